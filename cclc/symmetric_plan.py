"""Planning in symmetric form: what ``auto`` does where the whole schedule is too large.

A collective whose size estimate (:mod:`cclc.budget`) is over :data:`SYMMETRIC_FROM_OPS` is
planned in symmetric form when its machine is a healthy torus and a schedule of it is the same
from every rank up to a translation: the schedule is then built, verified, timed and written
as representatives and the group (:mod:`cclc.symmetric`), never expanded. Today that is the
AllToAll, AllReduce, AllGather and ReduceScatter under ``auto`` (:data:`BUILDERS`, from
:mod:`cclc.algorithms.torus_symmetric`), timed under a lockstep model, and the AllToAll on a
torus whose only faults are failed links: the healthy torus's schedule less the journeys that
cross them, and a tail that delivers theirs (:mod:`cclc.algorithms.torus_reroute`,
:mod:`cclc.symmetric_faults`); and the AllReduce, AllGather and ReduceScatter there:
ring+dimrotation less the phases of the rings they cut, run as lines in the same steps
(:mod:`cclc.algorithms.torus_cut_allreduce`, :mod:`cclc.symmetric_lines`). Anything else is
planned whole, or refused by the size check within seconds, with its estimate.
:func:`symmetric_reason` says why a collective cannot take this path, :func:`form_refusal`
why its form is too large for the machine (the size check of the form, from its closed-form
size, :func:`form_estimate`), :func:`plan_symmetric` takes it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from cclc.algorithms.torus_cut_allreduce import (
    lined_allgather,
    lined_allreduce,
    lined_reason,
    lined_reducescatter,
)
from cclc.algorithms.torus_reroute import excepted_alltoall, excepted_reason
from cclc.algorithms.torus_symmetric import (
    form_size,
    symmetric_allgather,
    symmetric_allreduce,
    symmetric_alltoall,
    symmetric_reducescatter,
)
from cclc.algorithms.torus_symmetric import symmetric_reason as builders_reason
from cclc.bounds import Bounds, bounds
from cclc.budget import BYTES_PER_OP, Limits, SizeEstimate
from cclc.collective import REDUCING_KINDS, Collective, CollectiveKind
from cclc.execution import IR_MODEL, ExecutionModel
from cclc.ir import Schedule
from cclc.plan import Resolution
from cclc.symmetric import ExceptedSchedule, SymmetricSchedule, expand
from cclc.symmetric_check import SymmetricLockstep, simulate_lockstep, verify_symmetric
from cclc.symmetric_faults import (
    ExceptedLockstep,
    expand_excepted,
    simulate_excepted,
    verify_excepted,
)
from cclc.symmetric_lines import simulate_lined, verify_lined

__all__ = ["BUILDERS", "EXCEPTED", "SYMMETRIC_FROM_OPS", "SymmetricPlan", "build_symmetric",
           "describe_form", "expand_form", "form_estimate", "form_refusal", "form_steps",
           "plan_symmetric",
           "simulate_form", "symmetric_model", "symmetric_reason", "verify_form"]

#: the size check's estimate (ops, a lower bound on the largest candidate, cclc.budget) above
#: which ``auto`` plans a collective in symmetric form where it can: a quarter of the limit
#: (cclc.budget.MAX_OPS), because whole schedules run to about three times the estimate at
#: 4,096 ranks (a 16x16x16 torus AllReduce: ring estimated at 16.8M ops, built with 50.3M,
#: 14 GB before it was stopped)
SYMMETRIC_FROM_OPS = 5_000_000

# The form's time constants are floors of what benchmarks/form_estimate.py measures (build,
# verify and simulate, 2 cores; its table shows measured / estimate per form, at least 1):
#: seconds per representative op at the least: 0.8 us an op measured on the AllToAll of a
#: 64x64 torus (the whole-schedule constant, cclc.budget.SECONDS_PER_OP, is 1 us)
FORM_SECONDS_PER_OP = 5e-7
#: seconds per step of a form at the least: its verifier runs a step at a time, 0.35 ms a
#: step measured in all (0.15 ms verifying, the builder's loop the rest) on an AllGather of a
#: 2x16384 torus
STEP_SECONDS = 1.5e-4
#: seconds per representative op and rank at the least where the form reduces: its verifier
#: moves a contributor row of ``n`` booleans per op; 2.1e-9 to 1.0e-8 measured per op and rank
#: (the least on a 16x16x16 AllReduce, whose verifier took 0.46 to 1.6 s from run to run)
SET_SECONDS = 2e-9
#: bytes per chunk slot of rank 0 in the form's verifier (an int64 value and an int64 stamp),
#: plus ``n`` booleans of contributors where it reduces
FORM_SLOT_BYTES = 16

#: the builder of each collective kind that ``auto`` plans in symmetric form
BUILDERS: dict[CollectiveKind, Callable[[Collective], SymmetricSchedule]] = {
    CollectiveKind.ALLTOALL: symmetric_alltoall,
    CollectiveKind.ALLREDUCE: symmetric_allreduce,
    CollectiveKind.ALLGATHER: symmetric_allgather,
    CollectiveKind.REDUCESCATTER: symmetric_reducescatter,
}

#: the builder of each collective kind with exceptions for failed links, and why it cannot
#: serve a collective
EXCEPTED: dict[CollectiveKind, tuple[Callable[[Collective], ExceptedSchedule],
                                     Callable[[Collective], str | None]]] = {
    CollectiveKind.ALLTOALL: (excepted_alltoall, excepted_reason),
    CollectiveKind.ALLREDUCE: (lined_allreduce, lined_reason),
    CollectiveKind.ALLGATHER: (lined_allgather, lined_reason),
    CollectiveKind.REDUCESCATTER: (lined_reducescatter, lined_reason),
}


@dataclass(frozen=True, eq=False)
class SymmetricPlan:
    """The schedule ``auto`` chose in symmetric form (verified by
    :func:`cclc.symmetric_check.verify_symmetric`), its lockstep time under ``model`` and the
    collective's bounds (``bound`` the best)."""

    schedule: SymmetricSchedule | ExceptedSchedule
    time: float
    bound: float | None
    bounds: Bounds
    model: ExecutionModel

    @property
    def name(self) -> str:
        s = self.schedule
        return s.algorithm if s.schedule in ("-", "") else f"{s.algorithm}+{s.schedule}"

    @property
    def pct_of_bound(self) -> float | None:
        if self.bound is None or self.time <= 0:
            return None
        return 100.0 * self.bound / self.time


