"""direct, ring and tree: every collective they serve verifies on rings, tori, meshes, faulty
tori and a switch fabric, for group sizes 2..9; plus the shapes that make them what they are."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cclc import bounds, sim
from cclc.algorithms import get
from cclc.algorithms.common import route_table, snake_order, torus_routes
from cclc.collective import CollectiveKind, make_collective
from cclc.ir import Buf, OpKind
from cclc.numeric import check_numeric
from cclc.topology import NodeType, leaf_spine, single_node, single_switch, torus, with_faults
from cclc.verify import verify

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples")
NODE = NodeType("hgx", "nvswitch", 4, 100e9, 1e-6, nics=2, nic_bandwidth=50e9)
TOPOLOGIES = {
    "ring9": lambda: torus("ring9", (9,), bandwidth=10e9, latency=1e-7),
    "torus3x4": lambda: torus("t", (3, 4), bandwidth=10e9, latency=1e-7),
    "mesh3x3": lambda: torus("m", (3, 3), wrap=(False, False)),
    "torus2x2x3": lambda: torus("t3", (2, 2, 3)),
    "faulty4x4": lambda: with_faults(torus("f", (4, 4)), links=[(0, 1), (1, 0), (5, 9)]),
    "dead_rank": lambda: with_faults(torus("d", (3, 4)), ranks=[2]),
    "nvswitch": lambda: single_node("n", NodeType("dgx", "nvswitch", 9, 450e9, 1e-6)),
    "switch": lambda: single_switch("s", 9, NodeType("one", "pcie", 1, 32e9, 1e-6, nics=1,
                                                     nic_bandwidth=50e9), 50e9, 1e-6),
    "fabric": lambda: leaf_spine("ls", 3, NODE, rails=2, leaves=None, spines=2,
                                 oversubscription=1, bandwidth=50e9, latency=1e-6),
}
CASES = [("direct", k) for k in ("ALLTOALL", "ALLGATHER", "REDUCESCATTER")] + \
        [("ring", k) for k in ("ALLGATHER", "REDUCESCATTER", "ALLREDUCE", "BROADCAST",
                               "REDUCE")] + \
        [("tree", k) for k in ("BROADCAST", "REDUCE")]


def _coll(topo, kind: CollectiveKind, group, per_block: int = 3, root: int | None = None):
    n = len(group)
    if kind in (CollectiveKind.BROADCAST, CollectiveKind.REDUCE):
        root = n // 2 if root is None else root
    else:
        root = None
    return make_collective("c", kind, topo, tuple(group), size=4 * n * per_block, root=root)


def _check_links(s) -> None:
    """Every remote op's route runs from its source to its destination over healthy links."""
    topo, group = s.topology, s.collective.group
    for i in np.flatnonzero(s.ops.src != s.ops.dst)[:2000].tolist():
        path = s.routes.path(int(s.ops.route[i]))
        at = group[int(s.ops.src[i])]
        for link in path:
            assert not topo.link_failed[link]
            assert int(topo.link_src[link]) == at
            at = int(topo.link_dst[link])
        assert at == group[int(s.ops.dst[i])]


@pytest.mark.slow
@pytest.mark.parametrize("topo_name", TOPOLOGIES)
@pytest.mark.parametrize("algo,kind", CASES)
def test_verifies_for_group_sizes_2_to_9(topo_name, algo, kind):
    topo = TOPOLOGIES[topo_name]()
    live = topo.live_ranks()
    for n in range(2, min(9, len(live)) + 1):
        # spread the group over the machine, not just its first ranks
        group = [live[i] for i in np.linspace(0, len(live) - 1, n).round().astype(int)]
        coll = _coll(topo, CollectiveKind[kind], group)
        entry = get(algo)
        assert entry.applicable(coll) is None
        s = entry.build(coll)
        verify(s)
        check_numeric(s)
        _check_links(s)


