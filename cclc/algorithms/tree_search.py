"""The search of tree synthesis: packings of spanning trees near the ForestColl optimum.

The packing and its optimum are in :mod:`cclc.synth.trees`. On a machine with switches two
graphs compete: the hop graph (fewest-hop rank-to-rank paths) and ForestColl's rank-only graph
left by splitting the switches off (:mod:`cclc.synth.splitting`); the packing with the lower
predicted time (:mod:`cclc.algorithms.tree_costs`) wins. An AllReduce on a machine without
switches first packs its in-trees and out-trees jointly (:mod:`cclc.synth.joint_trees`),
raced against the phases packed apart. :func:`synthesize_trees` keeps to its budget as a
deadline, and skips a candidate graph whose best possible prediction cannot beat the packing
kept.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import numpy as np

from cclc.algorithms.tree_budget import (
    DEFAULT_BUDGET,
    MAX_OPS,
    MAX_RESERVE,
    deadline_share,
    machine_slowdown,
    op_cap,
)
from cclc.algorithms.tree_costs import (
    block_bytes,
    cannot_win,
    expected_build,
    phase_load,
    phase_times,
    predict_pipeline,
)
from cclc.bounds import bounds
from cclc.collective import Collective, CollectiveKind
from cclc.execution import IR_MODEL, ExecutionModel
from cclc.synth.fabric_symmetry import find_free_automorphism, member_powers
from cclc.synth.hop_graph import HopGraph, hop_graph
from cclc.synth.joint_trees import pack_allreduce_trees
from cclc.synth.splitting import split_switches
from cclc.synth.tree_lp import (
    ALL_LEVELS,
    FractionalPacking,
    depth_limit,
    fractional_packing,
    rounded_packing,
    windows,
)
from cclc.synth.trees import TreePacking, flow_network, forestcoll_rate, pack_trees, translations

__all__ = ["TreeSynthesis", "synthesize_trees"]

#: a packing kept by the search: (predicted time, its physical moves, AllGather packing,
#: ReduceScatter packing)
_Kept = tuple[float, HopGraph, TreePacking | None, TreePacking | None]


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


def _orbit_representatives(coll: Collective, node_perm: np.ndarray
                           ) -> tuple[list[int], tuple[np.ndarray, list[int]] | None]:
    """One member per orbit (group indices) of the machine's symmetry, and the free
    automorphism with the representatives' ranks where one was found (``None`` else)."""
    orbits = node_perm
    auto = (find_free_automorphism(coll.topology, coll.group)
            if len(node_perm) == 1 and coll.topology.dims is None else None)
    if auto is not None:
        # identical servers: one max-flow per orbit of a free automorphism in the rate
        # search and the switch splitting (the trees are still packed for every root: see
        # cclc.synth.fabric_symmetry)
        powers = member_powers(coll, auto)
        if powers is not None:
            orbits = powers
    reps = sorted({int(orbits[:, v].min()) for v in range(coll.n)})
    if auto is None:
        return reps, None
    return reps, (auto, [int(coll.group[v]) for v in reps])


def _allreduce_reference(coll: Collective) -> tuple[float, float]:
    """AllReduce's reference time: the bound of :mod:`cclc.bounds` (its joint reduce-scatter +
    allgather LP, where it runs; else the closed forms). Not the sum of the two phases'
    optima: overlapping the phases on full-duplex links beats that sum. Also returns the
    strongest bandwidth bound (all but the latency bound), the joint packing's target."""
    # the best of all: the LP prices bandwidth only, the closed forms include latency
    b = bounds(coll)
    return b.best, max(x.seconds for x in b.items if x.name != "latency")


def synthesize_trees(coll: Collective, budget: float = DEFAULT_BUDGET,
                     trees: int | None = None, reserve: float = 0.0,
                     max_ops: int | None = None, model: ExecutionModel = IR_MODEL
                     ) -> TreeSynthesis | None:
    """Packings for ``coll`` within ``budget`` seconds, or ``None`` when none was finished.

    The function 14a's benchmark (and anyone) can call to get the optimum and the packing
    without building ops. ``trees`` fixes ``k``; otherwise 1..6 are tried while time is left
    and the one with the lowest predicted time wins. ``reserve``: seconds of the budget kept
    for what comes after the packing (building the ops); with ``max_ops`` (the op limit of
    the build) at least the time the ops of the pipeline depth the bound suggests take (see
    :func:`expected_build`). The packers stop that long before the budget ends (at most
    half of it is kept), and the ForestColl rate counts in the budget too.
    """
    t0, cpu0 = time.monotonic(), time.process_time()
    g = hop_graph(coll)
    node_perm, edge_perm = translations(coll, g)
    reps, symmetry = _orbit_representatives(coll, node_perm)
    net, members = flow_network(coll)
    probe = [members[v] for v in reps]
    block = block_bytes(coll)
    need_ag = coll.kind in (CollectiveKind.ALLGATHER, CollectiveKind.ALLREDUCE)
    need_rs = coll.kind in (CollectiveKind.REDUCESCATTER, CollectiveKind.ALLREDUCE)
    rate_ag = forestcoll_rate(net, members, probe) if need_ag else None
    rate_rs = forestcoll_rate(net.reverse(copy=True), members, probe) if need_rs else None
    optimal = sum(block / r for r in (rate_ag, rate_rs) if r is not None)
    build_s = 0.0 if max_ops is None else expected_build(
        coll, g, block, rate_ag, rate_rs, max_ops, model)
    deadline = _deadline(t0, cpu0, budget, reserve, build_s)
    # the packings are compared at the pipeline depth the build may reach
    cap = op_cap(coll, MAX_OPS if max_ops is None else max_ops)
    best: _Kept | None = None
    kept = None        # the kept separate packing's phase times (see cannot_win)
    if coll.kind is CollectiveKind.ALLREDUCE:
        assert rate_ag is not None and rate_rs is not None     # AllReduce has both phases
        optimal, best = _allreduce_start(coll, g, node_perm, edge_perm, trees, block, rate_ag,
                                         rate_rs, deadline_share(deadline, _JOINT_SHARE), model,
                                         cap)
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
        if kept is not None and cannot_win(coll, phys, (g_ag, g_rs), block, rate_ag,
                                           rate_rs, kept, max(margin, _TIE), model):
            # on the 128-GPU fabric example this skips 30 s of packing the split graph
            continue
        for k in k_list:
            deadline = _deadline(t0, cpu0, budget, reserve, build_s)   # the load so far
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
            options = _options(phys, realize if improve else None, packed[0], packed[1],
                               rate_ag, rate_rs, deadline, trees, realize)
            for ag, rs in options:
                # the op cap the build will use (fewer chunks under `auto`)
                predicted = predict_pipeline(coll, phys, ag, rs, block, rate_ag, rate_rs,
                                             model, max_ops=cap)[0]
                if best is None or predicted < best[0] * (1 - margin):
                    best = (predicted, phys, ag, rs)
                    kept = phase_times(coll, phys, ag, rs, block, rate_ag, rate_rs, model)
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


