"""Every example, compiled as a user would (``cclc compile EX --emit json,mscclpp``), exits 0
and writes MSCCL++ plans for every collective MSCCL++ can express (in-place and not; LL ones too
inside one server); each plan stays inside the executor's limits and runs correctly in the
independent executor. A collective MSCCL++ cannot run is skipped with
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
#: the executor keeps a vector clock per threadblock and per port channel's proxy (an int16
#: per actor, per actor) and a clock per reader per buffer element: past this many actors a
#: plan runs with chunks of 16 bytes (the least its 16-byte buffer_alignment allows) to keep
#: the elements few. hgx16_leafspine's 128-rank allreduce has 16,000 threadblocks (a 522k-op
#: schedule, a million plan operations cut into blocks of 64): 3.7 GB and about two minutes
LARGE_ACTORS = 3000
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
            run(doc, seeds=1, chunk_bytes=16 if _actors(doc) > LARGE_ACTORS else 64)
            del doc  # the largest plans take GBs in the executor: one at a time
