"""One line about a synthesized schedule, for ``cclc compile`` (and its ``--explain``)."""

from __future__ import annotations

from cclc.ir import Schedule

__all__ = ["synth_report"]


def synth_report(schedule: Schedule) -> str:
    """Status, solver, solve time and the LP's share of the time, from the schedule's params.

    ``lp_fraction`` is the LP rate's time over the schedule's lockstep time (the IR model): 1.0
    would be a schedule at the LP bound on the links it may use. ``nic_relayed``: the ops of
    GPUs without their NIC that :mod:`cclc.algorithms.nic_relay` routed through another's
    (the trees, and the LP rate, are then the machine's with those NICs working).
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
    if p.get("nic_relayed"):
        parts.append(f"packed with the lost NICs working, then {p['nic_relayed']} ops relayed "
                     "through live NICs of their servers")
    if p.get("lp_fraction"):
        healed = " with the NICs working" if p.get("nic_relayed") else ""
        parts.append(f"{100 * float(p['lp_fraction']):.1f}% of the LP rate{healed} "
                     "(lockstep model)")
    return ", ".join(parts)
