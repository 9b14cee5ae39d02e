"""The columnar dataflow run (:func:`cclc.dataflow._run`) against the loop over items it
replaced (``dataflow_run_reference``): the same time to the last bit, the same lanes and the
same groups, while placing (lanes and groups chosen) and on a placed plan, on every registered
algorithm over random tori, faults, sizes and overheads; on the same schedules with their ops
thrown into random steps (snapshots, several writes of a slot in a step, local ops on local
lanes); and on routes that take a link twice."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from dataflow_run_reference import reference_run
from drawn_schedules import KINDS, schedules
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cclc.dataflow import _run, lower, place_local_ops
from cclc.ir import Buf, Ops, Routes
from cclc.sim import dest_counts


def _raw_plan(s, lanes):
    o = s.ops
    return lower(s.n, o.step, o.src, o.dst, o.route, o.kind, o.src_buf, o.src_off, o.dst_buf,
                 o.dst_off, o.count, dest_counts(s), tuple(s.n_chunks(b) for b in Buf), lanes)


def _same_run(s, plan, overhead, place, what):
    got, want = _run(s, plan, overhead, place), reference_run(s, plan, overhead, place)
    assert got[0] == want[0], what
    np.testing.assert_array_equal(got[1], want[1], err_msg=what)
    np.testing.assert_array_equal(got[2], want[2], err_msg=what)
    # a plan made elsewhere has no columns: they are read from its items
    bare = _run(s, replace(plan, item_tuple=plan.items, columns=None), overhead, place)
    assert bare[0] == want[0], what


def _check(s, overhead, lanes, what):
    plan = _raw_plan(s, lanes)
    _same_run(s, plan, overhead, True, what)
    placed = place_local_ops(s, plan, overhead)
    _same_run(s, placed, overhead, False, what)
    # another overhead on the placed plan: its groups are kept, its times change
    _same_run(s, placed, overhead + 1e-6, False, what)


@pytest.mark.slow
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.integers(2, 4), min_size=1, max_size=3), st.integers(0, 1000),
       st.sampled_from(KINDS), st.sampled_from(["none", "source", "dimension_order"]),
       st.booleans(), st.integers(1, 3), st.sampled_from([0.0, 8.4e-6]),
       st.sampled_from([1, 3, 32]))
def test_columnar_run_matches_the_loop(dims, seed, kind, routing, fault, mult, overhead,
                                       lanes):
    for name, s in schedules(dims, seed, kind, routing, fault, mult):
        _check(s, overhead, lanes, name)


@pytest.mark.slow
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.integers(2, 3), min_size=1, max_size=2), st.integers(0, 1000),
       st.sampled_from(KINDS), st.integers(1, 4), st.sampled_from([0.0, 8.4e-6]),
       st.sampled_from([1, 2, 32]), st.booleans())
def test_columnar_run_matches_the_loop_on_scrambled_steps(dims, seed, kind, n_steps,
                                                          overhead, lanes, twice):
    """Ops in random steps: reads of slots the same step writes (snapshots), several writes
    of a slot in one step, local ops behind snapshots; ``twice``: every route takes each of
    its links twice (a link served twice by one item)."""
    rng = np.random.default_rng(seed)
    for name, s in schedules(dims, seed, kind, "source", seed % 2 == 0, 1):
        cols = s.ops.columns()
        cols["step"] = rng.integers(0, n_steps, len(s.ops)).astype(cols["step"].dtype)
        s2 = s.replace(ops=Ops(**cols))
        if twice:
            r = s.routes
            lengths = np.diff(r.offsets)
            offsets = np.concatenate([[0], np.cumsum(2 * lengths)]).astype(r.offsets.dtype)
            links = np.concatenate([np.concatenate([r.links[a:b], r.links[a:b]])
                                    for a, b in zip(r.offsets[:-1], r.offsets[1:],
                                                    strict=True)] or [r.links[:0]])
            s2 = s2.replace(routes=Routes(offsets, links.astype(r.links.dtype)))
        _check(s2, overhead, lanes, name)
