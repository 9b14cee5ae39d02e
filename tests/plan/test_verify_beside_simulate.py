"""The planner verifies a candidate beside its timing (:func:`cclc.plan._verify_and_simulate`):
the verifier's error wins over whatever the timing did, the timing's own errors still reach
the caller, and a schedule that passes gets its time; ``auto`` reports a candidate that fails
verification, and an explicit one raises the verifier's error."""

from __future__ import annotations

import dataclasses

import pytest

import cclc.plan as planner
from cclc.collective import CollectiveKind as K
from cclc.collective import Hint, make_collective
from cclc.errors import ScheduleError
from cclc.execution import IR_MODEL
from cclc.plan import plan
from cclc.topology import torus


def _ring_allgather(algorithm: str = "auto"):
    topo = torus("t", (6,), bandwidth=50e9, latency=1e-7, routing="none")
    coll = make_collective("g", K.ALLGATHER, topo, tuple(range(6)), size=6 * 4 * 8)
    return dataclasses.replace(coll, algorithm=Hint(algorithm))


def _broken_verify(schedule):
    raise ScheduleError("planted: the verifier refuses")


def _broken_simulate(schedule, model):
    raise ValueError("planted: the timing failed")


@pytest.mark.parametrize("timing_fails", [False, True])
def test_the_verifier_wins_over_the_timing(monkeypatch, timing_fails):
    s = plan(_ring_allgather("ring")).schedule
    monkeypatch.setattr(planner, "verify", _broken_verify)
    if timing_fails:
        monkeypatch.setattr(planner, "_simulate", _broken_simulate)
    with pytest.raises(planner._Unverified, match="planted: the verifier refuses"):
        planner._verify_and_simulate(s, IR_MODEL)


def test_the_timing_error_reaches_the_caller_when_verified(monkeypatch):
    s = plan(_ring_allgather("ring")).schedule
    monkeypatch.setattr(planner, "_simulate", _broken_simulate)
    with pytest.raises(ValueError, match="planted: the timing failed"):
        planner._verify_and_simulate(s, IR_MODEL)


def test_a_verified_schedule_gets_the_time_simulated_alone():
    p = plan(_ring_allgather("ring"))
    assert planner._verify_and_simulate(p.schedule, IR_MODEL) == planner._simulate(p.schedule,
                                                                                   IR_MODEL)


def test_auto_reports_an_unverified_candidate_and_explicit_raises(monkeypatch):
    monkeypatch.setattr(planner, "verify", _broken_verify)
    with pytest.raises(ScheduleError, match="planted: the verifier refuses"):
        plan(_ring_allgather("ring"))
    with pytest.raises(Exception, match="failed verification: planted: the verifier refuses"):
        plan(_ring_allgather())
