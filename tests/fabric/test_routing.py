"""Fabric routing: planned spine assignments never use a failed link and never load a spine link
above its fair share; ECMP hashing collides; both keep the schedule correct."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cclc.algorithms import get
from cclc.collective import CollectiveKind as K
from cclc.collective import make_collective
from cclc.errors import CollectiveError
from cclc.fabric_routing import ecmp_routes, fair_shares, planned_routes, spine_link_loads
from cclc.sim import simulate
from cclc.topology import NodeType, leaf_spine, with_faults
from cclc.verify import verify

GPU1 = NodeType("g1", "pcie", 1, 48e9, 1e-6, nics=1, nic_bandwidth=50e9)


def _fabric(nodes=8, leaves=2, spines=4, fail=()):
    topo = leaf_spine("f", nodes, GPU1, rails=1, leaves=leaves, spines=spines,
                      oversubscription=1.0, bandwidth=50e9, latency=1e-6)
    pairs = []
    for leaf, spine in fail:
        u, v = topo.vertex(f"leaf{leaf}"), topo.vertex(f"spine{spine}")
        pairs += [(u, v), (v, u)]
    return with_faults(topo, pairs) if pairs else topo


def _check_planned(s):
    """No failed link; no spine link above its fair share in a step whose spine-crossing flows
    are all one size; within one flow of it where sizes differ (indivisible flows of unequal
    sizes cannot always split evenly: 12, 12, 8, 4 over two links is 20 + 16, not 18 + 18)."""
    topo = s.topology
    verify(s)
    assert not topo.link_failed[s.routes.links].any()
    loads = spine_link_loads(s)
    shares = fair_shares(s)
    if not loads:
        return
    nb = s.op_bytes()
    crossing = np.isin(np.arange(len(s.ops)), [i for i in range(len(s.ops))
                       if set(s.routes.path(int(s.ops.route[i]))) & set(loads)])
    for step in range(s.n_steps):
        sizes = nb[crossing & (s.ops.step == step)]
        slack = 0 if len(np.unique(sizes)) <= 1 else int(sizes.max())
        for link, per_step in loads.items():
            assert not topo.link_failed[link]
            assert per_step[step] <= shares[link][step] + slack, (topo.link_name(link), step)


def test_direct_allgather_on_a_healthy_fabric_spreads_flows_evenly():
    topo = _fabric()
    coll = make_collective("c", K.ALLGATHER, topo, topo.all_ranks(), size=8 * 4096)
    planned = get("direct").build(coll)  # cclc's own schedules are planned when built
    _check_planned(planned)
    assert planned_routes(planned).routes.links.tolist() == planned.routes.links.tolist()
    loads = spine_link_loads(planned)
    # 4 nodes per leaf send 4 blocks each to the other leaf: 16 flows over 4 spines = 4 each
    block = 4096  # allgather size is the output: 8 blocks of 4096 B
    assert len(loads) == 16
    assert all((v == 4 * block).all() for v in loads.values())
    hashed = ecmp_routes(planned)
    assert simulate(planned).time <= simulate(hashed).time


def test_planned_routes_avoid_a_failed_link_and_respect_the_reduced_share():
    topo = _fabric(fail=[(1, 3)])
    coll = make_collective("c", K.ALLGATHER, topo, topo.all_ranks(), size=8 * 4096)
    s = planned_routes(get("direct").build(coll))
    _check_planned(s)
    block = 4096  # allgather size is the output: 8 blocks of 4096 B
    # leaf0 -> leaf1 may only use spines 0..2: ceil(16/3) = 6 flows on the busiest link
    loads = spine_link_loads(s)
    up = [topo.link_id(topo.vertex("leaf0"), topo.vertex(f"spine{k}")) for k in range(4)]
    assert loads.get(up[3]) is None or loads[up[3]].max() == 0
    assert max(loads[link].max() for link in up[:3]) == math.ceil(16 / 3) * block


def test_ecmp_collides_where_planned_does_not():
    # a ring whose every hop crosses between the two leaves: each step is a permutation of 8
    # flows each way over 8 spines, which a plan puts one per spine and hashing does not
    topo = _fabric(nodes=16, leaves=2, spines=8)
    group = tuple(x for k in range(8) for x in (k, k + 8))
    block = 4 << 20  # large enough that bandwidth, not latency, sets the step time
    coll = make_collective("c", K.ALLGATHER, topo, group, size=16 * block)
    s = get("ring").build(coll)
    planned, ecmp = planned_routes(s), ecmp_routes(s)
    verify(ecmp)
    assert max(v.max() for v in spine_link_loads(planned).values()) == block
    assert max(v.max() for v in spine_link_loads(ecmp).values()) >= 2 * block
    assert simulate(ecmp).time > 1.5 * simulate(planned).time
    # hashing is deterministic
    assert np.array_equal(ecmp_routes(s).routes.links, ecmp.routes.links)


def test_ecmp_never_uses_a_failed_link():
    topo = _fabric(nodes=8, leaves=2, spines=4, fail=[(0, 1), (1, 2)])
    coll = make_collective("c", K.ALLREDUCE, topo, topo.all_ranks(), size=4 * 1024)
    s = ecmp_routes(get("biring").build(coll))
    verify(s)
    assert not topo.link_failed[s.routes.links].any()


def test_schedules_of_cclc_are_planned_already():
    topo = _fabric(fail=[(0, 2)])
    coll = make_collective("c", K.REDUCESCATTER, topo, topo.all_ranks(), size=8 * 8 * 64)
    for name in ("pat", "biring", "recursive_halving"):
        s = get(name).build(coll)
        _check_planned(s)


ALGOS = ["direct", "bruck", "pat", "biring", "recursive_doubling"]


def _built(algo, coll):
    s = get(algo).build(coll)
    # direct (cclc.algorithms.direct) leaves routing to shortest paths: plan it here
    return planned_routes(s) if algo == "direct" else s


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=st.integers(2, 12), leaves=st.sampled_from([2, 3, 4]), spines=st.integers(1, 6),
       algo=st.sampled_from(ALGOS), blocks=st.integers(1, 5))
def test_planned_routes_never_exceed_the_fair_share(nodes, leaves, spines, algo, blocks):
    topo = _fabric(nodes, min(leaves, nodes), spines)
    coll = make_collective("c", K.ALLGATHER, topo, topo.all_ranks(), size=4 * nodes * blocks)
    s = _built(algo, coll)
    _check_planned(s)
    # planning a planned schedule again keeps it within the shares
    _check_planned(planned_routes(s))
    verify(ecmp_routes(s))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=st.integers(2, 12), leaves=st.sampled_from([2, 3, 4]), spines=st.integers(2, 6),
       fail=st.tuples(st.integers(0, 3), st.integers(0, 5)), algo=st.sampled_from(ALGOS),
       blocks=st.integers(1, 5))
def test_planned_routes_with_one_failed_link(nodes, leaves, spines, fail, algo, blocks):
    """One failed leaf-spine link (the C4 scenario). The shares of different leaves can then
    conflict (4 leaves on a ring, 2 spines, one cut: an odd cycle of forced choices), so the
    planner minimises the worst overload above the shares: it never uses the failed link and
    in no step is its worst overload above that of hashing (the shares are lower bounds for
    any assignment, so hashing's overload is at least as large)."""
    leaves = min(leaves, nodes)
    topo = _fabric(nodes, leaves, spines, [(fail[0] % leaves, fail[1] % spines)])
    coll = make_collective("c", K.ALLGATHER, topo, topo.all_ranks(), size=4 * nodes * blocks)
    s = _built(algo, coll)
    e = ecmp_routes(s)
    for x in (s, e):
        verify(x)
        assert not topo.link_failed[x.routes.links].any()
    shares = fair_shares(s)

    def overload(x):
        loads = spine_link_loads(x)
        worst = np.zeros(x.n_steps, dtype=np.int64)
        for link, per_step in loads.items():
            worst = np.maximum(worst, per_step - shares[link])
        return worst

    assert (overload(s) <= overload(e)).all()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=st.integers(2, 12), leaves=st.sampled_from([2, 3, 4]), spines=st.integers(2, 6),
       fail=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 5)), min_size=2, max_size=4),
       blocks=st.integers(1, 5))
