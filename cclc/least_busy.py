"""Identical flows, one after another, each onto the least busy of a few paths: the choice a
flow-by-flow greedy makes, computed for a whole run of flows at once.

The three-tier plan (:func:`cclc.fabric_routing.planned_routes`) gives every flow the path
(spine or core) whose busiest link, in seconds, stays least busy, then the least total, then
the lowest index; a 4,096-rank alltoall has 16.7M flows, in 16K runs of one source leaf, dest
leaf and size. Within a run the choice is a merge (see :func:`least_busy_picks`), so a run
costs a few array operations, not a Python step per flow, and gives the same paths.
"""

from __future__ import annotations

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
    n_paths = len(links)
    # each component about its share, a little more (loads even out); deeper when short
    depth = min(n_flows, -(-n_flows // len(np.unique(comp))) + 2)
    while True:
        keys = _component_keys(load, bandwidth, links, comp, size, depth)
        best = np.lexsort(keys[::-1])[:n_flows]
        row = keys[2][best].astype(np.int64)
        if depth == n_flows or np.bincount(comp[row], minlength=n_paths).max() < depth:
            return row
        depth = min(n_flows, 2 * depth)


def _component_keys(load: np.ndarray, bandwidth: np.ndarray, links: np.ndarray,
                    comp: np.ndarray, size, depth: int) -> np.ndarray:
    """``(busiest, total, row)`` of the first ``depth`` picks of every component, each on its
    own: ``(3, components * depth)``. Paths alone in their component in closed form (the
    ``t``-th flow sees ``t`` flows' bytes more), the others by :func:`_shared_keys`."""
    alone = np.bincount(comp, minlength=len(comp))[comp] == 1
    out = []
    if alone.any():
        rows = np.flatnonzero(alone)
        taken = (np.arange(depth, dtype=np.float64) * size)[None, :, None]
        busy = (load[links[rows]][:, None, :] + taken + size) / bandwidth[links[rows]][:, None, :]
        busy = busy.reshape(len(rows) * depth, links.shape[1])
        out.append(np.stack([busy.max(axis=1), busy.sum(axis=1),
                             np.repeat(rows, depth).astype(np.float64)]))
    if not alone.all():
        rows = np.flatnonzero(~alone)
        groups, slot = np.unique(comp[rows], return_inverse=True)
        width = int(np.bincount(slot).max())
        # (component, member) -> row, members in row order, padded with -1
        member = np.argsort(slot, kind="stable")
        at = np.arange(len(rows)) - np.searchsorted(slot[member], slot[member])
        grid = np.full((len(groups), width), -1, dtype=np.int64)
        grid[slot[member], at] = rows[member]
        keys = _guessed_keys(load, bandwidth, links, grid, size, depth)
        out.append(keys if keys is not None
                   else _lockstep_keys(load, bandwidth, links, grid, size, depth))
    return np.concatenate(out, axis=1)


def _least_member(top: np.ndarray, tot: np.ndarray) -> np.ndarray:
    """Index along the last axis of the least ``(top, tot, index)``: a later member wins
    only when strictly less (members are in row order, and the lower row wins ties)."""
    first = np.zeros(top.shape[:-1], dtype=np.int64)
    for col in range(1, top.shape[-1]):
        a = np.take_along_axis(top, first[..., None], -1)[..., 0]
        s = np.take_along_axis(tot, first[..., None], -1)[..., 0]
        b, t = top[..., col], tot[..., col]
        first[(b < a) | ((b == a) & (t < s))] = col
    return first


def _guessed_keys(load: np.ndarray, bandwidth: np.ndarray, links: np.ndarray,
                  grid: np.ndarray, size, depth: int) -> np.ndarray | None:
    """:func:`_lockstep_keys` without a loop over flows when a guess holds: each component's
    picks guessed as its members' own key sequences merged (as if they shared nothing), then
    checked at once: at every step, with the bytes the guessed picks put on every link so
    far (shared links counted for every member crossing them), the guessed member must be
    the least. ``None`` when the guess fails anywhere (then step by step)."""
    n_comp, width = grid.shape
    real = grid >= 0
    plinks = links[np.where(real, grid, grid[:, :1])]             # (C, W, L)
    base, bw = load[plinks], bandwidth[plinks]
    taken = np.arange(depth, dtype=np.float64) * size
    own = (base[:, :, None, :] + taken[None, None, :, None] + size) / bw[:, :, None, :]
    top = np.where(real[:, :, None], own.max(axis=-1), np.inf).reshape(n_comp, -1)
    tot = own.sum(axis=-1).reshape(n_comp, -1)
    who = np.broadcast_to(np.repeat(np.arange(width), depth), top.shape)
    pick = np.take_along_axis(who, np.lexsort((who, tot, top), axis=-1)[:, :depth], -1)
    # picks before each step, per member, and on each link of each member
    onehot = (pick[:, :, None] == np.arange(width)).astype(np.int64)    # (C, T, W)
    before = np.cumsum(onehot, axis=1) - onehot
    crosses = (plinks[:, :, :, None, None] == plinks[:, None, None, :, :]).any(axis=-1)
    crosses &= real[:, None, None, :]                                   # (C, W, L, W)
    count = np.einsum("cplq,ctq->ctpl", crosses.astype(np.int64), before)
    busy = (base[:, None] + count * size + size) / bw[:, None]          # (C, T, W, L)
    top = np.where(real[:, None, :], busy.max(axis=-1), np.inf)
    tot = busy.sum(axis=-1)
    if not (_least_member(top, tot) == pick).all():
        return None
    at = pick[..., None]
    return np.stack([np.take_along_axis(top, at, -1)[..., 0].ravel(),
                     np.take_along_axis(tot, at, -1)[..., 0].ravel(),
                     np.take_along_axis(grid, pick, -1).ravel().astype(np.float64)])


def _lockstep_keys(load: np.ndarray, bandwidth: np.ndarray, links: np.ndarray,
                   grid: np.ndarray, size, depth: int) -> np.ndarray:
    """The first ``depth`` picks of every component of ``grid`` (rows of ``links``, padded
    with -1), flow by flow, all components in step: ``(3, components * depth)``."""
    used = load.copy()
    keys = np.empty((3, len(grid), depth))
    g = np.arange(len(grid))
    real = grid.ravel() >= 0
    for t in range(depth):
        busy = (used[links[grid]] + size) / bandwidth[links[grid]]
        busy = busy.reshape(-1, links.shape[1])
        top = np.where(real, busy.max(axis=1), np.inf).reshape(grid.shape)
        tot = np.where(real, busy.sum(axis=1), np.inf).reshape(grid.shape)
        first = _least_member(top, tot)
        keys[0, :, t], keys[1, :, t] = top[g, first], tot[g, first]
        keys[2, :, t] = grid[g, first]
        # components share no link: one addition per link
        used[links[grid[g, first]].ravel()] += size
    return keys.reshape(3, -1)