@pytest.mark.parametrize("topo_name", ["torus3x4", "torus2x2x3", "faulty4x4", "dead_rank"])
@pytest.mark.parametrize("algo,kind", CASES)
def test_whole_torus(topo_name, algo, kind):
    topo = TOPOLOGIES[topo_name]()
    coll = _coll(topo, CollectiveKind[kind], topo.live_ranks(), root=1)
    s = get(algo).build(coll)
    verify(s)
    check_numeric(s)
    _check_links(s)
    assert sim.simulate(s).time >= bounds.bounds(coll).best * (1 - 1e-9)


def test_single_rank_groups():
    topo = torus("t", (4,))
    for algo, kind in CASES:
        s = get(algo).build(_coll(topo, CollectiveKind[kind], (2,)))
        verify(s)
        assert (s.ops.src == s.ops.dst).all()


def test_direct_alltoall_is_one_step_of_all_pairs():
    topo = torus("t", (4, 4))
    s = get("direct").build(_coll(topo, CollectiveKind.ALLTOALL, topo.all_ranks()))
    assert s.n_steps == 1 and len(s.ops) == 16 * 16
    # dimension-order routes on a healthy torus are shortest: hops = torus distance
    hops = s.routes.lengths()[s.ops.route]
    c = np.array([topo.coords(r) for r in range(16)])
    d = np.abs(c[s.ops.src] - c[s.ops.dst])
    assert (hops == np.minimum(d, 4 - d).sum(axis=1)).all()


def test_direct_nonuniform_alltoall_skips_empty_pairs():
    topo = torus("t", (5,))
    sizes = np.array([[0, 4, 8, 0, 4], [4, 4, 0, 0, 0], [8, 8, 8, 8, 8], [0, 0, 0, 0, 4],
                      [4, 0, 4, 0, 12]])
    coll = make_collective("c", CollectiveKind.ALLTOALL, topo, tuple(range(5)),
                           pair_sizes=sizes)
    s = get("direct").build(coll)
    verify(s)
    assert len(s.ops) == int((sizes > 0).sum())
    assert s.layouts[Buf.INPUT].shape == (5, 5)


def test_direct_routes_around_a_failed_link():
    topo = with_faults(torus("t", (6, 6)), links=[(0, 1)])
    s = get("direct").build(_coll(topo, CollectiveKind.ALLTOALL, topo.all_ranks()))
    verify(s)
    assert not topo.link_failed[s.routes.links].any()


def test_ring_on_whole_torus_uses_single_links():
    topo = torus("t", (4, 6))
    s = get("ring").build(_coll(topo, CollectiveKind.ALLGATHER, topo.all_ranks()))
    remote = s.ops.src != s.ops.dst
    assert (s.routes.lengths()[s.ops.route[remote]] == 1).all()
    assert s.n_steps == 23


def test_ring_allreduce_uneven_blocks():
    topo = torus("t", (7,))
    coll = make_collective("c", CollectiveKind.ALLREDUCE, topo, tuple(range(7)), size=4 * 10)
    s = get("ring").build(coll)
    verify(s)
    assert s.layouts[Buf.OUTPUT].sum() == 10
    # fewer elements than ranks: the empty blocks move no (latency-costing) messages
    tiny = get("ring").build(make_collective("c", CollectiveKind.ALLREDUCE, topo,
                                             tuple(range(7)), size=4 * 3))
    verify(tiny)
    check_numeric(tiny)
    assert (tiny.op_elems() > 0).all() and len(tiny.ops) < len(s.ops)


def test_ring_broadcast_chunks():
    topo = torus("t", (6,), latency=1e-6)
    coll = make_collective("c", CollectiveKind.BROADCAST, topo, tuple(range(6)),
                           size=4 * 1000, root=3)
    s = get("ring").build(coll, chunks=5)
    verify(s)
    assert s.n_steps == 5 + 6 - 2 and dict(s.params)["chunks"] == 5


