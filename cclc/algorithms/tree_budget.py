"""The time and op budget of tree synthesis (:mod:`cclc.algorithms.synth_trees`).

How many ops the built pipeline may have (:data:`MAX_OPS`; under ``algorithm auto`` what
:data:`AUTO_SHARE` of the budget builds, predicts and writes, at least :data:`MAX_OPS_AUTO`:
:func:`auto_op_limit`; fewer when the budget would not build them: :func:`op_limit`,
:func:`ops_left`), what one op costs to build, verify and predict under the execution model the
planner prices with (:func:`seconds_per_op`), and how much a machine shared with other work
stretches that (:func:`machine_slowdown`).
"""

from __future__ import annotations

import time

from cclc.collective import Collective
from cclc.execution import IR_MODEL, ExecutionModel

__all__ = ["AUTO_SHARE", "DEFAULT_BUDGET", "MAX_OPS", "MAX_OPS_AUTO", "MAX_RESERVE",
           "MAX_SLOWDOWN", "auto_op_limit", "deadline_share", "machine_slowdown", "op_cap",
           "op_limit", "ops_left", "seconds_per_op"]

#: the most ops a default pipeline depth may produce (bounds compile, verify and emit time)
MAX_OPS = 6_000_000
#: the fewest ops ``algorithm auto``'s candidate may have (:func:`auto_op_limit`): what it was
#: held to before its limit grew with the budget, so that no output's compile gets slower
MAX_OPS_AUTO = 200_000
#: the share of the budget that ``algorithm auto``'s synthesis candidate may spend on its ops
#: after the packing (building, verifying, predicting them and writing the requested outputs,
#: :func:`auto_op_limit`). The planner builds every candidate, so the synthesis gets a small
#: share: at the default 30 s, 1.5 s, 750k ops for the schedule document alone (the 128-GPU
#: fabric's 1 GiB AllReduce: 16 chunks per tree, 98.0% of its bound, where 200k ops gave 4
#: chunks and 84.7%); with a code output, whose lowering costs 33-134 us per op, it stays at
#: :data:`MAX_OPS_AUTO`
AUTO_SHARE = 0.05
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


def auto_op_limit(budget: float, model: ExecutionModel = IR_MODEL,
                  emit_seconds_per_op: float = 0.0) -> int:
    """The most ops ``algorithm auto``'s synthesis candidate may have: what building,
    verifying and predicting them under ``model`` (:func:`seconds_per_op`) and writing the
    requested outputs (``emit_seconds_per_op``, what their renders cost per op:
    :attr:`backends.contract.Backend.seconds_per_op`) take in :data:`AUTO_SHARE` of
    ``budget``; between :data:`MAX_OPS_AUTO` and :data:`MAX_OPS`."""
    per_op = seconds_per_op(model) + emit_seconds_per_op
    return min(MAX_OPS, max(MAX_OPS_AUTO, int(budget * AUTO_SHARE / per_op)))


def op_cap(coll: Collective, max_ops: int) -> int:
    """The op limit a packing's pipeline is predicted with: the build's ``max_ops`` under
    `auto` (:func:`auto_op_limit`, so the packing that wins is the one the build pipelines
    best within it), :data:`MAX_OPS` for a synthesis named explicitly."""
    return max_ops if coll.algorithm.name == "auto" else MAX_OPS
