"""The README's first commands, run as a newcomer would: a copy of the repository's tracked
files (a fresh clone), a fresh virtualenv, the install and the first compile, then the test
command on a small selection (the whole suite is this very run, so it is not run again).

Skips, saying why, when the repository is not a git checkout or no package index answers.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"```sh\n(.*?)```", text, flags=re.DOTALL)
    assert block, "the README starts with a ```sh block of commands"
    return [line.split("  #")[0].strip() for line in block.group(1).splitlines()
            if line.strip()]


def _run(cmd: str, cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", cmd], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def _fresh_clone(dest: Path) -> None:
    if shutil.which("git") is None:
        pytest.skip("git is not installed: cannot list the repository's tracked files")
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True)
    if listed.returncode != 0:
        pytest.skip("not a git checkout: cannot tell a fresh clone's files")
    for name in listed.stdout.decode().split("\0"):
        src = ROOT / name
        if name and src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


@pytest.mark.slow  # a fresh virtualenv and its install: minutes
def test_readme_commands_work_in_a_fresh_virtualenv(tmp_path):
    first_line, test_line = _readme_commands()
    # the first line makes and enters a virtualenv, then installs and compiles
    venv_line, _, install_line = first_line.partition(" && pip install")
    install_line = "pip install" + install_line
    assert venv_line == "python3 -m venv .venv && . .venv/bin/activate"
    assert install_line.startswith("pip install -e '.[test]' && cclc compile")
    assert test_line == "python3 -m pytest -q -rs"
    repo = tmp_path / "cclc"
    _fresh_clone(repo)
    # the README's python3, as a newcomer's shell finds it (not this test's virtualenv)
    base = getattr(sys, "_base_executable", None) or sys.executable
    made = _run(venv_line.replace("python3", base, 1) + " && python3 --version", repo, 300)
    assert made.returncode == 0, made.stderr
    activate = ". .venv/bin/activate"
    probe = _run(f"{activate} && pip download --no-deps -q -d {tmp_path / 'probe'} 'lark>=1.1.9'",
                 repo, 300)
    if probe.returncode != 0:
        pytest.skip("no package index reachable: " + (probe.stderr.strip().splitlines() or
                                                     ["pip download failed"])[-1])
    first = _run(f"{activate} && {install_line}", repo, 1200)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "a2a:" in first.stdout and "% of bound" in first.stdout
    for name in ("a2a.schedule.json", "a2a.msccl.xml", "a2a.html"):
        assert (repo / "out" / name).is_file(), name
    # the test command, on a small selection, and every module collected (imports resolve)
    for extra in ("--collect-only", "tests/dsl/test_parser.py"):
        second = _run(f"{activate} && {test_line} -p no:cacheprovider {extra}", repo, 600)
        assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
