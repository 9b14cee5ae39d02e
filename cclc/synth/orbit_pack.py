"""Packing one piece per orbit: the greedy packing of :mod:`cclc.synth.pack` over a symmetric
piece set, at the cost of its orbit representatives.

The path LP is solved over a group of torus automorphisms (:mod:`cclc.synth.symmetry`) and its
paths are mapped to every pair by every element, so the set of pieces is invariant under the
group (up to the rounding of shares to whole units). Give every piece of an orbit the start of
its representative: then every step's set of pieces is invariant too, and a link's load in a
step equals the load of every link of its orbit. The packing keeps one load per *link orbit*
and step; a representative of a piece orbit with ``m`` members adds, on each of its hops, its
seconds times ``m / |O|`` to the row of the hop's link orbit ``O`` (the orbit's members put
``m`` such loads on ``O``'s ``|O|`` links, evenly). With the group acting exactly this is the
load the full packing would track, so the greedy choices are the same cost model at
``1 / |G|`` of the work: on the healthy 8x8x8 torus (512 translations) 1 783 representatives
instead of 912 896 pieces. Where the rounding to whole units makes an image's share differ by a
unit from its representative's, the loads are approximate; the time of the packing is always
computed over every piece (:func:`cclc.synth.pack.packing_time`).

A piece's orbit is found by mapping it with the elements that take its source to the smallest
vertex of the source's orbit (one element under translations) and keeping the smallest image
(source, destination, links, and its index among the pieces of its pair on the same path).
"""

from __future__ import annotations

import numpy as np

from cclc.collective import Collective
from cclc.synth.pack import Packing, pack_pieces, packing_time
from cclc.synth.piece_table import HopTable, Piece
from cclc.synth.symmetry import Symmetry

__all__ = ["PieceOrbits", "pack_orbits", "piece_orbits"]


class PieceOrbits:
    """``orbit[i]``: the orbit of piece ``i``; ``reps[o]``: the index of orbit ``o``'s
    representative (its first piece); ``size[o]``: its pieces present; ``link_row``: per link,
    the row of its link orbit (0 for links no piece uses); ``row_size``: links per row;
    ``pair_orbit[i]``: the orbit of piece ``i``'s pair."""

    __slots__ = ("link_row", "orbit", "pair_orbit", "reps", "row_size", "size")

    def __init__(self, orbit, reps, size, link_row, row_size, pair_orbit):
        self.orbit, self.reps, self.size = orbit, reps, size
        self.link_row, self.row_size, self.pair_orbit = link_row, row_size, pair_orbit


def _lex_min(best: np.ndarray, cand: np.ndarray) -> np.ndarray:
    """Row-wise the lexicographically smaller of two equally shaped integer matrices."""
    diff = best != cand
    first = diff.argmax(axis=1)
    rows = np.arange(len(best))
    smaller = diff.any(axis=1) & (cand[rows, first] < best[rows, first])
    out = best.copy()
    out[smaller] = cand[smaller]
    return out


def piece_orbits(coll: Collective, pieces: list[Piece], sym: Symmetry, usable: np.ndarray,
                 table: HopTable) -> PieceOrbits:
    """The orbits of ``pieces`` under ``sym`` (see the module docstring); ``table`` is
    their :func:`~cclc.synth.piece_table.hop_table`."""
    group = np.asarray(coll.group, dtype=np.int64)
    index = np.full(sym.vertex.shape[1], -1, dtype=np.int64)
    index[group] = np.arange(len(group))
    n_pieces = len(pieces)
    # the pieces' links, one row each, padded with -1 (hop boundaries are the path's own:
    # an element maps a carried run onto a carried run)
    n_entries = np.bincount(table.piece[table.entry_hop], minlength=n_pieces)
    width = int(n_entries.max()) if n_pieces else 0
    ends = np.cumsum(n_entries)
    col = np.arange(len(table.entry_link)) - np.repeat(ends - n_entries, n_entries)
    links = np.full((n_pieces, width), -1, dtype=np.int64)
    links[table.piece[table.entry_hop], col] = table.entry_link
    # the index of a piece among its pair's pieces on the same path (split parts)
    order = np.lexsort(tuple(links.T[::-1]) + (table.dst, table.src))
    key = np.column_stack([table.src, table.dst, links])[order]
    new = np.r_[True, (key[1:] != key[:-1]).any(axis=1)]
    run = np.cumsum(new) - 1
    part = np.empty(n_pieces, dtype=np.int64)
    part[order] = np.arange(n_pieces) - np.flatnonzero(new)[run]
    src_v = group[table.src]
    smallest = sym.vertex[:, group].min(axis=0)            # per group index: its orbit's least
    canon = np.empty((n_pieces, 3 + width), dtype=np.int64)
    by_src = np.argsort(table.src, kind="stable")
    bounds = np.searchsorted(table.src[by_src], np.arange(len(group) + 1))
    has = links >= 0
    for s in range(len(group)):
        rows = by_src[bounds[s]:bounds[s + 1]]
        if not len(rows):
            continue
        v = src_v[rows[0]]
        best = None
        for g in np.flatnonzero(sym.vertex[:, v] == smallest[s]).tolist():
            img = links[rows].copy()
            m = has[rows]
            img[m] = sym.link_image(g, img[m])
            cand = np.column_stack([index[sym.vertex[g, group[table.dst[rows]]]],
                                    part[rows], np.zeros(len(rows), dtype=np.int64), img])
            best = cand if best is None else _lex_min(best, cand)
        assert best is not None, "the orbit's least vertex is an image of v"
        canon[rows] = best
        canon[rows, 2] = smallest[s]
    _, reps, orbit, size = np.unique(canon, axis=0, return_index=True, return_inverse=True,
                                     return_counts=True)
    # a pair's canonical form is its least image (source and destination lead the key)
    pair_orbit = np.unique(canon[:, [2, 0]], axis=0, return_inverse=True)[1].ravel()
    link_orbit = sym.link_orbits(usable)
    ids, link_row = np.unique(np.where(link_orbit >= 0, link_orbit, -1), return_inverse=True)
    row_size = np.bincount(link_row.ravel())
    if ids[0] < 0:                 # the unusable links: a row of their own, never loaded
        row_size[0] = 1
    return PieceOrbits(orbit.ravel(), reps, size, link_row.ravel(), row_size, pair_orbit)


def pack_orbits(coll: Collective, pieces: list[Piece], orbits: PieceOrbits, n_steps: int,
                step_overhead: float = 0.0, table: HopTable | None = None,
                passes: int = 0) -> Packing:
    """The greedy packing of the orbit representatives (then ``passes`` rounds of local
    search, :func:`~cclc.synth.pack.pack_pieces`), every piece started with its
    representative; the time is the lockstep time of every piece."""
    reps = [pieces[i] for i in orbits.reps.tolist()]
    packed = pack_pieces(coll, reps, n_steps, step_overhead, passes=passes,
                         link_row=orbits.link_row, mult=orbits.size.astype(np.float64),
                         row_scale=1.0 / orbits.row_size, timed=False).start
    start = packed[orbits.orbit]
    return Packing(start=start, n_steps=n_steps,
                   time=packing_time(coll, pieces, start, n_steps, step_overhead, table))


