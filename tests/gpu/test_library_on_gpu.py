"""Generated NCCL libraries on a real GPU: N processes share GPU 0, and every output buffer
must equal numpy's, for several dtypes, in place and out of place, in the lanes form and (where
NCCL is 2.29 or later) the one-sided form."""

from __future__ import annotations

import pytest
from backend_helpers import (
    fabric_2x3,
    pairwise_alltoall,
    pick,
    ring_reducescatter,
    swap_allreduce,
    uneven_ring_allgather,
)
from gpu_helpers import nccl_version, run_gpu

from cclc.collective import CollectiveKind, DType, ReduceOp, make_collective
from cclc.topology import NodeType, single_node, single_switch


def _hgx(kind: CollectiveKind):
    node = NodeType("hgx", "nvswitch", 8, 450e9, 1e-6)
    coll = make_collective(kind.value, kind, single_node("box", node), tuple(range(8)),
                           8 * 8 * 4 * 3)
    return pick(coll, ["direct"])[1]


def _six(kind: CollectiveKind, names: list[str], **kw):
    coll = make_collective(kind.value, kind, fabric_2x3(), tuple(range(6)), 6 * 6 * 4, **kw)
    return pick(coll, names)[1]


def _pat():
    node = NodeType("one", "nvswitch", 1, 450e9, 1e-6, nics=1, nic_bandwidth=50e9)
    coll = make_collective("ag", CollectiveKind.ALLGATHER, single_switch("six", 6, node, 50e9,
                                                                         2e-6),
                           tuple(range(6)), 6 * 8 * 4)
    return pick(coll, ["pat", "ring"])[1]


SCHEDULES = {
    "ring-reducescatter": lambda: ring_reducescatter(),
    "pairwise-alltoall": lambda: pairwise_alltoall(4, 3),
    "swap-allreduce": lambda: swap_allreduce(),
    "uneven-allgather": lambda: uneven_ring_allgather(n=4, elems=11, pieces=3, floor=True),
    "hgx-direct-allreduce": lambda: _hgx(CollectiveKind.ALLREDUCE),
    "hgx-direct-alltoall": lambda: _hgx(CollectiveKind.ALLTOALL),
    "pat-allgather": _pat,
    "hierarchical-allreduce": lambda: _six(CollectiveKind.ALLREDUCE, ["hierarchical", "ring"]),
    "tree-broadcast": lambda: _six(CollectiveKind.BROADCAST, ["tree"], root=2),
    "tree-reduce-max": lambda: _six(CollectiveKind.REDUCE, ["tree"], root=1, op=ReduceOp.MAX),
}

#: (dtype, in place, scale): every schedule runs each
CASES = [(DType.FP32, False, 1), (DType.FP32, True, 3), (DType.BF16, False, 1),
         (DType.FP16, True, 1), (DType.INT32, False, 2), (DType.FP64, True, 1)]


@pytest.mark.parametrize("dtype, inplace, scale", CASES,
                         ids=[f"{d.value}-{'in' if i else 'out'}-x{s}" for d, i, s in CASES])
@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_every_output_equals_numpy(tmp_path, name, dtype, inplace, scale):
    run_gpu(SCHEDULES[name](), tmp_path, dtype=dtype, inplace=inplace, scale=scale)


@pytest.mark.parametrize("inplace", [False, True], ids=["out", "in"])
@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_the_onesided_form_equals_numpy(tmp_path, name, inplace):
    if nccl_version() < (2, 29, 0):
        pytest.skip(f"NCCL {'.'.join(map(str, nccl_version()))} has no one-sided API (2.29+)")
    run_gpu(SCHEDULES[name](), tmp_path, dtype=DType.FP32, inplace=inplace, api="onesided")
