"""Every AllGather / ReduceScatter / AllReduce / AllToAll algorithm of issue 5 verifies and
computes the right numbers for every group size 2..33, powers of two and not."""

from __future__ import annotations

import numpy as np
import pytest

from cclc.algorithms import get
from cclc.collective import CollectiveKind as K
from cclc.collective import DType, make_collective
from cclc.numeric import check_numeric
from cclc.topology import NodeType, leaf_spine, single_node, torus, with_faults
from cclc.verify import verify

SIZES = range(2, 34)

#: (algorithm, collective) pairs that run on any group (a switch here)
SWITCH = [("bruck", K.ALLGATHER), ("bruck", K.ALLTOALL), ("pat", K.ALLGATHER),
          ("pat", K.REDUCESCATTER), ("recursive_doubling", K.ALLGATHER),
          ("recursive_doubling", K.ALLREDUCE), ("recursive_halving", K.REDUCESCATTER),
          ("halving_doubling", K.ALLREDUCE), ("biring", K.ALLGATHER),
          ("biring", K.REDUCESCATTER), ("biring", K.ALLREDUCE), ("direct", K.ALLREDUCE)]

RING_KINDS = (K.ALLGATHER, K.REDUCESCATTER, K.ALLREDUCE)


def _size(kind: K, n: int, blocks: int = 3) -> int:
    """A size in bytes (fp32) that ``kind`` can split over ``n`` ranks; not a multiple of n for
    allreduce, so uneven blocks are exercised."""
    if kind is K.ALLREDUCE:
        return 4 * (n * blocks + 1)
    if kind is K.ALLTOALL:
        return 4 * n * blocks
    return 4 * n * blocks


def check(coll, name: str, **params):
    algo = get(name)
    assert algo is not None, name
    why = algo.applicable(coll, **params)
    assert why is None, why
    s = algo.build(coll, **params)
    verify(s)
    check_numeric(s, dtypes=[DType.FP64, DType.INT32])
    return s


@pytest.mark.slow
@pytest.mark.parametrize("name,kind", SWITCH, ids=[f"{a}-{k.value}" for a, k in SWITCH])
def test_switch_every_group_size(name, kind):
    for n in SIZES:
        topo = single_node("box", NodeType("x", "nvswitch", n, 100e9, 1e-6))
        coll = make_collective("c", kind, topo, topo.all_ranks(), size=_size(kind, n))
        check(coll, name)


@pytest.mark.slow
@pytest.mark.parametrize("kind", RING_KINDS, ids=lambda k: k.value)
def test_biring_on_physical_rings(kind):
    for n in SIZES:
        topo = torus("ring", (n,), bandwidth=10e9, latency=1e-6)
        coll = make_collective("c", kind, topo, topo.all_ranks(), size=_size(kind, n))
        s = check(coll, "biring")
        # on a physical ring every hop is one link
        assert set(s.routes.lengths()[s.ops.route[s.ops.src != s.ops.dst]].tolist()) == {1}


