"""The plan carries the lockstep bound (cclc.lockstep_bound) where its model runs lockstep
steps and the bound is stronger than the best bound, and ``cclc compile`` prints the % of it
beside the % of the bound every model shares; under the dataflow models only the latter."""

from __future__ import annotations

import pytest

from cclc import cli
from cclc.collective import CollectiveKind as K
from cclc.collective import Hint, make_collective
from cclc.execution import MODELS
from cclc.lockstep_bound import lockstep_bound
from cclc.plan import plan
from cclc.topology import NodeType, single_switch


def _machine():
    # three servers of two GPUs, one 50 GB/s NIC each, on a 25 GB/s switch: every byte that
    # enters a server reaches its second GPU a step later, so the lockstep bound is stronger
    node = NodeType("box", "nvswitch", 2, 450e9, 1e-6, nics=1, nic_bandwidth=50e9)
    return single_switch("s", 3, node, 25e9, 2e-6)


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