def test_ring_reduce_is_the_broadcast_chain_run_backwards():
    topo = torus("t", (6,), latency=1e-6)
    for root in range(6):
        coll = make_collective("c", CollectiveKind.REDUCE, topo, tuple(range(6)),
                               size=4 * 1000, root=root)
        s = get("ring").build(coll, chunks=5)
        verify(s)
        check_numeric(s)
        # a local step seeding the partial sums, then 5 pieces over 5 hops
        assert s.n_steps == 1 + 5 + 6 - 2 and dict(s.params)["chunks"] == 5
        assert len(s.ops) == get("ring").ops(coll, chunks=5)
        remote = s.ops.src != s.ops.dst
        # every remote op adds into the next member towards the root; nothing leaves the root
        assert (s.ops.kind[remote] == OpKind.REDUCE).all()
        assert not (s.ops.src[remote] == root).any()
        assert (s.ops.dst[remote] == root).sum() == 5


@pytest.mark.parametrize("name", ["sum", "bcast"])
def test_chain_pieces_are_near_the_best_count_on_a_fabric(name):
    # the default piece count reads the slowest hop's route latency (several switches on a
    # fabric, not one link's): within 2% of the best of every count from 1 to 64
    import dsl

    prog = dsl.load(os.path.join(EXAMPLES, "pcie_oversubscribed.ccl"))
    coll = next(c for c in prog.collectives if c.name == name)
    best = min(sim.simulate(get("ring").build(coll, chunks=k)).time for k in range(1, 65))
    assert sim.simulate(get("ring").build(coll)).time <= 1.02 * best


def test_tree_has_log_steps():
    topo = torus("t", (9,))
    s = get("tree").build(_coll(topo, CollectiveKind.BROADCAST, topo.all_ranks()))
    assert s.n_steps == 4
    r = get("tree").build(_coll(topo, CollectiveKind.REDUCE, topo.all_ranks()))
    assert r.n_steps == 5  # the local seeding step + 4


def test_not_applicable_reasons():
    topo = torus("t", (4,))
    bc = _coll(topo, CollectiveKind.BROADCAST, topo.all_ranks())
    assert get("tree").applicable(bc) is None
    assert "no parameters" in get("tree").applicable(bc, chunks=3)
    a2a = _coll(topo, CollectiveKind.ALLTOALL, topo.all_ranks())
    assert "no parameters" in get("direct").applicable(a2a, chunks=3)
    ag = _coll(topo, CollectiveKind.ALLGATHER, topo.all_ranks())
    assert "no parameter chunks" in get("ring").applicable(ag, chunks=3)
    assert get("ring").applicable(bc, chunks=3) is None


def test_snake_order_is_hamiltonian():
    for dims in [(3, 4), (2, 3, 2), (5,), (4, 1, 3)]:
        order = snake_order(dims)
        assert sorted(order.tolist()) == list(range(int(np.prod(dims))))
        c = np.array(np.unravel_index(order, dims)).T
        assert (np.abs(np.diff(c, axis=0)).sum(axis=1) == 1).all()


@settings(max_examples=25, deadline=None)
@given(dims=st.lists(st.integers(1, 6), min_size=1, max_size=3),
       wrap=st.lists(st.booleans(), min_size=3, max_size=3), data=st.data())
def test_torus_routes_connect_pairs(dims, wrap, data):
    topo = torus("t", dims, wrap=wrap[:len(dims)])
    n = topo.n_ranks
    src = np.array(data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=20)))
    dst = np.array(data.draw(st.lists(st.integers(0, n - 1), min_size=len(src),
                                      max_size=len(src))))
    offsets, links = torus_routes(topo, src, dst)
    assert (links >= 0).all()
    for i in range(len(src)):
        at = src[i]
        path = links[offsets[i]:offsets[i + 1]]
        for link in path:
            assert topo.link_src[link] == at
            at = topo.link_dst[link]
        assert at == dst[i]
        assert len(path) == len(topo.shortest_path_links(int(src[i]), int(dst[i])))


def test_route_table_avoids_failures():
    topo = with_faults(torus("t", (5, 5)), links=[(0, 1), (6, 11)], ranks=[12])
    live = np.array(topo.live_ranks())
    src = np.repeat(live, len(live))
    dst = np.tile(live, len(live))
    offsets, links = route_table(topo, src, dst)
    assert not topo.link_failed[links].any()
    lengths = np.diff(offsets)
    for i in range(0, len(src), 7):
        assert lengths[i] == len(topo.shortest_path_links(int(src[i]), int(dst[i])))
