"""``make mpiperf``: the nccl-tests-style driver of the MPI build, run for real under mpirun.

Every row must show no wrong element for cclc (out of place and in place) nor for MPI's own
collective on the same buffers (which checks the driver's expected values against an
independent implementation); the bandwidth columns must follow nccl-tests' definitions; and a
library that computes a wrong result must be caught (#wrong > 0, exit status 1).
"""

from __future__ import annotations

import pathlib
import re
import shutil
import subprocess

import pytest
from backend_helpers import (
    MPIRUN,
    NVCC_BUILD_UNAVAILABLE,
    fabric_2x3,
    pairwise_alltoall,
    pick,
    ring_reducescatter,
    torus333_faulty,
)

from backends.nccl import emit
from backends.nccl.build import build
from cclc.collective import CollectiveKind, DType, ReduceOp, make_collective
from cclc.topology import NodeType, single_switch, torus
from dsl import load

pytestmark = pytest.mark.skipif(MPIRUN is None, reason="mpirun is not installed "
                                "(apt-get install openmpi-bin libopenmpi-dev)")

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"
ESIZE = {"int8": 1, "uint8": 1, "int32": 4, "uint32": 4, "int64": 8, "uint64": 8, "half": 2,
         "float": 4, "double": 8, "bfloat16": 2}


def _bus_factor(kind: CollectiveKind, n: int) -> float:
    """nccl-tests' busbw / algbw (doc/PERFORMANCE.md)."""
    if kind is CollectiveKind.ALLREDUCE:
        return 2 * (n - 1) / n
    if kind in (CollectiveKind.BROADCAST, CollectiveKind.REDUCE):
        return 1.0
    return (n - 1) / n


