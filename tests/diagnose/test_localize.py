"""Localization: routes against BFS, single faults found, nothing found on a healthy machine."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dsl
from cclc.diagnose.inject import Fault, probe_timings
from cclc.diagnose.localize import (
    MIN_BASELINE,
    MIN_EVIDENCE,
    PATCH_CONFIDENCE,
    DiagnoseOptions,
    diagnose,
)
from cclc.diagnose.pair_timings import TimingsError, make_timings
from cclc.diagnose.routes import pair_routes
from cclc.topology import torus, with_faults


def _found(d, kind_name: str) -> bool:
    top = d.suspects[0]
    return f"{top.kind} {top.name}" == kind_name or kind_name in top.same_pairs


def _name(topo, li):
    return f"{topo.vertex_names[topo.link_src[li]]}->{topo.vertex_names[topo.link_dst[li]]}"


def test_routes_are_shortest_healthy_paths():
    topo = with_faults(torus("t", (4, 5), None, 10e9, 1e-7), links=[(0, 5), (5, 0)])
    n = topo.n_ranks
    s, d = np.divmod(np.arange(n * n), n)
    keep = s != d
    s, d = s[keep], d[keep]
    r = pair_routes(topo, s, d)
    g = topo.healthy_graph()
    hops = dict(nx.all_pairs_shortest_path_length(g))
    for k, (u, v) in enumerate(zip(s.tolist(), d.tolist(), strict=True)):
        links = r.links[r.offsets[k]:r.offsets[k + 1]]
        assert not topo.link_failed[links].any()
        assert len(links) == hops[u][v]
        path = [u] + topo.link_dst[links].tolist()
        assert path[-1] == v and topo.link_src[links].tolist() == path[:-1]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(side=st.integers(3, 6), data=st.data(), noise=st.sampled_from([0.0, 0.02, 0.05]))
def test_a_half_speed_link_is_the_top_suspect(side, data, noise):
    # square tori: every link equally loaded, so halving any one doubles its pairs' time (on
    # a 3x5 torus a short-dimension link at half speed only costs its pairs 11%, below the
    # reporting threshold, as it should be)
    topo = torus("t", (side, side), None, 32e9, 1e-7)
    li = data.draw(st.integers(0, topo.n_links - 1))
    t = probe_timings(topo, (Fault("link", "", (li,)),), noise=noise, seed=li)
    d = diagnose(topo, t)
    assert d.suspects and _found(d, f"link {_name(topo, li)}")
    # the healthy machine under the same noise: nothing reported
    assert diagnose(topo, probe_timings(topo, (), noise=noise, seed=li)).suspects == ()


def test_failed_cable_and_slow_gpu_on_a_torus():
    topo = torus("t", (4, 4), None, 32e9, 1e-7)
    a, b = topo.rank_at((1, 1)), topo.rank_at((1, 2))
    cable = (topo.link_id(a, b), topo.link_id(b, a))
    d = diagnose(topo, probe_timings(topo, (Fault("cable", "", cable, failed=True),),
                                     noise=0.05))
    assert _found(d, "cable (1,1)--(1,2)") and d.suspects[0].hung == d.suspects[0].pairs
    gpu = tuple(np.flatnonzero((topo.link_src == a) | (topo.link_dst == a)).tolist())
    d = diagnose(topo, probe_timings(topo, (Fault("rank", "", gpu),), noise=0.05))
    assert _found(d, "rank (1,1)")


def test_slow_nic_and_nvlink_on_a_fabric():
    topo = next(iter(dsl.load("examples/hgx16_leafspine.ccl").topologies.values()))
    nic = topo.vertex("node3.nic5")
    links = tuple(np.flatnonzero((topo.link_src == nic) | (topo.link_dst == nic)).tolist())
    d = diagnose(topo, probe_timings(topo, (Fault("nic", "", links),), noise=0.05))
    assert _found(d, "nic node3.nic5")
    nv = topo.link_id(topo.vertex("node7.nvswitch"), topo.vertex("node7.gpu2"))
    d = diagnose(topo, probe_timings(topo, (Fault("link", "", (nv,)),), noise=0.05))
    assert _found(d, f"link {_name(topo, nv)}")


def test_pairwise_timings_charge_every_link_of_a_route():
    topo = torus("t", (4, 4), None, 32e9, 1e-7)
    li = 7
    t = probe_timings(topo, (Fault("link", "", (li,)),), noise=0.02)
    d = diagnose(topo, t, DiagnoseOptions(concurrent=False))
    assert _found(d, f"link {_name(topo, li)}")
    assert d.suspects[0].pairs == int((pair_routes(topo, t.src, t.dst).links == li).sum())


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), side=st.integers(3, 4))
def test_top_score_matches_a_brute_force_search(seed, side):
    """With pairs timed one at a time every part weighs its pairs 1: the winner's score is the
    largest ``sum clip(z) / sqrt(n)`` over every link, cable, row, column and rank, computed
    here with plain loops over the pairs."""
    topo = torus("t", (side, side), None, 32e9, 1e-7)
    rng = np.random.default_rng(seed)
    li = int(rng.integers(topo.n_links))
    t = probe_timings(topo, (Fault("link", "", (li,), factor=3.0),), noise=0.05, seed=seed)
    d = diagnose(topo, t, DiagnoseOptions(concurrent=False))
    r = pair_routes(topo, t.src, t.dst)
    zc = np.clip(d.z, -10, 10)
    on = [set(r.links[r.offsets[k]:r.offsets[k + 1]].tolist()) for k in range(len(t))]
    sets = []
    for a in range(topo.n_links):
        sets.append({k for k in range(len(t)) if a in on[k]})
        b = topo.link_id(int(topo.link_dst[a]), int(topo.link_src[a]))
        sets.append({k for k in range(len(t)) if a in on[k] or b in on[k]})
    for v in range(topo.n_ranks):
        mine = set(np.flatnonzero((topo.link_src == v) | (topo.link_dst == v)).tolist())
        sets.append({k for k in range(len(t)) if t.src[k] == v})
        sets.append({k for k in range(len(t)) if t.dst[k] == v})
        sets.append({k for k in range(len(t)) if on[k] & mine})
    best = max(sum(zc[k] for k in s) / np.sqrt(len(s)) for s in sets if s)
    assert d.suspects and abs(d.suspects[0].score - best) < 1e-9 * max(1.0, best)
    assert _found(d, f"link {_name(topo, li)}")


def test_two_slow_links_are_both_found():
    topo = torus("t", (5, 5), None, 32e9, 1e-7)
    a, b = 3, 61
    t = probe_timings(topo, (Fault("link", "", (a,)), Fault("link", "", (b,))), noise=0.05)
    d = diagnose(topo, t)
    assert {s.links for s in d.suspects} == {(a,), (b,)}
    assert all(s.explained == s.pairs for s in d.suspects)


# --- what the evidence supports -----------------------------------------------------------

TORUS = "examples/torus5x5.ccl"
MIB = 1 << 20


def _torus5x5():
    return next(iter(dsl.load(TORUS).topologies.values()))


def _timings(pairs, seconds):
    src = [a for a, _ in pairs]
    dst = [b for _, b in pairs]
    return make_timings(src, dst, np.full(len(pairs), float(MIB)), seconds)


def _kinds(d):
    return [f.kind for f in d.findings]


@pytest.mark.parametrize("pairs", [[(0, 6), (0, 12), (0, 18)], [(0, 12), (5, 18), (7, 21)]])
def test_three_pairs_within_4_percent_name_nothing(pairs):
    topo = _torus5x5()
    d = diagnose(topo, _timings(pairs, [0.00100, 0.00102, 0.00104]))
    assert d.suspects == () and d.best_rejected is None
    too_few = d.findings[_kinds(d).index("too-few-pairs")]
    assert f"at least {MIN_BASELINE}" in too_few.message and not too_few.problem
    assert "all-pairs probe (600 pairs" in too_few.measure_next[0]


def test_every_pair_hung_names_no_part():
    topo = _torus5x5()
    t = probe_timings(topo)
    d = diagnose(topo, make_timings(t.src, t.dst, t.nbytes, np.full(len(t), np.inf)))
    assert d.suspects == () and _kinds(d) == ["all-hung"]
    assert "all 600 measured pairs never finished" in d.findings[0].message
    assert d.problem


def test_uniform_slowness_is_the_machine_not_a_part():
    topo = _torus5x5()
    t = probe_timings(topo, noise=0.05, seed=1)
    slow = diagnose(topo, make_timings(t.src, t.dst, t.nbytes, t.seconds * 1500))
    assert slow.suspects == () and _kinds(slow) == ["slow-everywhere"]
    assert "1,500x the time the topology's links predict" in slow.findings[0].message
    fast = diagnose(topo, make_timings(t.src, t.dst, t.nbytes, t.seconds / 10))
    assert fast.suspects == () and _kinds(fast) == ["fast-everywhere"]
    # the same timings at the model's speed: nothing to say
    healthy = diagnose(topo, t)
    assert healthy.findings == () and not healthy.problem


def test_one_hung_pair_is_stated_not_blamed_on_a_part():
    topo = _torus5x5()
    t = probe_timings(topo, noise=0.05, seed=1)
    secs = t.seconds.copy()
    secs[7] = np.inf
    d = diagnose(topo, make_timings(t.src, t.dst, t.nbytes, secs))
    assert d.suspects == () and _kinds(d) == ["hung-pairs"]
    pair = f"{int(t.src[7])} -> {int(t.dst[7])}"
    assert f"1 pair never finished ({pair}): one pair cannot say" in d.findings[0].message
    assert d.findings[0].measure_next[0].startswith(f"{pair} again, alone")


def test_zero_seconds_are_refused():
    topo = _torus5x5()
    with pytest.raises(TimingsError, match="pair 0 -> 1 took 0.0 seconds"):
        diagnose(topo, _timings([(0, 1), (1, 2)], [0.0, 1e-3]))


def _pairwise_case(slow):
    """Pairs timed one at a time: ``slow`` of them (all over the link (0,0)->(0,1) and into
    rank 1) twice as slow as their model, with nine healthy pairs as the baseline: 5 -> 2 also
    crosses the link and 6 -> 1 also ends at rank 1, so the link and the receiver explain the
    slow pairs about equally well."""
    topo = _torus5x5()
    healthy = [(5, 2), (6, 1), (12, 13), (17, 18), (22, 23), (7, 8), (13, 14), (18, 19),
               (23, 24)]
    pairs = slow + healthy
    rng = np.random.default_rng(0)
    secs = MIB / 32e9 * np.exp(rng.normal(0.0, 0.02, len(pairs)))
    secs[:len(slow)] *= 2
    return topo, diagnose(topo, _timings(pairs, secs), DiagnoseOptions(concurrent=False))


def test_two_slow_pairs_are_not_enough_evidence():
    topo, d = _pairwise_case([(0, 1), (4, 1)])
    assert d.suspects == () and _kinds(d) == ["weak-evidence"]
    f = d.findings[0]
    assert "not enough evidence" in f.message and f"at least {MIN_EVIDENCE}" in f.message
    # what to measure next: unmeasured pairs over the candidate
    r = pair_routes(topo, np.array([0]), np.array([2]))
    assert "0 -> 2" in f.measure_next and len(r.links)


def test_three_slow_pairs_name_the_link_with_a_confidence_below_certainty():
    _, d = _pairwise_case([(0, 1), (4, 1), (9, 1)])
    assert [s.name for s in d.suspects] == ["(0,0)->(0,1)"]
    s = d.suspects[0]
    # three slow pairs among twelve: the rank test alone cannot be surer than 1/C(12, 3)
    assert s.p_value >= 1 / 220 - 1e-12
    assert s.confidence == pytest.approx(s.posterior * (1 - s.p_value))
    assert s.confidence < PATCH_CONFIDENCE and d.confident == ()
    assert "low-confidence" in _kinds(d)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(side=st.integers(3, 5), noise=st.floats(0.0, 0.3), seed=st.integers(0, 10_000),
       share=st.floats(0.0, 1.0), pairwise=st.booleans())
def test_noise_alone_never_reaches_the_patch_confidence(side, noise, seed, share, pairwise):
    """Healthy timings with any log-normal noise, on any subset: no fault statement. All at
    once: the probe among a random subset of the ranks (down to two); one at a time: a random
    subset of the pairs (down to two), each its bytes over the link plus its hops' latency."""
    topo = torus("t", (side, side), None, 32e9, 1e-7)
    rng = np.random.default_rng(seed)
    if pairwise:
        n = topo.n_ranks
        s, d = np.divmod(np.arange(n * n), n)
        keep = np.flatnonzero((s != d) & (rng.random(n * n) < share))
        keep = keep if len(keep) >= 2 else np.array([1, 2])
        s, d = s[keep], d[keep]
        hops = np.diff(pair_routes(topo, s, d).offsets)
        secs = (MIB / 32e9 + hops * 1e-7) * np.exp(rng.normal(0.0, noise, len(s)))
        t = make_timings(s, d, np.full(len(s), float(MIB)), secs)
    else:
        ranks = np.flatnonzero(rng.random(topo.n_ranks) < share)
        ranks = ranks if len(ranks) >= 2 else np.array([0, 1])
        t = probe_timings(topo, noise=noise, seed=seed, ranks=tuple(ranks.tolist()))
    d = diagnose(topo, t, DiagnoseOptions(concurrent=not pairwise))
    assert d.confident == ()
    assert all(s.explained >= MIN_EVIDENCE for s in d.suspects)
    assert "slow-everywhere" not in _kinds(d) and "fast-everywhere" not in _kinds(d)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), count=st.integers(1, MIN_EVIDENCE - 1),
       factor=st.one_of(st.floats(2.5, 1e4), st.just(np.inf)))
def test_fewer_slow_pairs_than_the_minimum_name_no_part(data, count, factor):
    """However slow (or hung), fewer than MIN_EVIDENCE bad pairs in a clean probe never name
    a part: they are stated (weak evidence, or hangs no part explains) instead."""
    topo = torus("t", (4, 4), None, 32e9, 1e-7)
    t = probe_timings(topo)
    bad = data.draw(st.lists(st.integers(0, len(t) - 1), min_size=count, max_size=count,
                             unique=True))
    secs = t.seconds.copy()
    secs[bad] *= factor
    d = diagnose(topo, make_timings(t.src, t.dst, t.nbytes, secs))
    assert d.suspects == ()
    kinds = _kinds(d)
    if np.isinf(factor):
        assert kinds == ["hung-pairs"] and f"{count} pair" in d.findings[0].message
    else:
        assert kinds in (["weak-evidence"], ["slow-pairs"])
    assert d.problem
