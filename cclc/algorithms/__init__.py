"""The table of algorithms: every way cclc knows to lower a collective into a schedule.

Each entry is the whole record of one algorithm: the collectives it serves, whether it applies
to a given collective (and if not, why), its builder, its schedule's ops and chunk slots (the
size check, :mod:`cclc.budget`) and its link traffic (the planner's load bound,
:mod:`cclc.load_bounds`), or an explicit :class:`NoBound` saying why it has none. Modules
register their entries at import; the list of modules imported here is the whole catalogue,
so adding an algorithm is one module and one line in :data:`_MODULES`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, replace

from cclc.collective import Collective, CollectiveKind
from cclc.errors import CollectiveError
from cclc.execution import IR_MODEL, ExecutionModel
from cclc.fabric_routing import has_spines, route_spines
from cclc.ir import Schedule
from cclc.link_traffic import Traffic
from cclc.own_nics import own_nic_routes
from cclc.relay import RelayError, lower_relays
from cclc.sends import Sends
from cclc.sim import simulate

__all__ = ["REGISTRY", "Algorithm", "BudgetExhausted", "BuildContext", "CostFn", "NoBound",
           "OpsFn", "Outpaced", "SendsFn", "Synthesis", "TrafficFn", "algorithms_for",
           "every_rank_ops", "get", "lockstep_time", "register", "unregister"]

#: the predicted time (seconds) of a schedule: what an algorithm that tunes itself (e.g.
#: hierarchical's pipeline depth) minimizes; it is given, never imported by the algorithm
CostFn = Callable[[Schedule], float]

#: the ops of an entry's schedule of a collective with the hint parameters, after the routing
#: and relay passes (``ops(coll, **params)``): what the size check of :mod:`cclc.budget`
#: refuses on before anything is built. It is a lower bound (a refusal is never caused by an
#: overestimate), and the exact count of the schedule before relay lowering wherever the
#: builder's count has a closed form, so that it is also within the relays' factor of what is
#: built (``tests/plan/test_op_estimates.py`` holds every entry to its stated factor); it
#: grows with every parameter that grows the schedule
OpsFn = Callable[..., int]


@dataclass(frozen=True, slots=True)
class BuildContext:
    """What the planner tells a build besides the collective and its hint parameters (given
    to the entries that declare ``contextual=True``; every other build ignores it).

    ``model``: the execution model the schedule will be priced with (synthesis packs for it,
    :func:`cclc.synth.pricing.step_cost`); ``synth_budget``: seconds a synthesis may take where
    its hint names no ``budget`` (``cclc compile --synth-budget``; ``None``: its default);
    ``emit_seconds_per_op``: what writing the requested outputs costs per op of the schedule
    kept (their :attr:`backends.contract.Backend.seconds_per_op` added), which ``auto``'s
    synthesis candidate pays for within its budget. ``beat``: the name and simulated time
    (seconds) of the fastest candidate ``auto`` has so far, which its synthesis candidate
    gives up against (:class:`Outpaced`) where its own prediction is far above it.
    ``own_nics``: an output's runtime sends a GPU's messages between servers through its own
    NIC only (:attr:`backends.contract.Backend.own_nics`), so every build's ops between
    servers are routed so (:func:`cclc.own_nics.own_nic_routes`) before their spines are
    planned. ``say(what)``: told before each routing pass that takes a while (the planner's
    progress line for the candidate: at 4,096 GPUs the spines' plan is most of a build).
    """

    model: ExecutionModel = IR_MODEL
    synth_budget: float | None = None
    emit_seconds_per_op: float = 0.0
    beat: tuple[str, float] | None = None
    own_nics: bool = False
    say: Callable[[str], None] | None = None


@dataclass(frozen=True, eq=False)
class Synthesis:
    """What a synthesizing entry found (its ``synthesize`` member), for the planner to race
    against the templates: ``schedule`` (``None`` when the budget ran out before one was
    whole), ``params`` (what the synthesis records about itself: solver, status, ...),
    ``optimal`` (seconds: the optimum the synthesis measures itself against, for a
    fallback's ``lp_fraction``; ``None`` when unknown) and ``started`` (its
    ``time.monotonic()`` start, from which a fallback's ``solve_s`` counts)."""

    schedule: Schedule | None
    params: tuple[tuple[str, object], ...]
    optimal: float | None
    started: float

    def own(self, coll: Collective) -> Schedule:
        """The synthesized schedule; :class:`BudgetExhausted` when there is none."""
        if self.schedule is None:
            raise BudgetExhausted(f"synth found no schedule for '{coll.name}' within its "
                                  "budget", coll.span)
        return self.schedule


class BudgetExhausted(CollectiveError):
    """A synthesis's budget ran out before it had a schedule (the planner then races the
    templates, or reports the candidate as not applicable under ``auto``)."""


class Outpaced(CollectiveError):
    """``auto``'s synthesis candidate gave up before building its ops: its own prediction
    (``predicted``, seconds) is far above the time of the fastest candidate so far
    (:attr:`BuildContext.beat`); the planner reports it as pruned, and builds it after all
    where the outputs refuse that candidate."""

    def __init__(self, message: str, predicted: float):
        super().__init__(message)
        self.predicted = predicted


@dataclass(frozen=True, slots=True)
class NoBound:
    """An entry's statement that it has no load bound here, and ``reason``: why (the planner
    reports it beside the candidate, which is then always built)."""

    reason: str


#: the bytes an entry's schedule of a collective with the hint parameters puts on every link
#: in every step before relay lowering (``load(coll, **params)``), from which the planner's
#: load and step bounds follow (:mod:`cclc.load_bounds`): it must never be below what the
#: schedule sends; a :class:`NoBound` where this collective or these parameters have no rule
TrafficFn = Callable[..., "Traffic | NoBound"]

#: what an entry's schedule of a collective with the hint parameters sends between members in
#: each step, without routes (``sends(coll, **params)``, :mod:`cclc.sends`), from which the
#: planner's bound that holds whatever the routes follows (:mod:`cclc.send_bounds`): its
#: steps and bytes must never be more than the schedule's; a :class:`NoBound` where this
#: collective or these parameters have no rule
SendsFn = Callable[..., "tuple[Sends, ...] | NoBound"]


def every_rank_ops(coll: Collective, **params) -> int:
    """The ops every schedule of ``coll`` has at the least: every rank receives something
    (aggregating schedules such as recursive doubling may need no more when ``n`` is not a
    power of two); ``n - 1`` for broadcast and reduce."""
    n = coll.n
    if n < 2:
        return 0
    if coll.kind in (CollectiveKind.BROADCAST, CollectiveKind.REDUCE):
        return n - 1
    return n


@dataclass(frozen=True, slots=True)
class Algorithm:
    """One lowering.

    ``name`` is what the user writes (``algorithm halfring`` / ``schedule dimrotation``; a
    multi-dimensional torus entry is named ``"<algorithm>+<schedule>"``, e.g.
    ``"halfring+dimrotation"``). ``applicable(coll, **params)`` returns ``None`` when the
    algorithm can serve ``coll`` or a sentence saying why not; ``build(coll, **params)`` returns
    the schedule. ``params`` are the user's hint parameters (e.g. ``chunks=6``). An entry with
    ``tunes=True`` chooses among variants of itself by cost: its raw build also takes ``cost=``
    (a :data:`CostFn`) and the table hands it one (``build(coll, cost=..., **params)`` on a
    registered entry; :func:`lockstep_time` by default). An entry with ``contextual=True``
    also takes ``context=`` (a :class:`BuildContext`: the planner's model and synthesis
    budget) in ``applicable``, ``build`` and ``synthesize``; a registered entry accepts it
    either way. ``synthesize`` (same signature as ``build``) marks an entry that synthesizes:
    it returns a :class:`Synthesis`, which the planner races against the templates when the
    entry is named explicitly (:mod:`cclc.template_race`; a hint ``race=0`` skips that, where
    the entry's ``applicable`` accepts it); ``build`` is its schedule alone.

    Two rules are required, so that no entry escapes the size check or the planner's pruning
    by omission: ``ops`` (an :data:`OpsFn`) gives its schedule's size before it is built
    (:func:`every_rank_ops` where nothing better is known), and ``load`` is its link
    traffic (a :data:`TrafficFn`) or a :class:`NoBound` saying why it has none. ``links``
    (same signature as ``ops``) bounds the links of its routes from below, where they are
    longer than its ops (an op sent over a route of many links the routing carries); without
    it, none are counted. ``slots`` (same signature) bounds from below the chunk slots of one
    rank over its three buffers, which the verifier's interpreter holds for every rank (with a
    contributor bitset of ``n`` bits each in a reduction: cubic in ``n`` where every rank
    holds ``n`` blocks); without it, one input and one output chunk are counted.
    ``sends`` (a :data:`SendsFn`) says what its steps send between members without routes,
    for the bound that holds whatever routes the routing picks (on a fabric with spines ECMP
    prices other routes than the algorithm's, so ``load`` gives none there); without it the
    entry has none.
    ``exact_ops=True`` states that ``ops`` is the exact count of the schedule before relay
    lowering, so what is built is within relay lowering's factor (the longest relayed route's
    hops) of the estimate; otherwise ``ops`` is a lower bound only, and the planner checks the
    built schedule against the size check's limits before verifying it.
    """

    name: str
    collectives: frozenset[CollectiveKind]
    applicable: Callable[..., str | None]
    build: Callable[..., Schedule]
    ops: OpsFn
    load: TrafficFn | NoBound
    description: str = ""
    tunes: bool = False
    links: OpsFn | None = None
    contextual: bool = False
    synthesize: Callable[..., Synthesis] | None = None
    slots: OpsFn | None = None
    exact_ops: bool = False
    sends: SendsFn | None = None

    def min_ops(self, coll: Collective, **params) -> int:
        """A lower bound on the ops of this entry's schedule of ``coll`` (it must apply)."""
        return max(self.ops(coll, **params), every_rank_ops(coll))

    def traffic(self, coll: Collective, **params) -> Traffic | NoBound:
        """The link traffic of this entry's schedule of ``coll`` (it must apply), or why it
        has none."""
        if isinstance(self.load, NoBound):
            return self.load
        return self.load(coll, **params)

    def step_sends(self, coll: Collective, **params) -> tuple[Sends, ...] | NoBound:
        """What this entry's schedule of ``coll`` (it must apply) sends in each step, or why
        that is not known before building."""
        if self.sends is None:
            return NoBound(f"{self.name} has no rule for what its steps send")
        return self.sends(coll, **params)

    def min_links(self, coll: Collective, **params) -> int:
        """A lower bound on the route links of this entry's schedule of ``coll``."""
        return 0 if self.links is None else self.links(coll, **params)

    def min_slots(self, coll: Collective, **params) -> int:
        """A lower bound on the chunk slots of one rank (input, output and scratch together)
        in this entry's schedule of ``coll``: every rank has an input and an output chunk."""
        return max(2, 0 if self.slots is None else self.slots(coll, **params))

    @property
    def algorithm(self) -> str:
        return self.name.split("+")[0]

    @property
    def schedule(self) -> str:
        return self.name.split("+")[1] if "+" in self.name else "-"


REGISTRY: dict[str, Algorithm] = {}


def register(algo: Algorithm) -> Algorithm:
    """Add ``algo`` to the table.

    One name may be registered by several modules for disjoint collectives (e.g. ``direct``
    for alltoall in one module and for allgather in another): the entries merge into one that
    dispatches on the collective's kind. A name registered twice for one collective is a bug.

    Every registered build ends with two passes, so that every schedule anyone gets from the
    table (the planner, the benchmarks, the tests) is one the machine runs, and no algorithm
    has to remember them: the routing pass :func:`cclc.fabric_routing.route_spines` (a planned
    spine for every flow through a leaf/spine fabric), then :func:`cclc.relay.lower_relays`
    (an algorithm may route over any healthy path; the moves the topology's declared routing
    cannot carry become relays).
    """
    algo = replace(algo, applicable=_with_context(algo.applicable, algo.contextual),
                   build=_with_passes(algo.build, algo.tunes, algo.contextual),
                   synthesize=None if algo.synthesize is None
                   else _synthesis_with_passes(algo.synthesize, algo.contextual))
    old = REGISTRY.get(algo.name)
    if old is not None:
        if old.collectives & algo.collectives:
            raise ValueError(f"algorithm '{algo.name}' registered twice")
        algo = _merged(old, algo)
    REGISTRY[algo.name] = algo
    return algo


def unregister(name: str) -> None:
    """Remove entry ``name`` from the table (a test's own algorithm, once it is done)."""
    del REGISTRY[name]


def _with_context(applicable: Callable[..., str | None], contextual: bool
                  ) -> Callable[..., str | None]:
    def applies(coll: Collective, context: BuildContext | None = None, **params) -> str | None:
        if contextual:
            params["context"] = context or BuildContext()
        return applicable(coll, **params)

    return applies


def _passes(schedule: Schedule, context: BuildContext | None = None) -> Schedule:
    say = None if context is None else context.say
    if say is not None and has_spines(schedule.topology):
        say(f"planning the spines of {len(schedule.ops)} ops")
    if context is None or not context.own_nics or schedule.topology.kind != "fabric":
        return lower_relays(route_spines(schedule))
    # each op between servers through its GPUs' own NICs; a GPU without one has its traffic
    # relayed by a server mate through the mate's NIC, in two ops (the runtime's GPU does not
    # forward another GPU's message as NCCL's PXN does)
    routed = route_spines(own_nic_routes(schedule))
    try:
        return lower_relays(routed, across_ranks=False)
    except RelayError:
        # the mate is not a member (a rail group): the plain lowering, which that output
        # refuses with its reason
        return lower_relays(routed)


def _with_passes(build: Callable[..., Schedule], tunes: bool, contextual: bool
                 ) -> Callable[..., Schedule]:
    def build_route_relay(coll: Collective, cost: CostFn | None = None,
                          context: BuildContext | None = None, **params) -> Schedule:
        if tunes:
            # a tuning algorithm compares its variants as routed (not yet relayed), which is
            # how they reach the machine's links
            measure = cost or lockstep_time
            own = context is not None and context.own_nics
            params["cost"] = lambda s: measure(route_spines(own_nic_routes(s) if own else s))
        if contextual:
            params["context"] = context or BuildContext()
        return _passes(build(coll, **params), context)

    return build_route_relay


def _synthesis_with_passes(synthesize: Callable[..., Synthesis], contextual: bool
                           ) -> Callable[..., Synthesis]:
    def synthesize_route_relay(coll: Collective, context: BuildContext | None = None,
                               **params) -> Synthesis:
        if contextual:
            params["context"] = context or BuildContext()
        found = synthesize(coll, **params)
        if found.schedule is None:
            return found
        return replace(found, schedule=_passes(found.schedule, context))

    return synthesize_route_relay


def lockstep_time(schedule: Schedule) -> float:
    """The IR's plain lockstep time of ``schedule`` (:func:`cclc.sim.simulate`): the default
    :data:`CostFn` of a tuning algorithm."""
    return simulate(schedule).time


def _merged(a: Algorithm, b: Algorithm) -> Algorithm:
    def pick(coll: Collective) -> Algorithm:
        return a if coll.kind in a.collectives else b

    return Algorithm(name=a.name, collectives=a.collectives | b.collectives,
                     applicable=lambda coll, **p: pick(coll).applicable(coll, **p),
                     build=lambda coll, **p: pick(coll).build(coll, **p),
                     description="; ".join(d for d in (a.description, b.description) if d),
                     tunes=a.tunes or b.tunes,
                     ops=lambda coll, **p: pick(coll).min_ops(coll, **p),
                     load=lambda coll, **p: pick(coll).traffic(coll, **p),
                     links=lambda coll, **p: pick(coll).min_links(coll, **p),
                     slots=lambda coll, **p: pick(coll).min_slots(coll, **p),
                     # merged entries state exactness only where both parts do
                     exact_ops=a.exact_ops and b.exact_ops,
                     sends=lambda coll, **p: pick(coll).step_sends(coll, **p),
                     contextual=a.contextual or b.contextual,
                     synthesize=None if a.synthesize is None and b.synthesize is None
                     else lambda coll, **p: _synthesize_of(pick(coll))(coll, **p))


def _synthesize_of(entry: Algorithm) -> Callable[..., Synthesis]:
    if entry.synthesize is None:
        raise CollectiveError(f"algorithm '{entry.name}' does not synthesize "
                              f"{', '.join(sorted(k.value for k in entry.collectives))}")
    return entry.synthesize


def algorithms_for(coll: Collective) -> list[Algorithm]:
    """Every registered algorithm that serves ``coll``'s kind, in registration order."""
    _load_all()
    return [a for a in REGISTRY.values() if coll.kind in a.collectives]


def get(name: str) -> Algorithm | None:
    _load_all()
    return REGISTRY.get(name)


def _load_all() -> None:
    # importing a module registers its algorithms; the order here is the order of reports
    for mod in _MODULES:
        importlib.import_module(f"cclc.algorithms.{mod}")


#: algorithm modules, each registers its entries when imported
_MODULES: list[str] = ["direct", "ring", "tree", "torus_collectives", "recursive", "bruck", "pat",
                       "hierarchical", "direct_switch", "torus_alltoall", "synth_flows",
                       "synth_trees", "rail_halving"]

# Loaded now, not on first use: importing any one module (``from cclc.algorithms import
# synth_flows``) runs this package first, so the catalogue's order, which breaks the planner's
# ties between equally fast schedules, never depends on which module someone imported first.
_load_all()
