"""Staggered starts from an LP over the time-expanded network (small and medium groups).

Given the pieces (one per path share, :func:`cclc.synth.pack.pieces_of`) and ``T`` steps,
variable ``y[i, sigma]`` is the fraction of piece ``i`` that starts in step ``sigma`` (hop ``k``
in step ``sigma + k``) and ``tau[t]`` the length of step ``t``::

    minimize sum_t tau[t]   subject to   sum_sigma y[i, sigma] = 1                  every piece
                                         sum_{i,k} bytes_i / c_e y[i, t - k] <= tau[t]
                                                          every step t and link e of hop k of i

(HiGHS through :func:`scipy.optimize.linprog`: the matrix is built in bulk). Its optimum is the
best lockstep time of the fractional staggering; each piece is then cut, in whole units of its
pair's quantum (:func:`cclc.synth.pack.pieces_of`), into one piece per start it uses (largest
remainders), so the rounded schedule keeps the LP's shape with few extra ops. Greedy list
scheduling (:func:`cclc.synth.pack.pack_pieces`) stays for groups where this LP is too large.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import scipy.sparse as sp
from scipy.optimize import linprog

from cclc.collective import Collective
from cclc.synth.pack import Packing, packing_time, split_by_weight
from cclc.synth.piece_table import Piece

__all__ = ["MAX_LP_CELLS", "stagger_lp"]

#: the LP is used while pieces x steps stays below this (HiGHS takes a few seconds there)
MAX_LP_CELLS = 60_000


def stagger_lp(coll: Collective, pieces: list[Piece], n_steps: int,
               step_overhead: float = 0.0, time_limit: float | None = None
               ) -> tuple[list[Piece], Packing] | None:
    """Pieces cut by start step and their packing, or ``None`` when HiGHS finds no optimum
    in ``time_limit`` seconds."""
    topo = coll.topology
    item = coll.dtype.itemsize
    hops = np.array([len(p.hops) for p in pieces], dtype=np.int64)
    T = n_steps
    n_sig = T - hops + 1                                   # starts per piece
    var0 = np.concatenate([[0], np.cumsum(n_sig)])         # first y variable of each piece
    n_y = int(var0[-1])
    # one entry per (piece, start, hop, link): row (step, link), value bytes / bandwidth
    rows, cols, vals = [], [], []
    bw = topo.link_bandwidth
    scale = 0.0
    for i, p in enumerate(pieces):
        sig = np.arange(n_sig[i])
        for k, hop in enumerate(p.hops):
            for e in hop:
                rows.append((sig + k) * topo.n_links + e)
                cols.append(var0[i] + sig)
                v = p.elems * item / bw[e]
                scale = max(scale, v)
                vals.append(np.full(len(sig), v))
    r = np.concatenate(rows)
    c = np.concatenate(cols)
    v = np.concatenate(vals) / scale
    used_rows, r = np.unique(r, return_inverse=True)
    step_of_row = used_rows // topo.n_links
    n_rows = len(used_rows)
    # columns: y (n_y) then tau (T); load - tau[t] <= 0
    a_ub = sp.csr_matrix((np.concatenate([v, -np.ones(n_rows)]),
                          (np.concatenate([r, np.arange(n_rows)]),
                           np.concatenate([c, n_y + step_of_row]))), shape=(n_rows, n_y + T))
    owner = np.repeat(np.arange(len(pieces)), n_sig)
    a_eq = sp.csr_matrix((np.ones(n_y), (owner, np.arange(n_y))), shape=(len(pieces), n_y + T))
    cost = np.concatenate([np.zeros(n_y), np.ones(T)])
    options = {"time_limit": float(time_limit)} if time_limit is not None else {}
    res = linprog(cost, A_ub=a_ub, b_ub=np.zeros(n_rows), A_eq=a_eq,
                  b_eq=np.ones(len(pieces)), bounds=(0, None), method="highs",
                  options=options)
    if res.status != 0:
        return None
    y = res.x[:n_y]
    out: list[Piece] = []
    start: list[int] = []
    for i, p in enumerate(pieces):
        frac = np.maximum(y[var0[i]:var0[i + 1]], 0.0)
        units = p.elems // p.unit
        if frac.sum() <= 0:
            frac = np.ones_like(frac)
        share = split_by_weight(units, frac)
        rest = p.elems - units * p.unit    # a remainder that is no whole unit rides along
        for sigma in np.flatnonzero(share).tolist():
            out.append(replace(p, elems=int(share[sigma]) * p.unit + rest))
            start.append(sigma)
            rest = 0
        if rest:
            out.append(replace(p, elems=rest))
            start.append(int(np.argmax(frac)))
    # renumber the pieces of every pair
    slot: dict[tuple[int, int], int] = {}
    for j, p in enumerate(out):
        k = slot.get((p.src, p.dst), 0)
        slot[(p.src, p.dst)] = k + 1
        out[j] = replace(p, slot=k)
    starts = np.array(start, dtype=np.int64)
    return out, Packing(start=starts, n_steps=T,
                        time=packing_time(coll, out, starts, T, step_overhead))
