"""Every example collective, compiled (dsl -> plan) and lowered to XML for every runtime: the
XML is within every limit the runtime's loader checks (counted here from the XML text, see
``test_msccl_runtimes.assert_loads``), or the lowering refuses it with a message naming the
limit and its source. Collectives small enough also run in the independent executor.

Lowering the few largest schedules (hundreds of thousands of ops) takes minutes each; they are
checked in the slow tier (``pytest -m slow``)."""

from __future__ import annotations

import pathlib
import re

import pytest
from test_msccl_runtimes import assert_loads

from backends.common import EmitOptions
from backends.msccl import render_xml
from backends.msccl.executor import execute
from backends.msccl.lower import LimitError
from cclc.errors import ScheduleError

EXAMPLES = sorted((pathlib.Path(__file__).parents[2] / "examples").glob("*.ccl"))
#: the executor keeps a vector clock per threadblock: fine for thousands of ops, not millions
MAX_OPS = 6000
#: above this the lowering takes minutes (plain Python): such collectives are the slow tier's
SLOW_OPS = 16_000
CITED = re.compile(r"in (microsoft/msccl|Azure/msccl-executor-nccl|ROCm/rccl) \S+ @ [0-9a-f]{7}")


@pytest.mark.slow  # plans every example: minutes
@pytest.mark.parametrize("path, large", [
    *(pytest.param(p, False, id=p.stem) for p in EXAMPLES),
    *(pytest.param(p, True, id=f"{p.stem}-large", marks=pytest.mark.slow) for p in EXAMPLES)])
def test_example_xml_loads_under_every_runtime(path, large):
    import dsl
    from cclc.plan import plan

    program = dsl.load(str(path))
    ran = 0
    for coll in program.collectives:
        schedule = plan(coll).schedule
        if (len(schedule.ops) > SLOW_OPS) != large:
            continue
        for runtime in ("msccl", "msccl-executor", "rccl"):
            try:
                xml = render_xml(schedule, EmitOptions(msccl_runtime=runtime))
            except LimitError as err:
                assert CITED.search(err.message), err.message
                continue
            except ScheduleError as err:
                assert "non-uniform alltoall" in err.message, err.message
                continue
            assert_loads(xml, runtime)
            if len(schedule.ops) <= MAX_OPS:
                execute(xml, op=coll.op.value, root=coll.root or 0)
            ran += 1
    if not ran:
        pytest.skip(f"no {'large ' if large else ''}collective of {path.name} fits a runtime"
                    + ("" if large else f" with at most {SLOW_OPS} ops (the slow tier lowers "
                                        "the larger ones)"))
