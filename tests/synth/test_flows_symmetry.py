"""The path LP of ``synth`` (AllToAll) over the whole automorphism group, and its paths cut to
what the packer takes: every group element is checked to be an automorphism by brute force,
the group to be closed, the LP over orbits to equal the LP without symmetry, and the reduced
paths to stay within the usable links and near the LP's load."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from cclc.collective import CollectiveKind, make_collective
from cclc.errors import CclError
from cclc.synth.flow_solution import MAX_PATHS, MIN_SHARE, pair_bytes, usable_links
from cclc.synth.flows import FULL_GROUP_ABOVE, choose_symmetry, solve_flows
from cclc.synth.symmetry import automorphisms, translations
from cclc.topology import torus, with_faults


def _a2a(dims, links=(), ranks=(), wrap=None, per_pair=64):
    t = torus("t", dims, wrap=wrap, bandwidth=32e9, latency=1e-7, routing="none")
    pairs = [(t.rank_at(a), t.rank_at(b)) for a, b in links]
    topo = with_faults(t, links=pairs + [(b, a) for a, b in pairs],
                       ranks=[t.rank_at(r) for r in ranks])
    group = topo.live_ranks()
    return make_collective("a", CollectiveKind.ALLTOALL, topo, tuple(group),
                           size=len(group) * per_pair * 4)


def _usable_set(coll):
    topo, ok = coll.topology, usable_links(coll)
    return {(int(topo.link_src[e]), int(topo.link_dst[e])) for e in np.flatnonzero(ok)}


def _check_group(coll, sym):
    links = _usable_set(coll)
    group = set(coll.group)
    maps = {tuple(v.tolist()) for v in sym.vertex}
    assert len(maps) == sym.order                       # distinct elements
    assert tuple(range(coll.topology.n_vertices)) == tuple(sym.vertex[0].tolist())
    for v in sym.vertex:
        assert {(int(v[a]), int(v[b])) for a, b in links} == links
        assert {int(v[r]) for r in group} == group
    for a in sym.vertex[: min(8, sym.order)]:
        for b in sym.vertex[: min(8, sym.order)]:
            assert tuple(a[b].tolist()) in maps           # closed under composition


@pytest.mark.parametrize("dims, links, ranks, wrap, order", [
    ((5, 5, 5), [((0, 0, 0), (1, 0, 0))], (), None, 16),   # own-dimension flip x others' D4
    ((4, 4), (), (), None, 128),                          # 16 translations x 8 point maps
    ((5, 5), [((0, 2), (1, 2)), ((3, 2), (4, 2))], (), None, 4),
    ((4, 4), (), [(1, 1)], None, 8),                      # the failed rank's point group
    ((3, 4), (), (), (False, False), 4),                  # a mesh: its two flips
])
def test_automorphisms_of_known_cases(dims, links, ranks, wrap, order):
    coll = _a2a(dims, links, ranks, wrap)
    sym = automorphisms(coll, usable_links(coll))
    assert sym.order == order
    _check_group(coll, sym)


@pytest.mark.slow
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_every_element_is_an_automorphism(data):
    nd = data.draw(st.integers(1, 3))
    dims = tuple(data.draw(st.integers(2, 5)) for _ in range(nd))
    t = torus("t", dims, bandwidth=1e9, latency=1e-7)
    faults = data.draw(st.lists(st.integers(0, t.n_links - 1), max_size=2, unique=True))
    links = [(t.coords(int(t.link_src[e])), t.coords(int(t.link_dst[e]))) for e in faults]
    try:
        coll = _a2a(dims, links)
    except CclError:                    # the faults cut the torus apart
        assume(False)
    sym = automorphisms(coll, usable_links(coll))
    _check_group(coll, sym)
    # the translations are a subgroup
    trans = {tuple(v.tolist()) for v in translations(coll, usable_links(coll)).vertex}
    assert trans <= {tuple(v.tolist()) for v in sym.vertex}


@pytest.mark.parametrize("dims, links, ranks", [
    ((5, 5), [((0, 0), (1, 0))], ()),
    ((3, 3, 3), [((0, 0, 0), (1, 0, 0))], ()),
    ((4, 4), (), [(1, 1)]),
    ((6, 6), (), ()),
])
def test_orbit_lp_equals_the_lp_without_symmetry(dims, links, ranks):
    coll = _a2a(dims, links, ranks)
    full = solve_flows(coll, full_group=True)
    plain = solve_flows(coll, use_symmetry=False)
    assert full.symmetry > 1
    assert full.lp_time == pytest.approx(plain.lp_time, rel=2e-3)
    _check_paths(coll, full)


def _check_paths(coll, flows):
    """Shares add to one per pair, at most MAX_PATHS per pair none under MIN_SHARE of the
    largest, every path joins its pair over usable links, and the load of the paths as given
    stays within 25% of the LP's time."""
    topo, n = coll.topology, coll.n
    usable = usable_links(coll)
    tot = np.zeros((n, n))
    np.add.at(tot, (flows.src, flows.dst), flows.weight)
    off = ~np.eye(n, dtype=bool)
    assert np.allclose(tot[off], 1.0)
    count = np.bincount(flows.src * n + flows.dst, minlength=n * n)
    assert count.max() <= MAX_PATHS
    largest = np.zeros(n * n)
    np.maximum.at(largest, flows.src * n + flows.dst, flows.weight)
    assert (flows.weight >= MIN_SHARE * largest[flows.src * n + flows.dst] - 1e-12).all()
    group = np.array(coll.group)
    load = np.zeros(topo.n_links)
    demand = pair_bytes(coll)
    for s, d, w, p in zip(flows.src.tolist(), flows.dst.tolist(), flows.weight.tolist(),
                          flows.path, strict=True):
        assert usable[list(p)].all()
        assert topo.link_src[p[0]] == group[s] and topo.link_dst[p[-1]] == group[d]
        assert (topo.link_dst[list(p[:-1])] == topo.link_src[list(p[1:])]).all()
        load[list(p)] += w * demand[s, d]
    routed = float((load / topo.link_bandwidth).max())
    assert flows.lp_time * (1 - 1e-3) <= routed <= 1.25 * flows.lp_time


