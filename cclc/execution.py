"""Execution models: how each runtime runs a schedule, and the time cclc predicts for it.

A backend declares the model of the runtime it emits for (its ``execution_model``, see
:mod:`backends.contract`); this module defines the models and prices a schedule under one.

A schedule's steps say what may run together; a runtime decides what actually waits for what.
Every predicted time names the model it comes from:

``ir``
    The schedule's own steps with a barrier between them and no software cost: what the IR
    means, used when no code-emitting backend is chosen (``--emit json``).
``nccl``
    The generated NCCL library (and its MPI build): dataflow over lanes (:mod:`cclc.dataflow`).
    Each connection (pair of ranks and route) is a lane with a communicator and a CUDA stream
    of its own; an op starts when its dependency edges are done (CUDA events) and its lane is
    free on both ranks; consecutive ops of a lane that are ready together form one
    ``ncclGroupStart`` ... ``ncclGroupEnd`` group. Each group pays one launch, NCCL's base
    latency of a collective on the Simple protocol, 8.4 us (NCCL 2.21 ``src/graph/tuning.cc``,
    ``baseLat`` of ring/Simple, the fixed cost NCCL's tuner charges one launch); local copies
    and snapshots are free, as in the simulator. Timed by :func:`cclc.dataflow.dataflow_time`.
    The lanes are as many as the connections' edge colouring needs, at most 32, and fewer when
    NCCL's connection buffers for them would not fit the lane memory budget
    (``--nccl-lane-memory``, :mod:`cclc.lane_cost`): fewer lanes make pairs share a lane and
    wait for each other. A model: it has not been measured on a GPU.
``nccl-onesided``
    The one-sided form of the NCCL library (``--emit nccl-onesided``): no lane
    communicators; each rank runs its table entries one after another on the caller's stream,
    and every message is a credit signal from the receiver (its slot is free) then a put with
    a signal from the sender (``ncclSignal``, ``ncclPutSignal``, ``ncclWaitSignal``). Timed as
    dataflow over one lane (a message starts when both of its ranks are done with everything
    before it), each message paying 2.345 us of signalling: one signal+wait round trip of
    MSCCL++'s memory channel (below), a borrowed figure for the same mechanism, since NCCL
    publishes none for its one-sided calls. No launch cost per message (NCCL runs the puts on
    the copy engines, not in a kernel). A model, not measured.
``nccl-lockstep``
    The library as it was before it ran dataflow: one group per step, each step paying one
    launch of 8.4 us, then a barrier. No backend emits it any more; it is kept to show what
    the dataflow library gains.
``msccl``
    MSCCL runtimes: dataflow (an op starts when its inputs are written and its link is free:
    the event-driven simulator), each op paying the per-hop software latency of the Simple
    protocol over NVLink, 3.4 us (NCCL 2.21 ``src/graph/tuning.cc``, ``hwLat[NVLINK]`` of
    ring/Simple), plus one launch of 8.4 us per call (as above). A model, not measured.
``mscclpp``
    MSCCL++ execution plans as ``--emit mscclpp`` lowers them: each rank runs its steps in
    order, and before writing into a peer at a step waits for that peer's credit (the peer
    finished its previous step), then signals the data: lockstep between peers, each step
    with an op between two ranks paying two one-way synchronizations, one measured
    signal+wait round trip of MSCCL++'s memory channel, 2.345 us on H100
    (``SemaphorePerfTest.SignalPingPong``, measured figure quoted in microsoft/mscclpp commit
    4f3638b60db4640eb5f0cd4c1c92e05a72227474, "Use PTX red for D2D semaphore signal (#768)").
    A step of local ops alone (a reduction of received partial sums, synthesis's local
    folds) is free of it: the lowering (:mod:`backends.mscclpp.lower`) emits credits, data
    signals and waits only for the peers a rank writes into or is written by at a step, so
    at a step where no rank writes into another no rank signals or waits (the credits for
    the next step's writers, sent at its end, are that next step's synchronization). The
    model is a global lockstep, so a step where any two ranks talk pays the round trip
    (``overhead_steps="peer"``). Port channels (the network, through MSCCL++'s proxy)
    are slower, 19.02 us per ping-pong on H200 (``PortChannelOneToOneTest.PingPongPerf``,
    measured figure quoted in commit 5e038eacd2c45fb635800251663e03e31026039d, "Proxy FIFO
    latency improvement (#864)"); the model charges the memory-channel figure on every step
    that synchronizes.
    No launch cost is charged (MSCCL++ publishes none for its executor). The LL plans written
    beside them for small calls inside one server skip the per-step signals but move twice the
    bytes; the model prices the Simple plans. The plans run one
    threadblock at a time per GPU, whose copies may not reach a link's bandwidth; the model
    assumes they do. A model built from published measurements, not measured with these plans.

On a fabric whose declared routing is ``ecmp`` the time is priced with the spines ECMP would
hash each flow onto (:func:`cclc.fabric_routing.ecmp_routes`; the lockstep and event models
simulate them on the plan's own (op, link) pairs, :func:`cclc.fabric_routing.ecmp_pair_links`,
the same pairs to the bit); the spines cclc plans are a
plan that no backend can impose yet, so their time is reported beside it as ``planned_time``
and labelled as needing a routing mechanism. Under ``adaptive`` routing the switches balance
the spines themselves, which the planned assignment (no spine link above its fair share)
models.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np

from cclc.dataflow import MAX_LANES, dataflow_time, lower_schedule
from cclc.errors import ScheduleError
from cclc.fabric_routing import ecmp_pair_links, ecmp_routes, has_spines
from cclc.ir import Schedule
from cclc.lane_cost import DEFAULT_LANE_MEMORY, choose_lanes, lane_floor_refusal
from cclc.sim import OverheadSteps, simulate

__all__ = ["IR_MODEL", "LOCKSTEP_NCCL_MODEL", "MODELS", "MSCCLPP_MODEL", "MSCCL_MODEL",
           "NCCL_GROUP_OVERHEAD", "NCCL_MODEL", "NCCL_ONESIDED_MODEL", "ExecutionModel",
           "Output", "Prediction", "model_for", "model_lanes", "model_reason", "predict",
           "unpriced_reason"]


@dataclass(frozen=True, slots=True)
class ExecutionModel:
    """How a runtime executes a schedule: simulator mode and software overheads (seconds)."""

    name: str
    mode: Literal["lockstep", "event", "dataflow"]
    step_overhead: float = 0.0
    #: which lockstep steps pay ``step_overhead``: ``"every"`` step (a runtime that launches
    #: each step), or only the ``"peer"`` steps, those with an op between two ranks (a runtime
    #: that synchronizes ranks only where one writes into another); see
    #: :func:`cclc.sim.step_charges`
    overhead_steps: OverheadSteps = "every"
    op_overhead: float = 0.0
    call_overhead: float = 0.0
    description: str = ""
    #: the dataflow library's lane memory budget per rank in bytes (:mod:`cclc.lane_cost`
    #: chooses the lanes under it); None: at most :data:`cclc.dataflow.MAX_LANES` lanes
    lane_memory: int | None = None
    #: a fixed lane limit of a dataflow runtime (None: :data:`cclc.dataflow.MAX_LANES`, or
    #: what ``lane_memory`` allows)
    max_lanes: int | None = None
    #: whether ready messages of a dataflow lane share one launch (False: each pays its own)
    groups: bool = True

    @property
    def charges_software(self) -> bool:
        """Whether the model charges any launch, per-step or per-op software cost."""
        return bool(self.step_overhead or self.op_overhead or self.call_overhead)

    @property
    def label(self) -> str:
        """How reports name the model next to a time."""
        return f"{self.name} model: {self.description}"


#: the NCCL tuner's fixed cost of one launch on the Simple protocol (NCCL 2.21 tuning.cc)
_NCCL_LAUNCH = 8.4e-6
#: NCCL's per-hop software latency of the Simple protocol over NVLink (NCCL 2.21 tuning.cc)
_SIMPLE_HOP = 3.4e-6

#: MSCCL++ memory-channel signal+wait round trip measured on H100 (microsoft/mscclpp commit
#: 4f3638b6, SemaphorePerfTest.SignalPingPong, "Red-based (new): 2.345 us/iter")
_MSCCLPP_ROUND_TRIP = 2.345e-6

#: what one message of the one-sided NCCL library costs in signalling: a credit from the
#: receiver and the data signal from the sender, two one-way signals, priced as one
#: signal+wait round trip of MSCCL++'s memory channel (the figure above): a borrowed
#: measurement of the same mechanism (a flag written into a peer GPU's memory and polled
#: there), not one of NCCL's one-sided calls, which publish none
_ONESIDED_MESSAGE = _MSCCLPP_ROUND_TRIP

#: what one group (one launch) of the dataflow NCCL library costs
NCCL_GROUP_OVERHEAD = _NCCL_LAUNCH

IR_MODEL = ExecutionModel("ir", "lockstep", description="lockstep steps, no software cost")
LOCKSTEP_NCCL_MODEL = ExecutionModel(
    "nccl-lockstep", "lockstep", step_overhead=_NCCL_LAUNCH,
    description="lockstep, one NCCL group per step, 8.4 us per step (no longer emitted)")
#: the generated NCCL library (``backends.nccl``): lanes under a memory budget
NCCL_MODEL = ExecutionModel("nccl", "dataflow", op_overhead=NCCL_GROUP_OVERHEAD,
                            description="dataflow lanes, 8.4 us per NCCL group",
                            lane_memory=DEFAULT_LANE_MEMORY)
#: the one-sided form of the NCCL library (``--emit nccl-onesided``)
NCCL_ONESIDED_MODEL = ExecutionModel(
    "nccl-onesided", "dataflow", op_overhead=_ONESIDED_MESSAGE, max_lanes=1, groups=False,
    description="one-sided puts on the caller's communicator, each rank's entries in "
    "order, 2.345 us of signalling per message (MSCCL++'s measured signal+wait round "
    "trip, H100, borrowed)")
#: the MSCCL runtimes (``backends.msccl``)
MSCCL_MODEL = ExecutionModel("msccl", "event", op_overhead=_SIMPLE_HOP,
                             call_overhead=_NCCL_LAUNCH,
                             description="dataflow, 3.4 us per op, 8.4 us per call")
#: MSCCL++'s executor running the plans of ``backends.mscclpp``
MSCCLPP_MODEL = ExecutionModel("mscclpp", "lockstep", step_overhead=_MSCCLPP_ROUND_TRIP,
                               overhead_steps="peer",
                               description="lockstep steps (credit and data signal per peer), "
                               "2.345 us per step with an op between two ranks (MSCCL++'s "
                               "measured signal+wait round trip, H100); steps of local ops "
                               "alone free")


#: every model by its own name (what reports print and benchmarks' ``--model`` takes); the
#: model an output is priced with hangs on its backend, never looked up here by output name
MODELS: dict[str, ExecutionModel] = {m.name: m for m in (IR_MODEL, LOCKSTEP_NCCL_MODEL,
                                                         NCCL_MODEL, NCCL_ONESIDED_MODEL,
                                                         MSCCL_MODEL,
                                                         MSCCLPP_MODEL)}


class Output(Protocol):
    """What this module reads of an output (a :class:`backends.contract.Backend`): its name
    and the execution model of its runtime (``None`` when it runs nothing)."""

    @property
    def name(self) -> str: ...

    @property
    def execution_model(self) -> ExecutionModel | None: ...


def model_for(outputs: Iterable[Output]) -> ExecutionModel:
    """The model ``auto`` chooses with: that of the first output in ``outputs`` (in the order
    given) that declares one, or :data:`IR_MODEL` when none does."""
    for output in outputs:
        if output.execution_model is not None:
            return output.execution_model
    return IR_MODEL


def model_reason(outputs: Iterable[Output]) -> str | None:
    """Why :func:`model_for` prices with the model it does, when an output in ``outputs``
    chose it; ``None`` when none did (the IR's own model, that of ``--emit json``).

    The outputs asked for decide which algorithm ``auto`` keeps: each runtime pays software
    costs of its own, so the same file can compile to another algorithm with another
    ``--emit``. This sentence says so where it happens.
    """
    outputs = list(outputs)
    model = model_for(outputs)
    if model is IR_MODEL:
        return None
    coded = [o.name for o in outputs if o.execution_model is not None]
    why = f"--emit includes {model.name}"
    if len(coded) > 1:
        why += f", the first of {' and '.join(coded)} that --emit lists"
    other = model_for([o for o in outputs if o.execution_model is not model])
    return (f"priced under the {model.name} execution model ({model.description}) because "
            f"{why}; without {model.name}: the {other.name} model ({other.description})")


@dataclass(frozen=True, slots=True)
class Prediction:
    """A predicted time (seconds) and the model it is for.

    ``planned_time`` is set on an ECMP fabric: the time if the planned spines were realized
    (they need a routing mechanism no backend has yet); ``time`` is under ECMP.
    """

    time: float
    model: ExecutionModel
    planned_time: float | None = None


def _run(schedule: Schedule, model: ExecutionModel, pair_links: np.ndarray | None = None
         ) -> float:
    """``schedule``'s time under ``model``; ``pair_links`` (lockstep and event modes): the
    links its (op, link) pairs take instead of the routes' (:func:`cclc.sim.simulate`)."""
    if model.mode == "dataflow":
        assert pair_links is None

        plan = lower_schedule(schedule, op_overhead=model.op_overhead,
                              max_lanes=model_lanes(schedule, model), grouping=model.groups)
        return dataflow_time(schedule, model.op_overhead, plan) + model.call_overhead
    r = simulate(schedule, mode=model.mode, step_overhead=model.step_overhead,
                 op_overhead=model.op_overhead, overhead_steps=model.overhead_steps,
                 pair_links=pair_links)
    return float(r.time) + model.call_overhead


def model_lanes(schedule: Schedule, model: ExecutionModel) -> int:
    """The most lanes ``model`` runs ``schedule`` with: what :func:`cclc.lane_cost.choose_lanes`
    allows under the model's budget, or :data:`cclc.dataflow.MAX_LANES` without a budget or
    when none fits (the NCCL backend then refuses the schedule and says what it needs)."""
    if model.max_lanes is not None:
        return model.max_lanes
    if model.lane_memory is None:
        return MAX_LANES
    try:
        return choose_lanes(schedule, model.lane_memory).max_lanes
    except ScheduleError:
        return MAX_LANES


def unpriced_reason(schedule: Schedule, model: ExecutionModel) -> str | None:
    """Why ``model`` gives ``schedule`` no time, or None: the model prices what its runtime
    runs, and the NCCL library cannot hold the connections of a schedule whose pairs of
    ranks alone need more buffers than the model's lane budget
    (:func:`cclc.lane_cost.lane_floor_refusal`). A count of pairs, asked before the
    lowering into lanes: that lowering is the model's cost (over half an hour for the
    4,096-GPU fat tree's direct AllToAll), and its time would be of nothing that runs."""
    if model.mode != "dataflow" or model.lane_memory is None or model.max_lanes is not None:
        return None
    why = lane_floor_refusal(schedule, model.lane_memory)
    return None if why is None else f"the NCCL library cannot run it: {why}"


def predict(schedule: Schedule, model: ExecutionModel = IR_MODEL) -> Prediction:
    """The time of ``schedule`` under ``model`` and its topology's declared routing."""
    topo = schedule.topology
    if not (has_spines(topo) and topo.routing == "ecmp"):
        return Prediction(_run(schedule, model), model)
    if model.mode != "dataflow":
        # the simulator charges ECMP's spines on the plan's (op, link) pairs: no route table
        # rewritten for them (at 4,096 ranks a pass over 84M links); the same time to the bit
        # as simulating ecmp_routes' schedule (tests/fabric/test_ecmp_pricing.py)
        # (the plan's run first: ECMP's links, a copy of every pair's, are not held through
        # it; at 4,096 GPUs 0.5 GB off the compile's peak)
        planned = _run(schedule, model)
        links = ecmp_pair_links(schedule)
        if links is None or np.array_equal(links, schedule.op_links()[1]):
            # ECMP put every flow where the plan did (rail-local schedules never cross a
            # spine): one run prices both
            return Prediction(planned, model)
        # ECMP's run reads its own links for the pairs: the routes' go before it (at 4,096
        # GPUs 0.5 GB beside ECMP's, at the compile's peak), made again if anything asks
        schedule.release_op_links()
        ecmp = _run(schedule, model, links)
    else:
        # the dataflow runner lowers a schedule: the table with only the paths the ops take
        hashed = ecmp_routes(schedule, used_only=True)
        if _same_links(hashed, schedule):
            return Prediction(_run(hashed, model), model)
        planned, ecmp = _run(schedule, model), _run(hashed, model)
    # the plan is only news when it differs
    same = abs(planned - ecmp) <= 1e-9 * max(ecmp, 1e-30)
    return Prediction(ecmp, model, None if same else planned)


def _same_links(a: Schedule, b: Schedule) -> bool:
    """Whether ``a`` is ``b`` with the same route table and route of every op (then every
    model gives both the same time)."""
    if a is b:
        return True
    return (a.ops is b.ops or all(np.array_equal(x, y) for x, y in
                                  zip(a.ops.columns().values(), b.ops.columns().values(),
                                      strict=True))) \
        and np.array_equal(a.routes.offsets, b.routes.offsets) \
        and np.array_equal(a.routes.links, b.routes.links) and a.layouts is b.layouts
