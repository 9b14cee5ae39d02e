"""``synth`` for AllGather, ReduceScatter and AllReduce: packed spanning trees, pipelined.

The registry entry. The search for packings is :mod:`cclc.algorithms.tree_search` (the packing
and its optimum in :mod:`cclc.synth.trees`), their predicted times
:mod:`cclc.algorithms.tree_costs`, the time and op budget :mod:`cclc.algorithms.tree_budget`,
the ops :mod:`cclc.synth.tree_schedule`. This module chooses the number of chunks per tree
``C`` (and a taper of them), keeps to the time budget as a deadline for the whole synthesis
(the packers read the clock before every tree they grow and stop early enough for the ops to
be built in what is left, see :func:`~cclc.algorithms.tree_costs.expected_build`; a packing not
whole at the deadline is dropped), and records what it did in the schedule's ``params``:
``solver`` (``"forestcoll-maxflow+congestion-trees"``), ``status`` (``optimal`` when the
packing reaches the ForestColl rate, ``feasible`` when it does not, ``budget`` when the budget
cut the search short), ``solve_s``, ``lp_fraction`` (the collective's time at the ForestColl
optimum over the schedule's time in the lockstep IR model; for AllReduce not the optimum,
which is ReduceScatter's plus AllGather's and which overlapping the two phases on full-duplex
links can beat, but the lower bound of :mod:`cclc.bounds`, its joint LP of both phases, so at
most 1). It returns that schedule and nothing else: named explicitly, the planner races it
against every template (:mod:`cclc.template_race`) and returns a faster one instead, labelled
``status fallback`` with its ``template`` (``budget`` when no packing was whole in time).

Hint parameters: ``budget`` (seconds, default 30); ``race`` (1 by default: named explicitly,
the planner returns the fastest template when one beats the synthesized schedule; 0: always
the synthesized one; ``algorithm auto`` races every candidate anyway); ``trees`` (``k``;
default: the best of 1..6 by predicted time); ``chunks`` (``C``; default: the pipeline depth
that minimizes ``(C + D) * (alpha + beta / C)`` for tree depth ``D``, latency ``alpha`` and
bandwidth time ``beta``, with at most :data:`MAX_OPS` ops; under ``algorithm auto`` the ops
that a small share of the budget builds, predicts and writes to the requested outputs
(:func:`~cclc.algorithms.tree_budget.auto_op_limit`, at least :data:`MAX_OPS_AUTO`), so that
the candidate costs the planner about what a template does; fewer when the time left would not
build them: :func:`op_limit`,
:func:`~cclc.algorithms.tree_budget.ops_left`); ``taper`` (1 by default: chunks that shrink
down the pipeline where the lockstep model says they drain it sooner, :func:`_taper`; 0:
equal chunks).
"""

from __future__ import annotations

import time

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components

from cclc.algorithms import (
    Algorithm,
    BuildContext,
    NoBound,
    Outpaced,
    Synthesis,
    every_rank_ops,
    register,
)
from cclc.algorithms.common import bad_int_param, even_split, hint_int
from cclc.algorithms.nic_relay import healed_nics, nic_slowdown, relay_lost_nics
from cclc.algorithms.synth_flows import budget_seconds
from cclc.algorithms.tree_budget import (
    DEFAULT_BUDGET,
    MAX_OPS,
    MAX_OPS_AUTO,
    auto_op_limit,
    machine_slowdown,
    op_limit,
    ops_left,
)
from cclc.algorithms.tree_costs import block_bytes, depth_cap, predict_pipeline, step_alpha
from cclc.algorithms.tree_search import TreeSynthesis, synthesize_trees
from cclc.collective import Collective, CollectiveKind
from cclc.execution import ExecutionModel
from cclc.ir import Schedule
from cclc.sim import simulate
from cclc.synth import tree_schedule
from cclc.synth.hop_graph import MAX_FABRIC_PAIRS, HopGraph, fabric_pairs, hop_graph
from cclc.synth.phase_time import edge_levels
from cclc.synth.pricing import step_cost
from cclc.synth.taper import link_loads, pipeline_time, tapered_units
from cclc.synth.tree_time import edge_starts
from cclc.synth.trees import TreePacking
from cclc.units import format_time

__all__ = ["DEFAULT_BUDGET", "MAX_OPS", "MAX_OPS_AUTO", "SOLVER", "TreeSynthesis",
           "build_synth_trees", "op_limit", "synthesize_tree_schedule", "synthesize_trees"]

