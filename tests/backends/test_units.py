"""The units pass: a schedule in units is the same schedule. The verifier accepts it, the
simulator gives it the same times, and every op reads and writes the same elements as in
the original (checked against offsets summed from the original layouts with numpy)."""

from __future__ import annotations

import numpy as np
import pytest
from backend_helpers import (
    fabric_2x3,
    pick,
    random_allgather,
    random_reducescatter,
    swap_allreduce,
    swap_alltoall,
    uneven_ring_allgather,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from backends.common import entry_count, padded_count
from backends.units import buffer_units, rank_units, to_units, writes_input
from cclc.collective import CollectiveKind, make_collective
from cclc.ir import Buf
from cclc.sim import simulate
from cclc.topology import torus
from cclc.verify import verify


def _elements(schedule, buf_col, rank_col, off_col) -> np.ndarray:
    """Element offset of each op's (rank, buffer, chunk), summed from the layouts."""
    out = np.zeros(len(schedule.ops), dtype=np.int64)
    for i, (b, r, o) in enumerate(zip(buf_col, rank_col, off_col, strict=True)):
        lay = schedule.layouts[b]
        row = lay if lay.ndim == 1 else lay[r]
        out[i] = int(np.sum(row[:o]))
    return out


def _check_same(schedule, **kwargs):
    units, facts = to_units(schedule, **kwargs)
    verify(units)
    o, u = schedule.ops, units.ops
    for col in ("step", "src", "dst", "route", "kind", "src_buf", "dst_buf"):
        assert np.array_equal(getattr(o, col), getattr(u, col)), col
    assert np.array_equal(units.op_elems(), schedule.op_elems())
    assert np.array_equal(_elements(units, u.src_buf, u.src, u.src_off),
                          _elements(schedule, o.src_buf, o.src, o.src_off))
    assert np.array_equal(_elements(units, u.dst_buf, u.dst, u.dst_off),
                          _elements(schedule, o.dst_buf, o.dst, o.dst_off))
    for mode in ("lockstep", "event"):
        assert simulate(units, mode=mode).time == simulate(schedule, mode=mode).time
    # every rank's buffers hold what they held; real unit chunks are never empty
    for buf in Buf:
        assert np.array_equal(units.chunk_starts(buf)[:, -1], schedule.chunk_starts(buf)[:, -1])
        assert max(rank_units(units, buf), default=0) == buffer_units(units)[buf]
    if facts.exact:
        assert set(np.unique(units.chunk_elems(Buf.INPUT))) <= {0, facts.unit}
        assert facts.unit * facts.count_units == (padded_count(schedule) if facts.padded
                                                  else entry_count(schedule))
    assert writes_input(units) == bool((o.dst_buf == Buf.INPUT).any())
    return units, facts


@settings(max_examples=30, deadline=None)
@given(st.integers(2, 6), st.integers(0, 10**6), st.booleans())
def test_random_schedules_in_units_are_the_same_schedules(n, seed, gather):
    make = random_allgather if gather else random_reducescatter
    _check_same(make(n, seed, elems=3))


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["allgather", "alltoall", "reducescatter", "allreduce"])
def test_registry_schedules_in_units(kind):
    from cclc.algorithms import algorithms_for

    for topo in (torus("t23", (2, 3)), fabric_2x3()):
        n = topo.n_ranks
        coll = make_collective("c", CollectiveKind(kind), topo, tuple(range(n)), n * n * 12 * 4)
        for algo in algorithms_for(coll):
            if algo.applicable(coll) is None:
                _check_same(algo.build(coll))
                _check_same(algo.build(coll), split=True)


def test_hand_schedules_in_units():
    _check_same(swap_allreduce())
    _check_same(swap_alltoall())


def test_near_equal_form_is_the_same_schedule():
    s = uneven_ring_allgather(n=3, elems=100_000, pieces=3)
    units, facts = _check_same(s, max_units=1000)
    assert not facts.exact and facts.count_units == 3
    _, facts = _check_same(uneven_ring_allgather(n=4, elems=11, pieces=3, floor=True),
                           split=True)
    assert facts.split == 1


def test_padded_alltoall_is_the_same_schedule():
    sizes = np.array([[2, 6, 4, 2], [8, 2, 2, 2], [4, 4, 0, 6], [2, 2, 10, 4]]) * 4
    coll = make_collective("v", CollectiveKind.ALLTOALL, torus("r4", (4,)), tuple(range(4)),
                           pair_sizes=sizes)
    _, s = pick(coll, ["direct"])
    units, facts = _check_same(s, pad=True)
    assert facts.padded and units.layouts[Buf.INPUT].ndim == 2


def test_units_too_many_to_build_are_refused_not_built():
    """A scratch chunk of one element before a whole buffer (gcd 1, and the copy into it
    shifts the data by one element, so no near-equal form): in units the buffers would be
    tables of 268M units each; with no runtime limit (the NCCL library) the conversion
    refuses instead of building them (a schedule like it ran the compile out of memory),
    and the library's refusal says so before any candidate is chosen."""
    from backends.contract import EmitOptions
    from backends.nccl import BACKEND
    from backends.units import UnitsTooLong, units_refusal
    from cclc.ir import ScheduleBuilder

    ring = torus("ring", (2,))
    count = (1 << 28) + 2
    coll = make_collective("ar", CollectiveKind.ALLREDUCE, ring, (0, 1), size=4 * count)
    b = ScheduleBuilder(coll, input=[count], output=[count], scratch=[1, count])
    ranks = np.arange(2)
    b.add(step=0, src=ranks, dst=ranks, src_buf=Buf.INPUT, src_off=0, dst_buf=Buf.SCRATCH,
          dst_off=1)
    routes = [b.route((ring.link_id(0, 1),)), b.route((ring.link_id(1, 0),))]
    b.add(step=1, src=ranks, dst=1 - ranks, route=routes, src_buf=Buf.SCRATCH, src_off=1,
          dst_buf=Buf.OUTPUT, dst_off=0)
    s = b.build("hand")
    with pytest.raises(UnitsTooLong, match="more than cclc builds tables for"):
        to_units(s, split=True, pad=True)
    assert "more than cclc builds tables for" in units_refusal(s)
    assert "more than cclc builds tables for" in BACKEND.refusal(s, EmitOptions())
    assert units_refusal(s, 1 << 29) is None          # a runtime limit above it: fits
