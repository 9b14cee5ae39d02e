"""NCCL's cost model (nccl_plugins.md section 7) against values computed by hand."""

from __future__ import annotations

import math

import pytest

from cclc.collective import CollectiveKind as K
from cclc.collective import make_collective
from cclc.nccl_model import NcclView, algo_time, nccl_estimate, nccl_view
from cclc.topology import NodeType, leaf_spine, single_node, torus

GiB = 1 << 30
HGX = NodeType("hgx", "nvswitch", 8, 450e9, 1e-6, nics=8, nic_bandwidth=50e9)


def test_view_of_one_hgx_node():
    topo = single_node("box", HGX)
    v = nccl_view(make_collective("c", K.ALLREDUCE, topo, topo.all_ranks(), size=GiB))
    assert (v.n_ranks, v.n_nodes, v.intra_hw) == (8, 1, "nvlink")
    assert v.bw_intra == pytest.approx(450.0)
    assert v.n_channels == 22  # ceil(450 / 20.6)


def test_one_node_allreduce_1gib_is_ring_simple():
    topo = single_node("box", HGX)
    est = nccl_estimate(make_collective("c", K.ALLREDUCE, topo, topo.all_ranks(), size=GiB))
    # Ring/Simple: lat = 8.4 + 2*7 * 3.4 us; algbw = 450 * 8 / 14 GB/s
    expect = (8.4 + 14 * 3.4 + GiB / (1000 * 450 * 8 / 14)) * 1e-6
    assert (est.algorithm, est.protocol) == ("ring", "simple")
    assert est.time == pytest.approx(expect, rel=1e-12)
    assert est.busbw == pytest.approx(GiB / expect * 14 / 8)


def test_one_node_allreduce_1kib_is_ring_ll():
    topo = single_node("box", HGX)
    est = nccl_estimate(make_collective("c", K.ALLREDUCE, topo, topo.all_ranks(), size=1024))
    # Ring/LL: lat = 6.6 + 14 * 0.6; bw = min(141, 450 * 0.5) * 8 / 14
    expect = (6.6 + 14 * 0.6 + 1024 / (1000 * 141 * 8 / 14)) * 1e-6
    assert est.name == "ring/ll"
    assert est.time == pytest.approx(expect, rel=1e-12)
    # Tree/LL was the runner-up: 6.8 + 2 * 7 * 0.6, bw min(450/3.8, 141) * 0.5
    tree = {(a, p): t for a, p, t in est.table}[("tree", "ll")]
    assert tree == pytest.approx((6.8 + 14 * 0.6 + 1024 / (1000 * 450 / 3.8 * 0.5)) * 1e-6)


def test_sixteen_nodes_allreduce_uses_the_network_bandwidth_and_latency():
    topo = leaf_spine("c", 16, HGX, rails=8, leaves=None, spines=8, oversubscription=1.0,
                      bandwidth=50e9, latency=2e-6)
    coll = make_collective("c", K.ALLREDUCE, topo, topo.all_ranks(), size=GiB)
    v = nccl_view(coll)
    assert (v.n_nodes, v.bw_inter, v.n_channels) == (16, pytest.approx(50.0), 3)
    est = nccl_estimate(coll)
    n = 128
    # 254 steps, 30 of them between nodes; intra latency max(3.4, 3 x 1 us net overhead);
    # multi-node Ring/Simple allreduce latency x 1.4
    lat = (8.4 + (254 - 30) * 3.4 + 30 * 14.0) * 1.4
    expect = (lat + GiB / (1000 * 50.0 * n / 254)) * 1e-6
    assert est.name == "ring/simple"
    assert est.time == pytest.approx(expect, rel=1e-12)


def test_pat_only_with_one_gpu_per_node_and_only_simple():
    one_gpu = NcclView(16, 16, 48.0, 50.0, "pci", 3)
    t = algo_time(K.ALLGATHER, 1 << 20, one_gpu, "pat", "simple")
    expect = (8.0 + math.log2(16) * 14.0 / 3.5 + 16 * 2.8 + (1 << 20) / (1000 * 50 * 0.75))
    assert t == pytest.approx(expect * 1e-6)
    assert algo_time(K.ALLGATHER, 1 << 20, one_gpu, "pat", "ll") is None
    assert algo_time(K.ALLREDUCE, 1 << 20, one_gpu, "pat", "simple") is None
    eight = NcclView(128, 16, 450.0, 50.0, "nvlink", 3)
    assert algo_time(K.ALLGATHER, 1 << 20, eight, "pat", "simple") is None
    assert algo_time(K.ALLGATHER, 1 << 20, eight, "tree", "simple") is None


def test_allgather_ring_bandwidth_conversion():
    v = NcclView(8, 1, 450.0, 0.0, "nvlink", 22)
    t = algo_time(K.ALLGATHER, GiB, v, "ring", "simple")
    # busbw -> algbw: x nRanks / (n - 1)
    assert t == pytest.approx((8.4 + 7 * 3.4 + GiB / (1000 * 450 * 8 / 7)) * 1e-6)


def test_torus_and_alltoall():
    topo = torus("t", (4, 4), bandwidth=50e9, latency=1e-6)
    coll = make_collective("c", K.ALLGATHER, topo, topo.all_ranks(), size=16 * 4096)
    v = nccl_view(coll)
    # one NVLink-like domain, one link per ring hop
    assert (v.n_nodes, v.bw_intra, v.intra_hw) == (1, pytest.approx(50.0), "nvlink")
    assert nccl_estimate(coll) is not None
    a2a = make_collective("c", K.ALLTOALL, topo, topo.all_ranks(), size=16 * 4096)
    assert nccl_estimate(a2a) is None
