"""The machine: ranks, switches and directed links with bandwidth, latency, kind and health.

Vertices are integers: ranks ``0..n_ranks-1`` first, then switches and NICs. Link attributes
live in read-only numpy arrays indexed by link id, so a 4096-rank torus is a few arrays, not
thousands of objects. networkx is used for path questions on the healthy graph.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from enum import IntEnum
from itertools import chain, pairwise
from typing import Literal, TypedDict

import networkx as nx
import numpy as np

from cclc.errors import TopologyError

__all__ = ["LinkKind", "NodeType", "Topology", "torus", "single_node", "single_switch",
           "leaf_spine", "fat_tree", "with_faults", "interconnect_named"]


class LinkKind(IntEnum):
    """What a link is made of; stored as int8 in :attr:`Topology.link_kind`."""

    ICI = 0
    NVLINK = 1
    PCIE = 2
    IB = 3
    ETH = 4


@dataclass(frozen=True, slots=True)
class NodeType:
    """A server: GPUs behind an NVSwitch or a PCIe switch, and NICs.

    ``bandwidth``/``latency`` are per GPU to any other GPU of the node (per direction);
    ``nic_bandwidth`` is per NIC, shared by its ``nic_ports`` ports.
    """

    name: str
    interconnect: Literal["nvswitch", "pcie"]
    gpus: int
    bandwidth: float
    latency: float
    nics: int = 0
    nic_bandwidth: float = 0.0
    nic_ports: int = 1
    #: the NVSwitch does NVLS multicast (``multicast`` in the language): one load-reduce or
    #: store reaches every GPU of the node
    multicast: bool = False


_INTERCONNECTS: dict[str, Literal["nvswitch", "pcie"]] = {"nvswitch": "nvswitch", "pcie": "pcie"}


def interconnect_named(name: str) -> Literal["nvswitch", "pcie"]:
    """``name`` as a :attr:`NodeType.interconnect`; :class:`TopologyError` when it is none."""
    try:
        return _INTERCONNECTS[name]
    except KeyError:
        raise TopologyError(f"unknown interconnect '{name}': use nvswitch or pcie") from None


def _frozen(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


@dataclass(frozen=True, eq=False)
class Topology:
    """A resolved machine. Build with :func:`torus`, :func:`leaf_spine`, ... never by hand."""

    name: str
    kind: Literal["torus", "fabric", "node"]
    n_ranks: int
    vertex_names: tuple[str, ...]
    link_src: np.ndarray
    link_dst: np.ndarray
    link_bandwidth: np.ndarray
    link_latency: np.ndarray
    link_kind: np.ndarray
    link_failed: np.ndarray
    failed_ranks: frozenset[int] = frozenset()
    dims: tuple[int, ...] | None = None
    wrap: tuple[bool, ...] | None = None
    node_of_rank: np.ndarray | None = None
    gpu_of_rank: np.ndarray | None = None
    rail_of_rank: np.ndarray | None = None
    n_nodes: int = 1
    #: pod of every node on a three-tier fabric (:func:`fat_tree`); ``None`` elsewhere
    pod_of_node: np.ndarray | None = None
    fault_groups: tuple[tuple[str, tuple[int, ...]], ...] = ()
    #: what the network carries by itself (see :mod:`cclc.routing`)
    routing: str = "source"
    #: every node's NVSwitch does NVLS multicast (:attr:`NodeType.multicast`)
    multicast: bool = False
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    # -- sizes -------------------------------------------------------------------------------
    @property
    def n_vertices(self) -> int:
        return len(self.vertex_names)

    @property
    def n_links(self) -> int:
        return len(self.link_src)

    @property
    def n_failed_links(self) -> int:
        return int(self.link_failed.sum())

    @property
    def kind_name(self) -> str:
        """What the machine is, for messages: ``kind``, but a torus without wrap-around links
        is a ``mesh`` and one wrapped in only some dimensions a ``torus/mesh (wrap y,n)``.

        >>> torus("m", (4, 4), wrap=(False, False)).kind_name
        'mesh'
        """
        if self.kind != "torus" or self.wrap is None or all(self.wrap):
            return self.kind
        if not any(self.wrap):
            return "mesh"
        return "torus/mesh (wrap " + ",".join("y" if w else "n" for w in self.wrap) + ")"

    # -- lookups -----------------------------------------------------------------------------
    def _index(self) -> dict[str, int]:
        if "names" not in self._cache:
            self._cache["names"] = {n: i for i, n in enumerate(self.vertex_names)}
        return self._cache["names"]

    def vertex(self, name: str) -> int:
        """The vertex called ``name``; :class:`TopologyError` if there is none."""
        try:
            return self._index()[name]
        except KeyError:
            raise TopologyError(f"topology '{self.name}' has no vertex '{name}'") from None

    def _links(self) -> dict[tuple[int, int], int]:
        if "links" not in self._cache:
            pairs = zip(self.link_src.tolist(), self.link_dst.tolist(), strict=True)
            self._cache["links"] = {(int(u), int(v)): i for i, (u, v) in enumerate(pairs)}
        return self._cache["links"]

    def link_id(self, u: int, v: int) -> int | None:
        """The directed link ``u -> v``, or ``None`` when the machine has no such link."""
        return self._links().get((u, v))

    def link_between(self, u: int, v: int) -> int:
        """The directed link ``u -> v``; :class:`TopologyError` when the machine has none."""
        link = self.link_id(u, v)
        if link is None:
            raise TopologyError(f"topology '{self.name}' has no link "
                                f"{self.vertex_names[u]}->{self.vertex_names[v]}")
        return link

    def link_name(self, link: int) -> str:
        return f"{self.vertex_names[self.link_src[link]]}->{self.vertex_names[self.link_dst[link]]}"

    # -- torus geometry ----------------------------------------------------------------------
    def _require_torus(self) -> tuple[int, ...]:
        if self.dims is None:
            raise TopologyError(f"topology '{self.name}' is not a torus or mesh")
        return self.dims

    @property
    def grid_dims(self) -> tuple[int, ...]:
        """``dims`` of a torus or mesh; :class:`TopologyError` on any other machine."""
        return self._require_torus()

    @property
    def grid_wrap(self) -> tuple[bool, ...]:
        """``wrap`` of a torus or mesh (per dimension); :class:`TopologyError` otherwise."""
        if self.wrap is None:
            raise TopologyError(f"topology '{self.name}' is not a torus or mesh")
        return self.wrap

    def coords(self, rank: int) -> tuple[int, ...]:
        """Torus coordinates of ``rank`` (row-major: the last dimension varies fastest)."""
        dims = self._require_torus()
        return tuple(int(c) for c in np.unravel_index(rank, dims))

    def rank_at(self, coords: Sequence[int]) -> int:
        """The rank at torus ``coords``; :class:`TopologyError` if out of range."""
        dims = self._require_torus()
        if len(coords) != len(dims):
            raise TopologyError(f"coordinates {tuple(coords)} have {len(coords)} components, "
                                f"but '{self.name}' has {len(dims)} dimensions")
        for c, n in zip(coords, dims, strict=True):
            if not 0 <= c < n:
                raise TopologyError(f"coordinates {tuple(coords)} are outside "
                                    f"{'x'.join(map(str, dims))}")
        return int(np.ravel_multi_index(tuple(coords), dims))

    def ring(self, rank: int, dim: int) -> tuple[int, ...]:
        """The ranks of dimension ``dim`` through ``rank``, in increasing coordinate order."""
        dims = self._require_torus()
        c = list(self.coords(rank))
        out = []
        for i in range(dims[dim]):
            c[dim] = i
            out.append(int(np.ravel_multi_index(tuple(c), dims)))
        return tuple(out)

    # -- graph questions ---------------------------------------------------------------------
    def healthy_graph(self) -> nx.DiGraph:
        """Live vertices and healthy links (a failed rank takes its links with it)."""
        if "graph" not in self._cache:
            g = nx.DiGraph()
            g.add_nodes_from(v for v in range(self.n_vertices) if v not in self.failed_ranks)
            ok = np.flatnonzero(~self.link_failed)
            for i, u, v, lat in zip(ok.tolist(), self.link_src[ok].tolist(),
                                    self.link_dst[ok].tolist(), self.link_latency[ok].tolist(),
                                    strict=True):
                g.add_edge(u, v, link=i, latency=lat)
            self._cache["graph"] = g
        return self._cache["graph"]

    def shortest_path_links(self, u: int, v: int) -> tuple[int, ...]:
        """Link ids of a fewest-hop path ``u -> v`` over healthy links (ties: lowest ids)."""
        if u == v:
            return ()
        g = self.healthy_graph()
        paths = self._bfs_paths(u)
        if v not in paths:
            raise TopologyError(f"no healthy path from {self.vertex_names[u]} to "
                                f"{self.vertex_names[v]}")
        path = paths[v]
        return tuple(g[a][b]["link"] for a, b in pairwise(path))

    def shortest_path_table(self, src: np.ndarray, dst: np.ndarray
                            ) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`shortest_path_links` of many vertex pairs at once, as CSR ``(offsets,
        links)``: the same paths (one breadth-first search per source, kept), their links
        looked up in bulk rather than an edge at a time (a million pairs of a 1,024-rank
        alltoall took 60 s that way)."""
        src = np.asarray(src, dtype=np.int64)
        dst = np.asarray(dst, dtype=np.int64)
        vertex_paths = []
        for u, v in zip(src.tolist(), dst.tolist(), strict=True):
            path = [u] if u == v else None
            if path is None:
                paths = self._bfs_paths(u)
                if v not in paths:
                    raise TopologyError(f"no healthy path from {self.vertex_names[u]} to "
                                        f"{self.vertex_names[v]}")
                path = paths[v]
            vertex_paths.append(path)
        hops = np.array([len(p) - 1 for p in vertex_paths], dtype=np.int64)
        offsets = np.zeros(len(src) + 1, dtype=np.int64)
        np.cumsum(hops, out=offsets[1:])
        flat = np.fromiter(chain.from_iterable(vertex_paths), dtype=np.int64,
                           count=int(offsets[-1]) + len(src))
        # every vertex but each path's last is the tail of a hop, every one but the first a head
        tail = np.delete(flat, offsets[1:] + np.arange(len(src)))
        head = np.delete(flat, offsets[:-1] + np.arange(len(src)))
        keys, links = self._edge_links()
        at = np.searchsorted(keys, tail * self.n_vertices + head)
        return offsets, links[at].astype(np.int32)

    def _bfs_paths(self, u: int) -> dict:
        """networkx's fewest-hop paths from ``u`` over healthy links (kept per source)."""
        g = self.healthy_graph()
        key = ("bfs", u)
        if key not in self._cache:
            if u not in g:
                raise TopologyError(f"{self.vertex_names[u]} has failed")
            self._cache[key] = nx.single_source_shortest_path(g, u)
        return self._cache[key]

    def _edge_links(self) -> tuple[np.ndarray, np.ndarray]:
        """The link the healthy graph holds for every edge (the last of parallel links), as
        sorted keys ``tail * n_vertices + head`` and their link ids."""
        if "edge_links" not in self._cache:
            edges = np.array([(u, v, i) for u, v, i in self.healthy_graph().edges(data="link")],
                             dtype=np.int64).reshape(-1, 3)
            keys = edges[:, 0] * self.n_vertices + edges[:, 1]
            order = np.argsort(keys)
            self._cache["edge_links"] = (keys[order], edges[order, 2])
        return self._cache["edge_links"]

    def live_links(self) -> np.ndarray:
        """Per link: healthy, between vertices that are not failed ranks."""
        ok = ~self.link_failed
        if self.failed_ranks:
            dead = np.zeros(self.n_vertices, dtype=bool)
            dead[list(self.failed_ranks)] = True
            ok &= ~dead[self.link_src] & ~dead[self.link_dst]
        return ok

    def hop_links(self) -> tuple[np.ndarray, np.ndarray]:
        """The healthy graph between live vertices for fewest-hop searches: sorted distinct
        keys ``tail * n_vertices + head`` and the lowest link id of each (it names the hop)."""
        if "hop_links" not in self._cache:
            v = self.n_vertices
            ok = np.flatnonzero(self.live_links())
            key = self.link_src[ok].astype(np.int64) * v + self.link_dst[ok]
            order = np.lexsort((ok, key))
            key, ok = key[order], ok[order]
            first = np.ones(len(key), dtype=bool)
            first[1:] = key[1:] != key[:-1]
            self._cache["hop_links"] = (key[first], ok[first])
        return self._cache["hop_links"]

    def fewest_hops(self, sources: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Fewest healthy hops from every vertex of ``sources`` to every vertex (``inf``
        where none) and the predecessor of each vertex on one such path (-9999 at the source
        and where none), over :meth:`hop_links`: ``(len(sources), n_vertices)`` float64 and
        int32, read-only. Kept per source list: routing, relay checks and the bounds of a
        4,096-GPU fabric all ask for the same 4,096 searches.

        Among paths of equal length the predecessor is the one a breadth-first search picks
        when it scans each vertex's out-links from the highest head vertex down: the first
        vertex to reach it (:func:`_breadth_first`)."""
        sources = np.ascontiguousarray(sources, dtype=np.int64)
        key = ("fewest_hops", sources.tobytes())
        if key not in self._cache:
            dist, pred = _breadth_first(self.hop_links()[0], self.n_vertices, sources)
            dist.setflags(write=False)
            pred.setflags(write=False)
            self._cache[key] = (dist, pred)
        return self._cache[key]

    def is_connected(self, ranks: Iterable[int]) -> bool:
        """Whether every rank of ``ranks`` reaches every other over healthy links."""
        ranks = list(ranks)
        if not ranks:
            return True
        if any(r in self.failed_ranks for r in ranks):
            return False
        # scipy.sparse (~0.2 s to import) only when this runs: importing the module needs no scipy
        # strongly connected components on a sparse matrix: a networkx graph of a million-rank
        # mesh takes half a minute to build
        from scipy.sparse.csgraph import connected_components

        _, label = connected_components(self.latency_matrix(), directed=True,
                                        connection="strong")
        return bool((label[ranks] == label[ranks[0]]).all())

    def latency_matrix(self):
        """Live links as a sparse ``(V, V)`` matrix of latencies (the lowest of parallel
        links), kept on the topology; zero latencies are stored explicitly, so they stay edges
        for scipy.csgraph."""
        if "latency_matrix" not in self._cache:
            # scipy.sparse (~0.2 s to import) only when this runs: importing the module needs
            # no scipy
            from scipy.sparse import csr_matrix

            ok = self.live_links()
            src, dst, lat = self.link_src[ok], self.link_dst[ok], self.link_latency[ok]
            # csr_matrix sums duplicate entries: keep only the fastest of parallel links
            order = np.lexsort((lat, dst, src))
            src, dst, lat = src[order], dst[order], lat[order]
            first = np.ones(len(src), dtype=bool)
            first[1:] = (src[1:] != src[:-1]) | (dst[1:] != dst[:-1])
            n = self.n_vertices
            self._cache["latency_matrix"] = csr_matrix((lat[first], (src[first], dst[first])),
                                                       shape=(n, n))
        return self._cache["latency_matrix"]

    def diameter_latency(self, ranks: Sequence[int] | None = None, max_sources: int = 64) -> float:
        """Largest shortest-path latency between ranks of ``ranks`` (all live ranks by default).

        Exact up to ``max_sources`` ranks; beyond that the eccentricities of an evenly spaced
        sample of sources, which is still a lower bound on the diameter.
        """
        ranks = list(self.live_ranks() if ranks is None else ranks)
        if len(ranks) < 2:
            return 0.0
        # scipy.sparse (~0.2 s to import) only when this runs: importing the module needs no scipy
        from scipy.sparse.csgraph import dijkstra

        adj = self.latency_matrix()
        step = max(1, len(ranks) // max_sources)
        sources = ranks[::step]
        targets = np.asarray(ranks)
        best = 0.0
        for lo in range(0, len(sources), 8):   # 8 rows of V distances at a time
            dist = dijkstra(adj, directed=True, indices=sources[lo:lo + 8])[:, targets]
            reached = dist[np.isfinite(dist)]
            if reached.size:
                best = max(best, float(reached.max()))
        return best

    # -- NICs --------------------------------------------------------------------------------
    def nic_nodes(self) -> np.ndarray:
        """Per vertex: the node whose NIC it is (the builders name NIC ``i`` of node ``h``
        ``node{h}.nic{i}``), -1 for every other vertex. Read-only, kept."""
        if "nic_nodes" not in self._cache:
            out = np.full(self.n_vertices, -1, dtype=np.int64)
            for v in range(self.n_ranks, self.n_vertices):
                node, dot, device = self.vertex_names[v].partition(".")
                if dot and device.startswith("nic") and node[4:].isdigit():
                    out[v] = int(node[4:])
            self._cache["nic_nodes"] = _frozen(out)
        return self._cache["nic_nodes"]

    def gpu_nics(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The NICs on each GPU's own PCIe switch (NCCL's PXN layout: one NIC, or several,
        hangs off each of some GPUs): rows ``(rank, nic, usable)``, one per PCIe link from a
        rank to a NIC, usable where that link and one of the NIC's uplinks are healthy.
        Read-only, kept."""
        if "gpu_nics" not in self._cache:
            src, dst, kind = self.link_src, self.link_dst, self.link_kind
            up = np.zeros(self.n_vertices, dtype=bool)
            up[src[np.isin(kind, (LinkKind.IB, LinkKind.ETH)) & ~self.link_failed]] = True
            k = np.flatnonzero((src < self.n_ranks) & (kind == LinkKind.PCIE)
                               & (self.nic_nodes()[dst] >= 0))
            rows = (src[k].astype(np.int64), dst[k].astype(np.int64),
                    ~self.link_failed[k] & up[dst[k]])
            self._cache["gpu_nics"] = tuple(_frozen(a) for a in rows)
        return self._cache["gpu_nics"]

    # -- groups ------------------------------------------------------------------------------
    def all_ranks(self) -> tuple[int, ...]:
        return tuple(range(self.n_ranks))

    def live_ranks(self) -> tuple[int, ...]:
        return tuple(r for r in range(self.n_ranks) if r not in self.failed_ranks)

    def _require_nodes(self, what: str) -> np.ndarray:
        if self.node_of_rank is None:
            raise TopologyError(f"'{what}' needs a topology made of nodes; "
                                f"'{self.name}' is a {self.kind_name}")
        return self.node_of_rank

    def node(self, i: int) -> tuple[int, ...]:
        """Live ranks of node ``i``."""
        nodes = self._require_nodes("node")
        if not 0 <= i < self.n_nodes:
            raise TopologyError(f"node({i}) does not exist: '{self.name}' has nodes "
                                f"0..{self.n_nodes - 1}")
        return tuple(r for r in np.flatnonzero(nodes == i).tolist() if r not in self.failed_ranks)

    def rail(self, i: int) -> tuple[int, ...]:
        """Live ranks whose NIC is on rail ``i``."""
        self._require_nodes("rail")
        if self.rail_of_rank is None or not 0 <= i <= int(self.rail_of_rank.max(initial=-1)):
            top = -1 if self.rail_of_rank is None else int(self.rail_of_rank.max(initial=-1))
            raise TopologyError(f"rail({i}) does not exist: '{self.name}' has "
                                + (f"rails 0..{top}" if top >= 0 else "no rails"))
        return tuple(r for r in np.flatnonzero(self.rail_of_rank == i).tolist()
                     if r not in self.failed_ranks)

    def leaders(self) -> tuple[int, ...]:
        """One live rank per node: the lowest-numbered live GPU of each node."""
        self._require_nodes("leaders")
        out = []
        for n in range(self.n_nodes):
            members = self.node(n)
            if members:
                out.append(members[0])
        return tuple(out)


# --------------------------------------------------------------------------------------------
# builders


class _LinkArrays(TypedDict):
    """The link columns of a :class:`Topology`, as its builders pass them on."""

    link_src: np.ndarray
    link_dst: np.ndarray
    link_bandwidth: np.ndarray
    link_latency: np.ndarray
    link_kind: np.ndarray
    link_failed: np.ndarray


class _RankArrays(TypedDict):
    """The per-rank columns of a :class:`Topology` made of nodes."""

    node_of_rank: np.ndarray
    gpu_of_rank: np.ndarray
    rail_of_rank: np.ndarray


class _LinkList:
    """Accumulates links while a builder runs; becomes read-only arrays at the end."""

    def __init__(self) -> None:
        self.src: list[int] = []
        self.dst: list[int] = []
        self.bw: list[float] = []
        self.lat: list[float] = []
        self.kind: list[int] = []

    def add(self, u: int, v: int, bw: float, lat: float, kind: LinkKind, both: bool = True) -> None:
        for a, b in ((u, v), (v, u)) if both else ((u, v),):
            self.src.append(a)
            self.dst.append(b)
            self.bw.append(bw)
            self.lat.append(lat)
            self.kind.append(int(kind))

    def arrays(self) -> _LinkArrays:
        n = len(self.src)
        return _LinkArrays(link_src=_frozen(np.array(self.src, dtype=np.int32)),
                           link_dst=_frozen(np.array(self.dst, dtype=np.int32)),
                           link_bandwidth=_frozen(np.array(self.bw, dtype=np.float64)),
                           link_latency=_frozen(np.array(self.lat, dtype=np.float64)),
                           link_kind=_frozen(np.array(self.kind, dtype=np.int8)),
                           link_failed=_frozen(np.zeros(n, dtype=bool)))


def _per_dimension(value: Sequence[float] | float, nd: int) -> list[float]:
    """One number per dimension of a torus: the same for all, or one each."""
    if isinstance(value, int | float | np.number):
        return [float(value)] * nd
    return [float(x) for x in value]


def _check_positive(what: str, value: float) -> None:
    if not value > 0:
        raise TopologyError(f"{what} must be > 0, got {value:g}")


#: the predecessor of a vertex that none reaches, and of a search's source (scipy's)
NO_PREDECESSOR = -9999


def _breadth_first(keys: np.ndarray, v: int, sources: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray]:
    """:meth:`Topology.fewest_hops` over the links ``keys`` (``tail * v + head``, sorted):
    one breadth-first search per source in scipy, on the vertices numbered backwards so
    that each vertex's out-links are scanned from the highest head down.

    scipy's Dijkstra searches did this before: on the 4,096-GPU fabric 3.1-3.9 s for its
    4,096 sources, where these take 1.2 s (the searches 0.2 s of it, the distances from
    their orders the rest). Their predecessors among paths of equal length were this
    search's on every fabric cclc ships, but they follow the order of a heap's ties, which
    scipy leaves free to change between versions. A breadth-first search puts each vertex
    after the one that reached it, so the distances follow from the order, a block of
    searches at a time: after the vertices of one level come those they reach."""
    # scipy.sparse (~0.2 s to import) only when this runs: importing the module needs no scipy
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import breadth_first_order

    back = v - 1
    graph = csr_matrix((np.ones(len(keys)), (back - keys // v, back - keys % v)),
                       shape=(v, v))
    dist = np.empty((len(sources), v))
    pred = np.empty((len(sources), v), dtype=np.int32)
    rows = max(1, _SEARCH_CELLS // max(v, 1))
    for lo in range(0, len(sources), rows):
        block = sources[lo:lo + rows].tolist()
        n = len(block)
        # each search's vertices in the order reached (backward numbers; past the vertices
        # it reaches, ``v``) and the one that reached each (by backward number; at ``v``
        # the search's own source, so that the padding reads a place), in rows of v + 1
        order = np.full((n, v), v, dtype=np.int32)
        before = np.empty((n, v + 1), dtype=np.int32)
        reached = np.empty(n, dtype=np.int64)
        for i, source in enumerate(block):
            got, before[i, :v] = breadth_first_order(graph, back - source, directed=True,
                                                     return_predecessors=True)
            order[i, :len(got)], reached[i] = got, len(got)
            before[i, v] = back - source
        # (scipy's -9999 past ``back`` once subtracted)
        got_pred = np.subtract(back, before[:, v - 1::-1], out=pred[lo:lo + n])
        got_pred[got_pred > back] = NO_PREDECESSOR
        # the place of every vertex in its search's order (``v``: reached by none), and of
        # the vertex that reached the one at each place after the first: nondecreasing
        # (first in, first out)
        row_start = ((v + 1) * np.arange(n, dtype=np.int32))[:, None]
        cell = order + row_start
        place = np.full(n * (v + 1), v, dtype=np.int32)
        place[cell] = np.arange(v, dtype=np.int32)
        parent = place[before.ravel()[cell[:, 1:]] + row_start]
        parent[order[:, 1:] == v] = v                       # (padding: after every place)
        # the vertices reached from places < hi are those up to 1 + how many parents are
        # < hi: one search of the rows' concatenation per level (rows kept apart by 2v)
        gap = 2 * v * np.arange(n, dtype=np.int64)
        flat = (parent + gap[:, None]).ravel()
        first = (v - 1) * np.arange(n, dtype=np.int64)
        starts = np.zeros((n, v + 1), dtype=np.int8)
        hi = np.ones(n, dtype=np.int64)
        while (walking := hi < reached).any():
            starts[walking, hi[walking]] = 1                # a level starts at hi
            hi = np.where(walking, 1 + np.searchsorted(flat, hi + gap) - first, hi)
        # the level of each place, ``inf`` at ``v``; each vertex's read at its place
        level = np.cumsum(starts, axis=1, dtype=np.float64)
        level[:, v] = np.inf
        # (mode "clip": "raise", the default, buffers the output; every index is in range)
        np.take(level.ravel(), place.reshape(n, v + 1)[:, v - 1::-1] + row_start,
                out=dist[lo:lo + n], mode="clip")
    return dist, pred


#: (source, vertex) cells :func:`_breadth_first` orders at once
_SEARCH_CELLS = 1 << 22


def torus(name: str, dims: Sequence[int], wrap: Sequence[bool] | None = None,
          bandwidth: Sequence[float] | float = 1e9, latency: Sequence[float] | float = 0.0,
          kind: LinkKind = LinkKind.ICI, routing: str = "source") -> Topology:
    """An N-D torus (``wrap`` true) or mesh (false) per dimension, one link each way per hop.

    ``routing`` is one of :data:`cclc.routing.TORUS_ROUTINGS`. This builder defaults to
    ``source`` (cut-through along any healthy path a schedule names: the model of the torus
    AllToAll paper and of cclc before routing was declared); the language's default for a
    torus block is ``none``, the routing of a GPU torus.

    A wrapped dimension of size 2 has a single link pair between its two ranks (as a mesh of
    2); a dimension of size 1 has no links.

    >>> t = torus("t", (5, 5))
    >>> t.n_ranks, t.n_links
    (25, 100)
    """
    if routing not in ("none", "dimension_order", "shortest", "source"):
        raise TopologyError(f"unknown torus routing '{routing}': use none, dimension_order, "
                            "shortest or source")
    dims = tuple(int(d) for d in dims)
    if not dims:
        raise TopologyError("a torus needs at least one dimension")
    for d in dims:
        _check_positive("a dimension size", d)
    wrap = tuple(True for _ in dims) if wrap is None else tuple(bool(w) for w in wrap)
    if len(wrap) != len(dims):
        raise TopologyError(f"wrap has {len(wrap)} entries but the torus has "
                            f"{len(dims)} dimensions")
    nd = len(dims)
    bws, lats = _per_dimension(bandwidth, nd), _per_dimension(latency, nd)
    for value in bws:
        _check_positive("link bandwidth", value)
    for x in lats:
        if x < 0:
            raise TopologyError(f"link latency must be >= 0, got {x:g}")
    n = math.prod(dims)
    idx = np.arange(n).reshape(dims)
    src, dst, bw, lat = [], [], [], []
    for d, size in enumerate(dims):
        if size == 1:
            continue
        plus = np.roll(idx, -1, axis=d)
        a, b = idx, plus
        if not wrap[d] or size == 2:
            # drop the wrap-around hop (for size 2 it duplicates the only hop)
            keep = [slice(None)] * nd
            keep[d] = slice(0, size - 1)
            a, b = idx[tuple(keep)], plus[tuple(keep)]
        a, b = a.ravel(), b.ravel()
        src += [a, b]
        dst += [b, a]
        bw.append(np.full(2 * len(a), bws[d]))
        lat.append(np.full(2 * len(a), lats[d]))

    def cat(xs, t):
        return np.concatenate(xs).astype(t) if xs else np.zeros(0, dtype=t)

    link_src, link_dst = cat(src, np.int32), cat(dst, np.int32)
    names = tuple("(" + ",".join(map(str, c)) + ")" for c in np.ndindex(*dims))
    return Topology(name=name, kind="torus", n_ranks=n, vertex_names=names,
                    link_src=_frozen(link_src), link_dst=_frozen(link_dst),
                    link_bandwidth=_frozen(cat(bw, np.float64)),
                    link_latency=_frozen(cat(lat, np.float64)),
                    link_kind=_frozen(np.full(len(link_src), int(kind), dtype=np.int8)),
                    link_failed=_frozen(np.zeros(len(link_src), dtype=bool)),
                    dims=dims, wrap=wrap, routing=routing)


def _check_node_type(node: NodeType) -> None:
    _check_positive(f"gpus of node type '{node.name}'", node.gpus)
    _check_positive(f"link bandwidth of node type '{node.name}'", node.bandwidth)
    if node.latency < 0:
        raise TopologyError(f"link latency of node type '{node.name}' must be >= 0")
    if node.nics < 0 or (node.nics and node.nic_bandwidth <= 0):
        raise TopologyError(f"NIC bandwidth of node type '{node.name}' must be > 0")
    _check_positive(f"NIC ports of node type '{node.name}'", node.nic_ports)


class _NodesBuilder:
    """Lays out ``n_nodes`` nodes: ranks first, then each node's switch and NICs."""

    def __init__(self, n_nodes: int, node: NodeType):
        _check_node_type(node)
        self.node = node
        self.n_nodes = n_nodes
        self.n_ranks = n_nodes * node.gpus
        self.names = [f"node{n}.gpu{g}" for n in range(n_nodes) for g in range(node.gpus)]
        self.links = _LinkList()
        self.nic_vertex: dict[tuple[int, int], int] = {}
        gpu_kind = LinkKind.NVLINK if node.interconnect == "nvswitch" else LinkKind.PCIE
        for n in range(n_nodes):
            sw = None
            if node.gpus > 1 or node.interconnect == "pcie":
                sw = self._new(f"node{n}.{node.interconnect}")
                for g in range(node.gpus):
                    # half the GPU-to-GPU latency on each side of the switch
                    self.links.add(n * node.gpus + g, sw, node.bandwidth, node.latency / 2,
                                   gpu_kind)
            for i in range(node.nics):
                nic = self._new(f"node{n}.nic{i}")
                self.nic_vertex[(n, i)] = nic
                if node.interconnect == "pcie" and sw is not None:
                    self.links.add(sw, nic, node.nic_bandwidth, 0.0, LinkKind.PCIE)
                else:
                    # the NIC sits on the PCIe switch of its affine GPU; other GPUs reach it
                    # through that GPU over NVLink (NCCL's PXN)
                    self.links.add(n * node.gpus + self.nic_gpu(i), nic, node.nic_bandwidth, 0.0,
                                   LinkKind.PCIE)

    def nic_gpu(self, i: int) -> int:
        return i * self.node.gpus // self.node.nics

    def _new(self, name: str) -> int:
        self.names.append(name)
        return len(self.names) - 1

    def rank_arrays(self, rails: int) -> _RankArrays:
        g = np.tile(np.arange(self.node.gpus), self.n_nodes)
        nics = max(self.node.nics, 1)
        return _RankArrays(
            node_of_rank=_frozen(np.repeat(np.arange(self.n_nodes), self.node.gpus)),
            gpu_of_rank=_frozen(g.astype(np.int32)),
            rail_of_rank=_frozen(((g * nics // self.node.gpus) % max(rails, 1)).astype(np.int32)))

    def finish(self, name: str, kind: Literal["fabric", "node"], rails: int) -> Topology:
        return Topology(name=name, kind=kind, n_ranks=self.n_ranks,
                        vertex_names=tuple(self.names), n_nodes=self.n_nodes, routing="ecmp",
                        multicast=self.node.multicast, **self.links.arrays(),
                        **self.rank_arrays(rails))


def single_node(name: str, node: NodeType) -> Topology:
    """One server on its own: GPUs and their NVSwitch or PCIe switch (NICs unused)."""
    b = _NodesBuilder(1, replace(node, nics=0))
    return b.finish(name, "node", rails=1)


def single_switch(name: str, n_nodes: int, node: NodeType, bandwidth: float,
                  latency: float) -> Topology:
    """``n_nodes`` servers whose NIC ports all plug into one switch."""
    _check_positive("the number of nodes", n_nodes)
    _check_positive("link bandwidth", bandwidth)
    if node.nics < 1:
        raise TopologyError(f"node type '{node.name}' has no NICs to connect to a fabric")
    b = _NodesBuilder(n_nodes, node)
    sw = b._new("switch")
    port_bw = min(node.nic_bandwidth / node.nic_ports, bandwidth)
    for nic in b.nic_vertex.values():
        b.links.add(nic, sw, port_bw * node.nic_ports, latency, LinkKind.IB)
    return b.finish(name, "fabric", rails=1)


def _check_fabric(n_nodes: int, node: NodeType, rails: int, oversubscription: float,
                  bandwidth: float, latency: float) -> None:
    _check_positive("the number of nodes", n_nodes)
    _check_positive("rails", rails)
    _check_positive("oversubscription", oversubscription)
    _check_positive("link bandwidth", bandwidth)
    if latency < 0:
        raise TopologyError(f"link latency must be >= 0, got {latency:g}")
    if node.nics < 1:
        raise TopologyError(f"node type '{node.name}' has no NICs to connect to a fabric")
    if rails > node.nics:
        raise TopologyError(f"{rails} rails need at least {rails} NICs per node; node type "
                            f"'{node.name}' has {node.nics}")


def _pod(b: _NodesBuilder, nodes: range, rails: int, leaf_v: list[int], spine_v: list[int],
         oversubscription: float, bandwidth: float, latency: float) -> np.ndarray:
    """Link ``nodes`` to their leaves and every leaf to every spine (one leaf/spine pod);
    returns the leaf-facing capacity of each spine."""
    node = b.node
    planes = rails * node.nic_ports
    if len(leaf_v) % planes:
        raise TopologyError(f"{len(leaf_v)} leaves cannot be split evenly over {rails} rails x "
                            f"{node.nic_ports} ports = {planes} planes")
    per_plane = len(leaf_v) // planes
    port_bw = min(node.nic_bandwidth / node.nic_ports, bandwidth)
    downlinks = np.zeros(len(leaf_v))
    for n in nodes:
        for i in range(node.nics):
            rail = i % rails
            for p in range(node.nic_ports):
                leaf = ((rail * node.nic_ports + p) * per_plane
                        + (n - nodes.start) * per_plane // len(nodes))
                b.links.add(b.nic_vertex[(n, i)], leaf_v[leaf], port_bw, latency, LinkKind.IB)
                downlinks[leaf] += port_bw
    spine_down = np.zeros(len(spine_v))
    for li, lv in enumerate(leaf_v):
        need = downlinks[li] / (len(spine_v) * oversubscription)
        cables = max(1, math.ceil(need / bandwidth - 1e-9))
        for si, sv in enumerate(spine_v):
            b.links.add(lv, sv, cables * bandwidth, latency, LinkKind.IB)
            spine_down[si] += cables * bandwidth
    return spine_down


def leaf_spine(name: str, n_nodes: int, node: NodeType, rails: int, leaves: int | None,
               spines: int, oversubscription: float, bandwidth: float,
               latency: float) -> Topology:
    """A rail-optimized two-level fabric.

    NIC ``i`` of every node is on rail ``i % rails``; port ``p`` of it belongs to plane
    ``rail * ports + p``; the ``leaves`` are split evenly over the planes and the nodes evenly
    over a plane's leaves. Every leaf links to every spine; a leaf-spine link aggregates the
    parallel cables of speed ``bandwidth`` needed to carry the leaf's downlinks divided by
    ``oversubscription``.
    """
    _check_fabric(n_nodes, node, rails, oversubscription, bandwidth, latency)
    _check_positive("spines", spines)
    leaves = rails * node.nic_ports if leaves is None else leaves
    _check_positive("leaves", leaves)
    b = _NodesBuilder(n_nodes, node)
    leaf_v = [b._new(f"leaf{i}") for i in range(leaves)]
    spine_v = [b._new(f"spine{i}") for i in range(spines)]
    _pod(b, range(n_nodes), rails, leaf_v, spine_v, oversubscription, bandwidth, latency)
    return b.finish(name, "fabric", rails=rails)


def fat_tree(name: str, n_nodes: int, node: NodeType, pods: int, rails: int,
             leaves: int | None, spines: int | None, cores: int | None,
             oversubscription: tuple[float, float], bandwidth: float,
             latency: float) -> Topology:
    """A rail-optimized three-tier fabric: ``pods`` leaf/spine pods joined by core switches.

    Nodes are split evenly over the pods (pod ``p`` holds nodes ``p * n_nodes / pods``
    onwards). Inside a pod, leaves and spines are laid out as by :func:`leaf_spine`, with
    ``leaves`` and ``spines`` counted *per pod* (defaults: rails x ports leaves, as many
    spines as leaves) and numbered across the fabric: pod ``p`` holds ``leaf(p * leaves)``
    onwards. The ``cores`` (default: as many as spines per pod) form ``spines`` equal groups;
    spine ``j`` of every pod links to every core of group ``j`` (the three-level fat tree of
    Al-Fares, Loukissas and Vahdat, SIGCOMM 2008), so a flow between pods picks a spine
    position ``j`` and a core of group ``j``.

    ``oversubscription`` is ``(leaf -> spine, spine -> core)``: a leaf's uplinks carry its
    downlinks divided by the first, a spine's core uplinks its leaf-facing capacity divided
    by the second; each link aggregates the parallel cables of speed ``bandwidth`` needed.

    >>> hgx = NodeType("hgx", "nvswitch", 8, 450e9, 1e-6, nics=8, nic_bandwidth=50e9)
    >>> t = fat_tree("c", 4, hgx, pods=2, rails=8, leaves=None, spines=2, cores=4,
    ...              oversubscription=(1, 2), bandwidth=50e9, latency=2e-6)
    >>> t.vertex_names[-4:], t.pod_of_node.tolist()
    (('core0', 'core1', 'core2', 'core3'), [0, 0, 1, 1])
    """
    down_ratio, core_ratio = oversubscription
    _check_fabric(n_nodes, node, rails, down_ratio, bandwidth, latency)
    _check_positive("pods", pods)
    _check_positive("spine -> core oversubscription", core_ratio)
    if n_nodes % pods:
        raise TopologyError(f"{n_nodes} nodes cannot be split evenly over {pods} pods")
    leaves = rails * node.nic_ports if leaves is None else leaves
    spines = leaves if spines is None else spines
    cores = spines if cores is None else cores
    for what, count in (("leaves", leaves), ("spines", spines), ("cores", cores)):
        _check_positive(what, count)
    if cores % spines:
        raise TopologyError(f"{cores} cores cannot be split evenly over the {spines} spines of "
                            "a pod (spine j of every pod links to core group j)")
    per_pod, group = n_nodes // pods, cores // spines
    b = _NodesBuilder(n_nodes, node)
    leaf_v = [b._new(f"leaf{i}") for i in range(pods * leaves)]
    spine_v = [b._new(f"spine{i}") for i in range(pods * spines)]
    core_v = [b._new(f"core{i}") for i in range(cores)]
    for p in range(pods):
        pod_spines = spine_v[p * spines:(p + 1) * spines]
        spine_down = _pod(b, range(p * per_pod, (p + 1) * per_pod), rails,
                          leaf_v[p * leaves:(p + 1) * leaves], pod_spines, down_ratio,
                          bandwidth, latency)
        for j, sv in enumerate(pod_spines):
            cables = max(1, math.ceil(spine_down[j] / (group * core_ratio) / bandwidth - 1e-9))
            for cv in core_v[j * group:(j + 1) * group]:
                b.links.add(sv, cv, cables * bandwidth, latency, LinkKind.IB)
    return replace(b.finish(name, "fabric", rails=rails),
                   pod_of_node=_frozen(np.repeat(np.arange(pods), per_pod)))


def with_faults(topo: Topology, links: Iterable[tuple[int, int]] = (),
                ranks: Iterable[int] = (),
                groups: Iterable[tuple[str, Iterable[tuple[int, int]]]] = (),
                devices: Iterable[int] = ()) -> Topology:
    """``topo`` with the directed ``links`` failed, the ``ranks`` (and all their links) failed,
    and the ``devices`` (switches and NICs: vertices that are not ranks) failed with every
    link into or out of them (``fault switch``, ``fault nic``).

    ``groups`` are named sets of directed links that fail together (an optical circuit switch);
    their links fail and the group is remembered for reports. :class:`TopologyError` names a
    link that does not exist.
    """
    failed = topo.link_failed.copy()
    group_list = list(topo.fault_groups)
    for gname, glinks in groups:
        ids = []
        for u, v in glinks:
            ids.append(_find_link(topo, u, v))
        failed[ids] = True
        group_list.append((gname, tuple(ids)))
    for u, v in links:
        failed[_find_link(topo, u, v)] = True
    for device in devices:
        if not topo.n_ranks <= device < topo.n_vertices:
            raise TopologyError(f"vertex {device} of '{topo.name}' is not a switch or NIC")
        failed |= (topo.link_src == device) | (topo.link_dst == device)
    dead = set(topo.failed_ranks)
    for r in ranks:
        if not 0 <= r < topo.n_ranks:
            raise TopologyError(f"rank {r} does not exist in '{topo.name}'")
        dead.add(int(r))
    if dead:
        d = np.array(sorted(dead))
        failed |= np.isin(topo.link_src, d) | np.isin(topo.link_dst, d)
    return replace(topo, link_failed=_frozen(failed), failed_ranks=frozenset(dead),
                   fault_groups=tuple(group_list), _cache={})


def _find_link(topo: Topology, u: int, v: int) -> int:
    link = topo.link_id(u, v)
    if link is None:
        raise TopologyError(f"there is no link {topo.vertex_names[u]} -> {topo.vertex_names[v]} "
                            f"in '{topo.name}'")
    return link
