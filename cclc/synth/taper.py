"""Chunk sizes that shrink down a tree pipeline, and the lockstep time of any chunk sizes.

A tree pipeline sends chunk ``c`` over edge ``i`` in step ``start[i] + c``
(:mod:`cclc.synth.tree_schedule`). In the IR's lockstep model every step lasts its latency
plus its busiest link, so once the roots have sent their last chunk the levels below still
drain it, a step per level: with equal chunks a whole chunk's time per level. On the 128-GPU
fabric that drain (the NVLink fan-out of the last chunk a NIC brought in) and the latency of
each step cap equal chunks at 93% of the AllGather's bound at 1 GiB. Chunks that shrink down
the pipeline, each about what the next level can forward while the one after it arrives,
shorten the drain (96% there): a *tapered* pipeline.

The lockstep time of chunk fractions ``w`` (summing to 1) is ``sum_t alpha [t moves data] +
max_l sum_c uses[l, t - c] w_c b / cap_l`` (``uses[l, s]``: the tree edges through link
``l`` that carry their first chunk in step ``s``; ``b``: a tree's bytes), convex and
piecewise linear in ``w``: an LP over ``w`` and one time per step (GLOP). That charges every
step the slowest move's latency (in ``alpha``). :func:`link_loads` with ``latency`` charges
each step what :mod:`cclc.sim` does instead: the most over its links of the link's busy time
plus the latency of a move through it that runs in the step, so a step that only moves over
NVLink (1 us) is not charged the network's 4 us; then ``alpha`` is the software cost alone.
It is one row per link and latency of the moves through it (the link's whole load, active in
the steps where a move of that latency runs). The runtimes move
whole equal units (MSCCL's chunks, the C++ backends' units), so the LP's fractions are
rounded to whole units per chunk (cumulatively, every chunk at least one unit) and polished
by moving single units between chunks while the time falls.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from cclc.synth.hop_graph import HopGraph

__all__ = ["LinkLoads", "link_loads", "pipeline_time", "tapered_units"]


@dataclass(frozen=True, slots=True, eq=False)
class LinkLoads:
    """``rates[l, s]``: tree edges through link ``l`` that carry their first chunk in step
    ``s``, over the link's capacity (with :func:`link_loads`' ``prune``, one row per distinct
    row and no dominated row); ``active[s]``: some edge carries its first chunk in step
    ``s``."""

    rates: np.ndarray
    active: np.ndarray
    #: per row, where rows are a link and a latency (``link_loads(..., latency=True)``): the
    #: latency of the row's moves, and ``starts[r, s]``: one of them carries its first chunk in
    #: step ``s``; ``None``: rows are links and ``alpha`` carries the latency
    latency: np.ndarray | None = None
    starts: np.ndarray | None = None

    def moving(self, chunks: int) -> np.ndarray:
        """Steps (of ``span + chunks - 1``) in which some edge carries a chunk."""
        run = np.convolve(self.active.astype(float), np.ones(chunks))
        return run > 0

    def row_moving(self, chunks: int) -> np.ndarray:
        """``[r, t]``: some move of row ``r``'s latency carries a chunk in step ``t`` (rows of
        :func:`link_loads` with ``latency``)."""
        if self.starts is None:
            raise ValueError("row_moving needs the rows of link_loads(..., latency=True)")
        rows, span = self.starts.shape
        prefix = np.concatenate([np.zeros((rows, 1)), np.cumsum(self.starts, axis=1)], axis=1)
        t = np.arange(span + chunks - 1)
        return (prefix[:, np.minimum(t, span - 1) + 1]
                - prefix[:, np.clip(t - chunks + 1, 0, span)]) > 0

    def loads(self, fractions: np.ndarray) -> np.ndarray:
        """``[l, t]``: link ``l``'s busy time in step ``t`` per byte of a tree."""
        rows, span = self.rates.shape
        chunks = len(fractions)
        if (fractions == fractions[0]).all():
            # equal chunks: a sliding window over the starts (one pass, not one per chunk)
            prefix = np.concatenate([np.zeros((rows, 1)), np.cumsum(self.rates, axis=1)], axis=1)
            t = np.arange(span + chunks - 1)
            return (prefix[:, np.minimum(t, span - 1) + 1]
                    - prefix[:, np.clip(t - chunks + 1, 0, span)]) * fractions[0]
        out = np.zeros((rows, span + chunks - 1))
        for c, w in enumerate(fractions):
            out[:, c:c + span] += self.rates * w
        return out


