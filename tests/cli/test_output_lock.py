"""Two real ``cclc compile`` processes into one output folder: the folder's lock keeps their
files apart (a faulty torus's topology never lands beside a healthy torus's schedule)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from cclc.outdir import LOCK, MANIFEST

ROOT = Path(__file__).resolve().parents[2]

# both name their topology "torus": the files of the two runs have the same names
HEALTHY = """
topology torus = torus(3, 3) { link 32 GB/s, 100 ns }
collective a2a = alltoall on torus { size 9 KiB }
"""
FAULTY = """
topology torus = torus(3, 3) {
    link 32 GB/s, 100 ns
    fault link (1,1) -- (2,1)
}
collective a2a = alltoall on torus { size 9 KiB }
"""

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGSTOP"), reason="needs POSIX signals")


@pytest.fixture
def sources(tmp_path):
    (tmp_path / "healthy.ccl").write_text(HEALTHY)
    (tmp_path / "faulty.ccl").write_text(FAULTY)
    return tmp_path


def _compile(source: Path, out: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH",
                                                                                    "")]))
    return subprocess.Popen([sys.executable, "-m", "cclc.cli", "compile", str(source), "-o",
                             str(out)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _stop_after_topology(proc: subprocess.Popen) -> list[str]:
    """Read ``proc``'s progress until it wrote its topology (it holds the lock then), stop it
    there and return what it printed."""
    seen = []
    assert proc.stderr is not None
    for line in proc.stderr:
        seen.append(line)
        if line.startswith("wrote") and "topology-torus.json" in line:
            proc.send_signal(signal.SIGSTOP)
            return seen
    raise AssertionError(f"the compile never wrote its topology:\n{''.join(seen)}")


def _assert_one_run(out: Path, faulty: bool) -> None:
    """``out`` holds exactly one run's files, listed in its manifest, from one source."""
    files = sorted(os.listdir(out))
    assert files == [MANIFEST, "a2a.schedule.json", "topology-torus.json"], files
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["files"] == ["a2a.schedule.json", "topology-torus.json"]
    topology = json.loads((out / "topology-torus.json").read_text())["topology"]
    schedule = json.loads((out / "a2a.schedule.json").read_text())
    assert schedule["topology"] == topology
    assert any(topology["links"]["failed"]) == faulty


@pytest.mark.slow
def test_second_compile_into_a_held_folder_is_refused(sources):
    out = sources / "out"
    first = _compile(sources / "faulty.ccl", out)
    try:
        _stop_after_topology(first)
        second = _compile(sources / "healthy.ccl", out)
        _, err = second.communicate(timeout=120)
        assert second.returncode == 2, err
        assert f"being written by another cclc run (process {first.pid})" in err
        assert "Traceback" not in err
    finally:
        first.send_signal(signal.SIGCONT)
    _, err = first.communicate(timeout=120)
    assert first.returncode == 0, err
    _assert_one_run(out, faulty=True)


@pytest.mark.slow
def test_a_killed_holder_does_not_block_the_next_compile(sources):
    out = sources / "out"
    first = _compile(sources / "faulty.ccl", out)
    try:
        _stop_after_topology(first)
    finally:
        first.kill()
        first.communicate(timeout=60)
    assert (out / LOCK).exists()    # left behind by the killed run, no longer locked
    second = _compile(sources / "healthy.ccl", out)
    _, err = second.communicate(timeout=120)
    assert second.returncode == 0, err
    _assert_one_run(out, faulty=False)

