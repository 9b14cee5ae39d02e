"""AllToAll paths from a routed flow (``cclc.synth.routed``): the paths form a valid flow (every
pair's shares sum to one, every path walks over usable links from the pair's source to its
destination, at most the packer's paths per pair), the certified time is below an independent
node-arc LP (SciPy's HiGHS, written here) and the paths' busiest link is above it and near it,
over fault positions drawn by hypothesis; the routing's trace rebuilds its flows exactly."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st
from scipy.optimize import linprog

from cclc.algorithms import get
from cclc.collective import CollectiveKind, Hint, make_collective
from cclc.flow_route import fewest_hop_split, route_alltoall
from cclc.synth import flows as flows_mod
from cclc.synth.flow_solution import (
    MAX_PATHS,
    MIN_SHARE,
    group_connected,
    pair_bytes,
    usable_links,
)
from cclc.synth.flows import solve_flows
from cclc.synth.routed import routed_flows
from cclc.topology import torus, with_faults
from cclc.verify import verify


def _a2a(dims, links=(), per_pair=64, **hint):
    t = torus("t", dims, bandwidth=32e9, latency=1e-7, routing="none")
    topo = with_faults(t, links=list(links) + [(b, a) for a, b in links])
    group = topo.live_ranks()
    return make_collective("a", CollectiveKind.ALLTOALL, topo, tuple(group),
                           size=len(group) * per_pair * 4,
                           algorithm=Hint("synth", tuple(hint.items())))


def _node_arc_lp(coll) -> float:
    """The max-concurrent-flow time (seconds) over the usable links: one flow family per
    source, conservation at every vertex, every link's total within ``T`` times its rate."""
    topo = coll.topology
    links = np.flatnonzero(usable_links(coll))
    src, dst = topo.link_src[links], topo.link_dst[links]
    # scaled to numbers near one (HiGHS's tolerances are absolute): seconds = T * unit / cmax
    cmax = float(topo.link_bandwidth[links].max())
    bw = topo.link_bandwidth[links].astype(float) / cmax
    V, E, group = topo.n_vertices, len(links), list(coll.group)
    pair = pair_bytes(coll).copy()
    np.fill_diagonal(pair, 0.0)
    unit = float(pair.max())
    pair /= unit
    k = len(group)
    n_var = k * E + 1
    rows, cols, vals, b_eq = [], [], [], []
    for r in range(k):
        supply = np.zeros(V)
        supply[group] -= pair[r]
        supply[group[r]] += pair[r].sum()
        for e in range(E):
            rows += [r * V + src[e], r * V + dst[e]]
            cols += [r * E + e, r * E + e]
            vals += [1.0, -1.0]
        b_eq.append(supply)
    a_eq = sp.csr_matrix((vals, (rows, cols)), shape=(k * V, n_var))
    cap_rows = np.tile(np.arange(E), k)
    a_ub = sp.csr_matrix((np.concatenate([np.ones(k * E), -bw]),
                          (np.concatenate([cap_rows, np.arange(E)]),
                           np.concatenate([np.arange(k * E), np.full(E, k * E)]))),
                         shape=(E, n_var))
    cost = np.zeros(n_var)
    cost[-1] = 1.0
    res = linprog(cost, A_ub=a_ub, b_ub=np.zeros(E), A_eq=a_eq, b_eq=np.concatenate(b_eq),
                  bounds=(0, None), method="highs")
    assert res.status == 0
    return float(res.x[-1]) * unit / cmax


def _check_valid(coll, sol) -> float:
    """Assert that ``sol`` is a valid routing of ``coll``; its busiest link's time."""
    topo = coll.topology
    ok = usable_links(coll)
    group = list(coll.group)
    demand = pair_bytes(coll)
    total = np.zeros((coll.n, coll.n))
    count = np.zeros((coll.n, coll.n), dtype=int)
    load = np.zeros(topo.n_links)
    for s, d, w, p in zip(sol.src.tolist(), sol.dst.tolist(), sol.weight.tolist(), sol.path,
                          strict=True):
        assert s != d and w > 0 and len(p) >= 1
        assert all(ok[e] for e in p)
        assert int(topo.link_src[p[0]]) == group[s] and int(topo.link_dst[p[-1]]) == group[d]
        for a, b in zip(p[:-1], p[1:], strict=True):
            assert int(topo.link_dst[a]) == int(topo.link_src[b])
        visited = [int(topo.link_src[e]) for e in p] + [group[d]]
        assert len(set(visited)) == len(visited)            # a simple path
        total[s, d] += w
        count[s, d] += 1
        load[list(p)] += w * demand[s, d]
    off = ~np.eye(coll.n, dtype=bool)
    np.testing.assert_allclose(total[off], 1.0, rtol=0, atol=1e-9)
    assert count[off].max() <= MAX_PATHS
    # the packer's limits: no share under MIN_SHARE of its pair's largest
    for s, d, w in zip(sol.src.tolist(), sol.dst.tolist(), sol.weight.tolist(), strict=True):
        top = max(x for a, b, x in zip(sol.src.tolist(), sol.dst.tolist(),
                                       sol.weight.tolist(), strict=True) if (a, b) == (s, d))
        assert w >= MIN_SHARE * top - 1e-12
    return float((load / topo.link_bandwidth).max())


