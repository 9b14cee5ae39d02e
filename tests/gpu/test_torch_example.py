"""examples/torch/run_collective.py under torchrun: cclc.torch runs a generated library on
CUDA tensors (8 processes sharing GPU 0) and its output equals the collective's definition."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from backends.common import EmitOptions
from backends.nccl import emit
from dsl import load

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None
                                or shutil.which("torchrun") is None,
                                reason="PyTorch (and torchrun) is not installed")


@pytest.mark.parametrize("extra", [[], ["--inplace", "--dtype", "bfloat16"]],
                         ids=["out-of-place-fp32", "in-place-bf16"])
def test_the_example_runs_and_checks(tmp_path, extra):
    from backend_helpers import pick

    coll = next(c for c in load(ROOT / "examples" / "hgx_node.ccl").collectives
                if c.name == "grads")
    folder = emit(pick(coll, ["direct"])[1], tmp_path, EmitOptions(build=True))[0].parent
    env = dict(os.environ, NCCL_SOCKET_IFNAME="lo", NCCL_IB_DISABLE="1",
               PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
                           "8", str(ROOT / "examples" / "torch" / "run_collective.py"),
                           str(folder), "--count", "65536", *extra],
                          capture_output=True, text=True, timeout=600, env=env, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 wrong elements: ok" in proc.stdout
