"""OutputDir: a manifest of what cclc wrote, refusal to clobber other files, atomic writes, and
the folder's lock (two processes on one folder: tests/cli/test_output_lock.py)."""

from __future__ import annotations

import json
import os

import pytest

from cclc.errors import CclError
from cclc.outdir import LOCK, MANIFEST, OutputDir, write_atomically


def test_creates_folder_and_manifest(tmp_path):
    out = OutputDir(tmp_path / "a" / "b")
    assert out.write_text("x.json", "{}") == "x.json"
    assert out.write_text("sub/y.txt", "hi") == "sub/y.txt"
    assert (tmp_path / "a/b/sub/y.txt").read_text() == "hi"
    doc = json.loads((tmp_path / "a/b" / MANIFEST).read_text())
    assert doc["format"] == "cclc-manifest" and doc["files"] == ["sub/y.txt", "x.json"]
    # a later run reads the manifest back and may replace its own files
    again = OutputDir(tmp_path / "a" / "b")
    assert again.owns("x.json")
    again.write_text("x.json", "[]")
    assert (tmp_path / "a/b/x.json").read_text() == "[]"


def test_refuses_foreign_file_unless_forced(tmp_path):
    (tmp_path / "mine.json").write_text("user data")
    out = OutputDir(tmp_path)
    with pytest.raises(CclError, match="refusing to overwrite .*--force"):
        out.write_text("mine.json", "{}")
    assert (tmp_path / "mine.json").read_text() == "user data"
    OutputDir(tmp_path, force=True).write_text("mine.json", "{}")
    assert (tmp_path / "mine.json").read_text() == "{}"
    assert OutputDir(tmp_path).owns("mine.json")


def test_no_temporary_files_left(tmp_path):
    out = OutputDir(tmp_path)
    for i in range(3):
        out.write_bytes("f.bin", bytes([i]) * 1000)
    assert sorted(os.listdir(tmp_path)) == [MANIFEST, "f.bin"]
    assert (os.stat(tmp_path / "f.bin").st_mode & 0o777) == 0o666 & ~_umask()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@pytest.mark.parametrize("name", ["../escape.json", "/abs.json", MANIFEST, LOCK, ""])
def test_rejects_names_outside_the_folder(tmp_path, name):
    with pytest.raises(CclError, match="not a file name"):
        OutputDir(tmp_path).write_text(name, "x")


def test_bad_manifest_and_bad_folder(tmp_path):
    (tmp_path / MANIFEST).write_text("not json")
    with pytest.raises(CclError, match="cannot read the manifest"):
        OutputDir(tmp_path)
    (tmp_path / MANIFEST).write_text('{"format": "other"}')
    with pytest.raises(CclError, match="not a cclc manifest"):
        OutputDir(tmp_path)
    (tmp_path / "file").write_text("x")
    with pytest.raises(CclError, match="not a folder"):
        OutputDir(tmp_path / "file")


def test_empty_folder_name_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CclError, match="output folder name is empty"):
        OutputDir("")
    assert os.listdir(tmp_path) == []


def test_a_held_folder_refuses_a_second_writer(tmp_path):
    (tmp_path / "keep.txt").write_text("theirs")
    with OutputDir(tmp_path) as first:
        assert first.locked and (tmp_path / LOCK).exists()
        first.write_text("a.json", "{}")
        second = OutputDir(tmp_path)
        with pytest.raises(CclError, match=r"being written by another cclc run \(process "
                                           rf"{os.getpid()}\)"):
            second.__enter__()
        # a write outside a with block takes the lock for itself, so it is refused too
        with pytest.raises(CclError, match="being written by another cclc run"):
            second.write_text("b.json", "{}")
        with first:             # nested in the same object: no deadlock, still held after
            first.write_text("c.json", "{}")
        assert first.locked
    assert not first.locked
    assert sorted(os.listdir(tmp_path)) == [MANIFEST, "a.json", "c.json", "keep.txt"]
    with OutputDir(tmp_path) as again:
        assert again.files() == ("a.json", "c.json")


def test_a_stale_lock_file_blocks_nothing(tmp_path):
    # a run killed while it held the lock leaves the file behind; the OS dropped the lock
    (tmp_path / LOCK).write_text("999999\n")
    with OutputDir(tmp_path) as out:
        out.write_text("a.json", "{}")
    assert sorted(os.listdir(tmp_path)) == [MANIFEST, "a.json"]


def test_a_user_file_named_like_the_lock_is_left_alone(tmp_path):
    (tmp_path / LOCK).write_text("my notes")
    with pytest.raises(CclError, match="is not cclc's lock file"):
        OutputDir(tmp_path).write_text("a.json", "{}")
    assert (tmp_path / LOCK).read_text() == "my notes"
    assert sorted(os.listdir(tmp_path)) == [LOCK]


def test_a_manifest_spoiled_meanwhile_releases_the_lock(tmp_path):
    out = OutputDir(tmp_path)
    (tmp_path / MANIFEST).write_text("not json")
    with pytest.raises(CclError, match="cannot read the manifest"):
        out.__enter__()
    assert not out.locked and not (tmp_path / LOCK).exists()


def test_write_atomically_replaces_a_single_file_whole(tmp_path):
    target = tmp_path / "sub" / "page.html"
    write_atomically(target, b"first")
    write_atomically(target, [b"sec", b"ond"])
    assert target.read_bytes() == b"second"
    assert os.listdir(tmp_path / "sub") == ["page.html"]
    with pytest.raises(CclError, match="cannot write"):
        write_atomically(tmp_path / "sub" / "page.html" / "x", b"")
