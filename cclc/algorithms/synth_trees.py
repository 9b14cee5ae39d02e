"""``synth`` for AllGather, ReduceScatter and AllReduce: packed spanning trees, pipelined.

The packing and its optimum are in :mod:`cclc.synth.trees`, the ops in
:mod:`cclc.synth.tree_schedule`. On a machine with switches two graphs compete: the hop graph
(fewest-hop rank-to-rank paths) and ForestColl's rank-only graph left by splitting the switches
off (:mod:`cclc.synth.splitting`); the packing with the lower predicted time wins. An
AllReduce on a machine without switches first packs its in-trees and out-trees jointly
(:mod:`cclc.synth.joint_trees`; ``status`` ``optimal`` there means the trees meet the
AllReduce bandwidth bound), raced against the phases packed apart.

This module chooses the number of trees per root ``k`` and
of chunks per tree ``C``, keeps to the time budget as a deadline for the whole synthesis (the
templates are raced first; the packers read the clock before every tree they grow and stop
early enough for the ops to be built in what is left, see :func:`_expected_build`; a packing
not whole at the deadline is dropped, and with none whole a template is returned), skips a
candidate graph whose best possible prediction (load 1, the height of
its eccentricity) cannot beat the packing kept, and records what it did in the schedule's
``params``: ``solver`` (``"forestcoll-maxflow+congestion-trees"``), ``status``
(``optimal`` when the packing reaches the ForestColl rate, ``feasible`` when it does not,
``budget`` when the budget cut the search short, ``fallback`` when a template was returned
instead: no packing was finished in time, or the template is faster), ``solve_s``,
``lp_fraction`` (the collective's time at the ForestColl optimum over the returned schedule's
time in the lockstep IR model; for AllReduce not the optimum, which is ReduceScatter's plus
AllGather's and which overlapping the two phases on full-duplex links can beat, but the lower
bound of :mod:`cclc.bounds`, its joint LP of both phases, so at most 1), and on a fallback
``template``.

Hint parameters: ``budget`` (seconds, default 30); ``race`` (1 by default: return the fastest
template when one beats the synthesized schedule; 0, the default under ``algorithm auto``,
whose planner races every candidate anyway: always the synthesized one); ``trees``
(``k``; default: the best of 1..6 by predicted time, :data:`_TREES_TRIED`); ``chunks``
(``C``; default: the pipeline depth that minimizes ``(C + D) * (alpha + beta / C)`` for tree
depth ``D``, latency ``alpha`` and bandwidth time ``beta``, with at most :data:`MAX_OPS`
ops, :data:`MAX_OPS_AUTO` under ``algorithm auto`` so that the candidate costs the planner
what a template does, fewer when the time left would not build them: :func:`op_limit`,
:func:`_ops_left`); ``taper`` (1 by default: chunks that shrink down the pipeline where the
lockstep model says they drain it sooner, :func:`_taper`; 0: equal chunks).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import shortest_path

from cclc.algorithms import Algorithm, NoBound, every_rank_ops, register
from cclc.algorithms.common import bad_int_param, even_split, hint_int
from cclc.algorithms.synth_flows import budget_seconds
from cclc.collective import Collective, CollectiveKind
from cclc.errors import CollectiveError
from cclc.ir import Schedule
from cclc.synth import tree_schedule
from cclc.synth.fabric_symmetry import find_free_automorphism, member_powers
from cclc.synth.hop_graph import HopGraph, hop_graph
from cclc.synth.joint_trees import link_use, pack_allreduce_trees
from cclc.synth.phase_time import edge_levels, phase_lockstep_time
from cclc.synth.pricing import pricing_model, step_cost
from cclc.synth.splitting import split_switches
from cclc.synth.taper import link_loads, pipeline_time, tapered_units
from cclc.synth.tree_lp import (
    ALL_LEVELS,
    depth_limit,
    fractional_packing,
    rounded_packing,
    windows,
)
from cclc.synth.tree_time import allreduce_lockstep_time, edge_starts
from cclc.synth.trees import TreePacking, flow_network, forestcoll_rate, pack_trees, translations

__all__ = ["MAX_OPS", "MAX_OPS_AUTO", "TreeSynthesis", "build_synth_trees", "op_limit",
           "synthesize_trees"]

_KINDS = frozenset({CollectiveKind.ALLGATHER, CollectiveKind.REDUCESCATTER,
                    CollectiveKind.ALLREDUCE})
#: the most ops a default pipeline depth may produce (bounds compile, verify and emit time)
MAX_OPS = 6_000_000
#: the same under ``algorithm auto``
MAX_OPS_AUTO = 200_000
#: default time budget of the search, seconds
DEFAULT_BUDGET = 30.0
SOLVER = "forestcoll-maxflow+congestion-trees"


@dataclass(frozen=True, eq=False)
class TreeSynthesis:
    """The packings chosen for a collective and the optimum they are measured against.

    ``ag`` packs out-trees (AllGather, the second half of AllReduce), ``rs`` in-trees (as
    out-trees of the reversed moves); either is ``None`` when the collective does not need
    it. ``optimal_time`` is the collective's time at the ForestColl rate (seconds); for
    AllReduce the lower bound of :mod:`cclc.bounds` instead (its joint LP of both phases).
    """

    graph: HopGraph
    ag: TreePacking | None
    rs: TreePacking | None
    optimal_time: float
    rate_ag: float | None
    rate_rs: float | None
    status: str
    solve_s: float


def _allreduce_reference(coll: Collective) -> tuple[float, float]:
    """AllReduce's reference time: the bound of :mod:`cclc.bounds` (its joint reduce-scatter +
    allgather LP, where it runs; else the closed forms). Not the sum of the two phases'
    optima: overlapping the phases on full-duplex links beats that sum. Also returns the
    strongest bandwidth bound (all but the latency bound), the joint packing's target."""
    from cclc.bounds import bounds

    # the best of all: the LP prices bandwidth only, the closed forms include latency
    b = bounds(coll)
    return b.best, max(x.seconds for x in b.items if x.name != "latency")


