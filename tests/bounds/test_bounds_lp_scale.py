"""The LP bound at scale: the symmetry-reduced alltoall LP against an independent full LP
(scipy's linprog, one family per source, no symmetry), the torus symmetries against networkx's
automorphism count, the max-flow LPs against networkx max-flow, and the LP against the closed
forms it dominates."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from networkx.algorithms.isomorphism import DiGraphMatcher
from scipy.optimize import linprog

from cclc.bounds import bounds, lp_bound, lp_size
from cclc.collective import CollectiveKind, DType, make_collective
from cclc.errors import CollectiveError
from cclc.flow_lp import torus_symmetry
from cclc.topology import torus, with_faults

K = CollectiveKind
B = 10e9
REL = 1e-6


def coll(topo, kind, size, group=None, **kw):
    group = tuple(topo.live_ranks()) if group is None else tuple(group)
    root = 0 if kind in (K.BROADCAST, K.REDUCE) else None
    return make_collective("c", kind, topo, group, size=size, dtype=DType.UINT8, root=root, **kw)


def full_alltoall_lp(topo, group, pair: np.ndarray, method: str = "highs-ds") -> float:
    """Seconds: min T such that every pair's bytes route within T x bandwidth on every healthy
    link; one flow per (source, link), written here from scratch."""
    ok = ~topo.link_failed
    src, dst = topo.link_src[ok].astype(int), topo.link_dst[ok].astype(int)
    # GB/s and kB: HiGHS's tolerances are absolute (1e-7), so keep the numbers near 1; the
    # optimum is then in microseconds
    bw = topo.link_bandwidth[ok] / 1e9
    V, E, n = topo.n_vertices, len(src), len(group)
    g = np.asarray(group)
    n_var = n * E + 1
    eq_rows, eq_cols, eq_vals = [], [], []
    b_eq = np.zeros(n * V)
    for s in range(n):
        for e in range(E):
            eq_rows += [s * V + src[e], s * V + dst[e]]
            eq_cols += [s * E + e, s * E + e]
            eq_vals += [1.0, -1.0]
        b_eq[s * V + g] -= pair[s] / 1e3
        b_eq[s * V + g[s]] += pair[s].sum() / 1e3
    a_eq = sp.csr_matrix((eq_vals, (eq_rows, eq_cols)), shape=(n * V, n_var))
    ub_rows = [e for s in range(n) for e in range(E)] + list(range(E))
    ub_cols = [s * E + e for s in range(n) for e in range(E)] + [n * E] * E
    ub_vals = [1.0] * (n * E) + list(-bw)
    a_ub = sp.csr_matrix((ub_vals, (ub_rows, ub_cols)), shape=(E, n_var))
    c = np.zeros(n_var)
    c[-1] = 1.0
    res = linprog(c, A_ub=a_ub, b_ub=np.zeros(E), A_eq=a_eq, b_eq=b_eq, bounds=(0, None),
                  method=method)
    assert res.status == 0, res.message
    return float(res.fun) * 1e-6


@st.composite
def faulty_small_tori(draw):
    dims = draw(st.sampled_from([(3, 3), (4, 3), (5,), (6,), (4, 4), (2, 3, 3), (3, 3, 3),
                                 (5, 5)]))
    wrap = draw(st.sampled_from([None, tuple(i != 0 for i in range(len(dims)))]))
    bw = draw(st.sampled_from([B, None]))
    t = torus("t", dims, wrap=wrap,
              bandwidth=[B * (1 + i) for i in range(len(dims))] if bw is None else B)
    picks = draw(st.lists(st.integers(0, t.n_links - 1), min_size=0, max_size=4, unique=True))
    both = draw(st.booleans())
    pairs = []
    for i in picks:
        u, v = int(t.link_src[i]), int(t.link_dst[i])
        pairs.append((u, v))
        if both:
            pairs.append((v, u))
    return with_faults(t, links=sorted(set(pairs)))


@settings(max_examples=25, deadline=None)
@given(faulty_small_tori())
def test_reduced_alltoall_lp_equals_the_full_lp(topo):
    try:
        c = coll(topo, K.ALLTOALL, topo.n_ranks * 1000)
    except CollectiveError:
        assume(False)                     # the faults disconnect the torus
    try:
        want = full_alltoall_lp(topo, c.group, np.full((c.n, c.n), 1000.0)
                                - np.diag(np.full(c.n, 1000.0)))
    except AssertionError:
        assume(False)                     # disconnected: no flow
    assert lp_bound(c).seconds == pytest.approx(want, rel=REL)


@settings(max_examples=10, deadline=None)
@given(st.sampled_from([(6,), (3, 3), (4, 3)]), st.integers(0, 2 ** 31 - 1), st.booleans())
def test_reduced_lp_with_per_pair_sizes(dims, seed, circulant):
    """Sizes that repeat under translation keep the symmetry; random ones break it."""
    t = torus("t", dims, bandwidth=B)
    n = t.n_ranks
    rng = np.random.default_rng(seed)
    if circulant and len(dims) == 1:
        per_offset = rng.integers(1, 5000, size=n)
        pair = np.array([[per_offset[(j - i) % n] for j in range(n)] for i in range(n)])
    else:
        pair = rng.integers(0, 5000, size=(n, n))
    np.fill_diagonal(pair, 0)
    c = coll(t, K.ALLTOALL, int(pair.sum()), pair_sizes=pair)
    assert lp_bound(c).seconds == pytest.approx(full_alltoall_lp(t, c.group, pair.astype(float)),
                                                rel=REL)
    if circulant and len(dims) == 1:
        assert lp_size(c)[0] < n          # the translations survive


def _automorphisms(topo) -> int:
    """networkx's count of the healthy directed graph's automorphisms keeping bandwidths."""
    g = nx.DiGraph()
    g.add_nodes_from(range(topo.n_vertices))
    for e in np.flatnonzero(~topo.link_failed):
        g.add_edge(int(topo.link_src[e]), int(topo.link_dst[e]),
                   bw=float(topo.link_bandwidth[e]))
    matcher = DiGraphMatcher(g, g, edge_match=lambda a, b: a["bw"] == b["bw"])
    return sum(1 for _ in matcher.isomorphisms_iter())


@pytest.mark.slow
@pytest.mark.parametrize("dims,wrap", [((5, 5), None), ((3, 4), None), ((3, 3, 3), None),
                                       ((5, 3), (True, False)), ((4, 3), (False, False))])
def test_torus_symmetries_are_the_graph_automorphisms(dims, wrap):
    t = torus("t", dims, wrap=wrap, bandwidth=B)
    ok = ~t.link_failed
    sym = torus_symmetry(t, t.link_src[ok].astype(np.int64), t.link_dst[ok].astype(np.int64),
                         t.link_bandwidth[ok], np.arange(t.n_ranks), None)
    assert sym.order == _automorphisms(t)


@pytest.mark.parametrize("faults", [[(0, 1)], [(0, 1), (1, 0)], [(0, 5), (12, 17)]])
def test_symmetries_kept_by_faults_are_automorphisms(faults):
    t = with_faults(torus("t", (5, 5), bandwidth=B), links=faults)
    ok = ~t.link_failed
    sym = torus_symmetry(t, t.link_src[ok].astype(np.int64), t.link_dst[ok].astype(np.int64),
                         t.link_bandwidth[ok], np.arange(t.n_ranks), None)
    # every torus automorphism of the healthy graph is one: the count matches networkx's
    assert sym.order == _automorphisms(t)
    assert sym.order < 200


def test_a_healthy_torus_is_one_family_and_equals_the_bisection():
    t = torus("t", (8, 8, 8), bandwidth=B)
    c = coll(t, K.ALLTOALL, 512 * 4096)
    assert lp_size(c) == (1, 3072)
    # 8x8x8: the bisection of one dimension, 2 x 64 links each way, carries 256 x 256 pairs
    assert lp_bound(c).seconds == pytest.approx(256 * 256 * 4096 / (128 * B), rel=REL)


@pytest.mark.parametrize("kind", [K.BROADCAST, K.REDUCE, K.ALLGATHER])
@pytest.mark.parametrize("faults", [[], [(0, 1), (1, 0), (4, 5)], [(1, 2), (6, 7), (0, 3)]])
def test_max_flow_lps_against_networkx_max_flow(kind, faults):
    t = with_faults(torus("t", (4, 3), wrap=(True, False), bandwidth=[B, 2 * B]), links=faults)
    n, S = t.n_ranks, 1200.0 * t.n_ranks
    g = nx.DiGraph()
    for e in np.flatnonzero(~t.link_failed):
        g.add_edge(int(t.link_src[e]), int(t.link_dst[e]), capacity=float(t.link_bandwidth[e]))
    if kind is K.BROADCAST:      # S from rank 0 to each rank
        want = max(S / nx.maximum_flow_value(g, 0, v) for v in range(1, n))
    elif kind is K.REDUCE:       # S from each rank to rank 0
        want = max(S / nx.maximum_flow_value(g, v, 0) for v in range(1, n))
    else:                        # S/n from every other rank into each rank
        # rank i takes lambda S/n from each other rank when a super source feeding every other
        # rank lambda S/n fills the max-flow into i: bisect on lambda (the max-flow is
        # monotone in it), with networkx's max-flow deciding each step
        want = 0.0
        for i in range(n):
            h = g.copy()
            lo, hi = 0.0, 1.0
            while True:
                for v in range(n):
                    if v != i:
                        h.add_edge("src", v, capacity=hi * S / n)
                if nx.maximum_flow_value(h, "src", i) < (n - 1) * hi * S / n * (1 - 1e-12):
                    break
                lo, hi = hi, 2 * hi
            while hi - lo > 1e-10 * hi:
                mid = (lo + hi) / 2
                for v in range(n):
                    if v != i:
                        h["src"][v]["capacity"] = mid * S / n
                full = nx.maximum_flow_value(h, "src", i) >= (n - 1) * mid * S / n * (1 - 1e-12)
                lo, hi = (mid, hi) if full else (lo, mid)
            want = max(want, 1 / lo)
    assert lp_bound(coll(t, kind, int(S))).seconds == pytest.approx(want, rel=1e-6)


@settings(max_examples=20, deadline=None)
@given(faulty_small_tori(), st.sampled_from(list(K)))
def test_the_lp_dominates_the_closed_forms(topo, kind):
    try:
        c = coll(topo, kind, topo.n_ranks * 4 * 64)
    except CollectiveError:
        assume(False)
    try:
        b = bounds(c)
    except Exception as e:                # a disconnected group: the LP says so, clearly
        assert "disconnected" in str(e) or "no healthy link" in str(e)
        assume(False)
    lp = b["lp"].seconds
    assert lp >= b["cut"].seconds * (1 - 1e-6)
    if kind is not K.ALLREDUCE:           # AR's injection counts the best rank, not a flow
        assert lp >= b["injection"].seconds * (1 - 1e-6)
    if kind in (K.ALLTOALL,):
        assert lp >= b["hop_bytes"].seconds * (1 - 1e-6)


def test_the_lp_scales_with_the_size_and_is_kept():
    t = with_faults(torus("t", (4, 4, 4), bandwidth=B), links=[(0, 1)])
    small, big = coll(t, K.ALLTOALL, 64 * 100), coll(t, K.ALLTOALL, 64 * 300)
    first = lp_bound(small).seconds
    assert lp_bound(big).seconds == pytest.approx(3 * first, rel=1e-12)
    assert lp_bound(small).seconds == first
