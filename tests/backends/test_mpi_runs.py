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
    uneven_ring_allgather,
)

from cclc.collective import CollectiveKind, DType, ReduceOp, make_collective
from cclc.topology import NodeType, single_switch, torus

pytestmark = pytest.mark.skipif(MPIRUN is None, reason="mpirun is not installed "
                                "(apt-get install openmpi-bin libopenmpi-dev)")

#: torus alltoall preference: the paper's schedule first, its fault-tolerant forms, then direct
A2A = ["halfring+dimrotation", "foldedring+dimrotation", "line+dimrotation", "matee", "mate",
       "direct"]


@pytest.mark.slow
def test_alltoall_on_faulty_3x3x3_torus(tmp_path):
    topo = torus333_faulty()
    coll = make_collective("a2a", CollectiveKind.ALLTOALL, topo, tuple(range(27)),
                           27 * 27 * 4 * 2)
    _, s = pick(coll, A2A)
    run_mpi(s, tmp_path)


@pytest.mark.parametrize("api", ["lanes", "onesided"])
@pytest.mark.parametrize("kind", [CollectiveKind.ALLGATHER, CollectiveKind.REDUCESCATTER,
                                  CollectiveKind.ALLREDUCE])
def test_dimrotation_with_a_cut_ring_on_a_faulty_3x3x3_torus(tmp_path, kind, api):
    # the ring through the failed cable runs as a line: the downward chains of its
    # reductions land in a second accumulator and a local step adds them (ten pieces)
    size = 4 * 27 * 10 * (2 if kind is CollectiveKind.ALLREDUCE else 1)
    coll = make_collective(kind.value, kind, torus333_faulty(), tuple(range(27)), size)
    _, s = pick(coll, ["ring+dimrotation"])
    assert len({int(k) for k in s.ops.kind}) == (1 if kind is CollectiveKind.ALLGATHER else 2)
    run_mpi(s, tmp_path, inplace=kind is CollectiveKind.ALLREDUCE, api=api)


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


@pytest.mark.slow
def test_same_step_hazards_in_place_and_int_max(tmp_path):
    # reads of slots the same step rewrites, and an in-place call at 3x the compiled count
    run_mpi(swap_allreduce(), tmp_path / "swap", scale=3, inplace=True)
    run_mpi(swap_alltoall(), tmp_path / "a2a", scale=5000)   # beyond MPI's eager limit
    run_mpi(ring_reducescatter(op=ReduceOp.MAX, dtype=DType.INT32), tmp_path / "max",
            inplace=True)


@pytest.mark.slow
@pytest.mark.parametrize("kind, algos", [(CollectiveKind.BROADCAST, ["ring", "tree"]),
                                         (CollectiveKind.REDUCE, ["tree", "ring"])])
def test_rooted_collectives(tmp_path, kind, algos):
    coll = make_collective(kind.value, kind, torus("ring5", (5,)), tuple(range(5)), 5 * 8 * 4,
                           root=2)
    _, s = pick(coll, algos)
    run_mpi(s, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [DType.FP16, DType.BF16, DType.INT64, DType.UINT8])
def test_other_data_types_at_run_time(tmp_path, dtype):
    # the data type is a run-time argument; the schedule counts elements
    run_mpi(ring_reducescatter(n=4), tmp_path, scale=3, dtype=dtype)


@pytest.mark.slow
def test_uneven_chunks_run_at_any_count(tmp_path):
    # a ring allreduce of 43 elements on 6 ranks cuts its buffer into chunks of 7 and 8: the
    # library computes each chunk's offset from the call's count, so counts that 6 does not
    # divide run too, not only multiples of the compiled 43
    from backends.units import to_units

    node = NodeType("one", "nvswitch", 1, 450e9, 1e-6, nics=1, nic_bandwidth=50e9)
    topo = single_switch("six", 6, node, 50e9, 2e-6)
    coll = make_collective("ar", CollectiveKind.ALLREDUCE, topo, tuple(range(6)), 43 * 4)
    _, s = pick(coll, ["ring"])
    _, us = to_units(s, split=True)
    assert not us.exact and us.split and us.count_units % 6 == 0
    for count in (43, 6 * 1000 + 5, 4):
        run_mpi(s, tmp_path / f"c{count}", count=count, inplace=count == 43)


@pytest.mark.slow
def test_floor_cut_chunks_run_at_any_count(tmp_path):
    from backends.units import to_units

    s = uneven_ring_allgather(n=4, elems=11, pieces=3, floor=True)     # chunks 3, 4, 4
    _, us = to_units(s, split=True)
    assert us.split == 1 and us.count_units == 3
    for count in (11, 1000, 7):
        run_mpi(s, tmp_path / f"c{count}", count=count)


@pytest.mark.parametrize("scale", [1, 3])
def test_nonuniform_alltoall_padded_to_the_largest_buffer(tmp_path, scale):
    import subprocess

    import numpy as np

    from backends.common import EmitOptions, padded_count
    from backends.nccl import emit
    from backends.units import buffer_units, to_units

    sizes = np.array([[2, 6, 4, 2], [8, 2, 2, 2], [4, 4, 0, 6], [2, 2, 10, 4]]) * 4   # bytes
    coll = make_collective("v", CollectiveKind.ALLTOALL, torus("r4", (4,)), tuple(range(4)),
                           pair_sizes=sizes)
    _, s = pick(coll, ["direct"])
    elems = sizes // 4
    count = padded_count(s) * scale
    assert count == int(max(elems.sum(axis=0).max(), elems.sum(axis=1).max())) * scale
    exe = emit(s, tmp_path, EmitOptions(mpi=True))[-1]
    units, us = to_units(s, pad=True)
    widths = buffer_units(units)
    ue = count // us.count_units
    rng = np.random.default_rng(1)
    data = tmp_path / "data"
    data.mkdir()
    m = elems * scale
    inputs = []
    for r in range(4):
        x = rng.integers(-50, 50, size=widths[0] * ue).astype(np.float32)
        x[m[r].sum():] = np.nan        # padding: must never be read
        x.tofile(data / f"in.{r}.bin")
        inputs.append(x)
    proc = subprocess.run([MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", "4",
                           str(exe), str(data), str(count), "7"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for r in range(4):
        want = np.concatenate([inputs[j][m[j, :r].sum():m[j, :r + 1].sum()] for j in range(4)])
        got = np.fromfile(data / f"out.{r}.bin", dtype=np.float32)
        assert len(got) == widths[1] * ue
        assert np.array_equal(got[:len(want)], want), f"rank {r}"
