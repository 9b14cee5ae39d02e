"""A GPU whose NIC failed is served by every live NIC of its server (cclc.algorithms.nic_spread,
through rail_halving): found from the topology alone, its rail ops cut into one part per live
NIC on fewest-hop routes through those NICs, and the schedule still verifies, computes the
right numbers (numpy reference), has the op and slot counts its algorithm states and takes
about ``1 + 1/L`` of the healthy time where one relay took twice as long."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cclc.algorithms.rail_halving as rail_halving
from cclc.algorithms import get
from cclc.algorithms.nic_spread import NicSpread, _nic_states, cut_unit, refine
from cclc.collective import CollectiveKind as K
from cclc.collective import DType, make_collective
from cclc.ir import Buf
from cclc.numeric import check_numeric
from cclc.relay import relay_count
from cclc.sim import simulate
from cclc.topology import NodeType, Topology, fat_tree, leaf_spine, with_faults
from cclc.verify import verify

KINDS = (K.ALLGATHER, K.REDUCESCATTER, K.ALLREDUCE)


def _hgx(gpus: int) -> NodeType:
    return NodeType("hgx", "nvswitch", gpus, 450e9, 1e-6, nics=gpus, nic_bandwidth=50e9)


def _leaf_spine(nodes: int, gpus: int) -> Topology:
    return leaf_spine("f", nodes, _hgx(gpus), rails=gpus, leaves=None, spines=2,
                      oversubscription=1.0, bandwidth=50e9, latency=2e-6)


def _fail_nics(topo: Topology, nics) -> Topology:
    """``topo`` with NIC ``i`` of node ``h`` and all its links failed, for each ``(h, i)``
    (what ``fault nic node(h).nic(i)`` does)."""
    return with_faults(topo, devices=[topo.vertex(f"node{h}.nic{i}") for h, i in nics])


def _coll(topo: Topology, kind: K, blocks: int = 2, name: str = "c"):
    n = topo.n_ranks
    return make_collective(name, kind, topo, topo.all_ranks(), size=4 * n * blocks * 7)


def _build(coll):
    algo = get("rail_halving")
    assert algo.applicable(coll) is None
    s = algo.build(coll)
    verify(s)
    assert len(s.ops) == algo.ops(coll)
    assert sum(s.n_chunks(b) for b in Buf) == algo.slots(coll)
    return s


def _dead_nic_gpus(topo: Topology) -> np.ndarray:
    return _nic_states(topo)[1]


def test_dead_nic_gpus_from_the_topology():
    topo = _leaf_spine(4, 4)
    assert _nic_states(topo)[0].all()
    assert not _dead_nic_gpus(topo).any()
    failed = _fail_nics(topo, [(1, 2)])
    assert np.flatnonzero(_dead_nic_gpus(failed)).tolist() == [topo.vertex("node1.gpu2")]
    # a NIC whose only cable to its leaf failed is as dead as a failed NIC
    nic = topo.vertex("node3.nic0")
    up = [(int(a), int(b)) for a, b in zip(topo.link_src, topo.link_dst, strict=True)
          if nic in (a, b) and min(a, b) >= topo.n_ranks]
    assert len(up) == 2
    cable = with_faults(topo, links=up)
    assert np.flatnonzero(_dead_nic_gpus(cable)).tolist() == [topo.vertex("node3.gpu0")]


def test_refine_cuts_only_the_chunks_asked():
    assert refine([7, 3], 3).tolist() == [3, 2, 2, 1, 1, 1]
    assert refine([7, 3, 5], 2, np.array([False, True, False])).tolist() == [7, 2, 1, 5]
    assert refine([7, 3], 1).tolist() == [7, 3]


@settings(max_examples=14, deadline=None)
@given(log_nodes=st.integers(1, 3), gpus=st.integers(3, 5), kind=st.sampled_from(KINDS),
       data=st.data())
def test_verifies_and_computes_with_dead_nics(log_nodes, gpus, kind, data):
    """One or two failed NICs anywhere (the same node, the same rail on two nodes, or
    apart): verified, right numbers, the op and slot counts the algorithm states, and every
    route one that ECMP carries (no relays added)."""
    nodes = 1 << log_nodes
    cells = st.tuples(st.integers(0, nodes - 1), st.integers(0, gpus - 1))
    dead = data.draw(st.lists(cells, min_size=1, max_size=2, unique=True))
    topo = _fail_nics(_leaf_spine(nodes, gpus), dead)
    coll = _coll(topo, kind, blocks=data.draw(st.integers(1, 2)))
    s = _build(coll)
    check_numeric(s, dtypes=[DType.FP64, DType.INT32])
    assert relay_count(s) == 0


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.value)
def test_three_tier_fabric_with_a_dead_nic(kind):
    topo = fat_tree("c", 8, _hgx(4), pods=2, rails=4, leaves=None, spines=2, cores=4,
                    oversubscription=(1, 2), bandwidth=50e9, latency=2e-6)
    s = _build(_coll(_fail_nics(topo, [(5, 1)]), kind))
    check_numeric(s, dtypes=[DType.INT32])
    assert relay_count(s) == 0


def _gpus_on(s, op: int) -> list[int]:
    """The GPUs a op's route passes, its ends excluded (vertices below n_ranks are GPUs)."""
    topo = s.topology
    path = s.routes.path(int(s.ops.route[op]))
    inner = [int(topo.link_dst[k]) for k in path[:-1]]
    return [v for v in inner if v < topo.n_ranks]


