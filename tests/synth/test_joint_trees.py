"""AllReduce trees packed jointly (cclc.synth.joint_trees): spanning arborescences of the
right directions, a joint link load recounted from the trees that never beats the AllReduce
bandwidth bound of cclc.bounds, and the faulty 5x5 torus where packing the phases separately
stays at 76% of that bound."""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from synth_tori import faulty_torus

from cclc.algorithms import get
from cclc.algorithms.synth_trees import synthesize_trees
from cclc.bounds import bounds
from cclc.collective import CollectiveKind as K
from cclc.collective import make_collective
from cclc.numeric import check_numeric
from cclc.sim import simulate
from cclc.synth import tree_schedule
from cclc.synth.hop_graph import hop_graph
from cclc.synth.joint_trees import link_use, pack_allreduce_trees
from cclc.synth.tree_time import allreduce_lockstep_time
from cclc.synth.trees import translations
from cclc.verify import verify


def _is_arborescence(src, dst, parent, edge, root) -> bool:
    """Every non-root member arrives by a move from its parent and reaches the root."""
    n = len(parent)
    for v in range(n):
        if v == root:
            continue
        if (src[edge[v]], dst[edge[v]]) != (parent[v], v):
            return False
        x, hops = v, 0
        while x != root:
            x, hops = int(parent[x]), hops + 1
            if hops > n:
                return False
    return True


def _brute_force_use(g, packing) -> np.ndarray:
    """Trees crossing each physical link, counted move by move."""
    use = np.zeros(len(g.capacity))
    for r in range(g.n):
        for j in range(packing.k):
            for v in range(g.n):
                if v != r:
                    use[list(g.path(int(packing.edge[r, j, v])))] += 1
    return use


@st.composite
def faulty_tori(draw):
    dims = tuple(draw(st.lists(st.integers(2, 5), min_size=1, max_size=3)))
    links = draw(st.lists(st.integers(0, 10_000), max_size=3))
    topo = faulty_torus(dims, links)
    if not topo.is_connected(topo.live_ranks()):
        topo = faulty_torus(dims, [])
    return topo, draw(st.integers(1, 3))


@pytest.mark.slow
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(faulty_tori())
def test_joint_packing_is_trees_and_never_beats_the_allreduce_bound(machine):
    topo, k = machine
    group = topo.live_ranks()
    n = len(group)
    coll = make_collective("ar", K.ALLREDUCE, topo, group, size=n * 4 * 1024)
    g = hop_graph(coll)
    nodes, edges = translations(coll, g)
    b = bounds(coll)
    bandwidth = max(x.seconds for x in b.items if x.name != "latency")
    block = coll.size / n
    rs, ag = pack_allreduce_trees(g, block / bandwidth, k, nodes, edges, time.monotonic() + 30)
    for r in range(n):
        for j in range(k):
            assert _is_arborescence(g.src, g.dst, ag.parent[r, j], ag.edge[r, j], r)
            # in-trees: moves taken backwards, the partial sums flow member -> parent
            assert _is_arborescence(g.dst, g.src, rs.parent[r, j], rs.edge[r, j], r)
    use = _brute_force_use(g, rs) + _brute_force_use(g, ag)
    assert np.array_equal(use, link_use(g, rs) + link_use(g, ag))
    ok = g.capacity > 0
    busiest = float((use[ok] / g.capacity[ok]).max())
    # the packing's load is the busiest link relative to the bound's rate
    assert ag.load == pytest.approx(busiest * block / k / bandwidth, rel=1e-9)
    # the trees' bandwidth time never beats the bound (the LP bound included where it runs)
    assert busiest * block / k >= bandwidth * (1 - 1e-9)


def test_faulty_5x5_allreduce_meets_the_bound_where_separate_phases_cannot():
    topo = faulty_torus((5, 5), [0])
    group = topo.live_ranks()
    coll = make_collective("ar", K.ALLREDUCE, topo, group, size=25 * 4 * 4096)
    syn = synthesize_trees(coll, budget=60)
    block = coll.size / coll.n
    separate = block / syn.rate_rs + block / syn.rate_ag
    bandwidth = max(x.seconds for x in bounds(coll).items if x.name != "latency")
    # the rank beside the fault: 3 links in, 24 blocks per phase; the hop-bytes bound spreads
    # both phases over the 98 live links: (2 x 24 x 25) / 98 = 12.24 blocks vs 8 + 8
    assert bandwidth / separate == pytest.approx(2 * 24 * 25 / 98 / 16, rel=1e-6)
    g = syn.graph
    ok = g.capacity > 0
    use = link_use(g, syn.rs) + link_use(g, syn.ag)
    trees_time = block / syn.ag.k * float((use[ok] / g.capacity[ok]).max())
    assert trees_time <= bandwidth * 1.03


@pytest.mark.slow
@pytest.mark.parametrize("dims, links, ranks", [((5, 5), [0], ()), ((4, 4), [], (6,)),
                                                ((3, 4), [0, 17], ())])
def test_joint_allreduce_verifies_and_matches_numpy(dims, links, ranks):
    topo = faulty_torus(dims, links, ranks)
    group = topo.live_ranks()
    n = len(group)
    coll = make_collective("ar", K.ALLREDUCE, topo, group, size=n * 4 * 24)
    s = get("synth").build(coll, chunks=3, race=0)
    verify(s)
    check_numeric(s)
    assert float(simulate(s).time) >= bounds(coll).best * (1 - 1e-9)


@pytest.mark.parametrize("dims, links, ranks, k, chunks", [((5, 5), [0], (), 1, 4),
                                                           ((4, 4), [], (6,), 2, 3),
                                                           ((3, 4), [0, 17], (), 3, 2),
                                                           ((2, 3, 2), [5], (), 1, 5)])
def test_lockstep_time_of_the_packings_is_the_simulated_time(dims, links, ranks, k, chunks):
    """allreduce_lockstep_time against cclc.sim on the built schedule (equal chunks, equal
    latencies: the two must agree to rounding)."""
    topo = faulty_torus(dims, links, ranks)
    group = topo.live_ranks()
    n = len(group)
    coll = make_collective("ar", K.ALLREDUCE, topo, group, size=n * 4 * k * chunks * 7)
    syn = synthesize_trees(coll, budget=30, trees=k)
    s = tree_schedule.allreduce_ops(coll, syn.graph, syn.rs, syn.ag, chunks, ())
    alpha = float(syn.graph.latency.max())
    predicted = allreduce_lockstep_time(syn.graph, syn.rs, syn.ag, coll.size / n, chunks, alpha)
    assert predicted == pytest.approx(float(simulate(s).time), rel=1e-9)
