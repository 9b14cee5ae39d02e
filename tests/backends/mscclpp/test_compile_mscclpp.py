"""``cclc compile --emit json,mscclpp`` writes both plans of every collective, and a collective
MSCCL++ cannot express is skipped with a note naming it (exit 0), not a traceback."""

from __future__ import annotations

import json

from backends.mscclpp.executor import run
from cclc.cli import main

SOURCE = """
node box = nvswitch(gpus = 4) { link 450 GB/s, 1 us }
topology one = node(box)
collective ar = allreduce on one { size 1 MiB; dtype fp32 }
collective ag = allgather on one { size 256 KiB; algorithm ring }
collective top = allreduce on one { size 1 MiB; op max }
"""


def test_compile_writes_plans_and_names_what_mscclpp_refuses(tmp_path, capsys):
    src = tmp_path / "box.ccl"
    src.write_text(SOURCE)
    out = tmp_path / "out"
    rc = main(["compile", str(src), "-o", str(out), "--emit", "json,mscclpp"])
    err = capsys.readouterr().err
    assert rc == 0 and "Traceback" not in err
    assert ("collective 'top': no mscclpp output, its format cannot express this collective: "
            "MSCCL++'s executor sums every reduction") in err
    for name in ("ar", "ag"):
        for inplace, file in ((False, f"{name}.mscclpp.json"),
                              (True, f"{name}.inplace.mscclpp.json"),
                              (False, f"{name}.ll.mscclpp.json"),
                              (True, f"{name}.ll.inplace.mscclpp.json")):
            plan = json.loads((out / file).read_text())
            assert plan["inplace"] is inplace
            run(plan, seeds=2)
    assert not (out / "top.mscclpp.json").exists()


def test_a_schedule_over_the_op_cap_gets_its_other_outputs_and_the_reason(tmp_path, capsys,
                                                                          monkeypatch):
    # (the cap lowered below the collective's every schedule: a 4,096-GPU alltoall's 16.7M
    # ops against the real one)
    import importlib
    monkeypatch.setattr(importlib.import_module("backends.mscclpp.lower"), "MAX_OPS", 3)
    src = tmp_path / "box.ccl"
    src.write_text(SOURCE)
    out = tmp_path / "out"
    rc = main(["compile", str(src), "-o", str(out), "--emit", "json,mscclpp", "--only", "ar"])
    err = capsys.readouterr().err
    assert rc != 0 and "Traceback" not in err
    assert "collective 'ar': no mscclpp output: its " in err
    assert "ops are over the 3 cclc lowers into an MSCCL++ plan" in err
    assert json.loads((out / "ar.schedule.json").read_text())["collective"]["name"] == "ar"
    assert not (out / "ar.mscclpp.json").exists()
