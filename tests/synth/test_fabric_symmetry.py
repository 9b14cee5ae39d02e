"""Free automorphisms of fabrics (issue 17): every map found is checked here against an
independent definition (links as a multiset of ends and attributes, members, servers, the
cycles of its powers), the rate search with one max-flow per orbit against the one over every
member, and a map that moves a fault is refused."""

from __future__ import annotations

import time
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dsl
from cclc.algorithms import BudgetExhausted, BuildContext, get
from cclc.algorithms.synth_trees import build_synth_trees, synthesize_trees
from cclc.collective import CollectiveKind as K
from cclc.collective import Hint, make_collective
from cclc.errors import CollectiveError
from cclc.synth.fabric_symmetry import find_free_automorphism, is_automorphism, member_powers
from cclc.synth.hop_graph import hop_graph
from cclc.synth.splitting import _probe, split_switches
from cclc.synth.trees import flow_network, forestcoll_rate, pack_trees
from cclc.template_race import race_synthesis
from cclc.topology import NodeType, leaf_spine, with_faults
from cclc.verify import verify


def _fabric(n_nodes: int, gpus: int, spines: int):
    node = NodeType("h", "nvswitch", gpus, 450e9, 1e-6, nics=gpus, nic_bandwidth=50e9)
    return leaf_spine("ls", n_nodes, node, rails=gpus, leaves=None, spines=spines,
                      oversubscription=1.0, bandwidth=50e9, latency=2e-6)


def _link_multiset(topo, perm=None):
    p = np.arange(topo.n_vertices) if perm is None else perm
    return Counter(zip(p[topo.link_src].tolist(), p[topo.link_dst].tolist(),
                       topo.link_bandwidth.tolist(), topo.link_latency.tolist(),
                       topo.link_failed.tolist(), np.asarray(topo.link_kind).tolist(),
                       strict=True))


def _check_free_automorphism(topo, members, perm):
    """The definition, written out independently of the module."""
    assert sorted(perm.tolist()) == list(range(topo.n_vertices))
    assert _link_multiset(topo, perm) == _link_multiset(topo)
    ranks = set(range(topo.n_ranks))
    assert {int(perm[v]) for v in ranks} == ranks
    assert {int(perm[v]) for v in members} == set(members)
    node = topo.node_of_rank
    same = {(int(node[a]), int(node[b])) for a in ranks for b in ranks}
    moved = {(int(node[perm[a]]), int(node[perm[b]])) for a in ranks for b in ranks
             if node[a] == node[b]}
    assert all(a == b for a, b in moved) and len(same) > 0
    # every member on a cycle of one length L > 1: the powers act freely
    lengths = set()
    for r in members:
        x, n = int(perm[r]), 1
        while x != r:
            x, n = int(perm[x]), n + 1
        lengths.add(n)
    assert len(lengths) == 1 and lengths.pop() > 1


@st.composite
def faulty_fabrics(draw):
    topo = _fabric(draw(st.integers(2, 4)), draw(st.sampled_from([2, 4])),
                   draw(st.integers(1, 2)))
    links = draw(st.lists(st.integers(0, topo.n_links - 1), max_size=2, unique=True))
    pairs = [(int(topo.link_src[x]), int(topo.link_dst[x])) for x in links]
    return with_faults(topo, links=pairs) if pairs else topo


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(faulty_fabrics())
def test_a_found_map_is_a_free_automorphism(topo):
    members = list(topo.live_ranks())
    perm = find_free_automorphism(topo, members)
    if perm is not None:
        assert is_automorphism(topo, members, perm)
        _check_free_automorphism(topo, members, perm)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(faulty_fabrics())
def test_rate_with_one_probe_per_orbit_is_the_full_rate(topo):
    try:
        coll = make_collective("c", K.ALLGATHER, topo, topo.live_ranks(), size=2**20,
                               algorithm=Hint("auto"), schedule=Hint("auto"))
    except CollectiveError:
        return                                    # the faults split the machine
    powers = member_powers(coll)
    if powers is None or not _reachable(coll):
        return
    net, members = flow_network(coll)
    reps = sorted({int(powers[:, v].min()) for v in range(coll.n)})
    assert len(reps) < coll.n
    full = forestcoll_rate(net, members)
    probed = forestcoll_rate(net, members, [members[v] for v in reps])
    assert abs(probed - full) <= 1e-9 * full