def symmetric_reason(resolution: Resolution) -> str | None:
    """Why ``resolution``'s collective cannot be planned in symmetric form (``None`` when it
    can)."""
    coll = resolution.collective
    if resolution.explicit:
        return "an algorithm is named (the symmetric form is built under auto)"
    why = builders_reason(coll)
    if why is None or not coll.topology.n_failed_links:
        return why
    # a torus whose failed links alone break the translations: the healthy torus's schedule
    # with exceptions (cclc.algorithms.torus_reroute, cclc.algorithms.torus_cut_allreduce)
    excepted = EXCEPTED.get(coll.kind)
    kinds = [k.value for k in EXCEPTED]
    failed = (f"exceptions for failed links are built for {', '.join(kinds[:-1])} and "
              f"{kinds[-1]} only, not {coll.kind.value}"
              if excepted is None else excepted[1](coll))
    return None if failed is None else f"{why}; nor with exceptions for them: {failed}"


def form_estimate(coll: Collective) -> SizeEstimate:
    """What planning ``coll`` in symmetric form needs at the least, from the closed-form size
    of its builder's schedule (:func:`cclc.algorithms.torus_symmetric.form_size`; with failed
    links, that of the healthy base, the exceptions beside it not counted): its
    representative ops as the ops, their memory and the verifier's rank-0 chunk slots (with a
    contributor row of ``n`` booleans each where it reduces), and the time of its ops, its
    steps and its contributor rows. ``symmetric_reason`` must have accepted ``coll``."""
    size = form_size(coll)
    n = coll.n
    reduces = coll.kind in REDUCING_KINDS
    memory = size.ops * BYTES_PER_OP + size.slots * (FORM_SLOT_BYTES + (n if reduces else 0))
    seconds = (size.ops * FORM_SECONDS_PER_OP + size.steps * STEP_SECONDS
               + (size.ops * n * SET_SECONDS if reduces else 0.0))
    return SizeEstimate(coll.name, size.ops, float(memory), seconds, "symmetric form")


def form_refusal(coll: Collective, memory: int | None) -> str | None:
    """Why ``coll``'s form stored by symmetry is too large for the limits of
    :class:`cclc.budget.Limits` with ``memory`` bytes available (``None`` when it fits), in
    words: a ring of tens of thousands of ranks makes a form of 10^8 representative ops, a
    reduction over 10^5 ranks a verifier of contributor rows of terabytes."""
    return Limits(memory).refusal(form_estimate(coll), "its form would have at least")


def build_symmetric(coll: Collective) -> SymmetricSchedule | ExceptedSchedule:
    """``coll``'s schedule in symmetric form: :data:`BUILDERS`'s where translations are a
    symmetry of its machine, else the healthy torus's AllToAll with exceptions for the failed
    links. ``symmetric_reason`` must have accepted ``coll``."""
    if builders_reason(coll) is None:
        return BUILDERS[coll.kind](coll)
    return EXCEPTED[coll.kind][0](coll)


