"""The torus AllToAll benchmark's machinery on a small torus (the real run is in benchmarks/)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "torus_alltoall.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("torus_alltoall_bench", _PATH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_rows_speedups_and_table(bench):
    sizes = [8 * 1024, 2 * 2**30]
    series = list(bench.SERIES) + list(bench.RHO_SERIES)
    rows = bench.run_torus((3, 3), 32e9, sizes, series, log=lambda msg: None)
    assert len(rows) == len(sizes) * len(series)
    by = {(r["series"], r["size"]): r for r in rows}
    assert all(by[("Ring_Pipeline", s)]["speedup"] == 1.0 for s in sizes)
    # bandwidth-bound: HalfRing vs Ring on a 3-ring is 2N/(N+1) = 1.5 (Pipeline both)
    big = sizes[-1]
    assert by[("HalfRing_Pipeline", big)]["speedup_bandwidth"] == pytest.approx(1.5, rel=0.01)
    # event mode runs for MATE on a small torus and is never slower than lockstep
    assert by[("MATE", big)]["time_event"] <= by[("MATE", big)]["time"] * (1 + 1e-9)
    avg = bench.averages(rows)
    assert set(avg) == set(series)
    text = bench.markdown(rows, [], series)
    assert "| HalfRing_DimRotation |" in text and "1.56x" in text
