"""Predicted times of packed tree pipelines (:mod:`cclc.algorithms.synth_trees`).

The closed form of a pipeline of ``C`` chunks per tree over trees of height ``H``
(:func:`pipeline_times`), the depth it picks within the op limit (:func:`depth_cap`), the
lockstep times of the packings themselves where the closed form is loose
(:func:`predict_pipeline`), the floor no packing of a graph can beat (:func:`predict_floor`),
and the time the ops of a packing will likely take to build (:func:`expected_build`). Every
step is charged the software cost of the execution model the planner prices with
(:func:`step_alpha`; nothing under the IR's lockstep model).
"""

from __future__ import annotations

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import shortest_path

from cclc.algorithms.tree_budget import MAX_OPS, seconds_per_op
from cclc.collective import Collective
from cclc.execution import IR_MODEL, ExecutionModel
from cclc.synth.hop_graph import HopGraph
from cclc.synth.joint_trees import link_use
from cclc.synth.phase_time import phase_lockstep_time
from cclc.synth.pricing import step_cost
from cclc.synth.tree_time import allreduce_lockstep_time
from cclc.synth.trees import TreePacking

__all__ = ["block_bytes", "cannot_win", "depth_cap", "expected_build", "phase_load",
           "phase_times", "pipeline_times", "predict_floor", "predict_pipeline", "step_alpha"]


def block_bytes(coll: Collective) -> float:
    """Bytes of one root's block (what each tree family carries)."""
    return coll.size / coll.n


