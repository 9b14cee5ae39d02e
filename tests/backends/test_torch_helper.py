"""``cclc.torch``: loads a generated library without importing torch, and reads the buffer
layout the library expects (checked against the schedule's own buffers). Running it on CUDA
tensors is the GPU tier's job (tests/gpu/test_torch_example.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from backend_helpers import NVCC_BUILD_UNAVAILABLE, pairwise_alltoall, ring_reducescatter

from backends.common import EmitOptions
from backends.nccl import emit
from cclc.ir import Buf
from cclc.torch import load, nccl_type


def test_importing_the_helper_does_not_import_torch():
    code = "import sys, cclc.torch; assert 'torch' not in sys.modules, 'torch was imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_nccl_type_names_ncclDataType_t():
    assert [nccl_type(f"torch.{t}") for t in ("int8", "float16", "float32", "bfloat16")] == \
        [0, 6, 7, 9]
    with pytest.raises(TypeError, match="complex64"):
        nccl_type("torch.complex64")


@pytest.mark.slow
@pytest.mark.skipif(NVCC_BUILD_UNAVAILABLE is not None,
                    reason=f"building the library: {NVCC_BUILD_UNAVAILABLE}")
@pytest.mark.parametrize("schedule", [ring_reducescatter(), pairwise_alltoall(4, 3)],
                         ids=["reducescatter", "alltoall"])
def test_load_reads_the_collective_and_its_buffers(tmp_path, schedule):
    coll = schedule.collective
    folder = emit(schedule, tmp_path, EmitOptions(build=True))[0].parent
    lib = load(folder)
    assert (lib.kind, lib.n_ranks, lib.root) == (coll.kind.value, coll.n, None)
    assert lib.op == ("sum" if coll.kind.value == "reducescatter" else None)
    assert load(lib.library).name == lib.name
    # the schedule's buffers (elements per rank) at its compiled count, and at 3x that count
    in_elems = int(schedule.chunk_starts(Buf.INPUT)[:, -1].max())
    out_elems = int(schedule.chunk_starts(Buf.OUTPUT)[:, -1].max())
    count = lib.count_of(in_elems)
    assert count == coll.count // coll.n
    assert lib.elements(count) == (in_elems, out_elems)
    assert lib.elements(3 * count) == (3 * in_elems, 3 * out_elems)


def test_load_says_what_is_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match="no single libcclc_<name>.so"):
        load(tmp_path)


def _one_server_allreduce():
    from cclc.algorithms import algorithms_for
    from cclc.collective import CollectiveKind, make_collective
    from cclc.topology import NodeType, single_node

    topo = single_node("box", NodeType("box4", "nvswitch", 4, 450e9, 1e-6))
    coll = make_collective("grads", CollectiveKind.ALLREDUCE, topo, (0, 1, 2, 3), 4 * 4 * 16)
    return next(a.build(coll) for a in algorithms_for(coll) if a.applicable(coll) is None)


def _write_plans(folder, schedule):
    import json

    from backends.mscclpp import render_plans

    for name, doc in render_plans(schedule).items():
        (folder / name).write_text(json.dumps(doc))


def test_mscclpp_plans_say_which_calls_they_serve(tmp_path):
    from cclc.torch import mscclpp_plans

    _write_plans(tmp_path, _one_server_allreduce())
    plans = {p.path.name: p for p in mscclpp_plans(tmp_path)}
    assert sorted(plans) == ["grads.inplace.mscclpp.json", "grads.ll.inplace.mscclpp.json",
                             "grads.ll.mscclpp.json", "grads.mscclpp.json"]
    ll, simple = plans["grads.ll.inplace.mscclpp.json"], plans["grads.inplace.mscclpp.json"]
    assert (ll.protocol, simple.protocol, ll.world_size) == ("LL", "Simple", 4)
    # every size is served by exactly one plan of each buffer mode, none of the other mode
    g = simple.granularity
    for nbytes in (g, 1 << 20, (1 << 20) + g, 3 * g << 20):
        for inplace in (False, True):
            serving = [p.path.name for p in plans.values()
                       if p.serves("allreduce", nbytes, inplace)]
            assert len(serving) == 1 and (".inplace." in serving[0]) == inplace, serving
    assert not simple.serves("allreduce", g + 1, True)
    assert not simple.serves("allgather", 1 << 24, True)
    with pytest.raises(FileNotFoundError, match="--emit mscclpp"):
        mscclpp_plans(tmp_path / "nothing")


def test_mscclpp_environment_preloads_the_nccl_interface(tmp_path):
    from cclc.torch import mscclpp_environment

    assert mscclpp_environment(tmp_path) == {"LD_PRELOAD": f"{tmp_path}/libmscclpp_nccl.so"}
    env = mscclpp_environment("/opt/mscclpp/lib/libmscclpp_nccl.so", "/usr/lib/libnccl.so.2")
    assert env == {"LD_PRELOAD": "/opt/mscclpp/lib/libmscclpp_nccl.so",
                   "MSCCLPP_NCCL_LIB_PATH": "/usr/lib/libnccl.so.2"}


def test_register_mscclpp_registers_one_buffer_mode(tmp_path, monkeypatch):
    """MSCCL++'s Python package is not installed here: a recording stand-in for its three
    names checks what register_mscclpp hands over (the real registration needs a GPU)."""
    import types

    from cclc.torch import register_mscclpp

    calls = []

    class Algorithm:
        class Constraint:
            def __init__(self, world_size, n_ranks_per_node):
                self.args = (world_size, n_ranks_per_node)

        def __init__(self, id, execution_plan, constraint, tags):
            self.args = (id, execution_plan, constraint.args, tags)

    class Builder:
        def add_algorithm_builder(self, algo):
            calls.append(algo.args)

    pkg = types.ModuleType("mscclpp")
    ext = types.ModuleType("mscclpp.ext")
    pkg.Algorithm = Algorithm
    pkg.ExecutionPlan = lambda path, rank: (path.rsplit("/", 1)[-1], rank)
    ext.AlgorithmCollectionBuilder = Builder
    pkg.ext = ext
    monkeypatch.setitem(sys.modules, "mscclpp", pkg)
    monkeypatch.setitem(sys.modules, "mscclpp.ext", ext)
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    _write_plans(tmp_path, _one_server_allreduce())
    got = register_mscclpp(tmp_path, inplace=True)
    assert [p.name for p in got] == ["grads_inplace", "grads_ll_inplace"]
    assert calls == [("grads_inplace", ("grads.inplace.mscclpp.json", 2), (4, 4), {}),
                     ("grads_ll_inplace", ("grads.ll.inplace.mscclpp.json", 2), (4, 4), {})]


_REGISTER_AND_LIST = """
import json, sys
try:
    import mscclpp.ext
