"""The torus build-time benchmark's machinery on a small torus (the real run is in benchmarks/)."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

_ROOT = Path(__file__).resolve().parents[2]
_PATH = _ROOT / "benchmarks" / "torus_build_scale.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("torus_build_scale_bench", _PATH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_worker_digest_is_the_schedule(bench):
    a = bench._worker("3x3x3", "mate")
    b = bench._worker("3x3x3", "mate")
    c = bench._worker("3x3x3", "matee")
    assert a["ops"] > 0 and a["digest"] == b["digest"] != c["digest"]


def test_ratio_says_slower(bench):
    assert bench._ratio(2.0, 1.0) == "2.00x faster"
    assert bench._ratio(1.0, 2.0) == "2.00x slower"


@pytest.mark.slow
def test_side_by_side_run_against_a_git_revision(tmp_path):
    if shutil.which("git") is None or subprocess.run(
            ["git", "-C", str(_ROOT), "rev-parse", "HEAD"], capture_output=True).returncode:
        pytest.skip("not a git checkout: no baseline revision to compare with")
    out = tmp_path / "rows.json"
    done = subprocess.run([sys.executable, str(_PATH), "--baseline", "HEAD", "--dims", "3x3",
                           "--entries", "foldedring+dimrotation", "--repeat", "1",
                           "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "| 3x3 | foldedring+dimrotation |" in done.stdout and "| yes |" in done.stdout