def expected_build(coll: Collective, g: HopGraph, block: float, rate_ag: float | None,
                   rate_rs: float | None, max_ops: int, model: ExecutionModel = IR_MODEL
                   ) -> float:
    """Seconds the ops will likely take to build after the packing: one tree per root (the
    usual choice) at the pipeline depth the closed form picks for phases at the ForestColl
    rates, a level deeper than the farthest member (the trees' depth limit), each member
    sending a chunk once per phase and, in an in-tree, folding it at most once more. Only an
    estimate: the build caps the ops by the time left (:func:`ops_left`)."""
    phases = []
    for rate, moves in ((rate_rs, g.reversed()), (rate_ag, g)):
        if rate is None:
            continue
        hops = shortest_path(csr_matrix((np.ones(moves.m), (moves.src, moves.dst)),
                                        shape=(moves.n, moves.n)), unweighted=True)
        height = int(np.where(np.isfinite(hops), hops, 0).max()) + 1
        phases.append((block / rate, height))
    per_chunk = (1 if rate_ag is not None else 0) + (2 if rate_rs is not None else 0)
    per_chunk *= coll.n * (coll.n - 1)
    cap = max(1, min(max(1, coll.count // coll.n), max_ops // per_chunk))
    alpha = step_alpha(g, model)
    times = pipeline_times(np.arange(1, cap + 1, dtype=float), phases, alpha)
    chunks = int(np.argmin(times)) + 1
    return min(max_ops, per_chunk * chunks + coll.n) * seconds_per_op(model)


def phase_times(coll: Collective, g: HopGraph, ag: TreePacking | None,
                rs: TreePacking | None, block: float, rate_ag: float | None,
                rate_rs: float | None, model: ExecutionModel = IR_MODEL
                ) -> tuple[float, ...]:
    """The predicted time of each phase of a packing alone (AllGather's, ReduceScatter's),
    before the equal-chunk preference, by the closed form (what :func:`predict_floor`
    bounds)."""
    return tuple(predict_pipeline(coll, g, a, r, block, ra, rr, model, equal_chunks=False,
                                  exact=False)[0]
                 for a, r, ra, rr in ((ag, None, rate_ag, None), (None, rs, None, rate_rs))
                 if (a or r) is not None)


def cannot_win(coll: Collective, g: HopGraph, packing_graphs: tuple, block: float,
               rate_ag: float | None, rate_rs: float | None, kept: tuple[float, ...],
               tie: float, model: ExecutionModel = IR_MODEL) -> bool:
    """Whether to skip packing the candidate graph ``g``: no packing of it can make any
    phase faster than the kept packing's phase times ``kept`` (:func:`phase_times`).

    For AllGather and ReduceScatter (one phase) that is a proof that the candidate cannot
    win: :func:`predict_floor` is a lower bound on its prediction. For AllReduce it is a
    heuristic: the overlapped phases' lockstep time of a packing no phase of which is faster
    could still be lower, where its phases crowd different links (no floor of the overlapped
    time would skip anything: the phases' floors added are not one, and what is one, the
    AllReduce bound, is below every packing found on the fabric examples)."""
    rates = [(rate_ag, None), (None, rate_rs)]
    floors = [predict_floor(coll, g, packing_graphs, block, ra, rr, model) for ra, rr in rates
              if (ra or rr) is not None]
    return all(f >= t * (1 - tie) for f, t in zip(floors, kept, strict=True))


def predict_floor(coll: Collective, g: HopGraph, packing_graphs: tuple, block: float,
                  rate_ag: float | None, rate_rs: float | None,
                  model: ExecutionModel = IR_MODEL) -> float:
    """A lower bound on :func:`predict_pipeline` for every packing of ``packing_graphs``
    (AllGather's, ReduceScatter's) whose moves are those of ``g``: every phase at load 1 (no
    packing beats the optimal rate) and the height of the eccentricity of the farthest root
    (a spanning tree is at least that deep), with the pipeline depth of one tree per root (the most
    chunks any ``k`` may pipeline). The closed form's floor: one phase on a machine with
    switches is finally predicted by its exact lockstep time, which can be lower
    (:func:`_phase_exact`), so the skip is a proof only under the closed form there."""
    phases = []
    for pg, rate in ((packing_graphs[1], rate_rs), (packing_graphs[0], rate_ag)):
        if rate is None:
            continue
        hops = shortest_path(csr_matrix((np.ones(pg.m), (pg.src, pg.dst)), shape=(pg.n, pg.n)),
                             unweighted=True)
        if not np.isfinite(hops).all():
            return 0.0                          # no spanning tree: nothing to bound by
        phases.append((block * (1 - 1e-9) / rate, int(hops.max())))
    alpha = step_alpha(g, model)
    elems = coll.count // coll.n
    per_chunk = (2 if rate_rs is not None else 0) + (1 if rate_ag is not None else 0)
    cap = max(1, min(elems, MAX_OPS // max(1, per_chunk * coll.n * (coll.n - 1))))
    return float(pipeline_times(np.arange(1, cap + 1, dtype=float), phases, alpha).min())


def pipeline_times(c: np.ndarray, phases: list[tuple[float, int]], alpha: float) -> np.ndarray:
    """Lockstep time of pipeline depths ``c`` for phases ``(bandwidth time, height)``; two
    phases are AllReduce's, overlapped (see :func:`predict_pipeline`)."""
    if len(phases) == 1:
        beta, height = phases[0]
        return (c + height - 1) * (alpha + beta / c)
    return (c - 1) * (alpha + sum(b for b, _ in phases) / c) + sum(
        h * (alpha + b / c) for b, h in phases)


def phase_load(g: HopGraph, p: TreePacking, rate: float) -> float:
    """The busiest link's load of one phase's trees relative to its share at ``rate``."""
    ok = g.capacity > 0
    return float((link_use(g, p)[ok] * rate / p.k / g.capacity[ok]).max())


def _ops_per_chunk(p: TreePacking, folds: bool) -> int:
    """Ops one chunk of every tree of ``p`` adds: a send per tree edge and, for in-trees, a
    local fold per child that is not its parent's first."""
    n, k, _ = p.parent.shape
    edges = n * (n - 1) * k
    if not folds:
        return edges
    return 2 * edges - _parents(p)


def _parents(p: TreePacking) -> int:
    """How many members of the trees of ``p`` have a child (each tree counted apart)."""
    n, k, _ = p.parent.shape
    nonroot = np.ones((n, k, n), dtype=bool)
    nonroot[np.arange(n), :, np.arange(n)] = False
    r, j, _ = np.nonzero(nonroot)
    return len(np.unique((r * k + j) * n + p.parent[nonroot]))


def predict_pipeline(coll: Collective, g: HopGraph, ag: TreePacking | None,
                     rs: TreePacking | None, block: float, rate_ag: float | None,
                     rate_rs: float | None, model: ExecutionModel = IR_MODEL,
                     chunks: int | None = None, max_ops: int = MAX_OPS,
                     equal_chunks: bool = True, exact: bool = True) -> tuple[float, int]:
    """Predicted time and pipeline depth ``C`` (lockstep, each step charged the software
    cost of ``model``, the model the planner prices with).

    One phase of height ``H`` and bandwidth time ``beta`` takes ``(C + H - 1) * (alpha +
    beta / C)``. AllReduce's phases overlap: its first ``H_rs`` steps carry only reductions,
    its last ``H_ag`` only the broadcast, the ``C - 1`` between both; that closed form picks a
    depth, and the AllReduce's time is the lockstep time of the packings
    (:func:`cclc.synth.tree_time.allreduce_lockstep_time`) at the best of that depth and a
    few around it. One phase on a machine with switches is, unless ``exact`` is false, the
    lockstep time of its packing too (:func:`_phase_exact`).
    """
    one = _one_of(ag, rs)
    k = one.k
    if rs is not None and ag is not None:
        # per phase and for both at once, from the trees crossing each link (the joint
        # packings' loads are relative to the AllReduce bound, not to a phase's optimum)
        use_rs, use_ag = link_use(g, rs), link_use(g, ag)
        ok = g.capacity > 0

        def busiest(use: np.ndarray) -> float:
            return block / k * float((use[ok] / g.capacity[ok]).max())

        phases = [(busiest(use_rs), int(rs.depth().max())),
                  (busiest(use_ag), int(ag.depth().max()))]
        both = busiest(use_rs + use_ag)
    else:
        phases = [(block * p.load / _rate(rate), int(p.depth().max()))
                  for p, rate in ((rs, rate_rs), (ag, rate_ag)) if p is not None]
    # a step costs its latency plus the software cost of the model the planner prices with
    # (nothing under the IR's lockstep model; see cclc.synth.pricing)
    alpha = step_alpha(g, model)
    elems = coll.count // coll.n                      # the smallest block, in elements
    cap = depth_cap(coll, ag, rs, max_ops)
    c = np.arange(1, cap + 1, dtype=float) if chunks is None else \
        np.array([max(1, min(chunks, max(1, elems // k)))], dtype=float)
    if len(phases) == 1:
        beta, height = phases[0]
        t = (c + height - 1) * (alpha + beta / c)
    else:
        t = (c - 1) * (alpha + both / c) + sum(h * (alpha + b / c) for b, h in phases)
    best = int(np.argmin(t))
    # the MSCCL runtimes need equal chunks: prefer a depth whose k * C chunks divide every
    # block when it costs under _EQUAL_CHUNKS_SLACK more predicted time
    blocks = {coll.count // coll.n, -(-coll.count // coll.n)}
    even = np.array([all(b % (k * int(x)) == 0 for b in blocks) for x in c])
    if equal_chunks and even.any() and not even[best]:
        alt = int(np.flatnonzero(even)[np.argmin(t[even])])
        if t[alt] <= t[best] * (1 + _EQUAL_CHUNKS_SLACK):
            best = alt
    if rs is None or ag is None:
        if exact and coll.topology.n_vertices > coll.topology.n_ranks:
            return _phase_exact(coll, g, one, rs is not None, block, alpha, c, best,
                                even, chunks is None, equal_chunks)
        return float(t[best]), int(c[best])
    # AllReduce: the closed form charges every fill and drain step a whole phase's load and
    # the slowest move's latency, so it can be off either way; the lockstep time of the
    # packings (cclc.synth.tree_time) decides between the depth it chose and a few others
    options = {int(c[best])}
    if chunks is None:
        for x in (max(1, int(c[best] / 1.5)), min(cap, int(c[best] * 1.5)), cap):
            if even[best] and not even[x - 1]:
                shallower = np.flatnonzero(even[:x])
                if not len(shallower):
                    continue
                x = int(shallower[-1]) + 1                  # the deepest equal-chunk one
            options.add(x)
    is_even = {int(x): bool(e) for x, e in zip(c, even, strict=True)}
    if equal_chunks and even.any():
        options.add(int(c[np.flatnonzero(even)[np.argmin(t[even])]]))   # the best equal one
    timed = {x: allreduce_lockstep_time(g, rs, ag, block, x, alpha) for x in sorted(options)}
    chosen = min(timed, key=lambda x: timed[x])
    equal = [x for x in timed if is_even.get(x, False)]
    if equal_chunks and equal and not is_even.get(chosen, False):
        # the same preference for chunks the MSCCL runtimes can address, on the exact times
        alt = min(equal, key=lambda x: timed[x])
        if timed[alt] <= timed[chosen] * (1 + _EQUAL_CHUNKS_SLACK):
            chosen = alt
    return timed[chosen], chosen


def _one_of(ag: TreePacking | None, rs: TreePacking | None) -> TreePacking:
    """The AllGather packing, else the ReduceScatter one (a prediction has at least one)."""
    p = ag or rs
    if p is None:
        raise ValueError("a tree pipeline needs an AllGather or a ReduceScatter packing")
    return p


def _rate(rate: float | None) -> float:
    """The ForestColl rate of a phase that has a packing (so it has a rate)."""
    if rate is None:
        raise ValueError("a phase packed without its ForestColl rate")
    return rate


def step_alpha(g: HopGraph, model: ExecutionModel = IR_MODEL) -> float:
    """What a network step costs besides its busiest link: the slowest move's latency plus
    the software cost of the model the planner prices with (nothing under the IR's lockstep
    model; see :mod:`cclc.synth.pricing`)."""
    return (float(g.latency.max()) if g.m else 0.0) + step_cost(model)


def depth_cap(coll: Collective, ag: TreePacking | None, rs: TreePacking | None,
               max_ops: int) -> int:
    """The deepest pipeline (chunks per tree) within ``max_ops`` ops and one element a chunk."""
    k = _one_of(ag, rs).k
    elems = coll.count // coll.n                      # the smallest block, in elements
    # an in-tree edge is a send and, for all but a first child, a local fold: ops per chunk
    # of every tree, counted
    per_chunk = sum(_ops_per_chunk(p, folds) for p, folds in ((rs, True), (ag, False))
                    if p is not None)
    # besides: at most a local copy per rank and a seed copy per inner member of every in-tree
    # (n * (1 + n * k), the most trees can have, left 14% of the 128-GPU fabric's AllReduce
    # depth unused: 3 chunks instead of 4, unequal ones)
    fixed = coll.n + (_parents(rs) if rs is not None else 0)
    return max(1, min(elems // k, max(0, max_ops - fixed) // max(1, per_chunk)))


def _phase_exact(coll: Collective, g: HopGraph, p: TreePacking, reduce: bool, block: float,
                 alpha: float, c: np.ndarray, best: int, even: np.ndarray,
                 free: bool, equal_chunks: bool) -> tuple[float, int]:
    """One phase on a machine with switches: the lockstep time of the packing itself
    (:func:`cclc.synth.phase_time.phase_lockstep_time`) at the closed form's depth ``c[best]``
    and, unless the depth was given (``free`` false), shallow ones and a few around it. The
    closed form charges every fill and drain step a whole step; trees whose levels share the
    busiest links evenly fill for less (the packings balanced per level of
    :func:`cclc.algorithms.tree_search.synthesize_trees`)."""
    options = {int(c[best])}
    if free:
        options |= {int(x) for x in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, c[best] / 2, c[best] * 2)
                    if 1 <= x <= len(c)}
    exact = {x: phase_lockstep_time(g, p, block, x, alpha, reduce) for x in sorted(options)}
    chosen = min(exact, key=lambda x: exact[x])
    equal = [x for x in exact if even[x - 1]] if len(c) == len(even) and free else []
    if equal_chunks and equal and not even[chosen - 1]:
        alt = min(equal, key=lambda x: exact[x])
        if exact[alt] <= exact[chosen] * (1 + _EQUAL_CHUNKS_SLACK):
            chosen = alt
    return exact[chosen], chosen


#: the predicted time a pipeline depth with equal chunks may cost over the best depth
_EQUAL_CHUNKS_SLACK = 0.005
