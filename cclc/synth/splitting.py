"""Switches removed by edge splitting: ForestColl's rank-only graph.

ForestColl (Zhao et al., NSDI'26) packs its trees on a graph of ranks only. A switch ``w`` is
removed by *splitting off* pairs of its edges: ``gamma`` of an edge ``u -> w`` and ``gamma`` of
an edge ``w -> t`` become a logical edge ``u -> t`` of capacity ``gamma`` that travels both
(the physical path through the switch). Splitting never adds bandwidth to a cut, so it may
only take away what a cut can spare: the condition that keeps the optimal rate ``x`` is that
every rank ``v`` still receives a flow of ``N x`` from a source joined to every rank by an
edge of capacity ``x`` (the max-flow test of :func:`cclc.synth.trees.forestcoll_rate`). Bang-
Jensen, Frank and Jackson (1995), after Lovász and Mader, show that a switch whose in- and
out-capacities are equal can be split off completely while keeping that rooted
connectivity; ForestColl uses this to go from the fabric to ranks.

How much of a pair may be split off is found with max-flows: split off all that both edges
hold, run the test, and take back the largest deficit: every cut that the split weakens loses
exactly the split amount, so the test's deficit is exactly what is too much. Cheaper steps
come first. Switches no rank needs (the spines of a fabric whose rails already carry the
optimum) are removed, tested once per level of distance from the ranks. A vertex with two
neighbours (a NIC between a GPU or PCIe switch and a leaf) is contracted without a test: that
never makes a cut smaller than a cut of the graph before. Then each level of switches,
nearest the ranks first, is split proportionally (every in-edge to every out-edge, matrix-
scaled to the capacities) under one test for the whole level; a level that fails is split
switch by switch, and a switch that fails pair by pair. The max-flows run in SciPy (C) on
capacities rounded to 10^-7 of ``N x``: networkx's took 3 s per test on the 128-GPU fabric
example, SciPy's 0.1 s.

Only pairs whose joined path is a fewest-hop path between its ends are split (what ECMP and
adaptive routing carry, and what a rank can send as one op), so a path never turns back at a
leaf into the node it came from.

A logical edge whose physical path the declared routing does not carry (not a fewest-hop path
under ECMP) is dropped at the end; the rate of the graph that is left is reported, so a
packing on it is measured against the true optimum.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass

import networkx as nx
import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import maximum_flow, shortest_path

from cclc.collective import Collective
from cclc.ir import Routes
from cclc.routing import carried_routes
from cclc.synth.trees import forestcoll_rate
from cclc.topology import Topology

__all__ = ["SplitGraph", "split_switches"]

#: relative tolerance of the max-flow tests (the rate itself comes from floating point)
_TOL = 1e-9


@dataclass(frozen=True, eq=False)
class SplitGraph:
    """Logical rank-to-rank edges left after the switches were split off.

    ``src[e] -> dst[e]`` (group indices, in the direction data moves) has ``capacity[e]``
    bytes/s and travels the physical links ``paths[e]`` in order. ``rate`` is the optimal
    per-root rate of the collective's direction on these edges (at most the machine's).
    """

    src: np.ndarray
    dst: np.ndarray
    capacity: np.ndarray
    paths: tuple[tuple[int, ...], ...]
    rate: float


class _Graph:
    """The graph being split: logical edges with paths, and capacities per vertex pair."""

    def __init__(self, reverse: bool, dist: np.ndarray):
        self.reverse = reverse
        self.dist = dist
        self.edges: dict[int, tuple[int, int, float, tuple[int, ...]]] = {}
        self.out: dict[int, set[int]] = defaultdict(set)
        self.inc: dict[int, set[int]] = defaultdict(set)
        self.agg = nx.DiGraph()
        self._next = 0

    def add(self, u: int, t: int, cap: float, path: tuple[int, ...]) -> None:
        if cap <= 0 or u == t:
            return
        e = self._next
        self._next += 1
        self.edges[e] = (u, t, cap, path)
        self.out[u].add(e)
        self.inc[t].add(e)
        if self.agg.has_edge(u, t):
            self.agg[u][t]["capacity"] += cap
        else:
            self.agg.add_edge(u, t, capacity=cap)

    def take(self, e: int, amount: float) -> None:
        u, t, cap, path = self.edges[e]
        left = cap - amount
        self.agg[u][t]["capacity"] -= amount
        if self.agg[u][t]["capacity"] <= cap * _TOL:
            self.agg.remove_edge(u, t)
        if left <= cap * _TOL:
            del self.edges[e]
            self.out[u].discard(e)
            self.inc[t].discard(e)
        else:
            self.edges[e] = (u, t, left, path)

    def join(self, a: int, b: int) -> tuple[int, ...]:
        """The physical path of logical ``a`` then ``b`` (in the splitting direction)."""
        pa, pb = self.edges[a][3], self.edges[b][3]
        # on the reversed network (in-trees) a logical edge u -> w is physically w -> u
        return pb + pa if self.reverse else pa + pb

    def allowed(self, a: int, b: int) -> bool:
        """Whether ``a`` then ``b`` joins two different vertices by a fewest-hop path (what
        ECMP and adaptive routing carry; a subpath of one is one too)."""
        u, t = self.edges[a][0], self.edges[b][1]
        if u == t:
            return False
        first, last = (t, u) if self.reverse else (u, t)
        return len(self.edges[a][3]) + len(self.edges[b][3]) == self.dist[first, last]

    def split(self, a: int, b: int, amount: float) -> None:
        u, t = self.edges[a][0], self.edges[b][1]
        path = self.join(a, b)
        self.take(a, amount)
        self.take(b, amount)
        self.add(u, t, amount, path)

    def remove_vertex(self, w: int) -> None:
        for e in list(self.out[w]) + list(self.inc[w]):
            if e in self.edges:
                self.take(e, self.edges[e][2])
        if w in self.agg:
            self.agg.remove_node(w)

    def snapshot(self):
        return (dict(self.edges), {k: set(v) for k, v in self.out.items()},
                {k: set(v) for k, v in self.inc.items()}, self.agg.copy(), self._next)

    def restore(self, snap) -> None:
        edges, out, inc, agg, nxt = snap
        self.edges, self.agg, self._next = edges, agg, nxt
        self.out, self.inc = defaultdict(set, out), defaultdict(set, inc)


def _deficit(agg: nx.DiGraph, members: list[int], rate: float,
             probe: list[int] | None = None) -> float:
    """The largest shortfall ``N x - maxflow(source -> v)`` over members ``v`` (0 if none);
    ``probe``: the members whose max-flows are run (all by default; one per orbit when
    ``agg`` is invariant under a symmetry, see :func:`_probe`).

    The max-flows run in SciPy on capacities in units of ``N x / 10^7``, rounded up: a cut
    of ``E`` edges is overestimated by less than ``E`` units, so a split is never refused
    for rounding, and one that is short by less than that (a relative 10^-7 per edge) may
    pass; :func:`split_switches` recomputes the rate of the result exactly.
    """
    n = len(members)
    need = n * rate
    unit = need / _UNITS
    nodes = list(agg.nodes)
    index = {v: i + 1 for i, v in enumerate(nodes)}          # 0 is the source
    src, dst, cap = [], [], []
    for a, b, c in agg.edges(data="capacity"):
        src.append(index[a])
        dst.append(index[b])
        cap.append(c)
    src += [0] * n
    dst += [index[v] for v in members]
    cap += [rate] * n
    units = np.minimum(np.ceil(np.asarray(cap) / unit), 2**31 - 1).astype(np.int32)
    size = len(nodes) + 1
    graph = csr_matrix((units, (np.asarray(src), np.asarray(dst))), shape=(size, size))
    worst = 0
    for v in members if probe is None else probe:
        value = maximum_flow(graph, 0, index[v]).flow_value
        worst = max(worst, _UNITS - value)
    return worst * unit if worst > 0 else 0.0


#: units of ``N x`` in the max-flow tests
_UNITS = 10**7


def _probe(agg: nx.DiGraph, symmetry: tuple[np.ndarray, list[int]] | None) -> list[int] | None:
    """One member per orbit when the graph being split is invariant under ``symmetry``
    (``(vertex map, one member of each orbit of its powers)``: an automorphism of the
    machine, :mod:`cclc.synth.fabric_symmetry`), else ``None`` (every member).

    Invariance is checked on the graph as it is, pair capacities to a relative 1e-9: a map
    that keeps the graph maps every source-side cut of a member onto one of its image of
    the same capacity, so their max-flows are equal. A whole level split proportionally (or
    removed) keeps the symmetry of a symmetric graph; a split switch by switch need not.
    """
    if symmetry is None:
        return None
    perm, reps = symmetry
    nodes = set(agg.nodes)
    if any(int(perm[v]) not in nodes for v in nodes):
        return None
    for a, b, cap in agg.edges(data="capacity"):
        image = agg.get_edge_data(int(perm[a]), int(perm[b]))
        if image is None or abs(image["capacity"] - cap) > 1e-9 * cap:
            return None
    return reps


def _network(topo: Topology, group: np.ndarray, reverse: bool) -> _Graph:
    keep = np.zeros(topo.n_vertices, dtype=bool)
    keep[group] = True
    keep[topo.n_ranks:] = True
    ok = np.flatnonzero(~topo.link_failed & keep[topo.link_src] & keep[topo.link_dst])
    v = topo.n_vertices
    adj = csr_matrix((np.ones(len(ok)), (topo.link_src[ok], topo.link_dst[ok])), shape=(v, v))
    g = _Graph(reverse, shortest_path(adj, unweighted=True))
    for link in ok.tolist():
        u, t = int(topo.link_src[link]), int(topo.link_dst[link])
        if reverse:
            u, t = t, u
        g.add(u, t, float(topo.link_bandwidth[link]), (link,))
    return g


def _neighbours(g: _Graph, w: int) -> set[int]:
    return ({g.edges[e][1] for e in g.out[w]} | {g.edges[e][0] for e in g.inc[w]}) - {w}


def _contract(g: _Graph, w: int) -> None:
    """Split ``w`` completely by pairing every in-edge with out-edges to the other
    neighbour (a vertex of two neighbours: never makes a cut smaller, no test needed)."""
    for a in sorted(g.inc[w]):
        for b in sorted(g.out[w]):
            if a not in g.edges or b not in g.edges or not g.allowed(a, b):
                continue
            g.split(a, b, min(g.edges[a][2], g.edges[b][2]))
    g.remove_vertex(w)


def _proportional(g: _Graph, w: int) -> None:
    """Every allowed pair in proportion to both capacities (scaled so that no edge gives
    more than it has), then ``w`` and what is left on its edges removed."""
    ins, outs = sorted(g.inc[w]), sorted(g.out[w])
    a = np.array([g.edges[e][2] for e in ins])
    b = np.array([g.edges[e][2] for e in outs])
    ok = np.array([[g.allowed(ea, eb) for eb in outs] for ea in ins], dtype=bool)
    if ok.any():
        # matrix scaling (Sinkhorn) towards row sums a and column sums b, so that the
        # switch is split completely when the allowed pairs permit it
        gamma = np.where(ok, np.outer(a, b), 0.0)
        scale = min(a.sum(), b.sum())
        rows, cols = a * scale / a.sum(), b * scale / b.sum()
        for _ in range(200):
            gamma *= _ratio(rows, gamma.sum(axis=1))[:, None]
            gamma *= _ratio(cols, gamma.sum(axis=0))[None, :]
        over = max((gamma.sum(axis=1) / a).max(), (gamma.sum(axis=0) / b).max(), 1.0)
        if over > 1 + 1e-9:
            gamma = _clipped(gamma, a, b, over)
        for i, ea in enumerate(ins):
            for o, eb in enumerate(outs):
                # rounding can leave a row or column a hair above its edge's capacity, and
                # an edge taken to within tolerance is gone: never split more than is left
                if ok[i, o] and gamma[i, o] > 0 and ea in g.edges and eb in g.edges:
                    g.split(ea, eb, min(float(gamma[i, o]), g.edges[ea][2], g.edges[eb][2]))
    g.remove_vertex(w)


def _ratio(want: np.ndarray, have: np.ndarray) -> np.ndarray:
    """``want / have``, 0 where ``have`` is 0 (a row or column with no allowed pair, or one
    scaled to nothing: it stays empty; dividing would make inf * 0 = NaN of the whole
    matrix)."""
    return np.divide(want, have, out=np.zeros_like(want), where=have > 0)


def _clipped(gamma: np.ndarray, a: np.ndarray, b: np.ndarray, over: float) -> np.ndarray:
    """``gamma`` brought within the row capacities ``a`` and column capacities ``b``: divided
    by its worst excess ``over``, or clipped row by row then column by column, whichever
    splits more. Sinkhorn does not converge when the allowed pairs fall into blocks whose
    capacities differ (a PCIe switch: GPU-to-NIC pairs and NIC-to-GPU pairs, never NIC to
    NIC): one block's excess would then shrink every block."""
    rows = gamma * np.minimum(1.0, _ratio(a, gamma.sum(axis=1)))[:, None]
    both = rows * np.minimum(1.0, _ratio(b, rows.sum(axis=0)))[None, :]
    return both if both.sum() > gamma.sum() / over else gamma / over


