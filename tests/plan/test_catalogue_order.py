"""The planner breaks ties between equally fast schedules by the catalogue's order, so that
order must not depend on which algorithm module a program happened to import first (a test
module importing ``synth_flows`` once made ``synth`` win ``direct``'s ties)."""

from __future__ import annotations

import subprocess
import sys

import pytest

_PRINT = "from cclc.algorithms import REGISTRY; print(' '.join(REGISTRY))"


def _order(first_import: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", f"{first_import}\n{_PRINT}"],
                         capture_output=True, text=True, check=True)
    return out.stdout.split()


@pytest.mark.slow
@pytest.mark.parametrize("first", ["from cclc.algorithms import synth_flows",
                                   "import cclc.algorithms.synth_trees",
                                   "import cclc.algorithms.torus_alltoall",
                                   "import cclc.plan"])
def test_catalogue_order_does_not_depend_on_the_first_import(first):
    reference = _order("import cclc.algorithms")
    assert reference.index("direct") < reference.index("synth")
    assert _order(first) == reference
