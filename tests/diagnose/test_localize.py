"""Localization: routes against BFS, single faults found, nothing found on a healthy machine."""

from __future__ import annotations

import networkx as nx
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dsl
from cclc.diagnose.inject import Fault, probe_timings
from cclc.diagnose.localize import DiagnoseOptions, diagnose
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