def _applicable(coll: Collective, **params) -> str | None:
    if coll.kind not in _KINDS:
        return f"synth trees do not serve {coll.kind.value}"
    unknown = sorted(set(params) - {"budget", "trees", "chunks", "race", "taper"})
    if unknown:
        return f"synth takes budget, trees, chunks, race and taper (got {', '.join(unknown)})"
    for key, low in (("trees", 1), ("chunks", 1), ("race", 0), ("taper", 0)):
        why = bad_int_param(params, key, low)
        if why:
            return why
    budget = params.get("budget", DEFAULT_BUDGET)
    if not isinstance(budget, (int, float)) or budget <= 0:
        return f"parameter budget must be a number of seconds > 0, got {budget!r}"
    if coll.n < 2:
        return "synth needs at least 2 ranks"
    g = hop_graph(coll)
    if not _strongly_connected(g):
        return ("the group's members do not reach each other over moves the routing "
                "carries without leaving the group")
    return None


def _strongly_connected(g: HopGraph) -> bool:
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import connected_components

    mat = csr_matrix((np.ones(g.m), (g.src, g.dst)), shape=(g.n, g.n))
    return connected_components(mat, directed=True, connection="strong")[0] == 1


def _block_bytes(coll: Collective) -> float:
    """Bytes of one root's block (what each tree family carries)."""
    return coll.size / coll.n


def synthesize_trees(coll: Collective, budget: float = DEFAULT_BUDGET,
                     trees: int | None = None, reserve: float = 0.0,
                     max_ops: int | None = None) -> TreeSynthesis | None:
    """Packings for ``coll`` within ``budget`` seconds, or ``None`` when none was finished.

    The function 14a's benchmark (and anyone) can call to get the optimum and the packing
    without building ops. ``trees`` fixes ``k``; otherwise 1..6 are tried while time is left
    and the one with the lowest predicted time wins. ``reserve``: seconds of the budget kept
    for what comes after the packing (building the ops); with ``max_ops`` (the op limit of
    the build) at least the time the ops of the pipeline depth the bound suggests take (see
    :func:`_expected_build`). The packers stop that long before the budget ends (at most
    half of it is kept), and the ForestColl rate counts in the budget too.
    """
    t0, cpu0 = time.monotonic(), time.process_time()
    g = hop_graph(coll)
    node_perm, edge_perm = translations(coll, g)
    orbits, symmetry = node_perm, None
    auto = (find_free_automorphism(coll.topology, coll.group)
            if len(node_perm) == 1 and coll.topology.dims is None else None)
    if auto is not None:
        # identical servers: one max-flow per orbit of a free automorphism in the rate
        # search and the switch splitting (the trees are still packed for every root: see
        # cclc.synth.fabric_symmetry)
        orbits = member_powers(coll, auto)
    reps = sorted({int(orbits[:, v].min()) for v in range(coll.n)})
    if auto is not None:
        symmetry = (auto, [int(coll.group[v]) for v in reps])
    net, members = flow_network(coll)
    probe = [members[v] for v in reps]
    block = _block_bytes(coll)
    need_ag = coll.kind in (CollectiveKind.ALLGATHER, CollectiveKind.ALLREDUCE)
    need_rs = coll.kind in (CollectiveKind.REDUCESCATTER, CollectiveKind.ALLREDUCE)
    rate_ag = forestcoll_rate(net, members, probe) if need_ag else None
    rate_rs = forestcoll_rate(net.reverse(copy=True), members, probe) if need_rs else None
    optimal = sum(block / r for r in (rate_ag, rate_rs) if r is not None)
    expected = 0.0 if max_ops is None else _expected_build(coll, g, block, rate_ag, rate_rs,
                                                           max_ops) * _slowdown(t0, cpu0)
    deadline = t0 + budget - min(max(reserve, expected), budget * _MAX_RESERVE)
    best: tuple[float, HopGraph, TreePacking | None, TreePacking | None] | None = None
    kept = None        # the kept separate packing's phase times (see _cannot_win)
    if coll.kind is CollectiveKind.ALLREDUCE:
        optimal, best = _allreduce_start(coll, g, node_perm, edge_perm, trees, block, rate_ag,
                                         rate_rs, _share(deadline, _JOINT_SHARE))
    # (physical moves, AllGather packing graph, ReduceScatter packing graph, symmetry,
    #  packings -> physical moves, numbers of trees to try)
    ks = [trees] if trees else list(_TREES_TRIED)
    candidates = [(g, g, g.reversed(), node_perm, edge_perm, None, ks)]
    if coll.topology.n_vertices > coll.topology.n_ranks:
        # the switch splitting may take half the budget; the hop graph's packing the rest
        split = _split_candidate(coll, rate_ag, rate_rs, min(t0 + budget / 2, deadline),
                                 symmetry)
        if split is not None:
            candidates.append(split + ([trees] if trees else _SPLIT_TREES,))
    margin = _BETTER_BY if coll.kind is CollectiveKind.ALLREDUCE else 1e-9
    for phys, g_ag, g_rs, nodes, edges, realize, k_list in candidates:
        if kept is not None and _cannot_win(coll, phys, (g_ag, g_rs), block, rate_ag,
                                            rate_rs, kept, max(margin, _TIE)):
            # on the 128-GPU fabric example this skips 30 s of packing the split graph
            continue
        for k in k_list:
            if time.monotonic() > deadline:
                break
            packed = [pack_trees(pg, rate, k, nodes, edges, deadline) if rate is not None
                      else None for pg, rate in ((g_ag, rate_ag), (g_rs, rate_rs))]
            if any(p is None and r is not None for p, r in zip(packed, (rate_ag, rate_rs),
                                                                 strict=True)):
                break                       # the deadline passed before a packing was whole
            # the column generation only where no packing kept reaches the optimum
            improve = best is None or any(p is not None and p.status != "optimal"
                                          for p in best[2:])
            options = _options(phys, realize if improve else None, *packed, rate_ag, rate_rs,
                               deadline, trees, realize)
            for ag, rs in options:
                # the op cap the build will use (fewer chunks under `auto`)
                predicted = _predict(coll, phys, ag, rs, block, rate_ag, rate_rs,
                                     max_ops=_op_cap(coll))[0]
                if best is None or predicted < best[0] * (1 - margin):
                    best = (predicted, phys, ag, rs)
                    kept = _phase_times(coll, phys, ag, rs, block, rate_ag, rate_rs)
            if len(options) > 1 or all(p is None or p.status == "optimal" for p in (ag, rs)):
                break
    if best is None:
        return None
    _, g, ag, rs = best
    statuses = {p.status for p in (ag, rs) if p is not None}
    status = next(s for s in ("budget", "feasible", "optimal") if s in statuses)
    return TreeSynthesis(g, ag, rs, optimal, rate_ag, rate_rs, status, time.monotonic() - t0)


