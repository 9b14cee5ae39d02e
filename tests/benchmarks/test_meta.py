"""benchmarks/meta.py: the commit a benchmark's results name is the code that ran."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("meta", ROOT / "benchmarks" / "meta.py")
assert _spec is not None and _spec.loader is not None
meta = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(meta)


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def test_a_changed_tracked_file_of_cclc_marks_the_commit(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    (repo / "cclc").mkdir(parents=True)
    (repo / "cclc" / "x.py").write_text("a = 1\n")
    (repo / "notes.txt").write_text("n\n")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "c")
    monkeypatch.setattr(meta, "ROOT", repo)
    clean = meta._commit()
    assert clean is not None and not clean.endswith("+changes")
    (repo / "notes.txt").write_text("other\n")          # not code: still that commit's
    assert meta._commit() == clean
    (repo / "cclc" / "x.py").write_text("a = 2\n")
    assert meta._commit() == clean + "+changes"


def test_no_repository_names_no_commit(tmp_path, monkeypatch):
    monkeypatch.setattr(meta, "ROOT", tmp_path)
    assert meta._commit() is None


@pytest.mark.parametrize("key", ["command", "machine", "date", "commit", "python"])
def test_run_meta_says_where_it_ran(key):
    assert key in meta.run_meta([])
