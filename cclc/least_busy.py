"""Identical flows, one after another, each onto the least busy of a few paths: the choice a
flow-by-flow greedy makes, computed for a whole run of flows at once.

The three-tier plan (:func:`cclc.fabric_routing.planned_routes`) gives every flow the path
(spine or core) whose busiest link, in seconds, stays least busy, then the least total, then
the lowest index; a 4,096-rank alltoall has 16.7M flows, in 16K runs of one source leaf, dest
leaf and size. Within a run the choice is a merge (see :func:`least_busy_picks`), so a run
costs a few array operations, not a Python step per flow, and gives the same paths. Those
operations are on arrays of a few thousand entries, where numpy's fixed cost per call and
its slow reductions over a short axis dominate: the busiest and total link of a path are
taken one link at a time (:func:`_busiest_total`), the components' layout is kept per
pattern (:func:`_parts`), and a component's members' bytes come from one product
(:func:`_guessed_keys`): 0.9 to 0.33 ms a run.
"""

from __future__ import annotations

import functools

import numpy as np

__all__ = ["least_busy_picks"]


def least_busy_picks(load: np.ndarray, bandwidth: np.ndarray, links: np.ndarray,
                     comp: np.ndarray, size, n_flows: int) -> np.ndarray:
    """The path (row of ``links``: the link ids of one candidate path each) each of
    ``n_flows`` flows of ``size`` bytes takes, one after another, by least (busiest link,
    total, row) in seconds, given the byte ``load`` of every link so far and ``bandwidth``;
    ``comp[row]`` names the component of each path (paths joined by shared links).

    A component changes no other component's keys, and the least key in it only grows with
    every flow it takes, so the flow-by-flow choice is a merge: the ``n_flows`` smallest of
    the components' successive least keys, in order. Each component's first ``depth`` picks
    come from :func:`_component_keys`; one that took all of them may have taken more, and
    then it looks deeper. Loads are whole byte counts, exact in float64 below 2**53, so
    every busy time is the one a flow-by-flow loop computes."""
    n_comp, alone, grid = _parts(np.asarray(comp, dtype=np.int64).tobytes())
    # each component about its share, a little more (loads even out); deeper when short
    depth = min(n_flows, -(-n_flows // n_comp) + 2)
    while True:
        keys = _component_keys(load, bandwidth, links, alone, grid, size, depth)
        best = np.lexsort(keys[::-1])[:n_flows]
        row = keys[2][best].astype(np.int64)
        if depth == n_flows or np.bincount(comp[row], minlength=len(links)).max() < depth:
            return row
        depth = min(n_flows, 2 * depth)


@functools.lru_cache(maxsize=64)
def _parts(comp: bytes) -> tuple[int, np.ndarray, np.ndarray | None]:
    """The components of the paths (``comp`` as int64 bytes): how many, the rows alone in
    theirs, and the others as a (component, member) grid of rows in row order, padded with
    -1 (``None`` when every path is alone). Kept: a plan's runs repeat a few patterns."""
    of = np.frombuffer(comp, dtype=np.int64)
    alone = np.bincount(of, minlength=len(of))[of] == 1
    grid = None
    if not alone.all():
        rows = np.flatnonzero(~alone)
        groups, slot = np.unique(of[rows], return_inverse=True)
        member = np.argsort(slot, kind="stable")
        at = np.arange(len(rows)) - np.searchsorted(slot[member], slot[member])
        grid = np.full((len(groups), int(np.bincount(slot).max())), -1, dtype=np.int64)
        grid[slot[member], at] = rows[member]
    rows_alone = np.flatnonzero(alone)
    for kept in (rows_alone, grid):
        if kept is not None:
            kept.setflags(write=False)          # (shared by every run of the pattern)
    return len(np.unique(of)), rows_alone, grid


def _component_keys(load: np.ndarray, bandwidth: np.ndarray, links: np.ndarray,
                    alone: np.ndarray, grid: np.ndarray | None, size, depth: int
                    ) -> np.ndarray:
    """``(busiest, total, row)`` of the first ``depth`` picks of every component, each on its
    own: ``(3, components * depth)``. Paths ``alone`` in their component in closed form (the
    ``t``-th flow sees ``t`` flows' bytes more), the others (``grid``, see :func:`_parts`)
    by :func:`_guessed_keys` or else :func:`_lockstep_keys`."""
    # whole byte counts (exact), the t-th pick of a path seeing t flows more
    taken = np.arange(1, depth + 1, dtype=np.float64) * size
    out = []
    if len(alone):
        plinks = links[alone].T                                         # (L, P)
        top, tot = _busiest_total([(load[ln][:, None] + taken) / bandwidth[ln][:, None]
                                   for ln in plinks])                   # (P, D)
        out.append(np.stack([top.ravel(), tot.ravel(),
                             np.repeat(alone, depth).astype(np.float64)]))
    if grid is not None:
        keys = _guessed_keys(load, bandwidth, links, grid, size, taken)
        out.append(keys if keys is not None
                   else _lockstep_keys(load, bandwidth, links, grid, size, depth))
    return np.concatenate(out, axis=1)


def _busiest_total(busy: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The busiest and the total of a path's links, given as one array per link (in path
    order): elementwise, which numpy does many times faster than a reduction over an axis of
    four. The total adds the links in path order, as ``sum(axis=-1)`` over the path does."""
    top, tot = busy[0], busy[0]
    for b in busy[1:]:
        top, tot = np.maximum(top, b), tot + b
    return top, tot


def _least_member(top: np.ndarray, tot: np.ndarray) -> np.ndarray:
    """Index along the last axis of the least ``(top, tot, index)``: a later member wins
    only when strictly less (members are in row order, and the lower row wins ties)."""
    first = np.zeros(top.shape[:-1], dtype=np.int64)
    best_top, best_tot = top[..., 0], tot[..., 0]
    for col in range(1, top.shape[-1]):
        b, t = top[..., col], tot[..., col]
        wins = (b < best_top) | ((b == best_top) & (t < best_tot))
        first[wins] = col
        best_top, best_tot = np.where(wins, b, best_top), np.where(wins, t, best_tot)
    return first


def _guessed_keys(load: np.ndarray, bandwidth: np.ndarray, links: np.ndarray,
                  grid: np.ndarray, size, taken: np.ndarray) -> np.ndarray | None:
    """:func:`_lockstep_keys` without a loop over flows when a guess holds: each component's
    picks guessed as its members' own key sequences merged (as if they shared nothing), then
    checked at once: at every step, with the bytes the guessed picks put on every link so
    far (shared links counted for every member crossing them), the guessed member must be
    the least. ``None`` when the guess fails anywhere (then step by step). ``taken``: the
    bytes a path's t-th flow sees more (its own included), t < depth."""
    n_comp, width = grid.shape
    depth = len(taken)
    real = grid >= 0
    padded = not real.all()
    plinks = np.moveaxis(links[np.where(real, grid, grid[:, :1]) if padded else grid], -1, 0)
    base, bw = load[plinks], bandwidth[plinks]                          # (L, C, W)
    top, tot = _busiest_total(list((base[..., None] + taken) / bw[..., None]))  # (C, W, D)
    if padded:
        top = np.where(real[:, :, None], top, np.inf)
    top = top.reshape(n_comp, -1)
    who = np.broadcast_to(np.repeat(np.arange(width), depth), top.shape)
    pick = np.take_along_axis(who, np.lexsort((who, tot.reshape(n_comp, -1), top),
                                              axis=-1)[:, :depth], -1)       # (C, D)
    # picks before each step, per member, and on each link of each member
    onehot = (pick[:, :, None] == np.arange(width)).astype(np.int64)    # (C, D, W)
    before = (np.cumsum(onehot, axis=1) - onehot) * size
    crosses = (plinks[:, :, :, None, None] == plinks.transpose(1, 2, 0)[None, :, None])
    crosses = crosses.any(axis=-1) & real[None, :, None, :]             # (L, C, W, W)
    # bytes on each link of each member before each step: what every member crossing it took
    # (one product over the members q: count[l, c, d, m] = sum_q crosses[l, c, m, q] *
    # before[c, d, q]; whole byte counts, exact in any order)
    count = np.matmul(crosses.astype(before.dtype), before.transpose(0, 2, 1)
                      ).transpose(0, 1, 3, 2)
    top, tot = _busiest_total(list((base[:, :, None] + count + size)
                                   / bw[:, :, None]))                 # (C, D, W)
    if padded:
        top = np.where(real[:, None, :], top, np.inf)
    if not (_least_member(top, tot) == pick).all():
        return None
    comp = np.arange(n_comp)[:, None]
    return np.stack([top[comp, np.arange(depth), pick].ravel(),
                     tot[comp, np.arange(depth), pick].ravel(),
                     grid[comp, pick].ravel().astype(np.float64)])


def _lockstep_keys(load: np.ndarray, bandwidth: np.ndarray, links: np.ndarray,
                   grid: np.ndarray, size, depth: int) -> np.ndarray:
    """The first ``depth`` picks of every component of ``grid`` (rows of ``links``, padded
    with -1), flow by flow, all components in step: ``(3, components * depth)``."""
    used = load.copy()
    keys = np.empty((3, len(grid), depth))
    g = np.arange(len(grid))
    real = grid >= 0
    plinks = np.moveaxis(links[grid], -1, 0)                               # (L, C, W)
    bw = bandwidth[plinks]
    for t in range(depth):
        top, tot = _busiest_total([(used[ln] + size) / w for ln, w in zip(plinks, bw,
                                                                          strict=True)])
        top, tot = np.where(real, top, np.inf), np.where(real, tot, np.inf)
        first = _least_member(top, tot)
        keys[0, :, t], keys[1, :, t] = top[g, first], tot[g, first]
        keys[2, :, t] = grid[g, first]
        # components share no link: one addition per link
        used[links[grid[g, first]].ravel()] += size
    return keys.reshape(3, -1)