def _reachable(coll) -> bool:
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import connected_components

    g = hop_graph(coll)
    mat = csr_matrix((np.ones(g.m), (g.src, g.dst)), shape=(g.n, g.n))
    return connected_components(mat, directed=True, connection="strong")[0] == 1


def test_identical_servers_are_found_despite_a_broken_rail():
    # the example's fault breaks rail symmetry, not server symmetry
    topo = _fabric(4, 4, 4)
    leaf, spine = topo.vertex("leaf2"), topo.vertex("spine1")
    faulty = with_faults(topo, links=[(leaf, spine), (spine, leaf)])
    for t in (topo, faulty):
        perm = find_free_automorphism(t, list(t.all_ranks()))
        assert perm is not None
        _check_free_automorphism(t, list(t.all_ranks()), perm)


def test_a_map_that_moves_a_fault_is_refused():
    topo = _fabric(3, 2, 1)
    members = list(topo.all_ranks())
    perm = find_free_automorphism(topo, members)
    assert perm is not None and is_automorphism(topo, members, perm)
    # fail one NIC uplink: the same map now sends a failed link onto a healthy one
    nic = int(topo.link_src[np.flatnonzero(np.asarray(topo.link_kind) != topo.link_kind[0])[0]])
    out = int(np.flatnonzero(topo.link_src == nic)[0])
    faulty = with_faults(topo, links=[(nic, int(topo.link_dst[out]))])
    assert not is_automorphism(faulty, members, perm)
    assert _link_multiset(faulty, perm) != _link_multiset(faulty)
    # a map that is not a bijection, or sends a rank to a switch, is refused too
    assert not is_automorphism(topo, members, np.zeros(topo.n_vertices, dtype=np.int64))
    swap = np.arange(topo.n_vertices)
    swap[[0, topo.n_vertices - 1]] = swap[[topo.n_vertices - 1, 0]]
    assert not is_automorphism(topo, members, swap)


def test_the_example_fabric_shifts_its_16_servers():
    prog = dsl.load("examples/hgx16_leafspine.ccl")
    coll = {c.name: c for c in prog.collectives}["shards"]
    powers = member_powers(coll)
    assert powers is not None and powers.shape == (16, 128)
    perm = find_free_automorphism(coll.topology, coll.group)
    _check_free_automorphism(coll.topology, list(coll.group), perm)


# -- the budget ----------------------------------------------------------------------------

def _example(name):
    prog = dsl.load("examples/hgx16_leafspine.ccl")
    return {c.name: c for c in prog.collectives}[name]


def test_a_deadline_in_the_past_stops_packing_before_a_tree():
    coll = make_collective("c", K.ALLGATHER, _fabric(2, 2, 1), range(4), size=2**20,
                           algorithm=Hint("auto"), schedule=Hint("auto"))
    g = hop_graph(coll)
    ident = np.arange(g.n)[None, :], np.arange(g.m)[None, :]
    assert pack_trees(g, 1e9, 2, *ident, time.monotonic() - 1) is None
    later = pack_trees(g, 1e9, 2, *ident, time.monotonic() + 60)
    assert later is not None and later.parent.shape == (4, 2, 4)


def test_a_tiny_budget_still_gives_a_verified_schedule():
    coll = _example("shards")
    # the budget ends before the first packing is whole: no packing, so the planner's race
    # returns the fastest template
    assert synthesize_trees(coll, budget=1e-3) is None
    with pytest.raises(BudgetExhausted):
        build_synth_trees(coll, BuildContext(), budget=1e-3)
    s = race_synthesis(coll, get("synth"), BuildContext(), {"budget": 1e-3})
    assert dict(s.params)["status"] == "budget" and "template" in dict(s.params)
    verify(s)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(faulty_fabrics(), st.booleans())
