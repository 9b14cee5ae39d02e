"""Measure, diagnose, recompile: simulated timings with an injected fault go through
``cclc diagnose --patch``, and ``cclc compile`` of the patched file never routes over it."""

from __future__ import annotations

import numpy as np
import pytest

import dsl
from cclc import cli
from cclc.diagnose.inject import Fault, probe_timings
from cclc.diagnose.timings import to_pairs_csv
from cclc.serialize import load


@pytest.mark.parametrize("failed", [True, False])
def test_measure_diagnose_recompile(tmp_path, capsys, failed):
    src = "examples/torus5x5.ccl"
    topo = next(iter(dsl.load(src).topologies.values()))
    a, b = topo.rank_at((3, 1)), topo.rank_at((3, 2))
    bad = (topo.link_id(a, b), topo.link_id(b, a))
    timings = probe_timings(topo, (Fault("cable", "(3,1)--(3,2)", bad, failed=failed),),
                            noise=0.05, seed=3)
    probe = tmp_path / "probe.csv"
    probe.write_text(to_pairs_csv(timings))
    fixed = tmp_path / "fixed.ccl"
    rc = cli.main(["diagnose", str(probe), "--topology", src, "--patch", str(fixed)])
    out = capsys.readouterr().out
    assert rc == 1
    assert "suspect 1: cable (3,1)--(3,2)" in out and "suspect 2" not in out
    assert "fault link (3,1) -- (3,2)" in fixed.read_text()

    outdir = tmp_path / "out"
    assert cli.main(["compile", str(fixed), "-o", str(outdir)]) == 0
    schedule = load(outdir / "a2a.schedule.json")
    used = np.unique(schedule.routes.links)
    assert schedule.topology.link_failed[list(bad)].all()
    assert not np.isin(used, bad).any()
    assert cli.main(["verify", str(outdir / "a2a.schedule.json")]) == 0


def test_healthy_measurement_reports_nothing(tmp_path, capsys):
    src = "examples/hgx16_leafspine.ccl"
    topo = next(iter(dsl.load(src).topologies.values()))
    probe = tmp_path / "probe.csv"
    probe.write_text(to_pairs_csv(probe_timings(topo, (), noise=0.05, seed=1)))
    assert cli.main(["diagnose", str(probe), "--topology", src]) == 0
    out = capsys.readouterr().out
    assert "no fault found" in out
    # hgx16 routes cross-rail pairs over NVLink to the peer GPU's NIC: spines carry nothing
    assert "carry no measured pair" in out
