"""Shared fixtures of the tuning tests: example machines and the C harness."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from cclc.topology import NodeType, leaf_spine, single_node, single_switch
from cclc.tuning.space import machine_of

HERE = Path(__file__).parent
HGX = NodeType("hgx", "nvswitch", 8, 450e9, 1e-6, nics=8, nic_bandwidth=50e9)
PCIE4 = NodeType("box", "pcie", 4, 24e9, 2e-6, nics=2, nic_bandwidth=25e9)
GPU1 = NodeType("gpu1", "pcie", 1, 48e9, 1e-6, nics=1, nic_bandwidth=50e9)


@pytest.fixture(scope="session")
def hgx_node():
    return machine_of(single_node("box", HGX))


@pytest.fixture(scope="session")
def hgx_cluster():
    return machine_of(leaf_spine("cluster", 4, HGX, rails=8, leaves=None, spines=4,
                                 oversubscription=1.0, bandwidth=50e9, latency=1e-6))


@pytest.fixture(scope="session")
def single_gpu_fabric():
    return machine_of(single_switch("sw", 6, GPU1, bandwidth=50e9, latency=2e-6))


@pytest.fixture(scope="session")
def pcie_cluster():
    return machine_of(leaf_spine("pc", 4, PCIE4, rails=2, leaves=None, spines=2,
                                 oversubscription=2.0, bandwidth=25e9, latency=2e-6))


def _need_gcc() -> str:
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("no gcc")
    return gcc


ASAN = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-fno-sanitize-recover=all"]


@pytest.fixture(scope="session")
def harness(tmp_path_factory) -> Path:
    """tests/tuning/harness.c built with AddressSanitizer and UBSan."""
    gcc = _need_gcc()
    exe = tmp_path_factory.mktemp("harness") / "harness"
    subprocess.run([gcc, "-g", "-O1", "-Wall", "-Wextra", "-Werror", *ASAN, "-o", str(exe),
                    str(HERE / "harness.c"), "-ldl", "-lm", "-pthread"], check=True)
    return exe


def run_harness(harness: Path, lib: Path, mode: str, env: dict | None = None):
    """Run the harness; returns the CompletedProcess (stdout + stderr captured)."""
    import os

    full = {**os.environ, "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1",
            "ASAN_OPTIONS": "detect_leaks=1"}
    full.pop("CCLC_TUNER_ONLINE", None)
    full.update(env or {})
    return subprocess.run([str(harness), str(lib), mode], capture_output=True, text=True,
                          env=full, timeout=120, check=False)


def write_rows(path: Path, rows) -> Path:
    with open(path, "w") as f:
        f.writelines(f"{r['func']} {r['n_ranks']} {r['n_nodes']} {r['min_bytes']} {r['max_bytes']} "
                    f"{r['algo']} {r['proto']} {r['channels']} {r['chunk']}\n" for r in rows)
    return path
