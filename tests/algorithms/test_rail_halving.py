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
    rounds = log_nodes
    # the local copies and hand-offs, the intra-node steps, the rail rounds
    per_rank = {K.ALLREDUCE: 2 + 2 * (gpus - 1) + 2 * rounds,
                K.REDUCESCATTER: 2 + (gpus - 1) + rounds,
                K.ALLGATHER: 1 + (gpus - 1) + rounds}[kind]
    assert len(s.ops) == n * per_rank


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.value)
def test_three_tier_fabric(kind):
    topo = fat_tree("c", 8, _hgx(4), pods=2, rails=4, leaves=None, spines=2, cores=4,
                    oversubscription=(1, 2), bandwidth=50e9, latency=2e-6)
    coll = make_collective("c", kind, topo, topo.all_ranks(), size=_size(kind, 32, 2))
    s = _check(coll)
    # the first halving round (half the share) pairs nodes 2k and 2k+1
    node = topo.node_of_rank[np.asarray(coll.group)]
    first = s.ops.step == 1 + 3 if kind is not K.ALLGATHER else s.ops.step == 1
    if kind is not K.ALLGATHER:
        remote = first & (s.ops.src != s.ops.dst)
        assert (node[s.ops.src[remote]] // 2 == node[s.ops.dst[remote]] // 2).all()


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