@pytest.mark.slow
@pytest.mark.parametrize("dims, links", [
    ((3, 3, 3), [(0, 1)]),
    ((4, 4), [(0, 1), (5, 9)]),
    ((5, 4), [(0, 4), (1, 5), (6, 7)]),
])
def test_routed_paths_against_the_node_arc_lp(dims, links):
    coll = _a2a(dims, links)
    sol = routed_flows(coll)
    assert sol.status == "routed" and sol.symmetry == 1
    busiest = _check_valid(coll, sol)
    lp = _node_arc_lp(coll)
    # the certified time is a lower bound on the LP, the paths' busiest link an upper one
    assert sol.lp_time <= lp * (1 + 1e-6)
    assert busiest >= lp * (1 - 1e-6)
    assert sol.lp_time >= 0.97 * lp
    assert busiest <= 1.06 * lp


@st.composite
def _faults(draw):
    t = torus("t", (4, 4), routing="none")
    n = draw(st.integers(1, 3))
    picks = draw(st.lists(st.integers(0, t.n_links - 1), min_size=n, max_size=n, unique=True))
    return [(int(t.link_src[e]), int(t.link_dst[e])) for e in picks]


@pytest.mark.slow
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_faults())
@example(links=[(14, 15), (5, 4), (0, 4)])
@example(links=[(14, 13), (2, 3), (10, 14)])
def test_routed_paths_over_fault_positions(links):
    coll = _a2a((4, 4), links)
    assume(group_connected(coll))
    sol = routed_flows(coll)
    busiest = _check_valid(coll, sol)
    lp = _node_arc_lp(coll)
    assert sol.lp_time <= lp * (1 + 1e-6) <= busiest * (1 + 2e-6)
    # with the candidates sized for 512 ranks (3 fewest-hop seeds, 6 slots per pair) the two
    # examples above were 10.6% and 9.3% above the LP (missing paths the LP uses); with the
    # small groups' 6 seeds and 10 slots 0.2% and 0.8%, and the worst of 120 random draws
    # 6.6% ([(13, 1), (5, 4), (5, 6)]; the re-balancing is a heuristic)
    assert busiest <= 1.10 * lp


@pytest.mark.slow
def test_solve_flows_routes_above_the_threshold(monkeypatch):
    coll = _a2a((3, 3, 3), [(0, 1)])
    assert solve_flows(coll).status != "routed"
    monkeypatch.setattr(flows_mod, "ROUTE_ABOVE", 10)
    sol = solve_flows(coll)
    assert sol.status == "routed"
    _check_valid(coll, sol)


@pytest.mark.slow
def test_routed_synth_schedule_verifies(monkeypatch):
    monkeypatch.setattr(flows_mod, "ROUTE_ABOVE", 10)
    coll = _a2a((3, 3, 3), [(0, 1)], budget=120)
    schedule = get("synth").build(coll, budget=120)
    verify(schedule)
    params = dict(schedule.params)
    assert params["solver"] == "routed"
    assert params["status"] in ("routed", "fallback")
    assert 0 < params["lp_fraction"] <= 1.0


def test_trace_rebuilds_the_routed_flows():
    coll = _a2a((4, 4), [(0, 1), (5, 9)])
    topo = coll.topology
    links = np.flatnonzero(usable_links(coll))
    src, dst = topo.link_src[links].astype(np.int64), topo.link_dst[links].astype(np.int64)
    cap = topo.link_bandwidth[links] / topo.link_bandwidth[links].max()
    group = np.asarray(coll.group)
    pair = pair_bytes(coll) / pair_bytes(coll).max()
    np.fill_diagonal(pair, 0.0)
    args = (topo.n_vertices, src, dst, cap, group, pair)
    plain = [f.copy() for f, _ in route_alltoall(*args, lower=1.0, passes=3, target_gap=0.0)]
    trace: list = []
    traced = [f.copy() for f, _ in route_alltoall(*args, lower=1.0, passes=3, target_gap=0.0,
                                                  trace=trace)]
    for a, b in zip(plain, traced, strict=True):
        np.testing.assert_array_equal(a, b)                # the trace changes nothing
    flows = fewest_hop_split(topo.n_vertices, src, dst, group, pair)
    for lo, hi, step, into in trace:
        tree = np.zeros((hi - lo, len(src)))
        for r in range(hi - lo):
            for j, v in enumerate(group.tolist()):
                while v != group[lo + r]:                   # walk the tree up to the root
                    e = into[r, v]
                    tree[r, e] += pair[lo + r, j]
                    v = int(src[e])
        flows[lo:hi] += step * (tree - flows[lo:hi])
    np.testing.assert_allclose(flows, traced[-1], rtol=1e-9, atol=1e-12)
