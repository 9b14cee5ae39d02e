"""rail_halving: verifies and computes the right numbers (numpy reference of the numeric
interpreter) on leaf/spine and three-tier fabrics, has the op count its module states, keeps
its large rounds inside a leaf, and refuses what it cannot serve."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cclc.algorithms import get
from cclc.algorithms.rail_halving import rail_positions
from cclc.collective import CollectiveKind as K
from cclc.collective import DType, make_collective
from cclc.numeric import check_numeric
from cclc.topology import NodeType, fat_tree, leaf_spine
from cclc.verify import verify

KINDS = (K.ALLGATHER, K.REDUCESCATTER, K.ALLREDUCE)


def _hgx(gpus: int) -> NodeType:
    return NodeType("hgx", "nvswitch", gpus, 450e9, 1e-6, nics=gpus, nic_bandwidth=50e9)


def _leaf_spine(nodes: int, gpus: int):
    return leaf_spine("f", nodes, _hgx(gpus), rails=gpus, leaves=None, spines=2,
                      oversubscription=1.0, bandwidth=50e9, latency=2e-6)


def _size(kind: K, n: int, blocks: int) -> int:
    # allreduce: not a multiple of n, so the even split is uneven
    return 4 * (n * blocks + (1 if kind is K.ALLREDUCE else 0))


def _check(coll):
    algo = get("rail_halving")
    assert algo.applicable(coll) is None
    s = algo.build(coll)
    verify(s)
    check_numeric(s, dtypes=[DType.FP64, DType.INT32])
    return s


def test_rail_positions_are_bit_reversal():
    assert rail_positions(1).tolist() == [0]
    assert rail_positions(2).tolist() == [0, 1]
    p = rail_positions(16)
    assert sorted(p.tolist()) == list(range(16))
    for v in range(16):
        assert p[v] == int(f"{v:04b}"[::-1], 2)


@settings(max_examples=12, deadline=None)
@given(log_nodes=st.integers(1, 4), gpus=st.integers(2, 5), blocks=st.integers(1, 3),
       kind=st.sampled_from(KINDS))
def test_verifies_and_computes_on_leaf_spine(log_nodes, gpus, blocks, kind):
    topo = _leaf_spine(1 << log_nodes, gpus)
    n = topo.n_ranks
    coll = make_collective("c", kind, topo, topo.all_ranks(), size=_size(kind, n, blocks))
    s = _check(coll)
    nodes = 1 << log_nodes
    # doubling: rounds of 2^r chunks cut into pieces of max(1, nodes / 16), a step each, and a
    # forward to every peer of each piece (and of the rank's first chunk)
    piece = max(1, nodes // 16)
    doubling = sum(-(-(1 << r) // piece) for r in range(log_nodes))
    gather = doubling + (gpus - 1) * (doubling + 1)
    # the local copies and hand-offs, the intra-node steps, the rail rounds and pieces
    # (the halving mirrors it: its pieces, and each piece and the kept chunk reduced from every
    # peer)
    per_rank = {K.ALLREDUCE: 2 + 2 * gather, K.REDUCESCATTER: 2 + gather,
                K.ALLGATHER: 1 + gather}[kind]
    assert len(s.ops) == n * per_rank
    assert len(s.ops) == get("rail_halving").ops(coll)


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.value)
def test_three_tier_fabric(kind):
    topo = fat_tree("c", 8, _hgx(4), pods=2, rails=4, leaves=None, spines=2, cores=4,
                    oversubscription=(1, 2), bandwidth=50e9, latency=2e-6)
    coll = make_collective("c", kind, topo, topo.all_ranks(), size=_size(kind, 32, 2))
    s = _check(coll)
    # the first halving round (half the share) pairs nodes 2k and 2k+1; its first piece
    # crosses the rail after the log2(4) = 2 stages of the intra-node halving
    node = topo.node_of_rank[np.asarray(coll.group)]
    first = s.ops.step == 1 + 2 if kind is not K.ALLGATHER else s.ops.step == 1
    if kind is not K.ALLGATHER:
        remote = first & (s.ops.src != s.ops.dst)
        assert (node[s.ops.src[remote]] // 2 == node[s.ops.dst[remote]] // 2).all()


@pytest.mark.parametrize("gpus", [8, 6])
def test_intra_node_reduction_fills_in_log_steps(gpus):
    """The first piece crosses the rail after log2(G) steps of intra-node halving where G is
    a power of two (a GPU sends half its shares' piece, then a quarter, ...), after G - 1
    steps of the diagonal otherwise; either way every GPU sends G - 1 pieces per item."""
    topo = _leaf_spine(4, gpus)
    coll = make_collective("c", K.REDUCESCATTER, topo, topo.all_ranks(), size=_size(
        K.REDUCESCATTER, topo.n_ranks, 1))
    s = _check(coll)
    node = topo.node_of_rank[np.asarray(coll.group)]
    remote = node[s.ops.src] != node[s.ops.dst]
    fill = 3 if gpus == 8 else gpus - 1
    assert int(s.ops.step[remote].min()) == 1 + fill
    intra = (~remote) & (s.ops.src != s.ops.dst) & (s.ops.step < int(s.ops.step.max()))
    sent = np.bincount(s.ops.src[intra], minlength=topo.n_ranks)
    assert (sent == sent[0]).all()


def test_refusals():
    algo = get("rail_halving")
    topo = _leaf_spine(3, 2)
    coll = make_collective("c", K.ALLREDUCE, topo, topo.all_ranks(), size=4 * 60)
    assert "power-of-two number of nodes" in algo.applicable(coll)
    topo = _leaf_spine(2, 2)
    coll = make_collective("c", K.ALLTOALL, topo, topo.all_ranks(), size=4 * 16)
    assert "does not serve alltoall" in algo.applicable(coll)
    coll = make_collective("c", K.ALLREDUCE, topo, topo.all_ranks(), size=4 * 2)
    assert "at least one element per rank" in algo.applicable(coll)
    coll = make_collective("c", K.ALLREDUCE, topo, topo.all_ranks(), size=4 * 8)
    assert "takes no parameters" in algo.applicable(coll, chunks=2)
