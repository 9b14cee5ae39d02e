"""Multi-dimensional torus AllToAll (cclc.algorithms.torus_alltoall): per-link bytes against the
closed forms, speed-ups, faults, non-uniform sizes, and property tests over random tori."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cclc.algorithms import get
from cclc.algorithms.torus_alltoall import (
    ALGORITHMS,
    build_for_sizes,
    build_torus_alltoall,
    torus_faults,
)
from cclc.bounds import bounds
from cclc.collective import CollectiveKind, make_collective
from cclc.errors import CollectiveError
from cclc.numeric import check_numeric
from cclc.sim import simulate
from cclc.topology import torus, with_faults
from cclc.verify import verify

BW = 32e9
LAT = 100e-9


def a2a(topo, size=None, pair_sizes=None):
    live = topo.live_ranks()
    return make_collective("a2a", CollectiveKind.ALLTOALL, topo, live,
                           size=size if pair_sizes is None else None, pair_sizes=pair_sizes)


def fail_edge(topo, a, b, both=True):
    u, v = topo.rank_at(a), topo.rank_at(b)
    return with_faults(topo, links=[(u, v), (v, u)] if both else [(u, v)])


def check(s):
    """Everything a torus schedule must satisfy."""
    verify(s)
    check_numeric(s, dtypes=None)
    topo = s.topology
    assert not topo.link_failed[s.routes.links].any(), "a route crosses a failed link"
    # every op moves one ring hop (1 link), a FoldedRing edge (<= 2) or a MATE detour (3)
    lengths = s.routes.lengths()[s.ops.route]
    assert lengths.max() <= 3


# ---------------------------------------------------------------------------------------------
# closed forms on one ring


@pytest.mark.parametrize("n", [3, 4, 5, 6, 7, 8, 9])
def test_per_link_bytes_match_closed_forms(n):
    S = n * 4 * 840                      # divisible by every split used below
    t = torus("r", (n,), bandwidth=BW, latency=LAT)
    c = a2a(t, S)
    ring = build_torus_alltoall(c, "ring", "pipeline", chunks=1)
    half = build_torus_alltoall(c, "halfring", "dimrotation")
    for s in (ring, half):
        check(s)
    ring_bytes = simulate(ring).link_bytes
    half_bytes = simulate(half).link_bytes
    assert np.allclose(ring_bytes, (n - 1) * S / 4)
    want = (n * n - 1) * S / (8 * n) if n % 2 else n * S / 8
    assert np.allclose(half_bytes, want)


@pytest.mark.parametrize("n", [3, 4, 5, 6, 7, 8])
@pytest.mark.parametrize("pos", [0, 2])
def test_foldedring_even_load_on_every_surviving_link(n, pos):
    S = n * 4 * 60
    t = fail_edge(torus("r", (n,), bandwidth=BW), (pos % n,), ((pos + 1) % n,))
    s = build_torus_alltoall(a2a(t, S), "foldedring", "dimrotation")
    check(s)
    lb = simulate(s).link_bytes
    assert np.allclose(lb[~t.link_failed], (n - 1) * S / 2)
    assert not lb[t.link_failed].any()


def test_one_failed_direction_is_enough_to_fold():
    t = fail_edge(torus("r", (5,)), (1,), (2,), both=False)
    s = build_torus_alltoall(a2a(t, 5 * 4 * 10), "foldedring", "pipeline", chunks=2)
    check(s)


# ---------------------------------------------------------------------------------------------
# the "done when" speed-ups (bandwidth-bound, 2 GB)


def _time(s, mode="lockstep"):
    return simulate(s, mode=mode).time


def test_halfring_vs_ring_speedup_at_n5_is_5_over_3():
    t = torus("t", (5, 5), bandwidth=BW, latency=LAT)
    size = 2 * 10**9 // 100 * 100
    c = a2a(t, size)
    ring = build_torus_alltoall(c, "ring", "dimrotation")
    half = build_torus_alltoall(c, "halfring", "dimrotation")
    assert _time(ring) / _time(half) == pytest.approx(5 / 3, rel=0.02)


@pytest.mark.parametrize("dims", [(5, 5), (5, 5, 5)])
def test_dimrotation_vs_pipeline6_speedup(dims):
    t = torus("t", dims, bandwidth=BW, latency=LAT)
    D, K = len(dims), 6
    size = 2 * 10**9 // (t.n_ranks * 4 * 24) * (t.n_ranks * 4 * 24)
    c = a2a(t, size)
    pipe = build_torus_alltoall(c, "halfring", "pipeline", chunks=K)
    rot = build_torus_alltoall(c, "halfring", "dimrotation")
    assert _time(pipe) / _time(rot) == pytest.approx((K + D - 1) / K, rel=0.02)


def test_healthy_halfring_dimrotation_reaches_the_bandwidth_bound():
    t = torus("t", (5, 5), bandwidth=BW, latency=LAT)
    size = 128 * 2**20 // 100 * 100
    c = a2a(t, size)
    s = build_torus_alltoall(c, "halfring", "dimrotation")
    b = bounds(c, lp=False)
    assert b.best / _time(s) >= 0.97


def test_sizes_share_the_ops():
    t = torus("t", (3, 4))
    c = a2a(t, 12 * 4 * 6)
    small, big = build_for_sizes(c, [12 * 4 * 6, 12 * 4 * 6000], "halfring", "pipeline")
    assert small.ops is big.ops
    assert big.op_bytes().sum() == 1000 * small.op_bytes().sum()
    check(big)


# ---------------------------------------------------------------------------------------------
# MATE / MATEe


@pytest.mark.parametrize("dims,fault", [((5, 5), ((0, 0), (1, 0))), ((4, 4), ((2, 3), (2, 0))),
                                        ((5, 3), ((4, 1), (0, 1))),
                                        ((3, 2, 4), ((0, 1, 1), (1, 1, 1)))])
@pytest.mark.parametrize("name", ["mate", "matee"])
def test_mate_verifies_and_avoids_the_failed_link(dims, fault, name):
    t = fail_edge(torus("t", dims, bandwidth=BW, latency=LAT), *fault)
    c = a2a(t, t.n_ranks * 4 * 7 * 13)
    algo = get(name)
    assert algo.applicable(c) is None
    s = algo.build(c)
    check(s)
    assert (s.routes.lengths() == 3).any(), "no detours"


@pytest.mark.parametrize("name,extra", [("mate", 0.0), ("matee", 1.0)])
def test_mate_bandwidth_term_matches_the_derived_formula(name, extra):
    # T = T_HR(S) [1 + (1 - f)/((D-1) + rho)], rho = f = (N+1)/(4N) for odd N (event mode:
    # lanes of different length overlap as the paper's model assumes)
    n, D = 5, 2
    t = fail_edge(torus("t", (n, n), bandwidth=BW, latency=0.0), (0, 0), (1, 0))
    size = t.n_ranks * 4 * 10**5
    s = get(name).build(a2a(t, size))
    rho = (n + 1) / (4 * n)
    f = rho * extra
    t_hr = (n * n - 1) * size / (8 * n * BW)
    want = t_hr * (1 + (1 - f) / ((D - 1) + rho))
    assert simulate(s, mode="event").time == pytest.approx(want, rel=0.03)
    assert dict(s.params)["rho"] == pytest.approx(rho)


def test_mate_artifact_rho_swaps_the_formulas():
    t = fail_edge(torus("t", (5, 5)), (0, 0), (1, 0))
    s = get("mate").build(a2a(t, 25 * 4 * 100), rho="artifact")
    assert dict(s.params)["rho"] == pytest.approx(5 / 16)
    check(s)


# ---------------------------------------------------------------------------------------------
# what does not apply, and why


def test_failed_rank_sends_the_user_to_direct():
    t = with_faults(torus("t", (3, 3)), ranks=[4])
    c = a2a(t, 8 * 4 * 8)
    for name in ("halfring+dimrotation", "foldedring+pipeline", "mate"):
        reason = get(name).applicable(c)
        assert reason and "(1,1)" in reason and "direct" in reason


def test_two_failed_links_in_one_ring():
    t = torus("t", (5, 5))
    t = with_faults(t, links=[(t.rank_at((0, 0)), t.rank_at((1, 0))),
                              (t.rank_at((3, 0)), t.rank_at((4, 0)))])
    reason = get("foldedring+dimrotation").applicable(a2a(t, 25 * 4))
    assert "2 failed links" in reason and "direct" in reason


def test_faults_in_two_rings_fold_both_but_mate_declines():
    t = torus("t", (5, 5))
    t = with_faults(t, links=[(t.rank_at((0, 0)), t.rank_at((1, 0))),
                              (t.rank_at((2, 2)), t.rank_at((2, 3)))])
    c = a2a(t, 25 * 4 * 6)
    reason = get("mate").applicable(c)
    assert "2 rings" in reason and "foldedring+dimrotation" in reason
    check(get("foldedring+dimrotation").build(c))
    check(get("line+pipeline").build(c))


def test_healthy_algorithms_refuse_a_fault_and_name_alternatives():
    t = fail_edge(torus("t", (4, 4)), (0, 0), (0, 1))
    reason = get("halfring+pipeline").applicable(a2a(t, 16 * 4))
    assert "foldedring+pipeline" in reason and "mate" in reason
    healthy = a2a(torus("t", (4, 4)), 16 * 4)
    assert "halfring+dimrotation" in get("foldedring+dimrotation").applicable(healthy)
    with pytest.raises(CollectiveError):
        build_torus_alltoall(a2a(t, 16 * 4), "halfring", "pipeline")


def test_pipeline_parameters_are_checked():
    c = a2a(torus("t", (3, 4)), 12 * 4)
    assert get("halfring+pipeline").applicable(c, chunks=0)
    assert get("halfring+pipeline").applicable(c, order="00")
    assert get("halfring+dimrotation").applicable(c, chunks=3)
    s = get("halfring+pipeline").build(c, chunks=2, order="10")
    check(s)
    assert dict(s.params)["order"] == "10"


def test_not_alltoall_and_not_torus():
    t = torus("t", (4,))
    c = make_collective("ag", CollectiveKind.ALLGATHER, t, (0, 1, 2, 3), size=64)
    assert "alltoall" in get("mate").applicable(c)


# ---------------------------------------------------------------------------------------------
# non-uniform


@pytest.mark.parametrize("name", ["ring+pipeline", "halfring+dimrotation", "foldedring+pipeline",
                                  "mate", "matee"])
def test_non_uniform_sizes(name):
    t = torus("t", (4, 3))
    if name in ("foldedring+pipeline", "mate", "matee"):
        t = fail_edge(t, (1, 0), (2, 0))
    rng = np.random.default_rng(7)
    pairs = rng.integers(0, 9, size=(12, 12)) * 4
    pairs[3, 5] = 0
    s = get(name).build(a2a(t, pair_sizes=pairs))
    check(s)
    assert s.layouts[0].ndim == 2


# ---------------------------------------------------------------------------------------------
# properties over random tori


@st.composite
def tori(draw):
    n_dims = draw(st.integers(1, 4))
    dims = []
    for _ in range(n_dims):
        dims.append(draw(st.integers(2 if not dims else 1, 9)))
        if math.prod(dims) > 48:
            dims[-1] = max(1, 48 // math.prod(dims[:-1]))
    wrap = [draw(st.booleans()) if d > 2 else True for d in dims]
    if draw(st.integers(0, 4)) == 0:
        wrap = [d <= 1 for d in dims]
    return tuple(dims), tuple(wrap)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tori(), st.sampled_from(ALGORITHMS), st.sampled_from(["pipeline", "dimrotation"]),
       st.integers(0, 10**6), st.integers(1, 7))
def test_property_healthy_and_one_fault(shape, algorithm, schedule, fault_seed, block):
    dims, wrap = shape
    t = torus("t", dims, wrap=wrap, bandwidth=BW, latency=LAT)
    if algorithm in ("foldedring", "line"):
        # every fault position: one failed edge on a wrapped ring of >= 3
        rings = [d for d, (n, w) in enumerate(zip(dims, wrap, strict=True)) if w and n >= 3]
        if not rings:
            return
        d = rings[fault_seed % len(rings)]
        rank = (fault_seed // 7) % t.n_ranks
        a = t.coords(rank)
        b = list(a)
        b[d] = (b[d] + 1) % dims[d]
        t = fail_edge(t, a, tuple(b), both=bool(fault_seed % 2))
    c = a2a(t, t.n_ranks * 4 * block)
    algo = get(f"{algorithm}+{schedule}")
    reason = algo.applicable(c)
    if algorithm in ("ring", "halfring") and any(not w for w, n in zip(wrap, dims, strict=True)
                                                 if n > 1):
        assert reason is None     # meshes run Line on their dimensions
    assert reason is None, reason
    s = algo.build(c, chunks=3) if schedule == "pipeline" else algo.build(c)
    check(s)
    b = bounds(c, lp=c.n <= 16)
    assert simulate(s).time >= b.best * (1 - 1e-9)
    assert simulate(s, mode="event").time >= b.best * (1 - 1e-9)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(3, 6), min_size=2, max_size=3), st.integers(0, 10**6),
       st.sampled_from(["mate", "matee"]))
def test_property_mate_every_fault_position(dims, seed, name):
    dims = tuple(dims)
    if math.prod(dims) > 60:
        dims = dims[:2]
    t = torus("t", dims, bandwidth=BW, latency=LAT)
    d = seed % len(dims)
    a = t.coords((seed // 3) % t.n_ranks)
    b = list(a)
    b[d] = (b[d] + 1) % dims[d]
    t = fail_edge(t, a, tuple(b), both=bool(seed % 2))
    assert torus_faults(t).n_broken == 1
    c = a2a(t, t.n_ranks * 4 * 11)
    s = get(name).build(c)
    check(s)
    assert simulate(s).time >= bounds(c, lp=c.n <= 16).best * (1 - 1e-9)


@pytest.mark.parametrize("uniform", [True, False])
def test_group_in_any_order(uniform):
    t = fail_edge(torus("t", (3, 4)), (0, 1), (0, 2))
    order = tuple(np.random.default_rng(3).permutation(12).tolist())
    pairs = None if uniform else np.random.default_rng(4).integers(1, 5, size=(12, 12)) * 4
    c = make_collective("a2a", CollectiveKind.ALLTOALL, t, order,
                        size=12 * 4 * 5 if uniform else None, pair_sizes=pairs)
    for name in ("foldedring+pipeline", "mate"):
        check(get(name).build(c))


@pytest.mark.parametrize("name", ["mate", "matee"])
def test_slot_shares_verify_and_approximate_the_lane_shares(name):
    # slot shares: each part of the faulty ring's data is a range of whole slots (a large
    # torus keeps DimRotation's op count); exact lanes cut every chunk instead
    t = fail_edge(torus("t", (5, 5, 3), bandwidth=BW, latency=0.0), (0, 0, 1), (1, 0, 1))
    c = a2a(t, t.n_ranks * 4 * 1000)
    lanes = get(name).build(c, shares="lanes")
    slots = get(name).build(c, shares="slots")
    check(slots)
    assert dict(slots.params)["shares"] == "slots"
    assert len(slots.ops) < len(lanes.ops)
    ratio = simulate(slots, mode="event").time / simulate(lanes, mode="event").time
    assert 0.9 < ratio < 1.25          # shares quantized to 1/15 of a block here
    assert get(name).applicable(c, shares="halves")
