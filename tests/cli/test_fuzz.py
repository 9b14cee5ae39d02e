"""Fuzzing the command line: malformed .ccl files and schedule documents never escape as a
traceback; every run ends with exit status 0, 1 or 2.

The budget is fixed (``CCLC_FUZZ_EXAMPLES`` examples per test, 30 by default, seeded so a CI
run is reproducible); set ``CCLC_FUZZ_EXAMPLES=2000`` to search longer on a workstation.
The .ccl inputs are the shipped examples cut, repeated and with numbers swapped for hostile
ones, plus token soup drawn from the grammar's vocabulary; the schedule documents are one
small compiled schedule truncated, with values of other types, huge, negative, NaN and
infinite numbers, and deep nesting spliced in.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cclc.cli import main

#: hypothesis's budget takes minutes: the slow tier
pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
BUDGET = int(os.environ.get("CCLC_FUZZ_EXAMPLES", "30"))
FUZZ = settings(max_examples=BUDGET, deadline=None, derandomize=BUDGET <= 30,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                       HealthCheck.data_too_large])

#: the grammar's vocabulary (dsl/ccl.lark): keywords, shapes, units, punctuation
TOKENS = ["topology", "collective", "node", "torus", "mesh", "fabric", "leaf_spine", "nvswitch",
          "pcie", "link", "nic", "ports", "gpus", "nodes", "rails", "leaves", "spines",
          "oversubscription", "wrap", "on", "off", "dim", "fault", "rank", "group", "size",
          "sizes", "dtype", "algorithm", "schedule", "op", "root", "allreduce", "alltoall",
          "allgather", "reducescatter", "broadcast", "reduce", "auto", "ring", "direct", "pat",
          "mate", "halfring", "pipeline", "chunks", "buffer", "x", "t", "a", "cluster", "rail",
          "leaders", "ranks", "leaf", "spine", "=", "{", "}", "(", ")", "[", "]", ",", ";", ":",
          ".", "--", "->", "\n", "#", '"x.csv"', "GB/s", "Gb/s", "B/s", "ns", "us", "s", "MiB",
          "KiB", "B", "GiB", "bf16", "fp32", "sum", "max"]
#: numbers a user (or a fuzzer) may type
NUMBERS = ["0", "1", "2", "3", "4", "-1", "-0", "0.5", "1e-300", "1e300", "1e999", "nan",
           "inf", "1" + "0" * 30, "２", "１６", "4.", ".5", "2e", "07", "65", "1048577"]

SOURCES = {p.name: p.read_text() for p in sorted(EXAMPLES.glob("*.ccl"))}


def _run(argv: list[str], capsys) -> None:
    code = main(argv)      # any exception other than SystemExit(2) from argparse fails here
    err = capsys.readouterr().err
    assert code in (0, 1, 2), (argv, code, err)
    assert "Traceback" not in err, err


@st.composite
def mutated_sources(draw) -> str:
    text = SOURCES[draw(st.sampled_from(sorted(SOURCES)))]
    for _ in range(draw(st.integers(1, 4))):
        how = draw(st.sampled_from(["cut", "repeat", "number", "token"]))
        i = draw(st.integers(0, len(text)))
        j = draw(st.integers(i, min(len(text), i + 40)))
        if how == "cut":
            text = text[:i] + text[j:]
        elif how == "repeat":
            text = text[:j] + text[i:j] + text[j:]
        elif how == "number":
            text = text[:i] + draw(st.sampled_from(NUMBERS)) + text[j:]
        else:
            text = text[:i] + " " + draw(st.sampled_from(TOKENS)) + " " + text[i:]
    return text


token_soup = st.lists(st.one_of(st.sampled_from(TOKENS), st.sampled_from(NUMBERS)),
                      max_size=40).map(" ".join)


@FUZZ
@given(text=st.one_of(mutated_sources(), token_soup))
def test_malformed_ccl_never_escapes(tmp_path, capsys, text):
    src = tmp_path / "f.ccl"
    src.write_text(text, encoding="utf-8")
    for csv in EXAMPLES.glob("*.csv"):
        (tmp_path / csv.name).write_text(csv.read_text())
    _run(["check", str(src)], capsys)
    # compiling small inputs exercises elaboration and planning too; the size estimate keeps
    # huge ones from running for long
    _run(["compile", str(src), "-o", str(tmp_path / "out"), "--force"], capsys)


@pytest.fixture(scope="module")
def schedule_doc(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("fuzz")
    src = folder / "s.ccl"
    src.write_text("topology t = torus(3, 3) { link 10 GB/s, 100 ns\n"
                   "  fault link (0,0) -- (0,1) }\n"
                   "collective a = allreduce on t { size 36 KiB }\n")
    assert main(["compile", str(src), "-o", str(folder / "out")]) == 0
    return json.loads((folder / "out" / "a.schedule.json").read_text())


def _paths(doc, prefix=()):
    """Every place in ``doc`` (keys, and the first items of lists)."""
    yield prefix
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc[:2]):
            yield from _paths(v, prefix + (i,))


HOSTILE = [None, True, "x", "", [], {}, [[1]], -1, 0, 2**31, 2**62, 10**30, -10**30, 1.5,
           float("nan"), float("inf"), -float("inf"), 1e308, 1e-300, [None], {"a": 1}]


def _deep(depth: int):
    v: list = []
    for _ in range(depth):
        v = [v]
    return v


@FUZZ
@given(data=st.data())
def test_mutated_schedule_documents_never_escape(tmp_path, capsys, schedule_doc, data):
    doc = json.loads(json.dumps(schedule_doc))
    paths = [p for p in _paths(doc) if p]
    how = data.draw(st.sampled_from(["replace", "delete", "truncate", "deep"]))
    if how == "truncate":
        text = json.dumps(doc)
        text = text[:data.draw(st.integers(0, len(text) - 1))]
    else:
        path = data.draw(st.sampled_from(paths))
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        if how == "delete":
            del parent[path[-1]]
        elif how == "deep":
            parent[path[-1]] = _deep(data.draw(st.sampled_from([50, 900])))
        else:
            parent[path[-1]] = data.draw(st.sampled_from(HOSTILE))
        text = json.dumps(doc)     # NaN and Infinity are written as JavaScript spells them
    f = tmp_path / "m.json"
    f.write_text(text)
    _run(["verify", str(f)], capsys)
    _run(["sim", str(f)], capsys)
    _run(["viz", str(f), "-o", str(tmp_path / "m.html"), "--force"], capsys)


def test_a_document_nested_a_hundred_thousand_deep_is_refused(tmp_path, capsys):
    f = tmp_path / "deep.json"
    f.write_text("[" * 100_000)
    for argv in (["verify", str(f)], ["sim", str(f)], ["viz", str(f), "-o", str(tmp_path / "d")]):
        assert main(argv) == 2
        assert "nests lists or objects too deeply" in capsys.readouterr().err
