"""Measure, diagnose, recompile: simulated timings with an injected fault go through
``cclc diagnose --patch``, and ``cclc compile`` of the patched file never routes over it."""

from __future__ import annotations

import numpy as np
import pytest

import dsl
from cclc import cli
from cclc.diagnose.inject import Fault, probe_timings
from cclc.diagnose.pair_timings import make_timings
from cclc.diagnose.timings import to_pairs_csv
from cclc.serialize import load


@pytest.mark.slow
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


def _run(capsys, *argv):
    rc = cli.main(["diagnose", *map(str, argv)])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return rc, out


def test_example_probe_names_its_slow_link(capsys):
    """examples/probe_torus5x5.csv is the simulated probe its header says, and diagnose names
    the injected link with full confidence and its fault statement."""
    from cclc.diagnose.timings import read_timings

    topo = next(iter(dsl.load("examples/torus5x5.ccl").topologies.values()))
    li = topo.link_id(topo.rank_at((1, 1)), topo.rank_at((1, 2)))
    again = probe_timings(topo, (Fault("link", "(1,1)->(1,2)", (li,), factor=2.0),),
                          noise=0.05, seed=7)
    shipped = read_timings("examples/probe_torus5x5.csv")
    assert shipped.src.tolist() == again.src.tolist()
    assert np.allclose(shipped.seconds, again.seconds, rtol=1e-12)
    rc, out = _run(capsys, "examples/probe_torus5x5.csv", "--topology", "examples/torus5x5.ccl")
    assert rc == 1
    assert "suspect 1: link (1,1)->(1,2)  confidence 1.00" in out and "suspect 2" not in out
    assert "finding:" not in out
    assert "\n  fault link (1,1) -> (1,2)\n" in out


def test_too_little_evidence_writes_no_patch(tmp_path, capsys):
    probe = tmp_path / "three.csv"
    probe.write_text("src,dst,bytes,seconds\n0,6,1048576,0.0010\n0,12,1048576,0.00102\n"
                     "0,18,1048576,0.00104\n")
    fixed = tmp_path / "fixed.ccl"
    rc, out = _run(capsys, probe, "--topology", "examples/torus5x5.ccl", "--patch", fixed)
    assert "suspect" not in out and "fault link" not in out and not fixed.exists()
    assert f"no fault statement: nothing written to {fixed}" in out
    assert "only 3 measured pairs finished" in out and "measure next: an all-pairs probe" in out


def test_all_hung_and_uniform_slowness_are_stated(tmp_path, capsys):
    topo = next(iter(dsl.load("examples/torus5x5.ccl").topologies.values()))
    t = probe_timings(topo, (), noise=0.05, seed=1)
    hung = tmp_path / "hung.csv"
    hung.write_text(to_pairs_csv(make_timings(t.src, t.dst, t.nbytes, np.full(len(t), np.inf))))
    fixed = tmp_path / "fixed.ccl"
    rc, out = _run(capsys, hung, "--topology", "examples/torus5x5.ccl", "--patch", fixed)
    assert rc == 1 and not fixed.exists()
    assert "finding: all 600 measured pairs never finished" in out and "suspect" not in out
    slow = tmp_path / "slow.csv"
    slow.write_text(to_pairs_csv(make_timings(t.src, t.dst, t.nbytes, t.seconds * 1500)))
    rc, out = _run(capsys, slow, "--topology", "examples/torus5x5.ccl")
    assert rc == 1 and "finding: the pairs are slow alike: the median pair took 1,500x" in out
    assert "suspect" not in out


def test_a_suspect_below_the_confidence_gets_no_fault_statement(tmp_path, capsys):
    # two slow pairs over the link (0,0)->(0,1) and into rank 1, a third slow pair over both,
    # and one healthy pair over each: link and receiver explain them about equally
    pairs = [(0, 1), (4, 1), (9, 1), (5, 2), (6, 1), (12, 13), (17, 18), (22, 23), (7, 8),
             (13, 14), (18, 19), (23, 24)]
    rng = np.random.default_rng(0)
    secs = (1 << 20) / 32e9 * np.exp(rng.normal(0.0, 0.02, len(pairs)))
    secs[:3] *= 2
    probe = tmp_path / "p.csv"
    probe.write_text("src,dst,bytes,seconds\n" + "".join(
        f"{a},{b},{1 << 20},{x!r}\n" for (a, b), x in zip(pairs, secs.tolist(), strict=True)))
    fixed = tmp_path / "fixed.ccl"
    rc, out = _run(capsys, probe, "--topology", "examples/torus5x5.ccl", "--pairwise",
                   "--patch", fixed)
    assert rc == 1 and "suspect 1: link (0,0)->(0,1)" in out
    assert "below the 0.95 a fault statement needs" in out and "measure next: 0 -> 2" in out
    assert "no fault statement: no suspect reaches confidence 0.95" in out
    assert f"nothing written to {fixed}" in out and not fixed.exists()
    # a lower bar, stated on the command line, writes it
    rc, out = _run(capsys, probe, "--topology", "examples/torus5x5.ccl", "--pairwise",
                   "--patch", fixed, "--min-confidence", "0.5")
    assert "fault statements (suspects with confidence >= 0.5" in out
    assert "fault link (0,0) -> (0,1)" in fixed.read_text()


def test_the_patch_goes_through_the_writer(tmp_path, capsys):
    """--faults and --patch are written like every file of cclc: listed in the folder's
    manifest, and a file cclc did not write is replaced only with --force (neither is
    written when one is refused)."""
    from cclc.outdir import OutputDir

    probe = ("examples/probe_torus5x5.csv", "--topology", "examples/torus5x5.ccl")
    fixed, faults = tmp_path / "fixed.ccl", tmp_path / "faults.txt"
    fixed.write_text("the user's\n")
    rc, out = _run(capsys, *probe, "--faults", faults, "--patch", fixed)
    assert rc == 2 and fixed.read_text() == "the user's\n" and not faults.exists()
    rc, out = _run(capsys, *probe, "--faults", faults, "--patch", fixed, "--force")
    assert rc == 1 and f"wrote {fixed}" in out
    assert "fault link (1,1) -> (1,2)" in fixed.read_text()
    assert faults.read_text().endswith("\nfault link (1,1) -> (1,2)\n")
    assert OutputDir(tmp_path).files() == ("faults.txt", "fixed.ccl")
    # what cclc wrote it may replace without --force
    rc, out = _run(capsys, *probe, "--patch", fixed)
    assert rc == 1 and f"wrote {fixed}" in out
