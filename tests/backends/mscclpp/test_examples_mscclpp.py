"""Every example collective, planned as ``cclc compile --emit mscclpp`` plans it (under the
``mscclpp`` execution model, skipping schedules the backend refuses) and lowered to its MSCCL++
plans (in-place and not; LL ones too inside one server): each plan stays inside the executor's
limits and, when small enough, runs correctly in the independent executor; a collective
MSCCL++ cannot run is refused with the reason.

Planning the largest examples takes minutes (hgx16_leafspine about 7, the tpuv4 ones about 4,
torus5x5x5 about 2 on one core); they run with ``CCLC_SLOW_TESTS=1``."""

from __future__ import annotations

import os
import pathlib
import re

import pytest
from plan_checks import check_limits

from backends import load
from backends.contract import EmitOptions
from backends.mscclpp import render_plans
from backends.mscclpp.executor import run
from cclc.errors import ScheduleError
from cclc.execution import MSCCLPP_MODEL

EXAMPLES = sorted((pathlib.Path(__file__).parents[3] / "examples").glob("*.ccl"))
SLOW = os.environ.get("CCLC_SLOW_TESTS") == "1"
SLOW_EXAMPLES = {"hgx16_leafspine", "tpuv4_4x4x4_ocs", "tpuv4_8x4x4", "torus5x5x5"}
#: the executor keeps a vector clock per threadblock and proxy and checks every element it
#: moves: plans of schedules up to this many ops run in seconds (up to ``MANY_OPS`` in several
#: interleavings), larger ones (hgx16's 190k-op allreduce) would take hours
MANY_OPS = 1500
MAX_OPS = 4000
#: what MSCCL++ cannot run, in the words the backend uses
REFUSED = re.compile(r"no (broadcast|reduce) collective|sums every reduction|non-uniform "
                     r"alltoall|equal chunks")


@pytest.mark.slow  # plans and runs every example's plans: a minute or more
@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_plans(path):
    import dsl
    from cclc.plan import plan

    if path.stem in SLOW_EXAMPLES and not SLOW:
        pytest.skip("planning this example takes minutes; run with CCLC_SLOW_TESTS=1")
    backend = load("mscclpp")
    options = EmitOptions()
    program = dsl.load(str(path))
    ran = []
    for coll in program.collectives:
        chosen = plan(coll, model=MSCCLPP_MODEL,
                      refusal=lambda s: backend.refusal(s, options))
        schedule = chosen.schedule
        try:
            plans = render_plans(schedule, options)
        except ScheduleError as err:
            assert REFUSED.search(err.message), err.message
            continue
        for doc in plans.values():
            check_limits(doc)
            if len(schedule.ops) <= MAX_OPS:
                run(doc, seeds=2 if len(schedule.ops) <= MANY_OPS else 1)
                ran.append(coll.name)
    if not ran:
        pytest.skip(f"no collective of {path.name} is small enough for the executor "
                    f"(over {MAX_OPS} ops) or MSCCL++ runs none of them")