def test_parts_leave_through_every_live_nic_once():
    """Each rail op of the GPU without a NIC becomes one op per live NIC of its server, each
    through a different GPU of that server and through no other GPU; the healthy ranks'
    ops keep routes through no GPU at all."""
    gpus = 4
    topo = _fail_nics(_leaf_spine(4, gpus), [(2, 1)])
    s = _build(_coll(topo, K.ALLREDUCE))
    group = np.asarray(s.collective.group)
    node = topo.node_of_rank[group]
    dead = topo.vertex("node2.gpu1")
    o = s.ops
    across = np.flatnonzero(node[o.src] != node[o.dst])
    touched = across[(group[o.src[across]] == dead) | (group[o.dst[across]] == dead)]
    assert len(touched)
    by_op: dict[tuple, list[int]] = {}
    for k in touched.tolist():
        key = (int(o.step[k]), int(o.src[k]), int(o.dst[k]))
        by_op.setdefault(key, []).extend(_gpus_on(s, k))
        on_route = _gpus_on(s, k)
        assert len(on_route) == 1 and topo.node_of_rank[on_route[0]] == 2
    for relays in by_op.values():
        assert sorted(relays) == [topo.vertex(f"node2.gpu{g}") for g in (0, 2, 3)]
    others = np.setdiff1d(across, touched)
    assert all(not _gpus_on(s, k) for k in others.tolist())


def _time(topo: Topology) -> float:
    coll = make_collective("c", K.ALLREDUCE, topo, topo.all_ranks(), size=1 << 28)
    return simulate(_build(coll)).time


def test_one_dead_nic_costs_a_share_of_the_live_ones(monkeypatch):
    """8 nodes of 4 GPUs, NIC 0 of node 3 failed: about 4/3 of the healthy lockstep time
    (each of the 3 live NICs carries a third of the dead one's bytes), where keeping one
    relay (nothing cut) takes about twice as long."""
    healthy = _leaf_spine(8, 4)
    faulty = _fail_nics(healthy, [(3, 0)])
    base, spread = _time(healthy), _time(faulty)
    assert spread / base <= 4 / 3 * 1.05
    monkeypatch.setattr(rail_halving, "MAX_CUT_SLOTS", 0)
    one_relay = _time(faulty)
    assert one_relay / base >= 1.8


