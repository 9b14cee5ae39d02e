"""Element-level contracts of every collective and their mapping onto chunk layouts."""

from __future__ import annotations

import numpy as np
import pytest
from ir_builders import K, coll

from cclc.errors import ScheduleError
from cclc.ir import ScheduleBuilder
from cclc.semantics import EMPTY, chunk_map, contract, format_ranks, required_layout_elems
from cclc.topology import torus


def test_alltoall_uniform():
    c = contract(coll(K.ALLTOALL, n=3))          # 2 elements per block
    assert c.input_blocks.tolist() == [[2, 2, 2]] * 3
    # output block i of rank j is input block j of rank i
    assert c.input_base.tolist() == [[0, 2, 4], [6, 8, 10], [12, 14, 16]]
    assert c.output_base.tolist() == [[0, 6, 12], [2, 8, 14], [4, 10, 16]]
    assert not c.reducing and c.origin_rank(np.array([0, 5, 6, 17])).tolist() == [0, 0, 1, 2]


def test_alltoall_nonuniform():
    pairs = np.array([[4, 8], [0, 12]])          # bytes; fp32 -> elements [[1, 2], [0, 3]]
    c = contract(coll(K.ALLTOALL, n=2, pair_sizes=pairs))
    assert c.input_elems.tolist() == [3, 3] and c.output_elems.tolist() == [1, 5]
    assert c.output_blocks.tolist() == [[1, 0], [2, 3]]
    assert c.output_base.tolist() == [[0, 3], [1, 3]]
    assert c.describe(4, 2) == "rank 1's input elements 1..2 (its block for rank 1)"


def test_allgather_reducescatter_allreduce():
    ag = contract(coll(K.ALLGATHER, n=3))
    assert ag.input_blocks.tolist() == [[2]] * 3 and ag.output_base.tolist() == [[0, 2, 4]] * 3
    rs = contract(coll(K.REDUCESCATTER, n=3))
    assert rs.reducing and rs.input_base.tolist() == [[0, 2, 4]] * 3
    assert rs.output_base.tolist() == [[0], [2], [4]]
    assert rs.describe(2, 2, frozenset({0, 2})) == (
        "the sum of result elements 2..3 (block 1) over ranks {0,2}")
    ar = contract(coll(K.ALLREDUCE, n=3))
    assert ar.input_blocks.tolist() == [[4]] * 3 and ar.output_checked.all()


def test_broadcast_and_reduce_roots():
    b = contract(coll(K.BROADCAST, n=4, root=2))
    assert b.input_present.tolist() == [False, False, True, False]
    assert b.origin_rank(3) == 2
    assert b.describe(1, 2) == "rank 2's input elements 1..2"
    r = contract(coll(K.REDUCE, n=4, root=1))
    assert r.output_checked.tolist() == [False, True, False, False]


def test_required_layout_elems():
    i, o = required_layout_elems(coll(K.REDUCESCATTER, n=4))
    assert i.tolist() == [8] * 4 and o.tolist() == [2] * 4


def test_chunk_map_finer_chunks():
    c = coll(K.ALLGATHER, torus("r", (2,)), size=2 * 4 * 4)   # blocks of 4 elements
    s = ScheduleBuilder(c, input=[1, 3], output=[2, 2, 4]).build("x")
    m = chunk_map(s)
    assert m.input_value.tolist() == [[0, 1], [4, 5]]
    assert m.output_expected.tolist() == [[0, 2, 4]] * 2
    bc = coll(K.BROADCAST, torus("r", (2,)), root=1)
    m = chunk_map(ScheduleBuilder(bc, input=[4], output=[4]).build("x"))
    assert m.input_value.tolist() == [[EMPTY], [0]]


def test_chunk_map_rejects_misaligned_and_missized_layouts():
    c = coll(K.ALLTOALL, torus("r", (2,)))       # blocks of 2
    with pytest.raises(ScheduleError, match=r"^the input chunks of rank 0 do not align with the "
                       r"alltoall blocks: block 1 starts at element 2, which is inside a chunk"):
        chunk_map(ScheduleBuilder(c, input=[1, 3], output=[2, 2]).build("x"))
    with pytest.raises(ScheduleError, match=r"^the input layout of rank 0 has 5 elements, but "
                       r"a alltoall of 16 B \(fp32\) on 2 ranks needs 4 in that buffer$"):
        chunk_map(ScheduleBuilder(c, input=[2, 3], output=[2, 2]).build("x"))


def test_format_ranks():
    assert format_ranks([5, 0, 1, 2, 7, 8]) == "{0-2,5,7-8}"
    assert format_ranks([]) == "{}"
