"""``synth`` for AllToAll (uniform and per-pair sizes): a schedule synthesized from the machine.

The path LP (:mod:`cclc.synth.flows`) routes every pair's bytes at the best rate the usable
links allow; its weighted paths are cut into pieces and packed into steps
(:mod:`cclc.synth.pack`, :mod:`cclc.synth.alltoall`) for the execution model the planner prices
with (:class:`~cclc.algorithms.BuildContext`). This module returns that schedule and nothing
else: when ``synth`` is named explicitly the planner races it against every template
(:mod:`cclc.template_race`) and returns a faster template instead, labelled ``status
fallback``, or ``budget`` when the budget ran out before a schedule was whole, so that synth
is never slower than the best template; under ``algorithm auto`` the planner races the
candidates itself.

Parameters (``algorithm synth(budget = 60, split = 2)``): ``budget`` seconds for the whole
synthesis (default :data:`DEFAULT_BUDGET`, or ``cclc compile --synth-budget``); ``split`` pieces
per path (finer balance, more ops; default by the number of paths); ``steps`` a fixed step count.

The schedule's ``params``: ``solver`` (``pdlp``), ``status`` (``optimal``: the LP solved and its
paths are used; ``budget``: the solver stopped at the budget; ``fallback``: a template was
faster), ``solve_s`` (seconds), ``lp_fraction`` (the LP's time / the schedule's lockstep time),
``template`` when a template is returned, ``symmetry`` (the order of the group the LP was
solved over), ``rounds`` (pricing rounds), ``lp_s``/``lp_cpu_s`` (the LP's wall clock and CPU
seconds).
"""

from __future__ import annotations

import time

from cclc.algorithms import (
    Algorithm,
    BuildContext,
    NoBound,
    Synthesis,
    every_rank_ops,
    register,
)
from cclc.algorithms.common import bad_int_param
from cclc.collective import Collective, CollectiveKind
from cclc.ir import Schedule
from cclc.sim import simulate

__all__ = ["AUTO_MAX_RANKS", "AUTO_STAGGER", "AUTO_SYMMETRIC_RANKS", "DEFAULT_BUDGET",
           "budget_seconds", "build_synth_alltoall", "synthesize_flows"]

#: seconds the synthesis may take unless told otherwise
DEFAULT_BUDGET = 60.0
#: without an explicit budget, synth stays out of groups larger than this: the whole synthesis
#: (path LP, basic optimum, packing, writing the ops) takes 10-25 s of CPU time at 125 ranks
#: (benchmarks/synth_scale.py --quick) and 30-100 s at 512 (8x8x8, healthy and one failed
#: link), where ``auto`` must stay within seconds; ``budget=`` or ``--synth-budget`` lifts it
AUTO_MAX_RANKS = 125
#: ``auto`` considers synth in groups larger than this only where the faults (or a mesh, or a
#: fabric) break the torus translations: where every translation survives, the torus
#: templates reach the bandwidth bound (5x5x5: halfring+dimrotation at 100.0% of the LP, synth
#: falls back to it after 15 s), so synth would cost seconds and cannot win
AUTO_SYMMETRIC_RANKS = 32
#: under ``auto``, in groups larger than :data:`AUTO_SYMMETRIC_RANKS`, no staggering LP
#: (:mod:`cclc.synth.stagger`) is tried, only the greedy packing: on tpuv4_4x4x4_ocs the LP
#: reaches 97.8% of the LP bound instead of 94.5% but needs 22 s of CPU time, and a wall-clock
#: time limit would make ``auto``'s choice depend on the machine's load
AUTO_STAGGER = False


def budget_seconds(params: dict, default: float | None = None) -> float | None:
    """The time budget of ``synth`` (seconds): the hint's ``budget`` parameter, else
    ``default`` (the planner's :attr:`~cclc.algorithms.BuildContext.synth_budget`), else
    ``None``."""
    if "budget" in params:
        return float(params["budget"])
    return default


