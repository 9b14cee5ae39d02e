"""The hop graph: the moves a spanning tree may use, as one op each under the declared routing.

Torus neighbour links on a torus or mesh, fewest-hop paths between members through switches on
a fabric (what ECMP or adaptive routing carries), never through a rank outside the group.
:mod:`cclc.synth.trees` and :mod:`cclc.synth.tree_grow` grow trees over it; the tree time
models and the tree LP read it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components, dijkstra

from cclc.collective import Collective
from cclc.topology import Topology

__all__ = ["MAX_FABRIC_PAIRS", "HopGraph", "fabric_pairs", "hop_graph", "live_links"]

#: the most member pairs whose fabric paths :func:`hop_graph` walks (one Python loop step
#: per pair: ~1M pairs take about a minute on 2 cores; 4,096 ranks have 16.8M)
MAX_FABRIC_PAIRS = 1 << 20


@dataclass(frozen=True, eq=False)
class HopGraph:
    """Rank-to-rank moves the declared routing carries as one op, over group indices.

    ``src[h] -> dst[h]`` travels the physical links ``links[offsets[h]:offsets[h+1]]``;
    ``capacity[l]`` is the bandwidth of physical link ``l`` (bytes/s) and ``latency[h]`` the
    route latency of move ``h``. Pairs are unique.
    """

    n: int
    src: np.ndarray
    dst: np.ndarray
    offsets: np.ndarray
    links: np.ndarray
    capacity: np.ndarray
    latency: np.ndarray

    @property
    def m(self) -> int:
        return len(self.src)

    def incidence(self) -> csr_matrix:
        """``(m, n_links)`` 0/1 matrix: which physical links each move uses."""
        rows = np.repeat(np.arange(self.m), np.diff(self.offsets))
        return csr_matrix((np.ones(len(self.links)), (rows, self.links)),
                          shape=(self.m, len(self.capacity)))

    def reversed(self) -> HopGraph:
        """The same moves with source and destination swapped (for in-trees)."""
        return HopGraph(self.n, self.dst, self.src, self.offsets, self.links, self.capacity,
                        self.latency)

    def path(self, h: int) -> tuple[int, ...]:
        return tuple(self.links[self.offsets[h]:self.offsets[h + 1]].tolist())


def live_links(topo: Topology, members: np.ndarray) -> np.ndarray:
    """Healthy links whose ends are members or non-rank vertices."""
    keep = np.zeros(topo.n_vertices, dtype=bool)
    keep[members] = True
    keep[topo.n_ranks:] = True
    return ~topo.link_failed & keep[topo.link_src] & keep[topo.link_dst]


def fabric_pairs(coll: Collective) -> int:
    """The member pairs whose paths :func:`hop_graph` walks: ``n (n - 1)`` through switches,
    0 on a torus or mesh (its moves are the neighbour links)."""
    topo = coll.topology
    if topo.dims is not None and topo.n_vertices == topo.n_ranks:
        return 0
    return coll.n * (coll.n - 1)


def hop_graph(coll: Collective) -> HopGraph:
    """The moves trees may use: healthy neighbour links between members on a torus or mesh
    (carried by every torus routing), otherwise fewest-hop paths between every two members
    through switches (what ECMP or adaptive fabric routing carries), never through a rank
    outside the group."""
    topo = coll.topology
    group = np.asarray(coll.group, dtype=np.int64)
    index = np.full(topo.n_vertices, -1, dtype=np.int64)
    index[group] = np.arange(coll.n)
    ok = live_links(topo, group)
    if topo.dims is not None and topo.n_vertices == topo.n_ranks:
        links = np.flatnonzero(ok)
        s, d = index[topo.link_src[links]], index[topo.link_dst[links]]
        pair = s * coll.n + d
        _, first = np.unique(pair, return_index=True)     # size-2 rings: one link per pair
        links = links[np.sort(first)]
        return HopGraph(coll.n, index[topo.link_src[links]], index[topo.link_dst[links]],
                        np.arange(len(links) + 1), links.astype(np.int64),
                        np.where(topo.link_failed, 0.0, topo.link_bandwidth),
                        topo.link_latency[links].astype(float))
    return _fabric_hops(coll, group, index, ok)


def _fabric_hops(coll: Collective, group, index, ok) -> HopGraph:
    topo = coll.topology
    # a route may pass a member (a NIC behind its affine GPU) but never a non-member rank;
    # unit weights: fewest hops, the paths ECMP and adaptive routing use
    lk = np.flatnonzero(ok)
    v = topo.n_vertices
    order = np.lexsort((lk, topo.link_dst[lk], topo.link_src[lk]))
    lk = lk[order]
    first = np.ones(len(lk), dtype=bool)
    first[1:] = ((topo.link_src[lk][1:] != topo.link_src[lk][:-1])
                 | (topo.link_dst[lk][1:] != topo.link_dst[lk][:-1]))
    lk = lk[first]
    g = csr_matrix((np.ones(len(lk)), (topo.link_src[lk], topo.link_dst[lk])), shape=(v, v))
    link_of = {(int(a), int(b)): int(i) for i, a, b in
               zip(lk, topo.link_src[lk], topo.link_dst[lk], strict=True)}
    _, pred = dijkstra(g, indices=group, return_predecessors=True, unweighted=True)
    srcs, dsts, paths = [], [], []
    for i, u in enumerate(group.tolist()):
        for j, w in enumerate(group.tolist()):
            if i == j or pred[i, w] < 0:
                continue
            path, x = [], w
            while x != u:
                p = int(pred[i, x])
                path.append(link_of[(p, x)])
                x = p
            srcs.append(i)
            dsts.append(j)
            paths.append(path[::-1])
    srcs, dsts, paths = _nearest_member_moves(coll, srcs, dsts, paths)
    lengths = np.array([len(p) for p in paths], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    # no moves at all: members reach each other only through ranks outside the group
    links = np.concatenate([np.asarray(p, dtype=np.int64) for p in paths] or [np.zeros(0, int)])
    lat = np.add.reduceat(topo.link_latency[links], offsets[:-1]) if len(links) else lengths
    return HopGraph(coll.n, np.asarray(srcs, dtype=np.int64), np.asarray(dsts, dtype=np.int64),
                    offsets, links, np.where(topo.link_failed, 0.0, topo.link_bandwidth),
                    np.asarray(lat, dtype=float))


def _nearest_member_moves(coll: Collective, srcs, dsts, paths):
    """Only the moves to the nearest members of every other node (and all moves inside a
    node), when those still join the group: on a rail-optimized fabric the same-rail and
    NVLink moves, without the cross-rail paths over spines that a rail move plus an NVLink
    move replaces. Keeps the graph (and the search) small."""
    node = coll.topology.node_of_rank
    if node is None or not srcs:
        return srcs, dsts, paths
    group = np.asarray(coll.group)
    length = np.array([len(p) for p in paths])
    src, dst = np.asarray(srcs), np.asarray(dsts)
    key = src * (int(node.max()) + 1) + node[group[dst]]
    nearest = np.full(int(key.max()) + 1, np.iinfo(np.int64).max)
    np.minimum.at(nearest, key, length)
    keep = length <= nearest[key]
    if keep.all() or not _connected(coll.n, src[keep], dst[keep]):
        return srcs, dsts, paths
    idx = np.flatnonzero(keep).tolist()
    return [srcs[i] for i in idx], [dsts[i] for i in idx], [paths[i] for i in idx]


def _connected(n: int, src: np.ndarray, dst: np.ndarray) -> bool:
    """Whether moves ``src -> dst`` join all ``n`` members (strongly)."""
    mat = csr_matrix((np.ones(len(src)), (src, dst)), shape=(n, n))
    return connected_components(mat, directed=True, connection="strong")[0] == 1
