"""``cclc verify``: exit status 0 / 1 / 2 and what it prints."""

from __future__ import annotations

import argparse
import json

import pytest
from ir_builders import K, build, coll

from cclc.commands import verify as command
from cclc.errors import CclError, render_error
from cclc.serialize import save, to_json


def run_cli(argv, capsys):
    """The command as cclc.cli runs it: CclError is rendered and exits 2."""
    parser = argparse.ArgumentParser(prog="cclc")
    command.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    try:
        rc = args.run(args)
    except CclError as err:
        print(render_error(err), file=__import__("sys").stderr)
        rc = 2
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_ok(tmp_path, capsys):
    p = tmp_path / "a2a.schedule.json"
    save(build(coll(K.ALLTOALL)), p)
    rc, out, err = run_cli(["verify", str(p)], capsys)
    assert (rc, out, err) == (0, "ok: alltoall: 16 ops, 2 steps, verified\n", "")
    rc, out, _ = run_cli(["verify", "--numeric", str(p)], capsys)
    assert (rc, out) == (0, "ok: alltoall: 16 ops, 2 steps, verified and checked numerically\n")


def test_failure_exits_1_with_the_reason(tmp_path, capsys):
    d = to_json(build(coll(K.ALLREDUCE)))
    for col in d["ops"].values():
        del col[5]
    p = tmp_path / "ar.json"
    p.write_text(json.dumps(d))
    rc, out, err = run_cli(["verify", str(p)], capsys)
    assert rc == 1 and out == ""
    assert err.startswith(f"{p}: verification failed: rank 1 at (1): output chunk 0")
    assert "(missing the contribution of rank(s) {2})" in err


@pytest.mark.parametrize("text, words", [
    (None, "cannot read"),
    ("not json", "is not valid JSON"),
    ('{"format": "cclc-schedule", "version": 1}', "missing key 'topology'"),
])
def test_bad_files_exit_2(tmp_path, capsys, text, words):
    p = tmp_path / "x.json"
    if text is not None:
        p.write_text(text)
    rc, out, err = run_cli(["verify", str(p)], capsys)
    assert rc == 2 and out == "" and err.startswith("error: ") and words in err


def test_help_has_an_example(capsys):
    with pytest.raises(SystemExit):
        run_cli(["verify", "--help"], capsys)
    assert "cclc verify out/a2a.schedule.json" in capsys.readouterr().out
