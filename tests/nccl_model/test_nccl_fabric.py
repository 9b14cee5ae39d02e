"""NCCL across pods: the double binary tree is NCCL's (two spanning trees of depth log n), and
the pods' core links bound a ring or tree by closed form; NCCL's choice stays fabric-blind
while its time grows when the core is narrower than its bus bandwidth."""

from __future__ import annotations

import math

import networkx as nx
import pytest

from cclc.collective import CollectiveKind as K
from cclc.collective import make_collective
from cclc.nccl_fabric import core_limits, dtree_edges, pod_core_seconds, ring_edges
from cclc.nccl_model import nccl_estimate
from cclc.topology import NodeType, fat_tree

HGX = NodeType("hgx", "nvswitch", 8, 450e9, 1e-6, nics=8, nic_bandwidth=50e9)


@pytest.mark.parametrize("n", list(range(2, 41)) + [512])
def test_both_trees_span_the_nodes_with_logarithmic_depth(n):
    for edges in dtree_edges(n):
        g = nx.DiGraph(edges)
        assert len(edges) == n - 1 and nx.is_arborescence(g.reverse())
        roots = [v for v in g if g.out_degree(v) == 0]
        depth = max(nx.shortest_path_length(g, v, roots[0]) for v in g)
        assert depth <= math.ceil(math.log2(n)) + 1
        assert max(d for _, d in g.in_degree()) <= 2


def _cluster(core_ratio: float, nodes=16, pods=4):
    return fat_tree("c", nodes, HGX, pods=pods, rails=8, leaves=None, spines=4, cores=8,
                    oversubscription=(1.0, core_ratio), bandwidth=50e9, latency=2e-6)


def test_ring_and_tree_limits_by_closed_form():
    topo = _cluster(4.0)
    # a pod: 4 nodes x 8 NICs x 50 GB/s = 1600 GB/s into its 4 spines, 400 GB/s to the core
    limits = core_limits(topo, topo.all_ranks())
    assert limits.pods == 4
    # ranks pod by pod: the ring leaves each pod once, with its whole bus
    assert limits.ring == pytest.approx(400.0)
    # trees: count the crossing edges of both trees per pod (half the bus each, both ways)
    first, second = dtree_edges(16)
    pod = [v // 4 for v in range(16)]
    load = [0.0] * 4
    for a, b in first + second:
        if pod[a] != pod[b]:
            load[pod[a]] += 0.5
            load[pod[b]] += 0.5
    assert limits.tree == pytest.approx(min(400.0 / x for x in load if x))
    # ranks dealt across pods: every ring edge crosses
    spread = [r for i in range(4) for p in range(4) for r in range(32 * p + 8 * i,
                                                                     32 * p + 8 * i + 8)]
    assert core_limits(topo, spread).ring == pytest.approx(400.0 / 4)
    assert core_limits(topo, topo.node(0) + topo.node(1)) is None       # one pod


def test_ring_edges():
    assert ring_edges(3) == [(0, 1), (1, 2), (2, 0)] and ring_edges(1) == []


def test_nccl_chooses_blind_and_the_narrow_core_slows_it():
    wide, narrow = _cluster(1.0), _cluster(8.0)
    est = {}
    for name, topo in (("wide", wide), ("narrow", narrow)):
        coll = make_collective("ar", K.ALLREDUCE, topo, topo.all_ranks(), size=1 << 30)
        est[name] = nccl_estimate(coll)
    assert (est["wide"].algo, est["wide"].proto) == (est["narrow"].algo, est["narrow"].proto)
    assert est["wide"].core_limit is None
    assert est["narrow"].core_limit is not None
    assert est["narrow"].time_us > est["wide"].time_us * 1.2


def test_leaves_that_serve_no_server_leave_their_spines_in_the_pod():
    # one server per pod and two leaves per rail: half the leaves serve no NIC. Their spines
    # are the pod's all the same (they were given "no pod" by the leaves without one, and
    # the pods' core capacity came out 0: NCCL predicted at "inf s")
    topo = fat_tree("c", 2, HGX, pods=2, rails=8, leaves=16, spines=4, cores=8,
                    oversubscription=(1.0, 2.0), bandwidth=50e9, latency=2e-6)
    names = topo.vertex_names
    # the builder numbers spines pod by pod: spines 0-3 are pod 0's
    up = sum(float(bw) for u, v, bw, bad in zip(topo.link_src, topo.link_dst,
                                                topo.link_bandwidth, topo.link_failed,
                                                strict=True)
             if not bad and names[u] in {f"spine{i}" for i in range(4)}
             and names[v].startswith("core"))
    assert up > 0
    seconds, pods = pod_core_seconds(topo, topo.all_ranks(), 1e6)
    # each of pod 0's 8 GPUs sends 1 MB to each of pod 1's 8
    assert (seconds, pods) == (pytest.approx(64e6 / up), 2)
    limits = core_limits(topo, topo.all_ranks())
    assert limits.ring == pytest.approx(up / 1e9) and math.isfinite(limits.tree)
