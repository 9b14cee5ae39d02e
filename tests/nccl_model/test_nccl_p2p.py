"""NCCL's AllToAll as grouped send/recv (cclc.nccl_p2p): the channels of NCCL's source rules,
the bandwidth term against closed forms and brute force, the pods' core bound on a fat tree."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cclc.collective import CollectiveKind as K
from cclc.collective import DType, make_collective
from cclc.nccl_comparison import compare_with_nccl
from cclc.nccl_model import BASE_LAT, HW_LAT, Algo, NcclSystem, Proto, system_of
from cclc.nccl_p2p import (
    P2P_LL_THRESHOLD,
    alltoall_estimate,
    nccl_alltoall,
    p2p_channels,
    p2p_chunk,
)
from cclc.topology import NodeType, fat_tree, single_node, single_switch, torus

HGX = NodeType("hgx", "nvswitch", 8, 450e9, 1e-6, nics=8, nic_bandwidth=50e9)
GiB = 1 << 30


def _cluster(nodes: int, node: NodeType = HGX):
    return single_switch("c", nodes, node, 50e9, 2e-6)


def test_channels_follow_ncclTopoComputeP2pChannels():
    # one H100 node: 32 comm channels; NVLink peers 2 x 18 links -> 64 -> capped at 32
    node = system_of(single_node("box", HGX))
    assert p2p_channels(node) == (32, 32) and p2p_chunk(node) == 1 << 19
    # 2 nodes: 16 channels; network peers max(1 NIC, ceil(50/14)) = 4, 4 x ceil(16/8) <= 16
    assert p2p_channels(system_of(_cluster(2))) == (16, 4)
    # 10 nodes: halved while perPeer x ceil(80/8) > 16
    ten = system_of(_cluster(10))
    assert p2p_channels(ten) == (16, 1) and p2p_chunk(ten) == 1 << 17
    assert p2p_chunk(ten, arm_host=True) == 1 << 17          # x2 only with sm100+
    pcie = system_of(single_node("p", NodeType("p", "pcie", 4, 24e9, 1e-6)), arch="ampere")
    assert p2p_channels(pcie)[1] == 2 and p2p_chunk(pcie) == 1 << 17


@pytest.mark.parametrize("nodes", [2, 3, 4, 8, 16, 64])
def test_busbw_across_nodes_by_closed_form(nodes):
    """NVIDIA/nccl-tests issue 130 (sjeaugey): the network part sets the time, so busbw is
    the per-GPU network bandwidth x N/(N-1) for N nodes -- exactly (n-1)/(n-ppn) for n ranks,
    ppn per node; here 48 GB/s (the Gen5 PCIe path NCCL rates below the 50 GB/s NIC)."""
    s = system_of(_cluster(nodes))
    n = 8 * nodes
    r = nccl_alltoall(s, 64 * GiB)
    assert r.bound == "network" and r.name == "p2p/simple"
    bandwidth = (64 * GiB) * (n - 8) / n / (r.time_us - r.latency_us) / 1e3
    assert bandwidth == pytest.approx(48.0)
    assert r.busbw == pytest.approx(48.0 * (n - 1) / (n - 8), rel=1e-3)


def test_one_node_is_bound_by_nvlink_as_nccl_rates_it():
    r = nccl_alltoall(system_of(single_node("box", HGX)), 8 * GiB)
    assert r.bound == "nvlink"
    assert r.busbw == pytest.approx(18 * 20.6, rel=1e-3)
    # one round of peers: Ring/Simple base latency + one NVLink Simple step
    assert r.latency_us == pytest.approx(BASE_LAT[Algo.RING][Proto.SIMPLE]
                                         + HW_LAT["nvlink"][Algo.RING][Proto.SIMPLE])


def test_small_messages_use_ll_at_half_bandwidth():
    s = system_of(single_node("box", HGX))
    per_peer = p2p_channels(s)[1] * P2P_LL_THRESHOLD
    small, big = nccl_alltoall(s, 8 * per_peer), nccl_alltoall(s, 8 * per_peer + 8 * 8)
    assert small.proto is Proto.LL and big.proto is Proto.SIMPLE
    assert (small.time_us - small.latency_us) == pytest.approx(
        2 * 7 * per_peer / (1e3 * s.gpu_bw))


def _brute_force(sent: np.ndarray, node: list[int]) -> tuple[float, float]:
    n = len(node)
    intra = inter = 0.0
    for i in range(n):
        for rows in (sent[i, :], sent[:, i]):
            same = sum(rows[j] for j in range(n) if j != i and node[j] == node[i])
            other = sum(rows[j] for j in range(n) if node[j] != node[i])
            intra, inter = max(intra, same), max(inter, other)
    return intra, inter


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 64), min_size=64, max_size=64))
def test_pair_matrix_loads_against_brute_force(units):
    topo = _cluster(2, NodeType("q", "nvswitch", 4, 450e9, 1e-6, nics=4, nic_bandwidth=50e9))
    sent = np.array(units, dtype=np.int64).reshape(8, 8) * 4096
    np.fill_diagonal(sent, 0)
    sent[0, 1] += 4096                        # never all zero
    coll = make_collective("m", K.ALLTOALL, topo, tuple(range(8)), dtype=DType.FP32,
                           pair_sizes=sent)
    r = alltoall_estimate(coll)
    s = system_of(topo)
    intra, inter = _brute_force(sent.astype(float), [0] * 4 + [1] * 4)
    slow = 0.5 if r.proto is Proto.LL else 1.0
    expect = max(intra / (1e3 * s.gpu_bw * slow), inter / (1e3 * 48.0 * slow))
    assert r.time_us - r.latency_us == pytest.approx(expect)


def test_an_even_pair_matrix_is_the_uniform_alltoall():
    topo = _cluster(4)
    n = 32
    sent = np.full((n, n), 1 << 20, dtype=np.int64)
    np.fill_diagonal(sent, 0)
    matrix = make_collective("m", K.ALLTOALL, topo, tuple(range(n)), pair_sizes=sent)
    # the uniform alltoall also sends 1 MiB to itself, which never leaves the GPU
    uniform = make_collective("u", K.ALLTOALL, topo, tuple(range(n)), size=n << 20)
    a, b = alltoall_estimate(matrix), alltoall_estimate(uniform)
    assert a.time_us == pytest.approx(b.time_us)


def _pods(core_ratio: float):
    return fat_tree("f", 16, HGX, pods=4, rails=8, leaves=None, spines=4, cores=8,
                    oversubscription=(1.0, core_ratio), bandwidth=50e9, latency=2e-6)


def test_the_pods_core_holds_an_alltoall_on_a_narrow_fat_tree():
    """4 pods of 4 HGX nodes: a pod's 32 NICs carry 1,600 GB/s to its spines, 1,600 / ratio to
    the core; a pod sends 32 x S x 96/128 bytes to other pods."""
    size, n = 8 * GiB, 128
    narrow = make_collective("t", K.ALLTOALL, _pods(4.0), tuple(range(n)), size=size)
    r = alltoall_estimate(narrow)
    core_us = 32 * size * 96 / 128 / (1600.0 / 4 * 1e9) * 1e6
    assert r.bound == "core" and r.time_us - r.latency_us == pytest.approx(core_us)
    assert r.core_limit == pytest.approx(size / core_us / 1e3 * 127 / 128)
    assert "held by the pods' core links" in compare_with_nccl(narrow, r.time_us * 1e-6)
    # at 1:1 the core carries what the NICs send: the network binds, not the core
    wide = make_collective("t", K.ALLTOALL, _pods(1.0), tuple(range(n)), size=size)
    w = alltoall_estimate(wide)
    assert w.bound == "network" and w.core_limit is None and w.time_us < r.time_us


def test_no_claim_where_the_model_does_not_apply():
    t = torus("t", (4, 4), bandwidth=32e9, latency=1e-7)
    assert alltoall_estimate(make_collective("a", K.ALLTOALL, t, tuple(range(16)),
                                             size=16 << 20)) is None
    box = single_node("box", HGX)
    assert alltoall_estimate(make_collective("g", K.ALLGATHER, box, tuple(range(8)),
                                             size=GiB)) is None


def test_the_comparison_says_slower_when_slower():
    coll = make_collective("a", K.ALLTOALL, _cluster(2), tuple(range(16)), size=GiB)
    r = alltoall_estimate(coll)
    line = compare_with_nccl(coll, r.time_us * 1e-6 * 2)
    assert line.startswith("NCCL today (predicted by cclc's model of NCCL): p2p/simple")
    assert "2.00x slower" in line and "faster" not in line


def test_the_model_is_one_system():
    s = NcclSystem("hopper", 8, 1, "nvlink", 370.8, nvswitch=True)
    assert nccl_alltoall(s, GiB).busbw == pytest.approx(
        nccl_alltoall(system_of(single_node("box", HGX)), GiB).busbw)


def test_the_4096_gpu_tokens_alltoall_is_held_by_the_core():
    """docs/nccl-model.md: on pods512_fattree.ccl (8 pods of 64 HGX servers, 2:1 at the core)
    a pod's 512 GPUs send 7/8 of their 1 GiB through 64 x 8 x 50 / 2 = 12,800 GB/s of core
    uplinks: 37.58 ms, plus 32 rounds of network latency (elaboration only, no compile)."""
    from pathlib import Path

    import dsl

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "machines" / "pods512_fattree.ccl"
    coll = next(c for c in dsl.load(path).collectives if c.name == "tokens")
    r = alltoall_estimate(coll)
    core_us = 512 * GiB * 7 / 8 / 12_800e9 * 1e6
    assert r.bound == "core" and r.time_us - r.latency_us == pytest.approx(core_us)
    assert r.latency_us == pytest.approx(8.4 + 32 * 14.0)
    assert round(r.time_us / 1e3, 2) == 38.04 and round(r.busbw, 1) == 28.2
    assert round(r.core_limit, 1) == 28.6
    # beside cclc's recorded direct schedule (benchmarks/results/fattree_scale.json)
    import json

    rows = json.loads((path.parents[1] / "results" / "fattree_scale.json").read_text())["rows"]
    ours = next(x for x in rows if (x["collective"], x["mode"]) == ("tokens", "direct"))
    value, unit = ours["time"].split()
    seconds = float(value) * {"ms": 1e-3, "us": 1e-6, "s": 1.0}[unit]
    line = compare_with_nccl(coll, seconds, software_cost=False)
    assert "held by the pods' core links" in line and "predicted as fast" in line


def test_a_group_with_uneven_nodes_is_charged_its_busiest_gpus():
    """12 ranks: all 8 of node 0 and 4 of node 1. Node 1's GPUs send 8/12 of their bytes over
    the network, node 0's send 7/12 over NVLink; the network binds."""
    topo = _cluster(2)
    group = tuple(range(12))
    coll = make_collective("a", K.ALLTOALL, topo, group, size=12 << 26)
    r = alltoall_estimate(coll)
    s = system_of(topo, group)
    inter_bw = min(s.gpu_nic_bw, s.nics * s.nic_bw / s.ppn)
    assert r.bound == "network"
    assert r.time_us - r.latency_us == pytest.approx((8 << 26) / (1e3 * inter_bw))


def test_no_time_where_the_model_sees_no_bandwidth_for_the_bytes():
    # a fuzz run of hand-edited schedule documents: vertex names that swap a GPU and the
    # NVSwitch left the model no NVLink bandwidth, and `cclc sim` divided by it
    import dataclasses

    box = single_node("box", HGX)
    names = list(box.vertex_names)
    switch = names.index("node0.nvswitch")
    names[1], names[switch] = names[switch], names[1]
    renamed = dataclasses.replace(box, vertex_names=tuple(names))
    group = tuple(range(box.n_ranks))
    coll = make_collective("a", K.ALLTOALL, renamed, group, size=GiB)
    assert alltoall_estimate(coll) is None
    assert compare_with_nccl(coll, 1e-3) is None
    # the machine as declared still gets its time
    assert alltoall_estimate(make_collective("a", K.ALLTOALL, box, group, size=GiB)) is not None
