"""AllToAll time: pieces of the LP's paths packed into lockstep steps.

Every weighted path of :mod:`cclc.synth.flows` carries one *piece* of its pair's block. The
declared routing cuts a path into hops it carries by itself (:func:`cclc.routing.
carried_segments`: one link each under ``routing none``, the whole path under ``source``,
rank-to-rank fewest-hop pieces on a fabric); between hops the piece waits in scratch at the
relaying rank, which forwards it in a later step. A piece that starts in step ``sigma`` takes
hop ``k`` in step ``sigma + k``: a time-expanded network of ``T`` steps.

List scheduling chooses every piece's start, largest first, to keep the sum of the steps'
lengths small: a step lasts as long as its busiest link (the lockstep model of
:mod:`cclc.sim`), so a piece goes where it raises the step maxima least, and among equal
choices where its links are least loaded. Staggering the starts is what lets every link work in
every step (all pieces starting together would load first hops in step 0 and last hops in the
last step only). ``T`` is chosen from a few candidates by the predicted time, which charges
each step its route latency and ``step_overhead`` (the emitting backend's cost per step), so
small sizes get few steps and large ones enough to balance.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cclc.collective import Collective
from cclc.routing import carried_segments
from cclc.synth.piece_table import HopTable, Piece, hop_table

__all__ = ["Packing", "pack_pieces", "packing_time", "pieces_of", "split_by_weight"]


@dataclass(frozen=True, eq=False)
class Packing:
    """Start step per piece, the number of steps, and the predicted lockstep time."""

    start: np.ndarray
    n_steps: int
    time: float


def split_by_weight(total: int, weights: np.ndarray) -> np.ndarray:
    """Integers proportional to ``weights`` summing to ``total`` (largest remainders)."""
    raw = weights / weights.sum() * total
    out = np.floor(raw).astype(np.int64)
    short = total - int(out.sum())
    if short:
        out[np.argsort(-(raw - out), kind="stable")[:short]] += 1
    return out


def _quantum(elems: int, quantum: int) -> tuple[int, int]:
    """``(q, unit)``: the largest ``q <= quantum`` dividing ``elems`` when it is at least
    ``quantum / 4`` (equal units), else ``quantum`` units of ``elems // quantum`` (the first
    piece then takes the remainder too, and the chunks are not all multiples of one unit)."""
    for q in range(min(quantum, max(elems, 1)), 0, -1):
        if elems % q == 0:
            if 4 * q >= quantum or q == elems:
                return q, elems // q
            break
    q = min(quantum, max(elems, 1))
    return q, elems // q


def pieces_of(coll: Collective, src: np.ndarray, dst: np.ndarray, weight: np.ndarray,
              paths: tuple[tuple[int, ...], ...], max_paths: int, min_weight: float,
              split: int = 1, quantum: int = 32) -> tuple[list[Piece], int]:
    """Pieces for the weighted paths (at most ``max_paths`` per pair, none under
    ``min_weight``, renormalized, each cut into ``split``) and the most pieces any pair has.

    Shares are whole multiples of ``1/q`` of the block, ``q`` the largest divisor of the
    block's elements up to ``quantum``: every chunk is then a multiple of one unit, which the
    MSCCL runtimes need (equal chunks); a block of prime size keeps its largest path only.
    """
    topo = coll.topology
    item = coll.dtype.itemsize
    n = coll.n
    if coll.pair_sizes is not None:
        elems = np.asarray(coll.pair_sizes, dtype=np.int64) // item
    else:
        elems = np.full((n, n), coll.count // n, dtype=np.int64)
    index = {int(g): i for i, g in enumerate(coll.group)}
    order = np.lexsort((-weight, dst, src))
    seg_cache: dict[tuple[int, ...], tuple[tuple[tuple[int, ...], ...], tuple[int, ...]]] = {}

    def hops_of(path: tuple[int, ...]):
        if path not in seg_cache:
            if topo.routing == "none":
                segs: tuple[tuple[int, ...], ...] = tuple((e,) for e in path)
            elif topo.routing == "source":
                segs = (path,)
            else:
                segs = tuple(carried_segments(topo, path))
            via = tuple(index[int(topo.link_dst[s[-1]])] for s in segs)
            seg_cache[path] = (segs, via)
        return seg_cache[path]

    # per block size its quantum, per share its cut into ``split``: computed once (at 512
    # ranks there are a million paths and a handful of distinct values)
    quanta: dict[int, tuple[int, int]] = {}
    even: dict[int, list[int]] = {}
    pieces: list[Piece] = []
    widest = 1
    # the pairs' runs in ``order`` found at once, the loop below is one pass per pair
    so, do = src[order], dst[order]
    bounds = np.flatnonzero(np.r_[True, (so[1:] != so[:-1]) | (do[1:] != do[:-1]), True])
    for i, j, s, d in zip(bounds[:-1].tolist(), bounds[1:].tolist(), so[bounds[:-1]].tolist(),
                          do[bounds[:-1]].tolist(), strict=True):
        rows = order[i:j]
        if j - i == 1:
            keep = rows             # one path: no shares to compare (most pairs at scale)
        else:
            w = weight[rows]
            keep = rows[(w >= min_weight * w.max())][:max_paths]
        block = int(elems[s, d])
        qu = quanta.get(block)
        if qu is None:
            qu = quanta[block] = _quantum(block, quantum)
        q, unit = qu
        units = [q] if len(keep) == 1 else split_by_weight(q, weight[keep]).tolist()
        rest = block - q * unit            # 0 unless the block has no divisor near quantum
        slot = 0
        for r, u in zip(keep.tolist(), units, strict=True):
            segs, via = hops_of(paths[r])
            parts = even.get(u)
            if parts is None:
                parts = even[u] = split_by_weight(u, np.ones(split)).tolist()
            for part in parts:
                if part:
                    size = int(part) * unit + rest
                    pieces.append(Piece(s, d, slot, size, segs, via, unit))
                    rest = 0
                    slot += 1
        widest = max(widest, slot)
    return pieces, widest


def _geometry(coll: Collective, pieces: list[Piece], n_steps: int,
              link_row: np.ndarray | None = None, row_scale: np.ndarray | None = None):
    """Per piece: its flat ``(step, row)`` indices for every start (one row per start; a
    link's row is ``link_row[link]``, the link itself by default), its
    hops' steps for every start, the hop boundaries when a hop has several links (``None``
    under one link per hop), and the bandwidth of each of its links. Computed once per
    distinct path: the pieces of one path share it (a placement then costs a few array
    operations, not the index arithmetic). With ``row_scale``, a link's bandwidth is divided
    by its row's scale (a load counted ``row_scale`` times per second)."""
    topo = coll.topology
    n_links = topo.n_links if link_row is None else int(link_row.max()) + 1
    cache: dict = {}
    out = []
    for p in pieces:
        g = cache.get(p.hops)
        if g is None:
            sizes = [len(hop) for hop in p.hops]
            links = np.fromiter((e for hop in p.hops for e in hop), dtype=np.int64,
                                count=sum(sizes))
            h = len(p.hops)
            hop_of = np.repeat(np.arange(h), sizes)
            firsts = (None if len(links) == h else
                      np.concatenate([[0], np.cumsum(sizes)[:-1]]))
            sig = np.arange(n_steps - h + 1)[:, None]
            steps = sig + np.arange(h)[None, :]
            rows = links if link_row is None else link_row[links]
            bw = topo.link_bandwidth[links]
            if row_scale is not None:
                bw = bw / row_scale[rows]
            g = cache[p.hops] = ((sig + hop_of[None, :]) * n_links + rows[None, :],
                                 steps, firsts, bw)
        out.append(g)
    return out