def _perf(schedule, tmp_path, *args: str, expect_status: int = 0, tamper=None):
    folder = emit(schedule, tmp_path)[0].parent
    if tamper is not None:
        tamper(folder)
    exe = build(folder, ["mpiperf"])[0]
    n = schedule.collective.n
    proc = subprocess.run([MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", str(n),
                           str(exe), *args], capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == expect_status, f"{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def _rows(out: str) -> list[list[str]]:
    return [line.split() for line in out.splitlines() if line.strip() and line[0] != "#"]


def _check(out: str, coll, dtype: str, reference: bool = True):
    """Every row: nothing wrong, nccl-tests' columns and definitions."""
    assert "# Out of bounds values : 0 OK" in out
    header = next(line for line in out.splitlines() if "#wrong" in line).split()
    assert header[1:10] == ["size", "count", "type", "redop", "root", "time", "algbw", "busbw",
                            "#wrong"]
    rows = _rows(out)
    assert rows
    sizes = [int(r[0]) for r in rows]
    assert sizes == sorted(set(sizes))
    factor = _bus_factor(coll.kind, coll.n)
    for r in rows:
        size, count = int(r[0]), int(r[1])
        assert size == count * ESIZE[dtype] and r[2] == dtype
        assert r[3] == (coll.op.value if coll.kind in (CollectiveKind.ALLREDUCE,
                                                       CollectiveKind.REDUCESCATTER,
                                                       CollectiveKind.REDUCE) else "none")
        assert int(r[4]) == (coll.root if coll.kind in (CollectiveKind.BROADCAST,
                                                        CollectiveKind.REDUCE) else -1)
        for at in (5, 9):   # out of place, in place
            time_us, algbw, busbw = float(r[at]), float(r[at + 1]), float(r[at + 2])
            wrong = r[at + 3]
            assert wrong == "0"
            assert algbw == pytest.approx(size / (time_us * 1e3), abs=0.006)
            assert busbw == pytest.approx(size / (time_us * 1e3) * factor, abs=0.006)
        if reference:
            ref_time, ref_wrong, ratio, word = float(r[13]), r[15], r[16], r[17]
            assert ref_wrong == "0"
            cclc_time = float(r[5])
            assert word == ("faster" if ref_time >= cclc_time else "slower")
            assert float(ratio.rstrip("x")) == pytest.approx(
                max(ref_time, cclc_time) / min(ref_time, cclc_time), rel=0.02, abs=0.006)
        else:
            assert r[13:16] == ["-", "-", "-"] and "has no such collective" in " ".join(r)
    return rows


@pytest.mark.slow
def test_allreduce_of_the_hgx_example_in_several_types(tmp_path):
    program = load(EXAMPLES / "hgx_node.ccl")
    coll = next(c for c in program.collectives if c.name == "grads")
    coll = make_collective("grads", coll.kind, coll.topology, coll.group, size=8 * 64 * 2,
                           dtype=DType.BF16)
    _, s = pick(coll, ["direct"])
    for dtype in ["float", "int8", "double"]:
        out = _perf(s, tmp_path / dtype, "-b", "64", "-e", "64K", "-f", "8", "-n", "2", "-w",
                    "1", "-d", dtype)
        rows = _check(out, coll, dtype)
        assert [int(r[0]) for r in rows] == [64, 512, 4096, 32768]
    # bf16 (the .ccl's dtype, the default): MPI cannot reduce it, so no reference
    out = _perf(s, tmp_path / "bf16", "-b", "1K", "-e", "4K", "-n", "2", "-w", "0")
    _check(out, coll, "bfloat16", reference=False)


@pytest.mark.slow
def test_alltoall_on_a_faulty_torus_and_a_pairwise_ring(tmp_path):
    coll = make_collective("a2a", CollectiveKind.ALLTOALL, torus333_faulty(), tuple(range(27)),
                           27 * 27 * 4)
    _, s = pick(coll, ["foldedring+dimrotation", "line+dimrotation", "direct"])
    _check(_perf(s, tmp_path / "t", "-b", "8K", "-e", "32K", "-f", "4", "-n", "1", "-w", "0"),
           coll, "float")
    s = pairwise_alltoall(3, 2)
    _check(_perf(s, tmp_path / "p", "-b", "1", "-e", "1M", "-f", "16", "-n", "2", "-d",
                 "uint8"), s.collective, "uint8")


def test_nonuniform_alltoall_is_measured_against_alltoallv(tmp_path):
    coll = next(c for c in load(EXAMPLES / "alltoall_nonuniform.ccl").collectives)
    _, s = pick(coll, ["direct"])
    _check(_perf(s, tmp_path, "-b", "1K", "-e", "64K", "-f", "8", "-n", "2", "-d", "int32"),
           coll, "int32")


@pytest.mark.slow
@pytest.mark.parametrize("kind, op, root", [
    (CollectiveKind.BROADCAST, ReduceOp.SUM, 2),
    (CollectiveKind.REDUCE, ReduceOp.MAX, 3),
    (CollectiveKind.REDUCESCATTER, ReduceOp.PROD, None),
    (CollectiveKind.ALLGATHER, ReduceOp.SUM, None),
])
def test_rooted_and_scattering_collectives_on_6_ranks(tmp_path, kind, op, root):
    coll = make_collective(kind.value, kind, fabric_2x3(), tuple(range(6)), 6 * 6 * 4, op=op,
                           root=root)
    _, s = pick(coll, ["tree", "hierarchical", "ring"])
    _check(_perf(s, tmp_path, "-b", "96", "-e", "24K", "-f", "16", "-n", "2", "-d", "int32"),
           coll, "int32")


@pytest.mark.slow
def test_uneven_ring_allreduce_runs_at_any_count(tmp_path):
    # 43 fp32 elements cut into near-equal chunks: the sweep's counts are not multiples of 6
    node = NodeType("one", "nvswitch", 1, 450e9, 1e-6, nics=1, nic_bandwidth=50e9)
    coll = make_collective("ar", CollectiveKind.ALLREDUCE, single_switch("six", 6, node, 50e9,
                                                                        2e-6),
                           tuple(range(6)), 43 * 4)
    _, s = pick(coll, ["ring"])
    rows = _check(_perf(s, tmp_path, "-b", "172", "-e", "21500", "-f", "5", "-n", "2"), coll,
                  "float")
    assert [int(r[1]) for r in rows] == [43, 215, 1075, 5375]


def test_a_wrong_result_is_counted_and_fails(tmp_path):
    coll = make_collective("ar", CollectiveKind.ALLREDUCE, torus("ring", (4,), None, [50e9],
                                                                [1e-6]),
                           tuple(range(4)), 4 * 16 * 4)
    _, s = pick(coll, ["ring"])

    def drop_the_addition(folder):
        # the MPI build's reduction keeps its left operand: sums come out wrong
        cc = folder / "cclc_ar_mpi.cc"
        text = cc.read_text()
        assert "return (T)(a + b);" in text
        cc.write_text(text.replace("return (T)(a + b);", "return (T)(a + 0 * b);"))

    out = _perf(s, tmp_path, "-b", "256", "-e", "1K", "-n", "1", expect_status=1,
                tamper=drop_the_addition)
    assert re.search(r"# Out of bounds values : [1-9]\d* FAILED", out)
    for r in _rows(out):
        assert int(r[8]) > 0 and int(r[12]) > 0 and r[15] == "0"   # MPI's own stays right


@pytest.mark.slow
def test_usage_errors(tmp_path):
    s = pairwise_alltoall(3, 2)
    folder = emit(s, tmp_path)[0].parent
    exe = build(folder, ["mpiperf"])[0]
    for argv, words in [(["-np", "2", str(exe)], "runs on 3 ranks; start it with mpirun -np 3"),
                        (["-np", "3", str(exe), "-d", "float7"], "bad argument: -d float7"),
                        (["-np", "3", str(exe), "-f", "1"], "bad argument: -f 1")]:
        proc = subprocess.run([MPIRUN, "--allow-run-as-root", "--oversubscribe", *argv],
                              capture_output=True, text=True, timeout=120, check=False)
        assert proc.returncode == 2 and words in proc.stderr


@pytest.mark.slow
@pytest.mark.skipif(NVCC_BUILD_UNAVAILABLE is not None or shutil.which("mpicxx") is None,
                    reason=f"make perf needs nvcc with NCCL's headers and mpicxx: "
                           f"{NVCC_BUILD_UNAVAILABLE or 'mpicxx is not installed'}")
def test_make_perf_builds_the_nccl_driver_with_warnings_as_errors(tmp_path):
    # no GPU needed to build; running it is the GPU tier's job (tests/gpu)
    s = ring_reducescatter(name="rs-perf")
    folder = emit(s, tmp_path)[0].parent
    exe = build(folder, ["perf"])[0]
    assert exe.name == "cclc_rs_perf_perf" and exe.exists()
    needed = subprocess.run(["readelf", "-d", str(exe)], capture_output=True, text=True,
                            check=True).stdout
    assert "libcclc_rs_perf.so" in needed and "libnccl.so.2" in needed
    assert "libmpi" in needed
