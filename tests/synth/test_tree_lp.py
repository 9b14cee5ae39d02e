"""The column generation of cclc.synth.tree_lp against independent references: an LP over every
spanning arborescence of bounded depth (enumerated by brute force, solved by SciPy), the
ForestColl rate (min over cuts), and the simulator for the exact lockstep time of one phase."""

from __future__ import annotations

import itertools
import time

import networkx as nx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.optimize import linprog

import dsl
from cclc.algorithms import get
from cclc.bounds import bounds
from cclc.collective import CollectiveKind as K
from cclc.collective import Hint, make_collective
from cclc.numeric import check_numeric
from cclc.sim import simulate
from cclc.synth import tree_lp
from cclc.synth.hop_graph import HopGraph, hop_graph
from cclc.synth.phase_time import phase_lockstep_time
from cclc.synth.tree_schedule import allgather_ops, reducescatter_ops
from cclc.synth.trees import forestcoll_rate, pack_trees
from cclc.topology import NodeType, leaf_spine
from cclc.verify import verify


def _graph(n: int, caps: dict[tuple[int, int], float]) -> HopGraph:
    """Moves of one link each (link h = move h)."""
    pairs = sorted(caps)
    m = len(pairs)
    return HopGraph(n, np.array([a for a, _ in pairs]), np.array([b for _, b in pairs]),
                    np.arange(m + 1), np.arange(m), np.array([caps[p] for p in pairs]),
                    np.full(m, 1e-6))


@st.composite
def small_graphs(draw):
    n = draw(st.integers(3, 4))
    caps = {}
    for a, b in itertools.permutations(range(n), 2):
        if draw(st.integers(0, 3)):                       # most pairs present
            caps[(a, b)] = float(draw(st.integers(1, 4)))
    for v in range(n):                                    # a ring keeps it strongly connected
        caps.setdefault((v, (v + 1) % n), 1.0)
    return _graph(n, caps)


def _arborescences(g: HopGraph, root: int, limit: int):
    """Every spanning arborescence of ``g`` rooted at ``root`` at most ``limit`` deep, as the
    move into every other member (brute force over one in-move per member)."""
    others = [v for v in range(g.n) if v != root]
    into = [np.flatnonzero(g.dst == v).tolist() for v in others]
    for pick in itertools.product(*into):
        parent = dict(zip(others, (int(g.src[h]) for h in pick), strict=True))
        ok = True
        for v in others:
            x, d = v, 0
            while x != root and d <= g.n:
                x, d = parent[x], d + 1
            if x != root or d > limit:
                ok = False
                break
        if ok:
            yield np.array(pick)


def _brute_lp(g: HopGraph, rate: float, wins, reduce: bool) -> float:
    """The LP of cclc.synth.tree_lp over every tree within each root's depth limit."""
    hops = nx.floyd_warshall_numpy(nx.DiGraph(list(zip(g.src.tolist(), g.dst.tolist(),
                                                       strict=True))), nodelist=range(g.n))
    limit = hops.max(axis=1).astype(int) + tree_lp.DEPTH_SLACK
    cols = []
    for r in range(g.n):
        for t in _arborescences(g, r, int(limit[r])):
            lev = tree_lp._levels(g, r, t, reduce)
            use = np.zeros((len(wins), g.m))
            for w, (lo, hi, _) in enumerate(wins):
                np.add.at(use[w], t[(lev >= lo) & (lev <= hi)], 1.0)
            cols.append((r, use.ravel()))
    nw, m = len(wins), g.m
    a = np.stack([u for _, u in cols], axis=1)
    z = np.zeros((nw * m, nw))
    for w in range(nw):
        z[w * m:(w + 1) * m, w] = -g.capacity / rate
    eq = np.zeros((g.n, len(cols) + nw))
    for j, (r, _) in enumerate(cols):
        eq[r, j] = 1.0
    c = np.concatenate([np.zeros(len(cols)), [w for *_, w in wins]])
    res = linprog(c, A_ub=np.hstack([a, z]), b_ub=np.zeros(nw * m), A_eq=eq,
                  b_eq=np.ones(g.n), bounds=(0, None), method="highs")
    assert res.status == 0
    return float(res.fun)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_graphs(), st.booleans(), st.booleans())
