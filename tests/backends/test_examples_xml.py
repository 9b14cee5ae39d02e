"""Every example collective small enough to execute on the CPU: compiled (dsl -> plan), lowered
to XML for every runtime, and run by the independent executor. A schedule that does not fit a
runtime must fail at compile time with the runtime's limit named."""

from __future__ import annotations

import pathlib

import pytest

from backends.common import EmitOptions
from backends.msccl import render_xml
from backends.msccl.executor import execute
from backends.msccl.lower import LimitError
from cclc.errors import ScheduleError

EXAMPLES = sorted((pathlib.Path(__file__).parents[2] / "examples").glob("*.ccl"))
#: the executor keeps a vector clock per threadblock: fine for thousands of ops, not millions
MAX_OPS = 6000


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_xml_runs_in_the_executor(path):
    import dsl
    from cclc.plan import plan

    program = dsl.load(str(path))
    ran = 0
    for coll in program.collectives:
        schedule = plan(coll).schedule
        if len(schedule.ops) > MAX_OPS:
            continue
        for runtime in ("msccl", "msccl-executor", "rccl"):
            try:
                xml = render_xml(schedule, EmitOptions(msccl_runtime=runtime))
            except LimitError as err:
                assert "allows" in err.message or "address" in err.message or "fits" in \
                    err.message
                continue
            except ScheduleError as err:
                assert "non-uniform alltoall" in err.message, err.message
                continue
            execute(xml, op=coll.op.value, root=coll.root or 0)
            ran += 1
    if not ran:
        pytest.skip(f"no collective of {path.name} is small enough for the executor or fits")
