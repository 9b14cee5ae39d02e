"""The plan carries the lockstep bound (cclc.lockstep_bound) where its model runs lockstep
steps and the bound is stronger than the best bound, and ``cclc compile`` prints the % of it
beside the % of the bound every model shares; under the dataflow models only the latter."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dsl
from cclc import cli
from cclc.collective import CollectiveKind as K
from cclc.collective import Hint, make_collective
from cclc.execution import MODELS
from cclc.lockstep_bound import lockstep_bound
from cclc.plan import plan
from cclc.topology import NodeType, single_switch
from cclc.verify import verify

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples")


def _machine(nodes: int = 3, gpus: int = 2, nics: int = 1):
    # by default three servers of two GPUs, one 50 GB/s NIC each, on a 25 GB/s switch: every
    # byte that enters a server reaches its second GPU a step later, so the lockstep bound is
    # stronger than the bandwidth bound
    node = NodeType("box", "nvswitch", gpus, 450e9, 1e-6, nics=nics, nic_bandwidth=50e9)
    return single_switch("s", nodes, node, 25e9, 2e-6)


def _collective(kind, algorithm="hierarchical"):
    topo = _machine()
    return make_collective(kind.value, kind, topo, topo.live_ranks(), size=6 << 20,
                           algorithm=Hint(algorithm))


@pytest.mark.parametrize("kind", [K.ALLGATHER, K.REDUCESCATTER, K.ALLREDUCE])
@pytest.mark.parametrize("model", ["ir", "mscclpp"])
def test_lockstep_models_carry_the_lockstep_bound(kind, model):
    coll = _collective(kind)
    p = plan(coll, model=MODELS[model])
    expected = lockstep_bound(coll)
    assert p.lockstep is not None and p.lockstep.seconds == expected.seconds
    assert p.lockstep.seconds > p.bound
    # the schedule's time under a lockstep model is never below it, and both % are shown
    assert p.time >= p.lockstep.seconds * (1 - 1e-9)
    assert p.pct_of_lockstep_bound == pytest.approx(100 * expected.seconds / p.time)
    assert p.pct_of_bound < p.pct_of_lockstep_bound <= 100 + 1e-7


@pytest.mark.parametrize("model", ["nccl", "msccl"])
def test_dataflow_models_are_not_held_to_it(model):
    p = plan(_collective(K.ALLGATHER), model=MODELS[model])
    assert p.lockstep is None and p.pct_of_lockstep_bound is None
    assert p.pct_of_bound is not None


def test_none_where_the_collective_has_none():
    p = plan(_collective(K.ALLTOALL, "direct"), model=MODELS["ir"])
    assert p.lockstep is None and p.pct_of_lockstep_bound is None


SOURCE = """\
node box = nvswitch(gpus = 2) {
    link 450 GB/s, 1 us
    nic  1 x 400 Gb/s
}
topology sw = fabric(switch) {
    nodes 3 x box
    link  200 Gb/s, 2 us
}
collective ag = allgather on sw { size 6 MiB; algorithm hierarchical }
"""


@pytest.mark.parametrize("emit, shown", [("json", True), ("json,msccl", False)])
def test_compile_prints_it_beside_the_bound(tmp_path, monkeypatch, capsys, emit, shown):
    monkeypatch.setattr(cli, "COMMANDS", ["compile"])
    src = tmp_path / "sw.ccl"
    src.write_text(SOURCE)
    assert cli.main(["compile", str(src), "-o", str(tmp_path / "out"), "--emit", emit]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("ag: "))
    assert "% of bound" in line
    assert ("% of the lockstep bound)" in line) is shown


@pytest.mark.slow
@settings(max_examples=12, deadline=None)
@given(st.integers(2, 4), st.integers(1, 3), st.data(), st.sampled_from([1 << 12, 1 << 20]),
       st.sampled_from([K.ALLGATHER, K.REDUCESCATTER, K.ALLREDUCE]),
       st.sampled_from(["ir", "mscclpp"]))
def test_no_plan_beats_it(nodes, gpus, data, block, kind, model):
    # whatever `auto` picks on a random machine of nodes under a lockstep model: verified,
    # and never faster than the lockstep bound it is reported against
    topo = _machine(nodes, gpus, data.draw(st.integers(1, gpus)))
    group = topo.live_ranks()
    coll = make_collective(kind.value, kind, topo, group, size=block * len(group))
    p = plan(coll, model=MODELS[model])
    verify(p.schedule)
    if p.lockstep is not None:
        assert p.time >= p.lockstep.seconds * (1 - 1e-9)
        assert p.lockstep.seconds > p.bound
        assert p.pct_of_lockstep_bound <= 100 + 1e-7


@pytest.mark.slow
@pytest.mark.parametrize("kind, floor", [(K.ALLGATHER, 97.0), (K.REDUCESCATTER, 97.0),
                                         (K.ALLREDUCE, 95.0)])
def test_synth_on_the_128_gpu_fabric_against_its_lockstep_bound(kind, floor):
    # hgx16_leafspine at 128 MiB, `algorithm synth` under the IR model: AllGather and
    # ReduceScatter at 97.4% of the lockstep bound (96.2% while the taper charged every step
    # the network's latency), AllReduce at 95.1% (92.7% against the per-node count alone,
    # before the count of alike nodes charged the fill and drain); issue 32 asks 95%
    topo = dsl.load(os.path.join(EXAMPLES, "hgx16_leafspine.ccl")).topologies["cluster"]
    group = topo.live_ranks()
    coll = make_collective(kind.value, kind, topo, group, size=128 << 20,
                           algorithm=Hint("synth"))
    p = plan(coll, model=MODELS["ir"])
    assert p.lockstep is not None and p.lockstep.seconds > p.bound
    assert floor <= p.pct_of_lockstep_bound <= 100 + 1e-7
