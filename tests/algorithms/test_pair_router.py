"""PairRouter (the routes of schedules on fabrics of more than MANY_RANKS ranks): every route
leads from its source to its destination over healthy links, as few as networkx's BFS."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from cclc import routing
from cclc.algorithms import common
from cclc.algorithms.common import pair_router
from cclc.collective import CollectiveKind as K
from cclc.collective import make_collective
from cclc.ir import ScheduleBuilder
from cclc.topology import NodeType, fat_tree, with_faults


@pytest.mark.parametrize("block", [1, 1 << 21])
@pytest.mark.parametrize("faulty", [False, True])
def test_routes_are_fewest_hop_paths(faulty, block, monkeypatch):
    # (block 1: the predecessors' links looked up one source at a time)
    monkeypatch.setattr(routing, "_CELL_BLOCK", block)
    hgx = NodeType("hgx", "nvswitch", 4, 450e9, 1e-6, nics=4, nic_bandwidth=50e9)
    topo = fat_tree("c", 8, hgx, pods=2, rails=4, leaves=None, spines=2, cores=4,
                    oversubscription=(1, 2), bandwidth=50e9, latency=2e-6)
    if faulty:
        up = [i for i in range(topo.n_links)
              if topo.vertex_names[topo.link_src[i]].startswith("spine")
              and topo.vertex_names[topo.link_dst[i]].startswith("core")][0]
        topo = with_faults(topo, [(int(topo.link_src[up]), int(topo.link_dst[up]))])
    coll = make_collective("c", K.ALLGATHER, topo, topo.all_ranks(), size=4 * 32)
    b = ScheduleBuilder(coll, input=[1], output=[1] * 32)
    src, dst = np.meshgrid(np.arange(32), np.arange(32))
    src, dst = src.ravel(), dst.ravel()
    ids = pair_router(coll).ids(b, src, dst)
    s = b.build("test")
    assert pair_router(coll) is pair_router(coll)          # made once per topology and group
    for u, v, r in zip(src.tolist(), dst.tolist(), ids.tolist(), strict=True):
        path = s.routes.path(r)
        if u == v:
            assert r == 0
            continue
        assert not topo.link_failed[list(path)].any()
        assert topo.link_src[path[0]] == u and topo.link_dst[path[-1]] == v
        assert all(topo.link_dst[a] == topo.link_src[c] for a, c in itertools.pairwise(path))
        assert len(path) == len(topo.shortest_path_links(u, v))


def _walked(router, src: np.ndarray, dst: np.ndarray) -> list[tuple[int, ...]]:
    """Every pair's path read back from the router's predecessors one hop at a time, each
    hop's link looked up by (tail, head): the reference for the bulk walk of ``ids``."""
    out = []
    for u, d in zip(src.tolist(), dst.tolist(), strict=True):
        start, cur, path = int(router.group[u]), int(router.group[d]), []
        while cur != start:
            prev = int(router.pred[u, cur])
            path.append(int(router.links[np.searchsorted(router.keys, prev * router.v + cur)]))
            cur = prev
        out.append(tuple(path[::-1]))
    return out


@pytest.mark.parametrize("block", [1, 7, 1 << 18])
@pytest.mark.parametrize("faulty", [False, True])
@pytest.mark.parametrize("order", ["all pairs", "shuffled with repeats"])
def test_bulk_walk_matches_hop_by_hop(faulty, order, block, monkeypatch):
    # (blocks of 1 and 7 pairs: the walk's and the hop counts' blocks, one path and a few,
    # against one block)
    monkeypatch.setattr(routing, "_WALK_BLOCK", block)
    monkeypatch.setattr(common, "_HOPS_BLOCK", block)
    hgx = NodeType("hgx", "nvswitch", 4, 450e9, 1e-6, nics=4, nic_bandwidth=50e9)
    topo = fat_tree("c", 8, hgx, pods=2, rails=4, leaves=None, spines=2, cores=4,
                    oversubscription=(1, 2), bandwidth=50e9, latency=2e-6)
    if faulty:
        names = topo.vertex_names
        cut = [(int(u), int(v)) for u, v in zip(topo.link_src, topo.link_dst, strict=True)
               if names[u].startswith(("leaf", "spine")) and names[v].startswith("spine")][::5]
        topo = with_faults(topo, cut)
    coll = make_collective("c", K.ALLGATHER, topo, topo.all_ranks(), size=4 * 32)
    src, dst = (x.ravel() for x in np.meshgrid(np.arange(32), np.arange(32), indexing="ij"))
    if order != "all pairs":
        pick = np.random.default_rng(1).integers(0, len(src), 3 * len(src))
        src, dst = src[pick], dst[pick]
    b = ScheduleBuilder(coll, input=[1], output=[1] * 32)
    router = pair_router(coll)
    ids = router.ids(b, src, dst)
    routes = b.build("x").routes
    assert [routes.path(int(i)) for i in ids] == _walked(router, src, dst)
