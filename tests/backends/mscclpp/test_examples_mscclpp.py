"""Every example, compiled as a user would (``cclc compile EX --emit json,mscclpp``), exits 0
and writes MSCCL++ plans for every collective MSCCL++ can express (in-place and not; LL ones too
inside one server); each plan stays inside the executor's limits and, when the independent
executor can hold it, runs correctly there. A collective MSCCL++ cannot run is skipped with
the reason on stderr.

Compiling the largest examples takes minutes (hgx16_leafspine, the tpuv4 ones, torus5x5x5):
the whole module is in the slow tier."""

from __future__ import annotations

import json
import pathlib
import re

import pytest
from plan_checks import check_limits

from backends.mscclpp.executor import run
from cclc.cli import main

EXAMPLES = sorted((pathlib.Path(__file__).parents[3] / "examples").glob("*.ccl"))
#: the executor keeps a vector clock per threadblock and per port channel's proxy (one int64
#: per actor, per actor): plans up to this many actors take at most a few hundred MB there.
#: hgx16_leafspine's 128-rank allreduce has 16,000 threadblocks (a 522k-op schedule, a million
#: plan operations cut into blocks of 64) and its reducescatter 10,624, far past it: those
#: plans get the limit checks only
MAX_ACTORS = 3000
#: what MSCCL++ cannot run, in the words the backend uses
REFUSED = re.compile(r"no (broadcast|reduce) collective|sums every reduction|non-uniform "
                     r"alltoall|equal chunks")


def _actors(plan: dict) -> int:
    return sum(len(g["threadblocks"]) + sum(len(c.get("connected_to", ()))
                                            for c in g["channels"]
                                            if c["channel_type"] == "port")
               for g in plan["gpus"])


@pytest.mark.slow  # compiles every example: minutes for the largest
@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_plans(path, tmp_path, capsys):
    import dsl

    out = tmp_path / "out"
    assert main(["compile", str(path), "-o", str(out), "--emit", "json,mscclpp"]) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err
    for coll in dsl.load(str(path)).collectives:
        plans = sorted(out.glob(f"{coll.name}*.mscclpp.json"))
        if not plans:
            note = next(line for line in err.splitlines()
                        if f"collective '{coll.name}': no mscclpp output" in line)
            assert REFUSED.search(note), note
            continue
        assert {p.name for p in plans} >= {f"{coll.name}.mscclpp.json",
                                           f"{coll.name}.inplace.mscclpp.json"}
        for file in plans:
            doc = json.loads(file.read_text())
            check_limits(doc)
            if _actors(doc) <= MAX_ACTORS:
                run(doc, seeds=1)
