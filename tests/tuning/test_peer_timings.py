"""The plugin's per-peer timings (CCLC_PEER_TIMINGS), driven by a C harness the way NCCL's
profiler drives it (ASan + UBSan), read back by ``cclc diagnose``'s JSON reader."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from backends import tuner as tuner_backend
from cclc.diagnose.timings import parse_timings

from .conftest import ASAN, HERE, _need_gcc


@pytest.fixture(scope="module")
def peer_run(tmp_path_factory):
    gcc = _need_gcc()
    d = tmp_path_factory.mktemp("peers")
    tuner_backend.emit([], d / "plugin")
    lib = tuner_backend.build(d / "plugin", extra_flags=["-g", "-O1", *ASAN],
                              output=d / "asan.so")
    exe = d / "peer_harness"
    subprocess.run([gcc, "-g", "-O1", "-Wall", "-Wextra", "-Werror", *ASAN, "-o", str(exe),
                    str(HERE / "peer_harness.c"), "-ldl"], check=True)
    env = {**os.environ, "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1",
           "ASAN_OPTIONS": "detect_leaks=1"}
    done = subprocess.run([str(exe), str(lib), str(d / "timings")], capture_output=True,
                          text=True, env=env, timeout=120, check=False)
    return done, d


def test_harness_passes_under_sanitizers(peer_run):
    done, _ = peer_run
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 failures" in done.stdout


def test_written_timings(peer_run):
    _, d = peer_run
    path = d / "timings.0000000000abcdef.rank1.json"
    doc = json.loads(path.read_text())
    assert doc["format"] == "cclc-peer-timings" and doc["rank"] == 1 and doc["nranks"] == 4
    recs = {(r["coll"], r["peer"], r["dir"]): r for r in doc["records"]}
    # six ops of the AllReduce, two steps of 64 KiB each; the PXN op is not attributed
    for peer in (0, 2, 3):
        for way in ("send", "recv"):
            r = recs[("AllReduce", peer, way)]
            assert r["bytes"] == 2 * 65536 and r["ops"] == 1
    assert recs[("other", 3, "send")]["bytes"] == 4096
    assert len(doc["records"]) == 7
    slow = recs[("AllReduce", 2, "send")]["seconds"]
    assert slow >= 0.04 and all(recs[("AllReduce", p, "send")]["seconds"] < slow
                                for p in (0, 3))
    # diagnose reads it: rank 1's sends are pairs 1 -> peer, its receives peer -> 1
    t = parse_timings(path.read_text(), str(path))
    pairs = dict(zip(zip(t.src.tolist(), t.dst.tolist(), strict=True), t.seconds.tolist(),
                     strict=True))
    assert set(pairs) == {(1, 0), (1, 2), (1, 3), (0, 1), (2, 1), (3, 1)}
    assert pairs[(1, 2)] == max(pairs.values())


def test_no_file_without_the_variable(tmp_path):
    """Without CCLC_PEER_TIMINGS the profiler asks for no proxy events and writes nothing:
    the harness's mask check fails, which shows it is not vacuous."""
    gcc = _need_gcc()
    tuner_backend.emit([], tmp_path / "plugin")
    lib = tmp_path / "plugin" / tuner_backend.LIBRARY
    exe = tmp_path / "peer_harness"
    subprocess.run([gcc, "-O1", "-o", str(exe), str(HERE / "peer_harness.c"), "-ldl"],
                   check=True)
    # an empty prefix turns the feature off; setenv in the harness sets it to ""
    done = subprocess.run([str(exe), str(lib), ""], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 1 and "lacks Coll|ProxyOp|ProxyStep" in done.stderr
    assert not list(Path(tmp_path).glob("*.json"))


def test_diagnose_joins_per_rank_files(tmp_path):
    """Two ranks' files: each pair's send side and receive side meet, the slower is kept."""
    from cclc.diagnose.timings import read_timings_files

    def doc(rank, recs):
        return json.dumps({"format": "cclc-peer-timings", "version": 1, "records": [
            {"rank": rank, "peer": p, "dir": w, "bytes": 100, "seconds": s, "coll": "AllReduce",
             "ops": 1} for p, w, s in recs]})
    a = tmp_path / "t.rank0.json"
    b = tmp_path / "t.rank1.json"
    a.write_text(doc(0, [(1, "send", 1.0), (1, "recv", 2.0)]))
    b.write_text(doc(1, [(0, "recv", 3.0), (0, "send", 0.5)]))
    t = read_timings_files([str(a), str(b)])
    pairs = dict(zip(zip(t.src.tolist(), t.dst.tolist(), strict=True), t.seconds.tolist(),
                     strict=True))
    assert pairs == {(0, 1): 3.0, (1, 0): 2.0}
