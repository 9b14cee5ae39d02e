"""``cclc.torch``: loads a generated library without importing torch, and reads the buffer
layout the library expects (checked against the schedule's own buffers). Running it on CUDA
tensors is the GPU tier's job (tests/gpu/test_torch_example.py)."""

from __future__ import annotations

import subprocess
import sys

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
