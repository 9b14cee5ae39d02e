"""benchmarks/report.py: the result tables of README.md and docs/results.md are what it writes
from the committed benchmark JSON, and it says faster and slower the right way round."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("report", ROOT / "benchmarks" / "report.py")
assert _spec is not None and _spec.loader is not None
report = importlib.util.module_from_spec(_spec)
sys.modules["report"] = report  # its dataclasses look their module up there
_spec.loader.exec_module(report)


def test_committed_tables_are_generated(capsys):
    assert report.main(["--check"]) == 0, capsys.readouterr().err


def test_every_benchmark_has_its_json():
    missing = [b.name for b in report.BENCHMARKS if not b.json_path.is_file()]
    assert not missing, f"run: python benchmarks/report.py --run --only {','.join(missing)}"


def test_every_recorded_run_names_its_command_and_machine():
    scripts = {b.name: b.script or b.name for b in report.BENCHMARKS}
    for name, data in report.load_results().items():
        meta = data["meta"]
        assert meta["command"].startswith(f"python benchmarks/{scripts[name]}.py"), name
        assert meta["command"].endswith(f"--json benchmarks/results/{name}.json"), name
        assert "cores" in meta["machine"] and meta["date"], name


def test_versus_says_slower_when_slower():
    assert report._versus(1.0, 2.0) == "2.00x slower"
    assert report._versus(3.0, 1.0) == "3.00x faster"
    assert report._versus(1.1, 1.0) == "1.10x faster (within the model's error)"
    assert report._versus(1.0, 1.001) == "as fast"
    assert report._versus(None, 1.0) == "–"


def test_headline_renders_the_largest_size_allreduce():
    row = {"topology": "a.ccl:t", "collective": "allreduce", "ranks": 8, "nominal": 1 << 30,
           "auto": "ring", "auto_pct_of_bound": 97.04, "nccl": "ring/simple",
           "nccl_time_s": 1.0, "auto_time_s": 2.0}
    small = {**row, "nominal": 1 << 20, "auto": "direct"}
    data = {"rows": [small, row], "model": "test model", "meta": {"command": "python x"}}
    lines = report.render_headline(data)
    assert "| a | 8 | ring | 97.0% | ring/simple | 2.00x slower |" in lines
    assert "1 GiB" in lines[0] and "test model" in lines[0]
