"""backends.common: C names, options, equal units and per-rank step tables."""

from __future__ import annotations

import numpy as np
import pytest
from backend_helpers import (
    uneven_ring_allgather,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from backends.common import EmitOptions, RecentLowerings, c_identifier
from backends.units import buffer_units, rank_units, to_units
from cclc.collective import CollectiveKind, make_collective
from cclc.errors import ScheduleError
from cclc.ir import Buf, ScheduleBuilder
from cclc.topology import torus


@pytest.mark.parametrize("name, ident", [
    ("a2a", "a2a"), ("a2a-fast.v2", "a2a_fast_v2"), ("3d", "_3d"), ("int", "_int"),
    ("grüße", "gr__e"), ("", "_"), ("x y", "x_y")])
def test_c_identifier(name, ident):
    assert c_identifier(name) == ident


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(st.text(max_size=20))
def test_c_identifier_is_always_a_c_identifier(name):
    ident = c_identifier(name)
    assert ident and (ident[0].isalpha() or ident[0] == "_") and ident.isascii()
    assert all(ch.isalnum() or ch == "_" for ch in ident)


def test_recent_lowerings_lower_a_schedule_once_per_key_and_keep_two():
    coll = make_collective("ag", CollectiveKind.ALLGATHER, torus("r", (2,)), (0, 1), size=8)
    a, b, c = (ScheduleBuilder(coll, input=[2], output=[1, 1]).build("none")
                 for _ in range(3))
    calls: list[str] = []
    recent: RecentLowerings[str] = RecentLowerings(keep=2)

    def lowering(name: str):
        return lambda: calls.append(name) or name

    assert recent.get(a, "k", lowering("a")) == "a"
    assert recent.get(a, "k", lowering("again")) == "a"            # kept: not lowered again
    assert recent.get(a, "other", lowering("a2")) == "a2"          # another key lowers
    assert recent.get(b, "k", lowering("b")) == "b"                # pushes a under "k" out
    assert recent.get(a, "k", lowering("a3")) == "a3"
    assert recent.get(c, "k", lowering("c")) == "c"                # identity, not equality
    assert calls == ["a", "a2", "b", "a3", "c"]


def test_options_validate():
    with pytest.raises(ScheduleError, match="protocol"):
        EmitOptions(protocol="ll")
    with pytest.raises(ScheduleError, match="multiple of 32"):
        EmitOptions(nthreads=100)


def test_the_cli_fills_the_one_options_type():
    import argparse

    from cclc.commands import compile as compile_cmd

    args = argparse.Namespace(msccl_runtime="rccl", msccl_max_bytes=1 << 20, build=True)
    opts = compile_cmd._options(args)
    assert type(opts) is EmitOptions
    assert opts.msccl_runtime == "rccl" and opts.build and opts.max_bytes == 1 << 20
    assert opts.protocol == "Simple"      # what the CLI does not set keeps its default


def test_the_runtime_names_are_the_runtimes_table():
    from backends.msccl import BACKEND
    from backends.msccl.runtimes import RUNTIMES

    coll = make_collective("ag", CollectiveKind.ALLGATHER, torus("r", (2,)), (0, 1), 2 * 6 * 4)
    for key in RUNTIMES:
        assert BACKEND.files(coll, EmitOptions(msccl_runtime=key))[0] == f"ag.{key}.xml"
    # the MSCCL backend, the one output that reads the name, refuses another before any work
    with pytest.raises(ScheduleError, match="unknown MSCCL runtime 'nccl'"):
        BACKEND.files(coll, EmitOptions(msccl_runtime="nccl"))


def test_the_contract_imports_no_backend():
    import ast

    import backends.contract as contract

    tree = ast.parse(open(contract.__file__, encoding="utf-8").read())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | \
        {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not {m for m in imported if m and m.startswith("backends")}, imported


def test_unequal_chunks_become_gcd_units():
    topo = torus("r", (2,))
    coll = make_collective("ag", CollectiveKind.ALLGATHER, topo, (0, 1), 2 * 6 * 4)
    # input cut 2 + 4 elements, output 6 + 6
    b = ScheduleBuilder(coll, input=[2, 4], output=[6, 6])
    for r in range(2):
        b.add(step=0, src=r, dst=r, src_buf=Buf.INPUT, src_off=0, dst_buf=Buf.OUTPUT,
              dst_off=r, count=2)
        b.add(step=0, src=r, dst=1 - r, route=b.route(topo.shortest_path_links(r, 1 - r)),
              src_buf=Buf.INPUT, src_off=1, dst_buf=Buf.OUTPUT, dst_off=r)
        b.add(step=1, src=r, dst=1 - r, route=b.route(topo.shortest_path_links(r, 1 - r)),
              src_buf=Buf.INPUT, src_off=0, dst_buf=Buf.OUTPUT, dst_off=r)
    # the second op lands its 4 elements at the start of block r; the third op then must
    # not overwrite them: not a valid allgather, but a fine test of the unit arithmetic
    units, facts = to_units(b.build("hand"))
    assert facts.unit == 2 and buffer_units(units) == (3, 6, 0) and facts.count_units == 3
    # ops are sorted by step: (r0 copy, r0 send, r1 copy, r1 send) then (r0, r1) of step 1
    assert units.ops.src_off.tolist() == [0, 1, 0, 1, 0, 0]
    assert units.ops.dst_off.tolist() == [0, 0, 3, 3, 0, 3]
    assert units.ops.count.tolist() == [3, 2, 3, 2, 1, 1]
    # every unit chunk holds one unit of elements
    assert units.layouts[Buf.INPUT].tolist() == [2] * 3


def test_per_rank_sizes_are_refused_but_per_rank_cuts_are_not():
    topo = torus("r", (2,))
    sizes = np.array([[4, 8], [4, 4]])          # rank 0 sends 12 B, rank 1 sends 8 B
    coll = make_collective("v", CollectiveKind.ALLTOALL, topo, (0, 1), pair_sizes=sizes)
    b = ScheduleBuilder(coll, input=[[1, 2], [1, 1]], output=[[1, 1], [2, 1]])
    with pytest.raises(ScheduleError, match="non-uniform alltoall"):
        to_units(b.build("hand"))
    # same totals on every rank, cut differently, with different scratch: fine
    coll = make_collective("u", CollectiveKind.ALLTOALL, topo, (0, 1), 16)
    b = ScheduleBuilder(coll, input=[[1, 1], [1, 1]], output=[[1, 1], [1, 1]],
                        scratch=[[2, 0], [1, 0]])
    units, _ = to_units(b.build("hand"))
    assert buffer_units(units) == (2, 2, 2) and rank_units(units, Buf.SCRATCH) == (2, 1)


def test_near_equal_units_for_uneven_splits():
    s = uneven_ring_allgather(n=3, elems=100_000, pieces=3)     # blocks cut 33334+33333+33333
    exact, facts = to_units(s)
    assert facts.exact and facts.unit == 1 and buffer_units(exact) == (100_000, 300_000, 0)
    assert to_units(s, max_units=300_000)[1].exact          # exact units fit: kept
    units, facts = to_units(s, max_units=1000)
    assert not facts.exact and facts.count_units == 3 and buffer_units(units) == (3, 9, 0)
    # every op moves one chunk: one unit, at the chunk's index
    assert (units.ops.count == 1).all()
    ops = s.ops
    assert (units.ops.src_off == ops.src_off).all()
    assert (units.ops.dst_off == ops.dst_off).all()
    # the atoms are the schedule's own chunks
    assert units.layouts[Buf.OUTPUT].tolist() == [33334, 33333, 33333] * 3


def test_near_equal_units_refuse_ops_that_move_across_atom_cuts():
    # a copy of input chunk 0 (33334 elements) to scratch offset 5: the atoms it covers
    # (cut at 5 by the scratch's own boundary) do not line up with those it lands on
    topo = torus("r", (2,))
    coll = make_collective("ar", CollectiveKind.ALLREDUCE, topo, (0, 1), 100_000 * 4)
    b = ScheduleBuilder(coll, input=[33334, 33333, 33333], output=[33334, 33333, 33333],
                        scratch=[5, 33334])
    for r in range(2):
        b.add(step=0, src=r, dst=r, src_buf=Buf.INPUT, src_off=0, dst_buf=Buf.SCRATCH,
              dst_off=1)
    _, facts = to_units(b.build("hand"), max_units=1000)
    assert facts.exact and facts.unit == 1
