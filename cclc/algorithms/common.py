"""Helpers every algorithm shares: group indexing, ring embeddings, routes in bulk, block layouts.

Algorithms think in *group indices* (0..n-1, what the IR's ``src``/``dst`` hold) and route over
*global* vertices and link ids. The route helpers here take many (source, destination) pairs at
once and return a CSR table, so a 4096-rank alltoall (16.7M pairs) never loops in Python per pair:
on a torus, dimension-order routes are computed arithmetically from a ``(rank, dim, direction)``
link table; only pairs whose route hits a failed link fall back to a BFS path.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np

from cclc.collective import Collective
from cclc.errors import CollectiveError
from cclc.ir import ScheduleBuilder, even_split
from cclc.routing import FewestHopPaths
from cclc.topology import Topology

__all__ = [
    "MANY_RANKS",
    "PairRouter",
    "add_pair_routes",
    "chunks_reason",
    "even_split",
    "group_index",
    "hint_int",
    "pair_distance",
    "pair_hops",
    "pair_ops",
    "pair_router",
    "ring_order",
    "route_table",
    "snake_order",
    "torus_link_table",
    "torus_routes",
]


def group_index(coll: Collective) -> np.ndarray:
    """``index[r]`` = group index of global rank ``r``, or -1 when ``r`` is not in the group."""
    idx = np.full(coll.topology.n_ranks, -1, dtype=np.int64)
    idx[np.asarray(coll.group, dtype=np.int64)] = np.arange(coll.n)
    return idx


def snake_order(dims: Sequence[int]) -> np.ndarray:
    """The ranks of a ``dims`` grid in boustrophedon order (a reflected mixed-radix Gray code).

    Consecutive entries differ by one step in one coordinate, so on a torus every hop of the
    order is a single link. Coordinate ``d`` runs backwards whenever the number formed by the
    coordinates before it is odd.

    >>> snake_order((2, 3)).tolist()
    [0, 1, 2, 5, 4, 3]
    """
    dims = tuple(int(d) for d in dims)
    n = int(np.prod(dims))
    k = np.arange(n)
    digits = np.unravel_index(k, dims)
    coords = []
    prefix = np.zeros(n, dtype=np.int64)
    for d, size in enumerate(dims):
        a = digits[d]
        coords.append(np.where(prefix % 2 == 1, size - 1 - a, a))
        prefix = prefix * size + a
    return np.ravel_multi_index(tuple(coords), dims).astype(np.int64)


def ring_order(coll: Collective) -> np.ndarray:
    """Group indices in the order a ring visits them.

    On a torus whose whole live set is the group, the snake order (failed ranks skipped), so
    consecutive members are neighbours; otherwise group order (the user's order is usually the
    locality order: node by node on a fabric).
    """
    topo = coll.topology
    if coll.n > 1 and topo_is_plain_torus(topo) and set(coll.group) == set(topo.live_ranks()):
        idx = group_index(coll)
        best, best_cost = None, None
        # a snake exists for every order of the dimensions and runs either way round; keep
        # the one with the fewest hops that are not a single healthy link (faults, closure)
        for perm in itertools.permutations(range(len(topo.grid_dims))):
            ranks = _permuted_snake(topo.grid_dims, perm)
            ranks = ranks[idx[ranks] >= 0]
            for cand in (ranks, ranks[::-1]):
                cost = int((~_single_healthy_hop(topo, cand, np.roll(cand, -1))).sum())
                if best_cost is None or cost < best_cost:
                    best, best_cost = cand, cost
            if best_cost == 0:
                break
        return idx[best]
    return np.arange(coll.n, dtype=np.int64)


def _permuted_snake(dims: Sequence[int], perm: Sequence[int]) -> np.ndarray:
    """The snake through ``dims`` that varies dimension ``perm[-1]`` fastest."""
    pdims = tuple(dims[d] for d in perm)
    pcoords = np.unravel_index(snake_order(pdims), pdims)
    coords = tuple(pcoords[i] for i in np.argsort(perm))      # dimension d is perm's i-th
    return np.asarray(np.ravel_multi_index(coords, tuple(dims)), dtype=np.int64)


def _single_healthy_hop(topo: Topology, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """Whether each ``src -> dst`` is one healthy link of the torus."""
    links = torus_link_table(topo)[src]  # (k, D, 2)
    safe = np.where(links >= 0, links, 0)
    ok = (links >= 0) & ~topo.link_failed[safe] & (topo.link_dst[safe] == dst[:, None, None])
    return ok.any(axis=(1, 2)) | (src == dst)


def torus_link_table(topo: Topology) -> np.ndarray:
    """``table[rank, dim, dir]``: the link from ``rank`` one step in ``dim`` (dir 0: +, 1: -).

    -1 where there is no such link (mesh edges, size-1 dimensions). A wrapped dimension of size
    2 has one link each way, which serves as both + and -. Failed links are still listed.
    """
    key = "cclc.algorithms.link_table"
    if key in topo._cache:
        return topo._cache[key]
    dims = np.asarray(topo.dims, dtype=np.int64)
    nd = len(dims)
    table = np.full((topo.n_ranks, nd, 2), -1, dtype=np.int32)
    src = topo.link_src.astype(np.int64)
    dst = topo.link_dst.astype(np.int64)
    cs = np.stack(np.unravel_index(src, tuple(dims)), axis=1)
    cd = np.stack(np.unravel_index(dst, tuple(dims)), axis=1)
    diff = cd - cs
    dim = np.argmax(diff != 0, axis=1)
    links = np.arange(topo.n_links, dtype=np.int32)
    delta = diff[np.arange(len(src)), dim] % dims[dim]
    plus = delta == 1
    minus = delta == dims[dim] - 1
    table[src[plus], dim[plus], 0] = links[plus]
    table[src[minus], dim[minus], 1] = links[minus]
    table.setflags(write=False)
    topo._cache[key] = table
    return table


def _torus_displacements(topo: Topology, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """Signed hop counts per dimension ``(len(src), D)`` of the shortest torus route.

    A wrapped dimension goes the short way round; the antipode of an even ring (a tie) goes +
    from even coordinates and - from odd ones, so both directions carry half the ties.
    """
    dims = topo.grid_dims
    cs = np.unravel_index(src, dims)
    cd = np.unravel_index(dst, dims)
    out = np.empty((len(src), len(dims)), dtype=np.int64)
    for d, (size, wrap) in enumerate(zip(dims, topo.grid_wrap, strict=True)):
        diff = cd[d].astype(np.int64) - cs[d]
        if wrap and size > 2:
            fwd = diff % size
            back = fwd - size
            tie = 2 * fwd == size
            go_fwd = (2 * fwd < size) | (tie & (cs[d] % 2 == 0))
            diff = np.where(go_fwd, fwd, back)
        out[:, d] = diff
    return out


def torus_routes(topo: Topology, src: np.ndarray, dst: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Dimension-order routes (dimension 0 first) for many global rank pairs, as CSR.

    Returns ``(offsets, links)``: route ``i`` is ``links[offsets[i]:offsets[i+1]]``. Routes of
    pairs with ``src == dst`` are empty. Links may be failed; see :func:`route_table`.
    """
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    table = torus_link_table(topo)
    disp = _torus_displacements(topo, src, dst)
    hops = np.abs(disp)
    lengths = hops.sum(axis=1)
    offsets = np.zeros(len(src) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    links = np.empty(int(offsets[-1]), dtype=np.int32)
    strides = np.cumprod((1,) + tuple(topo.grid_dims[:0:-1]))[::-1]
    written = offsets[:-1].copy()
    cur = src.copy()
    for d, size in enumerate(topo.grid_dims):
        h = hops[:, d]
        if not h.any():
            continue
        direction = (disp[:, d] < 0).astype(np.int64)
        step = np.where(direction == 0, 1, -1)
        coord = (cur // strides[d]) % size
        active = np.flatnonzero(h > 0)
        for k in range(int(h.max())):
            if k:
                active = active[h[active] > k]
            r = cur[active]
            links[written[active]] = table[r, d, direction[active]]
            written[active] += 1
            c = coord[active]
            nc = (c + step[active]) % size
            cur[active] = r + (nc - c) * strides[d]
            coord[active] = nc
    return offsets, links


def route_table(topo: Topology, src: np.ndarray, dst: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray]:
    """Shortest healthy routes for many global vertex pairs, as CSR ``(offsets, links)``.

    Tori use dimension-order routes; a pair whose route crosses a failed link (or a failed
    rank) gets a fewest-hop path over healthy links instead. Other topologies use BFS paths,
    computed once per distinct pair.
    """
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    if topo.dims is not None and topo.n_vertices == topo.n_ranks:
        offsets, links = torus_routes(topo, src, dst)
        if not topo.link_failed.any():
            return offsets, links
        bad_link = topo.link_failed[links]
        if not bad_link.any():
            return offsets, links
        owner = np.repeat(np.arange(len(src)), np.diff(offsets))
        bad = np.zeros(len(src), dtype=bool)
        bad[owner[bad_link]] = True
        return _patch_routes(topo, src, dst, offsets, links, np.flatnonzero(bad))
    return _bfs_routes(topo, src, dst)


def _bfs_routes(topo: Topology, src: np.ndarray, dst: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray]:
    pairs = np.stack([src, dst], axis=1)
    uniq, inverse = np.unique(pairs, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    paths = [topo.shortest_path_links(int(u), int(v)) for u, v in uniq.tolist()]
    lengths = np.array([len(p) for p in paths], dtype=np.int64)[inverse]
    offsets = np.zeros(len(src) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = [np.asarray(paths[i], dtype=np.int32) for i in inverse.tolist()]
    links = np.concatenate(flat) if flat else np.zeros(0, dtype=np.int32)
    return offsets, links.astype(np.int32)


def _patch_routes(topo: Topology, src, dst, offsets, links, bad: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Replace the routes of pairs ``bad`` by healthy BFS paths (rebuilding the CSR)."""
    new_paths = {int(i): np.asarray(topo.shortest_path_links(int(src[i]), int(dst[i])),
                                    dtype=np.int32) for i in bad.tolist()}
    lengths = np.diff(offsets)
    new_lengths = lengths.copy()
    for i, p in new_paths.items():
        new_lengths[i] = len(p)
    new_offsets = np.zeros_like(offsets)
    np.cumsum(new_lengths, out=new_offsets[1:])
    new_links = np.empty(int(new_offsets[-1]), dtype=np.int32)
    keep = np.ones(len(src), dtype=bool)
    keep[bad] = False
    # copy every kept route's links to its new position in one vectorized gather
    kept_owner = np.repeat(np.arange(len(src)), np.where(keep, lengths, 0))
    pos_in_route = np.arange(len(kept_owner)) - np.repeat(
        np.cumsum(np.where(keep, lengths, 0)) - np.where(keep, lengths, 0),
        np.where(keep, lengths, 0))
    new_links[new_offsets[kept_owner] + pos_in_route] = links[offsets[kept_owner] + pos_in_route]
    for i, p in new_paths.items():
        new_links[new_offsets[i]:new_offsets[i + 1]] = p
    return new_offsets, new_links


def pair_router(coll: Collective) -> PairRouter:
    """The :class:`PairRouter` of ``coll``'s group on its topology, made once per topology
    and group (kept in the topology's cache: every step of every candidate routes with it)."""
    topo = coll.topology
    key = ("pair_router", tuple(coll.group))
    if key not in topo._cache:
        topo._cache[key] = PairRouter(coll)
    return topo._cache[key]


#: pairs whose hop counts :meth:`PairRouter.ids` reads at once
_HOPS_BLOCK = 1 << 20


class PairRouter:
    """Fewest-hop routes over healthy links for many group-index pairs at once: one
    breadth-first search per group member in scipy
    (:meth:`cclc.topology.Topology.shortest_path_links` runs one in networkx per source and
    keeps every path: 19 of 21 s of a 1,024-rank build, minutes and gigabytes at 4,096
    ranks), the paths read back from the predecessors for all pairs together
    (:class:`cclc.routing.FewestHopPaths`). Among paths of equal length the choice may differ
    from networkx's; on a fabric the routing pass (:func:`cclc.fabric_routing.route_spines`)
    replans the spine and core hops anyway."""

    def __init__(self, coll: Collective):
        topo = coll.topology
        self.names = topo.vertex_names
        self.group = np.asarray(coll.group, dtype=np.int64)
        self.paths = FewestHopPaths.of(topo, self.group)
        self.keys, self.links, self.v = self.paths.keys, self.paths.links, self.paths.v
        self.hops, self.pred = self.paths.dist, self.paths.pred

    def ids(self, b: ScheduleBuilder, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """Route ids (added to builder ``b``) of group-index pairs ``src -> dst``; 0 where
        equal."""
        ids = np.zeros(len(src), dtype=np.int32)
        remote = np.flatnonzero(src != dst)
        if not len(remote):
            return ids
        n = len(self.group)
        key = src[remote].astype(np.int64) * n + dst[remote]
        if (key[1:] > key[:-1]).all():
            # distinct pairs in order already (every pair of an alltoall): no sort
            pairs, inverse = key, None
        else:
            pairs, inverse = np.unique(key, return_inverse=True)
        del key
        # (32-bit: at 4,096 GPUs every entry is one of 16.7M, and fresh memory is the cost)
        u = (pairs // n).astype(np.int32)
        end = self.group[pairs % n].astype(np.int32)
        del pairs
        offsets = np.zeros(len(u) + 1, dtype=np.int64)
        for lo in range(0, len(u), _HOPS_BLOCK):
            hops = self.paths.hops(u[lo:lo + _HOPS_BLOCK], end[lo:lo + _HOPS_BLOCK])
            self._check_paths(u[lo:], end[lo:], hops)   # (the walk trusts them)
            offsets[lo + 1:lo + 1 + len(hops)] = hops
        np.cumsum(offsets, out=offsets)
        links = np.empty(int(offsets[-1]), dtype=np.int32)
        self.paths.write(u, end, links, offsets[1:] - 1)
        route = b.add_routes(offsets, links)
        ids[remote] = route if inverse is None else route[inverse.reshape(-1)]
        return ids

    def _check_paths(self, u: np.ndarray, end: np.ndarray, hops: np.ndarray) -> None:
        """:class:`CollectiveError` where a pair (group row ``u``, vertex ``end``) has no
        healthy path."""
        none = ~np.isfinite(hops)
        if none.any():
            bad = int(np.flatnonzero(none)[0])
            raise CollectiveError(f"no healthy path from {self.names[self.group[u[bad]]]} "
                                  f"to {self.names[end[bad]]}")


def add_pair_routes(builder: ScheduleBuilder, coll: Collective, src: np.ndarray,
                    dst: np.ndarray) -> np.ndarray:
    """Route ids (in ``builder``) for group-index pairs ``src -> dst``; 0 where ``src == dst``."""
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    topo = coll.topology
    torus = topo_is_plain_torus(topo)
    if not torus and topo.n_ranks > MANY_RANKS:
        return pair_router(coll).ids(builder, src, dst)
    group = np.asarray(coll.group, dtype=np.int64)
    ids = np.zeros(len(src), dtype=np.int32)
    remote = np.flatnonzero(src != dst)
    if not len(remote):
        return ids
    gs, gd = group[src[remote]], group[dst[remote]]
    if torus:
        # every pair has its own route on a torus; build them in blocks to bound temporaries
        for lo in range(0, len(remote), _ROUTE_BLOCK):
            hi = min(lo + _ROUTE_BLOCK, len(remote))
            offsets, links = route_table(topo, gs[lo:hi], gd[lo:hi])
            ids[remote[lo:hi]] = builder.add_routes(offsets, links)
        return ids
    # elsewhere paths come from BFS, one per distinct pair; the builder deduplicates them
    pairs, inverse = np.unique(np.stack([gs, gd], axis=1), axis=0, return_inverse=True)
    pair_ids = builder.routes(*topo.shortest_path_table(pairs[:, 0], pairs[:, 1]))
    ids[remote] = pair_ids[inverse.reshape(-1)]
    return ids


#: ranks above which :func:`add_pair_routes` routes through :class:`PairRouter` off a torus
#: (a networkx search per source up to here: the paths every schedule of this size had
#: before; at 4,096 ranks they take 50 ms per source, 200 s per candidate)
MANY_RANKS = 1024

#: pairs routed per block on a torus (bounds the temporaries of :func:`torus_routes`)
_ROUTE_BLOCK = 1 << 20


def topo_is_plain_torus(topo: Topology) -> bool:
    """A torus or mesh whose vertices are all ranks (no switches)."""
    return topo.dims is not None and topo.n_vertices == topo.n_ranks


def pair_ops(coll: Collective) -> int:
    """A lower bound on the ops of a schedule that moves one block per op between every
    ordered pair of the group (direct, ring, biring, foldedring): ``n (n - 1)``."""
    return coll.n * (coll.n - 1)


def pair_hops(coll: Collective) -> int:
    """A lower bound on the ops of a schedule that moves every ordered pair's block in ops of
    one block each, once relay lowering (:mod:`cclc.relay`) has cut the moves the routing does
    not carry into single hops: :func:`pair_distance` on a torus with routing ``none``,
    elsewhere :func:`pair_ops`."""
    if coll.topology.routing != "none":
        return pair_ops(coll)
    return pair_distance(coll)


def pair_distance(coll: Collective) -> int:
    """A lower bound on the links that every ordered pair's block crosses, together: on a
    torus of ranks with the whole torus in the group, the sum of every pair's hop distance
    (faults only lengthen routes), in closed form; elsewhere :func:`pair_ops` (a link each).
    It bounds the ops of a schedule that moves blocks hop by hop between neighbours, and the
    route links of one that sends every pair's block over a route."""
    topo = coll.topology
    n = coll.n
    if not (topo_is_plain_torus(topo) and n == topo.n_ranks):
        return pair_ops(coll)
    # mean distance between two coordinates drawn independently, summed over the dimensions:
    # on a ring of m, min(x, m - x) averaged over x; on a line, (m^2 - 1) / 3m
    mean = 0.0
    for m, wrap in zip(topo.grid_dims, topo.grid_wrap, strict=True):
        mean += (sum(min(x, m - x) for x in range(m)) / m) if wrap else (m * m - 1) / (3 * m)
    # n^2 mean is the sum over ordered pairs (a rank's distance to itself is 0); rounding
    # down keeps it a lower bound
    return max(pair_ops(coll), int(n * n * mean * (1 - 1e-12)))


def chunks_reason(coll: Collective, params: dict, elements: int, what: str) -> str | None:
    """Why hint parameter ``chunks`` cannot cut ``elements`` elements (``what`` names them,
    e.g. 'the buffer'), or ``None``: every chunk needs at least one element."""
    chunks = params.get("chunks")
    if isinstance(chunks, float) and chunks.is_integer():
        chunks = int(chunks)
    if isinstance(chunks, int) and not isinstance(chunks, bool) and chunks > elements:
        return (f"chunks = {chunks} is more chunks than {what} has elements ({elements} of "
                f"{coll.dtype.value}); use at most chunks = {max(1, elements)}")
    return None


def hint_int(params: dict, key: str, default: int | None, low: int = 1) -> int | None:
    """Integer hint parameter ``key`` (e.g. ``chunks=6``), checked to be ``>= low``."""
    value = params.get(key, default)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise CollectiveError(f"parameter {key} must be an integer >= {low}, got {value!r}")
    return value


def bad_int_param(params: dict, key: str, low: int = 1) -> str | None:
    """Why integer hint parameter ``key`` is unusable, or ``None``: for ``applicable``, so a
    bad value is reported at the file's hint before any work starts."""
    try:
        hint_int(params, key, None, low)
    except CollectiveError as err:
        return err.message
    return None
