"""The NCCL C++/CUDA library: golden sources, an nvcc build (no GPU needed) that exports the
entry point, argument-check code paths, and build errors."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from backend_helpers import (
    NVCC_BUILD_UNAVAILABLE,
    check_golden,
    pairwise_alltoall,
    ring_reducescatter,
)

from backends.common import EmitOptions, c_identifier
from backends.nccl import emit, render_sources
from backends.nccl.build import BuildError, build, nccl_home
from cclc.collective import ReduceOp

NVCC = shutil.which("nvcc")


def test_golden_sources():
    src = render_sources(ring_reducescatter())
    assert set(src) == {"cclc_exec.h", "cclc_rs_ring_schedule.h", "cclc_rs_ring.h",
                        "cclc_rs_ring.cu", "cclc_rs_ring_mpi.h", "cclc_rs_ring_mpi.cc",
                        "cclc_rs_ring_mpi_main.cc", "Makefile", "cclc_rs_ring_perf.h",
                        "cclc_rs_ring_perf.cu", "cclc_rs_ring_mpi_perf.cc"}
    for name in ("cclc_exec.h", "cclc_rs_ring_schedule.h", "cclc_rs_ring.h", "cclc_rs_ring.cu",
                 "cclc_rs_ring_mpi.cc", "cclc_rs_ring_perf.h"):
        check_golden(f"nccl/{name}", src[name])
    check_golden("nccl/cclc_a2a_schedule.h",
                 render_sources(pairwise_alltoall())["cclc_a2a_schedule.h"])


def test_tables_are_per_rank_and_complete():
    s = pairwise_alltoall(n=3)
    header = render_sources(s)["cclc_a2a_schedule.h"]
    rows = re.findall(r"^  \{ (-?\d+(?:, -?\d+){14}) \},$", header, flags=re.MULTILINE)
    # 3 local copies + 6 messages seen from both ends + the sentinel
    assert len(rows) == 3 + 2 * 6 + 1
    first = re.search(r"_first\[\] = \{ ([0-9, ]+) \}", header).group(1)
    assert [int(x) for x in first.split(",")] == [0, 5, 10, 15]


def test_reduction_op_is_compiled_in():
    cu = render_sources(ring_reducescatter(op=ReduceOp.MAX))["cclc_rs_ring.cu"]
    assert "return a < b ? b : a;" in cu and "return a + b;" not in cu


@pytest.mark.slow
@pytest.mark.skipif(NVCC_BUILD_UNAVAILABLE is not None, reason=str(NVCC_BUILD_UNAVAILABLE))
def test_nvcc_builds_the_library_and_exports_the_entry_point(tmp_path):
    s = ring_reducescatter(name="my-rs.v2")
    ident = c_identifier("my-rs.v2")
    files = emit(s, tmp_path, EmitOptions(build=True))
    lib = files[-1]
    assert lib.name == f"libcclc_{ident}.so" and lib.exists()
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True,
                             text=True, check=True).stdout
    assert re.search(rf"\bT cclc_{ident}$", symbols, flags=re.MULTILINE), symbols
    needed = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True,
                            check=True).stdout
    assert "libnccl.so.2" in needed
    # a C++ caller compiles and links against the header and the library
    caller = tmp_path / "caller.cc"
    caller.write_text(
        f'#include "cclc_{ident}.h"\n'
        "int main() {\n"
        f"  return cclc_{ident}(nullptr, nullptr, 1, ncclFloat32, nullptr, nullptr) == "
        "ncclInvalidArgument ? 0 : 1;\n}\n")
    home = nccl_home()
    subprocess.run([NVCC, "-o", str(tmp_path / "caller"), str(caller), f"-I{lib.parent}",
                    f"-I{home}/include", f"-L{lib.parent}", f"-lcclc_{ident}",
                    f"-L{home}/lib", "-l:libnccl.so.2", f"-Xlinker=-rpath,{lib.parent}"],
                   check=True, capture_output=True)


@pytest.mark.skipif(NVCC is None, reason="nvcc (CUDA toolkit) is not installed")
def test_build_failure_names_the_problem(tmp_path, monkeypatch):
    emit(pairwise_alltoall(), tmp_path)
    folder = tmp_path / "nccl-a2a"
    monkeypatch.setenv("NCCL_HOME", str(tmp_path / "no-nccl-here"))
    with pytest.raises(BuildError, match="nccl.h|failed"):
        build(folder, ["all"], EmitOptions(nccl_home=str(tmp_path / "no-nccl-here")))
