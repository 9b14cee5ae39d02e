"""One line about a synthesized schedule, for ``cclc compile`` (and its ``--explain``)."""

from __future__ import annotations

from cclc.ir import Schedule

__all__ = ["synth_report"]


def synth_report(schedule: Schedule) -> str:
    """Status, solver, solve time and the LP's share of the time, from the schedule's params.

    ``lp_fraction`` is the LP rate's time over the schedule's lockstep time (the IR model): 1.0
    would be a schedule at the LP bound on the links it may use.
    """
    p = dict(schedule.params)
    parts = [f"synth: status {p.get('status', '?')}"]
    if "template" in p:
        parts.append(f"template {p['template']} (faster than the synthesized schedule)"
                     if p.get("status") == "fallback" else f"template {p['template']}")
    if "solver" in p:
        parts.append(f"solver {p['solver']}")
    if "solve_s" in p:
        parts.append(f"{float(p['solve_s']):.1f} s")
    if p.get("lp_fraction"):
        parts.append(f"{100 * float(p['lp_fraction']):.1f}% of the LP rate (lockstep model)")
    return ", ".join(parts)
