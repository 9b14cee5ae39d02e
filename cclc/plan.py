"""Planning: turn a collective's algorithm/schedule hints into one verified schedule.

An explicit hint names a registry entry (algorithm ``a`` and schedule ``s`` combine into the
key ``"a+s"``, or just ``"a"`` when the schedule is ``auto``). With ``auto`` every applicable
entry is built, verified and simulated under an execution model (:mod:`cclc.execution`: the
backend's lockstep or dataflow execution and its software overhead; the IR's plain lockstep by
default) and the topology's declared routing, and the fastest wins. Either way the
:class:`Plan` records every candidate considered: its simulated time and % of the lower bound,
or why it was not applicable.

This module is where choices are made; the algorithms only build. Names resolve once
(:func:`resolve`, a :class:`Resolution` that the size check also takes); the explicit path
and ``auto`` are two functions; the model and the synthesis budget reach the builds as a
:class:`~cclc.algorithms.BuildContext`; a synthesis named explicitly is raced against the
templates by :mod:`cclc.template_race`; ``auto``'s large best-so-far waits in
:mod:`cclc.spill`.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from cclc.algorithms import (
    REGISTRY,
    Algorithm,
    BudgetExhausted,
    BuildContext,
    NoBound,
    Outpaced,
    algorithms_for,
    get,
)
from cclc.bounds import Bound, Bounds, bounds
from cclc.budget import Limits
from cclc.collective import Collective, make_collective
from cclc.errors import CclError, CollectiveError, ScheduleError, Span
from cclc.execution import IR_MODEL, ExecutionModel, predict, unpriced_reason
from cclc.ir import Schedule
from cclc.load_bounds import LoadBound, candidate_bounds, evaluation_order, prune_reason
from cclc.lockstep_bound import lockstep_bound
from cclc.relay import RelayError
from cclc.spill import HeldSchedule
from cclc.template_race import race_synthesis
from cclc.verify import verify

__all__ = [
    "Candidate",
    "CrossoverRow",
    "Plan",
    "Resolution",
    "crossover_table",
    "hint_key",
    "hint_params",
    "known_names",
    "plan",
    "resolve",
]


@dataclass(frozen=True, slots=True)
class Candidate:
    """One row of the planner's table.

    ``time`` (seconds, under the plan's execution model and the declared routing) and
    ``pct_of_bound`` (bound / time x 100) are ``None`` when the candidate was not applicable
    (``reason`` says why) or could not be simulated. ``planned_time``: on an ECMP fabric, the
    time if cclc's planned spines were realized (a plan: it needs a routing mechanism).
    ``estimate``: the candidate's load bound (:mod:`cclc.load_bounds`), a lower bound on
    ``time`` computed before building anything, or ``no_bound``: why it has none (the
    entry's :class:`~cclc.algorithms.NoBound`); ``pruned`` says why ``auto`` did not build a
    candidate whose bound is above a simulated time (then ``time`` is ``None``).
    ``refused``: why a requested output cannot take the schedule (``auto`` then chooses
    the fastest candidate every output takes, when one exists).
    """

    name: str
    applicable: bool
    reason: str | None = None
    time: float | None = None
    pct_of_bound: float | None = None
    planned_time: float | None = None
    estimate: float | None = None
    pruned: str | None = None
    refused: str | None = None
    no_bound: str | None = None


@dataclass(frozen=True, eq=False)
class Plan:
    """The chosen schedule and the evidence for the choice. The schedule was verified: a plan
    is only ever made of one that passed :func:`cclc.verify.verify`."""

    schedule: Schedule
    time: float | None
    bound: float | None
    candidates: tuple[Candidate, ...]
    model: ExecutionModel = IR_MODEL
    planned_time: float | None = None
    #: every lower bound of the collective (``bound`` is the best of them)
    bounds: Bounds | None = None
    #: the bound of :mod:`cclc.lockstep_bound`, where ``model`` runs lockstep steps (no
    #: dataflow runtime is held to it) and it is stronger than ``bound``; else ``None``
    lockstep: Bound | None = None

    @property
    def name(self) -> str:
        return _entry_name(self.schedule)

    @property
    def pct_of_bound(self) -> float | None:
        return _pct(self.bound, self.time)

    @property
    def pct_of_lockstep_bound(self) -> float | None:
        """The lockstep bound / ``time`` x 100, where there is one (see ``lockstep``)."""
        return _pct(self.lockstep.seconds if self.lockstep is not None else None, self.time)


@dataclass(frozen=True, slots=True)
class CrossoverRow:
    """The winner of ``auto`` for one size."""

    size: int
    winner: str
    time: float | None
    pct_of_bound: float | None


def _entry_name(s: Schedule) -> str:
    return s.algorithm if s.schedule in ("-", "auto", "") else f"{s.algorithm}+{s.schedule}"


def _pct(bound: float | None, time: float | None) -> float | None:
    if bound is None or time is None or time <= 0:
        return None
    return 100.0 * bound / time


def hint_key(coll: Collective) -> str | None:
    """The registry key the hints name, or ``None`` when the algorithm is ``auto``."""
    a, s = coll.algorithm.name, coll.schedule.name
    if a == "auto":
        return None
    return a if s == "auto" else f"{a}+{s}"


def _params(coll: Collective) -> dict:
    # schedule parameters (e.g. chunks=6) follow the algorithm's, later ones win
    return dict(coll.algorithm.params) | dict(coll.schedule.params)


#: the hint parameters an entry of ``coll`` is built with
hint_params = _params


# -- the analyses every candidate goes through ------------------------------------------------

def _simulate(schedule: Schedule, model: ExecutionModel) -> tuple[float, float | None]:
    p = predict(schedule, model)
    return p.time, p.planned_time


def _bounds(coll: Collective, on_stage: Callable[[str], None]) -> Bounds:
    return bounds(coll, on_stage=on_stage)


# -- planning --------------------------------------------------------------------------------

def _unknown(coll: Collective, what: str, name: str, known: list[str]) -> CollectiveError:
    close = difflib.get_close_matches(name, known, n=1)
    hint = coll.schedule if what == "schedule" else coll.algorithm
    msg = (f"unknown {what} '{name}' for {coll.kind.value}; known: "
           f"{', '.join(known) if known else '(none)'}")
    if close:
        msg += f" (did you mean '{close[0]}'?)"
    return CollectiveError(msg, hint.span or coll.span)


def _lookup(coll: Collective) -> list[Algorithm] | Algorithm:
    """The explicit entry, or the auto candidates, with errors for names that do not exist."""
    serving = algorithms_for(coll)
    key = hint_key(coll)
    sched = coll.schedule.name
    if key is None:
        if sched == "auto":
            return serving
        matching = [a for a in serving if a.schedule == sched]
        if not matching:
            known = sorted({a.schedule for a in serving if a.schedule != "-"})
            raise _unknown(coll, "schedule", sched, known)
        return matching
    if sched == "auto":
        # "ring" names the plain entry, or lets auto pick among "ring+<schedule>" entries
        family = [a for a in serving if a.name == key or a.algorithm == key]
        plain = [a for a in family if a.name == key]
        if plain:
            return plain[0]
        if family:
            return family
    entry = get(key)
    if entry is not None and coll.kind in entry.collectives:
        return entry
    if entry is not None or any(a.algorithm == key for a in REGISTRY.values()):
        served = ", ".join(a.name for a in serving)
        raise CollectiveError(f"algorithm '{key}' does not serve {coll.kind.value}; "
                              f"for {coll.kind.value}: {served}",
                              coll.algorithm.span or coll.span)
    if sched != "auto" and any(a.algorithm == coll.algorithm.name for a in serving):
        known = sorted({a.schedule for a in serving
                        if a.algorithm == coll.algorithm.name and a.schedule != "-"})
        raise _unknown(coll, "schedule", sched, known)
    if any(a.algorithm == coll.algorithm.name for a in REGISTRY.values()):
        served = ", ".join(a.name for a in serving)
        raise CollectiveError(f"algorithm '{coll.algorithm.name}' does not serve "
                              f"{coll.kind.value}; for {coll.kind.value}: {served}",
                              coll.algorithm.span or coll.span)
    known = sorted({a.name for a in serving} | {a.algorithm for a in serving})
    raise _unknown(coll, "algorithm", coll.algorithm.name, known)


@dataclass(frozen=True, eq=False)
class Resolution:
    """A collective's hints resolved once (:func:`resolve`), for the size check and the
    planner: ``entries`` is the explicitly named entry alone (``explicit``) or the candidates
    of ``auto``; ``params`` the hint parameters they are built with; ``serving`` every entry
    serving the collective's kind (the alternatives ``explain`` shows and the size check
    suggests)."""

    collective: Collective
    entries: tuple[Algorithm, ...]
    explicit: bool
    params: dict = field(default_factory=dict)
    serving: tuple[Algorithm, ...] = ()


def resolve(coll: Collective, context: BuildContext | None = None) -> Resolution:
    """The entries ``plan`` considers for ``coll`` and their parameters, without building
    anything (``context``: what the builds will be told, which an entry's applicability may
    depend on: a synthesis budget).

    Raises the same :class:`~cclc.errors.CollectiveError` as :func:`plan` for unknown names
    and for an explicit entry that does not apply, so a caller can reject a file's mistakes
    before doing any long work.
    """
    context = context or BuildContext()
    chosen = _lookup(coll)
    params = _params(coll)
    serving = tuple(algorithms_for(coll))
    if isinstance(chosen, Algorithm):
        _check_applicable(coll, chosen, params, context)
        return Resolution(coll, (chosen,), True, params, serving)
    return Resolution(coll, tuple(chosen), False, params, serving)


def _check_applicable(coll: Collective, algo: Algorithm, params: dict,
                      context: BuildContext) -> None:
    reason = algo.applicable(coll, context=context, **params)
    if reason is not None:
        raise CollectiveError(f"algorithm '{algo.name}' cannot serve collective "
                              f"'{coll.name}': {reason}",
                              _named_param_span(coll, reason) or coll.algorithm.span
                              or coll.span)


def _named_param_span(coll: Collective, reason: str) -> Span | None:
    """Where the hint parameter that ``reason`` is about is written (``chunks = ...`` or
    ``parameter chunks``), so the caret is under it; ``None`` when it names none."""
    # schedule parameters win over the algorithm's, as in the hint parameters
    for hint in (coll.schedule, coll.algorithm):
        for key, _ in hint.params:
            if f"{key} = " in reason or f"parameter {key} " in reason:
                span = hint.param_span(key)
                if span is not None:
                    return span
    return None


def _evaluate(coll: Collective, algo: Algorithm, params: dict, bound: float | None,
              context: BuildContext, say: Callable[[str], None] = lambda what: None,
              limits: Limits | None = None, estimate_fits: bool = False,
              before_build: Callable[[], None] = lambda: None
              ) -> tuple[Candidate, Schedule | None]:
    """Build, verify and simulate one candidate (for ``auto`` and ``explain``); ``say(what)``
    is told each phase before it starts. With ``limits`` (the size check's), a candidate
    whose estimate, or whose built schedule, does not fit them is not applicable: it is not
    built, or not verified. ``estimate_fits``: the caller found the estimate within
    ``limits`` already. ``before_build()`` is called once the candidate is to be built."""
    reason = algo.applicable(coll, context=context, **params)
    if reason is None and limits is not None and not estimate_fits:
        reason = limits.candidate_refusal(coll, algo, params)
    if reason is not None:
        return Candidate(algo.name, False, reason), None
    before_build()
    context = replace(context, say=lambda what: say(f"{algo.name}: {what}"))
    try:
        schedule = algo.build(coll, context=context, **params)  # any other failure: a bug
    except (RelayError, BudgetExhausted) as err:
        # the routing cannot carry a move and no member of the group can relay it, or a
        # synthesis found nothing within its budget
        return Candidate(algo.name, False, err.message), None
    except Outpaced as err:
        # auto's synthesis predicted itself far slower than the fastest so far (no estimate:
        # its prediction is not a lower bound, so only a refusal of that one builds it again)
        return Candidate(algo.name, True, None, pruned=err.message), None
    # an estimate below what was built: the verifier's interpreter must still fit
    reason = None if limits is None else limits.schedule_refusal(schedule)
    if reason is not None:
        return Candidate(algo.name, False, reason), None
    # a schedule the model's runtime cannot run has no time under it (and its pricing can
    # be the longest work of the compile)
    reason = unpriced_reason(schedule, context.model)
    if reason is not None:
        return Candidate(algo.name, False, f"no time under the {context.model.name} model: "
                         f"{reason}"), None
    say(f"{algo.name}: verifying {len(schedule.ops)} ops")
    try:
        verify(schedule)
    except ScheduleError as err:
        # a bug in the algorithm: never pick it, and say so in the table
        return Candidate(algo.name, False, f"failed verification: {err.message}"), None
    say(f"{algo.name}: simulating {len(schedule.ops)} ops")
    time, planned = _simulate(schedule, context.model)
    return Candidate(algo.name, True, None, time, _pct(bound, time), planned), schedule


def _saying(step: Callable[[int, int, str], None], i: int, total: int
            ) -> Callable[[str], None]:
    """``say(what)`` for a candidate's phases: step ``i`` of ``total`` doing ``what``."""
    return lambda what: step(i, total, what)


#: ``on_step(i, total, what)``: the planner is at step ``i`` of ``total``, doing ``what``
StepFn = Callable[[int, int, str], None]


def plan(coll: Collective, explain: bool = False, model: ExecutionModel = IR_MODEL,
         on_step: StepFn | None = None, prune: bool = True,
         refusal: Callable[[Schedule], str | None] | None = None,
         synth_budget: float | None = None, resolution: Resolution | None = None,
         emit_seconds_per_op: float = 0.0, limits: Limits | None = None,
         own_nics: bool = False) -> Plan:
    """Choose, build and check the schedule of ``coll``.

    With an explicit algorithm hint, that entry is built and verified (its
    :class:`~cclc.errors.ScheduleError` propagates; a synthesizing entry is raced against
    the templates, :mod:`cclc.template_race`); ``explain=True`` also evaluates every other
    entry serving the collective, so the table shows the alternatives. With ``auto`` every
    applicable entry is evaluated and the fastest verified one is kept (the first registered
    among equals).

    Raises :class:`~cclc.errors.CollectiveError` (at the hint's span) for an unknown name, an
    entry that does not serve the collective or is not applicable, and when no candidate
    applies. Times are under ``model`` (see :mod:`cclc.execution`), which every build that
    asks is told (:class:`~cclc.algorithms.BuildContext`), with ``synth_budget``: the seconds
    a synthesis may take where its hint names none. ``on_step(i, total, what)`` is called
    before each step (the bounds, then each candidate), for progress reports. ``prune``
    (``auto`` only): skip the candidates whose load bound (:mod:`cclc.load_bounds`) is above
    an already simulated time; they cannot win, so the choice is the same.
    ``refusal(schedule)`` (``auto`` only): why the requested outputs cannot take a schedule,
    or None; asked of the fastest candidate, then (where refused) of the next fastest, built
    again, with the candidates pruned against the refused time that could beat it evaluated:
    a refused candidate ranks after every one the outputs take (it is chosen only when all
    are refused).
    ``resolution``: ``coll``'s :func:`resolve`, when the caller has it already.
    ``emit_seconds_per_op``: what writing the requested outputs costs per op of the schedule
    kept, which ``auto``'s synthesis candidate pays for within its budget (its op limit,
    :func:`cclc.algorithms.tree_budget.auto_op_limit`).
    ``limits``: the size check's (:class:`~cclc.budget.Limits`; ``None``: none): ``auto``
    skips a candidate whose estimate or built schedule does not fit them, and an explicit
    entry whose built schedule does not is refused (:class:`~cclc.errors.CclError`) before
    it is verified.
    ``own_nics``: route every op between servers through its GPUs' own NICs, what an output's
    runtime runs (:attr:`~cclc.algorithms.BuildContext.own_nics`).
    """
    step = on_step or (lambda i, total, what: None)
    context = BuildContext(model, synth_budget, emit_seconds_per_op, own_nics=own_nics)
    res = resolution if resolution is not None else resolve(coll, context)
    others = [a for a in res.serving if a.name != res.entries[0].name] \
        if res.explicit and explain else []
    total = 1 + (1 + len(others) if res.explicit else len(res.entries))
    step(0, total, "lower bounds")
    try:
        # the bounds report what they wait for (the symmetry search, the LP and its size),
        # so a long solve shows what it is
        all_bounds, unjoinable = _bounds(
            coll, lambda what: step(0, total, f"lower bounds: {what}")), None
    except CclError as err:
        # no route the routing carries joins the group: each candidate's failure says why
        # better; the bounds' error stands if one builds all the same
        all_bounds, unjoinable = None, err
    if res.explicit:
        chosen = _plan_explicit(res, others, context, all_bounds, unjoinable, step, total,
                                limits)
    else:
        chosen = _plan_auto(res, context, all_bounds, unjoinable, step, total, prune, refusal,
                            limits, explain)
    return replace(chosen, lockstep=_lockstep(coll, model, chosen.bound))


def _lockstep(coll: Collective, model: ExecutionModel, bound: float | None) -> Bound | None:
    """The lockstep bound of ``coll`` where ``model`` runs lockstep steps and the bound is
    above ``bound`` (``None``: the bounds failed). A model with a cost per step takes the
    IR's lockstep time plus that cost, so the bound holds under it too; a dataflow runtime
    does not wait for a step's slowest op, so no dataflow time is held to it."""
    if model.mode != "lockstep" or bound is None:
        return None
    found = lockstep_bound(coll)
    if found is None or found.seconds <= bound:
        return None
    return found


def _plan_explicit(res: Resolution, others: list[Algorithm], context: BuildContext,
                   all_bounds: Bounds | None, unjoinable: CclError | None, step: StepFn,
                   total: int, limits: Limits | None) -> Plan:
    """The explicitly named entry, built and verified, and (``explain``) the ``others``
    evaluated beside it."""
    coll, (chosen,) = res.collective, res.entries
    bound = None if all_bounds is None else float(all_bounds.best)
    _check_applicable(coll, chosen, res.params, context)
    step(1, total, f"{chosen.name}: building")
    if chosen.synthesize is not None:
        # the planner, not the synthesis, decides whether a template is faster
        race = res.params.get("race", 1) != 0
        schedule = race_synthesis(coll, chosen, context, res.params, race)
    else:
        schedule = chosen.build(coll, context=replace(
            context, say=lambda what: step(1, total, f"{chosen.name}: {what}")), **res.params)
    if unjoinable is not None:
        raise unjoinable
    why = None if limits is None else limits.schedule_refusal(schedule)
    if why is not None:
        raise CclError(f"collective '{coll.name}': its {chosen.name} schedule is {why}; use a "
                       "smaller topology, group, size or chunks, another algorithm, or "
                       "--no-size-check to try anyway")
    why = unpriced_reason(schedule, context.model)
    if why is not None:
        raise CclError(f"collective '{coll.name}': its {chosen.name} schedule has no time "
                       f"under the {context.model.name} model, which prices what the first "
                       f"code-emitting output of --emit runs: {why}, or emit that output "
                       "after another")
    step(1, total, f"{chosen.name}: verifying {len(schedule.ops)} ops")
    verify(schedule)
    step(1, total, f"{chosen.name}: simulating {len(schedule.ops)} ops")
    time, planned = _simulate(schedule, context.model)
    rows = [Candidate(chosen.name, True, None, time, _pct(bound, time), planned)]
    # the alternatives are judged without the user's parameters, which belong to the
    # explicit choice
    for i, algo in enumerate(others):
        step(2 + i, total, f"{algo.name}: building")
        rows.append(_evaluate(coll.as_auto(), algo, {}, bound, context,
                              _saying(step, 2 + i, total), limits)[0])
    return Plan(schedule, time, bound, tuple(rows), context.model, planned, all_bounds)


def _plan_auto(res: Resolution, context: BuildContext, all_bounds: Bounds | None,
               unjoinable: CclError | None, step: StepFn, total: int, prune: bool,
               refusal: Callable[[Schedule], str | None] | None, limits: Limits | None,
               explain: bool = False) -> Plan:
    """``auto``: every candidate of ``res`` evaluated, cheapest load bound first, those that
    cannot win pruned, the fastest kept (the first registered among equals) if the outputs
    take it, else the next fastest they take (:meth:`_AutoRun.first_taken`). The load
    bounds are computed where they can prune (two candidates or more to build) or are shown
    (``explain``)."""
    coll, chosen, params = res.collective, res.entries, res.params
    bound = None if all_bounds is None else float(all_bounds.best)
    # a candidate the size check skips is not bounded either: its rule could hold as many
    # entries as its ops (direct's sends at 4,096 ranks: 2e8)
    fits = [limits is None or limits.candidate_refusal(coll, algo, params) is None
            for algo in chosen]
    # a lone candidate is built whatever its bound: the 4,096-GPU fat tree's AllToAll, where
    # only direct applies and fits, spent 1.7-2.5 s on direct's send bound for nothing
    live = sum(ok and algo.applicable(coll, **params) is None
               for algo, ok in zip(chosen, fits, strict=True))
    bounds_loads = prune and (explain or live > 1)
    # cheapest bound first, so a good time is known early and prunes the most; the winner is
    # the fastest, the first registered among equals, whatever the order of evaluation
    if bounds_loads:
        step(0, total, f"load bounds of the {len(chosen)} candidates")
    bounded = iter(candidate_bounds(coll, [a for a, ok in zip(chosen, fits, strict=True) if ok],
                                    params, context.model) if bounds_loads else ())
    run = _AutoRun(res, bound, context, step, total, limits, fits,
                   [next(bounded) if bounds_loads and ok else None for ok in fits], prune)
    for n_done, i in enumerate(evaluation_order(
            run.bounds_of, [a.synthesize is not None for a in chosen])):
        algo = chosen[i]
        step(1 + n_done, total, algo.name)
        est, fastest = run.bounds_of[i], run.fastest
        why = prune_reason(est, fastest.row.time if fastest else None,
                           fastest.row.name if fastest else None)
        if why is not None and algo.applicable(coll, context=context, **params) is None:
            assert isinstance(est, LoadBound)
            run.found[i] = Candidate(algo.name, True, None, estimate=est.time, pruned=why)
            continue
        run.evaluate(i, 1 + n_done)
    best = run.first_taken(refusal)
    rows = [r for r in run.found if r is not None]
    if best is None:
        why = "; ".join(f"{r.name}: {r.reason}" for r in rows) or "no algorithm is registered"
        raise CollectiveError(f"no algorithm can serve collective '{coll.name}' "
                              f"({coll.kind.value} on {coll.n} ranks): {why}",
                              coll.algorithm.span or coll.span)
    if unjoinable is not None:
        raise unjoinable
    schedule, row = best.held.restored(), best.row
    return Plan(schedule, row.time, bound, tuple(rows), context.model, row.planned_time,
                all_bounds)


@dataclass(eq=False)
class _AutoRun:
    """``auto``'s evaluation of the candidates of ``res``: their rows (``found``, in
    registration order; ``None``: not reached yet) and the fastest evaluated, held."""

    res: Resolution
    bound: float | None
    context: BuildContext
    step: StepFn
    total: int
    limits: Limits | None
    fits: list[bool]            # whether each candidate's size estimate fits ``limits``
    bounds_of: list[LoadBound | NoBound | None]
    prune: bool = True
    found: list[Candidate | None] = field(default_factory=list)
    fastest: _Best | None = None

    def __post_init__(self) -> None:
        self.found = [None] * len(self.res.entries)

    def evaluate(self, i: int, at: int) -> None:
        """Evaluate candidate ``i`` (step ``at``) into ``found``; hold it if the fastest."""
        est = self.bounds_of[i]
        context = self.context
        # a synthesis may give up against the fastest so far, unless every candidate is to
        # be built (prune=False)
        if self.prune and self.fastest is not None and self.fastest.row.time is not None:
            context = replace(context, beat=(self.fastest.row.name, self.fastest.row.time))
        row, schedule = _evaluate(self.res.collective, self.res.entries[i], self.res.params,
                                  self.bound, context, _saying(self.step, at, self.total),
                                  self.limits, self.fits[i], self._make_room)
        self.found[i] = row = replace(
            row, estimate=est.time if isinstance(est, LoadBound) else None,
            no_bound=est.reason if isinstance(est, NoBound) else None)
        key = (_tie_time(row.time), i)
        if schedule is not None and (self.fastest is None or key < self.fastest.key):
            self.fastest = _Best(key, HeldSchedule(schedule), row)

    def _make_room(self) -> None:
        """The fastest so far moved out of memory, before another candidate is built (not
        before one that is not: at 4,096 GPUs only direct is built of the AllToAll's 14, and
        spilling its 16.7M ops for each of the others cost the compile 8-12 s)."""
        if self.fastest is not None:
            self.fastest = self.fastest.make_room()

    def first_taken(self, refusal: Callable[[Schedule], str | None] | None) -> _Best | None:
        """The fastest candidate the outputs take (``refusal``), or, when they refuse every
        one, the fastest; ``None`` when none was built. The outputs are asked of the fastest
        only (the MSCCL output lowers what it is asked about); a refusal, rare, costs the next
        one's build again, after the candidates pruned against the refused time that could
        beat it are evaluated."""
        refused: _Best | None = None
        last = self.total - 1
        while refusal is not None:
            if self.fastest is None:
                ranked = self._ranked()
                next_time = ranked[0][0] if ranked else float("inf")
                for i, r in enumerate(self.found):
                    # (a synthesis that gave up against the refused one has no estimate)
                    if (r is not None and r.pruned is not None
                            and (r.estimate is None or r.estimate < next_time)):
                        self.evaluate(i, last)
                ranked = self._ranked()
                if not ranked:
                    break
                if self.fastest is None or self.fastest.key != ranked[0]:
                    i = ranked[0][1]
                    self.step(last, self.total, f"{self.res.entries[i].name}: building again "
                              f"(the outputs refuse {refused.row.name if refused else 'it'})")
                    self.fastest = None
                    # builds are deterministic, but for a synthesis's budget
                    self.evaluate(i, last)
                    if self.fastest is None:
                        continue
            self.step(last, self.total, f"{self.fastest.row.name}: asking the outputs")
            # held in memory from here: the schedule asked about is the one returned (an
            # output may keep what it worked out for it, as MSCCL's lowering)
            schedule = self.fastest.held.restored()
            self.fastest = replace(self.fastest, held=HeldSchedule(schedule))
            why = refusal(schedule)
            if why is None:
                break
            i = self.fastest.key[1]
            self.found[i] = replace(self.fastest.row, refused=why)
            if refused is None or self.fastest.key < refused.key:
                refused = self.fastest.make_room()
            self.fastest = None
        return self.fastest or refused

    def _ranked(self) -> list[tuple[float, int]]:
        """The sort keys of the simulated candidates the outputs have not refused, fastest
        first."""
        return sorted((_tie_time(r.time), i) for i, r in enumerate(self.found)
                      if r is not None and r.time is not None and r.refused is None)


@dataclass(frozen=True, eq=False)
class _Best:
    """``auto``'s fastest candidate so far: its sort key, its schedule (in memory, or on disk
    while the next candidate is built: :mod:`cclc.spill`) and its row."""

    key: tuple[float, int]
    held: HeldSchedule
    row: Candidate

    def make_room(self) -> _Best:
        """This entry with a large schedule moved out of memory."""
        return replace(self, held=self.held.make_room())


def _tie_time(time: float | None) -> float:
    """A candidate's time for ranking: rounded to 9 significant digits, so that two
    schedules whose times differ only by floating-point rounding tie and the first registered
    wins (synth's trees on one switch price like ``direct`` up to the last bit, and which bit
    depended on the chunk count its deadline allowed, so on the machine's load)."""
    return float("inf") if time is None else float(f"{time:.9g}")


def crossover_table(coll: Collective, sizes) -> list[CrossoverRow]:
    """For each size in ``sizes`` (bytes, as ``coll.size`` means them), the ``auto`` winner.

    The collective is rebuilt at each size with ``auto`` hints; sizes that the group cannot
    split evenly raise :class:`~cclc.errors.CollectiveError`.
    """
    if coll.pair_sizes is not None:
        raise CollectiveError(f"collective '{coll.name}' has per-pair sizes; a crossover table "
                              "needs a uniform size to vary", coll.span)
    rows = []
    for size in sizes:
        sized = make_collective(coll.name, coll.kind, coll.topology, coll.group, size=int(size),
                                dtype=coll.dtype, op=coll.op, root=coll.root, span=coll.span)
        p = plan(sized)
        rows.append(CrossoverRow(int(size), p.name, p.time, p.pct_of_bound))
    return rows


def known_names() -> list[str]:
    """Every registered entry name (for help texts)."""
    get("")  # loads every algorithm module
    return sorted(REGISTRY)
