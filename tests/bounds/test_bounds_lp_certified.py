"""The certified alltoall LP bound (PDLP + weak duality) against independent references: the
full LP written from scratch (scipy's HiGHS, one family per source, no symmetry), the
closed-form hop-bytes and cut bounds that particular link lengths must reproduce, brute-force
flow conservation, and every registered algorithm's simulated time."""

from __future__ import annotations

from dataclasses import replace

import networkx as nx
import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from scipy.optimize import linprog

import cclc.bounds as bounds_module
from cclc.algorithms import algorithms_for
from cclc.bounds import bounds, hop_bytes_bound, lp_bound
from cclc.cli import main
from cclc.collective import CollectiveKind, DType, Hint, make_collective
from cclc.errors import CclError, CollectiveError
from cclc.flow_dual import certified_time
from cclc.flow_lp import Symmetry, _repair, alltoall_lp_certified
from cclc.sim import simulate
from cclc.topology import torus, with_faults
from cclc.verify import verify

K = CollectiveKind
B = 10e9
#: how far below the exact optimum the certified bound may be (PDLP at 1e-4 relative)
TOLERANCE = 1e-3


def _links(topo):
    ok = ~topo.link_failed
    return (topo.link_src[ok].astype(np.int64), topo.link_dst[ok].astype(np.int64),
            topo.link_bandwidth[ok])


def full_lp(topo, group, pair) -> float:
    """min T: every pair's bytes routed within T x capacity on every healthy link (capacities
    in the units of ``cap`` below); one flow per (source, link), no symmetry."""
    src, dst, bw = _links(topo)
    cap = bw / bw.max()
    V, E, n = topo.n_vertices, len(src), len(group)
    g = np.asarray(group)
    rows, cols, vals = [], [], []
    b_eq = np.zeros(n * V)
    for s in range(n):
        rows += [s * V + src, s * V + dst]
        cols += [s * E + np.arange(E)] * 2
        vals += [np.ones(E), -np.ones(E)]
        b_eq[s * V + g] -= pair[s]
        b_eq[s * V + g[s]] += pair[s].sum()
    a_eq = sp.csr_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                         shape=(n * V, n * E + 1))
    a_ub = sp.hstack([sp.hstack([sp.identity(E)] * n), sp.csr_matrix(-cap.reshape(-1, 1))])
    c = np.zeros(n * E + 1)
    c[-1] = 1.0
    res = linprog(c, A_ub=a_ub.tocsr(), b_ub=np.zeros(E), A_eq=a_eq, b_eq=b_eq,
                  bounds=(0, None), method="highs-ds")
    assert res.status == 0, res.message
    return float(res.fun)


@st.composite
def faulty_tori(draw):
    dims = draw(st.sampled_from([(5,), (6,), (3, 3), (4, 3), (4, 4), (2, 3, 3), (3, 3, 3)]))
    wrap = draw(st.sampled_from([None, tuple(i != 0 for i in range(len(dims)))]))
    t = torus("t", dims, wrap=wrap,
              bandwidth=draw(st.sampled_from([B, [B * (1 + i) for i in range(len(dims))]])))
    picks = draw(st.lists(st.integers(0, t.n_links - 1), max_size=4, unique=True))
    pairs = [(int(t.link_src[i]), int(t.link_dst[i])) for i in picks]
    if draw(st.booleans()):
        pairs += [(v, u) for u, v in pairs]
    return with_faults(t, links=sorted(set(pairs)))


def _uniform(topo, seed: int | None = None):
    """The group (every live rank) and its per-pair bytes: uniform, or random when seeded."""
    group = np.asarray(topo.live_ranks())
    n = len(group)
    pair = np.ones((n, n)) if seed is None else np.random.default_rng(seed).uniform(0, 3, (n, n))
    np.fill_diagonal(pair, 0.0)
    return group, pair


def _exact_or_skip(topo, group, pair) -> float:
    assume((~topo.link_failed).any())
    try:
        return full_lp(topo, group, pair)
    except AssertionError:
        assume(False)                     # the faults disconnect a pair: no flow at all
        raise


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(faulty_tori(), st.integers(0, 2 ** 31 - 1), st.booleans())
def test_any_link_lengths_give_a_lower_bound(topo, seed, uniform):
    """Weak duality: whatever the lengths (random, many zero), never above the optimum."""
    group, pair = _uniform(topo, None if uniform else seed)
    exact = _exact_or_skip(topo, group, pair)
    src, dst, bw = _links(topo)
    rng = np.random.default_rng(seed)
    length = rng.exponential(size=len(src)) * (rng.random(len(src)) < 0.7)
    got = certified_time(topo.n_vertices, src, dst, bw / bw.max(), group, pair, length)
    assert got <= exact * (1 + 1e-9)