def _pairwise(g: _Graph, w: int, members: list[int], rate: float, deadline: float) -> bool:
    """Split ``w`` pair by pair, each as much as the max-flow test allows; ``False`` when
    the deadline passes first."""
    for a in sorted(g.inc[w]):
        for b in sorted(g.out[w]):
            if a not in g.edges or b not in g.edges or not g.allowed(a, b):
                continue
            if time.monotonic() > deadline:
                return False
            most = min(g.edges[a][2], g.edges[b][2])
            snap = g.snapshot()
            g.split(a, b, most)
            short = _deficit(g.agg, members, rate)
            if short > 0:
                g.restore(snap)
                if most - short > most * 1e-6:
                    g.split(a, b, most - short)
    g.remove_vertex(w)
    return True


def _distance_levels(g: _Graph, ranks: list[int], switches: list[int]) -> dict[int, int]:
    """Hops from the nearest rank, either direction."""
    und = g.agg.to_undirected(as_view=True)
    dist = nx.multi_source_dijkstra_path_length(und, set(ranks), weight=lambda *_: 1)
    return {w: int(dist.get(w, 0)) for w in switches}


def _prune(g: _Graph, switches: list[int], level: dict[int, int], members: list[int],
           rate: float, symmetry=None) -> list[int]:
    """Remove the farthest switches, level by level, while the rate survives without them;
    returns the switches left."""
    for d in sorted(set(level.values()), reverse=True):
        if d <= 1:
            break
        far = [w for w in switches if level[w] == d]
        snap = g.snapshot()
        for w in far:
            g.remove_vertex(w)
        if _deficit(g.agg, members, rate, _probe(g.agg, symmetry)) > 0:
            g.restore(snap)
            break
        switches = [w for w in switches if w not in far]
    return switches