#: how much lower a later AllReduce candidate's predicted time must be to replace the one
#: kept: the prediction is the lockstep time of the packings (cclc.synth.tree_time), equal to
#: the simulated time up to the chunks' rounding to whole elements (a closed form that charged
#: the fill and drain steps whole loads needed 2% here)
_BETTER_BY = 0.002

#: the numbers of trees per root tried, in this order, while the budget lasts and no packing
#: reaches the optimum: a whole number of trees per link balances unevenly, and the best
#: ``k`` is not monotone (the 3x3x3 torus with one failed link, 128 MiB AllGather: 84.6,
#: 92.1, 94.9, 96.4, 97.5 (optimal) % of the bound for k = 1..5; torus4x4_failed_rank's
#: AllReduce 88.2, 91.9, 93.9, 94.8, 95.3, 93.8 % for k = 1..6)
_TREES_TRIED = (1, 2, 3, 4, 5, 6)

#: the share of the budget the joint AllReduce packing may take (more trees per root pack
#: closer to the bound: 96.5%, 98.7%, 99.5% for 1, 2, 3 on the 4x4x4 torus with two faults)
_JOINT_SHARE = 0.8

#: the most of the budget kept for building the ops (the packers need the rest)
_MAX_RESERVE = 0.5

#: seconds per op of what follows the packing as a user gets it: choosing the pipeline depth,
#: building the ops, the lockstep simulation that reports ``lp_fraction``, and the compile's
#: verification, prediction and JSON output (11.6 s after the packing for the 6.0M ops of
#: the faulty 5x5x5 torus's AllReduce, `cclc compile` under cProfile: 1.9 us per op); on a
#: machine shared with other work, stretched by :func:`_slowdown`
_SECONDS_PER_OP = 2e-6


#: what predicting the schedule under the emitting backend's model adds per op (the planner
#: predicts every candidate under it): the nccl backend's dataflow over lanes 4.7 us, the
#: msccl backend's event simulation 0.9 us (CPU seconds on the faulty 5x5x5 torus's
#: AllReduce of 0.77M ops; the IR's lockstep model is part of _SECONDS_PER_OP)
_PREDICT_SECONDS_PER_OP = {"dataflow": 4.7e-6, "event": 0.9e-6}


def _seconds_per_op() -> float:
    return _SECONDS_PER_OP + _PREDICT_SECONDS_PER_OP.get(pricing_model().mode, 0.0)


def op_limit(budget: float, max_ops: int) -> int:
    """The most ops a default pipeline depth may give: ``max_ops``, fewer when building and
    predicting them would take more than :data:`_MAX_RESERVE` of the budget (under the
    model the planner prices with: the nccl backend's dataflow prediction costs more than
    twice the rest)."""
    return max(1, min(max_ops, int(budget * _MAX_RESERVE / _seconds_per_op())))


def _share(deadline: float, share: float) -> float:
    """The instant ``share`` of the time left until ``deadline`` from now."""
    now = time.monotonic()
    return now + max(0.0, deadline - now) * share


def _expected_build(coll: Collective, g: HopGraph, block: float, rate_ag: float | None,
                    rate_rs: float | None, max_ops: int) -> float:
    """Seconds the ops will likely take to build after the packing: one tree per root (the
    usual choice) at the pipeline depth the closed form picks for phases at the ForestColl
    rates, a level deeper than the farthest member (the trees' depth limit), each member
    sending a chunk once per phase and, in an in-tree, folding it at most once more. Only an
    estimate: the build caps the ops by the time left (:func:`_ops_left`)."""
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
    alpha = (float(g.latency.max()) if g.m else 0.0) + step_cost(pricing_model())
    times = _pipeline_times(np.arange(1, cap + 1, dtype=float), phases, alpha)
    chunks = int(np.argmin(times)) + 1
    return min(max_ops, per_chunk * chunks + coll.n) * _seconds_per_op()


def _ops_left(end: float, max_ops: int, slowdown: float = 1.0) -> int:
    """The op limit that builds by ``end`` (a ``time.monotonic()`` instant) at
    :func:`_seconds_per_op` times ``slowdown``: ``max_ops`` when time allows, never under
    :data:`MAX_OPS_AUTO` (a schedule as small as `auto`'s is built even when the packing
    overran)."""
    left = end - time.monotonic()
    return min(max_ops, max(MAX_OPS_AUTO, int(left / (_seconds_per_op() * slowdown))))