def test_column_generation_never_beats_the_lp_over_all_trees(g, levels, reduce):
    net = nx.DiGraph()
    for a, b, c in zip(g.src.tolist(), g.dst.tolist(), g.capacity.tolist(), strict=True):
        net.add_edge(a, b, capacity=c)
    rate = forestcoll_rate(net, list(range(g.n)))
    wins = tree_lp.windows(tree_lp.depth_limit(g), 1) if levels else tree_lp.ALL_LEVELS
    frac = tree_lp.fractional_packing(g, rate, time.monotonic() + 30, None, wins, reduce)
    brute = _brute_lp(g, rate, wins, reduce)
    # its columns are trees within the limit: never below the LP over all of them, and that
    # LP never below the ForestColl rate's load (every tree crosses every cut)
    assert frac.z >= brute * (1 - 1e-7)
    assert brute >= 1 - 1e-7
    # weights: a root's add up to 1
    roots = np.array([r for r, _ in frac.trees])
    assert np.allclose(np.bincount(roots, weights=frac.weight, minlength=g.n), 1.0)
    # the rounding: spanning trees, its load recomputed from the moves
    k = 4
    p = tree_lp.rounded_packing(g, frac, rate, k, time.monotonic() + 30, None, 0.0, wins, reduce)
    use = np.zeros(g.m)
    for r in range(g.n):
        for j in range(k):
            assert p.parent[r, j, r] == r
            for v in range(g.n):
                if v != r:
                    h = p.edge[r, j, v]
                    assert g.dst[h] == v and g.src[h] == p.parent[r, j, v]
                    use[h] += 1
    assert (p.depth() < g.n).all()                        # no cycles: every chain ends at r
    assert p.load == pytest.approx((use * rate / k / g.capacity).max())
    if not levels:
        assert p.load >= frac.z * (1 - 1e-7)


def test_column_generation_reaches_the_lp_over_all_trees_on_a_complete_graph():
    # capacities that no equal-weight tree family fits: the LP needs weighted trees
    caps = {(a, b): float(1 + (a * 3 + b) % 3) for a, b in itertools.permutations(range(4), 2)}
    g = _graph(4, caps)
    net = nx.DiGraph([(a, b, {"capacity": c}) for (a, b), c in caps.items()])
    rate = forestcoll_rate(net, list(range(4)))
    frac = tree_lp.fractional_packing(g, rate, time.monotonic() + 30)
    assert frac.status == "optimal"
    assert frac.z == pytest.approx(_brute_lp(g, rate, tree_lp.ALL_LEVELS, False), rel=1e-6)


@pytest.mark.parametrize("height, chunks", [(1, 1), (2, 1), (2, 5), (3, 2), (4, 7)])
def test_windows_count_every_level_once_per_chunk(height, chunks):
    wins = tree_lp.windows(height, chunks)
    assert sum(c for *_, c in wins) == height + chunks - 1
    for level in range(height):
        assert sum(c for lo, hi, c in wins if lo <= level <= hi) == chunks


def _fabric():
    node = NodeType("h", "nvswitch", 2, 450e9, 1e-6, nics=2, nic_bandwidth=50e9)
    return leaf_spine("ls", 3, node, rails=2, leaves=None, spines=2, oversubscription=2.0,
                      bandwidth=50e9, latency=2e-6)


@pytest.mark.parametrize("kind", [K.ALLGATHER, K.REDUCESCATTER])
@pytest.mark.parametrize("chunks", [1, 2, 5])
def test_phase_time_bounds_the_simulated_time(kind, chunks):
    # the simulator charges each op its own route's latency and busiest link: at most the
    # step's largest latency plus its busiest link, which the exact time charges
    topo = _fabric()
    n = topo.n_ranks
    coll = make_collective("c", kind, topo, list(range(n)), size=n * 4 * 2 * chunks * 1000)
    g = hop_graph(coll)
    reduce = kind is K.REDUCESCATTER
    pg = g.reversed() if reduce else g
    ident = (np.arange(n)[None, :], np.arange(g.m)[None, :])
    p = pack_trees(pg, 1e9, 2, *ident, time.monotonic() + 30)
    build = reducescatter_ops if reduce else allgather_ops
    s = build(coll, g, p, chunks, ())
    sim = float(simulate(s).time)
    alpha = float(g.latency.max())
    exact = phase_lockstep_time(g, p, coll.size / n, chunks, alpha, reduce)
    steps = int(p.depth().max()) + chunks - 1
    assert sim <= exact * (1 + 1e-9)
    assert sim >= exact - steps * (alpha - float(g.latency.min())) - 1e-12


@pytest.mark.slow
def test_pcie_fabric_trees_reach_95_percent_at_128_mib():
    # the level-synchronous trees (one chunk per tree) of the PCIe fabric example
    topo = dsl.load("examples/pcie_oversubscribed.ccl").topologies["cluster"]
    group = topo.live_ranks()
    n = len(group)
    for kind in (K.ALLGATHER, K.REDUCESCATTER):
        coll = make_collective("c", kind, topo, group, size=(128 << 20) // (4 * n) * 4 * n,
                               algorithm=Hint("synth"))
        s = get("synth").build(coll, race=0, budget=120)
        assert bounds(coll).best / float(simulate(s).time) >= 0.95
        verify(s)
        check_numeric(s)
