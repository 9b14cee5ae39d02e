"""Graph questions answered on sparse matrices agree with networkx on the same healthy graph."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cclc import topology
from cclc.topology import NO_PREDECESSOR, NodeType, leaf_spine, torus, with_faults


@st.composite
def faulty_tori(draw):
    dims = tuple(draw(st.lists(st.integers(2, 5), min_size=1, max_size=3)))
    lat = tuple(draw(st.sampled_from([0.0, 1e-7, 3e-7])) for _ in dims)
    topo = torus("t", dims, wrap=tuple(draw(st.booleans()) for _ in dims), latency=lat)
    links = draw(st.lists(st.integers(0, max(0, topo.n_links - 1)), max_size=3, unique=True))
    pairs = [(int(topo.link_src[k]), int(topo.link_dst[k])) for k in links if topo.n_links]
    ranks = draw(st.lists(st.integers(0, topo.n_ranks - 1), max_size=1))
    if len(ranks) == topo.n_ranks:
        ranks = []
    return with_faults(topo, pairs, ranks)


@settings(max_examples=60, deadline=None)
@given(topo=faulty_tori())
def test_connectivity_and_diameter_match_networkx(topo):
    g = topo.healthy_graph()
    ranks = list(topo.live_ranks())
    reach = all(nx.has_path(g, a, b) for a in ranks for b in ranks)
    assert topo.is_connected(ranks) == reach
    # over the pairs that are connected, like the networkx version it replaced
    best = 0.0
    for s in ranks:
        dist = nx.single_source_dijkstra_path_length(g, s, weight="latency")
        best = max(best, max(d for t, d in dist.items() if t in set(ranks)))
    assert abs(topo.diameter_latency(ranks) - best) <= 1e-12 * max(best, 1e-9)


def test_kind_name_tells_a_mesh_from_a_torus():
    assert torus("t", (4, 4)).kind_name == "torus"
    assert torus("m", (4, 4), wrap=(False, False)).kind_name == "mesh"
    assert torus("h", (4, 4), wrap=(True, False)).kind_name == "torus/mesh (wrap y,n)"


@settings(max_examples=60, deadline=None)
@given(topo=faulty_tori(), data=st.data())
def test_fewest_hops_are_bfs_lengths_along_their_predecessors(topo, data):
    """Distances equal networkx's BFS lengths on the healthy graph without failed ranks, and
    each vertex's predecessor is one hop closer over a healthy link; the search is kept."""
    live = topo.live_ranks()
    sources = data.draw(st.lists(st.sampled_from(list(live)), min_size=1, max_size=4))
    g = topo.healthy_graph()
    dist, pred = topo.fewest_hops(np.array(sources))
    keys, links = topo.hop_links()
    v = topo.n_vertices
    for row, s in enumerate(sources):
        want = nx.single_source_shortest_path_length(g, s)
        for t in range(v):
            assert dist[row, t] == want.get(t, np.inf)
            if t == s or t not in want:
                assert pred[row, t] < 0
                continue
            p = int(pred[row, t])
            assert dist[row, p] == dist[row, t] - 1
            link = links[np.searchsorted(keys, p * v + t)]
            assert (topo.link_src[link], topo.link_dst[link]) == (p, t)
            assert not topo.link_failed[link]
    again = topo.fewest_hops(np.array(sources))
    assert again[0] is dist and again[1] is pred


@st.composite
def leaf_spines(draw):
    gpus = draw(st.integers(1, 4))
    nics = draw(st.integers(1, 2))
    node = NodeType("n", draw(st.sampled_from(["nvswitch", "pcie"])), gpus, 100e9, 1e-6,
                    nics=nics, nic_bandwidth=50e9)
    topo = leaf_spine("ls", draw(st.integers(2, 4)), node, rails=draw(st.integers(1, nics)),
                      leaves=None, spines=draw(st.integers(1, 3)), oversubscription=1.0,
                      bandwidth=50e9, latency=2e-6)
    if draw(st.booleans()):
        leaf, spine = topo.vertex("leaf0"), topo.vertex("spine0")
        topo = with_faults(topo, [(leaf, spine), (spine, leaf)])
    return topo


def _first_to_reach(topo, source: int) -> dict[int, int]:
    """The vertex that first reaches each vertex in a breadth-first search from ``source``
    over healthy links that takes each vertex's out-links from the highest head down."""
    keys, _ = topo.hop_links()
    v = topo.n_vertices
    heads: dict[int, list[int]] = {}
    for k in keys.tolist():
        heads.setdefault(k // v, []).append(k % v)
    seen, queue, by = {source}, [source], {}
    for u in queue:                                 # (the list grows as the search goes)
        for w in sorted(heads.get(u, []), reverse=True):
            if w not in seen:
                seen.add(w)
                by[w] = u
                queue.append(w)
    return by


@settings(max_examples=40, deadline=None)
@given(topo=st.one_of(faulty_tori(), leaf_spines()), data=st.data())
def test_the_predecessor_is_the_first_to_reach_scanning_heads_from_the_highest(topo, data):
    """Among paths of equal length the search picks one by a stated rule (scipy's Dijkstra
    searches, used before, follow their heap's order of ties), the same in blocks of one,
    two or all sources."""
    live = [r for r in range(topo.n_ranks) if r not in topo.failed_ranks]
    sources = data.draw(st.lists(st.sampled_from(live), min_size=1, max_size=5))
    rows = data.draw(st.sampled_from([1, 2, 1 << 10]))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(topology, "_SEARCH_CELLS", rows * topo.n_vertices)
        dist, pred = topo.fewest_hops(np.array(sources))
    g = topo.healthy_graph()
    for row, s in enumerate(sources):
        by = _first_to_reach(topo, s)
        want = [by.get(t, NO_PREDECESSOR) for t in range(topo.n_vertices)]
        assert pred[row].tolist() == want
        got = nx.single_source_shortest_path_length(g, s)
        assert dist[row].tolist() == [got.get(t, np.inf) for t in range(topo.n_vertices)]
