"""The generated plugin, loaded by a C harness the way NCCL loads it (ASan + UBSan)."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backends import tuner as tuner_backend
from cclc.errors import CclError
from cclc.outdir import OutputDir

from .conftest import ASAN, run_harness, write_rows

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

ROWS = [  # func n_ranks n_nodes min max algo proto channels chunk (all measured)
    dict(func=4, n_ranks=8, n_nodes=1, min_bytes=1024, max_bytes=1 << 20, algo=1, proto=1,
         channels=4, chunk=65536),
    dict(func=4, n_ranks=8, n_nodes=1, min_bytes=(1 << 20) + 1, max_bytes=1 << 30, algo=4,
         proto=2, channels=8, chunk=0),
    dict(func=2, n_ranks=16, n_nodes=16, min_bytes=4096, max_bytes=8192, algo=6, proto=2,
         channels=2, chunk=131072),
    dict(func=2, n_ranks=16, n_nodes=16, min_bytes=8193, max_bytes=100000, algo=1, proto=0,
         channels=3, chunk=0),
    dict(func=4, n_ranks=16, n_nodes=16, min_bytes=1, max_bytes=10, algo=0, proto=2, channels=5,
         chunk=0),
    dict(func=0, n_ranks=8, n_nodes=1, min_bytes=0, max_bytes=1 << 40, algo=1, proto=2,
         channels=64, chunk=1 << 20),
]
ROWS = [dict(r, measured=1) for r in ROWS]


def _asan_build(src_dir: Path, out: Path) -> Path:
    tuner_backend.build(src_dir, extra_flags=["-g", "-O1", *ASAN], output=out)
    return out


@pytest.fixture(scope="module")
def plugin(tmp_path_factory):
    if shutil.which("gcc") is None:
        pytest.skip("no gcc")
    d = tmp_path_factory.mktemp("plugin")
    names = tuner_backend.emit(ROWS, d)
    assert names == ["plugin.c", "Makefile", tuner_backend.LIBRARY]
    return d


def test_exports(plugin):
    syms = subprocess.run(["nm", "-D", "--defined-only", str(plugin / tuner_backend.LIBRARY)],
                          capture_output=True, text=True, check=True).stdout
    exported = {line.split()[-1] for line in syms.splitlines() if line.strip()}
    assert set(tuner_backend.TUNER_SYMBOLS) <= exported
    assert set(tuner_backend.PROFILER_SYMBOLS) <= exported
    # nothing else leaks: the plugin's helpers are hidden
    assert not {s for s in exported if s.startswith("cclc_")}


def test_makefile_builds_the_same_library(plugin, tmp_path):
    if shutil.which("make") is None:
        pytest.skip("no make")
    shutil.copy(plugin / "plugin.c", tmp_path)
    shutil.copy(plugin / "Makefile", tmp_path)
    subprocess.run(["make", "-s", "-C", str(tmp_path)], check=True, capture_output=True)
    assert (tmp_path / tuner_backend.LIBRARY).stat().st_size > 0


@pytest.mark.parametrize("instrumented", [False, True])
def test_harness_static(harness, plugin, tmp_path, instrumented):
    lib = plugin / tuner_backend.LIBRARY
    if instrumented:
        lib = _asan_build(plugin, tmp_path / "asan.so")
    done = run_harness(harness, lib, str(write_rows(tmp_path / "rows.txt", ROWS)))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 failures" in done.stdout


@pytest.mark.parametrize("instrumented", [False, True])
def test_harness_online_converges(harness, plugin, tmp_path, instrumented):
    lib = plugin / tuner_backend.LIBRARY
    if instrumented:
        lib = _asan_build(plugin, tmp_path / "asan.so")
    done = run_harness(harness, lib, "--online")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "froze Ring/Simple channels=8 chunk>>2" in done.stdout
    print(done.stdout)


def test_harness_threads(harness, plugin, tmp_path):
    """Four communicators tuned online from four threads at once, on the ASan build."""
    lib = _asan_build(plugin, tmp_path / "asan.so")
    done = run_harness(harness, lib, "--threads")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("froze Ring/Simple channels=8 chunk>>2") == 4


def test_harness_catches_a_plugin_that_forces_unavailable_entries(harness, tmp_path):
    """The harness is not vacuous: a plugin that ignores IGNORE entries fails it."""
    files = tuner_backend.render(ROWS)
    broken = files["plugin.c"].replace("return t[algo * numProto + proto] >= 0.0f;",
                                       "return t != NULL;")
    assert broken != files["plugin.c"]
    (tmp_path / "plugin.c").write_text(broken)
    lib = tuner_backend.build(tmp_path)
    done = run_harness(harness, lib, str(write_rows(tmp_path / "rows.txt", ROWS)))
    assert done.returncode != 0 and "FAIL" in done.stderr


def test_plugin_never_applies_resources_from_a_model_row(harness, tmp_path):
    """The rule is enforced in the plugin itself: a row marked as coming from a model may
    force its algorithm/protocol, but its channels and chunk are never applied, even if a
    hand-edited table carries them (render() already refuses such rows)."""
    model_rows = [dict(r, measured=0) for r in ROWS]
    with pytest.raises(CclError, match="comes from a model"):
        tuner_backend.render(model_rows)
    # bypass the check: the template with resources on model rows
    source = tuner_backend._ENV.get_template("plugin.c.j2").render(rows=model_rows)
    (tmp_path / "plugin.c").write_text(source)
    lib = tuner_backend.build(tmp_path)
    expect = [dict(r, channels=0, chunk=0) for r in model_rows]   # what NCCL must see
    done = run_harness(harness, lib, str(write_rows(tmp_path / "rows.txt", expect)))
    assert done.returncode == 0, done.stdout + done.stderr
    # and the harness notices when the plugin does apply them
    done = run_harness(harness, lib, str(write_rows(tmp_path / "rows2.txt", model_rows)))
    assert done.returncode != 0 and "FAIL" in done.stderr


def test_empty_table_leaves_nccl_alone(harness, tmp_path):
    tuner_backend.emit([], tmp_path)
    done = run_harness(harness, tmp_path / tuner_backend.LIBRARY,
                       str(write_rows(tmp_path / "rows.txt", [])))
    assert done.returncode == 0, done.stdout + done.stderr


def test_bad_rows_and_compiler(tmp_path):
    with pytest.raises(CclError, match="lacks"):
        tuner_backend.render([{"func": 4}])
    with pytest.raises(CclError, match="empty"):
        tuner_backend.render([dict(ROWS[0], min_bytes=10, max_bytes=1)])
    with pytest.raises(CclError, match="no C compiler"):
        tuner_backend.emit(ROWS, tmp_path, cc="no-such-cc")


_row = st.builds(dict, func=st.integers(0, 4), n_ranks=st.sampled_from([2, 8]),
                 n_nodes=st.just(1), min_bytes=st.integers(0, 1 << 20),
                 max_bytes=st.just(0), algo=st.integers(0, 6), proto=st.integers(0, 2),
                 channels=st.integers(1, 64), chunk=st.sampled_from([0, 4096, 1 << 19]),
                 measured=st.just(1))


@settings(max_examples=4, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(_row, max_size=6))
def test_harness_on_random_tables(harness, tmp_path_factory, rows):
    # non-overlapping ranges per (func, comm): the first match is the only match
    seen, table = {}, []
    for r in sorted(rows, key=lambda r: r["min_bytes"]):
        key = (r["func"], r["n_ranks"])
        lo = max(r["min_bytes"], seen.get(key, -1) + 1)
        row = dict(r, min_bytes=lo, max_bytes=lo + 1000)
        seen[key] = row["max_bytes"]
        table.append(row)
    d = tmp_path_factory.mktemp("rand")
    tuner_backend.emit(table, d)
    done = run_harness(harness, d / tuner_backend.LIBRARY, str(write_rows(d / "rows.txt", table)))
    assert done.returncode == 0, done.stdout + done.stderr


def test_grid_on_a_machine_nccl_cannot_tune_says_why(tmp_path):
    path = EXAMPLES / "pcie_oversubscribed.ccl"   # a failed GPU leaves 3 GPUs on one node
    if not path.exists():
        pytest.skip("example not present")
    with pytest.raises(CclError, match="same number of GPUs on every node"):
        _tune_cli([str(path), "-o", str(tmp_path), "--collectives", "allreduce"])


def _tune_cli(argv: list[str]) -> int:
    from cclc.commands import tune
    parser = argparse.ArgumentParser(prog="cclc")
    tune.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["tune", *argv])
    return args.run(args)


@pytest.mark.parametrize("example,extra", [
    ("hgx_node.ccl", ["--sizes", "64KiB:1GiB:x16"]),
    ("hgx16_leafspine.ccl", []),
    ("fabric6_single_gpu.ccl", ["--nccl-version", "2.27"]),
    ("pcie_oversubscribed.ccl", ["--sizes", "1MiB,64MiB"]),
])
def test_cclc_tune_on_examples(harness, tmp_path, capsys, example, extra):
    path = EXAMPLES / example
    if not path.exists():
        pytest.skip(f"{example} not present")
    out = tmp_path / "out"
    assert _tune_cli([str(path), "-o", str(out), *extra]) == 0
    for name in ("tuning.csv", "tuning.json", "nccl.conf", "nccl_tuner.conf", "plugin.c",
                 "Makefile", tuner_backend.LIBRARY, "tune-cache.json"):
        assert (out / name).exists(), name
    doc = json.loads((out / "tuning.json").read_text())
    chunk_ok = doc["nccl_version"] >= "2.30"
    rows = [dict(func=["Broadcast", "Reduce", "AllGather", "ReduceScatter",
                       "AllReduce"].index(e["collective"]),
                 n_ranks=e["nranks"], n_nodes=e["nnodes"], min_bytes=e["min_bytes"],
                 max_bytes=e["max_bytes"], algo=["Tree", "Ring", "CollNetDirect", "CollNetChain",
                                                 "NVLS", "NVLSTree", "PAT"].index(e["algorithm"]),
                 proto=["LL", "LL128", "Simple"].index(e["protocol"]),
                 # a model's entry keeps NCCL's channels and chunk: the plugin sets neither
                 channels=e["channels"] if e["source"] == "measured" else 0,
                 chunk=e["chunk"] if chunk_ok and e["source"] == "measured" else 0)
            for e in doc["entries"]]
    assert rows
    # --profiler model (the default): every entry is a model's, and no plugin row carries
    # channels or a chunk -- NCCL keeps its own (issue 11: the hgx16 table wrote 1-2 channels)
    assert {e["source"] for e in doc["entries"]} == {"model"}
    import re
    c_rows = re.findall(r"^  \{ (\d+), .*, (\d+), (\d+)ULL, (\d) \},$",
                        (out / "plugin.c").read_text(), re.M)
    assert len(c_rows) >= 1 and all((ch, ck, m) == ("0", "0", "0") for _, ch, ck, m in c_rows)
    done = run_harness(harness, out / tuner_backend.LIBRARY,
                       str(write_rows(tmp_path / "rows.txt", rows)))
    assert done.returncode == 0, done.stdout + done.stderr
    # a rerun measures nothing new
    capsys.readouterr()
    assert _tune_cli([str(path), "-o", str(out), *extra, "--no-build"]) == 0
    assert "(0 evaluated under the NCCL model, the rest cached)" in capsys.readouterr().out


def test_cclc_tune_says_a_model_evaluates_and_never_measures(tmp_path, capsys):
    out = tmp_path / "out"
    assert _tune_cli([str(EXAMPLES / "hgx_node.ccl"), "-o", str(out), "--sizes", "1MiB",
                      "--no-build"]) == 0
    printed = capsys.readouterr().out
    assert "measured" not in printed
    summary = next(line for line in printed.splitlines() if "table entries" in line)
    assert "evaluated under the NCCL model, the rest cached) with cd on model" in summary
    entries = [line for line in printed.splitlines() if " B: " in line]
    assert entries and all(line.endswith("; evaluated under the NCCL model)")
                           for line in entries)
    doc = json.loads((out / "tuning.json").read_text())
    assert all("measured" not in e and e["source"] == "model" for e in doc["entries"])


def test_cclc_tune_refuses_a_foreign_file_before_it_searches(tmp_path, monkeypatch):
    from cclc.commands import tune

    out = tmp_path / "out"
    out.mkdir()
    (out / "nccl.conf").write_text("NCCL_DEBUG=INFO\n")     # the user's
    searched = []
    monkeypatch.setattr("cclc.tuning.table.tune", lambda *a, **k: searched.append(a))
    argv = [str(EXAMPLES / "hgx_node.ccl"), "-o", str(out), "--sizes", "1MiB", "--no-build"]
    with pytest.raises(CclError, match="refusing to overwrite 'nccl.conf'"):
        _tune_cli(argv)
    assert searched == [] and (out / "nccl.conf").read_text() == "NCCL_DEBUG=INFO\n"
    monkeypatch.undo()
    assert _tune_cli([*argv, "--force"]) == 0
    assert set(OutputDir(out).files()) == {*tune.TABLE_FILES, "plugin.c", "Makefile"}


def test_cclc_tune_replays_a_csv(tmp_path, capsys):
    path = EXAMPLES / "hgx_node.ccl"
    if not path.exists():
        pytest.skip("example not present")
    csv_path = tmp_path / "measured.csv"
    csv_path.write_text("collective,nbytes,algorithm,protocol,channels,busbw\n"
                        "allreduce,1073741824,ring,simple,8,500\n"
                        "allreduce,1073741824,ring,simple,16,350\n"
                        "allreduce,1073741824,nvls,simple,16,480\n"
                        "allgather,268435456,ring,simple,16,360\n")
    out = tmp_path / "out"
    capsys.readouterr()
    assert _tune_cli([str(path), "-o", str(out), "--profiler", f"csv:{csv_path}",
                      "--search", "exhaustive", "--no-build"]) == 0
    printed = capsys.readouterr().out
    assert " measured, the rest cached) with exhaustive on csv" in printed
    assert "NCCL model" not in printed
    entries = {e["target"]: e for e in json.loads((out / "tuning.json").read_text())["entries"]}
    grads = entries["grads"]
    assert (grads["algorithm"], grads["protocol"], grads["channels"]) == ("Ring", "Simple", 8)
    assert grads["busbw_gbps"] == 500 and grads["nccl_busbw_gbps"] == 480
    # no threads column: every thread count measures alike, so nothing process-wide is set
    assert "NCCL_NTHREADS" not in (out / "nccl.conf").read_text()
    assert not (out / tuner_backend.LIBRARY).exists()