def test_nothing_is_cut_where_it_cannot_be(monkeypatch):
    """Blocks too small to cut, a node left with one live NIC, or more slots than allowed:
    the schedule is the one-relay schedule, with the healthy op count."""
    topo = _leaf_spine(4, 3)
    healthy_ops = get("rail_halving").ops(_coll(topo, K.ALLREDUCE))
    one_each = make_collective("c", K.ALLREDUCE, _fail_nics(topo, [(0, 0)]),
                               topo.all_ranks(), size=4 * topo.n_ranks)
    assert not NicSpread(one_each, one_each.count // one_each.n).active
    assert len(_build(one_each).ops) == healthy_ops
    lone = _coll(_fail_nics(topo, [(0, 0), (0, 1)]), K.ALLREDUCE)
    assert not NicSpread(lone, lone.count // lone.n).active
    assert len(_build(lone).ops) == healthy_ops
    monkeypatch.setattr(rail_halving, "MAX_CUT_SLOTS", 0)
    capped = _coll(_fail_nics(topo, [(1, 2)]), K.ALLREDUCE)
    assert len(_build(capped).ops) == healthy_ops


def test_cut_chunks_keep_the_units_coarse():
    """Chunks are cut in whole units of a divisor of every chunk's size, so the runtimes that
    count buffers in equal units (the gcd of the chunk sizes) count 64 units per chunk cut in
    sevenths, not one per element (which ran the NCCL library's emission out of memory)."""
    from backends.units import buffer_units, to_units

    assert cut_unit([np.full(4, 1 << 22)], 7) == 1 << 16
    assert refine([1 << 22], 7, None, 1 << 16).tolist() == [x << 16 for x in
                                                           (10, 9, 9, 9, 9, 9, 9)]
    topo = _fail_nics(_leaf_spine(4, 4), [(1, 1)])
    coll = make_collective("c", K.ALLREDUCE, topo, topo.all_ranks(), size=2 * (16 << 22))
    s = _build(coll)
    units, _ = to_units(s, split=True, pad=True)
    # 3 live NICs: parts of at least 8 units, so 32 units of 2^16 per chunk of 2^21 elements
    assert max(buffer_units(units)) == 16 * 32


def test_servers_with_fewer_nics_than_gpus():
    """8 GPUs and 4 NICs (on GPUs 0, 2, 4, 6): a GPU without a NIC of its own is not a relay;
    with NIC 0 of node 1 failed its GPU 0 is spread over the NICs of GPUs 2, 4 and 6."""
    node = NodeType("half", "nvswitch", 8, 450e9, 1e-6, nics=4, nic_bandwidth=50e9)
    topo = leaf_spine("f", 4, node, rails=4, leaves=None, spines=2, oversubscription=1.0,
                      bandwidth=50e9, latency=2e-6)
    live, dead = _nic_states(_fail_nics(topo, [(1, 0)]))
    assert np.flatnonzero(dead).tolist() == [topo.vertex("node1.gpu0")]
    assert live.sum() == 4 * 4 - 1
    coll = _coll(_fail_nics(topo, [(1, 0)]), K.ALLREDUCE)
    spread = NicSpread(coll, coll.count // coll.n)
    (relays,) = spread.relays.values()
    assert [int(coll.group[r]) for r in relays] == [topo.vertex(f"node1.gpu{g}") for g in (2, 4, 6)]
    for kind in KINDS:
        s = _build(_coll(_fail_nics(topo, [(1, 0)]), kind))
        check_numeric(s, dtypes=[DType.INT32])


def test_the_spread_is_read_from_the_routes(monkeypatch):
    """``spread_nics`` names the ranks whose cross-server ops the routes spread over several
    NICs, with how many (read from the schedule, not from how it was built); one relay, or
    a healthy fabric, spreads nothing, and the report says so only where there is a spread."""
    from cclc.algorithms.nic_spread import spread_nics, spread_note

    topo = _fail_nics(_leaf_spine(4, 4), [(2, 1)])
    s = _build(_coll(topo, K.ALLREDUCE))
    dead = topo.vertex("node2.gpu1")
    assert spread_nics(s) == {dead: 3}
    note = spread_note(s)
    assert note is not None and f"rank {dead} " in note and "3 NICs" in note
    assert "a plan, not what runs" in note
    assert spread_nics(_build(_coll(_leaf_spine(4, 4), K.ALLREDUCE))) == {}
    monkeypatch.setattr(rail_halving, "MAX_CUT_SLOTS", 0)
    one_relay = _build(_coll(topo, K.ALLREDUCE))
    assert spread_nics(one_relay) == {} and spread_note(one_relay) is None
