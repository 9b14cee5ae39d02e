"""cclc's MSCCL++ plans under unchanged PyTorch, through MSCCL++'s NCCL interface: torchrun
starts 8 ranks on GPU 0 with ``libmscclpp_nccl.so`` preloaded (``cclc.torch.mscclpp_environment``),
each registers the plans of one buffer mode (``cclc.torch.register_mscclpp``) and calls
``all_reduce``, ``all_gather_into_tensor`` and ``reduce_scatter_tensor`` inside each plan's
window (``mscclpp_torch_worker.py``). Every output must equal the collective's definition, and
MSCCL++'s log must show its executor running each of those plans (not its own algorithms or
the fallback NCCL), except the in-place reducescatter plans, which MSCCL++ never picks for
NCCL's in-place layout.

Needs an MSCCL++ built at the commit the backend cites with its NCCL interface and Python
package (``$MSCCLPP_HOME/lib/libmscclpp_nccl.so``; ``import mscclpp``), as
``tests/gpu/run_on_device.sh`` builds them. Skipped, with the reason, without them."""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest
from test_library_on_gpu import _hgx

from backends.mscclpp import iter_plans
from backends.nccl.build import nccl_home
from cclc.collective import CollectiveKind
from cclc.torch import mscclpp_environment, mscclpp_plans

ROOT = pathlib.Path(__file__).resolve().parents[2]
WORKER = pathlib.Path(__file__).with_name("mscclpp_torch_worker.py")
LIB = pathlib.Path(os.environ.get("MSCCLPP_HOME", "/nonexistent")) / "lib" / "libmscclpp_nccl.so"


def _why_not() -> str | None:
    if not LIB.exists():
        return "no MSCCL++ NCCL interface at $MSCCLPP_HOME/lib/libmscclpp_nccl.so"
    if importlib.util.find_spec("torch") is None:
        return "no PyTorch"
    # in a process of its own: in this one, tests/backends/mscclpp shadows the name
    probe = subprocess.run([sys.executable, "-c", "import mscclpp.ext"], cwd=ROOT,
                           capture_output=True, text=True, timeout=120, check=False)
    if probe.returncode:
        return f"MSCCL++'s Python package does not import: {probe.stderr.strip()[-300:]}"
    return None


pytestmark = pytest.mark.skipif(_why_not() is not None, reason=str(_why_not()))


@pytest.fixture(scope="module")
def plans(tmp_path_factory) -> pathlib.Path:
    """The plans of an 8-GPU server's allreduce, allgather and reducescatter, in one folder."""
    folder = tmp_path_factory.mktemp("plans")
    for kind in (CollectiveKind.ALLREDUCE, CollectiveKind.ALLGATHER,
                 CollectiveKind.REDUCESCATTER):
        for name, plan in iter_plans(_hgx(kind)):
            (folder / name).write_text(json.dumps(plan))
    return folder


@pytest.mark.parametrize("mode", ["in", "out"])
def test_torch_runs_the_plans_through_the_nccl_interface(plans, mode):
    env = dict(os.environ, **mscclpp_environment(LIB, pathlib.Path(nccl_home()) / "lib"
                                                 / "libnccl.so.2"),
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               MSCCLPP_LOG_LEVEL="INFO", MSCCLPP_LOG_SUBSYS="EXEC",
               NCCL_SOCKET_IFNAME="lo", NCCL_IB_DISABLE="1")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
                           "8", str(WORKER), str(plans), mode],
                          capture_output=True, text=True, timeout=300, env=env, check=False)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-6000:]
    called = [p for p in mscclpp_plans(plans) if p.inplace == (mode == "in")
              and not (p.collective == "allreduce" and not p.inplace)]
    for plan in called:
        checked = re.findall(rf"rank (\d) plan {plan.name}: \d+ bytes, 0 wrong elements", log)
        assert sorted(checked) == [str(r) for r in range(8)], (plan.name, log[-6000:])
        ran = len(re.findall(rf"Starting execution with plan: {plan.name}\b", log))
        if plan.collective == "reducescatter" and plan.inplace:
            # MSCCL++ calls a reducescatter in place only when its buffers are one
            # (CollectiveRequest::bufferMode, src/core/algorithm.cc): NCCL's in-place layout
            # (the output is the rank's slice of the input) goes to the fallback NCCL
            assert ran == 0, (f"{plan.name} ran", log[-6000:])
        else:
            assert ran >= 8, (f"MSCCL++'s executor did not run {plan.name} on every rank",
                              log[-6000:])
