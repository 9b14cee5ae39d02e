"""Execution models (cclc.execution) and the simulator's software overheads, against closed
forms; the fabric's declared routing prices ECMP, with the plan beside it."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import backends
from cclc.algorithms import get
from cclc.collective import CollectiveKind as K
from cclc.collective import make_collective
from cclc.errors import ScheduleError
from cclc.execution import (
    IR_MODEL,
    LOCKSTEP_NCCL_MODEL,
    MSCCL_MODEL,
    MSCCLPP_MODEL,
    NCCL_MODEL,
    model_for,
    model_reason,
    predict,
)
from cclc.fabric_routing import ecmp_routes
from cclc.plan import plan
from cclc.sim import simulate
from cclc.topology import NodeType, leaf_spine, single_node, torus, with_faults

from .sim_builders import chain, folded_reducescatter, ring_allgather


@settings(max_examples=25, deadline=None)
@given(st.integers(3, 9), st.integers(1, 8), st.floats(0, 1e-5))
def test_lockstep_step_overhead_adds_once_per_step(n, chunks, overhead):
    t = torus("l", (n,), wrap=[False], bandwidth=1e9, latency=1e-7)
    s = chain(t, 64 * chunks, chunks)
    base = simulate(s).time
    got = simulate(s, step_overhead=overhead).time
    assert got == pytest.approx(base + s.n_steps * overhead, rel=1e-12, abs=1e-15)


@settings(max_examples=25, deadline=None)
@given(st.integers(2, 8), st.integers(1, 64), st.floats(1e-7, 1e-5))
def test_mscclpp_pays_its_round_trip_only_on_steps_between_ranks(n, per, latency):
    # n - 1 steps where every rank sends one block of `per` bytes to a peer through the
    # NVSwitch (up- and downlink each carry one block: latency + bytes / bandwidth), between n
    # steps of local ops alone (free): the MSCCL++ plan synchronizes the n - 1 only
    bandwidth = 100e9
    topo = single_node("n", NodeType("hgx", "nvswitch", n, bandwidth, latency))
    s = folded_reducescatter(topo, n * per)
    assert s.n_steps == 2 * n - 1
    ir = (n - 1) * (latency + per / bandwidth)
    assert predict(s, IR_MODEL).time == pytest.approx(ir, rel=1e-12)
    assert predict(s, MSCCLPP_MODEL).time == pytest.approx(ir + (n - 1) * 2.345e-6, rel=1e-12)
    # the launch-per-step model still pays every step, local ones too
    assert predict(s, LOCKSTEP_NCCL_MODEL).time == pytest.approx(ir + (2 * n - 1) * 8.4e-6,
                                                                 rel=1e-12)
    # the per-step times say which steps paid: the local ones nothing at all
    r = simulate(s, step_overhead=1e-6, overhead_steps="peer")
    assert r.step_time[0::2] == pytest.approx([0.0] * n, abs=1e-15)
    assert r.step_time[1::2] == pytest.approx([latency + per / bandwidth + 1e-6] * (n - 1))


def test_an_unknown_overhead_rule_is_refused():
    t = torus("l", (3,), wrap=[False], bandwidth=1e9, latency=1e-7)
    with pytest.raises(ScheduleError, match="overhead_steps 'some'"):
        simulate(chain(t, 64, 1), step_overhead=1e-6, overhead_steps="some")  # type: ignore


@settings(max_examples=25, deadline=None)
@given(st.integers(3, 9), st.floats(0, 1e-5))
def test_event_op_overhead_adds_once_per_op_along_a_chain(n, overhead):
    # one chunk down a line: n - 1 dependent hops after the root's local copy
    t = torus("l", (n,), wrap=[False], bandwidth=1e9, latency=1e-7)
    s = chain(t, 64, 1)
    base = simulate(s, mode="event").time
    got = simulate(s, mode="event", op_overhead=overhead).time
    # the critical path is the n - 1 hops (the root reads its input, beside its local copy)
    assert got == pytest.approx(base + (n - 1) * overhead, rel=1e-12, abs=1e-15)


def test_each_backend_names_its_model_and_auto_uses_the_first_code_backend():
    assert model_for(_outputs("json")) is IR_MODEL
    assert model_for(_outputs("json", "msccl", "nccl")).name == "msccl"
    assert model_for(_outputs("nccl", "msccl")).name == "nccl"
    assert NCCL_MODEL.mode == "dataflow" and MSCCL_MODEL.mode == "event"
    t = torus("r", (6,), bandwidth=1e9, latency=1e-7)
    s = ring_allgather(t, 6 * 600)
    # a ring allgather is one chain of n - 1 dependent hops per block: the dataflow library
    # pays one launch per hop on it, the lockstep one per step
    nccl = predict(s, NCCL_MODEL)
    assert nccl.time == pytest.approx(simulate(s, mode="event").time + s.n_steps * 8.4e-6)
    lock = predict(s, LOCKSTEP_NCCL_MODEL)
    assert lock.time == pytest.approx(simulate(s).time + s.n_steps * 8.4e-6)
    msccl = predict(s, MSCCL_MODEL)
    assert msccl.time > simulate(s, mode="event").time + 8.4e-6
    coll = s.collective
    assert plan(coll, model=NCCL_MODEL).model.name == "nccl"


GPU1 = NodeType("g1", "pcie", 1, 48e9, 1e-6, nics=1, nic_bandwidth=50e9)


def test_ecmp_fabrics_price_ecmp_and_show_the_plan_beside_it():
    topo = leaf_spine("f", 16, GPU1, rails=1, leaves=2, spines=8, oversubscription=1.0,
                      bandwidth=50e9, latency=1e-6)
    group = tuple(x for k in range(8) for x in (k, k + 8))
    coll = make_collective("c", K.ALLGATHER, topo, group, size=16 * (4 << 20))
    s = get("ring").build(coll)
    p = predict(s)
    assert p.time == pytest.approx(simulate(ecmp_routes(s)).time)
    assert p.planned_time == pytest.approx(simulate(s).time)
    assert p.time > 1.5 * p.planned_time          # ECMP collides, as measured in fabric tests
    # adaptive switches balance the spines themselves: the planned time is the declared one
    adaptive = predict(replace(s, collective=replace(coll, topology=replace(
        topo, routing="adaptive", _cache={}))))
    assert adaptive.planned_time is None and adaptive.time == pytest.approx(p.planned_time)


@pytest.mark.parametrize("dims", [(5, 5), (5, 5, 5)])
def test_matee_is_not_slower_than_mate_under_the_dataflow_model(dims):
    # the paper's comparison (source routing, one failed link in dimension 0): MATEe uses the
    # faulty ring too, so where ops start when their inputs are ready it is at least as fast
    t = torus("t", dims, bandwidth=32e9, latency=1e-7)
    a, b = t.rank_at((0,) * len(dims)), t.rank_at((1,) + (0,) * (len(dims) - 1))
    t = with_faults(t, links=[(a, b), (b, a)])
    size = (1 << 27) // (4 * t.n_ranks) * 4 * t.n_ranks
    c = make_collective("a", K.ALLTOALL, t, t.all_ranks(), size)
    model = MSCCL_MODEL
    mate = predict(get("mate").build(c), model).time
    matee = predict(get("matee").build(c), model).time
    assert matee <= mate


def test_compile_names_the_model_and_routing_of_every_time(tmp_path, capsys):
    from cclc import cli

    src = tmp_path / "t.ccl"
    src.write_text("topology t = torus(3, 3) { link 10 GB/s, 100 ns }\n"
                   "collective a = alltoall on t { size 36 KiB }\n")
    for emit, model in (("json", "ir"), ("json,msccl", "msccl"), ("nccl,msccl", "nccl")):
        code = cli.main(["compile", str(src), "-o", str(tmp_path / emit.replace(",", "_")),
                         "--emit", emit, "--explain"])
        out = capsys.readouterr().out
        assert code == 0
        assert f"time ({model} model)" in out
        assert f"({model} model: " in out and "routing none" in out


def _outputs(*names):
    """The backends ``--emit`` would load for ``names``, in order."""
    return [backends.load(name) for name in names]


def test_model_reason_says_which_output_chose_the_model():
    assert model_reason(_outputs("json", "html")) is None
    msccl = model_reason(_outputs("json", "msccl"))
    assert msccl.startswith("priced under the msccl execution model (dataflow, 3.4 us per op")
    assert msccl.endswith("without msccl: the ir model (lockstep steps, no software cost)")
    both = model_reason(_outputs("nccl", "msccl"))
    assert "because --emit includes nccl, the first of nccl and msccl that --emit lists" in both
    assert both.endswith("without nccl: the msccl model (dataflow, 3.4 us per op, 8.4 us per "
                         "call)")
