"""``cclc compile --synth-budget`` and the report line of a synthesized schedule."""

from __future__ import annotations

import json

import pytest

from cclc import cli

SOURCE = """
topology t = torus(3, 3, 3) {
    link 32 GB/s, 100 ns
    fault link (0,0,0) -- (1,0,0)
}
collective a2a = alltoall on t { size 27 MiB; algorithm ALGO }
"""


@pytest.fixture
def run_cli(monkeypatch, capsys):
    monkeypatch.setattr(cli, "COMMANDS", ["compile"])

    def run(*argv):
        code = cli.main([str(a) for a in argv])
        out, err = capsys.readouterr()
        return code, out, err
    return run


@pytest.mark.slow
def test_synth_reports_status_solver_and_lp_fraction(tmp_path, run_cli):
    src = tmp_path / "t.ccl"
    src.write_text(SOURCE.replace("ALGO", "synth"))
    code, out, err = run_cli("compile", src, "-o", tmp_path / "out", "--synth-budget", "120")
    assert code == 0, err
    line = next(x for x in out.splitlines() if x.strip().startswith("synth: status"))
    assert "solver pdlp" in line and "of the LP rate" in line
    doc = json.loads((tmp_path / "out" / "a2a.schedule.json").read_text())
    assert doc["algorithm"] == "synth"


@pytest.mark.parametrize("value", ["0", "-3", "soon"])
def test_bad_budget_is_a_usage_error(tmp_path, run_cli, value):
    src = tmp_path / "t.ccl"
    src.write_text(SOURCE.replace("ALGO", "synth"))
    with pytest.raises(SystemExit) as exc:
        run_cli("compile", src, "-o", tmp_path / "out", "--synth-budget", value)
    assert exc.value.code == 2