def link_loads(g: HopGraph, start: np.ndarray, move: np.ndarray, prune: bool = False,
               latency: bool = False) -> LinkLoads:
    """The :class:`LinkLoads` of edges ``move`` of ``g`` with first steps ``start``; with
    ``prune``, one row per distinct row and no dominated row (for the LP); with ``latency``,
    one row per link and latency of the moves through it, each charged its latency (see the
    module docstring)."""
    lengths = np.diff(g.offsets)[move]
    first = np.repeat(g.offsets[move], lengths)
    within = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    link = g.links[first + within]
    step = np.repeat(start, lengths)
    used, link = np.unique(link, return_inverse=True)
    span = int(step.max()) + 1
    hist = np.zeros((len(used), span))
    np.add.at(hist, (link, step), 1.0)
    active = hist.sum(axis=0) > 0
    cap = g.capacity[used]
    ok = cap > 0
    rates = hist[ok] / cap[ok, None]
    if not latency:
        return LinkLoads(_undominated(np.unique(rates, axis=0)) if prune else rates, active)
    # one row per (link, latency) of the moves through it: the link's whole load, charged
    # that latency in the steps where such a move runs
    row_of_link = np.cumsum(ok) - 1
    pair_lat = np.repeat(g.latency[move], lengths)
    keep = ok[link]
    classes, cls = np.unique(np.stack([link[keep], pair_lat[keep]]), axis=1, return_inverse=True)
    starts = np.zeros((classes.shape[1], span))
    np.add.at(starts, (cls.reshape(-1), step[keep]), 1.0)
    rows = np.hstack([classes[1][:, None], rates[row_of_link[classes[0].astype(np.int64)]],
                      (starts > 0).astype(float)])
    if prune:
        # a row no larger than another in latency, load and steps never sets a step's time
        rows = _undominated(np.unique(rows, axis=0))
    return LinkLoads(rows[:, 1:span + 1], active, rows[:, 0].copy(), rows[:, span + 1:] > 0)


def _undominated(rows: np.ndarray) -> np.ndarray:
    """The rows no other row is at least as large as everywhere (they never set a max)."""
    if len(rows) <= 1:
        return rows
    order = np.argsort(-rows.sum(axis=1), kind="stable")
    kept = np.zeros((len(rows), rows.shape[1]))
    n = 0
    for i in order.tolist():
        if not (kept[:n] >= rows[i]).all(axis=1).any():
            kept[n] = rows[i]
            n += 1
    return kept[:n]


def pipeline_time(loads: LinkLoads, fractions: np.ndarray, tree_bytes: float,
                  alpha: float) -> float:
    """Seconds of the lockstep pipeline whose chunk ``c`` holds ``fractions[c]`` of every
    tree's ``tree_bytes``, each step that moves data charged ``alpha`` plus its busiest link
    (with ``loads.latency``: plus the most over its links of the link's busy time and
    latency)."""
    busy = loads.loads(np.asarray(fractions, dtype=float)) * tree_bytes
    moving = loads.moving(len(fractions))
    if loads.latency is None:
        step = busy.max(axis=0)
    else:
        on = loads.row_moving(len(fractions))
        step = np.where(on, busy + loads.latency[:, None], 0.0).max(axis=0)
    return float(step[moving].sum() + alpha * moving.sum())


