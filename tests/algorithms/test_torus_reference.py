"""The torus AllToAll builder reproduces the schedules of the single-module builder exactly
(ops columns, routes, layouts, parameters), kept as reference data for small tori with and
without failed links, uniform and non-uniform."""

from __future__ import annotations

import numpy as np
import pytest
from torus_reference_cases import (
    CASES,
    DATA,
    build_case,
    case_name,
    schedule_arrays,
)


@pytest.fixture(scope="module")
def reference():
    with np.load(DATA) as z:
        return {k: z[k] for k in z.files}


@pytest.mark.parametrize("i", range(len(CASES)), ids=case_name)
def test_schedule_equals_the_reference(reference, i):
    got = schedule_arrays(build_case(i))
    name = case_name(i)
    want = {k.split("/", 1)[1]: v for k, v in reference.items() if k.startswith(name + "/")}
    assert set(got) == set(want)
    for key, value in want.items():
        assert got[key].shape == value.shape, key
        assert np.array_equal(got[key], value), f"{name}: {key} differs"


def test_the_reference_covers_every_entry(reference):
    names = {case[3] for case in CASES}
    assert names == {f"{a}+{s}" for a in ("ring", "halfring", "foldedring", "line")
                     for s in ("pipeline", "dimrotation")} | {"mate", "matee"}