def _slowdown(t0: float, cpu0: float) -> float:
    """Wall-clock seconds per CPU second of this process since ``(t0, cpu0)`` (from
    ``time.monotonic()`` and ``time.process_time()``), between 1 and :data:`_MAX_SLOWDOWN`:
    how much a machine shared with other work stretches the per-op times, which were measured
    on a machine this process had to itself. 1 when too little has run to tell."""
    cpu = time.process_time() - cpu0
    if cpu < 0.2:
        return 1.0
    return min(_MAX_SLOWDOWN, max(1.0, (time.monotonic() - t0) / cpu))


#: the most a shared machine is taken to stretch the build (beyond it, the op limit would
#: leave too few chunks to pipeline)
_MAX_SLOWDOWN = 4.0


#: relative difference under which a candidate graph's best possible prediction counts as a
#: tie with the packing kept (not worth packing: it could win only by the equal-chunk
#: preference of :func:`_predict`, a tie-break, not speed)
_TIE = 1e-6

#: trees per root tried on the split graph: its logical edges hold small shares of the
#: switches, so equal-weight trees need more of them to fit the capacities closely (most
#: promising first: the budget may end the list)
_SPLIT_TREES = [8, 4, 12, 2, 1]


def _split_candidate(coll: Collective, rate_ag: float | None, rate_rs: float | None,
                     deadline: float, symmetry=None):
    """ForestColl's construction: pack on the rank-only graphs left by splitting the switches
    off (:mod:`cclc.synth.splitting`), parallel logical edges of a pair merged.

    Returns ``(physical moves, AllGather packing graph, ReduceScatter packing graph, node
    perm, edge perm, realize)`` or ``None`` when a split did not finish in time; ``realize``
    maps packings of the merged graphs to moves of the physical graph (AllGather edges
    first, then ReduceScatter ones), spreading a pair's trees over its parallel paths in
    proportion to their capacities.
    """
    parts = []
    for rate, reverse in ((rate_ag, False), (rate_rs, True)):
        sg = None if rate is None else split_switches(coll, rate, reverse, deadline, symmetry)
        if rate is not None and (sg is None or not len(sg.src)):
            return None
        parts.append(sg)
    present = [p for p in parts if p is not None]
    paths = [path for p in present for path in p.paths]
    lengths = np.array([len(p) for p in paths], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    links = np.concatenate([np.asarray(p, dtype=np.int64) for p in paths])
    topo = coll.topology
    phys = HopGraph(coll.n, np.concatenate([p.src for p in present]),
                    np.concatenate([p.dst for p in present]), offsets, links,
                    np.where(topo.link_failed, 0.0, topo.link_bandwidth),
                    np.add.reduceat(topo.link_latency[links], offsets[:-1]).astype(float))
    n = coll.n
    merged, groups = [], []
    first = 0
    for sg in parts:
        if sg is None:
            merged.append(None)
            groups.append(None)
            continue
        pair, inverse = np.unique(sg.src * n + sg.dst, return_inverse=True)
        cap = np.bincount(inverse, weights=sg.capacity)
        m = len(pair)
        lat = np.zeros(m)
        np.maximum.at(lat, inverse, phys.latency[first:first + len(sg.src)])
        merged.append(HopGraph(n, pair // n, pair % n, np.arange(m + 1), np.arange(m), cap,
                               lat))
        groups.append((first + np.arange(len(sg.src)), inverse, sg.capacity))
        first += len(sg.src)

    def realize(ag, rs):
        return tuple(None if p is None else _on_links(phys, p, rate, *grp)
                     for p, rate, grp in ((ag, rate_ag, groups[0]), (rs, rate_rs, groups[1])))

    g_ag = merged[0]
    g_rs = merged[1].reversed() if merged[1] is not None else None
    ident = np.arange(n)[None, :]
    edge_ident = np.arange(max(g.m for g in merged if g is not None))[None, :]
    return phys, g_ag, g_rs, ident, edge_ident, realize


def _op_cap(coll: Collective) -> int:
    """The most ops the built schedule may have (:data:`MAX_OPS_AUTO` under `auto`)."""
    return MAX_OPS_AUTO if coll.algorithm.name == "auto" else MAX_OPS


def _options(phys: HopGraph, exact_on, ag: TreePacking | None, rs: TreePacking | None,
             rate_ag: float | None, rate_rs: float | None, deadline: float,
             trees: int | None, realize) -> list[tuple[TreePacking | None, TreePacking | None]]:
    """The heuristic's packings (as moves of ``phys``, through ``realize`` on the split graph)
    and, when ``exact_on`` (the split graph's ``realize``: no packing kept is optimal) and
    they stop above x*, the column generation's (:func:`_exact_packings`, seeded with them)."""
    if realize is None:
        return [(ag, rs)]
    ag, rs = realize(ag, rs)
    if exact_on is None or all(p is None or p.status == "optimal" for p in (ag, rs)):
        return [(ag, rs)]
    return [(ag, rs)] + _exact_packings(phys, ag, rs, rate_ag, rate_rs, deadline,
                                        (trees,) if trees else None)


#: trees per root the column generation's weights are rounded to (more trees round closer to
#: the weights, 2.1% to 0.6% above x* from 8 to 32 on the PCIe fabric example, but pipeline
#: fewer chunks under the op cap: the prediction picks)
_EXACT_TREES = (8, 16, 24, 32)
#: the same for the trees whose levels share the busy links evenly (97.8% and 98.2% of the
#: bound for 32 and 64 on the PCIe fabric's 128 MiB AllGather, at 6 chunks per tree)
_LEVEL_TREES = (32, 64)
#: the pipeline depth those trees are balanced for (:func:`cclc.synth.tree_lp.windows`): on
#: the PCIe fabric's AllGather, balanced for one chunk they reach 96.6% at 128 MiB, for four
#: 98.2% (at 6 chunks) and 99.1% at 1 GiB (at 16)
_LEVEL_CHUNKS = 4


def _exact_packings(phys: HopGraph, ag: TreePacking | None, rs: TreePacking | None,
                    rate_ag: float | None, rate_rs: float | None, deadline: float,
                    ks: tuple[int, ...] | None = None
                    ) -> list[tuple[TreePacking | None, TreePacking | None]]:
    """Packings of ``phys``'s moves from the fractional optima of
    :func:`cclc.synth.tree_lp.fractional_packing` (seeded with ``ag`` and ``rs``): the least
    busiest-link load rounded to each of :data:`_EXACT_TREES` trees per root and, for one
    phase, the least lockstep bandwidth time of a pipeline of :data:`_LEVEL_CHUNKS` chunks
    (the sum over its steps of the busiest link among the levels they move,
    :func:`cclc.synth.tree_lp.windows`) rounded to :data:`_LEVEL_TREES`; ``ks``: the
    numbers of trees per root instead of both (the user's ``trees``)."""
    t0 = time.monotonic()
    phases = [(p, rate, graph, graph is not phys) for p, rate, graph in
              ((ag, rate_ag, phys), (rs, rate_rs, phys.reversed())) if p is not None]
    plans = [(ALL_LEVELS, ks or _EXACT_TREES)]
    if len(phases) == 1:
        plans.append((windows(depth_limit(phys), _LEVEL_CHUNKS), ks or _LEVEL_TREES))
    out = []
    fracs = [None] * len(phases)
    for i, (wins, ks) in enumerate(plans):
        # the column generation stops with time left for the rounding; a later LP starts
        # from the earlier one's trees
        stop = time.monotonic() + (deadline - time.monotonic()) * (0.4 if i + 1 < len(plans)
                                                                  else 0.8)
        fracs = [fractional_packing(graph, rate, stop, p, wins, reduce,
                                    [] if f is None else [t for t, w in
                                                          zip(f.trees, f.weight, strict=True)
                                                          if w > 1e-9])
                 for (p, rate, graph, reduce), f in zip(phases, fracs, strict=True)]
        if any(f is None for f in fracs):
            break
        for k in ks:
            pair = [rounded_packing(graph, frac, rate, k, deadline, p if p.k == k else None,
                                    time.monotonic() - t0, wins, reduce)
                    for frac, (p, rate, graph, reduce) in zip(fracs, phases, strict=True)]
            if any(p is None for p in pair):
                break
            out.append((pair[0] if ag is not None else None,
                        pair[-1] if rs is not None else None))
    return out


def _on_links(phys: HopGraph, p: TreePacking, rate: float, moves: np.ndarray,
              pair_of: np.ndarray, capacity: np.ndarray) -> TreePacking:
    """Packing ``p`` of a merged split graph as moves of ``phys``: every use of a pair goes
    to the parallel logical edge (``moves[i]``, of pair ``pair_of[i]``) with the most
    capacity left; the load is measured on the physical links."""
    n, k = p.parent.shape[:2]
    share = rate / k
    left = capacity.astype(float).copy()
    by_pair: dict[int, list[int]] = {}
    for i, pr in enumerate(pair_of.tolist()):
        by_pair.setdefault(pr, []).append(i)
    edge = p.edge.copy()
    nonroot = np.ones((n, k, n), dtype=bool)
    nonroot[np.arange(n), :, np.arange(n)] = False
    flat = np.flatnonzero(nonroot.ravel())
    out = edge.ravel()
    for pos, pr in zip(flat.tolist(), out[flat].tolist(), strict=True):
        options = by_pair[pr]
        best = max(options, key=lambda i: left[i]) if len(options) > 1 else options[0]
        left[best] -= share
        out[pos] = moves[best]
    edge = out.reshape(n, k, n)
    use = np.zeros(len(phys.capacity))
    chosen, count = np.unique(edge[nonroot], return_counts=True)
    rows = np.repeat(np.arange(len(chosen)), np.diff(phys.offsets)[chosen])
    idx = np.concatenate([phys.links[a:b] for a, b in
                          zip(phys.offsets[chosen], phys.offsets[chosen + 1], strict=True)])
    np.add.at(use, idx, count[rows])
    ok = phys.capacity > 0
    load = float((use[ok] * share / phys.capacity[ok]).max())
    status = "optimal" if load <= 1 + 1e-9 else ("budget" if p.status == "budget" else "feasible")
    return TreePacking(p.parent, edge, load, status, p.solve_s)


def _phase_times(coll: Collective, g: HopGraph, ag: TreePacking | None,
                 rs: TreePacking | None, block: float, rate_ag: float | None,
                 rate_rs: float | None) -> tuple[float, ...]:
    """The predicted time of each phase of a packing alone (AllGather's, ReduceScatter's),
    before the equal-chunk preference, by the closed form (what :func:`_predict_floor`
    bounds)."""
    return tuple(_predict(coll, g, a, r, block, ra, rr, equal_chunks=False, exact=False)[0]
                 for a, r, ra, rr in ((ag, None, rate_ag, None), (None, rs, None, rate_rs))
                 if (a or r) is not None)


def _cannot_win(coll: Collective, g: HopGraph, packing_graphs: tuple, block: float,
                rate_ag: float | None, rate_rs: float | None, kept: tuple[float, ...],
                tie: float) -> bool:
    """Whether to skip packing the candidate graph ``g``: no packing of it can make any
    phase faster than the kept packing's phase times ``kept`` (:func:`_phase_times`).

    For AllGather and ReduceScatter (one phase) that is a proof that the candidate cannot
    win: :func:`_predict_floor` is a lower bound on its prediction. For AllReduce it is a
    heuristic: the overlapped phases' lockstep time of a packing no phase of which is faster
    could still be lower, where its phases crowd different links (no floor of the overlapped
    time would skip anything: the phases' floors added are not one, and what is one, the
    AllReduce bound, is below every packing found on the fabric examples)."""
    rates = [(rate_ag, None), (None, rate_rs)]
    floors = [_predict_floor(coll, g, packing_graphs, block, ra, rr) for ra, rr in rates
              if (ra or rr) is not None]
    return all(f >= t * (1 - tie) for f, t in zip(floors, kept, strict=True))


def _predict_floor(coll: Collective, g: HopGraph, packing_graphs: tuple, block: float,
                   rate_ag: float | None, rate_rs: float | None) -> float:
    """A lower bound on :func:`_predict` for every packing of ``packing_graphs`` (AllGather's,
    ReduceScatter's) whose moves are those of ``g``: every phase at load 1 (no packing beats
    the optimal rate) and the height of the eccentricity of the farthest root (a spanning
    tree is at least that deep), with the pipeline depth of one tree per root (the most
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
    alpha = (float(g.latency.max()) if g.m else 0.0) + step_cost(pricing_model())
    elems = coll.count // coll.n
    per_chunk = (2 if rate_rs is not None else 0) + (1 if rate_ag is not None else 0)
    cap = max(1, min(elems, MAX_OPS // max(1, per_chunk * coll.n * (coll.n - 1))))
    return float(_pipeline_times(np.arange(1, cap + 1, dtype=float), phases, alpha).min())


def _pipeline_times(c: np.ndarray, phases: list[tuple[float, int]], alpha: float) -> np.ndarray:
    """Lockstep time of pipeline depths ``c`` for phases ``(bandwidth time, height)``; two
    phases are AllReduce's, overlapped (see :func:`_predict`)."""
    if len(phases) == 1:
        beta, height = phases[0]
        return (c + height - 1) * (alpha + beta / c)
    return (c - 1) * (alpha + sum(b for b, _ in phases) / c) + sum(
        h * (alpha + b / c) for b, h in phases)


def _allreduce_start(coll: Collective, g: HopGraph, node_perm, edge_perm, trees: int | None,
                     block: float, rate_ag: float, rate_rs: float, deadline: float):
    """AllReduce's reference time and, on a machine without switches, the best joint packing
    of its in-trees and out-trees (``(predicted, g, ag, rs)`` or ``None``)."""
    optimal, bandwidth_time = _allreduce_reference(coll)
    if coll.topology.n_vertices != coll.topology.n_ranks:
        # not through switches: there the shallow trees over fewest-hop paths overload the
        # roots' uplinks (34% of the per-rank bound on hgx16_leafspine, 31% on
        # pcie_oversubscribed; on the split graph's paths 75% and 91% against 81% and 93% for
        # the phases packed apart)
        return optimal, None
    # both phases' trees under one set of link prices (cclc.synth.joint_trees), within
    # _JOINT_SHARE of the budget; the separately packed phases race it in what is left (on
    # the faulty tori of benchmarks/synth_trees.py each of them fills the links at its own
    # optimum: 76-84% of the bound)
    return optimal, _joint_allreduce(coll, g, node_perm, edge_perm,
                                     [trees] if trees else list(_TREES_TRIED), block,
                                     bandwidth_time,
                                     rate_ag, rate_rs, deadline)


def _joint_allreduce(coll: Collective, g: HopGraph, node_perm: np.ndarray,
                     edge_perm: np.ndarray, ks: list[int], block: float,
                     bandwidth_time: float, rate_ag: float, rate_rs: float, deadline: float):
    """The best joint AllReduce packing over ``ks`` trees per root by predicted time:
    ``(predicted, g, ag, rs)``, or ``None`` when the deadline came before the first."""
    best = None
    # trees as deep as the farthest member's hop distance, then a level deeper: neither wins
    # everywhere (the faulty 4x4x4 torus balances as well a level shallower; the 4x4 mesh
    # and the 4x4 torus with a failed rank balance better with the extra level)
    for k, slack in ((k, slack) for k in ks for slack in (0, 1)):
        if best is not None and time.monotonic() > deadline:
            break
        packed = pack_allreduce_trees(g, block / bandwidth_time, k, node_perm, edge_perm,
                                      deadline, depth_slack=slack)
        if packed is None:
            break                       # the deadline passed before every root had its trees
        rs, ag = packed
        # each packing's load relative to its own phase's optimum, as TreePacking says
        rs, ag = (replace(p, load=_phase_load(g, p, rate)) for p, rate in
                  ((rs, rate_rs), (ag, rate_ag)))
        predicted = _predict(coll, g, ag, rs, block, None, None, max_ops=_op_cap(coll))[0]
        if best is None or predicted < best[0] * (1 - _BETTER_BY):
            best = (predicted, g, ag, rs)
        if ag.status == "optimal":
            break
    return best


def _phase_load(g: HopGraph, p: TreePacking, rate: float) -> float:
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


def _predict(coll: Collective, g: HopGraph, ag: TreePacking | None, rs: TreePacking | None,
             block: float, rate_ag: float | None, rate_rs: float | None,
             chunks: int | None = None, max_ops: int = MAX_OPS, equal_chunks: bool = True,
             exact: bool = True) -> tuple[float, int]:
    """Predicted time and pipeline depth ``C`` (lockstep, each step charged the pricing
    model's software cost).

    One phase of height ``H`` and bandwidth time ``beta`` takes ``(C + H - 1) * (alpha +
    beta / C)``. AllReduce's phases overlap: its first ``H_rs`` steps carry only reductions,
    its last ``H_ag`` only the broadcast, the ``C - 1`` between both; that closed form picks a
    depth, and the AllReduce's time is the lockstep time of the packings
    (:func:`cclc.synth.tree_time.allreduce_lockstep_time`) at the best of that depth and a
    few around it. One phase on a machine with switches is, unless ``exact`` is false, the
    lockstep time of its packing too (:func:`_phase_exact`).
    """
    k = (ag or rs).k
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
        phases = [(block * p.load / rate, int(p.depth().max()))
                  for p, rate in ((rs, rate_rs), (ag, rate_ag)) if p is not None]
    # a step costs its latency plus the software cost of the model the planner prices with
    # (nothing under the IR's lockstep model; see cclc.synth.pricing)
    alpha = _step_alpha(g)
    elems = coll.count // coll.n                      # the smallest block, in elements
    cap = _depth_cap(coll, ag, rs, max_ops)
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
            return _phase_exact(coll, g, ag or rs, rs is not None, block, alpha, c, best,
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
    exact = {x: allreduce_lockstep_time(g, rs, ag, block, x, alpha) for x in sorted(options)}
    chosen = min(exact, key=exact.get)
    equal = [x for x in exact if is_even.get(x, False)]
    if equal_chunks and equal and not is_even.get(chosen, False):
        # the same preference for chunks the MSCCL runtimes can address, on the exact times
        alt = min(equal, key=exact.get)
        if exact[alt] <= exact[chosen] * (1 + _EQUAL_CHUNKS_SLACK):
            chosen = alt
    return exact[chosen], chosen


def _step_alpha(g: HopGraph) -> float:
    """What a network step costs besides its busiest link: the slowest move's latency plus
    the software cost of the model the planner prices with (nothing under the IR's lockstep
    model; see :mod:`cclc.synth.pricing`)."""
    return (float(g.latency.max()) if g.m else 0.0) + step_cost(pricing_model())


def _depth_cap(coll: Collective, ag: TreePacking | None, rs: TreePacking | None,
               max_ops: int) -> int:
    """The deepest pipeline (chunks per tree) within ``max_ops`` ops and one element a chunk."""
    k = (ag or rs).k
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


def _taper(coll: Collective, syn: TreeSynthesis, chunks: int, fixed: bool, max_ops: int,
           deadline: float) -> tuple[int, np.ndarray | None]:
    """The pipeline's depth and units per chunk (``None``: equal chunks): a tapered pipeline
    (:mod:`cclc.synth.taper`) of ``chunks``, or (unless ``fixed``) of a deeper one, where it is
    :data:`_TAPER_GAIN` faster in the lockstep model than equal chunks at ``chunks``.

    Tapering needs every block cut into whole equal units (2 to :data:`_TAPER_UNITS` times the
    depth per tree, the finest that divides the blocks): the runtimes move whole units, and
    a tree's receive slots then hold its largest chunk.
    """
    ag, rs, g = syn.ag, syn.rs, syn.graph
    k = (ag or rs).k
    cap = _depth_cap(coll, ag, rs, max_ops)
    depths = [chunks] if fixed else sorted({chunks, min(cap, -(-3 * chunks // 2)),
                                           min(cap, 2 * chunks)})
    depths = [c for c in depths if 2 <= c <= _TAPER_MAX_DEPTH]
    if not depths:
        return chunks, None
    if ag is not None and rs is not None:
        start, move = edge_starts(rs, ag)
        blocks = set(even_split(coll.count, coll.n).tolist())
    else:
        start, move = edge_levels(ag or rs, ag is None)
        blocks = {coll.count // coll.n}
    loads = link_loads(g, start, move, prune=True)
    tree_bytes, alpha = _block_bytes(coll) / k, _step_alpha(g)
    equal = pipeline_time(loads, np.full(chunks, 1.0 / chunks), tree_bytes, alpha)
    best: tuple[float, int, np.ndarray | None] = (equal * (1 - _TAPER_GAIN), chunks, None)
    for c in depths:
        per_tree = next((u for u in range(_TAPER_UNITS * c, 2 * c - 1, -1)
                         if all(b % (k * u) == 0 for b in blocks)), None)
        if per_tree is None or time.monotonic() > deadline:
            continue
        units = tapered_units(loads, c, per_tree, tree_bytes, alpha, deadline)
        if units is None:
            continue
        t = pipeline_time(loads, units / per_tree, tree_bytes, alpha)
        if t < best[0]:
            best = (t, c, units)
    return best[1], best[2]


#: how much faster (lockstep model) a tapered pipeline must be than equal chunks to be used
_TAPER_GAIN = 0.005
#: the deepest pipeline tapered: the drain a taper shortens is about a chunk per level below
#: the first, under 2% of the time past 64 chunks with trees two levels deep, and the LP and
#: its polish grow with the depth (a 221-chunk ReduceScatter on a 4x4 torus: 30 s)
_TAPER_MAX_DEPTH = 64
#: a tapered pipeline of depth ``C`` cuts a tree's bytes into at most this many times ``C``
#: units (the most that divides every block, at least 2 C): 16 C takes the 128-GPU fabric's
#: 1 GiB AllGather to 96.6% of its bound (8 C: 95.1%; the LP's fractions: 96.7%) and keeps its
#: largest chunk (48 units) under the MSCCL runtimes' ``cnt`` limit (71)
_TAPER_UNITS = 16


def _phase_exact(coll: Collective, g: HopGraph, p: TreePacking, reduce: bool, block: float,
                 alpha: float, c: np.ndarray, best: int, even: np.ndarray,
                 free: bool, equal_chunks: bool) -> tuple[float, int]:
    """One phase on a machine with switches: the lockstep time of the packing itself
    (:func:`cclc.synth.phase_time.phase_lockstep_time`) at the closed form's depth ``c[best]``
    and, unless the depth was given (``free`` false), shallow ones and a few around it. The
    closed form charges every fill and drain step a whole step; trees whose levels share the
    busiest links evenly fill for less (the packings balanced per level of
    :func:`_exact_packings`)."""
    options = {int(c[best])}
    if free:
        options |= {int(x) for x in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, c[best] / 2, c[best] * 2)
                    if 1 <= x <= len(c)}
    exact = {x: phase_lockstep_time(g, p, block, x, alpha, reduce) for x in sorted(options)}
    chosen = min(exact, key=exact.get)
    equal = [x for x in exact if even[x - 1]] if len(c) == len(even) and free else []
    if equal_chunks and equal and not even[chosen - 1]:
        alt = min(equal, key=exact.get)
        if exact[alt] <= exact[chosen] * (1 + _EQUAL_CHUNKS_SLACK):
            chosen = alt
    return exact[chosen], chosen


#: the predicted time a pipeline depth with equal chunks may cost over the best depth
_EQUAL_CHUNKS_SLACK = 0.005


def _best_template(coll: Collective) -> tuple[float, Schedule] | None:
    """The fastest template and its time (lockstep IR model), or ``None`` when none applies."""
    from cclc.algorithms import algorithms_for
    from cclc.sim import simulate

    best: tuple[float, Schedule] | None = None
    for algo in algorithms_for(coll):
        if algo.name == "synth" or algo.applicable(coll) is not None:
            continue
        s = algo.build(coll)
        t = float(simulate(s).time)
        if best is None or t < best[0]:
            best = (t, s)
    return best


def _as_fallback(template: tuple[float, Schedule], optimal: float | None, t0: float
                 ) -> Schedule:
    t, s = template
    fraction = round(optimal / t, 4) if optimal else 0.0
    return s.replace(params=s.params + (
        ("solver", SOLVER), ("status", "fallback"), ("template", _name(s)),
        ("solve_s", round(time.monotonic() - t0, 3)), ("lp_fraction", fraction)))


def _name(s: Schedule) -> str:
    return s.algorithm if s.schedule in ("-", "") else f"{s.algorithm}+{s.schedule}"


def build_synth_trees(coll: Collective, **params) -> Schedule:
    """The synthesized schedule of an AllGather, ReduceScatter or AllReduce.

    Raced against every template unless ``race=0``: when a template is faster (lockstep IR
    model) that template is returned with ``status`` ``fallback``, so ``synth`` is never slower
    than the best template; likewise when the budget ends before any packing exists.
    """
    from cclc.sim import simulate

    # the collective's own budget, else `cclc compile --synth-budget`, else the default
    budget = budget_seconds(params)
    budget = DEFAULT_BUDGET if budget is None else budget
    # under `algorithm auto` the planner races every candidate itself
    race = bool(hint_int(params, "race", 0 if coll.algorithm.name == "auto" else 1, low=0))
    t0, cpu0 = time.monotonic(), time.process_time()
    # `auto` builds, verifies, simulates (and, for the nccl backend, lowers) every candidate:
    # its synth candidate pipelines fewer chunks so that it costs what a template costs
    max_ops = op_limit(budget, MAX_OPS_AUTO if coll.algorithm.name == "auto" else MAX_OPS)
    # the budget is a deadline for the whole synthesis: the templates are raced first (at
    # 512 ranks building them takes tens of seconds), the packers stop early enough that the
    # ops are built (and verified) within what is left, and the pipeline depth fits it
    template = _best_template(coll) if race else None
    left = max(budget - (time.monotonic() - t0), 1e-3)
    syn = synthesize_trees(coll, left, hint_int(params, "trees", None), max_ops=max_ops)
    if syn is None:
        template = template if race else _best_template(coll)
        if template is None:
            raise CollectiveError(f"synth found no packing for '{coll.name}' within its budget "
                                  f"of {budget:g} s and no template applies")
        return _as_fallback(template, None, t0)
    given = hint_int(params, "chunks", None)
    ops_left = _ops_left(t0 + budget, max_ops, _slowdown(t0, cpu0))
    _, chunks = _predict(coll, syn.graph, syn.ag, syn.rs, _block_bytes(coll), syn.rate_ag,
                         syn.rate_rs, given, ops_left)
    units = None
    # a lockstep step waits for its slowest link, so a deep level drains the last chunk a
    # whole step; under the dataflow models (msccl, nccl) it does not, and the tail's small
    # chunks only add per-op cost (msccl model, 128-GPU fabric's 128 MiB ReduceScatter: 78.5%
    # of the bound with equal chunks, 74.5% tapered)
    if hint_int(params, "taper", 1, low=0) and pricing_model().mode == "lockstep":
        chunks, units = _taper(coll, syn, chunks, given is not None, ops_left, t0 + budget)
    meta = (("solver", SOLVER), ("status", syn.status), ("solve_s", round(syn.solve_s, 3)),
            ("k", (syn.ag or syn.rs).k), ("chunks", chunks))
    if units is not None:
        meta += (("units", int(units.sum())),)
    if coll.kind is CollectiveKind.ALLGATHER:
        s = tree_schedule.allgather_ops(coll, syn.graph, syn.ag, chunks, meta, units)
    elif coll.kind is CollectiveKind.REDUCESCATTER:
        s = tree_schedule.reducescatter_ops(coll, syn.graph, syn.rs, chunks, meta, units)
    else:
        s = tree_schedule.allreduce_ops(coll, syn.graph, syn.rs, syn.ag, chunks, meta, units)
    t = float(simulate(s).time)
    s = s.replace(params=meta + (("lp_fraction", round(syn.optimal_time / t, 4)),))
    if race:
        if template is not None and template[0] < t * (1 - 1e-9):
            return _as_fallback(template, syn.optimal_time, t0)
    return s


register(Algorithm(
    name="synth", collectives=_KINDS, applicable=_applicable, build=build_synth_trees,
    ops=every_rank_ops,
    load=NoBound("synthesis chooses its trees while it builds: there is no traffic to bound "
                 "before"),
    description="spanning trees packed near the ForestColl optimum, pipelined in chunks"))
