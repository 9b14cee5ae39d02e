"""The execution model a synthesized schedule will be priced with, and its cost per step.

``plan`` prices every candidate under the emitting backend's model (:mod:`cclc.execution`),
and an algorithm's ``build`` only sees the collective. The planner therefore names the model
around each build (:func:`priced_with`), and synthesis packs for it (:func:`pricing_model`):

* ``ir``: lockstep steps, nothing but the links and their latency.
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

import contextlib
import contextvars

from cclc.execution import IR_MODEL, ExecutionModel

__all__ = ["priced_with", "pricing_model", "step_cost"]

_MODEL: contextvars.ContextVar[ExecutionModel] = contextvars.ContextVar("synth_model",
                                                                        default=IR_MODEL)


@contextlib.contextmanager
def priced_with(model: ExecutionModel):
    """Within the block, synthesis packs for ``model`` (the planner's model)."""
    token = _MODEL.set(model)
    try:
        yield
    finally:
        _MODEL.reset(token)


def pricing_model() -> ExecutionModel:
    """The model set by the innermost :func:`priced_with`, else the IR's lockstep model."""
    return _MODEL.get()


def step_cost(model: ExecutionModel) -> float:
    """Seconds of software cost a step adds to the critical path under ``model``: its
    per-step launch, or one op's (or one group's) overhead (see the module docstring)."""
    return model.step_overhead + model.op_overhead