def pack_pieces(coll: Collective, pieces: list[Piece], n_steps: int,
                step_overhead: float = 0.0, passes: int = 2,
                link_row: np.ndarray | None = None, mult: np.ndarray | None = None,
                row_scale: np.ndarray | None = None, timed: bool = True) -> Packing:
    """List-schedule ``pieces`` into ``n_steps`` steps (see the module docstring), then
    ``passes`` rounds of local search: each piece in turn is taken out and put back where it
    raises the step maxima least (never worse than where it was).

    ``link_row`` and ``mult`` pack orbit representatives (:mod:`cclc.synth.orbit_pack`): the
    loads are kept per row (a link orbit) and piece ``i`` adds ``mult[i] * row_scale[row]``
    times its seconds to each of its rows. ``timed=False`` leaves the time to the caller
    (``nan``)."""
    n_rows = coll.topology.n_links if link_row is None else int(link_row.max()) + 1
    L = np.zeros((n_steps, n_rows))
    flat = L.reshape(-1)                 # a view: (step, row) by one index
    M = np.zeros(n_steps)
    start = np.zeros(len(pieces), dtype=np.int64)
    geometry = _geometry(coll, pieces, n_steps, link_row, row_scale)
    item = coll.dtype.itemsize
    scale = np.ones(len(pieces)) if mult is None else np.asarray(mult, dtype=np.float64)
    adds = [p.elems * item * m / g[3]
            for p, g, m in zip(pieces, geometry, scale.tolist(), strict=True)]

    def place(i: int) -> None:
        index, steps, firsts, _ = geometry[i]
        add = adds[i]
        new = flat[index]
        new += add
        if firsts is not None:
            new = np.maximum.reduceat(new, firsts, axis=1)
        before = M[steps]
        rise = new - before
        np.maximum(rise, 0.0, out=rise)
        inc = rise.sum(axis=1)
        if step_overhead:
            # a step that moves nothing yet costs its software overhead once it is opened
            inc += step_overhead * (before == 0).sum(axis=1)
        inc += 1e-6 * new.sum(axis=1)
        best = int(inc.argmin())
        start[i] = best
        flat[index[best]] += add
        h = steps.shape[1]
        M[best:best + h] = np.maximum(M[best:best + h], new[best])

    order = np.argsort(-np.array([a.sum() for a in adds]), kind="stable").tolist()
    for i in order:
        place(i)
    for _ in range(passes):
        for i in order:
            index, steps, _, _ = geometry[i]
            sigma = int(start[i])
            flat[index[sigma]] -= adds[i]
            h = steps.shape[1]
            M[sigma:sigma + h] = L[sigma:sigma + h].max(axis=1)
            place(i)
    return Packing(start=start, n_steps=n_steps,
                   time=packing_time(coll, pieces, start, n_steps, step_overhead)
                   if timed else float("nan"))


def packing_time(coll: Collective, pieces: list[Piece], start: np.ndarray, n_steps: int,
                 step_overhead: float = 0.0, table: HopTable | None = None) -> float:
    """The lockstep time of ``pieces`` started at ``start``: per step its busiest link plus
    its longest hop latency (and ``step_overhead``), summed over the steps that move data.
    ``table`` is ``pieces``' :func:`~cclc.synth.piece_table.hop_table` when already built."""
    topo = coll.topology
    item = coll.dtype.itemsize
    L: np.ndarray = np.zeros((n_steps, topo.n_links))
    latency = np.zeros(n_steps)
    if pieces:
        h = hop_table(topo, pieces) if table is None else table
        hop_step = np.asarray(start, dtype=np.int64)[h.piece] + h.k
        link = h.entry_link
        piece = h.piece[h.entry_hop]
        L = np.bincount(hop_step[h.entry_hop] * topo.n_links + link,
                        weights=h.elems[piece] * item / topo.link_bandwidth[link],
                        minlength=n_steps * topo.n_links).reshape(n_steps, topo.n_links)
        np.maximum.at(latency, hop_step, h.latency)
    M = L.max(axis=1)
    used = M > 0
    return float((M + latency)[used].sum() + step_overhead * used.sum())
