"""``synth`` for alltoall: the path LP against the node-arc LP of cclc.bounds (an independent
formulation), and the schedules through the verifier, the numeric interpreter, the simulator
(never under the LP, never slower than the best template) and the MSCCL executor."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cclc.algorithms import get
from cclc.bounds import bounds, lp_bound
from cclc.collective import CollectiveKind, Hint, make_collective
from cclc.numeric import check_numeric
from cclc.plan import plan
from cclc.sim import simulate
from cclc.synth.flow_solution import usable_links
from cclc.synth.flows import solve_flows
from cclc.synth.symmetry import translations
from cclc.topology import NodeType, leaf_spine, torus, with_faults
from cclc.verify import verify

A2A = CollectiveKind.ALLTOALL


def _both(links):
    return [(a, b) for a, b in links] + [(b, a) for a, b in links]


def _a2a(topo, per_pair=64, algorithm="auto", **params):
    group = topo.live_ranks()
    n = len(group)
    return make_collective("a", A2A, topo, tuple(group), size=n * per_pair * 4,
                           algorithm=Hint(algorithm, tuple(params.items())))


def _faulty(dims, links=(), ranks=(), routing="none", wrap=None):
    t = torus("t", dims, wrap=wrap, bandwidth=32e9, latency=1e-7, routing=routing)
    return with_faults(t, links=_both(links), ranks=ranks)


CASES = {
    "5x5 two faults in one ring": _faulty((5, 5), [(10, 15), (11, 16)]),
    "3x3x3 one fault": _faulty((3, 3, 3), [(0, 9)]),
    "4x4 failed rank": _faulty((4, 4), ranks=[5]),
    "3x4 mesh": _faulty((3, 4), wrap=(False, False)),
    "4x3 torus, two faults, dimension order": _faulty((4, 3), [(0, 3), (4, 5)],
                                                      routing="dimension_order"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_path_lp_equals_the_node_arc_lp(name):
    coll = _a2a(CASES[name])
    flows = solve_flows(coll)
    assert flows.status == "optimal"
    assert flows.lp_time == pytest.approx(lp_bound(coll).seconds, rel=2e-3)
    # every pair's shares add up to one and every path joins its pair over usable links
    topo = coll.topology
    usable = usable_links(coll)
    tot = np.zeros((coll.n, coll.n))
    np.add.at(tot, (flows.src, flows.dst), flows.weight)
    off = ~np.eye(coll.n, dtype=bool)
    assert np.allclose(tot[off], 1.0)
    group = np.array(coll.group)
    for s, d, p in zip(flows.src.tolist(), flows.dst.tolist(), flows.path, strict=True):
        assert usable[list(p)].all()
        assert topo.link_src[p[0]] == group[s] and topo.link_dst[p[-1]] == group[d]
        assert (topo.link_dst[list(p[:-1])] == topo.link_src[list(p[1:])]).all()


def test_healthy_torus_uses_every_translation():
    coll = _a2a(_faulty((4, 4)))
    assert translations(coll, usable_links(coll)).order == 16
    flows = solve_flows(coll, full_group=False)
    assert flows.symmetry == 16
    # with reflections and the exchange of the two dimensions: 16 x 8 automorphisms
    assert solve_flows(coll, full_group=True).symmetry == 128
    assert flows.lp_time == pytest.approx(lp_bound(coll).seconds, rel=2e-3)


def test_a_fault_breaks_the_translations_it_moves():
    coll = _a2a(_faulty((4, 4), [(0, 4)]))
    assert translations(coll, usable_links(coll)).order == 1
    # a whole failed ring row keeps the translations along it
    row = [(r, r + 4) for r in range(4)]       # every (x,0)-(x+1,0)... along dimension 1
    coll = _a2a(_faulty((4, 4), [(4 * 0 + y, 4 * 1 + y) for y in range(4)]))
    assert translations(coll, usable_links(coll)).order == 4
    del row


def _check(schedule):
    verify(schedule)
    check_numeric(schedule, dtypes=None)
    p = dict(schedule.params)
    assert schedule.algorithm == "synth"
    assert p["status"] in ("optimal", "feasible", "budget", "fallback")
    assert p["solver"] == "pdlp" and p["solve_s"] >= 0
    t = simulate(schedule).time
    assert t >= bounds(schedule.collective, lp=False).best * (1 - 1e-9)
    return t, p


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_synth_schedules_are_correct_and_near_the_lp(name):
    coll = _a2a(CASES[name], per_pair=240, algorithm="synth")
    s = get("synth").build(coll)
    t, p = _check(s)
    lp = lp_bound(coll).seconds
    assert t >= lp * (1 - 2e-3)
    if p["status"] == "optimal":
        assert p["lp_fraction"] == pytest.approx(lp / t, rel=5e-3)


@pytest.mark.slow
@pytest.mark.parametrize("per_pair", [4, 240, 1 << 16])
def test_never_slower_than_the_best_template(per_pair):
    # `algorithm synth`, with every other entry evaluated beside it (explain)
    coll = _a2a(CASES["5x5 two faults in one ring"], per_pair=per_pair, algorithm="synth")
    p = plan(coll, explain=True, prune=False)
    times = {c.name: c.time for c in p.candidates if c.time is not None}
    best_template = min(t for name, t in times.items() if name != "synth")
    assert times["synth"] <= best_template * (1 + 1e-9)


@pytest.mark.slow
@pytest.mark.parametrize("per_pair", [4, 1 << 16])
def test_under_auto_the_planner_races_the_synthesized_schedule(per_pair):
    # under `auto` synth returns its own schedule (no template inside it) and the planner
    # keeps the fastest candidate: synth at large sizes, a template at tiny ones
    coll = _a2a(CASES["5x5 two faults in one ring"], per_pair=per_pair)
    p = plan(coll, prune=False)
    assert any(c.name == "synth" and c.time is not None for c in p.candidates)
    assert p.time == min(c.time for c in p.candidates if c.time is not None)
    if per_pair == 1 << 16:
        params = dict(p.schedule.params)
        assert p.name == "synth" and params["status"] == "optimal" and "template" not in params


@pytest.mark.slow
def test_large_sizes_approach_the_lp_rate():
    # 1 MiB per pair on a 5x5 torus with two failed links in one ring
    coll = _a2a(CASES["5x5 two faults in one ring"], per_pair=1 << 18, algorithm="synth")
    s = get("synth").build(coll)
    p = dict(s.params)
    assert p["status"] == "optimal"
    assert p["lp_fraction"] >= 0.9


def test_nonuniform_sizes():
    topo = _faulty((3, 3), [(0, 1)])
    rng = np.random.default_rng(4)
    sizes = rng.integers(0, 9, size=(9, 9)) * 4 * 32
    coll = make_collective("a", A2A, topo, tuple(range(9)), pair_sizes=sizes,
                           algorithm=Hint("synth"))
    _check(get("synth").build(coll))


def test_oversubscribed_fabric_with_failed_cable_and_nvlink_nodes():
    node = NodeType("n", "nvswitch", 2, 450e9, 1e-6, nics=2, nic_bandwidth=50e9)
    topo = leaf_spine("f", 4, node, rails=2, leaves=None, spines=2, oversubscription=2,
                      bandwidth=50e9,
                      latency=2e-6)
    leaf, spine = topo.vertex("leaf0"), topo.vertex("spine1")
    topo = with_faults(topo, links=[(leaf, spine), (spine, leaf)])
    coll = make_collective("a", A2A, topo, tuple(range(8)), size=8 * 64 * 4,
                           algorithm=Hint("synth"))
    _check(get("synth").build(coll))


@pytest.mark.slow
def test_budget_runs_out_into_a_template():
    coll = _a2a(CASES["3x3x3 one fault"], algorithm="synth", budget=1e-6)
    # the hint's parameters as the planner hands them, raced as the planner races them
    from cclc.algorithms import BuildContext
    from cclc.template_race import race_synthesis

    s = race_synthesis(coll, get("synth"), BuildContext(), {"budget": 1e-6})
    p = dict(s.params)
    assert p["status"] in ("budget", "fallback") and "template" in p or p["status"] == "budget"
    verify(s)


def test_parameters_are_checked():
    synth = get("synth")
    coll = _a2a(CASES["3x3x3 one fault"])
    assert "budget" in synth.applicable(coll, budget=-1)
    assert "takes budget" in synth.applicable(coll, chunks=3)
    huge = _a2a(_faulty((6, 6, 4)))
    assert "give it a budget" in synth.applicable(huge)
    assert synth.applicable(huge, budget=30) is None


def test_auto_considers_synth_where_the_faults_break_the_torus_symmetry():
    synth = get("synth")
    healthy = _faulty((5, 5, 3))
    assert "translations all survive" in synth.applicable(_a2a(healthy))
    assert synth.applicable(_a2a(healthy, algorithm="synth")) is None   # asked for by name
    assert synth.applicable(_a2a(healthy), budget=30) is None
    assert synth.applicable(_a2a(_faulty((5, 5, 3), [(0, 1)]))) is None
    assert synth.applicable(_a2a(_faulty((6, 6), wrap=(False, False)))) is None   # a mesh
    assert synth.applicable(_a2a(_faulty((4, 4)))) is None           # 16 ranks: always


@st.composite
def faulty_tori(draw):
    dims = tuple(draw(st.lists(st.integers(2, 4), min_size=1, max_size=3)))
    if np.prod(dims) < 3:
        dims = dims + (3,)
    routing = draw(st.sampled_from(["none", "dimension_order", "shortest", "source"]))
    t = torus("t", dims, bandwidth=10e9, latency=1e-6, routing=routing)
    pairs = sorted({(min(a, b), max(a, b)) for a, b in zip(t.link_src.tolist(),
                                                             t.link_dst.tolist(), strict=True)})
    chosen = draw(st.lists(st.sampled_from(pairs), max_size=2, unique=True))
    faulty = with_faults(t, links=_both(chosen))
    if not faulty.is_connected(faulty.live_ranks()):
        faulty = t
    return faulty


@pytest.mark.slow
@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(faulty_tori(), st.sampled_from([4, 96, 4096]))
def test_random_faulty_tori(topo, per_pair):
    coll = _a2a(topo, per_pair=per_pair, algorithm="synth")
    s = get("synth").build(coll)
    t, _ = _check(s)
    assert t >= lp_bound(coll).seconds * (1 - 2e-3)


def test_a_group_that_only_outsiders_could_join_is_not_applicable():
    t = torus("r", (6,), routing="none")
    coll = make_collective("x", A2A, t, (0, 3), 2 * 4 * 2)
    assert "cannot reach each other" in get("synth").applicable(coll)


@pytest.mark.parametrize("per_pair", [4, 1 << 14])
def test_the_template_race_skips_only_templates_that_cannot_win(per_pair):
    # brute force: every applicable template built and predicted
    from cclc.algorithms import BuildContext, algorithms_for
    from cclc.execution import predict
    from cclc.template_race import fastest_template

    coll = _a2a(CASES["5x5 two faults in one ring"], per_pair=per_pair, algorithm="synth")
    auto = _a2a(CASES["5x5 two faults in one ring"], per_pair=per_pair)
    times = [float(predict(a.build(auto)).time) for a in algorithms_for(auto)
             if a.name != "synth" and a.applicable(auto) is None]
    fastest = min(times)
    # whenever a template beats `beat`, the fastest one is found; otherwise any found
    # template is no faster than `beat` (synth keeps its own schedule)
    synth, ctx = get("synth"), BuildContext()
    assert fastest_template(coll, synth, ctx).time == fastest
    assert fastest_template(coll, synth, ctx, beat=2 * fastest).time == fastest
    assert fastest_template(coll, synth, ctx, beat=fastest * (1 + 1e-6)).time == fastest
    below = fastest_template(coll, synth, ctx, beat=0.5 * fastest)
    assert below is None or below.time >= fastest