def _applicable(coll: Collective, context: BuildContext, **params) -> str | None:
    # cclc.synth.flow_solution, cclc.synth.symmetry only when this runs, not for cclc --help
    from cclc.synth.flow_solution import group_connected, usable_links
    from cclc.synth.symmetry import translations

    if coll.kind is not CollectiveKind.ALLTOALL:
        return f"synth (flows) does not serve {coll.kind.value}"
    unknown = sorted(set(params) - {"budget", "split", "steps"})
    if unknown:
        return f"synth takes budget, split and steps (got {', '.join(unknown)})"
    if "budget" in params:
        b = params["budget"]
        if isinstance(b, bool) or not isinstance(b, (int, float)) or not b > 0:
            return f"budget must be a number of seconds > 0 (got {b!r})"
    for key in ("split", "steps"):
        why = bad_int_param(params, key)
        if why:
            return why
    if coll.n < 2:
        return "a single rank has nothing to move"

    if not group_connected(coll):
        return ("the group's ranks cannot reach each other through members of the group "
                "(synth relays only through the group's ranks and switches)")
    if budget_seconds(params, context.synth_budget) is not None:
        return None
    if coll.n > AUTO_MAX_RANKS:
        return (f"{coll.n} ranks > {AUTO_MAX_RANKS}: synthesis takes minutes of CPU time "
                "here; give it a budget (synth(budget = 300) or --synth-budget) to run it")
    if coll.algorithm.name == "auto" and coll.n > AUTO_SYMMETRIC_RANKS:
        if translations(coll, usable_links(coll)).order == coll.n:
            return (f"{coll.n} ranks on a torus whose translations all survive: the torus "
                    "templates reach the bandwidth bound there; synth(budget = 60) or "
                    "--synth-budget runs it")
    return None


def synthesize_flows(coll: Collective, context: BuildContext, **params) -> Synthesis:
    """The synthesized alltoall of ``coll``, packed for ``context.model``; without a schedule
    when the budget ran out before the path LP had one."""
    # cclc.synth.alltoall, cclc.synth.flows only when this runs, not for cclc --help
    from cclc.synth.alltoall import LP_TIME_LIMIT, synthesize_alltoall, write_schedule
    from cclc.synth.flows import SynthBudgetError, solve_flows

    t0 = time.monotonic()
    budget = budget_seconds(params, context.synth_budget)
    deadline = t0 + (DEFAULT_BUDGET if budget is None else budget)
    split = int(params["split"]) if "split" in params else None  # None: by the pieces
    steps = params.get("steps")
    lp_time = None
    try:
        flows = solve_flows(coll, deadline=deadline)
        lp_time = flows.lp_time
        auto = coll.algorithm.name == "auto" and coll.n > AUTO_SYMMETRIC_RANKS
        synth = synthesize_alltoall(coll, flows, split=split,
                                    steps=None if steps is None else int(steps),
                                    deadline=deadline, model=context.model,
                                    lp_time_limit=None if auto and not AUTO_STAGGER
                                    else LP_TIME_LIMIT)
        synthesized = write_schedule(coll, synth, ())
    except SynthBudgetError:
        return Synthesis(None, (("solver", "pdlp"),), lp_time, t0)
    status = flows.status if flows.status in ("optimal", "routed") else "budget"
    solver = "routed" if flows.status == "routed" else "pdlp"
    meta = (("solver", solver), ("symmetry", flows.symmetry), ("rounds", flows.rounds),
            ("lp_s", round(flows.solve_s, 3)), ("lp_cpu_s", round(flows.cpu_s, 3)))
    solve_s = time.monotonic() - t0
    ir_time = float(simulate(synthesized).time)          # lp_fraction is on the IR's model
    fraction = lp_time / ir_time if lp_time is not None and ir_time > 0 else 0.0
    info = meta + (("status", status), ("solve_s", round(solve_s, 3)),
                   ("lp_fraction", round(fraction, 4)))
    own = synthesized.replace(algorithm="synth", schedule="-", params=info)
    return Synthesis(own, meta, lp_time, t0)


def build_synth_alltoall(coll: Collective, context: BuildContext, **params) -> Schedule:
    """The synthesized alltoall of ``coll`` (:func:`synthesize_flows`);
    :class:`~cclc.algorithms.BudgetExhausted` when the budget ran out before it had one."""
    return synthesize_flows(coll, context, **params).own(coll)


register(Algorithm(
    name="synth", collectives=frozenset({CollectiveKind.ALLTOALL}), applicable=_applicable,
    build=build_synth_alltoall, synthesize=synthesize_flows, contextual=True,
    ops=every_rank_ops,
    load=NoBound("synthesis chooses its routes while it builds: there is no traffic to bound "
                 "before"),
    description="alltoall: max-concurrent-flow LP paths packed into steps (named explicitly, "
                "the best template when that is faster)"))
