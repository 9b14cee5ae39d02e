"""The generated schedule code, built against MPI, run for real with mpirun: every output
buffer must equal the numpy reference."""

from __future__ import annotations

import pytest
from backend_helpers import (
    MPIRUN,
    fabric_2x3,
    pick,
    ring_reducescatter,
    run_mpi,
    swap_allreduce,
    swap_alltoall,
    torus333_faulty,
)

from cclc.collective import CollectiveKind, DType, ReduceOp, make_collective
from cclc.topology import NodeType, single_switch, torus

pytestmark = pytest.mark.skipif(MPIRUN is None, reason="mpirun is not installed "
                                "(apt-get install openmpi-bin libopenmpi-dev)")

#: torus alltoall preference: the paper's schedule first, its fault-tolerant forms, then direct
A2A = ["halfring+dimrotation", "foldedring+dimrotation", "line+dimrotation", "matee", "mate",
       "direct"]


def test_alltoall_on_faulty_3x3x3_torus(tmp_path):
    topo = torus333_faulty()
    coll = make_collective("a2a", CollectiveKind.ALLTOALL, topo, tuple(range(27)),
                           27 * 27 * 4 * 2)
    _, s = pick(coll, A2A)
    run_mpi(s, tmp_path)


def test_pat_allgather_on_6_ranks(tmp_path):
    node = NodeType("one", "nvswitch", 1, 450e9, 1e-6, nics=1, nic_bandwidth=50e9)
    topo = single_switch("six", 6, node, 50e9, 2e-6)
    coll = make_collective("ag", CollectiveKind.ALLGATHER, topo, tuple(range(6)), 6 * 8 * 4)
    _, s = pick(coll, ["pat", "ring"])
    run_mpi(s, tmp_path, scale=2)


@pytest.mark.parametrize("kind", [CollectiveKind.REDUCESCATTER, CollectiveKind.ALLREDUCE])
def test_hierarchical_reductions_on_2_nodes_of_3(tmp_path, kind):
    coll = make_collective(kind.value, kind, fabric_2x3(), tuple(range(6)), 6 * 6 * 4)
    _, s = pick(coll, ["hierarchical", "ring"])
    run_mpi(s, tmp_path, inplace=kind is CollectiveKind.ALLREDUCE)


def test_same_step_hazards_in_place_and_int_max(tmp_path):
    # reads of slots the same step rewrites, and an in-place call at 3x the compiled count
    run_mpi(swap_allreduce(), tmp_path / "swap", scale=3, inplace=True)
    run_mpi(swap_alltoall(), tmp_path / "a2a", scale=5000)   # beyond MPI's eager limit
    run_mpi(ring_reducescatter(op=ReduceOp.MAX, dtype=DType.INT32), tmp_path / "max",
            inplace=True)


@pytest.mark.parametrize("kind, algos", [(CollectiveKind.BROADCAST, ["ring", "tree"]),
                                         (CollectiveKind.REDUCE, ["tree", "ring"])])
def test_rooted_collectives(tmp_path, kind, algos):
    coll = make_collective(kind.value, kind, torus("ring5", (5,)), tuple(range(5)), 5 * 8 * 4,
                           root=2)
    _, s = pick(coll, algos)
    run_mpi(s, tmp_path)


@pytest.mark.parametrize("dtype", [DType.FP16, DType.BF16, DType.INT64, DType.UINT8])
def test_other_data_types_at_run_time(tmp_path, dtype):
    # the data type is a run-time argument; the schedule counts elements
    run_mpi(ring_reducescatter(n=4), tmp_path, scale=3, dtype=dtype)
