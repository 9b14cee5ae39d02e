"""Declared routing: which paths the machine's network can carry a message over by itself.

A topology declares how its network forwards a message (``routing`` in a torus, mesh or
fabric block). A route in a schedule is *carried* when that routing would send the message
along exactly those links; any other route must be broken into relays through intermediate
ranks (:mod:`cclc.relay`) before a backend sees it.

``none``
    Point-to-point links and no router: a GPU torus joined by NVLink or by cables between
    NICs. A message only reaches a neighbour; anything farther is relayed by GPUs. The default
    of a torus or mesh, because a torus of GPUs has no router that forwards for it.
``dimension_order``
    A router per chip that corrects dimension 0 first, then 1, ..., each by the shorter way
    round (the positive way on a tie): the deterministic routing of TPU-style torus
    interconnects and of the Blue Gene/L and Cray torus networks in their default mode. It
    cannot avoid a failed link; a path over one has to be relayed around it.
``shortest``
    Minimal adaptive routing that knows the faults: any fewest-hop path over healthy links.
``source``
    Source routing: each message carries its path and is forwarded cut-through along any
    healthy path the schedule names (as Myrinet did). The model the torus AllToAll paper's
    simulator assumes, and the default of the Python ``torus()`` builder, so studies that
    reproduce the paper say so; not a default of the language.
``ecmp``
    Switched fabrics with equal-cost multipath: a fewest-hop path over healthy links, the
    spine chosen by a hash of the flow (priced by :func:`cclc.fabric_routing.ecmp_routes`).
    The default of a fabric and of a single node.
``adaptive``
    A switched fabric whose switches pick the least-loaded fewest-hop path per packet.
"""

from __future__ import annotations

import numpy as np

from cclc.ir import Routes
from cclc.topology import Topology

__all__ = ["FABRIC_ROUTINGS", "TORUS_ROUTINGS", "FewestHopPaths", "carried_routes",
           "carried_segments", "through_ranks",
           "describe", "hop_distance"]

#: routings a torus or mesh may declare (the first is the default)
TORUS_ROUTINGS = ("none", "dimension_order", "shortest", "source")
#: routings a fabric or node may declare (the first is the default)
FABRIC_ROUTINGS = ("ecmp", "adaptive")

_DESCRIPTIONS = {
    "none": "point-to-point links, multi-hop moves relayed by ranks",
    "dimension_order": "dimension-order routers (cannot avoid a failed link)",
    "shortest": "minimal adaptive routing around faults",
    "source": "source routing along any healthy path",
    "ecmp": "ECMP hashing over fewest-hop paths",
    "adaptive": "adaptive routing over fewest-hop paths",
}


def describe(routing: str) -> str:
    """One line saying what a routing can carry (for reports)."""
    return _DESCRIPTIONS[routing]