def test_the_split_with_one_probe_per_orbit_is_the_split(topo, reverse):
    try:
        coll = make_collective("c", K.ALLGATHER, topo, topo.live_ranks(), size=2**20,
                               algorithm=Hint("auto"), schedule=Hint("auto"))
    except CollectiveError:
        return
    perm = find_free_automorphism(topo, coll.group)
    if perm is None or not _reachable(coll):
        return
    powers = member_powers(coll, perm)
    reps = sorted({int(powers[:, v].min()) for v in range(coll.n)})
    symmetry = (perm, [int(coll.group[v]) for v in reps])
    net, members = flow_network(coll)
    rate = forestcoll_rate(net.reverse(copy=True) if reverse else net, members)
    plain = split_switches(coll, rate, reverse, time.monotonic() + 60)
    probed = split_switches(coll, rate, reverse, time.monotonic() + 60, symmetry)
    assert (plain is None) == (probed is None)
    if plain is not None:
        assert plain.paths == probed.paths and plain.rate == probed.rate
        assert np.array_equal(plain.capacity, probed.capacity)


def test_an_invariant_graph_is_probed_once_per_orbit():
    topo = _fabric(4, 2, 2)
    coll = make_collective("c", K.ALLGATHER, topo, topo.all_ranks(), size=2**20,
                           algorithm=Hint("auto"), schedule=Hint("auto"))
    perm = find_free_automorphism(topo, coll.group)
    net, _ = flow_network(coll)
    assert _probe(net, (perm, [0])) == [0]
    # one capacity changed: no longer invariant, every member is probed
    a, b = next(iter(net.edges))
    net[a][b]["capacity"] *= 2
    assert _probe(net, (perm, [0])) is None


def test_a_deadline_inside_the_rounds_returns_whole_trees(monkeypatch):
    # a clock that moves one second per reading: the deadline falls inside the rip-up rounds
    # (a 3x3 torus with a failed link is not packed optimally by the first trees)
    from cclc.synth import trees as trees_module
    from cclc.topology import torus

    topo = torus("t", (3, 3), bandwidth=10e9, latency=1e-6)
    topo = with_faults(topo, links=[(0, 1), (1, 0)])
    coll = make_collective("c", K.ALLGATHER, topo, topo.all_ranks(), size=36 * 1024,
                           algorithm=Hint("auto"), schedule=Hint("auto"))
    g = hop_graph(coll)
    net, members = flow_network(coll)
    rate = forestcoll_rate(net, members)
    ident = np.arange(g.n)[None, :], np.arange(g.m)[None, :]
    free = pack_trees(g, rate, 2, *ident, time.monotonic() + 60)
    ticks = iter(range(10**6))
    monkeypatch.setattr(trees_module.time, "monotonic", lambda: float(next(ticks)))
    cut = pack_trees(g, rate, 2, *ident, 9 * 2 + 5)    # 18 trees, then 5 more readings
    assert cut is not None
    assert cut.status in ("budget", "optimal")
    if free.status != "optimal":
        assert cut.status == "budget"
    # every tree spans: each member reaches its root by parents, over moves of the graph
    n, k, _ = cut.parent.shape
    for r in range(n):
        for j in range(k):
            for v in range(n):
                x, hops = v, 0
                while x != r and hops <= n:
                    h = cut.edge[r, j, x]
                    assert g.src[h] == cut.parent[r, j, x] and g.dst[h] == x
                    x, hops = int(cut.parent[r, j, x]), hops + 1
                assert x == r


def test_the_search_gives_up_past_its_budget_of_link_visits(monkeypatch):
    # a node of 4,096 alike NICs asked for ~15,000 refinements of 50,000 links (minutes); past
    # the budget the search finds nothing and synthesis runs without the symmetry
    import cclc.synth.fabric_symmetry as fs

    coll = dsl.load("examples/hgx16_leafspine.ccl").collectives[0]
    assert find_free_automorphism(coll.topology, coll.group) is not None
    visits = []
    refine = fs._Refiner.refine

    def counted(self, colors):
        out = refine(self, colors)
        visits.append(self.work)
        return out

    monkeypatch.setattr(fs._Refiner, "refine", counted)
    assert find_free_automorphism(coll.topology, coll.group) is not None
    needed = max(visits)
    monkeypatch.setattr(fs, "_MAX_WORK", needed // 2)
    assert find_free_automorphism(coll.topology, coll.group) is None
