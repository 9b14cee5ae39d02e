"""The array-wise spine and core routing (:mod:`cclc.fabric_routing`) against the per-route,
per-flow loops it replaced (``fabric_routing_reference``): on small leaf/spine and three-tier
fabrics with random failed switch links and random per-pair sizes, ECMP hashing and the
planned routing give the same route of every op, the same route table (ids included) and
the same errors."""

from __future__ import annotations

import numpy as np
import pytest
from fabric_routing_reference import ecmp_routes as reference_ecmp
from fabric_routing_reference import planned_routes as reference_planned
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cclc.fabric_routing as fabric_routing
from cclc.algorithms.direct import build_direct
from cclc.collective import CollectiveKind as K
from cclc.collective import make_collective
from cclc.errors import CclError
from cclc.fabric_routing import ecmp_pair_links, ecmp_routes, planned_routes
from cclc.topology import NodeType, fat_tree, leaf_spine, with_faults

GPU1 = NodeType("g1", "pcie", 1, 48e9, 1e-6, nics=1, nic_bandwidth=50e9)
HGX4 = NodeType("hgx4", "nvswitch", 4, 450e9, 1e-6, nics=4, nic_bandwidth=50e9)

FABRICS = {
    # two cores per spine group: the planned core paths of a flow share their spines' links
    "fat_tree": lambda: fat_tree("f", 8, GPU1, pods=2, rails=1, leaves=2, spines=2, cores=4,
                                 oversubscription=(1.0, 2.0), bandwidth=50e9, latency=1e-6),
    "fat_tree_rails": lambda: fat_tree("r", 4, HGX4, pods=2, rails=4, leaves=4, spines=2,
                                       cores=2, oversubscription=(1.0, 1.0), bandwidth=50e9,
                                       latency=1e-6),
    "leaf_spine": lambda: leaf_spine("l", 6, GPU1, rails=1, leaves=3, spines=3,
                                     oversubscription=1.0, bandwidth=50e9, latency=1e-6),
}


def _switch_links(topo) -> np.ndarray:
    names = topo.vertex_names
    tiers = ("leaf", "spine", "core")
    return np.flatnonzero([names[u].startswith(tiers) and names[v].startswith(tiers)
                           for u, v in zip(topo.link_src.tolist(), topo.link_dst.tolist(),
                                           strict=True)])


def _routed(route, s):
    """``route(s)``, or the message of the error it raises."""
    try:
        return route(s)
    except CclError as err:
        return str(err)


def _assert_same(got, want) -> None:
    if isinstance(want, str):
        assert got == want
        return
    assert not isinstance(got, str), got
    for name, col in want.ops.columns().items():
        np.testing.assert_array_equal(getattr(got.ops, name), col, err_msg=name)
    np.testing.assert_array_equal(got.routes.offsets, want.routes.offsets)
    np.testing.assert_array_equal(got.routes.links, want.routes.links)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fabric=st.sampled_from(sorted(FABRICS)), faults=st.lists(st.integers(0, 10 ** 6),
                                                               max_size=4),
       sizes=st.sampled_from(["uniform", "random"]), seed=st.integers(0, 2 ** 16))
def test_routes_match_the_per_flow_reference(fabric, faults, sizes, seed):
    topo = FABRICS[fabric]()
    links = _switch_links(topo)
    failed = {(int(topo.link_src[k]), int(topo.link_dst[k]))
              for k in links[np.asarray(faults, dtype=np.int64) % len(links)]}
    topo = with_faults(topo, links=sorted(failed))
    n = topo.n_ranks
    group = tuple(range(n))
    # unequal sizes: the plan's runs of one size and one leaf pair are short
    pair = np.random.default_rng(seed).integers(0, 4, size=(n, n)) * 4
    try:
        coll = (make_collective("a", K.ALLTOALL, topo, group, size=n * 4 * 8)
                if sizes == "uniform" else
                make_collective("a", K.ALLTOALL, topo, group, pair_sizes=pair))
        s = build_direct(coll)
    except CclError:
        return      # the faults cut a rank off: nothing to route
    _assert_same(_routed(ecmp_routes, s), _routed(reference_ecmp, s))
    _assert_same(_routed(planned_routes, s), _routed(reference_planned, s))


def test_hgx_fat_tree_alltoall_matches_the_reference():
    """Every pair of 32 GPUs: PXN hops inside the nodes, flows in pods and through cores."""
    topo = FABRICS["fat_tree_rails"]()
    s = build_direct(make_collective("a", K.ALLTOALL, topo, tuple(range(topo.n_ranks)),
                                     size=1 << 20))
    _assert_same(ecmp_routes(s), reference_ecmp(s))
    _assert_same(planned_routes(s), reference_planned(s))


def test_ecmp_used_only_keeps_every_op_path():
    """The pricing table (``used_only``) gives every op the path of the full table."""
    topo = FABRICS["fat_tree"]()
    s = planned_routes(build_direct(make_collective("a", K.ALLTOALL, topo,
                                                    tuple(range(topo.n_ranks)), size=4096)))
    full, small = ecmp_routes(s), ecmp_routes(s, used_only=True)
    assert len(small.routes) < len(full.routes)
    assert [full.routes.path(int(r)) for r in full.ops.route] == \
        [small.routes.path(int(r)) for r in small.ops.route]



@pytest.mark.parametrize("block", [1, 7])
def test_spine_hops_rewritten_a_block_at_a_time(block, monkeypatch):
    """The planned table and ECMP's pair links, their spine hops replaced a few paths at a
    time, are those replaced all at once."""
    topo = FABRICS["fat_tree_rails"]()

    def routed():
        s = build_direct(make_collective("a", K.ALLTOALL, topo, tuple(range(topo.n_ranks)),
                                         size=1 << 20))
        planned = planned_routes(s)
        return planned, ecmp_pair_links(planned)

    whole, whole_links = routed()
    monkeypatch.setattr(fabric_routing, "_HOP_BLOCK", block)
    blocked, blocked_links = routed()
    _assert_same(blocked, whole)
    np.testing.assert_array_equal(blocked_links, whole_links)