#: the most nonzero coefficients the LP may have (beyond, no taper is tried): the LP is built
#: term by term, about 1 s at 300 000 terms (100 distinct links, 40 starts, 50 chunks)
MAX_TERMS = 400_000


def tapered_units(loads: LinkLoads, chunks: int, units: int, tree_bytes: float,
                  alpha: float, deadline: float = math.inf) -> np.ndarray | None:
    """Whole units per chunk (``chunks`` of them, at least one each, ``units`` in all) that
    minimize the lockstep time, or ``None`` when the LP is too large or fails. The polish
    stops at ``deadline`` (``time.monotonic()``)."""
    rows, span = loads.rates.shape
    if units < chunks or rows == 0 or rows * (span + chunks) * min(span, chunks) > MAX_TERMS:
        return None
    w = _lp_fractions(loads, chunks, tree_bytes)
    if w is None:
        return None
    cum = np.round(np.cumsum(w) * units).astype(np.int64)
    cum[-1] = units
    u = np.diff(np.concatenate([[0], cum]))
    while (u < 1).any():                  # every chunk a unit: take it from the largest
        u[int(np.argmin(u))] += 1
        u[int(np.argmax(u))] -= 1
    return _polish(loads, u, tree_bytes, alpha, deadline)


def _lp_fractions(loads: LinkLoads, chunks: int, tree_bytes: float) -> np.ndarray | None:
    # OR-Tools (0.1-0.4 s to import) only when this model is solved
    from ortools.linear_solver import pywraplp

    rates = loads.rates * tree_bytes
    rows, span = rates.shape
    moving = loads.moving(chunks)
    solver = pywraplp.Solver.CreateSolver("GLOP")
    w = [solver.NumVar(0.0, 1.0, f"w{c}") for c in range(chunks)]
    solver.Add(solver.Sum(w) == 1.0)
    objective = solver.Objective()
    for t in np.flatnonzero(moving).tolist():
        s = solver.NumVar(0.0, solver.infinity(), f"s{t}")
        objective.SetCoefficient(s, 1.0)
        cs = range(max(0, t - span + 1), min(chunks, t + 1))
        for r in range(rows):
            terms = [(c, rates[r, t - c]) for c in cs if rates[r, t - c] > 0]
            if loads.starts is not None and not any(loads.starts[r, t - c] for c in cs):
                continue                    # no move of this row's latency runs in step t
            if terms:
                lat = 0.0 if loads.latency is None else float(loads.latency[r])
                ct = solver.Constraint(-solver.infinity(), -lat)
                ct.SetCoefficient(s, -1.0)
                for c, a in terms:
                    ct.SetCoefficient(w[c], float(a))
    objective.SetMinimization()
    if solver.Solve() != pywraplp.Solver.OPTIMAL:
        return None
    return np.array([max(0.0, v.solution_value()) for v in w])


#: sweeps of single-unit moves the polish makes at most
_POLISH_SWEEPS = 50


def _polish(loads: LinkLoads, u: np.ndarray, tree_bytes: float, alpha: float,
            deadline: float) -> np.ndarray:
    """``u`` after moving single units between neighbouring chunks while the pipeline's time
    falls (the rounding's loss is in the small chunks of the tail, where a unit is a large
    share; a unit moves to where the step it joins has room, next door)."""
    total = float(u.sum())
    best = pipeline_time(loads, u / total, tree_bytes, alpha)
    for _ in range(_POLISH_SWEEPS):
        improved = False
        if time.monotonic() > deadline:
            break
        for i in range(len(u) - 1):
            for a, b in ((i, i + 1), (i + 1, i)):
                if u[a] <= 1:
                    continue
                v = u.copy()
                v[a] -= 1
                v[b] += 1
                t = pipeline_time(loads, v / total, tree_bytes, alpha)
                if t < best * (1 - 1e-12):
                    best, u, improved = t, v, True
        if not improved:
            break
    return u
