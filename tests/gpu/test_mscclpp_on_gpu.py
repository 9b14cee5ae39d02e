"""cclc's MSCCL++ execution plans run by MSCCL++ itself on a real GPU: N processes share GPU 0,
MSCCL++'s Executor runs the out-of-place plan (Simple, and LL where the schedule stays in one
server) through ``mscclpp_harness.cu``, and every output buffer must equal numpy's.

Needs an MSCCL++ built at the commit the backend cites, installed under ``$MSCCLPP_HOME``
(``include/mscclpp``, ``lib/libmscclpp.so``); ``tests/gpu/run_on_device.sh`` builds one from
sources carried in ``.whl/``. Skipped, with the reason, without it."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess

import numpy as np
import pytest
from backend_helpers import NP_TYPES, check_outputs, write_exact_inputs
from gpu_helpers import free_port, run_ranks
from test_library_on_gpu import SCHEDULES

from backends.mscclpp import iter_plans
from backends.nccl.build import cuda_home
from cclc.collective import CollectiveKind, DType

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


def _bytes(kind: CollectiveKind, size: int, n: int) -> tuple[int, int]:
    """(input, output) bytes per rank of a call of ``size`` bytes (the plan's message size:
    the input's, the output's for allgather)."""
    if kind is CollectiveKind.ALLGATHER:
        return size // n, size
    if kind is CollectiveKind.REDUCESCATTER:
        return size, size // n
    return size, size


@pytest.mark.parametrize("dtype", [DType.FP32, DType.FP16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("protocol", ["Simple", "LL"])
@pytest.mark.parametrize("name", NAMES)
def test_mscclpp_runs_the_plan(tmp_path, harness, name, protocol, dtype):
    schedule = SCHEDULES[name]()
    coll = schedule.collective
    plans = dict(iter_plans(schedule))
    base = next(iter(plans)).split(".")[0]
    key = f"{base}.ll.mscclpp.json" if protocol == "LL" else f"{base}.mscclpp.json"
    if key not in plans:
        pytest.skip(f"{name} crosses servers: no LL plan")
    plan = plans[key]
    path = tmp_path / key
    path.write_text(json.dumps(plan))
    chunks = (plan["gpus"][0]["output_chunks"] if coll.kind is CollectiveKind.ALLGATHER
              else plan["gpus"][0]["input_chunks"])
    step = plan["buffer_alignment"] * chunks
    size = max(plan["min_message_size"], 4 * step)
    size = -(-size // step) * step
    assert size <= plan["max_message_size"]
    in_bytes, out_bytes = _bytes(coll.kind, size, coll.n)
    esize = np.dtype(NP_TYPES[dtype][0]).itemsize if dtype is not DType.FP16 else 2
    data = tmp_path / "data"
    inputs = write_exact_inputs(coll, dtype, in_bytes // esize, 0, data)
    addr = f"lo:127.0.0.1:{free_port()}"   # rank 0 listens there
    argvs = [[str(harness), str(path), str(data), str(r), str(coll.n), addr, str(in_bytes),
              str(out_bytes), str(DTYPE_CODE[dtype])] for r in range(coll.n)]
    results = run_ranks(argvs, [dict(os.environ) for _ in argvs], timeout=120)
    for r, (status, out, err) in enumerate(results):
        assert status == 0, f"rank {r} exited with {status}:\n{out}\n{err}"
    check_outputs(coll, dtype, inputs, data)