def split_switches(coll: Collective, rate: float, reverse: bool, deadline: float,
                   symmetry: tuple[np.ndarray, list[int]] | None = None) -> SplitGraph | None:
    """The rank-only graph of ``coll``'s machine at per-root rate ``rate`` (module docstring),
    or ``None`` when the deadline passes first or a switch cannot be split.

    ``reverse``: split the reversed network (in-trees, ReduceScatter); edges are returned in
    the direction data moves either way. ``symmetry``: an automorphism of the machine and one
    member of each orbit of its powers (vertex ids); the tests of whole levels then run one
    max-flow per orbit while the graph stays invariant (checked each time, :func:`_probe`).
    """
    topo = coll.topology
    group = np.asarray(coll.group, dtype=np.int64)
    members = group.tolist()
    g = _network(topo, group, reverse)
    switches = [w for w in range(topo.n_ranks, topo.n_vertices) if w in g.agg]
    # 1. switches far from every rank that the optimum does not need (spines)
    level = _distance_levels(g, members, switches)
    switches = _prune(g, switches, level, members, rate, symmetry)
    # 2. two-neighbour vertices (NICs) by contraction
    for w in switches:
        if len(_neighbours(g, w)) <= 2:
            _contract(g, w)
    switches = [w for w in switches if w in g.agg]
    # 3. the others nearest the ranks first (a node's switch before the leaves, so paths are
    # built from the ranks outwards): a whole level split proportionally under one test,
    # else switch by switch, else pair by pair
    for d in sorted({level[w] for w in switches}):
        batch = [w for w in switches if level[w] == d]
        if time.monotonic() > deadline:
            return None
        snap = g.snapshot()
        for w in batch:
            _proportional(g, w)
        if _deficit(g.agg, members, rate, _probe(g.agg, symmetry)) == 0:
            continue
        g.restore(snap)
        for w in batch:
            if time.monotonic() > deadline:
                return None
            snap = g.snapshot()
            _proportional(g, w)
            if _deficit(g.agg, members, rate) == 0:
                continue
            g.restore(snap)
            if not _pairwise(g, w, members, rate, deadline):
                return None
            if _deficit(g.agg, members, rate) > 0:
                return None
    return _finish(coll, g, members, reverse, rate)


