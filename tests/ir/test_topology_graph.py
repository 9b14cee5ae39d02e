"""Graph questions answered on sparse matrices agree with networkx on the same healthy graph."""

from __future__ import annotations

import networkx as nx
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from cclc.topology import torus, with_faults


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
