"""A torus AllToAll with failed links, stored by symmetry with exceptions.

The HalfRing + DimRotation AllToAll of the healthy torus
(:func:`cclc.algorithms.torus_symmetric.symmetric_alltoall`) is kept for every journey that
crosses no failed link; the journeys that do are left out (masked) and their units delivered
by a *tail* run after it (:class:`~cclc.symmetric.ExceptedSchedule`; soundness in
:mod:`cclc.symmetric_faults`). The tail is store and forward, one hop per step, every unit
leaving its source at step 0: each unit takes a shortest path in some dimension order (any of
the ``D!`` orders, either way round a ring at its antipode) that avoids the failed links,
chosen greedily to keep the busiest (step, link) of the tail light; a unit no such path
serves (its source and destination on one ring through a failed link) takes a shortest path
of the faulty torus. Between hops a unit waits in a scratch chunk of the tail's own, after
the base's: per rank, per chunk size and per step parity one chunk per unit arriving, so a
chunk written in a step is read in the next one before it is written again.
"""

from __future__ import annotations

import itertools

import numpy as np
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import shortest_path

from cclc.algorithms.torus_symmetric import faulty_reason, link_lookup, symmetric_alltoall
from cclc.collective import Collective, CollectiveKind
from cclc.errors import CollectiveError
from cclc.ir import Buf, OpKind, Ops, Routes
from cclc.symmetric import ExceptedSchedule, TranslationGroup, healthy_collective
from cclc.symmetric_check import journeys
from cclc.symmetric_faults import masked_outputs, required_mask

__all__ = ["excepted_alltoall", "excepted_reason", "reroute_units"]

#: units routed together by the greedy choice (each batch sees the loads of those before it)
BATCH = 64
#: the latest step a tail unit may leave its source at (waiting spreads a busy source's units
#: over steps, so the units it forwards do not all meet in the same steps)
MAX_DELAY = 8


def excepted_reason(coll: Collective) -> str | None:
    """Why :func:`excepted_alltoall` cannot serve ``coll`` (``None`` when it can): an
    AllToAll on a torus with failed links (no failed ranks) whose healthy machine the
    symmetric builder serves."""
    if coll.kind is not CollectiveKind.ALLTOALL:
        return f"exceptions for failed links are built for alltoall only, not {coll.kind.value}"
    return faulty_reason(coll)


def excepted_alltoall(coll: Collective) -> ExceptedSchedule:
    """The symmetric AllToAll of ``coll``'s healthy torus, less the journeys that cross a
    failed link, and the tail that delivers theirs (see the module docstring);
    :class:`~cclc.errors.CollectiveError` where :func:`excepted_reason` says it cannot."""
    why = excepted_reason(coll)
    if why is not None:
        raise CollectiveError(f"no symmetric alltoall with exceptions of '{coll.name}': {why}")
    base = symmetric_alltoall(healthy_collective(coll))
    found = journeys(base)
    mask = required_mask(base, found.root, coll.topology)
    first = len(base.layouts[Buf.SCRATCH])
    no_routes = Routes(np.zeros(2, dtype=np.int64), np.zeros(0, dtype=np.int32))
    # the masked journeys first: which output chunks the tail must deliver follows from them
    draft = ExceptedSchedule(collective=coll, base=base, journey=found.root,
                             masked_element=mask[:, 0], masked_journey=mask[:, 1],
                             tail=Ops.empty(), tail_routes=no_routes, tail_scratch_from=first)
    rank, chunk = masked_outputs(draft, found)
    tail, routes, extra = reroute_units(coll, base.layouts, rank, chunk, first)
    lay = base.layouts
    full = base.replace(layouts=(lay[0], lay[1], np.concatenate([lay[2], extra])))
    return draft.replace(base=full, tail=tail, tail_routes=routes)


