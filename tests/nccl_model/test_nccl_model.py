"""cclc's model of NCCL: its topology search replica and cost formulas against values worked
out by hand from NCCL's rules, and against graphs NCCL itself printed (NCCL_DEBUG=INFO)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cclc.collective import CollectiveKind as K
from cclc.collective import make_collective
from cclc.nccl_model import (
    Algo,
    Func,
    Graph,
    NcclSystem,
    Proto,
    bus_factor,
    cost_table,
    nccl_choice,
    nccl_estimate,
    nccl_init,
    nccl_time,
    nvlink_as_nccl_sees_it,
    system_of,
)
from cclc.topology import NodeType, leaf_spine, single_node, single_switch, with_faults

GiB = 1 << 30
HGX = NodeType("hgx", "nvswitch", 8, 450e9, 1e-6, nics=8, nic_bandwidth=50e9)


def _cluster(nodes: int, node: NodeType = HGX):
    return leaf_spine("c", nodes, node, rails=node.nics, leaves=None, spines=4,
                      oversubscription=1.0, bandwidth=node.nic_bandwidth, latency=2e-6)


def test_h100_node_search():
    # 18 NVLinks x 20.6 = 370.8 GB/s; Hopper intra speeds 60, 50, 40, 30 all pack to 360 at
    # best (6 x 60 first); 24/60 < 0.49 stops; bw 60 >= 50 so the channels are duplicated
    m = nccl_init(system_of(single_node("box", HGX)))
    assert m.system.gpu_bw == pytest.approx(370.8)
    assert m.ring == Graph(12, 30.0, 30.0)
    assert m.channels == 24
    # NVLS (search.cc, NVLS pattern): 8 heads, one per GPU; a GPU carries (8 + 1) x bwIntra
    # (its head channel twice): 50 x 9 > 370.8, 40 x 9 <= 370.8; pass 2 then raises bwInter
    # alone while it is below 2 x bwIntra, to the top of the Hopper intra list (60)
    assert m.nvls == Graph(8, 40.0, 60.0)


def test_h800_node_search_matches_nccl_log():
    # NVIDIA/nccl issue 892 (H800, 8 NVLinks): NCCL printed "16 coll channels".
    # 8 x 20.6 = 164.8: 40 GB/s packs 4 channels (160), 20 GB/s 8 (160, not better);
    # 4 channels are not "> 4", so they are duplicated to 8 x 20
    node = NodeType("h800", "nvswitch", 8, 200e9, 1e-6)
    m = nccl_init(system_of(single_node("box", node)))
    assert m.ring == Graph(8, 20.0, 20.0)
    assert m.channels == 16


def test_two_node_two_gpu_search_matches_nccl_log():
    # NVIDIA/nccl issue 1189 (H20, 2 GPUs and 2 NDR NICs per node, PCIe Gen5 48 GB/s):
    # NCCL printed "Pattern 4 ... nChannels 4, bw 24.000000/24.000000" and
    # "8 coll channels". Speed 48 gives one channel per NIC (2 x 48); the duplication halves
    # it into 4 x 24 (2 channels are not "> 4"); the communicator runs twice that
    node = NodeType("h20", "nvswitch", 2, 450e9, 1e-6, nics=2, nic_bandwidth=50e9)
    m = nccl_init(system_of(single_switch("sw", 2, node, 50e9, 2e-6)))
    assert (m.system.nics, m.system.gpu_nic_bw) == (2, 48.0)
    assert m.ring == Graph(4, 24.0, 24.0)
    assert m.channels == 8


def test_channels_spread_over_all_nics():
    """The cause of issue 11: across nodes NCCL runs one channel per NIC (8 x 48 GB/s on
    8 NDR NICs), not the per-GPU share of the NICs; 2, 3, 4 and 16 nodes agree."""
    totals = []
    for nodes in (2, 3, 4, 16):
        m = nccl_init(system_of(_cluster(nodes)))
        assert m.ring == Graph(8, 48.0, 48.0)
        totals.append(m.ring.total)
    assert totals == [384.0] * 4
    # half the NICs, half the bandwidth: 4 x 48, and 4 channels are not "> 4", so they are
    # duplicated into 8 x 24
    half = NodeType("h4", "nvswitch", 8, 450e9, 1e-6, nics=4, nic_bandwidth=50e9)
    assert nccl_init(system_of(_cluster(4, half))).ring == Graph(8, 24.0, 24.0)


def _fail_nic(topo, name: str):
    return with_faults(topo, devices=[topo.vertex(name)])


def test_a_failed_nic_is_seen_by_every_rank():
    """NCCL settles each graph on the fewest channels and the lowest bandwidth over all
    ranks, so a node with a failed NIC holds the whole group to 7 NICs, whichever rank comes
    first; a GPU whose own NIC failed reaches another one over NVLink (PXN) at that NIC's
    rate, so a rail group with it is not slower (it was 0 NICs, sockets' 0.12 GB/s)."""
    healthy = _cluster(4)
    for node in (0, 2):
        s = system_of(_fail_nic(healthy, f"node{node}.nic3"))
        assert (s.nics, s.nic_bw) == (7, 50.0)
    rail = [healthy.vertex(f"node{h}.gpu0") for h in range(4)]
    assert system_of(_fail_nic(healthy, "node0.nic0"), rail) == system_of(healthy, rail)
    assert system_of(_fail_nic(healthy, "node2.nic0"), rail).nics == 1
    # every NIC of a node gone: nothing to reach
    dead = healthy
    for i in range(8):
        dead = _fail_nic(dead, f"node1.nic{i}")
    assert system_of(dead, rail).nics == 0


def test_one_node_allgather_is_ring_simple_by_hand():
    m = nccl_init(system_of(single_node("box", HGX)))
    c = nccl_choice(m, Func.ALLGATHER, GiB)
    # Ring/Simple: lat 8.4 + 7 x 3.4 us; algbw = 12 x 30 x 8 / 7 GB/s
    expect = 8.4 + 7 * 3.4 + GiB / (1000 * 360 * 8 / 7)
    assert (c.algo, c.proto) == (Algo.RING, Proto.SIMPLE)
    assert c.time_us == pytest.approx(expect, rel=1e-12)
    assert c.busbw == pytest.approx(GiB / expect / 1e3 * 7 / 8)


def test_one_node_allreduce_large_is_nvls_by_hand():
    m = nccl_init(system_of(single_node("box", HGX)))
    c = nccl_choice(m, Func.ALLREDUCE, GiB)
    # NVLS (NCCL 2.28 tuning.cc): 8 channels x min(40 x 0.85 x 7/8 x 2, 60) = 476 GB/s bus,
    # x 8/14 to algbw like Ring; latency = NVLink NVLS 25 us
    bus = 8 * min(40 * 0.85 * 7 / 8 * 2, 60.0)
    assert bus == pytest.approx(476.0)
    assert c.name == "nvls/simple"
    assert c.time_us == pytest.approx(25.0 + GiB / (1000 * bus * 8 / 14), rel=1e-6)
    assert c.channels == 16


def test_sixteen_nodes_ring_latency_by_hand():
    coll = make_collective("c", K.ALLREDUCE, _cluster(16), tuple(range(128)), size=GiB)
    est = nccl_estimate(coll)
    n = 128
    # 254 steps, 30 between nodes; intra max(3.4, 3 x 1 us net overhead); the multi-node
    # Ring/Simple allreduce latency x 1.4 (nBytes / (24 x 128) >= 64)
    lat = (8.4 + (254 - 30) * 3.4 + 30 * 14.0) * 1.4
    ring = nccl_time(est.model, Func.ALLREDUCE, Algo.RING, Proto.SIMPLE, GiB)
    assert ring == pytest.approx(lat + GiB / (1000 * 384.0 * n / 254), rel=1e-12)
    # NVLSTree is faster and NCCL runs it: the NVLS graph has 8 heads (one per NIC) of
    # bwIntra 40 (9 x 40 <= 370.8 on the head GPU) and bwInter 48 (the PCIe Gen5 path);
    # per channel min(40 x 0.85 x 7/8 x 2, 48, Hopper 4+-node cap 45.5) = 45.5, x 8
    # channels, x 128/254 to algbw; latency 25 + 2 x log2(16) x 20.9 us
    nvls_tree = 25.0 + 2 * 4 * 20.9 + GiB / (1000 * 8 * 45.5 * n / 254)
    assert est.name == "nvls_tree/simple"
    assert est.time_us == pytest.approx(nvls_tree, rel=1e-6)
    assert est.time_us < ring


def test_small_allreduce_tree_correction_and_ll():
    m = nccl_init(system_of(_cluster(4)))
    t = {(a, p): v for a, p, v in cost_table(m, Func.ALLREDUCE, 4096)}
    # Tree/LL at 4 KiB: log2(4096 / 64) = 6 -> correction 0.7 on the bandwidth
    bus = min(384 / 3.8, 35.0)                 # LL cap on Hopper at 4+ nodes
    lat = 6.8 + 2 * (7 * 0.6 + 2 * 5.0)
    assert t[(Algo.TREE, Proto.LL)] == pytest.approx(lat + 4096 / (1000 * bus * 0.5 * 0.7))
    # NVLS needs CollNet across nodes; NVLSTree is there; PAT needs one GPU per node
    assert t[(Algo.NVLS, Proto.SIMPLE)] is None
    assert t[(Algo.NVLS_TREE, Proto.SIMPLE)] is not None
    assert t[(Algo.PAT, Proto.SIMPLE)] is None
    assert nccl_choice(m, Func.ALLREDUCE, 4096).proto is Proto.LL


def test_pat_only_with_one_gpu_per_node_and_simple():
    one = NcclSystem("hopper", 16, 16, "pci", 48.0, 1, 50.0, 48.0)
    m = nccl_init(one)
    assert nccl_time(m, Func.ALLGATHER, Algo.PAT, Proto.SIMPLE, 1 << 20) is not None
    assert nccl_time(m, Func.ALLGATHER, Algo.PAT, Proto.LL, 1 << 20) is None
    assert nccl_time(m, Func.ALLREDUCE, Algo.PAT, Proto.SIMPLE, 1 << 20) is None
    # ppn 1: the tree's network latency (14 us Simple), log2(16) = 4
    t = nccl_time(m, Func.ALLGATHER, Algo.PAT, Proto.SIMPLE, 1 << 20)
    bus = m.ring.total * 0.75
    assert t == pytest.approx(8.0 + 4 * 14.0 / 3.5 + 16 * 2.8 + (1 << 20) / (1000 * bus))


@given(n=st.integers(2, 4096))
def test_bus_factor_is_nccl_tests(n):
    """nccl-tests' factors (src/*.cu ``*GetBw``): 2(n-1)/n for allreduce, (n-1)/n for
    allgather, reducescatter and alltoall (AlltoAllGetBw), 1 for broadcast and reduce."""
    assert bus_factor(K.ALLREDUCE, n) == pytest.approx(2 * (n - 1) / n)
    for kind in (K.ALLGATHER, K.REDUCESCATTER, K.ALLTOALL):
        assert bus_factor(kind, n) == pytest.approx((n - 1) / n)
    assert bus_factor(K.BROADCAST, n) == bus_factor(K.REDUCE, n) == 1.0


def test_the_simulator_reports_busbw_with_the_one_factor():
    from cclc.algorithms import get
    from cclc.sim import simulate

    coll = make_collective("a", K.ALLTOALL, single_node("box", HGX), tuple(range(8)),
                           size=8 * 8 * 1024)
    r = simulate(get("direct").build(coll))
    assert r.busbw == pytest.approx(coll.size / r.time * 7 / 8)


def test_nccl_sees_an_nvlink_at_its_derated_rate():
    # an H100's 18 NVLinks (450 GB/s declared at 25 GB/s each) at NCCL's 20.6 GB/s a link
    assert nvlink_as_nccl_sees_it(450.0, "hopper") == pytest.approx(18 * 20.6)
    assert nvlink_as_nccl_sees_it(900.0, "blackwell") == pytest.approx(18 * 40.1)


@settings(max_examples=40, deadline=None)
@given(nodes=st.integers(1, 12), gpus=st.sampled_from([1, 2, 4, 8]),
       nics=st.integers(1, 8), nic_gbps=st.sampled_from([100, 200, 400]),
       arch=st.sampled_from(["ampere", "hopper", "blackwell"]))
def test_search_never_exceeds_the_links(nodes, gpus, nics, nic_gbps, arch):
    """Whatever the machine, the replica's graph fits in its links: the channels x bandwidth
    are at most the GPU's total and, across nodes, at most the NICs' total."""
    if nodes == 1 and gpus == 1:
        return
    node = NodeType("n", "nvswitch" if gpus > 1 else "pcie", gpus,
                    (300e9 if arch == "ampere" else 450e9) if gpus > 1 else 48e9, 1e-6,
                    nics=nics, nic_bandwidth=nic_gbps / 8 * 1e9)
    topo = single_node("b", node) if nodes == 1 else single_switch("s", nodes, node,
                                                                   nic_gbps / 8 * 1e9, 2e-6)
    s = system_of(topo, arch=arch)
    m = nccl_init(s)
    g = m.ring
    assert 1 <= g.n_channels <= 32 and m.channels == min(64, 2 * g.n_channels)
    # across nodes a channel crosses (ppn-1)/ppn of each GPU's link, inside one node all of it
    share = (s.ppn - 1) / s.ppn if nodes > 1 else 1.0
    assert g.n_channels * g.bw_intra * share <= s.gpu_bw + 1e-6 or g.n_channels == 1
    if nodes > 1:
        assert g.total <= s.nics * s.gpu_nic_bw + 1e-6 or g.n_channels == 1
    # the NVLS graph: one channel per head (a GPU; across nodes a GPU with its own NIC), the
    # head GPU carries twice its channel, bwInter only raised while below twice bwIntra and, across
    # nodes, within the GPU's path to its NIC
    if m.nvls is not None:
        v = m.nvls
        assert 1 <= v.n_channels <= min(s.ppn, s.nics if nodes > 1 else s.ppn)
        assert (v.n_channels + 1) * v.bw_intra <= s.gpu_bw + 1e-6
        # raised one list step at a time while below 2 x bwIntra (adjacent speeds < 2x apart)
        assert v.bw_intra <= v.bw_inter < 4 * v.bw_intra
        if nodes > 1:
            assert v.bw_inter <= min(s.gpu_nic_bw, s.nic_bw) + 1e-6
    else:
        assert not s.nvls
    # every enabled entry is a positive time, and NCCL's choice is the argmin
    for func in (Func.ALLREDUCE, Func.ALLGATHER, Func.REDUCESCATTER):
        table = [(a, p, t) for a, p, t in cost_table(m, func, 1 << 24) if t is not None]
        assert table and all(t > 0 for *_, t in table)
        c = nccl_choice(m, func, 1 << 24)
        assert c.time_us == min(t for *_, t in table)
        assert math.isfinite(c.busbw)


@pytest.mark.parametrize("example", ["hgx_node.ccl", "hgx16_leafspine.ccl",
                                     "fabric6_single_gpu.ccl"])
def test_compile_and_tune_baselines_are_one_function(example):
    """What compile reports as NCCL's choice is what cclc tune puts beside its entries."""
    from pathlib import Path

    import dsl
    from cclc.tuning.baseline import nccl_default
    from cclc.tuning.space import NcclVersion, func_of, machine_of, space_for

    program = dsl.load(Path(__file__).resolve().parents[2] / "examples" / example)
    checked = 0
    for coll in program.collectives:
        est = nccl_estimate(coll)
        if est is None:
            continue
        machine = machine_of(coll.topology, coll.group)
        d = nccl_default(space_for(func_of(coll.kind), machine, NcclVersion(2, 30)), coll.size)
        assert (d.algo, d.proto, d.channels, d.threads) == \
            (est.algo, est.proto, est.channels, est.threads), coll.name
        checked += 1
    assert checked
