"""Spanning-tree packings for AllGather / ReduceScatter (ForestColl's construction, in part).

An AllGather is one broadcast per rank; a broadcast at rate ``x`` is a packing of spanning
out-trees rooted at its rank, and a ReduceScatter is the same over in-trees. Two questions:

*The optimum.* ForestColl (Zhao et al., NSDI'26) shows that the best per-root rate ``x*`` with
every rank broadcasting at once is the largest ``x`` such that, after adding a source ``s`` with
an edge of capacity ``x`` to every rank, every rank ``v`` receives a flow of ``n * x`` from
``s``: by max-flow/min-cut that is ``x * |S ∩ ranks| <= bandwidth leaving S`` for every cut
``S`` that misses a rank, and Edmonds' branching theorem says trees reach it. Switch vertices
(NVSwitch, NICs, leaves, spines) are ordinary non-rank vertices of the flow network.
:func:`forestcoll_rate` finds ``x*`` by a Newton (Dinkelbach) search on the rate: each probe
runs one max-flow per rank; a probe that fails returns its minimum cut, whose ratio is the next,
smaller, probe, so the search ends on the exact optimum after a few probes instead of bisecting
towards it.

*The trees.* ForestColl builds the trees exactly, after splitting switch vertices off
(:mod:`cclc.synth.splitting` does the splitting); here the trees are built by negotiated
congestion (:func:`pack_trees`), a heuristic whose result is measured against ``x*``: every
root gets ``k`` trees over the *hop graph* (moves the declared routing carries as one op:
torus neighbour links, rank-to-rank fewest-hop paths through a fabric, or the logical edges
of the split graph, each with its own capacity). A tree grows one member at a time over the
cheapest move out of it, under link prices
that grow exponentially with the link's load relative to its share at ``x*``, plus a price per
level of depth and a depth limit (depth is pipeline fill); trees are ripped up and regrown
until no link is above its share or the budget runs out.

Symmetry: on a torus whose faults are invariant under a group of translations, the trees of
one root per orbit are built and translated, and prices count the loads of all translates.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import networkx as nx
import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import breadth_first_order, maximum_flow

from cclc.collective import Collective
from cclc.synth.hop_graph import HopGraph, live_links
from cclc.synth.tree_grow import depth_price, grow_tree, tree_family

__all__ = ["TreePacking", "flow_network", "forestcoll_rate", "link_permutation", "negotiate",
           "orbit_reps", "pack_trees", "translated", "translations"]


# -- the optimum ---------------------------------------------------------------------------------

def flow_network(coll: Collective) -> tuple[nx.DiGraph, list]:
    """The healthy machine as a capacitated digraph (bytes/s) and its member vertices; ranks
    outside the group are left out (they do not take part)."""
    topo = coll.topology
    group = np.asarray(coll.group, dtype=np.int64)
    ok = np.flatnonzero(live_links(topo, group))
    g = nx.DiGraph()
    g.add_nodes_from(group.tolist())
    for u, w, bw in zip(topo.link_src[ok].tolist(), topo.link_dst[ok].tolist(),
                        topo.link_bandwidth[ok].tolist(), strict=True):
        cap = g[u][w]["capacity"] + bw if g.has_edge(u, w) else bw
        g.add_edge(u, w, capacity=cap)
    return g, group.tolist()


def forestcoll_rate(graph: nx.DiGraph, members: list, probe_members: list | None = None,
                    ) -> float:
    """The largest rate ``x`` (bytes/s per root) at which every member broadcasts to all others
    at once: ``min over cuts S missing a member of B_out(S) / |S ∩ members|``.

    ``probe_members``: the members whose in-cuts are checked (all by default; one per orbit
    when a symmetry maps cuts onto cuts).

    >>> g = nx.DiGraph([(0, 1, {"capacity": 2.0}), (1, 0, {"capacity": 2.0})])
    >>> forestcoll_rate(g, [0, 1])
    2.0
    """
    n = len(members)
    probe = members if probe_members is None else probe_members
    if n < 2:
        return float("inf")
    x = min(sum(d["capacity"] for _, _, d in graph.in_edges(v, data=True)) for v in members)
    x /= n - 1
    cut = _scipy_cuts if graph.number_of_nodes() > _SCIPY_ABOVE else _networkx_cuts
    for _ in range(64):
        worst = None
        for inside in cut(graph, members, probe, x):
            k = sum(1 for u in members if u in inside)
            out = sum(d["capacity"] for a, b, d in graph.edges(inside, data=True)
                      if b not in inside)
            ratio = out / k
            worst = ratio if worst is None else min(worst, ratio)
        if worst is None or worst >= x * (1 - 1e-12):
            return x
        x = worst
    return x


#: graphs with more vertices than this run their max-flows in SciPy (C) instead of networkx
#: (the same rates on the 128-GPU fabric and a faulty 5x5x5 torus, 30-100x faster)
_SCIPY_ABOVE = 64
#: units of ``N x`` in the SciPy max-flows (capacities rounded up to whole units)
_UNITS = 10**8


def _networkx_cuts(graph: nx.DiGraph, members: list, probe: list, x: float):
    """For every probed member short of ``N x``: the source side of a minimum cut (without
    the source)."""
    n = len(members)
    h = graph.copy()
    src = ("forestcoll", "source")
    for v in members:
        h.add_edge(src, v, capacity=x)
    for v in probe:
        value, (side, _) = nx.minimum_cut(h, src, v)
        if value < n * x * (1 - 1e-12):
            yield {u for u in side if u != src}


def _scipy_cuts(graph: nx.DiGraph, members: list, probe: list, x: float):
    """:func:`_networkx_cuts` with SciPy's max-flow on capacities in units of ``N x / 10^8``,
    rounded up: a shortfall under a unit per cut edge can go unseen, so the rate may stop
    that much (relatively 10^-8 per edge) above the exact one."""
    n = len(members)
    unit = n * x / _UNITS
    nodes = list(graph.nodes)
    index = {v: i + 1 for i, v in enumerate(nodes)}
    edges = list(graph.edges(data="capacity"))
    src = np.array([index[a] for a, _, _ in edges] + [0] * n)
    dst = np.array([index[b] for _, b, _ in edges] + [index[v] for v in members])
    cap = np.array([c for _, _, c in edges] + [x] * n) / unit
    units = np.minimum(np.ceil(cap - 1e-9), 2**31 - 1).astype(np.int32)
    size = len(nodes) + 1
    mat = csr_matrix((units, (src, dst)), shape=(size, size))
    for v in probe:
        res = maximum_flow(mat, 0, index[v])
        if res.flow_value >= _UNITS:
            continue
        # the source side: reachable from the source over edges with residual capacity
        residual = (mat - res.flow).tocsr()
        residual.data = (residual.data > 0).astype(np.int8)
        residual.eliminate_zeros()
        side = breadth_first_order(residual, 0, directed=True, return_predecessors=False)
        yield {nodes[i - 1] for i in side.tolist() if i != 0}


# -- symmetry ------------------------------------------------------------------------------------

def translations(coll: Collective, g: HopGraph) -> tuple[np.ndarray, np.ndarray]:
    """Torus translations that map the group, its faults and link bandwidths onto themselves.

    Returns ``(node_perm, edge_perm)``: ``node_perm[t, v]`` is the member that member ``v``
    goes to under translation ``t`` and ``edge_perm[t, h]`` likewise for moves. Row 0 is the
    identity; elsewhere (fabrics, subgroups that no translation keeps) it is the only row.
    """
    n = g.n
    ident = (np.arange(n)[None, :], np.arange(g.m)[None, :])
    topo = coll.topology
    if topo.dims is None or topo.n_vertices != topo.n_ranks or not all(topo.grid_wrap):
        return ident
    if np.diff(g.offsets).max(initial=1) != 1:
        return ident
    dims = np.asarray(topo.dims)
    group = np.asarray(coll.group, dtype=np.int64)
    index = np.full(topo.n_ranks, -1, dtype=np.int64)
    index[group] = np.arange(n)
    coords = np.stack(np.unravel_index(group, topo.dims), axis=1)
    pair_edge = {(int(a), int(b)): h for h, (a, b) in enumerate(zip(g.src, g.dst, strict=True))}
    bw = g.capacity[g.links]
    node_rows, edge_rows = [], []
    for shift in np.stack(np.unravel_index(np.arange(topo.n_ranks), topo.dims), axis=1):
        moved = index[np.ravel_multi_index(tuple(((coords + shift) % dims).T), topo.dims)]
        if (moved < 0).any():
            continue
        edges = np.array([pair_edge.get((int(a), int(b)), -1)
                          for a, b in zip(moved[g.src], moved[g.dst], strict=True)])
        if (edges < 0).any() or not np.allclose(bw[edges], bw):
            continue
        node_rows.append(moved)
        edge_rows.append(edges)
    return np.array(node_rows), np.array(edge_rows)


# -- the packing ---------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class TreePacking:
    """``k`` spanning out-trees per root, each carrying ``1/k`` of the root's data.

    ``parent[r, j, v]``: the member ``v`` receives from in tree ``j`` of root ``r``
    (``parent[r, j, r] == r``); ``edge[r, j, v]`` the move it arrives by (meaningless at the
    root). ``load`` is the largest link load relative to the link's share at the optimal rate
    (1.0 means the packing reaches the optimum). ``status`` is ``"optimal"`` when it does,
    ``"feasible"`` when the rounds ran out first, ``"budget"`` when the time budget did.
    """

    parent: np.ndarray
    edge: np.ndarray
    load: float
    status: str
    solve_s: float

    @property
    def k(self) -> int:
        return int(self.parent.shape[1])

    def depth(self) -> np.ndarray:
        """``(n, k, n)`` hops from the root."""
        n = self.parent.shape[2]
        d = np.zeros(self.parent.shape, dtype=np.int64)
        cur = np.broadcast_to(np.arange(n), self.parent.shape).copy()
        roots = np.arange(n)[:, None, None]
        for _ in range(n):
            live = cur != roots
            if not live.any():
                break
            d += live
            cur = np.where(live, np.take_along_axis(self.parent, cur, axis=2), cur)
        return d


def _tree_links(g: HopGraph, edges: np.ndarray) -> np.ndarray:
    starts, ends = g.offsets[edges], g.offsets[edges + 1]
    if not len(edges):
        return edges
    return np.concatenate([g.links[a:b] for a, b in zip(starts, ends, strict=True)])


def pack_trees(g: HopGraph, rate: float, k: int, node_perm: np.ndarray, edge_perm: np.ndarray,
               deadline: float, rounds: int = 40, seed: int = 0) -> TreePacking | None:
    """``k`` out-trees per root under negotiated congestion (module docstring).

    ``rate`` is the optimal per-root rate ``x*`` that loads are measured against; ``node_perm``
    and ``edge_perm`` are the symmetry from :func:`translations` (or
    :func:`cclc.synth.fabric_symmetry.fabric_symmetry`); ``deadline`` is a
    ``time.monotonic()`` instant after which the best packing so far is returned (status
    ``"budget"``), or ``None`` when the deadline passes before every root has its trees.
    The clock is read before every tree is grown, so the deadline is overrun by one tree.
    """
    t0 = time.monotonic()
    n = g.n
    cap = g.capacity
    link_perm = link_permutation(g, edge_perm)
    reps = orbit_reps(node_perm)
    share = rate / k                                   # bytes/s of one tree
    with np.errstate(divide="ignore"):
        unit = np.where(cap > 0, share / np.where(cap > 0, cap, 1.0), 0.0)  # util per tree use
    load = np.zeros(len(cap))
    fam = tree_family(g, _DEPTH_SLACK)
    price_depth = depth_price(fam, unit, _DEPTH_WEIGHT)
    keys = [(r, j) for r in reps for j in range(k)]
    found = negotiate(keys, lambda key: grow_tree(fam, key[0], load, unit, link_perm,
                                                  price_depth),
                      load, unit, rounds, _PATIENCE, np.random.default_rng(seed), deadline)
    if found is None:
        return None                               # no complete packing to return
    best, best_load, status = found
    parent, edge = translated(best, n, k, node_perm, edge_perm)
    return TreePacking(parent, edge, best_load, status, time.monotonic() - t0)


def negotiate(keys: list, grow, load: np.ndarray, unit: np.ndarray, rounds: int,
              patience: int, rng: np.random.Generator, deadline: float
              ) -> tuple[dict, float, str] | None:
    """Negotiated congestion over the trees named by ``keys``: grow one per key, then rip up
    and regrow them in random order, each under the loads the others leave.

    ``grow(key)`` returns ``(parent, edge, use)`` with ``use`` the tree's uses of each link;
    ``load`` (links' load, in shares) is updated in place by ``use * unit``, which is how
    ``grow`` sees the other trees. Stops when no link is above its share, after ``rounds``
    rounds, ``patience`` rounds without a lower peak, or at ``deadline`` (``time.monotonic()``;
    read before every tree). Returns the trees of the lowest peak, that peak and a status
    (``optimal``, ``feasible``, ``budget``), or ``None`` when the deadline passes before every
    key has a tree.
    """
    trees: dict = {}
    usage: dict = {}
    for key in keys:
        if time.monotonic() > deadline:
            return None
        parent, edge, use = grow(key)
        trees[key], usage[key] = (parent, edge), use
        load += use * unit
    best_load, best = float(load.max()), dict(trees)
    status, stale = "feasible", 0
    for _ in range(rounds):
        if best_load <= 1.0 + 1e-9:
            break
        if time.monotonic() > deadline:
            status = "budget"
            break
        for i in rng.permutation(len(keys)):
            if time.monotonic() > deadline:
                # every tree regrown so far replaced one of the last round: still a packing
                status = "budget"
                break
            key = keys[i]
            load -= usage[key] * unit
            parent, edge, use = grow(key)
            trees[key], usage[key] = (parent, edge), use
            load += use * unit
        if load.max() < best_load - 1e-12:
            best_load, best, stale = float(load.max()), dict(trees), 0
        else:
            stale += 1
            if stale >= patience or status == "budget":
                break
    if best_load <= 1.0 + 1e-9:
        status = "optimal"
    return best, best_load, status


def translated(trees: dict, n: int, k: int, node_perm: np.ndarray, edge_perm: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray]:
    """``(parent, edge)`` of every root: the trees of the orbit representatives, moved by
    every symmetry."""
    parent = np.zeros((n, k, n), dtype=np.int64)
    edge = np.zeros((n, k, n), dtype=np.int64)
    for (r, j), (p, e) in trees.items():
        for t in range(len(node_perm)):
            nodes = node_perm[t]
            parent[nodes[r], j, nodes] = nodes[p]
            edge[nodes[r], j, nodes] = edge_perm[t][e]
    return parent, edge


#: price of one level of depth, relative to the median move: keeps trees shallow
_DEPTH_WEIGHT = 0.25
#: levels a tree may grow beyond the hop distance to its farthest member
_DEPTH_SLACK = 1
#: rounds without improvement after which the search stops
_PATIENCE = 3


def link_permutation(g: HopGraph, edge_perm: np.ndarray) -> np.ndarray:
    """``(t, n_links)``: where each physical link goes under each translation (identity on
    links no move uses)."""
    perm = np.tile(np.arange(len(g.capacity)), (len(edge_perm), 1))
    if len(edge_perm) > 1:
        # on a torus every move is one link, so moves map links
        perm[:, g.links] = g.links[edge_perm]
    return perm


def orbit_reps(node_perm: np.ndarray) -> list[int]:
    """One vertex per orbit of the symmetries ``node_perm`` (``(t, n)``), the smallest."""
    seen = np.zeros(node_perm.shape[1], dtype=bool)
    reps = []
    for v in range(node_perm.shape[1]):
        if not seen[v]:
            reps.append(v)
            seen[node_perm[:, v]] = True
    return reps
