"""benchmarks/lockstep_limits.py: where a lockstep schedule's time goes (checked against the
closed form of a one-step schedule), and the floors of synth's tree pipelines (closed forms for
one level; never above the simulated time of the schedules synth builds, tapered or not, on
random machines of nodes; buffering never loses; on the 128-GPU fabric's 128 MiB AllReduce,
under 95% of the lockstep bound)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cclc.algorithms import get
from cclc.collective import CollectiveKind as K
from cclc.collective import make_collective
from cclc.lockstep_bound import lockstep_bound
from cclc.sim import simulate
from cclc.synth.taper import pipeline_time
from cclc.topology import NodeType, single_switch

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("lockstep_limits",
                                               ROOT / "benchmarks" / "lockstep_limits.py")
assert _spec is not None and _spec.loader is not None
limits = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(limits)


def _machine(nodes: int, gpus: int, nics: int):
    node = NodeType("box", "nvswitch", gpus, 450e9, 1e-6, nics=nics, nic_bandwidth=50e9)
    return single_switch("s", nodes, node, 25e9, 2e-6)


def _collective(topo, block: int, kind: K):
    group = topo.live_ranks()
    return make_collective(kind.value, kind, topo, group, size=block * len(group))


def _loads(coll):
    return limits.tree_loads(coll)


def _synth():
    algo = get("synth")
    assert algo is not None
    return algo


@pytest.mark.parametrize("nodes", [2, 4])
def test_breakdown_of_one_step(nodes):
    # `direct` AllGather on nodes of one GPU: one step, GPU -> NIC -> switch -> NIC -> GPU
    # (4 us), whose busiest link (the switch's into a NIC) carries the other nodes' blocks
    block = 1 << 20
    direct = get("direct")
    assert direct is not None
    s = direct.build(_collective(_machine(nodes, 1, 1), block, K.ALLGATHER))
    b = limits.step_breakdown(s)
    assert b["steps"] == b["network_steps"] == 1
    assert b["latency_s"] == pytest.approx(4e-6)
    assert b["bottleneck_s"] == pytest.approx((nodes - 1) * block / 25e9)
    assert b["excess_s"] == pytest.approx(0.0, abs=1e-12)
    assert b["time_s"] == pytest.approx(float(simulate(s).time))


def test_breakdown_counts_steps_inside_nodes_apart():
    # synth's AllReduce on nodes of two GPUs with one NIC: its first and last steps move
    # over NVLink only; every step pays at least a route through the NVSwitch (1 us), and
    # the three parts add up to the simulated time
    coll = _collective(_machine(2, 2, 1), 1 << 18, K.ALLREDUCE)
    s = _synth().build(coll, race=0)
    b = limits.step_breakdown(s)
    assert 0 < b["network_steps"] < b["steps"]
    assert b["latency_s"] >= 1e-6 * b["steps"] * (1 - 1e-9)
    total = b["bottleneck_s"] + b["excess_s"] + b["latency_s"]
    assert total == pytest.approx(float(simulate(s).time), rel=1e-12)


@pytest.mark.parametrize("chunks", [1, 3])
def test_one_level_floor_is_its_closed_form(chunks):
    # nodes of one GPU: an AllGather's trees are one level (the root sends to every node), so
    # each of the C steps pays 4 us and the levels' bytes take the switch's link into a NIC
    # (N - 1) blocks at 25 GB/s whatever the split
    nodes, block = 3, 1 << 20
    loads, tree_bytes = _loads(_collective(_machine(nodes, 1, 1), block, K.ALLGATHER))
    want = chunks * 4e-6 + (nodes - 1) * block / 25e9
    for buffered in (False, True):
        got = limits.stage_flow_time(loads, chunks, tree_bytes, buffered=buffered)
        assert got == pytest.approx(want, rel=1e-6)


@pytest.mark.slow
@settings(max_examples=6, deadline=None)
@given(st.integers(2, 3), st.integers(1, 4), st.data(),
       st.sampled_from([1 << 14, 1 << 20, 1 << 22]),
       st.sampled_from([K.ALLGATHER, K.REDUCESCATTER, K.ALLREDUCE]))
def test_floors_below_what_synth_builds(nodes, gpus, data, block, kind):
    coll = _collective(_machine(nodes, gpus, data.draw(st.integers(1, gpus))), block, kind)
    loads, tree_bytes = _loads(coll)
    for taper in (0, 1):
        s = _synth().build(coll, race=0, taper=taper)
        chunks = dict(s.params)["chunks"]
        chunk = limits.stage_flow_time(loads, chunks, tree_bytes, buffered=False)
        buffered = limits.stage_flow_time(loads, chunks, tree_bytes, buffered=True)
        assert buffered <= chunk * (1 + 1e-7)
        # equal chunks are one of the free splits
        equal = pipeline_time(loads, np.full(chunks, 1 / chunks), tree_bytes, 0.0)
        assert chunk <= equal * (1 + 1e-7)
        # the schedule's chunks differ by at most an element: 1e-3 covers that
        assert chunk <= float(simulate(s).time) * (1 + 1e-3), (taper, chunks)


@pytest.mark.slow
def test_the_128_gpu_allreduce_trees_floors_lie_between_the_bound_and_synth():
    # hgx16_leafspine, 128 MiB: the four levels (NVLink, NIC, NIC, NVLink) fill and drain
    # about twofold a step (docs/synthesis-trees.md); even buffered, the trees' floor is no
    # faster than the lockstep bound (whose count of alike nodes pays the same fill and
    # drain, 95.9% of the floor), and what synth builds is no faster than its floor
    import dsl

    topo = dsl.load(ROOT / "examples" / "hgx16_leafspine.ccl").topologies["cluster"]
    coll = _collective(topo, (128 << 20) // 128, K.ALLREDUCE)
    floors = limits.pipeline_floors(coll)
    bound = lockstep_bound(coll)
    assert bound is not None
    assert floors["buffered_floor_s"] <= floors["chunk_floor_s"] * (1 + 1e-7)
    assert 0.95 < bound.seconds / floors["buffered_floor_s"] <= 1 + 1e-7
    built = float(simulate(_synth().build(coll, race=0)).time)
    assert floors["chunk_floor_s"] <= built * (1 + 1e-3)
