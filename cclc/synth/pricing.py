"""The cost per step a synthesized schedule pays under the execution model it is priced with.

``plan`` prices every candidate under the emitting backend's model (:mod:`cclc.execution`) and
hands that model to every build that asks for it (:class:`cclc.algorithms.BuildContext`), so
synthesis packs for it:

* ``ir``: lockstep steps, nothing but the links and their latency.
* ``mscclpp``: lockstep steps, each with an op between two ranks paying one signal+wait round
  trip. Every step the packing opens moves data between ranks, so it pays it; the steps of
  local folds that :mod:`cclc.synth.tree_schedule` adds between them pay nothing, as the
  model charges them (:attr:`cclc.execution.ExecutionModel.overhead_steps`).
* ``msccl``: dataflow, every op starts 3.4 us after its inputs are ready. Ops of one step start
  together, so a piece pays it once per hop: on the critical path it is a cost per step.
* ``nccl``: dataflow over lanes, 8.4 us per group, the ops of a lane that are ready together
  forming one group. Under ``routing none`` a lane is a link's pair of ranks, so a link pays
  one group per step it carries data in: again a cost per step.

:func:`step_cost` is that per-step charge, which the packing adds to every step it opens
(:func:`cclc.synth.pack.packing_time`); the synthesized candidates are then compared by the
model's own prediction (:func:`cclc.execution.predict`).
"""

from __future__ import annotations

from cclc.execution import ExecutionModel

__all__ = ["step_cost"]


def step_cost(model: ExecutionModel) -> float:
    """Seconds of software cost a step adds to the critical path under ``model``: its
    per-step launch, or one op's (or one group's) overhead (see the module docstring)."""
    return model.step_overhead + model.op_overhead