@pytest.mark.slow
@pytest.mark.parametrize("kind", RING_KINDS, ids=lambda k: k.value)
def test_foldedring_every_size_and_fault_position(kind):
    for n in range(3, 34):
        for broken in sorted({0, n // 2, n - 1}):
            topo = with_faults(torus("ring", (n,)), [(broken, (broken + 1) % n)])
            coll = make_collective("c", kind, topo, topo.all_ranks(), size=_size(kind, n))
            s = check(coll, "foldedring")
            used = s.routes.links
            assert not topo.link_failed[used].any()


def test_foldedring_loads_every_surviving_link_once_per_step():
    n = 7
    topo = with_faults(torus("ring", (n,)), [(2, 3), (3, 2)])
    coll = make_collective("c", K.ALLGATHER, topo, topo.all_ranks(), size=4 * n * 8)
    s = check(coll, "foldedring")
    healthy = np.flatnonzero(~topo.link_failed)
    for step in range(s.n_steps):
        ops = np.flatnonzero(s.ops.step == step)
        links = np.concatenate([np.asarray(s.routes.path(int(s.ops.route[i])), dtype=int)
                                for i in ops])
        counts = np.bincount(links, minlength=topo.n_links)
        # every surviving directed link carries exactly one logical hop per step
        assert (counts[healthy] == 1).all()


@pytest.mark.parametrize("dims", [(2, 2), (3, 4), (4, 4), (2, 3, 2), (3, 3, 3), (5, 1, 3)])
@pytest.mark.parametrize("kind", RING_KINDS, ids=lambda k: k.value)
def test_ring_dimrotation_on_tori(dims, kind):
    topo = torus("t", dims)
    n = topo.n_ranks
    coll = make_collective("c", kind, topo, topo.all_ranks(), size=_size(kind, n, blocks=4))
    check(coll, "ring+dimrotation")


@pytest.mark.parametrize("nodes,gpus", [(2, 2), (3, 4), (4, 8), (5, 3), (2, 8), (11, 3)])
@pytest.mark.parametrize("kind", RING_KINDS, ids=lambda k: k.value)
def test_hierarchical_shapes(nodes, gpus, kind):
    node = NodeType("hgx", "nvswitch", gpus, 450e9, 1e-6, nics=gpus, nic_bandwidth=50e9)
    topo = leaf_spine("f", nodes, node, rails=gpus, leaves=None, spines=2,
                      oversubscription=1.0, bandwidth=50e9, latency=2e-6)
    n = topo.n_ranks
    coll = make_collective("c", kind, topo, topo.all_ranks(), size=_size(kind, n))
    check(coll, "hierarchical")


@pytest.mark.parametrize("kind", RING_KINDS, ids=lambda k: k.value)
def test_hierarchical_pipelined(kind):
    node = NodeType("hgx", "nvswitch", 3, 450e9, 1e-6, nics=3, nic_bandwidth=50e9)
    topo = leaf_spine("f", 4, node, rails=3, leaves=None, spines=2, oversubscription=1.0,
                      bandwidth=50e9, latency=2e-6)
    coll = make_collective("c", kind, topo, topo.all_ranks(), size=_size(kind, 12, blocks=6))
    for chunks in (2, 3, 5):
        s = check(coll, "hierarchical", chunks=chunks)
        assert dict(s.params)["chunks"] == chunks


def test_hierarchical_on_a_subset_of_gpus():
    node = NodeType("hgx", "nvswitch", 4, 450e9, 1e-6, nics=4, nic_bandwidth=50e9)
    topo = leaf_spine("f", 3, node, rails=4, leaves=None, spines=2, oversubscription=1.0,
                      bandwidth=50e9, latency=2e-6)
    group = (9, 1, 5, 0, 8, 4)  # gpus 0 and 1 of three nodes, shuffled
    coll = make_collective("c", K.ALLREDUCE, topo, group, size=4 * 61)
    check(coll, "hierarchical")


def test_swing_on_powers_of_two_and_tori():
    for n in SIZES:
        topo = single_node("box", NodeType("x", "nvswitch", n, 100e9, 1e-6))
        coll = make_collective("c", K.ALLREDUCE, topo, topo.all_ranks(), size=_size(K.ALLREDUCE, n))
        if n & (n - 1):
            assert "power-of-two" in get("swing").applicable(coll)
            continue
        s = check(coll, "swing")
        assert s.n_steps == 1 + n.bit_length() - 1  # a local copy, then log2 n exchanges
    for dims in [(2, 4), (4, 4, 4), (8, 4, 4), (16,)]:
        topo = torus("t", dims)
        coll = make_collective("c", K.ALLREDUCE, topo, topo.all_ranks(), size=4 * 37)
        check(coll, "swing")


def test_not_applicable_reasons_are_sentences():
    topo = torus("t", (4, 4))
    coll = make_collective("c", K.ALLGATHER, topo, topo.all_ranks(), size=4 * 16)
    for name in ("hierarchical", "foldedring", "recursive_doubling"):
        why = get(name).applicable(coll)
        assert why and " " in why and why[0].islower(), (name, why)
    coll = make_collective("c", K.ALLREDUCE, topo, topo.all_ranks(), size=4 * 16)
    assert "allgather and reducescatter" in get("pat").applicable(coll)
    coll = make_collective("c", K.ALLGATHER, topo, topo.all_ranks(), size=4 * 16)
    assert "parameter" in get("biring").applicable(coll, chunks=3)