@pytest.mark.slow
@pytest.mark.parametrize("full", [False, True])
def test_fewer_paths_beats_cutting_and_rescaling(monkeypatch, full):
    """The shares dropped to keep MAX_PATHS per pair go where links have room: the busiest
    link ends no busier than when the largest shares are kept and simply scaled up (what the
    packer would do with the LP's paths as they are)."""
    import cclc.synth.flows as flows_mod

    coll = _a2a((4, 4, 4), [((0, 0, 0), (1, 0, 0)), ((2, 0, 1), (2, 1, 1))])
    topo = coll.topology
    demand = pair_bytes(coll)

    def busiest(flows):
        load = np.zeros(topo.n_links)
        for s, d, x, p in zip(flows.src.tolist(), flows.dst.tolist(), flows.weight.tolist(),
                              flows.path, strict=True):
            load[list(p)] += x * demand[s, d]
        return float((load / topo.link_bandwidth).max())

    ours = solve_flows(coll, full_group=full)
    _check_paths(coll, ours)

    def cut(owner, w, hops, rows, coef, busy):
        # the same paths dropped (flows._owners_to_cut's rules), the rest simply scaled up
        order, starts, ends, _, longest = flows_mod._owners_to_cut(owner, w, hops)
        keep = np.zeros(len(w), dtype=bool)
        for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
            mine = order[a:b]
            ok = (w[mine] >= MIN_SHARE * w[mine[0]]) & (np.arange(b - a) < MAX_PATHS)
            ok &= (hops[mine] <= longest) | (np.arange(b - a) == 0)
            keep[mine[ok]] = True
        tot = np.bincount(owner[keep], weights=w[keep], minlength=owner.max() + 1)
        w[keep] = w[keep] / tot[owner[keep]]
        return keep

    monkeypatch.setattr(flows_mod, "_reduce_shares", cut)
    naive = solve_flows(coll, full_group=full)
    assert ours.lp_time == pytest.approx(naive.lp_time)
    assert busiest(ours) <= busiest(naive) * (1 + 1e-9)


def test_the_whole_group_only_where_the_translations_leave_a_large_lp():
    # a faulty 5x5x5 keeps no translation: 15 500 commodities, under the threshold
    small = _a2a((5, 5, 5), [((0, 0, 0), (1, 0, 0))])
    assert small.n * (small.n - 1) <= FULL_GROUP_ABOVE
    assert choose_symmetry(small, usable_links(small)).order == 1
    assert choose_symmetry(small, usable_links(small), full_group=True).order == 16
    # a faulty 12x12 torus: 20 592 commodities, over it (own-dimension flip x the other's)
    big = _a2a((12, 12), [((0, 0), (1, 0))])
    assert big.n * (big.n - 1) > FULL_GROUP_ABOVE
    assert choose_symmetry(big, usable_links(big)).order == 4
