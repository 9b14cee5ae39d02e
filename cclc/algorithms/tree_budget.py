"""The time and op budget of tree synthesis (:mod:`cclc.algorithms.synth_trees`).

How many ops the built pipeline may have (:data:`MAX_OPS`, :data:`MAX_OPS_AUTO` under
``algorithm auto``, fewer when the budget would not build them: :func:`op_limit`,
:func:`ops_left`), what one op costs to build, verify and predict under the execution model the
planner prices with (:func:`seconds_per_op`), and how much a machine shared with other work
stretches that (:func:`machine_slowdown`).
"""

from __future__ import annotations

import time

from cclc.collective import Collective
from cclc.execution import IR_MODEL, ExecutionModel

__all__ = ["DEFAULT_BUDGET", "MAX_OPS", "MAX_OPS_AUTO", "MAX_RESERVE", "MAX_SLOWDOWN",
           "deadline_share", "machine_slowdown", "op_cap", "op_limit", "ops_left",
           "seconds_per_op"]

#: the most ops a default pipeline depth may produce (bounds compile, verify and emit time)
MAX_OPS = 6_000_000
#: the same under ``algorithm auto``
MAX_OPS_AUTO = 200_000
#: default time budget of the search, seconds
DEFAULT_BUDGET = 30.0

#: the most of the budget kept for building the ops (the packers need the rest)
MAX_RESERVE = 0.5

#: seconds per op of what follows the packing as a user gets it: choosing the pipeline depth,
#: building the ops, the lockstep simulation that reports ``lp_fraction``, and the compile's
#: verification, prediction and JSON output (11.6 s after the packing for the 6.0M ops of
#: the faulty 5x5x5 torus's AllReduce, `cclc compile` under cProfile: 1.9 us per op); on a
#: machine shared with other work, stretched by :func:`machine_slowdown`
_SECONDS_PER_OP = 2e-6


#: what predicting the schedule under the emitting backend's model adds per op (the planner
#: predicts every candidate under it): the nccl backend's dataflow over lanes 4.7 us, the
#: msccl backend's event simulation 0.9 us (CPU seconds on the faulty 5x5x5 torus's
#: AllReduce of 0.77M ops; the IR's lockstep model is part of _SECONDS_PER_OP)
_PREDICT_SECONDS_PER_OP = {"dataflow": 4.7e-6, "event": 0.9e-6}

def seconds_per_op(model: ExecutionModel = IR_MODEL) -> float:
    """Seconds per op of what follows the packing when the planner prices with ``model``."""
    return _SECONDS_PER_OP + _PREDICT_SECONDS_PER_OP.get(model.mode, 0.0)


def op_limit(budget: float, max_ops: int, model: ExecutionModel = IR_MODEL) -> int:
    """The most ops a default pipeline depth may give: ``max_ops``, fewer when building and
    predicting them would take more than :data:`MAX_RESERVE` of the budget (under the
    model the planner prices with: the nccl backend's dataflow prediction costs more than
    twice the rest)."""
    return max(1, min(max_ops, int(budget * MAX_RESERVE / seconds_per_op(model))))


def deadline_share(deadline: float, share: float) -> float:
    """The instant ``share`` of the time left until ``deadline`` from now."""
    now = time.monotonic()
    return now + max(0.0, deadline - now) * share


def ops_left(end: float, max_ops: int, slowdown: float = 1.0,
             model: ExecutionModel = IR_MODEL) -> int:
    """The op limit that builds by ``end`` (a ``time.monotonic()`` instant) at
    :func:`seconds_per_op` times ``slowdown``: ``max_ops`` when time allows, never under
    :data:`MAX_OPS_AUTO` (a schedule as small as `auto`'s is built even when the packing
    overran)."""
    left = end - time.monotonic()
    return min(max_ops, max(MAX_OPS_AUTO, int(left / (seconds_per_op(model) * slowdown))))


def machine_slowdown(t0: float, cpu0: float) -> float:
    """Wall-clock seconds per CPU second of this process since ``(t0, cpu0)`` (from
    ``time.monotonic()`` and ``time.process_time()``), between 1 and :data:`MAX_SLOWDOWN`:
    how much a machine shared with other work stretches the per-op times, which were measured
    on a machine this process had to itself. 1 when too little has run to tell."""
    cpu = time.process_time() - cpu0
    if cpu < 0.2:
        return 1.0
    return min(MAX_SLOWDOWN, max(1.0, (time.monotonic() - t0) / cpu))


#: the most a shared machine is taken to stretch the build (beyond it, the op limit would
#: leave too few chunks to pipeline)
MAX_SLOWDOWN = 4.0


def op_cap(coll: Collective) -> int:
    """The most ops the built schedule may have (:data:`MAX_OPS_AUTO` under `auto`)."""
    return MAX_OPS_AUTO if coll.algorithm.name == "auto" else MAX_OPS