#: relative difference under which a candidate graph's best possible prediction counts as a
#: tie with the packing kept (not worth packing: it could win only by the equal-chunk
#: preference of :func:`predict_pipeline`, a tie-break, not speed)
_TIE = 1e-6


#: trees per root tried on the split graph: its logical edges hold small shares of the
#: switches, so equal-weight trees need more of them to fit the capacities closely (most
#: promising first: the budget may end the list)
_SPLIT_TREES = [8, 4, 12, 2, 1]


def _deadline(t0: float, cpu0: float, budget: float, reserve: float, build_s: float) -> float:
    """When the packers must stop: the budget from ``t0`` less ``reserve`` or the build's
    expected seconds ``build_s`` stretched by the load measured since ``(t0, cpu0)``
    (:func:`machine_slowdown`), whichever is more, and at most :data:`MAX_RESERVE` of it.

    Asked again before each round of packing: at the start too little has run to measure the
    load (the rates take a fraction of a CPU second). A 128-rank AllReduce beside other work
    measured 1.0 at the start and 3.1 at the end, and its build was left a third of the time
    its 731k ops needed (tpuv4_8x4x4's ``grads`` under ``auto``: 86.8% of its bound, 95.5-96.2%
    with the deadline asked again)."""
    expected = build_s * machine_slowdown(t0, cpu0)
    return t0 + budget - min(max(reserve, expected), budget * MAX_RESERVE)


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
    merged: list[HopGraph | None] = []
    groups: list[tuple[np.ndarray, np.ndarray, np.ndarray] | None] = []
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
        return tuple(None if p is None or rate is None or grp is None
                     else _on_links(phys, p, rate, *grp)
                     for p, rate, grp in ((ag, rate_ag, groups[0]), (rs, rate_rs, groups[1])))

    g_ag = merged[0]
    g_rs = merged[1].reversed() if merged[1] is not None else None
    ident = np.arange(n)[None, :]
    edge_ident = np.arange(max(g.m for g in merged if g is not None))[None, :]
    return phys, g_ag, g_rs, ident, edge_ident, realize


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
              ((ag, rate_ag, phys), (rs, rate_rs, phys.reversed()))
              if p is not None and rate is not None]
    plans: list[tuple[tuple[tuple[int, int, float], ...], tuple[int, ...]]] = \
        [(ALL_LEVELS, ks or _EXACT_TREES)]
    if len(phases) == 1:
        plans.append((windows(depth_limit(phys), _LEVEL_CHUNKS), ks or _LEVEL_TREES))
    out = []
    fracs: list[FractionalPacking | None] = [None] * len(phases)
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
        ready = [f for f in fracs if f is not None]
        if len(ready) < len(fracs):
            break
        for k in ks:
            pair = [rounded_packing(graph, frac, rate, k, deadline, p if p.k == k else None,
                                    time.monotonic() - t0, wins, reduce)
                    for frac, (p, rate, graph, reduce) in zip(ready, phases, strict=True)]
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


def _allreduce_start(coll: Collective, g: HopGraph, node_perm: np.ndarray,
                     edge_perm: np.ndarray, trees: int | None, block: float,
                     rate_ag: float, rate_rs: float, deadline: float,
                     model: ExecutionModel, cap: int) -> tuple[float, _Kept | None]:
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
                                     bandwidth_time, rate_ag, rate_rs, deadline, model, cap)


def _joint_allreduce(coll: Collective, g: HopGraph, node_perm: np.ndarray,
                     edge_perm: np.ndarray, ks: list[int], block: float,
                     bandwidth_time: float, rate_ag: float, rate_rs: float,
                     deadline: float, model: ExecutionModel, cap: int) -> _Kept | None:
    """The best joint AllReduce packing over ``ks`` trees per root by predicted time (at
    pipeline depths within ``cap`` ops):
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
        rs, ag = (replace(p, load=phase_load(g, p, rate)) for p, rate in
                  ((rs, rate_rs), (ag, rate_ag)))
        predicted = predict_pipeline(coll, g, ag, rs, block, None, None, model,
                                     max_ops=cap)[0]
        if best is None or predicted < best[0] * (1 - _BETTER_BY):
            best = (predicted, g, ag, rs)
        if ag.status == "optimal":
            break
    return best
