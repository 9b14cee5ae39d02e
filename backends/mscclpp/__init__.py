"""MSCCL++ execution plans: ``<name>.mscclpp.json`` for out-of-place calls and
``<name>.inplace.mscclpp.json`` for in-place ones, per collective; for a schedule inside one
server also ``<name>.ll.mscclpp.json`` and ``<name>.ll.inplace.mscclpp.json``, LL-packet plans
for calls up to :data:`LL_MAX_BYTES`, the Simple ones then serving the larger calls.

MSCCL++ (microsoft/mscclpp) runs custom schedules as JSON execution plans: its executor
(``src/core/executor/``) loads them per rank, and its NCCL-API library (``libmscclpp_nccl.so``)
routes ``ncclAllReduce``, ``ncclAllGather`` and ``ncclReduceScatter`` calls to registered plans.
:func:`backends.mscclpp.lower.lower` turns the schedule's two-sided moves into one-sided puts
with the signals and waits that order them; :func:`backends.mscclpp.plan.plan_document` writes
the loader's JSON; :data:`backends.mscclpp.limits.LIMITS` holds what the executor accepts.
MSCCL++ matches a call to a plan by its buffer mode (``src/ext/nccl/algorithm_selector.cc``
``matchExecutionPlan``): ``torch.distributed.all_reduce`` is in-place,
``all_gather_into_tensor`` and ``reduce_scatter_tensor`` usually out-of-place, hence both. A
plan is size-generic: it serves every call whose size is a multiple of ``buffer_alignment``
(16 B) times its chunk count, within ``[min_message_size, max_message_size]``.
"""

from __future__ import annotations

import gc
import json
import pathlib
from collections.abc import Iterator
from contextlib import contextmanager

from backends.common import RecentLowerings, c_identifier
from backends.contract import Backend, Contents, EmitOptions, Facts
from backends.msccl.lower import LimitError
from backends.mscclpp.limits import COMMIT, LIMITS, REPOSITORY
from backends.mscclpp.lower import LoweredPlan, chunk_refusal, lower, lowering_refusal, size_refusal
from backends.mscclpp.nics import nic_refusal
from backends.mscclpp.plan import plan_document
from cclc.collective import REDUCING_KINDS, Collective, CollectiveKind, ReduceOp
from cclc.errors import NotExpressible, ScheduleError
from cclc.execution import MSCCLPP_MODEL, ExecutionModel
from cclc.ir import Schedule

__all__ = ["BACKEND", "COLLECTIVES", "LL_MAX_BYTES", "MscclppBackend", "iter_plans",
           "render_plan", "render_plans", "served_sizes"]

#: the collectives an MSCCL++ plan names (python/mscclpp/language/collectives.py: AllGather,
#: AllReduce, ReduceScatter, AllToAll); it has no broadcast or reduce plan
COLLECTIVES = {k: k.value for k in (CollectiveKind.ALLREDUCE, CollectiveKind.ALLGATHER,
                                    CollectiveKind.REDUCESCATTER, CollectiveKind.ALLTOALL)}

#: the largest call the LL plans serve when both protocols are written: MSCCL++'s own selector
#: runs its packet AllReduce on one server up to 1 MiB (src/ext/nccl/algorithm_selector.cc,
#: ``selectSingleNodeAllreduce``: "<= 64KB or <= 1MB" without NVLS zero-copy)
LL_MAX_BYTES = 1 << 20

#: the out-of-place Simple plan's lowering is asked for its served sizes and then rendered
_LOWERINGS: RecentLowerings[LoweredPlan] = RecentLowerings()


