"""cclc.routing.FewestHopPaths: the bulk walk of many fewest-hop paths, a block at a time,
checked path by path against networkx on fabrics with failed cables: each path runs from its
source to its end over healthy links, in as few hops as networkx's BFS finds, and is flagged
exactly when a vertex inside it is one the caller avoids."""

from __future__ import annotations

import networkx as nx
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cclc import routing
from cclc.routing import FewestHopPaths
from cclc.topology import NodeType, fat_tree, with_faults


def _machine(cut_every: int):
    hgx = NodeType("hgx", "nvswitch", 4, 450e9, 1e-6, nics=4, nic_bandwidth=50e9)
    topo = fat_tree("c", 8, hgx, pods=2, rails=4, leaves=None, spines=2, cores=4,
                    oversubscription=(1, 2), bandwidth=50e9, latency=2e-6)
    if cut_every:
        names = topo.vertex_names
        cut = [(int(u), int(v)) for u, v in zip(topo.link_src, topo.link_dst, strict=True)
               if names[u].startswith(("leaf", "spine")) and names[v].startswith("spine")]
        topo = with_faults(topo, cut[::cut_every])
    return topo


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(cut_every=st.sampled_from([0, 3, 5]), block=st.sampled_from([1, 7, 1 << 18]),
       seed=st.integers(0, 2**16), from_nics=st.booleans())
def test_bulk_walk_matches_networkx(cut_every, block, seed, from_nics, monkeypatch):
    # (blocks of 1 and 7 paths against one block; the patch holds for every example)
    monkeypatch.setattr(routing, "_WALK_BLOCK", block)
    topo = _machine(cut_every)
    names = topo.vertex_names
    rng = np.random.default_rng(seed)
    pool = (np.array([i for i, n in enumerate(names) if ".nic" in n]) if from_nics
            else np.arange(topo.n_ranks))
    sources = np.unique(rng.choice(pool, size=6))
    paths = FewestHopPaths(topo, sources)
    rows = rng.integers(0, len(sources), 60).astype(np.int32)
    ends = rng.integers(0, topo.n_vertices, 60).astype(np.int32)
    hops = paths.hops(rows, ends)
    graph = nx.DiGraph()
    graph.add_nodes_from(range(topo.n_vertices))
    graph.add_edges_from((int(a), int(b)) for a, b, bad in
                         zip(topo.link_src, topo.link_dst, topo.link_failed, strict=True)
                         if not bad)
    for r, e, h in zip(rows.tolist(), ends.tolist(), hops.tolist(), strict=True):
        want = nx.shortest_path_length(graph, int(sources[r]), e) \
            if nx.has_path(graph, int(sources[r]), e) else np.inf
        assert h == want
    walk = np.flatnonzero(np.isfinite(hops))
    offsets = np.zeros(len(walk) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum(hops[walk])
    links = np.full(int(offsets[-1]), -1, dtype=np.int32)
    avoid = rng.random(topo.n_vertices) < 0.3
    crosses = paths.write(rows[walk], ends[walk], links, offsets[1:] - 1, avoid=avoid)
    for i, k in enumerate(walk.tolist()):
        path = links[offsets[i]:offsets[i + 1]]
        verts = [int(sources[rows[k]])] + [int(topo.link_dst[x]) for x in path]
        assert verts[-1] == ends[k]
        assert all(topo.link_src[x] == v for x, v in zip(path, verts, strict=False))
        assert not topo.link_failed[path].any()
        assert bool(crosses[i]) == bool(avoid[verts[1:-1]].any())
    assert not paths.write(rows[walk], ends[walk], links, offsets[1:] - 1).any()


def test_one_walker_per_topology_and_sources():
    topo = _machine(0)
    a = FewestHopPaths.of(topo, np.arange(4))
    assert FewestHopPaths.of(topo, np.array([0, 1, 2, 3], dtype=np.int32)) is a
    assert FewestHopPaths.of(topo, np.arange(5)) is not a
    assert FewestHopPaths.of(_machine(0), np.arange(4)) is not a      # another topology
