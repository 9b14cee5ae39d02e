"""What a user can throw at the command line gets a clear error and an exit code, never a
traceback, and nothing that is not cclc's own is overwritten."""

from __future__ import annotations

import json
import os

from cclc.cli import main
from cclc.errors import CclError, Span, render_error

ONE_RANK = """topology t = torus(1) { link 1 GB/s, 1 us }
collective g = allgather on t { size 4 KiB }
collective r = allreduce on t { size 4 KiB }
"""

SMALL = """topology t = torus(3, 3) { link 10 GB/s, 100 ns }
collective a2a = alltoall on t { size 36 KiB }
"""


def _compile(tmp_path, text, *extra):
    src = tmp_path / "x.ccl"
    src.write_text(text)
    out = tmp_path / "out"
    return main(["compile", str(src), "-o", str(out), *extra]), out


def test_a_one_rank_group_compiles(tmp_path):
    code, out = _compile(tmp_path, ONE_RANK)
    assert code == 0
    assert (out / "g.schedule.json").exists() and (out / "r.schedule.json").exists()


def test_an_unusable_output_path_is_an_error_not_a_traceback(tmp_path, capsys):
    src = tmp_path / "x.ccl"
    src.write_text(SMALL)
    code = main(["compile", str(src), "-o", str(tmp_path / ("x" * 300))])
    assert code == 2
    assert "error: cannot use" in capsys.readouterr().err


def test_non_regular_and_foreign_files(tmp_path, capsys):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    assert main(["check", str(fifo)]) == 2  # would block forever if it were read
    assert "not a regular file" in capsys.readouterr().err
    code, out = _compile(tmp_path, SMALL)
    assert code == 0
    schedule = out / "a2a.schedule.json"
    assert main(["check", str(schedule)]) == 2
    assert "JSON document written by cclc" in capsys.readouterr().err
    assert main(["viz", str(schedule), "-o", str(fifo), "--force"]) == 2
    assert fifo.exists() and not fifo.is_file()


def test_sim_and_viz_refuse_a_schedule_that_fails_verification(tmp_path, capsys):
    code, out = _compile(tmp_path, SMALL)
    assert code == 0
    doc = json.loads((out / "a2a.schedule.json").read_text())
    for col in doc["ops"]:
        doc["ops"][col] = doc["ops"][col][1:]  # drop op 0
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(doc))
    assert main(["sim", str(broken)]) == 1
    assert "fails verification" in capsys.readouterr().err
    assert main(["viz", str(broken), "-o", str(tmp_path / "b.html")]) == 1
    assert not (tmp_path / "b.html").exists()


def test_malformed_numbers_in_a_schedule_are_rejected_at_load(tmp_path, capsys):
    code, out = _compile(tmp_path, SMALL)
    doc = json.loads((out / "a2a.schedule.json").read_text())
    for change, message in ((("ops", "step", -3), "must be >= 0"),
                            (("ops", "step", 10**9), "without long gaps"),
                            (("topology", "bandwidth", 0.0), "bandwidth must be > 0")):
        d = json.loads(json.dumps(doc))
        where, key, value = change
        if where == "ops":
            d["ops"][key][0] = value
        else:
            d["topology"]["links"][key][0] = value
        path = tmp_path / "m.json"
        path.write_text(json.dumps(d))
        assert main(["sim", str(path)]) == 2
        assert message in capsys.readouterr().err


def test_a_very_long_source_line_is_shown_as_a_window():
    line = "x" * 5000 + "BAD" + "y" * 5000
    err = CclError("here", Span("f.ccl", 1, 5001, 1, 5004))
    text = render_error(err, line)
    shown, caret = text.splitlines()[1:]
    assert len(shown) < 200
    assert shown[caret.index("^"):caret.index("^") + 3] == "BAD"