def hop_distance(topo: Topology, sources: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Fewest healthy hops from each of ``sources`` to the matching entry of ``targets``
    (``inf`` where there is no path; no path passes a failed rank)."""
    v = topo.n_vertices
    # the distinct sources and the row of each, by counting (vertices are few; np.unique
    # sorted the 33M route ends of a 4,096-rank alltoall: 6 s)
    sources = np.asarray(sources, dtype=np.int64)
    rows = np.flatnonzero(np.bincount(sources, minlength=v))
    row_of = np.zeros(v, dtype=np.int64)
    row_of[rows] = np.arange(len(rows))
    # the topology keeps the searches: the relay pass and the verifier of every candidate,
    # and the routes of the pairs, ask for the same rows (3.7 s for 4,096 sources on a
    # 4,096-GPU fabric)
    return topo.fewest_hops(rows)[0][row_of[sources], targets]


def _link_geometry(topo: Topology) -> tuple[np.ndarray, np.ndarray]:
    """Per torus link: its dimension and direction (+1 towards the next coordinate)."""
    if "link_geometry" not in topo._cache:
        dims = np.array(topo.dims)
        cs = np.array(np.unravel_index(topo.link_src, topo.grid_dims)).T
        cd = np.array(np.unravel_index(topo.link_dst, topo.grid_dims)).T
        dim = np.argmax(cs != cd, axis=1) if len(cs) else np.zeros(0, dtype=np.int64)
        rows = np.arange(len(dim))
        wraps = (np.array(topo.wrap) & (dims > 2))[dim]
        a, b = cs[rows, dim], cd[rows, dim]
        # on a ring the +1 neighbour wraps around; on a line (or a pair) it is just larger
        sign = np.where(np.where(wraps, (a + 1) % dims[dim] == b, b > a), 1, -1)
        topo._cache["link_geometry"] = (dim, sign)
    return topo._cache["link_geometry"]


def _dor_moves(topo: Topology, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per (src, dst) pair and dimension: hops and direction of the dimension-order path."""
    dims = np.array(topo.dims)
    wrap = np.array(topo.wrap) & (dims > 2)
    cs = np.array(np.unravel_index(src, topo.grid_dims)).T
    cd = np.array(np.unravel_index(dst, topo.grid_dims)).T
    fwd = (cd - cs) % dims
    # a wrapped dimension goes the shorter way round, the positive way on a tie; a mesh
    # dimension (or one of size 2, which has a single link pair) goes straight
    go_up = np.where(wrap, fwd <= dims - fwd, cd >= cs)
    hops = np.where(wrap, np.minimum(fwd, dims - fwd), np.abs(cd - cs))
    return hops, np.where(go_up, 1, -1)


def carried_routes(topo: Topology, routes: Routes, routing: str | None = None) -> np.ndarray:
    """Boolean per route: whether ``routing`` (the topology's by default) carries it.

    Only routes whose links exist, chain and are healthy are meaningful here; the verifier
    checks those properties first. The empty route 0 counts as carried. The answer is kept on
    ``routes`` for ``topo`` (read-only): the relay pass and the verifier ask it of one table.
    """
    routing = topo.routing if routing is None else routing
    key = ("carried", id(topo), routing)
    if key not in routes._cache:
        ok = _carried_routes(topo, routes, routing)
        ok.setflags(write=False)
        # (the topology is kept beside the answer: its id stays its own while the key lives)
        routes._cache[key] = (topo, ok)
    return routes._cache[key][1]


def _carried_routes(topo: Topology, routes: Routes, routing: str) -> np.ndarray:
    lengths = routes.lengths()
    ok = np.ones(len(routes), dtype=bool)
    nonempty = np.flatnonzero(lengths > 0)
    if not len(nonempty):
        return ok
    links = routes.links           # (indexes as it is: an int64 copy of 84M links is 670 MB)
    first = topo.link_src[links[routes.offsets[:-1][nonempty]]].astype(np.int64)
    last = topo.link_dst[links[routes.offsets[1:][nonempty] - 1]].astype(np.int64)
    if routing == "source":
        pass
    elif routing == "none":
        ok[nonempty] = lengths[nonempty] == 1
    elif routing in ("shortest", "ecmp", "adaptive"):
        ok[nonempty] = lengths[nonempty] == hop_distance(topo, first, last)
    elif routing == "dimension_order":
        hops, sign = _dor_moves(topo, first, last)
        ldim, lsign = _link_geometry(topo)
        route_of = np.repeat(np.arange(len(routes)), lengths)
        pos = np.searchsorted(nonempty, route_of)          # row of each link's route
        d = ldim[links]
        good = lsign[links] == sign[pos, d]
        # dimensions are corrected in order: a link never goes back to a lower dimension
        same_route = route_of[1:] == route_of[:-1]
        good[1:] &= ~same_route | (d[1:] >= d[:-1])
        bad_routes = np.unique(route_of[~good])
        ok[nonempty] = lengths[nonempty] == hops.sum(axis=1)
        ok[bad_routes] = False
    else:
        raise ValueError(f"unknown routing '{routing}'")
    return ok


def through_ranks(topo: Topology, offsets: np.ndarray, links: np.ndarray) -> np.ndarray:
    """Boolean per path of the CSR table ``offsets``/``links``: whether a rank lies inside it
    (the head of a link other than its last), so that the GPU there forwards it (NCCL's PXN
    over NVLink to another GPU's NIC, or a relay)."""
    lengths = np.diff(offsets)
    inner = topo.link_dst[links] < topo.n_ranks
    inner[offsets[1:][lengths > 0] - 1] = False          # a path's end is its own
    out = np.zeros(len(lengths), dtype=bool)
    out[np.repeat(np.arange(len(lengths)), lengths)[inner]] = True
    return out


def carried_segments(topo: Topology, path: tuple[int, ...]) -> list[tuple[int, ...]]:
    """``path`` cut into the fewest pieces, greedily from its start, that the topology's
    routing carries one by one; the cut points are where a rank must relay."""
    out: list[tuple[int, ...]] = []
    i = 0
    while i < len(path):
        # the longest carried prefix of what is left (a single link is always carried:
        # under every routing a healthy link between neighbours is a fewest-hop path)
        # a cut must fall on a rank: switches forward but do not store and forward
        candidates = [path[i:j] for j in range(len(path), i, -1)
                      if j == len(path) or topo.link_dst[path[j - 1]] < topo.n_ranks]
        offs = np.concatenate([[0, 0], np.cumsum([len(c) for c in candidates])])
        ok = carried_routes(topo, Routes(offs, np.concatenate(candidates)))[1:]
        best = candidates[int(np.argmax(ok))] if ok.any() else path[i:i + 1]
        out.append(best)
        i += len(best)
    return out


#: (source, vertex) cells whose predecessor links :class:`FewestHopPaths` looks up at once
_CELL_BLOCK = 1 << 21

#: paths :meth:`FewestHopPaths.write` walks at once
_WALK_BLOCK = 1 << 18


class FewestHopPaths:
    """Fewest-hop paths over healthy links from each vertex of ``sources`` to every vertex,
    read back from the topology's breadth-first searches (:meth:`Topology.fewest_hops`, kept
    there) for many paths at once: a path is a (source row, end vertex) pair, and the walk
    goes a block of paths at a time (at 4,096 GPUs 16.7M paths of up to 8 hops: whole-table
    temporaries would be fresh memory at every hop, which costs more than the lookups).
    :meth:`of` keeps one per topology and source list (every build of a compile asks)."""

    @classmethod
    def of(cls, topo: Topology, sources: np.ndarray) -> FewestHopPaths:
        """The paths from ``sources`` on ``topo``, made once (kept in the topology's cache)."""
        sources = np.ascontiguousarray(sources, dtype=np.int64)
        key = ("fewest_hop_paths", sources.tobytes())
        if key not in topo._cache:
            topo._cache[key] = cls(topo, sources)
        return topo._cache[key]

    def __init__(self, topo: Topology, sources: np.ndarray):
        self.sources = np.ascontiguousarray(sources, dtype=np.int64)
        self.keys, self.links = topo.hop_links()
        self.v = v = topo.n_vertices
        self.dist, self.pred = topo.fewest_hops(self.sources)
        # the link into every vertex from its predecessor, looked up once for all paths, a
        # block of sources at a time (at 4,096 sources the whole table's temporaries are
        # 1.2 GB of fresh memory)
        into = np.full(self.pred.shape, -1, dtype=np.int32)
        heads = np.arange(v, dtype=np.int64)
        rows = max(1, _CELL_BLOCK // max(v, 1))
        for lo in range(0, len(self.pred), rows):
            pred = self.pred[lo:lo + rows]
            has = pred >= 0
            cells = pred[has] * v + np.broadcast_to(heads, pred.shape)[has]
            into[lo:lo + rows][has] = self.links[np.searchsorted(self.keys, cells)]
        self.into = into

    def hops(self, rows: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """Hops of each path (source row ``rows[i]`` to vertex ``ends[i]``): float, ``inf``
        where none."""
        return self.dist.reshape(-1)[rows.astype(np.int64) * self.v + ends]

    def write(self, rows: np.ndarray, ends: np.ndarray, out: np.ndarray,
              last_at: np.ndarray, avoid: np.ndarray | None = None) -> np.ndarray:
        """Write each path's links into ``out``, its last link at ``last_at[i]`` and the
        others before it (the caller lays the paths out from :meth:`hops`; every path must
        exist). ``avoid``: a boolean per vertex; returns which paths pass through one (not
        counting their two ends), all False without it."""
        crosses = np.zeros(len(rows), dtype=bool)
        pred, into = self.pred.reshape(-1), self.into.reshape(-1)
        for lo in range(0, len(rows), _WALK_BLOCK):
            # every path written from its end back to its source; the walk keeps only the
            # paths still walking
            row = rows[lo:lo + _WALK_BLOCK].astype(np.int64) * self.v
            start = self.sources[rows[lo:lo + _WALK_BLOCK]]
            at = last_at[lo:lo + _WALK_BLOCK]
            which = np.arange(lo, lo + len(row))
            cell = row + ends[lo:lo + _WALK_BLOCK]
            walking = cell != row + start
            at, start, row, which, cell = (x[walking] for x in (at, start, row, which, cell))
            while len(cell):
                out[at] = into[cell]
                prev = pred[cell]
                walking = prev != start
                if avoid is not None:
                    crosses[which[walking & avoid[np.maximum(prev, 0)]]] = True
                at, start, row, which = at[walking] - 1, start[walking], row[walking], \
                    which[walking]
                cell = row + prev[walking]
        return crosses