@pytest.mark.parametrize("faults", [[], [(0, 1)], [(0, 1), (1, 0), (7, 8)]])
def test_unit_lengths_are_the_hop_bytes_bound(faults):
    topo = with_faults(torus("t", (4, 5), bandwidth=[B, 2 * B]), links=faults)
    group, pair = _uniform(topo)
    src, dst, bw = _links(topo)
    got = certified_time(topo.n_vertices, src, dst, bw, group, pair, np.ones(len(src)))
    coll = make_collective("a", K.ALLTOALL, topo, tuple(group), size=len(group) ** 2,
                           dtype=DType.UINT8)
    # pair bytes here are 1 each, the collective's n (size n^2 over n ranks)
    assert got * len(group) == pytest.approx(hop_bytes_bound(coll).seconds, rel=1e-12)


@pytest.mark.parametrize("dims", [(6,), (4, 4), (3, 3, 3)])
def test_cut_lengths_are_the_cut_bound(dims):
    """Lengths 1 on the links leaving a vertex set, 0 elsewhere: the bytes that must leave
    it over the capacity leaving it, counted here pair by pair (both sides connected, so no
    pair inside a side needs to cross)."""
    topo = torus("t", dims, bandwidth=B)
    group, pair = _uniform(topo, 7)
    src, dst, bw = _links(topo)
    side = np.zeros(topo.n_vertices, dtype=bool)
    side[: topo.n_vertices // 2] = True
    leaving = side[src] & ~side[dst]
    got = certified_time(topo.n_vertices, src, dst, bw, group, pair, leaving.astype(float))
    need = sum(pair[i, j] for i in range(len(group)) for j in range(len(group))
               if side[group[i]] and not side[group[j]])
    assert got == pytest.approx(need / bw[leaving].sum(), rel=1e-12)


@settings(max_examples=15, deadline=None)
@given(faulty_tori(), st.integers(0, 2 ** 31 - 1))
def test_the_certificate_against_networkx_distances(topo, seed):
    group, pair = _uniform(topo, seed)
    src, dst, bw = _links(topo)
    rng = np.random.default_rng(seed)
    length = rng.integers(0, 4, size=len(src)).astype(float)
    g = nx.DiGraph()
    g.add_nodes_from(range(topo.n_vertices))
    for u, v, w in zip(src.tolist(), dst.tolist(), length.tolist(), strict=True):
        if not g.has_edge(u, v) or g[u][v]["w"] > w:
            g.add_edge(u, v, w=w)
    dist = dict(nx.all_pairs_dijkstra_path_length(g, weight="w"))
    n = len(group)
    if any(int(group[j]) not in dist[int(group[i])] for i in range(n) for j in range(n)):
        want = float("inf")
    else:
        want = sum(pair[i, j] * dist[int(group[i])][int(group[j])] for i in range(n)
                   for j in range(n)) / float((bw * length).sum())
    got = certified_time(topo.n_vertices, src, dst, bw, group, pair, length)
    if length.any():
        assert got == pytest.approx(want, rel=1e-9)
    else:
        assert got == 0.0


@pytest.mark.slow
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(faulty_tori(), st.booleans(), st.integers(0, 2 ** 31 - 1))
def test_the_certified_lp_brackets_the_exact_lp(topo, uniform, seed):
    """lower <= the exact optimum <= upper, and lower within TOLERANCE of it (no symmetry
    used: the certificate must not depend on it)."""
    group, pair = _uniform(topo, None if uniform else seed)
    exact = _exact_or_skip(topo, group, pair)
    src, dst, bw = _links(topo)
    sym = Symmetry.trivial(topo.n_vertices, src, dst)
    cert = alltoall_lp_certified(topo.n_vertices, src, dst, bw / bw.max(), group, pair, sym,
                                 tolerance=1e-4, iteration_limit=20_000)
    assert cert.lower <= exact * (1 + 1e-9)
    assert cert.upper >= exact * (1 - 1e-9)
    assert cert.lower >= exact * (1 - TOLERANCE)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(faulty_tori())
def test_lp_bound_through_pdlp_and_the_symmetries_against_the_full_lp(topo):
    """The path ``bounds`` takes above the exact limit (symmetry-reduced, then certified),
    forced on small tori: never above the full LP, within TOLERANCE of it."""
    group, pair = _uniform(topo)
    exact = _exact_or_skip(topo, group, pair)
    _, _, bw = _links(topo)
    coll = make_collective("a", K.ALLTOALL, topo, tuple(group), size=len(group) ** 2,
                           dtype=DType.UINT8)
    saved = bounds_module.LP_EXACT_MAX_VARIABLES
    bounds_module.LP_EXACT_MAX_VARIABLES = 0
    try:
        b = lp_bound(coll)
    finally:
        bounds_module.LP_EXACT_MAX_VARIABLES = saved
    assert "certified" in b.description
    exact_s = exact * len(group) / bw.max()      # n bytes per pair
    assert exact_s * (1 - TOLERANCE) <= b.seconds <= exact_s * (1 + 1e-9)


@settings(max_examples=20, deadline=None)
@given(faulty_tori(), st.integers(0, 2 ** 31 - 1))
def test_the_repaired_flow_conserves_exactly(topo, seed):
    """Any nonnegative flows come back conserving each family's supply at every vertex."""
    group, pair = _uniform(topo, seed)
    src, dst, _ = _links(topo)
    V, E, n = topo.n_vertices, len(src), len(group)
    from scipy.sparse.csgraph import connected_components
    adj = sp.csr_matrix((np.ones(E), (src, dst)), shape=(V, V))
    assume(connected_components(adj, directed=True, connection="strong")[0] == 1)
    supply = np.zeros((n, V))
    supply[:, group] = -pair
    supply[np.arange(n), group] += pair.sum(axis=1)
    flow = np.random.default_rng(seed).exponential(size=(n, E))
    fixed = _repair(V, src, dst, supply, group, flow)
    assert (fixed >= flow).all()
    for r in range(n):
        net = np.zeros(V)
        np.add.at(net, src, fixed[r])
        np.subtract.at(net, dst, fixed[r])
        assert net == pytest.approx(supply[r], abs=1e-9 * (1 + flow.sum()))


def _faulty_5x5x5():
    return with_faults(torus("t5", (5, 5, 5), bandwidth=B, latency=1e-7), links=[(0, 1)])


@pytest.mark.slow
def test_a_faulty_5x5x5_torus_is_certified_by_default():
    """22 350 flow variables: above the exact LP's limit, so PDLP and the certificate; the
    bound is the exact LP's (which HiGHS solves here in seconds) to TOLERANCE."""
    topo = _faulty_5x5x5()
    coll = make_collective("a", K.ALLTOALL, topo, topo.live_ranks(), size=125 * 1000,
                           dtype=DType.UINT8)
    b = lp_bound(coll)
    assert "certified" in b.description and "feasible flow" in b.description
    src, dst, bw = _links(topo)
    group, pair = _uniform(topo)
    from cclc.flow_lp import alltoall_lp_time, torus_symmetry
    sym = torus_symmetry(topo, src, dst, bw, group, None)
    exact = alltoall_lp_time(topo.n_vertices, src, dst, bw / bw.max(), group, pair, sym)
    exact_s = exact * 1000 / bw.max()     # 1000 B per pair, capacities over the largest
    assert exact_s * (1 - TOLERANCE) <= b.seconds <= exact_s * (1 + 1e-9)
    # the bound the reports print is the strongest, and LP >= cut >= hop-bytes on this torus
    assert bounds(coll).best >= b.seconds


def test_cclc_bounds_prints_the_certified_lp(tmp_path, capsys):
    path = tmp_path / "t.ccl"
    path.write_text("topology pod = torus(5, 5, 5) {\n    link 10 GB/s, 100 ns\n"
                    "    fault link (0,0,0) -> (0,0,1)\n}\n\n"
                    "collective a2a = alltoall on pod {\n    size 500 KB\n}\n")
    assert main(["bounds", str(path)]) == 0
    out = capsys.readouterr().out
    import dsl
    coll = dsl.load(str(path)).collectives[0]
    lp = bounds(coll)["lp"]
    line = next(x for x in out.splitlines() if x.strip().lstrip("*").strip().startswith("lp "))
    assert f"{lp.seconds * 1e6:.3f} us" in line and "certified" in line


@pytest.mark.parametrize("dims,faults", [((4, 4), [(0, 1)]), ((3, 3, 3), [(0, 1), (1, 0)])])
def test_no_registered_algorithm_beats_the_certified_bound(monkeypatch, dims, faults):
    monkeypatch.setattr(bounds_module, "LP_EXACT_MAX_VARIABLES", 0)   # the PDLP path
    topo = with_faults(torus("t", dims, bandwidth=B, latency=1e-7), links=faults)
    n = topo.n_ranks
    try:
        coll = make_collective("a", K.ALLTOALL, topo, topo.live_ranks(), size=n * n * 64,
                               dtype=DType.UINT8)
    except CollectiveError:
        pytest.skip("disconnected")
    b = bounds(coll)
    assert "certified" in b["lp"].description
    timed = 0
    for algo in algorithms_for(coll):
        c = replace(coll, algorithm=Hint(algo.name))
        params = {"race": 0} if algo.name == "synth" else {}
        if algo.applicable(c, **params) is not None:
            continue
        try:
            s = algo.build(c, **params)
        except CclError:
            continue
        verify(s)
        assert float(simulate(s).time) >= b.best * (1 - 1e-9), algo.name
        timed += 1
    assert timed >= 2