@contextmanager
def _without_cycle_collection() -> Iterator[None]:
    """Lowering and writing a plan allocate millions of small objects that form no cycles;
    CPython's cyclic collector would walk every live one again at each full pass (half the
    time of a 32k-op schedule's lowering, more on larger ones), so it pauses meanwhile."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _lowered(schedule: Schedule, inplace: bool = False, protocol: str = "Simple"
             ) -> LoweredPlan:
    def lowered() -> LoweredPlan:
        with _without_cycle_collection():
            return lower(schedule, inplace=inplace, protocol=protocol)
    return _LOWERINGS.get(schedule, (inplace, protocol), lowered)


def served_sizes(schedule: Schedule, low: LoweredPlan) -> tuple[int, int, int]:
    """``(granularity, min_bytes, max_bytes)``: the message sizes the plan serves (bytes of the
    input buffer, of the output for allgather, as the loader's ``checkMessageSize`` measures
    them). The smallest is one unit of ``granularity``: MSCCL++'s NCCL interface matches a call
    to a plan by its window alone (``matchExecutionPlan``), so a window from 0 would take calls
    the loader then refuses, such as the 4-byte allreduce of ``torch.distributed.barrier``;
    below it they go to the fallback NCCL. The largest keeps every byte offset in the
    ``uint32_t`` of ``Operation``."""
    align = LIMITS["buffer_alignment"].value
    size_chunks = (low.output_chunks if schedule.collective.kind is CollectiveKind.ALLGATHER
                   else low.input_chunks)
    longest = max(low.input_chunks, low.output_chunks, *low.scratch_chunks)
    if low.protocol == "LL":
        longest *= 2  # packets sit at twice their data's offset (handlePutPackets)
    largest_chunk = LIMITS["byte_offset"].value // longest // align * align
    return align * size_chunks, align * size_chunks, largest_chunk * size_chunks


def _why_not(schedule: Schedule) -> str | None:
    """What makes MSCCL++ unable to run this collective at all, or None."""
    coll = schedule.collective
    if coll.kind not in COLLECTIVES:
        return (f"MSCCL++ execution plans have no {coll.kind.value} collective (they name "
                "allreduce, allgather, reducescatter and alltoall)")
    if coll.kind in REDUCING_KINDS and coll.op is not ReduceOp.SUM:
        # execution_kernel.hpp instantiates handleReduceSend / handleReadReduceSend with their
        # default OpType = SUM; the plan's "reduce_op" is not read
        return (f"MSCCL++'s executor sums every reduction (the plan's reduce_op is not read "
                f"at {REPOSITORY} {COMMIT[:7]}); this collective reduces with "
                f"'{coll.op.value}'")
    return None


def _checked(schedule: Schedule) -> None:
    why = _why_not(schedule)
    if why is not None:
        raise NotExpressible(why)
    why = size_refusal(schedule) or nic_refusal(schedule)
    if why is not None:
        raise ScheduleError(why)


def render_plan(schedule: Schedule, options: EmitOptions | None = None,
                inplace: bool = False, protocol: str | None = None,
                window: tuple[int, int] | None = None) -> dict:
    """The execution plan of ``schedule`` (for in-place calls with ``inplace``; in
    ``protocol``, else ``options.protocol``; serving the sizes of ``window``, else every size it
    can) as a JSON-ready dict; :class:`ScheduleError` names what MSCCL++ cannot run."""
    options = options or EmitOptions()
    protocol = protocol or options.protocol
    _checked(schedule)
    low = _lowered(schedule, inplace=inplace, protocol=protocol)
    _, min_bytes, max_bytes = served_sizes(schedule, low)
    if window is not None:
        min_bytes, max_bytes = window
    threads = options.nthreads or LIMITS["threads_per_block"].value
    if threads > LIMITS["threads_per_block"].value:
        raise LimitError(f"num_threads_per_block {threads} is above "
                         f"{LIMITS['threads_per_block'].value} "
                         f"({LIMITS['threads_per_block'].cite()})")
    name = (c_identifier(schedule.collective.name) + ("_ll" if protocol == "LL" else "")
            + ("_inplace" if inplace else ""))
    with _without_cycle_collection():
        return plan_document(low, name=name,
                             collective=COLLECTIVES[schedule.collective.kind],
                             min_bytes=options.min_bytes or min_bytes,
                             max_bytes=options.max_bytes or max_bytes, threads=threads)


def render_plans(schedule: Schedule, options: EmitOptions | None = None) -> dict[str, dict]:
    """File name -> plan: out-of-place and in-place plans; with the default protocol and no
    size window asked for, LL plans for calls up to :data:`LL_MAX_BYTES` beside Simple plans
    for larger ones, when the schedule stays inside one server (LL plans use memory channels
    only)."""
    return dict(iter_plans(schedule, options))


def iter_plans(schedule: Schedule, options: EmitOptions | None = None
               ) -> Iterator[tuple[str, dict]]:
    """The plans of :func:`render_plans` one at a time, so that a caller writing them holds one
    (a large schedule's plan is a JSON tree of a million ops)."""
    options = options or EmitOptions()
    base = c_identifier(schedule.collective.name)
    _checked(schedule)
    low = _lowered(schedule)
    one_server = all(kind == "memory" for kind in low.channels.values())
    ll_max = 0
    if (options.protocol == "Simple" and options.min_bytes is None
            and options.max_bytes is None and one_server):
        granularity, _, largest = served_sizes(schedule, low)
        ll_max = min(LL_MAX_BYTES // granularity * granularity, largest)
    for inplace, suffix in ((False, ""), (True, ".inplace")):
        plan = render_plan(schedule, options, inplace=inplace)
        if ll_max:
            plan["min_message_size"] = ll_max + granularity
        yield f"{base}{suffix}.mscclpp.json", plan
    if ll_max:
        for inplace, suffix in ((False, ""), (True, ".inplace")):
            yield f"{base}.ll{suffix}.mscclpp.json", render_plan(
                schedule, options, inplace=inplace, protocol="LL", window=(granularity, ll_max))


class MscclppBackend:
    """The MSCCL++ execution plans of each collective (see the module docstring)."""

    name = "mscclpp"
    wants_simulation = False
    renders_symmetric = False
    #: port channels go through the GPU's own NIC (see backends.mscclpp.nics)
    own_nics = True
    execution_model: ExecutionModel | None = MSCCLPP_MODEL
    #: the lowering and both plans: 134 us per op (CPU seconds rendering hgx16_leafspine's
    #: `shards`, `hierarchical`'s 262,272 ops, on the two-core machine beside other work)
    seconds_per_op = 134e-6

    def files(self, key: Collective, options: EmitOptions) -> tuple[str, ...]:
        base = c_identifier(key.name)
        return (f"{base}.mscclpp.json", f"{base}.inplace.mscclpp.json",
                f"{base}.ll.mscclpp.json", f"{base}.ll.inplace.mscclpp.json")

    def render(self, subject: Schedule, options: EmitOptions, facts: Facts
               ) -> dict[str, Contents]:
        return {name: json.dumps(plan, separators=(",", ":")) + "\n"
                for name, plan in iter_plans(subject, options)}

    def build(self, folder: pathlib.Path, key: Collective, options: EmitOptions) -> list[str]:
        return []

    def refusal(self, subject: Schedule, options: EmitOptions) -> str | None:
        """Why :meth:`render` would refuse ``subject``: a collective MSCCL++ has no plan for,
        more ops than cclc lowers (:func:`~backends.mscclpp.lower.size_refusal`, asked
        first: the other checks walk every op), routes between servers that MSCCL++ would not take
        (:func:`~backends.mscclpp.nics.nic_refusal`), or what the lowering refuses, whatever
        the op count, found by the lowering's own checks without building the programs
        (:func:`~backends.mscclpp.lower.lowering_refusal`: a candidate costs its unit
        conversion, not a lowering, and only the winner is lowered)."""
        return (_why_not(subject) or size_refusal(subject) or nic_refusal(subject)
                or chunk_refusal(subject) or lowering_refusal(subject))


BACKEND: Backend[Collective, Schedule] = MscclppBackend()