def _finish(coll: Collective, g: _Graph, members: list[int], reverse: bool,
            target: float) -> SplitGraph:
    topo = coll.topology
    index = {v: i for i, v in enumerate(members)}
    edges = list(g.edges.values())
    paths = [p for *_, p in edges]
    lengths = np.array([len(p) for p in paths], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    links = np.concatenate([np.asarray(p, dtype=np.int64) for p in paths]) if paths else \
        np.zeros(0, dtype=np.int64)
    carried = carried_routes(topo, Routes(np.concatenate([[0], offsets]),
                                          links))[1:] if paths else np.zeros(0, dtype=bool)
    kept = [e for e, ok in zip(edges, carried.tolist(), strict=True) if ok]
    # data moves along the physical path: on the reversed network that is t -> u
    src = np.array([index[t if reverse else u] for u, t, _, _ in kept], dtype=np.int64)
    dst = np.array([index[u if reverse else t] for u, t, _, _ in kept], dtype=np.int64)
    cap = np.array([c for _, _, c, _ in kept], dtype=float)
    agg = nx.DiGraph()
    agg.add_nodes_from(range(len(members)))
    for s, d, c in zip(src.tolist(), dst.tolist(), cap.tolist(), strict=True):
        a, b = (d, s) if reverse else (s, d)
        if agg.has_edge(a, b):
            agg[a][b]["capacity"] += c
        else:
            agg.add_edge(a, b, capacity=c)
    # the rate the split was made for, unless dropping uncarried edges lost some of it
    rate = target if _deficit(agg, list(range(len(members))), target) == 0 else \
        forestcoll_rate(agg, list(range(len(members))))
    return SplitGraph(src, dst, cap, tuple(p for *_, p in kept), rate)
