"""Reading timings: the three formats agree, repeated pairs add up, bad input says where."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cclc import cli
from cclc.diagnose.pair_timings import TimingsError
from cclc.diagnose.timings import parse_timings, to_pairs_csv


def test_pairs_csv_merges_repeats_and_hangs():
    t = parse_timings("src,dst,bytes,seconds\n0,1,100,1.0\n0,1,300,2.0\n1,0,10,inf\n"
                      "2,2,5,1\n", "p.csv")
    assert t.src.tolist() == [0, 1] and t.dst.tolist() == [1, 0]
    assert t.nbytes.tolist() == [400.0, 10.0]
    assert t.seconds[0] == 3.0 and math.isinf(t.seconds[1])


def test_matrix_and_json_match_pairs_csv():
    m = np.array([[0, 1.0, 2.0], [3.0, 0, 4.0], [5.0, 6.0, 0]])
    text = "\n".join(",".join(str(float(x)) for x in row) for row in m)
    a = parse_timings(text, "m.csv")
    records = [{"rank": i, "peer": j, "dir": "send", "bytes": 1, "seconds": m[i, j]}
               for i in range(3) for j in range(3) if i != j]
    # the receiving side of 0 -> 1 saw it take longer: the slower side is kept
    records.append({"rank": 1, "peer": 0, "dir": "recv", "bytes": 1, "seconds": 9.0})
    b = parse_timings(json.dumps({"format": "cclc-peer-timings", "version": 1,
                                  "records": records}), "t.json")
    c = parse_timings(to_pairs_csv(a), "again.csv")
    assert a.src.tolist() == b.src.tolist() == c.src.tolist()
    expect = [m[i, j] for i in range(3) for j in range(3) if i != j]
    assert a.seconds.tolist() == c.seconds.tolist() == expect
    assert b.seconds.tolist() == [9.0] + expect[1:]


@pytest.mark.parametrize("text, line, col, what", [
    ("src,dst,bytes,seconds\n0,1,100,fast\n", 2, 9, "expected a number for seconds"),
    ("src,dst,bytes,seconds\n0,x,100,1\n", 2, 3, "expected a rank id"),
    ("src,dst,bytes,seconds\n0,1,100\n", 2, 1, "expected 4 cells"),
    ("1,2\n3\n", 2, 1, "needs 2 numbers per row"),
    ("0,1\n-1,0\n", 2, 1, "must be a number >= 0"),
    ('{"format": "other"}', 1, 1, "cclc-peer-timings"),
    ("src,dst,bytes,seconds\n0,1,100,1\n1,0,100,0\n", 3, 9, "seconds must be > 0, got"),
    ("src,dst,bytes,seconds\n0,1,100,0.0\n", 2, 9, "a transfer that never finished is 'inf'"),
    ("0,1\n0,0\n", 2, 1, "the time of 1 -> 0 must be > 0, got"),
])
def test_bad_timings_name_the_place(text, line, col, what):
    with pytest.raises(TimingsError) as err:
        parse_timings(text, "bad.csv")
    assert what in err.value.message
    assert (err.value.span.line, err.value.span.col) == (line, col)


def test_cli_bad_timings_exit_2_with_caret(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("src,dst,bytes,seconds\n0,1,100,fast\n")
    rc = cli.main(["diagnose", str(bad), "--topology", "examples/torus5x5.ccl"])
    err = capsys.readouterr().err
    assert rc == 2
    assert f"{bad}:2:9: error: expected a number for seconds" in err
    assert "^" in err and "Traceback" not in err


def test_cli_rank_outside_topology(tmp_path, capsys):
    bad = tmp_path / "t.csv"
    bad.write_text("src,dst,bytes,seconds\n0,99,100,1\n")
    assert cli.main(["diagnose", str(bad), "--topology", "examples/torus5x5.ccl"]) == 2
    assert "names a rank that 'torus' does not have" in capsys.readouterr().err


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 6), st.integers(1, 10**9),
                          st.one_of(st.floats(0, 1e3, exclude_min=True), st.just(math.inf))),
                min_size=1, max_size=40))
def test_pairs_csv_round_trip_sums_like_numpy(rows):
    text = "src,dst,bytes,seconds\n" + "".join(f"{s},{d},{b},{x!r}\n" for s, d, b, x in rows)
    t = parse_timings(text, "r.csv")
    assert len(t) == len({(s, d) for s, d, _, _ in rows if s != d})
    if len(t):
        again = parse_timings(to_pairs_csv(t), "again.csv")
        assert again.seconds.tolist() == t.seconds.tolist()
    for k, (s, d) in enumerate(zip(t.src.tolist(), t.dst.tolist(), strict=True)):
        mine = [(b, x) for ss, dd, b, x in rows if (ss, dd) == (s, d)]
        assert t.nbytes[k] == sum(b for b, _ in mine)
        secs = np.array([x for _, x in mine])
        expect = np.inf if np.isinf(secs).any() else secs.sum()
        assert t.seconds[k] == pytest.approx(expect)


@pytest.mark.parametrize("text, message", [
    ('{"format": "cclc-peer-timings", "pad": ' + "9" * 100_000 + "}", "a number too large"),
    ('{"a": ' + "[" * 100_000, "nested too deeply")], ids=["huge number", "deep nesting"])
def test_json_that_python_cannot_read_is_a_timings_error(text, message):
    with pytest.raises(TimingsError, match=message):
        parse_timings(text, "t.json")


@pytest.mark.parametrize("data", [bytes(range(256)), b"src,dst,bytes,seconds\n0,1,8,\xff\n"])
def test_cli_binary_timings_exit_2_naming_the_file(tmp_path, capsys, data):
    binary = tmp_path / "probe.bin"
    binary.write_bytes(data)
    rc = cli.main(["diagnose", str(binary), "--topology", "examples/torus5x5.ccl"])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err
    assert err.startswith(f"{binary}:")
    assert "not a text file" in err and "expected timings as text" in err
    # a second file (the plugin's one per rank) and the --hosts file are read the same way
    good = tmp_path / "ok.csv"
    good.write_text("src,dst,bytes,seconds\n0,1,8,1\n")
    assert cli.main(["diagnose", str(good), str(binary), "--topology",
                     "examples/torus5x5.ccl"]) == 2
    assert "not a text file" in capsys.readouterr().err


def test_zero_seconds_in_json_is_refused():
    doc = {"format": "cclc-peer-timings", "version": 1,
           "records": [{"rank": 0, "peer": 1, "dir": "send", "bytes": 8, "seconds": 0.0}]}
    with pytest.raises(TimingsError, match="record 0 is out of range"):
        parse_timings(json.dumps(doc), "t.json")


def test_cli_zero_seconds_names_file_and_line(tmp_path, capsys):
    probe = tmp_path / "zero.csv"
    probe.write_text("src,dst,bytes,seconds\n0,1,1048576,0.001\n1,2,1048576,0\n")
    assert cli.main(["diagnose", str(probe), "--topology", "examples/torus5x5.ccl"]) == 2
    err = capsys.readouterr().err
    assert f"{probe}:3:13: error: seconds must be > 0, got" in err and "Traceback" not in err
