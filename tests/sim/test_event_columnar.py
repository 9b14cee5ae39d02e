"""The columnar event-driven simulator against the op-by-op loop it replaced
(``event_reference``): the same start and finish of every op to the last bit, and the same
critical path, on every registered algorithm over random tori, faults, sizes and overheads."""

from __future__ import annotations

import numpy as np
from event_reference import reference_event
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cclc.algorithms import algorithms_for
from cclc.collective import CollectiveKind, make_collective
from cclc.errors import CclError
from cclc.sim import _event, _local_time, _prepare
from cclc.topology import torus, with_faults

KINDS = [CollectiveKind.ALLTOALL, CollectiveKind.ALLGATHER, CollectiveKind.ALLREDUCE,
         CollectiveKind.REDUCESCATTER, CollectiveKind.BROADCAST, CollectiveKind.REDUCE]


def _schedules(dims, seed, kind, routing, fault, mult):
    t = torus("t", dims, bandwidth=10e9 + seed, latency=1e-7 * (1 + seed % 3), routing=routing)
    if fault and t.n_links:
        k = seed % t.n_links
        u, v = int(t.link_src[k]), int(t.link_dst[k])
        t2 = with_faults(t, links=[(u, v), (v, u)])
        t = t2 if t2.is_connected(t2.all_ranks()) else t
    n = t.n_ranks
    root = 0 if kind in (CollectiveKind.BROADCAST, CollectiveKind.REDUCE) else None
    c = make_collective("c", kind, t, t.all_ranks(), size=n * n * 4 * mult, root=root)
    for algo in algorithms_for(c):
        if algo.applicable(c) is not None:
            continue
        try:
            yield algo.name, algo.build(c)
        except CclError:
            continue


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.integers(2, 4), min_size=1, max_size=3), st.integers(0, 1000),
       st.sampled_from(KINDS), st.sampled_from(["none", "source", "dimension_order"]),
       st.booleans(), st.integers(1, 3), st.sampled_from([0.0, 3.4e-6]),
       st.sampled_from([None, 5e10]))
def test_columnar_event_matches_the_reference(dims, seed, kind, routing, fault, mult,
                                              overhead, local_bw):
    for name, s in _schedules(dims, seed, kind, routing, fault, mult):
        p = _prepare(s)
        local = _local_time(s, p, local_bw)
        start, finish, path = _event(s, p, local, overhead)
        want_start, want_finish, want_path = reference_event(s, p, local, overhead)
        np.testing.assert_array_equal(start, want_start, err_msg=name)
        np.testing.assert_array_equal(finish, want_finish, err_msg=name)
        assert path == want_path, name
