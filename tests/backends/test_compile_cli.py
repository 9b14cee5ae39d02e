"""`cclc compile --emit json,msccl,nccl --build` end to end on a small .ccl file."""

from __future__ import annotations

import subprocess

import pytest
from backend_helpers import NVCC_BUILD_UNAVAILABLE

from backends.msccl.executor import execute
from cclc.cli import main

SOURCE = """
topology ring = torus(4) { link 32 GB/s, 100 ns }
collective ag2 = allgather on ring { size 64 KiB; dtype bf16; algorithm ring }
"""


@pytest.mark.slow
@pytest.mark.skipif(NVCC_BUILD_UNAVAILABLE is not None, reason=str(NVCC_BUILD_UNAVAILABLE))
def test_compile_emits_xml_report_sources_and_library(tmp_path, capsys):
    src = tmp_path / "ag.ccl"
    src.write_text(SOURCE)
    out = tmp_path / "out"
    rc = main(["compile", str(src), "-o", str(out), "--emit", "json,msccl,nccl",
               "--msccl-runtime", "rccl", "--build"])
    assert rc == 0, capsys.readouterr().err
    xml = out / "ag2.rccl.xml"
    assert xml.exists() and (out / "ag2.rccl.report.md").exists()
    execute(xml.read_text())
    lib = out / "nccl-ag2" / "libcclc_ag2.so"
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True,
                             text=True, check=True).stdout
    assert " T cclc_ag2" in symbols
