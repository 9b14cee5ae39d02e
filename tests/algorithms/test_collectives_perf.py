"""Costs that the algorithms of issue 5 must reach: bandwidth optimality on rings and tori,
PAT's step counts, hierarchical AllReduce against the cut bound."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cclc.algorithms import get
from cclc.algorithms.pat import aggregation, pat_steps
from cclc.bounds import bounds, cut_bound
from cclc.collective import CollectiveKind as K
from cclc.collective import Hint, make_collective
from cclc.plan import plan
from cclc.sim import simulate
from cclc.topology import NodeType, leaf_spine, single_node, torus, with_faults
from cclc.verify import verify

GiB = 1 << 30
B = 50e9


def _ring_ar(name: str, n: int = 8):
    topo = torus("ring", (n,), bandwidth=B, latency=1e-6)
    coll = make_collective("c", K.ALLREDUCE, topo, topo.all_ranks(), size=GiB)
    return simulate(get(name).build(coll))


def test_ring_allreduce_is_bandwidth_optimal_on_a_ring():
    # one direction: busbw is the link bandwidth (nccl-tests definition)
    assert _ring_ar("ring").busbw == pytest.approx(B, rel=0.02)


def test_biring_allreduce_uses_both_directions():
    # both directions of every link: twice the link bandwidth, the ring's injection bound
    r = _ring_ar("biring")
    assert r.busbw == pytest.approx(2 * B, rel=0.02)
    assert r.time < 0.51 * _ring_ar("ring").time


@pytest.mark.parametrize("kind", [K.ALLGATHER, K.REDUCESCATTER, K.ALLREDUCE],
                         ids=lambda k: k.value)
def test_dimrotation_reaches_the_torus_injection_bound(kind):
    topo = torus("t", (4, 4), bandwidth=B, latency=100e-9)
    coll = make_collective("c", kind, topo, topo.all_ranks(), size=GiB)
    s = get("ring+dimrotation").build(coll)
    t = simulate(s).time
    bound = bounds(coll, lp=False).best
    assert bound <= t * (1 + 1e-9)
    assert bound / t > 0.98
    # every one of the 4 links of a rank carries traffic in every step of the piece schedule
    assert t < 0.55 * simulate(get("biring").build(coll)).time


def test_pat_takes_log2_steps_with_an_unbounded_buffer():
    for n in range(2, 34):
        topo = single_node("box", NodeType("x", "nvswitch", n, 100e9, 1e-6))
        for kind in (K.ALLGATHER, K.REDUCESCATTER):
            coll = make_collective("c", kind, topo, topo.all_ranks(), size=4 * n * 64)
            s = get("pat").build(coll)
            comm_steps = np.unique(s.ops.step[s.ops.src != s.ops.dst])
            assert len(comm_steps) == math.ceil(math.log2(n)), (n, kind)


def test_pat_steps_grow_as_the_buffer_shrinks():
    n = 13
    topo = single_node("box", NodeType("x", "nvswitch", n, 100e9, 1e-6))
    block = 1024
    coll = make_collective("c", K.ALLGATHER, topo, topo.all_ranks(), size=n * block)
    counts = []
    for buffer in (None, 64 * block, 8 * block, 4 * block, 2 * block, block, block // 2):
        params = {} if buffer is None else {"buffer": buffer}
        s = get("pat").build(coll, **params)
        verify(s)
        steps = len(np.unique(s.ops.step[s.ops.src != s.ops.dst]))
        assert steps == pat_steps(n, aggregation(coll, buffer))
        counts.append(steps)
    assert counts == sorted(counts)
    assert counts[0] == 4 and counts[-1] == n - 1  # log2 with room, one block per step without


def test_pat_single_block_steps_match_nccl_for_8_ranks():
    # reference: N=8 with aggFactor 1 is 7 single-block transfers; aggFactor 4 is 3 steps
    assert pat_steps(8, 1) == 7
    assert pat_steps(8, 4) == 3


def test_pat_buffer_hint_reaches_the_builder():
    n = 8
    topo = single_node("box", NodeType("x", "nvswitch", n, 100e9, 1e-6))
    coll = make_collective("c", K.REDUCESCATTER, topo, topo.all_ranks(), size=n * 4096,
                           algorithm=Hint("pat", (("buffer", 4096),)))
    p = plan(coll)
    assert dict(p.schedule.params)["buffer"] == 4096
    assert len(np.unique(p.schedule.ops.step[p.schedule.ops.src != p.schedule.ops.dst])) == 7


def _hgx16():
    node = NodeType("hgx", "nvswitch", 8, 450e9, 1e-6, nics=8, nic_bandwidth=50e9)
    return leaf_spine("cluster", 16, node, rails=8, leaves=None, spines=8, oversubscription=1.0,
                      bandwidth=50e9, latency=2e-6)


def test_hierarchical_allreduce_on_16_nvswitch_nodes_against_the_cut_bound():
    topo = _hgx16()
    coll = make_collective("grads", K.ALLREDUCE, topo, topo.all_ranks(), size=GiB)
    cut = cut_bound(coll).seconds
    # without pipelining the intra-node phases (2 (G-1)/G S over 450 GB/s) and the per-rail
    # network phases (2 (H-1)/H S/G over 50 GB/s) run one after the other
    plain = get("hierarchical").build(coll, chunks=1)
    verify(plain)
    t_plain = simulate(plain).time
    intra = 2 * 7 / 8 * GiB / 450e9
    inter = 2 * 15 / 16 * GiB / 8 / 50e9
    assert t_plain == pytest.approx(intra + inter, rel=0.02)
    # pipelined groups overlap one group's NVLink phase with another's network phase
    piped = get("hierarchical").build(coll)
    verify(piped)
    t = simulate(piped).time
    assert dict(piped.params)["chunks"] > 1
    assert cut <= t < 0.7 * t_plain
    assert t < 1.3 * inter  # within 30% of the network phase alone
    assert cut / t > 0.4
    # the flat rings send 1/G of the data over one NIC per node-crossing hop: far slower
    for flat in ("biring", "ring"):
        assert t < 0.3 * simulate(get(flat).build(coll)).time


def test_hierarchical_keeps_network_traffic_on_the_rails():
    topo = _hgx16()
    coll = make_collective("grads", K.ALLREDUCE, topo, topo.all_ranks(), size=GiB // 4)
    s = get("hierarchical").build(coll)
    names = topo.vertex_names
    spine = np.array([names[v].startswith("spine") for v in range(topo.n_vertices)])
    assert not spine[topo.link_dst[s.routes.links]].any()


def test_swing_beats_rings_on_small_torus_allreduce():
    # distances 1, 1, 3, ... instead of ring steps: far fewer latencies at small sizes
    topo = torus("t", (4, 4, 4), bandwidth=B, latency=100e-9)
    coll = make_collective("c", K.ALLREDUCE, topo, topo.all_ranks(), size=1024)
    swing = simulate(get("swing").build(coll)).time
    assert swing < 0.5 * simulate(get("ring+dimrotation").build(coll)).time
    assert plan(coll).name == "swing"


def test_biring_routes_around_a_failed_link_on_a_whole_torus():
    # the snake order crosses the failed link; a ring through healthy links avoids it and
    # keeps every hop one link, so the fault costs nothing
    topo = torus("t", (4, 4), bandwidth=B, latency=100e-9)
    faulty = with_faults(topo, [(2, 3), (3, 2)])  # snake hop (0,2) -> (0,3)
    times = []
    for t in (topo, faulty):
        coll = make_collective("c", K.ALLGATHER, t, t.all_ranks(), size=16 << 22)
        s = get("biring").build(coll)
        verify(s)
        assert set(s.routes.lengths()[s.ops.route[s.ops.src != s.ops.dst]].tolist()) == {1}
        times.append(simulate(s).time)
    assert times[1] == pytest.approx(times[0])
