"""The links a group can use under fewest-hop routing, against brute force: every link on some
fewest-hop path (networkx ``all_shortest_paths``) between two members, on small fabrics of two
and three tiers, with faults and sub-groups."""

from __future__ import annotations

from itertools import pairwise

import networkx as nx
import numpy as np
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from cclc.group_links import group_links
from cclc.topology import NodeType, fat_tree, leaf_spine, with_faults

NODE = NodeType("n2", "nvswitch", 2, 100e9, 1e-6, nics=2, nic_bandwidth=50e9)


def _brute(topo, group) -> np.ndarray:
    g = topo.healthy_graph()
    used = np.zeros(topo.n_links, dtype=bool)
    for a in group:
        for b in group:
            if a == b:
                continue
            for path in nx.all_shortest_paths(g, a, b):
                for x, y in pairwise(path):
                    used[g[x][y]["link"]] = True
    return used


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(three=st.booleans(), seed=st.integers(0, 2**16), faults=st.integers(0, 3),
       size=st.integers(2, 8))
# a failed cable leaves vertices a member cannot reach: their inf distances are no route
@example(three=True, seed=10433, faults=2, size=2)
def test_fewest_hop_links_match_brute_force(three, seed, faults, size):
    if three:
        topo = fat_tree("t", 4, NODE, pods=2, rails=2, leaves=2, spines=2, cores=2,
                        oversubscription=(1.0, 1.0), bandwidth=50e9, latency=1e-6)
    else:
        topo = leaf_spine("t", 4, NODE, rails=2, leaves=2, spines=2, oversubscription=1.0,
                          bandwidth=50e9, latency=1e-6)
    rng = np.random.default_rng(seed)
    switch = [k for k in range(topo.n_links)
              if topo.vertex_names[topo.link_src[k]].startswith(("leaf", "spine", "core"))]
    cut = [(int(topo.link_src[k]), int(topo.link_dst[k]))
           for k in rng.choice(switch, size=faults, replace=False)]
    topo = with_faults(topo, cut) if cut else topo
    group = sorted(rng.choice(topo.n_ranks, size=size, replace=False).tolist())
    if not topo.is_connected(group):
        return
    got = group_links(topo, np.array(group))
    assert (got == _brute(topo, group)).all()