except ImportError as err:
    sys.exit(f"no MSCCL++ Python package: {err}")
from cclc.torch import register_mscclpp
register_mscclpp(sys.argv[1], inplace=sys.argv[2] == "in", rank=2, ranks_per_node=4)
held = mscclpp.ext.AlgorithmCollectionBuilder().build()
# the wrapper exposes no constraint: its C++ algorithm's (bound as "constraint") says it
print(json.dumps([[a.name, a.collective, list(a.message_size_range),
                   str(a.buffer_mode).rsplit(".", 1)[-1], a.is_dsl_algorithm(),
                   [a._algorithm.constraint.world_size, a._algorithm.constraint.n_ranks_per_node]]
                  for a in held]))
"""


@pytest.mark.parametrize("mode", ["in", "out"])
def test_register_mscclpp_with_mscclpp_itself(tmp_path, mode):
    """Where MSCCL++'s Python package imports (built at the commit the backend cites; it
    imports without a GPU when the CUDA driver's and NVML's libraries load), its own
    AlgorithmCollectionBuilder, given cclc's plans by register_mscclpp, holds each of them as a
    DSL algorithm of the plan's name, collective, size window, buffer mode and constraint (world
    size, ranks per node). One process per
    mode: MSCCL++ keeps a DSL algorithm's buffer mode in a function-level static. The process
    starts in the checkout's root, where ``mscclpp`` is not the tests' folder of that name."""
    import json
    import os

    from cclc.torch import mscclpp_plans

    _write_plans(tmp_path, _one_server_allreduce())
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root),
                                                       os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", _REGISTER_AND_LIST, str(tmp_path), mode],
                          capture_output=True, text=True, env=env, cwd=root, timeout=120,
                          check=False)
    if "no MSCCL++ Python package" in proc.stderr:
        pytest.skip(proc.stderr.strip().splitlines()[-1])
    assert proc.returncode == 0, proc.stderr
    held = sorted(json.loads(proc.stdout.splitlines()[-1]))
    want = sorted([p.name, p.collective, [p.min_bytes, p.max_bytes],
                   "IN_PLACE" if p.inplace else "OUT_OF_PLACE", True, [p.world_size, 4]]
                  for p in mscclpp_plans(tmp_path) if p.inplace == (mode == "in"))
    assert held == want and len(want) == 2
