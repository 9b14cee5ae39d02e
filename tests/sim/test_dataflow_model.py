"""The NCCL library's execution model (cclc.dataflow): what the dataflow library does, timed
with the simulator's links. Checked against event mode (the schedule's own dataflow time):
never faster, equal when nothing shares a lane, and within 2% of it for the torus paper's
MATE and MATEe at bandwidth-bound sizes, where MATEe is at least as fast as MATE."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cclc.algorithms.torus_alltoall import build_for_sizes
from cclc.collective import CollectiveKind, DType, make_collective
from cclc.dataflow import DataflowPlan, dataflow_time, lower_schedule
from cclc.execution import NCCL_MODEL, predict
from cclc.relay import lower_relays
from cclc.sim import simulate
from cclc.topology import torus, with_faults


def _faulty_torus(dims, routing):
    t = torus("x".join(map(str, dims)), dims, bandwidth=50e9, latency=100e-9, routing=routing)
    a, b = t.rank_at((0,) * len(dims)), t.rank_at((1,) + (0,) * (len(dims) - 1))
    return with_faults(t, links=[(a, b), (b, a)])


def _mate(dims, routing, schedule, size):
    topo = _faulty_torus(dims, routing)
    n = topo.n_ranks
    coll = make_collective("a2a", CollectiveKind.ALLTOALL, topo, tuple(range(n)),
                           size=size // n * n, dtype=DType.UINT8)
    return lower_relays(build_for_sizes(coll, [coll.size], "halfring", schedule)[0])


@settings(max_examples=10, deadline=None)
@given(st.sampled_from([(4,), (6,), (3, 3), (4, 3)]), st.sampled_from(["none", "source"]),
       st.sampled_from(["dimrotation", "pipeline"]), st.integers(1, 64))
def test_never_faster_than_event_mode_and_equal_without_shared_lanes(dims, routing, sch, kib):
    topo = torus("t", dims, bandwidth=10e9, latency=1e-6, routing=routing)
    n = topo.n_ranks
    coll = make_collective("a2a", CollectiveKind.ALLTOALL, topo, tuple(range(n)),
                           size=n * n * kib * 64, dtype=DType.UINT8)
    s = lower_relays(build_for_sizes(coll, [coll.size], "ring", sch)[0])
    event = simulate(s, mode="event").time
    plan = lower_schedule(s)
    assert dataflow_time(s, 0.0, plan) >= event * (1 - 1e-12)
    # every op on a lane of its own, nothing grouped: the simulator's event mode exactly
    own = DataflowPlan(plan.items, plan.lane * 0 + range(len(s.ops)), len(s.ops), 0,
                       plan.staging, plan.group * 0 + range(len(s.ops)))
    assert dataflow_time(s, 0.0, own) == pytest.approx(event, rel=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("dims, routing", [((5, 5), "source"), ((5, 5), "none"),
                                           ((5, 5, 5), "source")])
def test_mate_and_matee_run_at_event_mode_time(dims, routing):
    size = 2 * 2**30
    nccl = NCCL_MODEL
    got = {}
    for sch in ("mate", "matee"):
        s = _mate(dims, routing, sch, size)
        event = simulate(s, mode="event").time
        got[sch] = predict(s, nccl).time
        assert got[sch] >= event
        assert got[sch] <= 1.02 * event, f"{sch}: {got[sch] / event:.4f} of event mode"
    assert got["matee"] <= got["mate"]
