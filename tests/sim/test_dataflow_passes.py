"""The dataflow lowering split into passes (:func:`cclc.dataflow.lower`) against the one loop
it replaced (``dataflow_reference``): the same items, edges, staging and lanes, on random op
arrays (overlapping reads and writes, reductions, several writes of one slot in a step) and
on the relayed schedules of every algorithm on small faulty tori."""

from __future__ import annotations

import numpy as np
import pytest
from dataflow_reference import lower_reference
from hypothesis import given, settings
from hypothesis import strategies as st

from cclc.algorithms import algorithms_for
from cclc.collective import CollectiveKind, make_collective
from cclc.dataflow import lower
from cclc.ir import Buf
from cclc.sim import dest_counts
from cclc.topology import torus, with_faults


def _same(a, b) -> None:
    assert a.items == b.items
    np.testing.assert_array_equal(a.lane, b.lane)
    assert (a.n_lanes, a.n_local, a.staging) == (b.n_lanes, b.n_local, b.staging)


@st.composite
def _op_arrays(draw):
    n = draw(st.integers(1, 5))
    widths = tuple(draw(st.lists(st.integers(1, 6), min_size=3, max_size=3)))
    m = draw(st.integers(0, 40))
    cols = {k: [] for k in ("step", "src", "dst", "path", "kind", "src_buf", "src_off",
                            "dst_buf", "dst_off", "count", "dcount")}
    for _ in range(m):
        sb, db = draw(st.integers(0, 2)), draw(st.integers(0, 2))
        count = draw(st.integers(1, min(widths[sb], widths[db])))
        cols["step"].append(draw(st.integers(0, 4)))
        cols["src"].append(draw(st.integers(0, n - 1)))
        cols["dst"].append(draw(st.integers(0, n - 1)))
        cols["path"].append(draw(st.integers(0, 2)))
        cols["kind"].append(draw(st.integers(0, 1)))
        cols["src_buf"].append(sb)
        cols["dst_buf"].append(db)
        cols["src_off"].append(draw(st.integers(0, widths[sb] - count)))
        cols["dst_off"].append(draw(st.integers(0, widths[db] - count)))
        cols["count"].append(count)
        cols["dcount"].append(draw(st.integers(1, count)))
    lanes = draw(st.integers(1, 4))
    return n, {k: np.array(v, dtype=np.int64) for k, v in cols.items()}, widths, lanes


def _call(f, n, c, widths, lanes):
    return f(n, c["step"], c["src"], c["dst"], c["path"], c["kind"], c["src_buf"],
             c["src_off"], c["dst_buf"], c["dst_off"], c["count"], c["dcount"], widths, lanes)


@settings(max_examples=150, deadline=None)
@given(_op_arrays())
def test_random_op_arrays(case):
    n, c, widths, lanes = case
    _same(_call(lower, n, c, widths, lanes), _call(lower_reference, n, c, widths, lanes))


def _torus_schedules():
    out = []
    for dims in ((4,), (3, 3), (4, 3)):
        t = torus("t", dims, bandwidth=10e9, latency=1e-6, routing="none")
        a, b = t.rank_at((0,) * len(dims)), t.rank_at((1,) + (0,) * (len(dims) - 1))
        t = with_faults(t, links=[(a, b), (b, a)])
        n = t.n_ranks
        for kind in (CollectiveKind.ALLTOALL, CollectiveKind.ALLREDUCE,
                     CollectiveKind.ALLGATHER, CollectiveKind.REDUCESCATTER):
            coll = make_collective("c", kind, t, tuple(range(n)), size=n * n * 256)
            for algo in algorithms_for(coll):
                if algo.applicable(coll) is None:
                    out.append(pytest.param(algo.build, coll,
                                            id=f"{'x'.join(map(str, dims))}-{kind.name}-"
                                               f"{algo.name}"))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("build, coll", _torus_schedules())
def test_algorithm_schedules(build, coll):
    s = build(coll)
    o = s.ops
    args = (s.n, o.step, o.src, o.dst, o.route, o.kind, o.src_buf, o.src_off, o.dst_buf,
            o.dst_off, o.count, dest_counts(s), tuple(s.n_chunks(b) for b in Buf))
    _same(lower(*args), lower_reference(*args))


@settings(max_examples=40, deadline=None)
@given(_op_arrays())
def test_edges_sorted_on_three_keys_when_one_could_overflow(case):
    import cclc.dataflow as df
    n, c, widths, lanes = case
    one = _call(lower, n, c, widths, lanes)
    limit = df._ONE_KEY_LIMIT
    df._ONE_KEY_LIMIT = 0
    try:
        three = _call(lower, n, c, widths, lanes)
    finally:
        df._ONE_KEY_LIMIT = limit
    _same(one, three)
    _same(three, _call(lower_reference, n, c, widths, lanes))


@pytest.mark.parametrize("overhead", [0.0, 5e-6])
@pytest.mark.parametrize("build, coll", _torus_schedules()[::3])
def test_the_time_found_while_placing_is_the_time_of_the_placed_plan(build, coll, overhead):
    from cclc.dataflow import _run, lower_schedule
    from cclc.relay import lower_relays
    s = lower_relays(build(coll))
    plan = lower_schedule(s, op_overhead=overhead)
    assert plan.placed_overhead == overhead
    assert plan.placed_time == _run(s, plan, overhead)[0]
