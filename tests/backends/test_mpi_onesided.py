"""The one-sided form of the library (``--emit nccl-onesided``): its MPI build (windows, puts,
flushes and counters) run for real with mpirun on every collective kind, every output buffer
compared with numpy; its NCCL source built with nvcc against NCCL's one-sided API; its own
execution model."""

from __future__ import annotations

import re

import pytest
from backend_helpers import (
    MPIRUN,
    NVCC_BUILD_UNAVAILABLE,
    fabric_2x3,
    pairwise_alltoall,
    pick,
    random_allgather,
    random_reducescatter,
    ring_reducescatter,
    run_mpi,
    swap_allreduce,
    uneven_ring_allgather,
)

from backends.common import EmitOptions
from backends.nccl import emit, render_sources
from cclc.collective import CollectiveKind, DType, ReduceOp, make_collective
from cclc.dataflow import dataflow_time, lower_schedule
from cclc.execution import NCCL_ONESIDED_MODEL, predict
from cclc.topology import NodeType, single_switch, torus

needs_mpi = pytest.mark.skipif(MPIRUN is None, reason="mpirun is not installed "
                               "(apt-get install openmpi-bin libopenmpi-dev)")


def _six():
    node = NodeType("one", "nvswitch", 1, 450e9, 1e-6, nics=1, nic_bandwidth=50e9)
    return single_switch("six", 6, node, 50e9, 2e-6)


@pytest.mark.slow
@needs_mpi
def test_alltoall_in_place(tmp_path):
    run_mpi(pairwise_alltoall(n=4), tmp_path, scale=3, inplace=True, api="onesided")


@pytest.mark.slow
@needs_mpi
@pytest.mark.parametrize("kind, algos", [
    (CollectiveKind.ALLREDUCE, ["ring"]),
    (CollectiveKind.ALLGATHER, ["pat", "ring"]),
    (CollectiveKind.REDUCESCATTER, ["ring"]),
    (CollectiveKind.ALLTOALL, ["direct"]),
])
def test_every_unrooted_kind(tmp_path, kind, algos):
    coll = make_collective(kind.value, kind, _six(), tuple(range(6)), 6 * 8 * 4)
    _, s = pick(coll, algos)
    run_mpi(s, tmp_path, scale=2, api="onesided", inplace=kind is CollectiveKind.ALLREDUCE)


@pytest.mark.slow
@needs_mpi
@pytest.mark.parametrize("kind, algos", [(CollectiveKind.BROADCAST, ["ring", "tree"]),
                                         (CollectiveKind.REDUCE, ["tree", "ring"])])
def test_rooted_kinds(tmp_path, kind, algos):
    coll = make_collective(kind.value, kind, torus("ring5", (5,)), tuple(range(5)), 5 * 8 * 4,
                           root=2)
    _, s = pick(coll, algos)
    run_mpi(s, tmp_path, api="onesided")


@pytest.mark.slow
@needs_mpi
def test_hazards_reductions_types_and_uneven_counts(tmp_path):
    # same-step reads of rewritten slots, landing slots of reducing receives, a relayed
    # hierarchical schedule, run-time data types and near-equal chunks at any count
    run_mpi(swap_allreduce(), tmp_path / "swap", scale=3, inplace=True, api="onesided")
    coll = make_collective("rs", CollectiveKind.REDUCESCATTER, fabric_2x3(), tuple(range(6)),
                           6 * 6 * 4)
    _, s = pick(coll, ["hierarchical", "ring"])
    run_mpi(s, tmp_path / "hier", api="onesided")
    run_mpi(ring_reducescatter(n=4, op=ReduceOp.MAX, dtype=DType.INT32), tmp_path / "max",
            inplace=True, api="onesided")
    run_mpi(ring_reducescatter(n=4), tmp_path / "bf16", scale=3, dtype=DType.BF16,
            api="onesided")
    run_mpi(uneven_ring_allgather(n=4, elems=11, pieces=3, floor=True), tmp_path / "uneven",
            count=1000, api="onesided")


@pytest.mark.slow
@needs_mpi
@pytest.mark.parametrize("seed", [3, 17])
def test_random_schedules(tmp_path, seed):
    run_mpi(random_allgather(5, seed), tmp_path / "ag", scale=2, api="onesided")
    run_mpi(random_reducescatter(5, seed, op=ReduceOp.MIN), tmp_path / "rs", api="onesided")


def test_sources_use_the_one_sided_api_on_one_communicator():
    src = render_sources(ring_reducescatter(), api="onesided")
    cu, mpi = src["cclc_rs_ring.cu"], src["cclc_rs_ring_mpi.cc"]
    for call in ("ncclCommWindowRegister(", "ncclPutSignal(", "ncclSignal(", "ncclWaitSignal("):
        assert call in cu
    assert "ncclCommSplit" not in cu and "cudaEventCreate" not in cu
    for call in ("MPI_Win_allocate(", "MPI_Put(", "MPI_Win_flush(", "MPI_Accumulate(",
                 "MPI_Fetch_and_op(", "MPI_Win_lock_all("):
        assert call in mpi
    assert "MPI_Isend" not in mpi
    assert "One-sided form" in src["cclc_rs_ring_schedule.h"]
    assert re.search(r"HEADERS = .*cclc_onesided\.h", src["Makefile"])


def test_the_one_sided_model_is_its_own():
    s = swap_allreduce()
    model = NCCL_ONESIDED_MODEL
    assert (model.max_lanes, model.groups) == (1, False)
    # one lane, a group per message: dataflow_time of that plan, at 2.345 us per message
    plan = lower_schedule(s, op_overhead=model.op_overhead, max_lanes=1, grouping=False)
    assert plan.n_lanes == 1
    assert predict(s, model).time == pytest.approx(dataflow_time(s, model.op_overhead, plan))
    assert model.op_overhead == pytest.approx(2.345e-6)
    assert predict(s, model).model.name == "nccl-onesided"


@pytest.mark.slow
@pytest.mark.skipif(NVCC_BUILD_UNAVAILABLE is not None, reason=str(NVCC_BUILD_UNAVAILABLE))
def test_nvcc_builds_the_one_sided_library(tmp_path):
    # nvcc -Werror against the NCCL of the nvidia-nccl-cu13 wheel (2.29 or later)
    import subprocess

    lib = emit(ring_reducescatter(), tmp_path, EmitOptions(build=True), api="onesided")[-1]
    assert lib.parent.name == "nccl-onesided-rs_ring"
    symbols = subprocess.run(["nm", "-D", str(lib)], capture_output=True, text=True,
                             check=True).stdout
    for name in ("cclc_rs_ring", "cclc_rs_ring_release"):
        assert re.search(rf" T {name}$", symbols, re.MULTILINE)
    for name in ("ncclPutSignal", "ncclWaitSignal", "ncclSignal", "ncclCommWindowRegister"):
        assert re.search(rf" U {name}$", symbols, re.MULTILINE)
