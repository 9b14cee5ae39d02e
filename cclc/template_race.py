"""The planner's race of a synthesis named explicitly against the templates.

A synthesizing entry (:attr:`cclc.algorithms.Algorithm.synthesize`) only synthesizes; it
never looks at the other entries. When the user names it (``algorithm synth``), the planner
(:func:`cclc.plan.plan`) calls :func:`race_synthesis`: every other entry serving the collective
that applies without parameters (as under ``auto``) is a template; they are built in the order
of their lower bounds (:mod:`cclc.load_bounds`) and one whose bound is above the best time
known (the synthesized schedule's included) is not built, since it cannot win. When a template
is faster under the planner's execution model, or the synthesis ran out of budget before it
had a schedule, that template is returned, relabelled as the entry's with ``status
fallback`` (``budget`` when there was no synthesized schedule) and its ``template``: an
explicit synthesis is never slower than the best template. Under ``algorithm auto`` the
planner races every candidate itself and there is nothing to do here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from cclc.algorithms import Algorithm, BuildContext, Synthesis, algorithms_for
from cclc.collective import Collective
from cclc.errors import CclError, ScheduleError
from cclc.execution import predict
from cclc.ir import Schedule
from cclc.load_bounds import evaluation_order, lower_bound, prune_reason
from cclc.sim import simulate
from cclc.verify import verify

__all__ = ["Template", "fastest_template", "race_synthesis"]


@dataclass(frozen=True, eq=False)
class Template:
    """A template's verified schedule and its time (seconds, under the race's model)."""

    name: str
    schedule: Schedule
    time: float


def fastest_template(coll: Collective, entry: Algorithm, context: BuildContext,
                     beat: float | None = None) -> Template | None:
    """The fastest entry other than ``entry`` serving ``coll`` without parameters, under
    ``context.model``; ``None`` when none applies or none can beat ``beat`` seconds (a
    template whose lower bound is above the best time so far is not built)."""
    plain = coll.as_auto()
    model = context.model
    algos = [a for a in algorithms_for(coll)
             if a.name != entry.name and a.applicable(plain, context=context) is None]
    bounds = [lower_bound(plain, a, {}, model) for a in algos]
    best: Template | None = None
    for i in evaluation_order(bounds):
        known = [t for t in (beat, best.time if best else None) if t is not None]
        if prune_reason(bounds[i], min(known) if known else None, "") is not None:
            continue                       # it cannot be faster than what is known
        try:
            s = algos[i].build(plain, context=context)
            verify(s)
        except (CclError, ScheduleError):
            continue
        t = float(predict(s, model).time)
        if best is None or t < best.time:
            best = Template(algos[i].name, s, t)
    return best


def race_synthesis(coll: Collective, entry: Algorithm, context: BuildContext,
                   params: dict, race: bool = True) -> Schedule:
    """The schedule of synthesizing ``entry`` named explicitly for ``coll`` with hint
    ``params``: its own, or the fastest template when that is faster or the synthesis found
    nothing (see the module docstring); :class:`~cclc.errors.ScheduleError` when neither
    exists. Without ``race`` (the hint's ``race = 0``) a synthesized schedule is returned as
    it is: a template only stands in for none."""
    assert entry.synthesize is not None
    found: Synthesis = entry.synthesize(coll, context=context, **params)
    own = found.schedule
    if own is not None and not race:
        return own
    own_time = None if own is None else float(predict(own, context.model).time)
    template = fastest_template(coll, entry, context, own_time)
    if own is not None and (template is None or own_time is None
                            or not template.time < own_time):
        return own
    if template is None:
        raise ScheduleError(f"{entry.name}: no schedule within the budget and no template "
                            f"serves collective '{coll.name}'")
    return _fallback(entry, found, template)


def _fallback(entry: Algorithm, found: Synthesis, template: Template) -> Schedule:
    """``template`` labelled as ``entry``'s schedule: what the synthesis recorded, its status,
    time and ``lp_fraction`` (its optimum over the template's lockstep IR time)."""
    status = "fallback" if found.schedule is not None else "budget"
    ir_time = float(simulate(template.schedule).time)
    fraction = found.optimal / ir_time if found.optimal is not None and ir_time > 0 else 0.0
    info = found.params + (("status", status),
                           ("solve_s", round(time.monotonic() - found.started, 3)),
                           ("lp_fraction", round(fraction, 4)), ("template", template.name))
    return template.schedule.replace(algorithm=entry.name, schedule="-", params=info)
