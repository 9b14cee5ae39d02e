"""ECMP priced on the plan's (op, link) pairs (:func:`cclc.fabric_routing.ecmp_pair_links`)
against the schedule :func:`~cclc.fabric_routing.ecmp_routes` rewrites: the same pairs in the
same order, so every simulated time and link load is the same to the bit, on two- and
three-tier fabrics, healthy and with failed cables, and :func:`cclc.execution.predict` prints
what it printed when it simulated the rewritten schedule."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cclc.algorithms import get
from cclc.collective import CollectiveKind as K
from cclc.collective import make_collective
from cclc.errors import ScheduleError
from cclc.execution import IR_MODEL, MSCCL_MODEL, MSCCLPP_MODEL, predict
from cclc.fabric_routing import _fabric, _spine_hops, ecmp_pair_links, ecmp_routes
from cclc.ir import Schedule
from cclc.sim import simulate
from cclc.topology import NodeType, Topology, fat_tree, leaf_spine, with_faults

GPU1 = NodeType("g1", "pcie", 1, 48e9, 1e-6, nics=1, nic_bandwidth=50e9)
HGX4 = NodeType("hgx4", "nvswitch", 4, 450e9, 1e-6, nics=4, nic_bandwidth=50e9)

#: (collective, algorithm) pairs whose flows cross spines
CASES = ((K.ALLTOALL, "direct"), (K.ALLGATHER, "ring"), (K.ALLREDUCE, "hierarchical"),
         (K.REDUCESCATTER, "rail_halving"))


def _machine(three_tier: bool, nodes: int, node: NodeType, cut: int) -> Topology:
    """A fabric of ``nodes`` servers, two tiers or three, with the uplink ``cut`` (counted
    round the uplinks) failed in both directions; ``cut < 0``: healthy."""
    if three_tier:
        topo = fat_tree("f", nodes, node, pods=2, rails=node.nics, leaves=node.nics,
                        spines=2, cores=4, oversubscription=(1.0, 2.0), bandwidth=50e9,
                        latency=1e-6)
    else:
        topo = leaf_spine("f", nodes, node, rails=node.nics, leaves=2 * node.nics, spines=3,
                          oversubscription=1.0, bandwidth=50e9, latency=1e-6)
    uplinks = np.flatnonzero([topo.vertex_names[int(u)].startswith("leaf")
                              and topo.vertex_names[int(v)].startswith("spine")
                              for u, v in zip(topo.link_src, topo.link_dst, strict=True)])
    if cut < 0:
        return topo
    k = int(uplinks[cut % len(uplinks)])
    u, v = int(topo.link_src[k]), int(topo.link_dst[k])
    return with_faults(topo, [(u, v), (v, u)])


def _planned(three_tier: bool, nodes: int, servers: bool, case, cut: int) -> Schedule | None:
    """``case``'s schedule (routed by the routing pass) over every rank of :func:`_machine`,
    with ``servers`` of four GPUs or of one; ``None`` where the algorithm does not apply."""
    kind, algo = case
    topo = _machine(three_tier, nodes, HGX4 if servers else GPU1, cut)
    coll = make_collective("c", kind, topo, topo.all_ranks(),
                           size=topo.n_ranks * topo.n_ranks * 256)
    entry = get(algo)
    return entry.build(coll) if entry.applicable(coll) is None else None


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(three_tier=st.booleans(), nodes=st.sampled_from([4, 6, 8]), servers=st.booleans(),
       case=st.sampled_from(CASES), cut=st.integers(-1, 40))
def test_pairs_and_times_equal_the_rewritten_schedule(three_tier, nodes, servers, case, cut):
    s = _planned(three_tier, nodes, servers, case, cut)
    if s is None:
        return
    links = ecmp_pair_links(s)
    hashed = ecmp_routes(s, used_only=True)
    if links is None:
        assert hashed is s
        return
    ops, want = hashed.op_links()
    assert np.array_equal(s.op_links()[0], ops)
    assert np.array_equal(links, want)
    for mode in ("lockstep", "event"):
        got, ref = simulate(s, mode=mode, pair_links=links), simulate(hashed, mode=mode)
        assert got.time == ref.time
        assert np.array_equal(got.link_bytes, ref.link_bytes)
        assert np.array_equal(got.op_finish, ref.op_finish)
    for model in (IR_MODEL, MSCCLPP_MODEL, MSCCL_MODEL):
        p = predict(s, model)
        planned = simulate(s, mode=model.mode, step_overhead=model.step_overhead,
                           op_overhead=model.op_overhead,
                           overhead_steps=model.overhead_steps).time + model.call_overhead
        ecmp = simulate(hashed, mode=model.mode, step_overhead=model.step_overhead,
                        op_overhead=model.op_overhead,
                        overhead_steps=model.overhead_steps).time + model.call_overhead
        assert p.time == ecmp
        assert p.planned_time == (None if abs(planned - ecmp) <= 1e-9 * ecmp else planned)


def test_a_pair_link_list_of_another_length_is_refused():
    topo = _machine(False, 4, GPU1, -1)
    s = get("direct").build(make_collective("c", K.ALLTOALL, topo, topo.all_ranks(),
                                            size=4 * 4 * 256))
    with pytest.raises(ScheduleError, match="links given"):
        simulate(s, pair_links=s.op_links()[1][:-1])


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(three_tier=st.booleans(), nodes=st.sampled_from([4, 6, 8]), servers=st.booleans(),
       case=st.sampled_from(CASES), cut=st.integers(-1, 40), used_only=st.booleans())
def test_rewritten_tables_carry_their_spine_hops(three_tier, nodes, servers, case, cut,
                                                 used_only):
    """The spine hops a rewritten table keeps (the routing pass's, and ECMP's, read again
    when ECMP is priced) are those found afresh on its routes."""
    planned = _planned(three_tier, nodes, servers, case, cut)
    if planned is None:
        return
    for s in (planned, ecmp_routes(planned, used_only=used_only)):
        fab = _fabric(s.topology)
        pos, la, lb, _, core = _spine_hops(s, fab)
        kept = s._cache.get("spine_hops")
        if kept is None:                  # nothing crossed a spine: nothing was rewritten
            assert not (pos >= 0).any()
            continue
        for got, want in zip(kept, (pos, la, lb, core), strict=True):
            assert np.array_equal(got, want)
