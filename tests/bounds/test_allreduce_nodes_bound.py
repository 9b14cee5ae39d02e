"""The AllReduce bound over nodes as parties: every element crosses between the N nodes of the
group at least 2(N-1) times (one-way gossip), checked by brute force on the gossip itself and
against the closed form on rail-optimized fabrics. That no schedule of any algorithm beats it
is the property of tests/bounds/test_group_bounds.py (groups across the nodes of small fabrics,
every algorithm, every execution model)."""

from __future__ import annotations

import itertools
import os

import pytest

import dsl
from cclc.bounds import bounds, injection_bound
from cclc.collective import CollectiveKind, DType, make_collective
from cclc.topology import NodeType, leaf_spine, with_faults

K = CollectiveKind
NIC = 50e9
NVLINK = 450e9
EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples")


def fabric(nodes: int, gpus: int, nics: int, spines: int = 2):
    node = NodeType("hgx", "nvswitch", gpus, NVLINK, 1e-6, nics=nics, nic_bandwidth=NIC)
    return leaf_spine("f", nodes, node, rails=nics, leaves=None, spines=spines,
                      oversubscription=1.0, bandwidth=NIC, latency=2e-6)


def allreduce(topo, size: int, group=None):
    group = tuple(topo.live_ranks() if group is None else group)
    return make_collective("c", K.ALLREDUCE, topo, group, size=size, dtype=DType.UINT8)


def fewest_one_way_messages(n: int) -> int:
    """Breadth-first search over what every party knows: the fewest one-way messages (the
    sender passes on all it knows, as a partial sum does) after which all know everything."""
    everything = (1 << n) - 1
    start = tuple(1 << i for i in range(n))
    seen, frontier, depth = {start}, [start], 0
    while True:
        if any(all(k == everything for k in state) for state in frontier):
            return depth
        nxt = []
        for state in frontier:
            for a, b in itertools.permutations(range(n), 2):
                if state[a] | state[b] != state[b]:
                    new = list(state)
                    new[b] |= state[a]
                    new = tuple(new)
                    if new not in seen:
                        seen.add(new)
                        nxt.append(new)
        frontier, depth = nxt, depth + 1


@pytest.mark.slow
@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_one_way_gossip_needs_2n_minus_2_messages(n):
    # the fact the bound rests on (Harary and Schwenk), for the sizes a test can enumerate
    assert fewest_one_way_messages(n) == 2 * n - 2


@pytest.mark.parametrize("nodes,gpus,nics", [(2, 4, 4), (4, 2, 2), (3, 4, 2)])
def test_closed_form_on_a_rail_optimized_fabric(nodes, gpus, nics):
    t = fabric(nodes, gpus, nics)
    size = 1 << 24
    b = injection_bound(allreduce(t, size))
    want = 2 * (nodes - 1) * size / (nodes * nics * NIC)
    # the rank form (2(n-1)/n S at a GPU's NVLink and NIC) is far below it
    assert want > 2 * (t.n_ranks - 1) / t.n_ranks * size / (NVLINK + NIC)
    assert b.seconds == pytest.approx(want, rel=1e-12)
    assert f"N = {nodes} nodes" in b.description


def test_the_fabric_example_bound_is_the_nodes_nics():
    (topo,) = dsl.load(os.path.join(EXAMPLES, "hgx16_leafspine.ccl")).topologies.values()
    size = 128 << 20
    b = bounds(allreduce(topo, size), lp=False)
    # 16 servers of 8 NICs at 400 Gb/s: 629 us, where every earlier bound was <= 533 us
    assert b.best == pytest.approx(2 * 15 * size / (16 * 8 * NIC), rel=1e-12)
    assert b.name == "injection"


def test_a_group_inside_one_node_keeps_the_rank_form():
    t = fabric(3, 4, 4)
    c = allreduce(t, 1 << 20, group=t.node(1))
    b = injection_bound(c)
    assert "some rank" in b.description
    # its schedules use only NVLink (no NIC is on a route between two GPUs of one node)
    assert b.seconds == pytest.approx(2 * 3 / 4 * (1 << 20) / NVLINK, rel=1e-12)


def test_one_gpu_per_node_is_the_rank_form_at_its_nic():
    # rail 0: one member per node and, for its schedules, only that member's NIC leaves it
    t = fabric(4, 4, 4)
    group = t.rail(0)
    b = injection_bound(allreduce(t, 1 << 20, group=group))
    assert b.seconds == pytest.approx(2 * 3 / 4 * (1 << 20) / NIC, rel=1e-12)


def test_a_failed_nic_cable_lowers_what_the_nodes_can_send():
    t = fabric(3, 2, 2)
    cut = with_faults(t, links=[(t.vertex("node0.nic0"), t.vertex("leaf0"))])
    size = 1 << 22
    healthy = injection_bound(allreduce(t, size)).seconds
    faulty = injection_bound(allreduce(cut, size)).seconds
    # one way of one NIC fails: the nodes' total outgoing bandwidth loses one NIC
    assert faulty == pytest.approx(2 * 2 * size / (5 * NIC), rel=1e-12)
    assert faulty > healthy