def _candidate_moves(shape: tuple[int, ...], src: np.ndarray, dst: np.ndarray
                     ) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per candidate (a dimension order and a way round every ring): per unit the signed hop
    counts along the dimensions in that order, then those dimensions (``(units, 2 D)``), and
    whether the candidate is a shortest path for the unit."""
    g = TranslationGroup(shape)
    a, b = g.coords(src), g.coords(dst)
    m = np.array(shape)[:, None]
    off = (b - a) % m                                     # (dims, units)
    plus_ok = 2 * off <= m
    minus_ok = (2 * off >= m) & (off > 0)
    out = []
    active = [d for d, s in enumerate(shape) if s > 1]
    for signs in itertools.product((1, -1), repeat=len(active)):
        hops = np.zeros((len(shape), len(src)), dtype=np.int64)
        ok = np.ones(len(src), dtype=bool)
        for d, sign in zip(active, signs, strict=True):
            if sign == 1:
                hops[d] = off[d]
                ok &= plus_ok[d] | (off[d] == 0)
            else:
                hops[d] = off[d] - m[d, 0]
                ok &= minus_ok[d]
        for order in itertools.permutations(active):
            dims = np.broadcast_to(np.array(order, dtype=np.int64), (len(src), len(order)))
            out.append((np.concatenate([hops[list(order)].T, dims], axis=1), ok))
    return out


def _walk(shape: tuple[int, ...], src: np.ndarray, moves: np.ndarray, length: int
          ) -> np.ndarray:
    """Rank sequences ``(units, length + 1)`` of the dimension-order walks ``moves`` (per
    unit: signed hops per listed dimension, then the dimensions), padded with the last rank."""
    g = TranslationGroup(shape)
    D = moves.shape[1] // 2
    hops, dims = moves[:, :D], moves[:, D:]
    at = g.coords(src).T.copy()                        # (units, dims)
    seq = np.empty((len(src), length + 1), dtype=np.int64)
    seq[:, 0] = src
    cum = np.cumsum(np.abs(hops), axis=1)
    m = np.array(shape)
    rows = np.arange(len(src))
    for h in range(length):
        phase = np.minimum((cum <= h).sum(axis=1), D - 1)
        moving = h < cum[:, -1]
        d = dims[rows, phase]
        step = np.sign(hops[rows, phase])
        at[rows[moving], d[moving]] = (at[rows[moving], d[moving]] + step[moving]) % m[
            d[moving]]
        seq[:, h + 1] = np.ravel_multi_index(tuple(at.T), shape)
    return seq


def _shortest_paths(coll: Collective, src: np.ndarray, dst: np.ndarray, length: int
                    ) -> np.ndarray:
    """Shortest paths of the faulty machine (rank sequences padded to ``length + 1`` or to the
    longest of them)."""
    topo = coll.topology
    ok = ~topo.link_failed
    n = topo.n_vertices
    graph = coo_matrix((np.ones(int(ok.sum())), (topo.link_src[ok], topo.link_dst[ok])),
                       shape=(n, n)).tocsr()
    sources, inv = np.unique(src, return_inverse=True)
    _, pred = shortest_path(graph, unweighted=True, indices=sources, return_predecessors=True)
    seqs = []
    for i in range(len(src)):
        row, node, path = pred[inv[i]], int(dst[i]), [int(dst[i])]
        while node != int(src[i]):
            node = int(row[node])
            if node < 0:
                raise CollectiveError(f"rank {int(dst[i])} cannot be reached from rank "
                                      f"{int(src[i])} of '{topo.name}' over healthy links")
            path.append(node)
        seqs.append(path[::-1])
    width = max([length + 1] + [len(p) for p in seqs])
    return np.array([p + [p[-1]] * (width - len(p)) for p in seqs], dtype=np.int64).reshape(
        len(src), width)


def _candidates(coll: Collective, src: np.ndarray, dst: np.ndarray, walk: int
                ) -> tuple[np.ndarray, np.ndarray]:
    """Every unit's candidate paths as link ids ``(paths, hops)`` (-1 past the end) and each
    path's unit, grouped by unit: its dimension-order shortest paths (of at most ``walk``
    hops) that avoid the failed links, or, where none does, one shortest path of the faulty
    machine (which may be longer)."""
    topo = coll.topology
    shape = tuple(int(d) for d in topo.grid_dims)
    paths, owner = [], []
    for moves, shortest in _candidate_moves(shape, src, dst):
        idx = np.flatnonzero(shortest)
        seq = _walk(shape, src[idx], moves[idx], walk)
        hop = seq[:, 1:] != seq[:, :-1]
        links = np.full((len(idx), walk), -1, dtype=np.int64)
        links[:, :walk][hop] = link_lookup(topo, seq[:, :-1][hop], seq[:, 1:][hop])
        fine = ~(hop & topo.link_failed[np.maximum(links[:, :walk], 0)]).any(axis=1)
        paths.append(links[fine])
        owner.append(idx[fine])
    served = np.zeros(len(src), dtype=bool)
    for o in owner:
        served[o] = True
    lost = np.flatnonzero(~served)
    if len(lost):
        seq = _shortest_paths(coll, src[lost], dst[lost], walk)
        hop = seq[:, 1:] != seq[:, :-1]
        links = np.full(hop.shape, -1, dtype=np.int64)
        links[hop] = link_lookup(topo, seq[:, :-1][hop], seq[:, 1:][hop])
        paths = [np.pad(p, ((0, 0), (0, hop.shape[1] - walk)), constant_values=-1)
                 for p in paths]
        paths.append(links)
        owner.append(lost)
    every, whose = np.concatenate(paths), np.concatenate(owner)
    order = np.argsort(whose, kind="stable")
    return every[order], whose[order]


def reroute_units(coll: Collective, layouts: tuple[np.ndarray, ...], rank: np.ndarray,
                  chunk: np.ndarray, scratch_from: int
                  ) -> tuple[Ops, Routes, np.ndarray]:
    """The tail delivering output chunk ``chunk[i]`` of rank ``rank[i]`` (each once) from its
    source's input on ``coll``'s faulty torus (see the module docstring): its ops, routes and
    the scratch chunks it adds after the first ``scratch_from``.

    Units are placed a batch at a time, each on the candidate path and start step (up to
    :data:`MAX_DELAY`) that adds least to the sum over steps of the busiest link's bytes (the
    lockstep time's bandwidth term), then that puts it on the least loaded links, then the
    earliest."""
    topo, n = coll.topology, coll.n
    shape = tuple(int(d) for d in topo.grid_dims)
    n_out = len(layouts[Buf.OUTPUT])
    k = n_out // n
    pattern = layouts[Buf.OUTPUT][:k]
    key = np.unique(rank.astype(np.int64) * n_out + chunk)
    # a fixed shuffle so that each batch mixes sources and destinations
    key = key[np.random.default_rng(0).permutation(len(key))]
    dst, out_chunk = np.divmod(key, n_out)
    src, unit = np.divmod(out_chunk, k)
    size = pattern[unit].astype(np.float64)
    walk = int(sum(s // 2 for s in shape))          # the longest shortest path
    paths, whose = _candidates(coll, src, dst, walk)
    longest = paths.shape[1]                        # with the detours taken
    bounds = np.searchsorted(whose, np.arange(len(key) + 1))
    L = topo.n_links
    horizon = longest + MAX_DELAY
    load = np.zeros((horizon + 1) * L)
    top = np.zeros(horizon + 1)                     # per step: the busiest link's seconds
    chosen = np.full((len(key), horizon), -1, dtype=np.int64)
    bw = topo.link_bandwidth
    for lo in range(0, len(key), BATCH):
        hi = min(lo + BATCH, len(key))
        cand = paths[bounds[lo]:bounds[hi]]
        who = whose[bounds[lo]:bounds[hi]] - lo
        hop = cand >= 0
        safe = np.maximum(cand, 0)
        extra = size[lo + who][:, None] / bw[safe]
        best = np.full(hi - lo, np.inf)
        pick = np.zeros((hi - lo, 2), dtype=np.int64)
        for delay in range(MAX_DELAY + 1):
            at = np.arange(longest)[None, :] + delay
            new = load[at * L + safe] / bw[safe] + extra
            # what the steps' bandwidth terms grow by; how full the links get breaks ties
            grow = np.where(hop, np.maximum(new - top[at], 0.0), 0.0).sum(axis=1)
            fill = np.where(hop, new, 0.0).max(axis=1)
            score = grow + 1e-3 * fill
            row_best = np.full(hi - lo, np.inf)
            np.minimum.at(row_best, who, score)
            win = (score <= row_best[who]) & (row_best[who] < best[who])
            rows = np.flatnonzero(win)
            rows = rows[np.unique(who[rows], return_index=True)[1]]
            best[who[rows]] = row_best[who[rows]]
            pick[who[rows]] = np.stack([rows, np.full(len(rows), delay)], axis=1)
        for u in range(hi - lo):
            row, delay = pick[u]
            ln = cand[row][cand[row] >= 0]
            steps = np.arange(len(ln)) + delay
            np.add.at(load, steps * L + ln, size[lo + u])
            top[steps] = np.maximum(top[steps], load[steps * L + ln] / bw[ln])
            chosen[lo + u, delay:delay + len(ln)] = ln
    return _tail_ops(chosen, src, dst, unit, out_chunk, pattern, k, topo, scratch_from)


def _tail_ops(chosen: np.ndarray, src: np.ndarray, dst: np.ndarray, unit: np.ndarray,
              out_chunk: np.ndarray, pattern: np.ndarray, k: int, topo, scratch_from: int
              ) -> tuple[Ops, Routes, np.ndarray]:
    """One op per hop of every unit: ``chosen[u, t]`` is the link unit ``u`` crosses in step
    ``t`` (-1: none; a unit's hops are in consecutive steps), from its source's input (first
    hop) or the scratch chunk it waits in, to its output chunk (last hop) or the next scratch
    chunk."""
    busy = chosen >= 0
    length = busy.sum(axis=1)
    start = np.argmax(busy, axis=1)
    u, step = np.nonzero(busy)                          # row-major: a unit's hops in order
    link = chosen[u, step]
    frm = topo.link_src[link].astype(np.int64)
    to = topo.link_dst[link].astype(np.int64)
    if (frm[(step - start[u]) == 0] != src[u[(step - start[u]) == 0]]).any():
        raise CollectiveError("a tail unit does not start at its source")
    h = step - start[u]
    last = h + 1 == length[u]
    # a waiting unit's scratch chunk: per (size, parity of the step it arrives, rank) one
    # chunk per unit arriving then
    sizes, size_class = np.unique(pattern[unit[u]], return_inverse=True)
    wait = ~last
    V = int(topo.n_vertices)
    gw = ((size_class * 2 + step % 2) * V + to)[wait]
    order = np.argsort(gw, kind="stable")
    starts = np.r_[0, np.flatnonzero(np.diff(gw[order])) + 1]
    run = np.repeat(starts, np.diff(np.r_[starts, len(gw)]))
    rank_in = np.empty(len(gw), dtype=np.int64)
    rank_in[order] = np.arange(len(gw)) - run
    cls = gw // V                                        # size class * 2 + parity
    width = np.zeros(2 * len(sizes), dtype=np.int64)
    np.maximum.at(width, cls, rank_in + 1)
    first = scratch_from + np.concatenate([[0], np.cumsum(width)[:-1]])
    slot = np.full(len(u), -1, dtype=np.int64)
    slot[wait] = first[cls] + rank_in
    extra = np.repeat(np.repeat(sizes, 2), width)
    prev = np.r_[-1, slot[:-1]]                         # the slot the unit waited in before
    src_buf = np.where(h == 0, int(Buf.INPUT), int(Buf.SCRATCH))
    src_off = np.where(h == 0, dst[u] * k + unit[u], prev)
    dst_buf = np.where(last, int(Buf.OUTPUT), int(Buf.SCRATCH))
    dst_off = np.where(last, out_chunk[u], slot)
    used, route = np.unique(link, return_inverse=True)
    srt = np.argsort(step, kind="stable")
    ops = Ops(step=step[srt], src=frm[srt], dst=to[srt], route=route[srt] + 1,
              kind=np.full(len(u), OpKind.COPY), src_buf=src_buf[srt], src_off=src_off[srt],
              dst_buf=dst_buf[srt], dst_off=dst_off[srt], count=np.ones(len(u), dtype=np.int64))
    return ops, Routes(np.arange(-1, len(used) + 1).clip(0), used), extra
