"""The routed alltoall LP bracket (certified prices below, a routed feasible flow above: the
path ``bounds`` takes above PDLP's limit) against independent references: the full LP written
from scratch (scipy's HiGHS, no symmetry), flow conservation checked link by link, a
closed-form load on healthy rings and tori, and the cut bound."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_bounds_lp_certified import _exact_or_skip, _links, _uniform, faulty_tori, full_lp

import cclc.bounds as bounds_module
from cclc.bounds import cut_bound, lp_bound
from cclc.collective import CollectiveKind, DType, make_collective
from cclc.flow_lp import alltoall_lp_routed
from cclc.flow_route import fewest_hop_split, route_alltoall, tree_loads
from cclc.topology import torus, with_faults

K = CollectiveKind
B = 10e9


def _net_outflow(n_vertices, src, dst, flows):
    """Per family, what leaves each vertex minus what enters it (numpy, link by link)."""
    out = np.zeros((len(flows), n_vertices))
    for r, f in enumerate(flows):
        np.add.at(out[r], src, f)
        np.add.at(out[r], dst, -f)
    return out


def _supply(n_vertices, group, pair):
    sup = np.zeros((len(group), n_vertices))
    for r in range(len(group)):
        sup[r, group] -= pair[r]
        sup[r, group[r]] += pair[r].sum()
    return sup


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(faulty_tori(), st.integers(0, 2 ** 31 - 1), st.booleans())
def test_every_routed_flow_conserves_and_no_flow_beats_the_exact_lp(topo, seed, uniform):
    group, pair = _uniform(topo, None if uniform else seed)
    exact = _exact_or_skip(topo, group, pair)
    src, dst, bw = _links(topo)
    cap = bw / bw.max()
    want = _supply(topo.n_vertices, group, pair)
    start = fewest_hop_split(topo.n_vertices, src, dst, group, pair)
    assert np.allclose(_net_outflow(topo.n_vertices, src, dst, start), want, atol=1e-9)
    assert (start >= 0).all()
    for flows, length in route_alltoall(topo.n_vertices, src, dst, cap, group, pair,
                                        lower=exact, passes=3, target_gap=0.0):
        assert (flows >= -1e-12).all() and (length > 0).all()
        assert np.allclose(_net_outflow(topo.n_vertices, src, dst, flows), want, atol=1e-8)
        assert (flows.sum(axis=0) / cap).max() >= exact * (1 - 1e-9)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(faulty_tori(), st.integers(0, 2 ** 31 - 1), st.booleans())
def test_the_routed_bracket_holds_the_exact_lp(topo, seed, uniform):
    """lower <= the exact optimum <= upper, and the printed gap is upper over lower."""
    group, pair = _uniform(topo, None if uniform else seed)
    exact = _exact_or_skip(topo, group, pair)
    src, dst, bw = _links(topo)
    cert = alltoall_lp_routed(topo.n_vertices, src, dst, bw / bw.max(), group, pair, (),
                              passes=10, target_gap=5e-3)
    assert cert.lower <= exact * (1 + 1e-9)
    assert cert.upper >= exact * (1 - 1e-9)
    assert cert.upper == pytest.approx(cert.lower * (1 + cert.gap), rel=1e-12)
    assert cert.method == "routed" and 1 <= cert.iterations <= 10


@pytest.mark.parametrize("dims", [(8,), (6, 6), (4, 4, 4)])
def test_the_fewest_hop_split_of_a_healthy_torus_is_the_lp_optimum(dims):
    """On a healthy torus with even sides the split loads every link equally, with the sum of
    all pairs' hop distances (counted here from the coordinates) over the number of links:
    the hop-bytes bound, so the split is the LP's optimum."""
    topo = torus("t", dims, bandwidth=B)
    group, pair = _uniform(topo)
    src, dst, bw = _links(topo)
    flows = fewest_hop_split(topo.n_vertices, src, dst, group, pair)
    load = flows.sum(axis=0)
    coords = np.array(np.unravel_index(np.arange(topo.n_vertices), dims))
    hops = sum(np.minimum(np.abs(c[:, None] - c[None, :]), m - np.abs(c[:, None] - c[None, :]))
               for c, m in zip(coords, dims, strict=True))
    assert load == pytest.approx(np.full(len(src), hops.sum() / len(src)), rel=1e-12)


def test_tree_loads_route_every_byte_down_one_tree():
    topo = with_faults(torus("t", (4, 4), bandwidth=B), links=[(0, 1), (5, 6)])
    group, pair = _uniform(topo, 3)
    src, dst, _ = _links(topo)
    demand = np.zeros((len(group), topo.n_vertices))
    demand[:, group] = pair
    rng = np.random.default_rng(0)
    loads, length = tree_loads(topo.n_vertices, src, dst, group, demand,
                               rng.uniform(0.5, 2.0, len(src)))
    assert np.allclose(_net_outflow(topo.n_vertices, src, dst, loads),
                       _supply(topo.n_vertices, group, pair), atol=1e-9)
    # one tree: every vertex but the root is fed by exactly one link
    for r in range(len(group)):
        fed = np.bincount(dst[loads[r] > 0], minlength=topo.n_vertices)
        assert fed.max() <= 1


@pytest.mark.slow
def test_bounds_above_the_pdlp_limit_route_and_keep_the_cut_bound(monkeypatch):
    """Forced on a small faulty torus: ``lp_bound`` takes the routed path, says so, is at
    least the cut bound (the cut's links are one of its certificates) and at most the full
    LP solved from scratch."""
    topo = with_faults(torus("t", (4, 4, 4), bandwidth=B), links=[(0, 1), (1, 0), (21, 22)])
    group, pair = _uniform(topo)
    n = len(group)
    coll = make_collective("a", K.ALLTOALL, topo, tuple(group), size=n * n, dtype=DType.UINT8)
    exact = full_lp(topo, group, pair) * n / B          # n bytes per pair
    monkeypatch.setattr(bounds_module, "LP_EXACT_MAX_VARIABLES", 0)
    monkeypatch.setattr(bounds_module, "LP_PDLP_MAX_VARIABLES", 0)
    routed = lp_bound(coll, max_variables=10 ** 9)
    assert "routed feasible flow" in routed.description
    assert cut_bound(coll).seconds * (1 - 1e-12) <= routed.seconds
    assert routed.seconds <= exact * (1 + 1e-9)


def test_the_pdlp_certificate_is_never_below_the_cut_bound(monkeypatch):
    """The best cut's links are one of PDLP's certificates too (PDLP's own prices may land a
    hair below the cut bound when the cut is the optimum)."""
    topo = with_faults(torus("t", (5, 5), bandwidth=B), links=[(0, 1), (1, 0), (12, 13)])
    group, pair = _uniform(topo)
    n = len(group)
    coll = make_collective("a", K.ALLTOALL, topo, tuple(group), size=n * n, dtype=DType.UINT8)
    monkeypatch.setattr(bounds_module, "LP_EXACT_MAX_VARIABLES", 0)
    b = lp_bound(coll)
    assert "certified lower value of PDLP" in b.description
    assert b.seconds >= cut_bound(coll).seconds * (1 - 1e-12)
    assert b.seconds <= full_lp(topo, group, pair) * n / B * (1 + 1e-9)
