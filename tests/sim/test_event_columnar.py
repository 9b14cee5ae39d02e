"""The columnar event-driven simulator against the op-by-op loop it replaced
(``event_reference``): the same start and finish of every op to the last bit, and the same
critical path, on every registered algorithm over random tori, faults, sizes and overheads."""

from __future__ import annotations

import numpy as np
import pytest
from drawn_schedules import KINDS, schedules
from event_reference import reference_event
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cclc.sim import _event, _local_time, prepare


@pytest.mark.slow
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.integers(2, 4), min_size=1, max_size=3), st.integers(0, 1000),
       st.sampled_from(KINDS), st.sampled_from(["none", "source", "dimension_order"]),
       st.booleans(), st.integers(1, 3), st.sampled_from([0.0, 3.4e-6]),
       st.sampled_from([None, 5e10]))
def test_columnar_event_matches_the_reference(dims, seed, kind, routing, fault, mult,
                                              overhead, local_bw):
    for name, s in schedules(dims, seed, kind, routing, fault, mult):
        p = prepare(s)
        local = _local_time(s, p, local_bw)
        start, finish, path = _event(s, p, local, overhead)
        want_start, want_finish, want_path = reference_event(s, p, local, overhead)
        np.testing.assert_array_equal(start, want_start, err_msg=name)
        np.testing.assert_array_equal(finish, want_finish, err_msg=name)
        assert path == want_path, name