def symmetric_model(model: ExecutionModel) -> ExecutionModel:
    """The model a symmetric plan is timed under: ``model`` where it is a lockstep model (its
    per-step cost is charged), else the IR model (the form has no dataflow or event
    simulation; an output that runs under ``model`` needs the expanded schedule anyway)."""
    return model if model.mode == "lockstep" else IR_MODEL


def plan_symmetric(coll: Collective, model: ExecutionModel,
                   on_stage: Callable[[str], None] = lambda what: None,
                   known: Bounds | None = None) -> SymmetricPlan:
    """Build ``coll``'s schedule in symmetric form, verify it, time it under
    :func:`symmetric_model` of ``model`` and bound it (``known``: ``bounds(coll)`` where the
    caller has it already, as when the whole plan was made first); :class:`ScheduleError`
    when it fails verification. ``symmetric_reason`` must have accepted ``coll``."""
    model = symmetric_model(model)
    on_stage("building the schedule in symmetric form")
    schedule = build_symmetric(coll)
    on_stage(f"verifying {len(schedule.ops):,} representative ops{_exceptions(schedule)}")
    verify_form(schedule)
    on_stage("simulating")
    time = simulate_form(schedule, model).time
    found = known if known is not None else bounds(coll, on_stage=on_stage)
    return SymmetricPlan(schedule=schedule, time=time, bound=found.best, bounds=found,
                         model=model)


def verify_form(s: SymmetricSchedule | ExceptedSchedule) -> None:
    """Verify a schedule stored by symmetry with the verifier of its form (the symmetric
    schedule, the AllToAll's exceptions or the lines of the others), without expanding it."""
    if not isinstance(s, ExceptedSchedule):
        verify_symmetric(s)
    elif s.interleaved:
        verify_lined(s)
    else:
        verify_excepted(s)


def simulate_form(s: SymmetricSchedule | ExceptedSchedule, model: ExecutionModel
                  ) -> SymmetricLockstep | ExceptedLockstep:
    """The lockstep simulation of a schedule stored by symmetry under ``model``'s step cost
    (its time, every step's time, bytes and busiest link, and every link's bytes), by the
    simulator of its form, without expanding it."""
    cost, steps = model.step_overhead, model.overhead_steps
    if not isinstance(s, ExceptedSchedule):
        return simulate_lockstep(s, step_overhead=cost, overhead_steps=steps)
    simulator = simulate_lined if s.interleaved else simulate_excepted
    return simulator(s, step_overhead=cost, overhead_steps=steps)


def expand_form(s: SymmetricSchedule | ExceptedSchedule) -> Schedule:
    """The whole schedule of a schedule stored by symmetry, every rank's ops (for an output
    or a command that needs them; :meth:`expanded_ops` of ``s`` says how many first)."""
    return expand_excepted(s) if isinstance(s, ExceptedSchedule) else expand(s)


def describe_form(s: SymmetricSchedule | ExceptedSchedule) -> str:
    """How ``s`` is stored, for a command's report: its group and its exceptions."""
    shape = "x".join(map(str, s.group.shape))
    exceptions = ""
    if isinstance(s, ExceptedSchedule):
        if s.interleaved:
            exceptions = (f", less {len(set(s.masked_journey.tolist()))} ring phases on the "
                          f"{len(set(s.masked_element.tolist())):,} ranks of the rings a "
                          f"failed link cuts, run there as lines of {len(s.tail):,} ops in the "
                          "same steps")
        else:
            exceptions = (f", less {len(s.masked_element):,} journeys that cross a failed "
                          f"link, delivered after it by a tail of {len(s.tail):,} ops in "
                          f"{s.tail.n_steps} steps")
    return f"stored by symmetry: the translations of the {shape} torus{exceptions}"


def form_steps(s: SymmetricSchedule | ExceptedSchedule) -> int:
    """The steps of ``s``'s whole schedule: a tail runs after the base, lines beside it."""
    base = s.ops.n_steps
    if not isinstance(s, ExceptedSchedule):
        return base
    return max(base, s.tail.n_steps) if s.interleaved else base + s.tail.n_steps


def _exceptions(s: SymmetricSchedule | ExceptedSchedule) -> str:
    """A schedule's exceptions, for its progress line."""
    if not isinstance(s, ExceptedSchedule):
        return ""
    what = ("masked ring phases and their lines" if s.interleaved
            else "masked journeys and a tail")
    return f", {len(s.masked_element):,} {what} of {len(s.tail):,} ops"