def test_planned_routes_with_several_failures(nodes, leaves, spines, fail, blocks):
    """With several failures the per-leaf shares may conflict (a flow forced onto one spine
    by its destination's failures crowds its source's other flows): the plan still never
    uses a failed link, and its worst link is no worse than hashing's."""
    leaves = min(leaves, nodes)
    fail = [(a % leaves, b % spines) for a, b in fail]
    topo = _fabric(nodes, leaves, spines, fail)
    try:
        coll = make_collective("c", K.ALLGATHER, topo, topo.all_ranks(),
                               size=4 * nodes * blocks)
    except CollectiveError:
        return  # the faults disconnect the group
    leaf_v = [topo.vertex(f"leaf{i}") for i in range(leaves)]
    spine_v = [topo.vertex(f"spine{i}") for i in range(spines)]
    ok = [[not topo.link_failed[topo.link_id(a, s)] for s in spine_v] for a in leaf_v]
    s = get("direct").build(coll)
    if any(not any(x and y for x, y in zip(ok[a], ok[b], strict=True))
           for a in range(leaves) for b in range(leaves) if a != b):
        # two leaves share no healthy spine: their flows detour through a third leaf; the
        # plan keeps those paths as found and still never uses a failed link
        planned = planned_routes(s)
        verify(planned)
        assert not topo.link_failed[planned.routes.links].any()
        return
    planned, ecmp = planned_routes(s), ecmp_routes(s)
    for x in (planned, ecmp):
        verify(x)
        assert not topo.link_failed[x.routes.links].any()

    def worst(x):
        return max((v.max() for v in spine_link_loads(x).values()), default=0)

    assert worst(planned) <= worst(ecmp)
