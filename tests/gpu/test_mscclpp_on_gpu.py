"""cclc's MSCCL++ execution plans run by MSCCL++ itself on a real GPU: N processes share GPU 0,
MSCCL++'s Executor runs the out-of-place and in-place plans (Simple, and LL where the schedule
stays in one server) through ``mscclpp_harness.cu``, and every output buffer must equal
numpy's. In-place plans run on one buffer laid out as NCCL defines an in-place call (allgather:
the input is the rank's slice of the output; reducescatter: the output is the rank's slice of
the input).

Needs an MSCCL++ built at the commit the backend cites, installed under ``$MSCCLPP_HOME``
(``include/mscclpp``, ``lib/libmscclpp.so``); ``tests/gpu/run_on_device.sh`` builds one from
sources carried in ``.whl/``. Skipped, with the reason, without it."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess

import pytest
from backend_helpers import check_outputs, write_exact_inputs
from gpu_helpers import free_port, inplace_offsets, run_ranks
from test_library_on_gpu import SCHEDULES

from backends.mscclpp import iter_plans
from backends.mscclpp.loader import CallSizes
from backends.nccl.build import cuda_home
from cclc.collective import DType

HARNESS = pathlib.Path(__file__).with_name("mscclpp_harness.cu")
HOME = os.environ.get("MSCCLPP_HOME", "")
pytestmark = pytest.mark.skipif(
    not (HOME and (pathlib.Path(HOME) / "lib" / "libmscclpp.so").exists()),
    reason="no MSCCL++ installed under $MSCCLPP_HOME (tests/gpu/run_on_device.sh builds one)")

#: the schedules of the library test whose collective MSCCL++ plans express (sums only)
#: (swap-allreduce writes its input buffer, which a plan may not)
NAMES = ["ring-reducescatter", "pairwise-alltoall", "hgx-direct-allreduce", "hgx-direct-alltoall",
         "pat-allgather", "hierarchical-allreduce"]
DTYPE_CODE = {DType.FP32: 0, DType.FP16: 1, DType.INT32: 2}


@pytest.fixture(scope="module")
def harness(tmp_path_factory) -> pathlib.Path:
    exe = tmp_path_factory.mktemp("mscclpp") / "mscclpp_harness"
    nvcc = shutil.which("nvcc") or str(pathlib.Path(cuda_home()) / "bin" / "nvcc")
    subprocess.run([nvcc, "-O2", "-std=c++20", "-arch=sm_90", str(HARNESS), "-o", str(exe),
                    f"-I{HOME}/include", f"-L{HOME}/lib", "-lmscclpp",
                    f"-Xlinker=-rpath,{HOME}/lib"], check=True, capture_output=True, text=True)
    return exe


def _call_sizes(plan: dict) -> tuple[CallSizes, int]:
    """The loader's sizes of a small call the plan serves, and its message size: 4 units of
    16 B per chunk, or the fewest units at or above the plan's ``min_message_size`` (the
    Simple plans begin above the LL window)."""
    align = plan["buffer_alignment"]

    def message(sizes: CallSizes) -> int:
        return sizes.out_bytes if plan["collective"] == "allgather" else sizes.in_bytes

    unit = message(CallSizes.of(plan, align))
    sizes = CallSizes.of(plan, align * max(4, -(-plan["min_message_size"] // unit)))
    return sizes, message(sizes)


@pytest.mark.parametrize("dtype", [DType.FP32, DType.FP16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("inplace", [False, True], ids=["out", "in"])
@pytest.mark.parametrize("protocol", ["Simple", "LL"])
@pytest.mark.parametrize("name", NAMES)
def test_mscclpp_runs_the_plan(tmp_path, harness, name, protocol, inplace, dtype):
    schedule = SCHEDULES[name]()
    coll = schedule.collective
    plan = next((p for _, p in iter_plans(schedule)
                 if p["protocol"] == protocol and p["inplace"] == inplace), None)
    if plan is None:
        pytest.skip(f"{name} crosses servers: no LL plan")
    path = tmp_path / "plan.mscclpp.json"
    path.write_text(json.dumps(plan))
    sizes, size = _call_sizes(plan)
    assert size <= plan["max_message_size"]
    data = tmp_path / "data"
    inputs = write_exact_inputs(coll, dtype, sizes.in_bytes // dtype.itemsize, 0, data)
    addr = f"lo:127.0.0.1:{free_port()}"   # rank 0 listens there
    argvs = [[str(harness), str(path), str(data), str(r), str(coll.n), addr,
              str(sizes.in_bytes), str(sizes.out_bytes), str(DTYPE_CODE[dtype]),
              *(map(str, inplace_offsets(coll.kind, r, sizes.in_bytes, sizes.out_bytes))
                if inplace else [])]
             for r in range(coll.n)]
    results = run_ranks(argvs, [dict(os.environ) for _ in argvs], timeout=120)
    for r, (status, out, err) in enumerate(results):
        assert status == 0, f"rank {r} exited with {status}:\n{out}\n{err}"
    check_outputs(coll, dtype, inputs, data)
