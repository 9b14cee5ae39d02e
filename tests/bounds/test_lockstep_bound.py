"""The lockstep AllGather, ReduceScatter and AllReduce bound (cclc.lockstep_bound): tight where
one step is optimal (nodes of one GPU on a switch: `direct`'s simulated time), never above the
lockstep time of any schedule any algorithm builds on random machines of nodes (synth tapered
or not, every template), and on the 128-GPU fabric at 128 MiB above the bandwidth bound / 0.95:
no lockstep schedule reaches 95% of the bandwidth bound there."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dsl
from cclc.algorithms import algorithms_for, get
from cclc.bounds import bounds
from cclc.collective import CollectiveKind as K
from cclc.collective import make_collective
from cclc.lockstep_bound import lockstep_bound
from cclc.sim import simulate
from cclc.topology import NodeType, single_switch

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples")


def _machine(nodes: int, gpus: int, nics: int, nvlink_latency: float = 1e-6):
    node = NodeType("box", "nvswitch", gpus, 450e9, nvlink_latency, nics=nics,
                    nic_bandwidth=50e9)
    return single_switch("s", nodes, node, 25e9, 2e-6)


def _collective(topo, block_bytes: int, kind=K.ALLGATHER):
    group = topo.live_ranks()
    return make_collective(kind.value, kind, topo, group, size=block_bytes * len(group))


@pytest.mark.parametrize("kind", [K.ALLGATHER, K.REDUCESCATTER])
@pytest.mark.parametrize("nodes", [2, 3, 5])
def test_tight_on_nodes_of_one_gpu(nodes, kind):
    # one step: GPU -> NIC -> switch -> NIC -> GPU is 4 us, and the switch's link into each
    # NIC (out of it, for ReduceScatter) carries the other nodes' blocks at 25 GB/s
    coll = _collective(_machine(nodes, 1, 1), 1 << 20, kind)
    bound = lockstep_bound(coll)
    assert bound.seconds == pytest.approx(4e-6 + (nodes - 1) * (1 << 20) / 25e9, rel=2e-6)
    assert float(simulate(get("direct").build(coll)).time) == pytest.approx(bound.seconds,
                                                                             rel=2e-6)


def test_none_where_it_does_not_apply():
    topo = _machine(2, 2, 2)
    group = topo.live_ranks()
    one_node = make_collective("ag", K.ALLGATHER, topo, group[:2], size=4 << 20)
    alltoall = make_collective("a2a", K.ALLTOALL, topo, group, size=4 << 20)
    assert lockstep_bound(one_node) is None
    assert lockstep_bound(alltoall) is None


@pytest.mark.slow
@settings(max_examples=20, deadline=None)
@given(st.integers(2, 4), st.integers(1, 4), st.data(),
       st.sampled_from([1 << 14, 1 << 20, 1 << 23]),
       st.sampled_from([K.ALLGATHER, K.REDUCESCATTER, K.ALLREDUCE]))
def test_no_schedule_beats_it(nodes, gpus, data, block, kind):
    nics = data.draw(st.integers(1, gpus))
    coll = _collective(_machine(nodes, gpus, nics), block, kind)
    bound = lockstep_bound(coll)
    assert bound is not None
    built = [get("synth").build(coll, race=0, taper=taper) for taper in (0, 1)]
    built += [a.build(coll) for a in algorithms_for(coll)
              if a.name != "synth" and a.applicable(coll) is None]
    for s in built:
        assert float(simulate(s).time) >= bound.seconds * (1 - 1e-9), s.algorithm


@pytest.mark.parametrize("kind", [K.ALLGATHER, K.REDUCESCATTER])
def test_the_128_gpu_fabric_cannot_reach_95_percent_at_128_mib(kind):
    topo = dsl.load(os.path.join(EXAMPLES, "hgx16_leafspine.ccl")).topologies["cluster"]
    coll = _collective(topo, (128 << 20) // 128, kind)
    bound = lockstep_bound(coll)
    assert bounds(coll).best / bound.seconds < 0.95
    synth = float(simulate(get("synth").build(coll, race=0)).time)
    assert bound.seconds <= synth


@pytest.mark.parametrize("nodes", [2, 3, 5])
def test_allreduce_on_nodes_of_one_gpu(nodes):
    # nodes of one GPU, alike: every element crosses between the N nodes 2 (N - 1) times
    # (at least S into each), entering over a NIC's link from the switch (25 GB/s), in one
    # step at the least (4 us of latency); out of a node the same on the reversed links
    topo = _machine(nodes, 1, 1)
    coll = _collective(topo, 1 << 18, K.ALLREDUCE)
    bound = lockstep_bound(coll)
    entering = max(1, 2 * (nodes - 1) / nodes) * coll.size
    assert bound.seconds == pytest.approx(4e-6 + entering / 25e9, rel=2e-6)
    # and no AllReduce schedule of the table beats it
    for algo in algorithms_for(coll):
        if algo.applicable(coll) is None and algo.name != "synth":
            assert float(simulate(algo.build(coll)).time) >= bound.seconds * (1 - 1e-9)


def test_allreduce_on_alike_nodes_pays_the_gossip_crossings():
    # hgx16: 16 alike nodes; every element crosses between nodes 2 (N - 1) times, so the LP
    # enters each node 2 (N - 1) S / N over its 8 NICs' 400 GB/s, plus a step's latency
    topo = dsl.load(os.path.join(EXAMPLES, "hgx16_leafspine.ccl")).topologies["cluster"]
    coll = _collective(topo, (128 << 20) // 128, K.ALLREDUCE)
    bound = lockstep_bound(coll)
    assert bound.seconds > 2 * 15 * coll.size / 16 / 400e9
    assert bound.seconds >= bounds(coll).best


def test_alike_nodes_pay_the_sums_before_the_first_crossing_and_the_copies_after_the_last():
    # hgx16 at 128 MiB: the per-node counts leave the first crossing free to carry unsummed
    # bytes (637.1 us: the crossings' 629.1 us and two steps' 4 us); counting every element's
    # crossings at both ends charges the own-node sums and copies, 653.9 us at 6 crossing
    # steps (the LP solved apart), and still under synth's 687.5 us
    from cclc import lockstep_bound as lb

    topo = dsl.load(os.path.join(EXAMPLES, "hgx16_leafspine.ccl")).topologies["cluster"]
    coll = _collective(topo, (128 << 20) // 128, K.ALLREDUCE)
    bound = lockstep_bound(coll)
    assert bound.description.startswith("lockstep steps of every node")
    assert bound.seconds == pytest.approx(653.885e-6, rel=1e-5)
    per_node = lb._node_bound(8, coll.size, 0.0, 400e9, 4e12, 4e-6, 0.0,
                              entering=2 * 15 * coll.size / 16)
    assert per_node == pytest.approx(637.145e-6, rel=1e-5)
    # more crossing steps pay more latency than they save fill: 6 is the least
    six = lb._joint_lp(6, 8, 16, coll.size, 400e9, 4e12, 4e-6, 0.0)
    assert six == pytest.approx(653.885e-6, rel=1e-5)
    assert lb._joint_lp(5, 8, 16, coll.size, 400e9, 4e12, 4e-6, 0.0) > six
    assert lb._joint_lp(7, 8, 16, coll.size, 400e9, 4e12, 4e-6, 0.0) > six
    assert bound.seconds <= float(simulate(get("synth").build(coll, race=0)).time)


@pytest.mark.parametrize("nodes", [2, 3, 5])
def test_the_joint_count_on_nodes_of_one_gpu_is_the_gossip_crossings(nodes):
    # G = 1: nothing to sum or copy inside a node, so both ends cost nothing beyond the
    # crossings: every element crosses 2 (N - 1) times, 2 (N - 1) / N of the size into a
    # node on average, in one step at the least (what the per-node count gives too)
    from cclc import lockstep_bound as lb

    coll = _collective(_machine(nodes, 1, 1), 1 << 18, K.ALLREDUCE)
    size = coll.size
    joint = lb._joint_bound(1, nodes, size, 25e9, 25e9, 4e-6, 0.0)
    assert joint == pytest.approx(4e-6 + 2 * (nodes - 1) * size / nodes / 25e9, rel=1e-5)
    # the per-node count finds the same time, and no count of the bound finds more
    assert lockstep_bound(coll).seconds == pytest.approx(joint, rel=1e-9)
