"""``make perf`` on a real GPU under mpirun: nccl-tests' columns, no wrong element for cclc or
for NCCL's own collective, and the NCCL version and GPU the run used (to record in the docs)."""

from __future__ import annotations

import subprocess

import pytest
from backend_helpers import pick
from gpu_helpers import one_gpu_mpirun

from backends.common import EmitOptions
from backends.nccl import emit
from backends.nccl.build import build
from cclc.collective import CollectiveKind, make_collective
from cclc.topology import NodeType, single_node
from dsl import load

EXAMPLES = __import__("pathlib").Path(__file__).resolve().parents[2] / "examples"


def _hgx(kind: CollectiveKind):
    node = NodeType("hgx", "nvswitch", 8, 450e9, 1e-6)
    coll = make_collective(kind.value, kind, single_node("box", node), tuple(range(8)),
                           8 * 8 * 4 * 64)
    return pick(coll, ["direct"])[1]


def run_perf(schedule, tmp_path, *args: str, env: dict[str, str] | None = None):
    folder = emit(schedule, tmp_path, EmitOptions(build=True))[0].parent
    exe = build(folder, ["perf"])[0]
    cmd = one_gpu_mpirun(schedule.collective.n, [str(exe), *args], **(env or {}))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


@pytest.mark.parametrize("kind", [CollectiveKind.ALLREDUCE, CollectiveKind.ALLTOALL,
                                  CollectiveKind.ALLGATHER, CollectiveKind.REDUCESCATTER])
def test_perf_rows_are_right_for_cclc_and_nccl(tmp_path, kind):
    out = run_perf(_hgx(kind), tmp_path, "-b", "4K", "-e", "16M", "-f", "4", "-n", "5", "-w",
                   "2", "-d", "float")
    print(out)   # the NCCL version and GPU line, for the record
    assert out.startswith("# NCCL ")
    assert "# Out of bounds values : 0 OK" in out
    rows = [line.split() for line in out.splitlines() if line.strip() and line[0] != "#"]
    assert len(rows) == 7
    for r in rows:
        assert r[8] == "0" and r[12] == "0" and r[15] == "0"
        assert r[17] in ("faster", "slower")


def test_nonuniform_alltoall_against_grouped_send_recv(tmp_path):
    coll = next(iter(load(EXAMPLES / "alltoall_nonuniform.ccl").collectives))
    out = run_perf(pick(coll, ["direct"])[1], tmp_path, "-b", "64K", "-e", "4M", "-f", "8",
                   "-n", "3", "-d", "bfloat16")
    assert "# Out of bounds values : 0 OK" in out
