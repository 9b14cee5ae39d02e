"""``cclc.routing.hop_distance`` against networkx's BFS lengths, on tori with failed links
and sources drawn with repeats in any order (its rows are the distinct sources, counted)."""

from __future__ import annotations

import networkx as nx
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from cclc.routing import hop_distance
from cclc.topology import torus, with_faults


@settings(max_examples=20, deadline=None)
@given(shape=st.sampled_from([(4,), (3, 3), (2, 3, 2)]), data=st.data())
def test_hop_distance_is_bfs_length(shape, data):
    topo = torus("t", shape)
    cut = data.draw(st.lists(st.integers(0, topo.n_links - 1), max_size=4, unique=True))
    if cut:
        topo = with_faults(topo, links=[(int(topo.link_src[k]), int(topo.link_dst[k]))
                                        for k in cut])
    v = topo.n_vertices
    pairs = data.draw(st.lists(st.tuples(st.integers(0, v - 1), st.integers(0, v - 1)),
                               min_size=1, max_size=30))
    src = np.array([p[0] for p in pairs])
    dst = np.array([p[1] for p in pairs])
    g = nx.DiGraph()
    g.add_nodes_from(range(v))
    ok = ~topo.link_failed
    g.add_edges_from(zip(topo.link_src[ok].tolist(), topo.link_dst[ok].tolist(), strict=True))
    want = [nx.shortest_path_length(g, u, w) if nx.has_path(g, u, w) else np.inf
            for u, w in pairs]
    np.testing.assert_array_equal(hop_distance(topo, src, dst), want)