_KINDS = frozenset({CollectiveKind.ALLGATHER, CollectiveKind.REDUCESCATTER,
                    CollectiveKind.ALLREDUCE})
SOLVER = "forestcoll-maxflow+congestion-trees"


def _applicable(coll: Collective, context: BuildContext, **params) -> str | None:
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
    if fabric_pairs(coll) > MAX_FABRIC_PAIRS:
        return (f"synth reads every member pair's fabric path ({fabric_pairs(coll):,} pairs "
                f"on {coll.n} ranks; it takes at most {MAX_FABRIC_PAIRS:,})")
    g = hop_graph(coll)
    if not _strongly_connected(g):
        return ("the group's members do not reach each other over moves the routing "
                "carries without leaving the group")
    return None


def _strongly_connected(g: HopGraph) -> bool:
    mat = csr_matrix((np.ones(g.m), (g.src, g.dst)), shape=(g.n, g.n))
    return connected_components(mat, directed=True, connection="strong")[0] == 1


def _taper(coll: Collective, syn: TreeSynthesis, chunks: int, fixed: bool, max_ops: int,
           deadline: float, model: ExecutionModel) -> tuple[int, np.ndarray | None, float]:
    """The pipeline's depth, units per chunk (``None``: equal chunks) and lockstep time: a
    tapered pipeline (:mod:`cclc.synth.taper`) of ``chunks``, or (unless ``fixed``) of a
    deeper one, where it is :data:`_TAPER_GAIN` faster in the lockstep model than equal chunks
    at ``chunks`` (their time, where not).

    Tapering needs every block cut into whole equal units (2 to :data:`_TAPER_UNITS` times the
    depth per tree, the finest that divides the blocks): the runtimes move whole units, and
    a tree's receive slots then hold its largest chunk.
    """
    ag, rs, g = syn.ag, syn.rs, syn.graph
    k = _packed(syn).k
    cap = depth_cap(coll, ag, rs, max_ops)
    depths = [chunks] if fixed else sorted({chunks, min(cap, -(-5 * chunks // 4)),
                                           min(cap, -(-3 * chunks // 2)), min(cap, 2 * chunks)})
    depths = [c for c in depths if 2 <= c <= _TAPER_MAX_DEPTH]
    if not depths:
        return chunks, None, float("inf")
    if ag is not None and rs is not None:
        start, move = edge_starts(rs, ag)
        blocks = set(even_split(coll.count, coll.n).tolist())
    else:
        start, move = edge_levels(_packed(syn), ag is None)
        blocks = {coll.count // coll.n}
    # every pipeline is timed as the simulator times it: each step its own links' latency (a
    # step that moves over NVLink only is not charged the network's) and the model's software
    # cost per step
    exact = link_loads(g, start, move, prune=True, latency=True)
    tree_bytes, cost = block_bytes(coll) / k, step_cost(model)
    # the LP prices steps so too; where moves differ in latency it is also solved charging
    # every step the slowest move's, whose whole units can round better (the 128-GPU fabric's
    # 1 GiB AllGather: 2605 us that way, 2619 us from the exact LP's units)
    pricings = [(exact, cost)]
    if len(np.unique(g.latency[move])) > 1:
        pricings.append((link_loads(g, start, move, prune=True), step_alpha(g, model)))
    equal = pipeline_time(exact, np.full(chunks, 1.0 / chunks), tree_bytes, cost)
    best: tuple[float, int, np.ndarray | None] = (equal * (1 - _TAPER_GAIN), chunks, None)
    for c in depths:
        per_tree = next((u for u in range(_TAPER_UNITS * c, 2 * c - 1, -1)
                         if all(b % (k * u) == 0 for b in blocks)), None)
        for loads, alpha in pricings:
            if per_tree is None or time.monotonic() > deadline:
                continue
            units = tapered_units(loads, c, per_tree, tree_bytes, alpha, deadline)
            if units is None:
                continue
            t = pipeline_time(exact, units / per_tree, tree_bytes, cost)
            if t < best[0]:
                best = (t, c, units)
    return best[1], best[2], best[0] if best[2] is not None else equal


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


#: how far above the fastest candidate so far (:attr:`BuildContext.beat`) the trees' predicted
#: time (the pipeline's lockstep time, tapered where that is faster, before the ops are
#: built) must be for ``auto``'s synth to give up (:class:`~cclc.algorithms.Outpaced`). A
#: margin, not a bound: under the IR model the built schedule's time (routed, and priced
#: under ECMP's hashing where the fabric declares it) was 0.98 to 1.00 times the prediction
#: on 16 AllGathers, ReduceScatters and AllReduces of the examples
#: (tests/algorithms/test_synth_outpaced.py checks the small ones; the equal-chunk prediction
#: alone was 1.34 times a tapered ring's time). Under the lockstep models only: under the
#: msccl model the prediction was 0.66 to 1.22 times the built schedule's time on the 12
#: smaller ones, so synth is always built under the dataflow models. Where a member lost its
#: NIC the prediction is the healed machine's times :func:`nic_slowdown` (the 128-GPU
#: fabric's 1 GiB AllReduce, IR model: 5.14 ms x 8/7 = 5.87 ms predicted, 6.02 ms relayed).
GIVE_UP = 1.25


def synthesize_tree_schedule(coll: Collective, context: BuildContext, **params) -> Synthesis:
    """The synthesized schedule of an AllGather, ReduceScatter or AllReduce, packed and
    pipelined for ``context.model``; without a schedule when the budget ended before any
    packing was whole (the planner then races the templates: :mod:`cclc.template_race`).

    Where a member lost its NIC, the trees are packed on the machine with that NIC working
    (where the fabric's symmetry holds) and the ops of that member between servers relayed
    through its server's live NICs (:mod:`cclc.algorithms.nic_relay`); packed on the real
    machine too, within what is left of the budget, where the relayed plan does not carry
    over or is more than :data:`RELAY_SLACK` above the live NICs' share (the faster kept)."""
    healed = healed_nics(coll)
    if healed is None:
        return _synthesize(coll, context, params)[0]
    t0 = time.monotonic()
    slowdown = nic_slowdown(coll)
    found, healed_time = _synthesize(healed, context, params, slowdown)
    if found.schedule is None:
        return found
    s = relay_lost_nics(found.schedule, coll)
    if s is None:
        return _synthesize(coll, context, _left(params, context, t0))[0]
    t = float(simulate(s).time)
    # the healed machine's optimum bounds the real one's (healing only adds links)
    meta = tuple(kv for kv in s.params if kv[0] != "lp_fraction") + (
        ("lp_fraction", round(found.optimal / t, 4) if found.optimal else 0.0),)
    relayed = Synthesis(s.replace(params=meta), found.params, found.optimal, found.started)
    if t <= RELAY_SLACK * slowdown * healed_time:
        return relayed
    # whole ops on few relays: the faulty machine's own packing, in what is left of the budget
    left = _left(params, context, t0)
    if left["budget"] <= 0:
        return relayed
    try:
        plain, plain_time = _synthesize(coll, context, left)
    except Outpaced:
        return relayed
    return plain if plain_time < t else relayed


#: how far above the live NICs' share (``nic_slowdown`` times the healed machine's time) a
#: relayed schedule may be before the faulty machine's own packing is tried as well: where the
#: GPU without its NIC moves few, large ops a step a relay takes a whole op more than its
#: share. Measured (IR model; relayed time over the share, and the faulty machine's own
#: packing): 4 servers of 8 GPUs, 29 MB: AllGather 1.31 and ReduceScatter 1.31 (own packing
#: 4% and 2% faster), AllReduce 1.23 (1% slower); 4 and 8 servers of 4 GPUs: 1.06 to 1.14
#: (7-25% slower); hgx16_leafspine, 1 GiB: AllReduce 1.03, ReduceScatter 1.09 (the own
#: packing 41% slower after 30 s of search, which this keeps `auto` from spending)
RELAY_SLACK = 1.2


def _budget(params: dict, context: BuildContext) -> float:
    """The collective's own budget, else `cclc compile --synth-budget`, else the default."""
    budget = budget_seconds(params, context.synth_budget)
    return DEFAULT_BUDGET if budget is None else budget


def _left(params: dict, context: BuildContext, t0: float) -> dict:
    """``params`` with the budget that is left since ``t0``."""
    return {**params, "budget": _budget(params, context) - (time.monotonic() - t0)}


def _synthesize(coll: Collective, context: BuildContext, params: dict,
                slowdown: float = 1.0) -> tuple[Synthesis, float]:
    """:func:`synthesize_tree_schedule` on ``coll``'s machine as it is, and the schedule's
    lockstep time (``inf`` without one); ``slowdown``: how much slower the schedule will run
    where it is relayed (for ``auto``'s give-up)."""
    budget = _budget(params, context)
    model = context.model
    t0, cpu0 = time.monotonic(), time.process_time()
    # `auto` builds, verifies and predicts every candidate, and writes the requested outputs
    # of the one it keeps: its synth candidate pipelines the ops a share of the budget pays
    # for, fewer where an output's lowering costs more per op
    cap = (auto_op_limit(budget, model, context.emit_seconds_per_op)
           if coll.algorithm.name == "auto" else MAX_OPS)
    max_ops = op_limit(budget, cap, model)
    # the budget is a deadline for the whole synthesis: the packers stop early enough that
    # the ops are built (and verified) within what is left, and the pipeline depth fits it
    left = max(budget - (time.monotonic() - t0), 1e-3)
    syn = synthesize_trees(coll, left, hint_int(params, "trees", None), max_ops=max_ops,
                           model=model)
    if syn is None:
        return Synthesis(None, (("solver", SOLVER),), None, t0), float("inf")
    given = hint_int(params, "chunks", None)
    room = ops_left(t0 + budget, max_ops, machine_slowdown(t0, cpu0), model)
    predicted, chunks = predict_pipeline(coll, syn.graph, syn.ag, syn.rs, block_bytes(coll),
                                         syn.rate_ag, syn.rate_rs, model, given, room)
    units = None
    # a lockstep step waits for its slowest link, so a deep level drains the last chunk a
    # whole step; under the dataflow models (msccl, nccl) it does not, and the tail's small
    # chunks only add per-op cost (msccl model, 128-GPU fabric's 128 MiB ReduceScatter: 78.5%
    # of the bound with equal chunks, 74.5% tapered)
    if hint_int(params, "taper", 1, low=0) and model.mode == "lockstep":
        chunks, units, tapered = _taper(coll, syn, chunks, given is not None, room,
                                        t0 + budget, model)
        predicted = min(predicted, tapered)
    if (context.beat is not None and model.mode == "lockstep"
            and predicted * slowdown > GIVE_UP * context.beat[1]):
        name, beat = context.beat
        relayed = (f" ({format_time(predicted)} planned with its lost NICs working, times "
                   f"{slowdown:.3g} for the NICs left)" if slowdown != 1.0 else "")
        raise Outpaced(f"its trees' predicted time, {format_time(predicted * slowdown)}"
                       f"{relayed}, is over {GIVE_UP:g}x {name}'s simulated "
                       f"{format_time(beat)}: given up before building its ops",
                       predicted * slowdown)
    meta: tuple[tuple[str, object], ...] = (
        ("solver", SOLVER), ("status", syn.status), ("solve_s", round(syn.solve_s, 3)),
        ("k", _packed(syn).k), ("chunks", chunks))
    if units is not None:
        meta += (("units", int(units.sum())),)
    if coll.kind is CollectiveKind.ALLGATHER:
        assert syn.ag is not None
        s = tree_schedule.allgather_ops(coll, syn.graph, syn.ag, chunks, meta, units)
    elif coll.kind is CollectiveKind.REDUCESCATTER:
        assert syn.rs is not None
        s = tree_schedule.reducescatter_ops(coll, syn.graph, syn.rs, chunks, meta, units)
    else:
        assert syn.rs is not None and syn.ag is not None
        s = tree_schedule.allreduce_ops(coll, syn.graph, syn.rs, syn.ag, chunks, meta, units)
    t = float(simulate(s).time)
    s = s.replace(params=meta + (("lp_fraction", round(syn.optimal_time / t, 4)),))
    return Synthesis(s, (("solver", SOLVER),), syn.optimal_time, t0), t


def build_synth_trees(coll: Collective, context: BuildContext, **params) -> Schedule:
    """The synthesized schedule (:func:`synthesize_tree_schedule`);
    :class:`~cclc.algorithms.BudgetExhausted` when no packing was whole within the budget."""
    return synthesize_tree_schedule(coll, context, **params).own(coll)


def _packed(syn: TreeSynthesis) -> TreePacking:
    """The synthesis's AllGather packing, else its ReduceScatter one (one always exists)."""
    p = syn.ag or syn.rs
    assert p is not None
    return p


register(Algorithm(
    name="synth", collectives=_KINDS, applicable=_applicable, build=build_synth_trees,
    synthesize=synthesize_tree_schedule, contextual=True, ops=every_rank_ops,
    load=NoBound("synthesis chooses its trees while it builds: there is no traffic to bound "
                 "before"),
    description="spanning trees packed near the ForestColl optimum, pipelined in chunks"))
