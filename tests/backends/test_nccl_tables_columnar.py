"""The columnar NCCL dataflow tables against the op-by-op loop they replaced
(``nccl_tables_reference``): the same entries, field by field, and the same C text, byte for
byte, on hypothesis-drawn schedules, on schedules with same-step hazards and relays, and on
the registry's algorithms for every example collective small enough to build quickly."""

from __future__ import annotations

import pathlib

import pytest
from backend_helpers import (
    random_allgather,
    random_reducescatter,
    swap_allreduce,
    swap_alltoall,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from nccl_tables_reference import reference_rows, reference_tables

from backends.nccl import render_sources, table_text
from backends.nccl.tables import dataflow_tables
from backends.units import to_units
from cclc.algorithms import algorithms_for
from cclc.collective import CollectiveKind, ReduceOp, make_collective
from cclc.errors import CclError

EXAMPLES = sorted((pathlib.Path(__file__).parents[2] / "examples").glob("*.ccl"))
#: the reference loop is slow; larger example schedules are left to the benchmark
MAX_OPS = 4000


def _same_as_reference(schedule) -> None:
    units, facts = to_units(schedule, split=True, pad=True)
    tables = dataflow_tables(schedule, units, facts)
    want = reference_tables(schedule, units, facts)
    assert tables.entries == want
    assert table_text(tables) == reference_rows(want)


@settings(max_examples=30, deadline=None)
@given(st.integers(2, 6), st.integers(0, 10**6), st.integers(1, 3))
def test_random_allgathers_match_the_loop(n, seed, elems):
    _same_as_reference(random_allgather(n, seed, elems=elems))


@settings(max_examples=30, deadline=None)
@given(st.integers(2, 6), st.integers(0, 10**6), st.sampled_from(list(ReduceOp)))
def test_random_reducescatters_match_the_loop(n, seed, op):
    _same_as_reference(random_reducescatter(n, seed, op=op))


@pytest.mark.slow
def test_hazards_and_relays_match_the_loop():
    _same_as_reference(swap_allreduce())
    _same_as_reference(swap_alltoall())
    # every applicable algorithm of an alltoall and an allreduce on a 3x3x3 torus with a
    # failed link, under routing none: multi-hop moves are relayed through scratch
    topo = _faulty_torus()
    built = 0
    for kind in (CollectiveKind.ALLTOALL, CollectiveKind.ALLREDUCE):
        coll = make_collective("c", kind, topo, topo.all_ranks(), 27 * 27 * 8)
        for algo in algorithms_for(coll):
            if algo.applicable(coll) is None and "synth" not in algo.name:
                _same_as_reference(algo.build(coll))
                built += 1
    assert built >= 4


def _faulty_torus():
    from cclc.topology import torus, with_faults

    t = torus("t333", (3, 3, 3), routing="none")
    a, b = t.rank_at((0, 0, 0)), t.rank_at((1, 0, 0))
    return with_faults(t, links=[(a, b), (b, a)])


@pytest.mark.slow
@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_schedules_match_the_loop(path):
    import dsl

    compared = 0
    for coll in dsl.load(str(path)).collectives:
        for algo in algorithms_for(coll):
            if algo.applicable(coll) is not None or "synth" in algo.name:
                continue
            try:
                schedule = algo.build(coll)
            except CclError:
                continue
            if len(schedule.ops) > MAX_OPS:
                continue
            _same_as_reference(schedule)
            compared += 1
    if not compared:
        pytest.skip(f"no schedule of {path.name} is small enough for the reference loop")


def test_an_empty_rank_and_the_text_around_the_table():
    # the sentinel row and the first edge column: the schedule header as the loop printed it
    s = random_allgather(3, 5)
    text = render_sources(s)[f"cclc_{s.collective.name.replace('-', '_')}_schedule.h"]
    units, facts = to_units(s, split=True, pad=True)
    rows, first, dep_lines = reference_rows(reference_tables(s, units, facts))
    assert "".join(f"  {{ {r} }},\n" for r in rows) in text
    assert f"[] = {{ {first} }};" in text
    assert "\n".join(f"    {line}" for line in dep_lines) in text
