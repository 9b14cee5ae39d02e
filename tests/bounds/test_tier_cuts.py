"""Cut bounds at each tier of a three-tier fabric: the pods' spine->core uplinks are a
candidate cut, and on a small instance (2 pods x 2 leaves x 2 single-GPU nodes) the best of
the candidate cuts and the injection bound (a rank alone, whose GPU link is the narrowest)
equals the brute-force best cut over every split of the ranks (max-flow min cut for each)."""

from __future__ import annotations

import itertools

import networkx as nx
import pytest

from cclc.bounds_closed_form import Facts, candidate_cuts, cut_bound, injection_bound
from cclc.collective import CollectiveKind as K
from cclc.collective import make_collective
from cclc.topology import NodeType, fat_tree

GPU1 = NodeType("g1", "pcie", 1, 48e9, 1e-6, nics=1, nic_bandwidth=50e9)


def _small(core_ratio: float):
    # 2 pods x 2 leaves x 2 nodes; 1 spine per pod, 1 core
    return fat_tree("t", 8, GPU1, pods=2, rails=1, leaves=2, spines=1, cores=1,
                    oversubscription=(1.0, core_ratio), bandwidth=50e9, latency=1e-6)


def _brute_force_alltoall(topo, size: int) -> float:
    """max over every split A of the 8 ranks of (bytes A must send across) / (min cut
    capacity from A to the rest), each way."""
    g = nx.DiGraph()
    ok = ~topo.link_failed
    for u, v, bw in zip(topo.link_src[ok].tolist(), topo.link_dst[ok].tolist(),
                        topo.link_bandwidth[ok].tolist(), strict=True):
        cap = g[u][v]["capacity"] + bw if g.has_edge(u, v) else bw
        g.add_edge(u, v, capacity=cap)
    n = topo.n_ranks
    best = 0.0
    for k in range(1, n):
        for side in itertools.combinations(range(n), k):
            h = g.copy()
            for r in side:
                h.add_edge("s", r, capacity=float("inf"))
            for r in set(range(n)) - set(side):
                h.add_edge(r, "t", capacity=float("inf"))
            cut = nx.maximum_flow_value(h, "s", "t")
            best = max(best, k * (n - k) * size / n / cut)
    return best


@pytest.mark.parametrize("core_ratio", [1.0, 4.0])
def test_pod_core_uplinks_are_a_cut_and_the_best_one_matches_brute_force(core_ratio):
    topo = _small(core_ratio)
    size = 8 * 2**20
    coll = make_collective("a", K.ALLTOALL, topo, topo.all_ranks(), size=size)
    names = [name for name, _ in candidate_cuts(Facts(coll))]
    assert any("(its core uplinks)" in n for n in names)
    assert any("(its spine uplinks)" in n for n in names)
    bound = cut_bound(coll)
    best = max(bound.seconds, injection_bound(coll).seconds)
    assert best == pytest.approx(_brute_force_alltoall(topo, size), rel=1e-9)
    if core_ratio == 4.0:
        # the pod's 4 ranks send 4 x 4 blocks of S/8 out through its spine's one core link:
        # 2 leaves x 100 GB/s at 4:1 is 50 GB/s
        assert "core uplinks" in bound.description
        assert bound.seconds == pytest.approx(16 * size / 8 / 50e9)


def test_allreduce_crosses_the_core_once_each_way():
    topo = _small(4.0)
    coll = make_collective("r", K.ALLREDUCE, topo, topo.all_ranks(), size=2**20)
    assert cut_bound(coll).seconds == pytest.approx(2**20 / 50e9)
