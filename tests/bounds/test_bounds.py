"""Lower bounds against closed forms (the standard alpha-beta bounds), the
LP against the closed forms on healthy tori, faults, fabrics, and sim time >= bound."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from sim_builders import chain, direct_alltoall, ring_allgather

from cclc.bounds import bounds, cut_bound, hop_bytes_bound, injection_bound, latency_bound, lp_bound
from cclc.bounds_closed_form import Facts, candidate_cuts, cut_time
from cclc.collective import CollectiveKind, DType, make_collective
from cclc.errors import CollectiveError
from cclc.sim import simulate
from cclc.topology import NodeType, leaf_spine, single_switch, torus, with_faults

K = CollectiveKind
B = 10e9
LAT = 1e-7
REL = 1e-6


def coll(topo, kind, size, group=None, **kw):
    group = tuple(range(topo.n_ranks)) if group is None else tuple(group)
    root = 0 if kind in (K.BROADCAST, K.REDUCE) else None
    return make_collective("c", kind, topo, group, size=size, dtype=DType.UINT8, root=root, **kw)


def halfring(n: int, size: float) -> float:
    """Bytes per link direction of HalfRing alltoall over B."""
    return (n * n - 1) * size / (8 * n * B) if n % 2 else n * size / (8 * B)


@pytest.mark.parametrize("n", [3, 4, 5, 6, 7, 8, 9])
def test_ring_alltoall_halfring_meets_the_bisection(n):
    size = n * 8 * 1000
    c = coll(torus("ring", (n,), bandwidth=B, latency=LAT), K.ALLTOALL, size)
    expect = halfring(n, size)
    assert cut_bound(c).seconds == pytest.approx(expect, rel=1e-12)
    assert hop_bytes_bound(c).seconds == pytest.approx(expect, rel=1e-12)
    assert lp_bound(c).seconds == pytest.approx(expect, rel=REL)
    assert injection_bound(c).seconds == pytest.approx((n - 1) / n * size / (2 * B))


@pytest.mark.parametrize("n", [3, 4, 7, 8])
def test_ring_allgather_reducescatter_allreduce_closed_forms(n):
    """Bidirectional ring: AG/RS (n-1)S/(2nB), AR (n-1)S/(nB) (the alpha-beta bandwidth bounds)."""
    size = n * 100_000              # large enough that bandwidth, not latency, binds
    t = torus("ring", (n,), bandwidth=B, latency=LAT)
    one = (n - 1) * size / (2 * n * B)
    for kind, expect in ((K.ALLGATHER, one), (K.REDUCESCATTER, one), (K.ALLREDUCE, 2 * one)):
        b = bounds(coll(t, kind, size))
        assert b.best == pytest.approx(expect, rel=REL), kind
        assert b["lp"].seconds == pytest.approx(expect, rel=REL)
        assert b["injection"].seconds == pytest.approx(expect, rel=1e-12)
    # broadcast: the root's S over its two links; every rank receives S over two links
    assert bounds(coll(t, K.BROADCAST, size))["lp"].seconds == pytest.approx(size / (2 * B),
                                                                              rel=REL)
    assert latency_bound(coll(t, K.ALLGATHER, size)).seconds == pytest.approx((n // 2) * LAT)


@pytest.mark.parametrize("dims", [(4, 4), (5, 5), (3, 3, 3)])
def test_lp_equals_the_closed_forms_on_healthy_tori(dims):
    t = torus("t", dims, bandwidth=B, latency=LAT)
    p, k, d = t.n_ranks, len(dims), dims[0]
    size = p * 64 * 3
    # alltoall: hop-bytes = bisection of the largest dimension (hop-bytes bound)
    a2a = coll(t, K.ALLTOALL, size)
    bis = (d * d - 1) * size / (8 * d * B) if d % 2 else d * size / (8 * B)
    assert cut_bound(a2a).seconds == pytest.approx(bis, rel=1e-12)
    assert hop_bytes_bound(a2a).seconds == pytest.approx(bis, rel=1e-12)
    assert lp_bound(a2a).seconds == pytest.approx(bis, rel=REL)
    # allgather / reducescatter: injection over 2k links; allreduce twice that
    inj = (p - 1) * size / (p * 2 * k * B)
    for kind, expect in ((K.ALLGATHER, inj), (K.REDUCESCATTER, inj), (K.ALLREDUCE, 2 * inj)):
        c = coll(t, kind, size)
        assert lp_bound(c).seconds == pytest.approx(expect, rel=REL), kind
        assert injection_bound(c).seconds == pytest.approx(expect, rel=1e-12), kind
    assert latency_bound(a2a).seconds == pytest.approx(sum(x // 2 for x in dims) * LAT)


def test_mesh_cut_is_the_middle_link():
    t = torus("line", (6,), wrap=[False], bandwidth=B, latency=LAT)
    size = 6 * 1000
    c = coll(t, K.ALLTOALL, size)
    # 3 x 3 pairs cross the middle link, S/6 each, one link per direction
    assert cut_bound(c).seconds == pytest.approx(9 * size / 6 / B)
    assert lp_bound(c).seconds == pytest.approx(9 * size / 6 / B, rel=REL)


@st.composite
def faulty_tori(draw):
    dims = draw(st.sampled_from([(3, 3), (4, 3), (5,), (6,), (4, 4), (2, 3, 3)]))
    bw = draw(st.sampled_from([B, None]))
    t = torus("t", dims, bandwidth=[B * (1 + i) for i in range(len(dims))] if bw is None else B,
              latency=LAT)
    picks = draw(st.lists(st.integers(0, t.n_links - 1), min_size=1, max_size=3, unique=True))
    pairs = [(int(t.link_src[i]), int(t.link_dst[i])) for i in picks]
    return t, with_faults(t, links=pairs)


@settings(max_examples=25, deadline=None)
@given(faulty_tori(), st.sampled_from([K.ALLTOALL, K.ALLGATHER, K.REDUCESCATTER, K.BROADCAST]))
def test_lp_never_decreases_when_links_fail(tori, kind):
    healthy, faulty = tori
    size = healthy.n_ranks * 256
    try:
        c_faulty = coll(faulty, kind, size)
    except CollectiveError:
        assume(False)                        # the faults disconnect the torus
    c_healthy = coll(healthy, kind, size)
    h, f = bounds(c_healthy), bounds(c_faulty)
    assert f["lp"].seconds >= h["lp"].seconds * (1 - 1e-7)
    for name in ("hop_bytes", "injection", "cut"):
        assert f[name].seconds >= h[name].seconds * (1 - 1e-9), name
    # the LP is the strongest of the bandwidth bounds on these graphs
    for name in ("injection", "cut"):
        assert f["lp"].seconds >= f[name].seconds * (1 - 1e-6), name


def test_a_failed_ring_link_doubles_the_alltoall_cut():
    """One ring of 8 with one link failed each way: the bisection through it has one link per
    direction instead of two."""
    t = torus("ring", (8,), bandwidth=B, latency=LAT)
    f = with_faults(t, links=[(0, 1), (1, 0)])
    size = 8 * 800
    healthy, faulty = coll(t, K.ALLTOALL, size), coll(f, K.ALLTOALL, size)
    assert cut_bound(faulty).seconds == pytest.approx(2 * cut_bound(healthy).seconds)
    assert lp_bound(faulty).seconds >= 2 * lp_bound(healthy).seconds * (1 - REL)


def small_fabric(**kw):
    node = NodeType("n", "nvswitch", 1, 100e9, 1e-6, nics=1, nic_bandwidth=B)
    args = {"rails": 1, "leaves": 2, "spines": 2, "oversubscription": 2, "bandwidth": B,
            "latency": 1e-6}
    args.update(kw)
    return leaf_spine("fabric", 8, node, **args)


def test_lp_on_an_oversubscribed_leaf_spine_equals_the_pod_cut():
    """8 single-GPU nodes, 2 leaves of 4, 2 spines, 2:1 oversubscribed: each leaf has 2B of
    uplink for 4 ranks of B. Alltoall sends 4 x 4 x S/8 = 2S out of a pod: S/B."""
    t = small_fabric()
    size = 8 * 100_000
    c = coll(t, K.ALLTOALL, size)
    b = bounds(c)
    assert b["cut"].seconds == pytest.approx(size / B)
    assert "pod" in b["cut"].description
    assert b["lp"].seconds == pytest.approx(size / B, rel=REL)
    assert b["injection"].seconds == pytest.approx(7 / 8 * size / B)
    assert b.name == "cut" and b.best == pytest.approx(size / B)
    # the switches relay: a failed uplink leaves the pod half its spine capacity
    leaf0, spine0 = t.vertex("leaf0"), t.vertex("spine0")
    f = with_faults(t, links=[(leaf0, spine0), (spine0, leaf0)])
    bf = bounds(coll(f, K.ALLTOALL, size))
    assert bf["lp"].seconds == pytest.approx(2 * size / B, rel=REL)
    assert bf["cut"].seconds == pytest.approx(2 * size / B)


def test_lp_on_a_single_switch_is_the_injection_bound():
    node = NodeType("n", "nvswitch", 1, 100e9, 1e-6, nics=1, nic_bandwidth=B)
    t = single_switch("sw", 6, node, bandwidth=B, latency=1e-6)
    size = 6 * 1000
    for kind in (K.ALLTOALL, K.ALLGATHER, K.REDUCESCATTER):
        b = bounds(coll(t, kind, size))
        assert b["lp"].seconds == pytest.approx(5 / 6 * size / B, rel=REL), kind
        assert b["injection"].seconds == pytest.approx(5 / 6 * size / B), kind


def test_node_cut_on_nvlink_nodes():
    """2 nodes x 4 GPUs, one NIC of B per node: the node cut dominates alltoall."""
    node = NodeType("hgx", "nvswitch", 4, 100e9, 1e-6, nics=1, nic_bandwidth=B)
    t = single_switch("sw", 2, node, bandwidth=B, latency=1e-6)
    size = 8 * 1000
    c = coll(t, K.ALLTOALL, size)
    # 4 x 4 pairs leave each node, S/8 each, through one NIC of B
    assert cut_bound(c).seconds == pytest.approx(16 * size / 8 / B)
    assert cut_bound(c).description == "node 0"
    assert lp_bound(c).seconds == pytest.approx(16 * size / 8 / B, rel=REL)


def test_nonuniform_alltoall_uses_the_size_matrix():
    t = torus("ring", (4,), bandwidth=B, latency=LAT)
    m = [[0, 4000, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]]
    c = make_collective("c", K.ALLTOALL, t, (0, 1, 2, 3), dtype=DType.UINT8, pair_sizes=m)
    assert injection_bound(c).seconds == pytest.approx(4000 / (2 * B))
    assert hop_bytes_bound(c).seconds == pytest.approx(4000 / (8 * B))
    assert lp_bound(c).seconds == pytest.approx(4000 / (2 * B), rel=REL)   # split over 2 paths


def test_the_lp_is_skipped_above_the_limit():
    t = torus("t", (3, 3), bandwidth=B, latency=LAT)
    c = coll(t, K.ALLTOALL, 9 * 100)
    assert lp_bound(c, max_ranks=8) is None
    b = bounds(c, lp_max_ranks=8)
    assert b.get("lp") is None
    assert b.notes == ("lp: skipped, 9 ranks > 8 (closed forms only)",)
    assert bounds(c, lp=False).get("lp") is None


def test_single_rank_has_zero_bounds():
    t = torus("t", (3,), bandwidth=B, latency=LAT)
    b = bounds(coll(t, K.ALLGATHER, 1000, group=(1,)))
    assert b.best == 0.0


def test_bounds_of_a_subgroup_ring_of_a_torus():
    t = torus("t", (4, 4), bandwidth=B, latency=LAT)
    group = t.ring(0, 1)
    c = coll(t, K.ALLGATHER, 4 * 100_000, group=group)
    # the other ranks of the torus can relay, but every member still receives 3/4 S over
    # its 4 links
    b = bounds(c)
    assert b.best == pytest.approx(3 * 100_000 / (4 * B), rel=REL)
    assert b["lp"].seconds == pytest.approx(b.best, rel=REL)


# ---- sim time >= bound ---------------------------------------------------------------------

def _check(s):
    b = bounds(s.collective)
    for mode in ("lockstep", "event"):
        r = simulate(s, mode=mode)
        assert r.time >= b.best * (1 - 1e-9), (mode, b.name, b.best, r.time)
    return b, r


@pytest.mark.parametrize("n", [2, 3, 6])
def test_ring_allgather_is_no_faster_than_its_bound(n):
    _check(ring_allgather(torus("ring", (n,), bandwidth=B, latency=LAT), n * 1000))


@pytest.mark.parametrize("dims", [(4,), (5,), (3, 3), (4, 4)])
def test_direct_alltoall_is_no_faster_than_its_bound(dims):
    t = torus("t", dims, bandwidth=B, latency=LAT)
    b, _ = _check(direct_alltoall(t, t.n_ranks * 1000))
    assert b.name in ("hop_bytes", "cut", "lp")


def test_direct_alltoall_on_a_faulty_torus_is_no_faster_than_its_bound():
    t = with_faults(torus("t", (4, 4), bandwidth=B, latency=LAT), links=[(0, 1), (1, 0)])
    _check(direct_alltoall(t, 16 * 1000))


def test_chain_broadcast_is_no_faster_than_its_bound():
    t = torus("line", (5,), wrap=[False], bandwidth=B, latency=LAT)
    b, _ = _check(chain(t, 8 * 5000, 8))
    assert b["latency"].seconds == pytest.approx(4 * LAT)


@settings(max_examples=15, deadline=None)
@given(st.sampled_from([(3,), (4,), (5,), (2, 3), (3, 3)]), st.integers(1, 50),
       st.sampled_from([0.0, LAT, 1e-5]))
def test_hand_built_schedules_never_beat_the_bound(dims, kib, lat):
    t = torus("t", dims, bandwidth=B, latency=lat)
    n = t.n_ranks
    _check(direct_alltoall(t, n * kib * 1024))
    _check(direct_alltoall(t, n * kib * 1024, pipelined_steps=True))
    ring = t.ring(0, len(dims) - 1)
    if len(ring) > 1:
        _check(ring_allgather(t, len(ring) * kib * 1024, ring))
    assert math.isfinite(bounds(coll(t, K.ALLREDUCE, n * 1024)).best)


@pytest.mark.parametrize(("dims", "wrap", "group"), [
    ((4, 4), None, None), ((5, 3), (True, False), None), ((2, 3, 4), None, None),
    ((4, 4), None, (0, 1, 5, 10, 15)), ((6,), (False,), (0, 2, 5))])
def test_torus_hop_sum_shortcut_matches_breadth_first_search(dims, wrap, group):
    from cclc import bounds_closed_form as mod

    t = torus("t", dims, wrap=wrap, bandwidth=B, latency=LAT)
    group = tuple(range(t.n_ranks)) if group is None else group
    f = mod.Facts(coll(t, K.ALLTOALL, len(group) * 100, group=group))
    bfs = float((f.pair_bytes() * mod._hop_matrix(f)).sum())
    assert mod._pair_hop_bytes(f) == pytest.approx(bfs, rel=1e-12)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 7), min_size=1, max_size=3).filter(lambda d: np.prod(d) > 1),
       st.sampled_from([CollectiveKind.ALLTOALL, CollectiveKind.ALLGATHER,
                        CollectiveKind.REDUCESCATTER, CollectiveKind.ALLREDUCE]))
def test_a_symmetric_torus_tries_one_bisection_per_dimension_and_loses_nothing(dims, kind):
    # translations map each bisection of a dimension onto the others: the one tried is as good
    # as the best of every offset (brute force over the masks, the way the cuts were tried)
    topo = torus("t", tuple(dims), bandwidth=25e9, latency=1e-6)
    n = topo.n_ranks
    coll = make_collective("c", kind, topo, tuple(range(n)), size=4 * n * n)
    f = Facts(coll)
    tried = list(candidate_cuts(f))
    wrapped = [m for m, w in zip(topo.grid_dims, topo.grid_wrap, strict=True) if w and m > 2]
    assert sum("bisection" in name for name, _ in tried) == len(wrapped)
    coords = np.array(np.unravel_index(np.arange(n), topo.dims))
    best = max((cut_time(f, (coords[d] - off) % m < m // 2, None)
                for d, m in enumerate(topo.grid_dims) if m > 2 for off in range(m)),
               default=0.0)
    assert cut_bound(coll).seconds >= best * (1 - 1e-12)


def test_a_torus_with_a_failed_link_tries_every_bisection():
    # the failed link breaks the translations: offsets differ in what they cut
    topo = with_faults(torus("t", (6, 4), bandwidth=25e9), links=[(0, 1)])
    coll = make_collective("c", CollectiveKind.ALLTOALL, topo, tuple(range(24)), size=4 * 24 * 24)
    names = [name for name, _ in candidate_cuts(Facts(coll))]
    assert sum("bisection of dimension 0" in name for name in names) == 6
    assert sum("bisection of dimension 1" in name for name in names) == 4
