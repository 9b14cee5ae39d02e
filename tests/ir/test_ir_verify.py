"""The symbolic verifier: hand-built schedules, correct and broken in each way, exactly."""

from __future__ import annotations

import numpy as np
import pytest
from ir_builders import K, build, coll, direct_alltoall, route, with_ops, without_op

from cclc.collective import DType
from cclc.errors import ScheduleError
from cclc.ir import Buf, OpKind, Ops, ScheduleBuilder, format_schedule
from cclc.topology import torus, with_faults
from cclc.verify import verify


def first_line(s, i=None):
    """The first line of verify's error, after checking it shows the IR around op ``i``."""
    with pytest.raises(ScheduleError) as e:
        verify(s)
    msg = e.value.message
    if i is not None:
        assert format_schedule(s, around=i) in msg
    return msg.splitlines()[0]


TOPOS = [torus("ring4", (4,)), torus("t33", (3, 3)), torus("mesh23", (2, 3), wrap=(False, False)),
         torus("one", (1,))]


@pytest.mark.parametrize("kind", list(K))
@pytest.mark.parametrize("topo", TOPOS, ids=lambda t: t.name)
def test_hand_built_schedules_verify(kind, topo):
    root = topo.n_ranks - 1 if kind in (K.BROADCAST, K.REDUCE) else None
    verify(build(coll(kind, topo, root=root)))


def test_subgroup_uses_global_ranks_for_routes():
    t = torus("t", (3, 3))
    c = coll(K.ALLGATHER, t, group=(4, 5, 8))
    verify(build(c))


def test_nonuniform_alltoall_with_per_rank_layouts():
    pairs = np.array([[4, 8, 0], [0, 4, 12], [8, 4, 4]])
    s = direct_alltoall(coll(K.ALLTOALL, torus("r", (3,)), pair_sizes=pairs))
    assert s.layouts[Buf.INPUT].ndim == 2
    verify(s)


def test_relay_through_scratch_over_two_steps():
    c = coll(K.ALLGATHER, torus("line", (3,), wrap=(False,)))
    b = ScheduleBuilder(c, input=[2], output=[2] * 3, scratch=[2])
    for i in range(3):
        b.add(step=0, src=i, dst=i, src_buf=Buf.INPUT, src_off=0, dst_buf=Buf.OUTPUT, dst_off=i)
    # 0 and 2 are not neighbours: their blocks hop through 1's scratch
    b.add(step=0, src=0, dst=1, route=route(b, 0, 1), src_buf=Buf.INPUT, src_off=0,
          dst_buf=Buf.OUTPUT, dst_off=0)
    b.add(step=0, src=2, dst=1, route=route(b, 2, 1), src_buf=Buf.INPUT, src_off=0,
          dst_buf=Buf.SCRATCH, dst_off=0)
    b.add(step=0, src=1, dst=0, route=route(b, 1, 0), src_buf=Buf.INPUT, src_off=0,
          dst_buf=Buf.OUTPUT, dst_off=1)
    b.add(step=0, src=1, dst=2, route=route(b, 1, 2), src_buf=Buf.INPUT, src_off=0,
          dst_buf=Buf.OUTPUT, dst_off=1)
    b.add(step=1, src=1, dst=0, route=route(b, 1, 0), src_buf=Buf.SCRATCH, src_off=0,
          dst_buf=Buf.OUTPUT, dst_off=2)
    b.add(step=1, src=1, dst=2, route=route(b, 1, 2), src_buf=Buf.OUTPUT, src_off=0,
          dst_buf=Buf.OUTPUT, dst_off=0)
    b.add(step=1, src=1, dst=1, src_buf=Buf.SCRATCH, src_off=0, dst_buf=Buf.OUTPUT, dst_off=2)
    s = b.build("relay")
    verify(s)
    # the relay must come after the hop into scratch: in one step it reads an empty slot
    early = with_ops(s, step=np.where(np.arange(len(s.ops)) >= 7, 0, s.ops.step))
    i = 7
    assert first_line(early, i) == (
        f"op #{i} (step 0: copy 1.s[0] -> 0.o[2] "
        f"via {early.routes.path(int(early.ops.route[i]))[0]})"
        ": reads rank 1's scratch chunk 0, which is empty (no earlier step wrote it)")


def test_ops_that_split_and_merge_chunks():
    # input chunks [1, 3] arrive in output chunks [2, 2]: same elements, different cuts
    c = coll(K.ALLGATHER, torus("r", (2,)), size=2 * 4 * 4)
    b = ScheduleBuilder(c, input=[1, 3], output=[2, 2] * 2)
    for i in range(2):
        for j in range(2):
            b.add(step=0, src=i, dst=j, route=route(b, i, j), count=2, src_buf=Buf.INPUT,
                  src_off=0, dst_buf=Buf.OUTPUT, dst_off=2 * i)
    s = b.build("split")
    verify(s)
    # the same cut, but the pieces are put back in the wrong order: not one run of data
    b = ScheduleBuilder(c, input=[1, 3], output=[2, 2] * 2, scratch=[3, 1])
    b.add(step=0, src=0, dst=0, src_buf=Buf.INPUT, src_off=1, dst_buf=Buf.SCRATCH, dst_off=0)
    b.add(step=0, src=0, dst=0, src_buf=Buf.INPUT, src_off=0, dst_buf=Buf.SCRATCH, dst_off=1)
    b.add(step=1, src=0, dst=0, count=2, src_buf=Buf.SCRATCH, src_off=0, dst_buf=Buf.OUTPUT,
          dst_off=0)
    bad = b.build("scrambled")
    assert first_line(bad, 2) == (
        "op #2 (step 1: copy 0.s[0+2] -> 0.o[0+2]): rank 0's output chunk 1 would receive "
        "pieces of different data (the source chunks are not one contiguous run of the "
        "collective's data)")


# -- each way to be wrong ------------------------------------------------------------------

def test_two_writes_to_one_slot_in_a_step():
    s = build(coll(K.ALLTOALL))
    # op 5 (1 -> 2) now writes 2's output chunk 0, which op 8 (0 -> 2) writes in step 1 too
    src, dst, off = s.ops.src.copy(), s.ops.dst.copy(), s.ops.dst_off.copy()
    i = int(np.flatnonzero((src == 1) & (dst == 2))[0])
    j = int(np.flatnonzero((src == 0) & (dst == 2))[0])
    off[i] = 0
    bad = with_ops(s, dst_off=off)
    later = max(i, j)
    line = first_line(bad, later)
    assert line.endswith(f": writes rank 2's output chunk 0, which op #{min(i, j)} also writes "
                         "in the same step")
    assert line.startswith(f"op #{later} (step 1: ")


def test_reduction_into_an_empty_slot():
    s = build(coll(K.ALLREDUCE))
    kind = s.ops.kind.copy()
    kind[0] = OpKind.REDUCE
    assert first_line(with_ops(s, kind=kind), 0) == (
        "op #0 (step 0: reduce 0.i[0+2] -> 0.o[0+2]): reduces into rank 0's output chunk 0, "
        "which is empty (a reduction needs data to add to; copy first)")


def test_reduction_that_adds_a_contribution_twice():
    s = build(coll(K.REDUCESCATTER))
    # the last op (step 3) adds rank 2's block 3 into rank 3; make it re-send rank 3's own
    i = len(s.ops) - 1
    assert (int(s.ops.src[i]), int(s.ops.dst[i])) == (2, 3)
    src = s.ops.src.copy()
    src[i] = 3
    rt = s.ops.route.copy()
    rt[i] = 0
    assert first_line(with_ops(s, src=src, route=rt), i) == (
        f"op #{i} (step 3: reduce 3.i[3] -> 3.o[0]): adds the contribution of rank(s) {{3}} "
        "twice: rank 3's output chunk 0 already holds the sum of result elements 6..7 "
        "(block 3) over ranks {0-1,3} and the op brings the sum of result elements 6..7 "
        "(block 3) over ranks {3}")


def test_reduction_of_different_data():
    s = build(coll(K.REDUCESCATTER))
    i = len(s.ops) - 1
    off = s.ops.src_off.copy()
    off[i] = 1
    assert first_line(with_ops(s, src_off=off), i) == (
        f"op #{i} (step 3: reduce 2.i[1] -> 3.o[0] via 2): reduces the sum of result elements "
        "2..3 (block 1) over ranks {2} into rank 3's output chunk 0, which holds the sum of "
        "result elements 6..7 (block 3) over ranks {0-1,3}: they are different data")


def test_reduction_in_a_copy_collective():
    s = build(coll(K.ALLGATHER))
    i = len(s.ops) - 1
    kind = s.ops.kind.copy()
    kind[i] = OpKind.REDUCE
    assert first_line(with_ops(s, kind=kind), i).endswith(
        ": is a reduction, but a allgather only moves data: it has nothing to reduce")


def test_reading_an_empty_slot():
    s = build(coll(K.ALLGATHER))
    bufs = s.ops.src_buf.copy()
    bufs[3] = Buf.OUTPUT
    off = s.ops.src_off.copy()
    off[3] = 1
    assert first_line(with_ops(s, src_buf=bufs, src_off=off), 3) == (
        "op #3 (step 0: copy 3.o[1] -> 3.o[3]): reads rank 3's output chunk 1, which is empty "
        "(no earlier step wrote it)")


def test_broadcast_input_off_the_root_holds_nothing():
    s = build(coll(K.BROADCAST, root=2))
    src = s.ops.src.copy()
    src[2] = 2
    src[0] = 0   # op 0 is 2 -> 0; make it a local copy of rank 0's (meaningless) input
    rt = s.ops.route.copy()
    rt[0] = 0
    assert first_line(with_ops(s, src=src, route=rt), 0).endswith(
        ": reads rank 0's input chunk 0, which is empty (no earlier step wrote it)")


@pytest.mark.parametrize("change, words", [
    ({"src_off": 4}, "source chunks 4..4 are out of bounds: rank 0's input has 4 chunks"),
    ({"dst_off": -1}, ("destination chunks -1..-1 are out of bounds: rank 0's output has 1 "
                       "chunk")),
    ({"count": 0}, "count 0 moves no chunk; it must be >= 1"),
    ({"count": 2}, "destination chunks 0..1 are out of bounds: rank 0's output has 1 chunk"),
    ({"src": 7}, "source rank 7 is outside the group of 4 ranks (0..3)"),
    ({"step": -1}, "step -1 is negative"),
    ({"src_buf": 5}, "source buffer 5 is not input (0), output (1) or scratch (2)"),
    ({"kind": 3}, "op kind 3 is not copy (0) or reduce (1)"),
    ({"route": 99}, "route 99 does not exist (the schedule has routes 0..{last})"),
])
def test_malformed_op_fields(change, words):
    s = build(coll(K.REDUCESCATTER))
    cols = {k: np.array(v) for k, v in s.ops.columns().items()}
    for k, v in change.items():
        cols[k][0] = v
    bad = s.replace(ops=Ops(**cols))
    assert first_line(bad).endswith(": " + words.format(last=len(s.routes) - 1))
    assert first_line(bad).startswith("op #0 (")


def test_element_totals_that_differ():
    c = coll(K.ALLGATHER, torus("r", (2,)), size=2 * 4 * 4)
    b = ScheduleBuilder(c, input=[1, 3], output=[4, 4], scratch=[2])
    b.add(step=0, src=0, dst=0, src_buf=Buf.INPUT, src_off=0, dst_buf=Buf.SCRATCH, dst_off=0)
    assert first_line(b.build("x"), 0) == (
        "op #0 (step 0: copy 0.i[0] -> 0.s[0]): the source chunks hold 1 elements but the "
        "destination chunks hold 2")


def test_layout_that_does_not_fit_the_collective():
    c = coll(K.ALLGATHER, torus("r", (2,)), size=2 * 4 * 4)
    b = ScheduleBuilder(c, input=[4], output=[3, 3, 2])
    with pytest.raises(ScheduleError, match=r"^the output chunks of rank 0 do not align with "
                       r"the allgather blocks: block 1 starts at element 4, which is inside a "
                       r"chunk \(chunk boundaries of rank 0: 0, 3, 6, 8\)"):
        verify(b.build("x"))
    b = ScheduleBuilder(c, input=[4], output=[4])
    with pytest.raises(ScheduleError, match=r"^the output layout of rank 0 has 4 elements, but "
                       r"a allgather of 32 B \(fp32\) on 2 ranks needs 8 in that buffer$"):
        verify(b.build("x"))


# -- routes ----------------------------------------------------------------------------------

def _a2a_on(topo):
    s = build(coll(K.ALLTOALL, topo))
    remote = np.flatnonzero(s.ops.src != s.ops.dst)
    return s, int(remote[0])


def test_route_over_a_failed_link():
    t = torus("r", (4,))
    s = build(coll(K.ALLTOALL, t))
    # the same schedule on the machine after link (0)->(1) failed
    faulty = with_faults(t, links=[(0, 1)])
    c = coll(K.ALLTOALL, faulty)
    bad = s.replace(collective=c)
    i = int(np.flatnonzero((s.ops.src == 0) & (s.ops.dst == 1))[0])
    link = t.link_id(0, 1)
    r = int(s.ops.route[i])
    assert first_line(bad, i) == (
        f"op #{i} (step 1: copy 0.i[1] -> 1.o[0] via {link}): route {r} uses link {link} "
        "((0)->(1)), which has failed")


def test_route_with_a_missing_link():
    s, _ = _a2a_on(torus("r", (4,)))
    b = ScheduleBuilder(s.collective, input=s.layouts[0], output=s.layouts[1])
    b.add(step=0, src=0, dst=1, route=b.route([99]), src_buf=Buf.INPUT, src_off=1,
          dst_buf=Buf.OUTPUT, dst_off=0)
    assert first_line(b.build("x")).endswith(
        ": route 1 uses link 99, which does not exist (the topology has links 0..7)")


def test_route_that_is_not_a_path_or_goes_elsewhere():
    t = torus("r", (4,))
    c = coll(K.ALLTOALL, t)
    hop = {(u, v): t.link_id(u, v) for u in range(4) for v in range(4) if t.link_id(u, v)
           is not None}
    cases = [
        ((hop[0, 1], hop[2, 3]), 0, 3, ("route 1 is not a path: link "
         f"{hop[0, 1]} ((0)->(1)) is followed by link {hop[2, 3]} ((2)->(3))")),
        ((hop[1, 2],), 0, 2, "route 1 starts at (1), but the source rank 0 is (0)"),
        ((hop[0, 1],), 0, 2, "route 1 ends at (1), but the destination rank 2 is (2)"),
    ]
    for links, src, dst, words in cases:
        b = ScheduleBuilder(c, input=[2] * 4, output=[2] * 4)
        b.add(step=0, src=src, dst=dst, route=b.route(links), src_buf=Buf.INPUT,
              src_off=dst, dst_buf=Buf.OUTPUT, dst_off=src)
        assert first_line(b.build("x")).endswith(": " + words)


def test_local_ops_use_route_zero_and_remote_ops_do_not():
    s, i = _a2a_on(torus("r", (4,)))
    rt = s.ops.route.copy()
    rt[i] = 0
    assert first_line(with_ops(s, route=rt), i).endswith(
        f": ranks {int(s.ops.src[i])} and {int(s.ops.dst[i])} differ but the op uses the "
        "empty route 0")
    rt = s.ops.route.copy()
    rt[0] = 1
    assert first_line(with_ops(s, route=rt), 0).endswith(
        ": a local op (source rank == destination rank) must use the empty route 0, not "
        "route 1")


# -- ordering and the postcondition ----------------------------------------------------------

def test_first_violation_in_step_order_is_reported():
    s = build(coll(K.ALLGATHER))
    n = len(s.ops)
    # a late op (step 1) with a bad offset and an early one (step 0) reading an empty slot,
    # stored out of step order: the step-0 fault comes first
    cols = {k: np.array(v) for k, v in s.ops.columns().items()}
    last = n - 1
    cols["dst_off"][last] = 9
    cols["src_buf"][0] = Buf.SCRATCH
    order = np.r_[last, np.arange(n - 1)]
    shuffled = s.replace(ops=Ops(**{k: v[order] for k, v in cols.items()}),
                         layouts=(s.layouts[0], s.layouts[1], np.array([2])))
    assert first_line(shuffled, 1) == (
        "op #1 (step 0: copy 0.s[0] -> 0.o[0]): reads rank 0's scratch chunk 0, which is "
        "empty (no earlier step wrote it)")
    # with the early fault repaired, the late static fault is reported
    cols["src_buf"][0] = Buf.INPUT
    shuffled = s.replace(ops=Ops(**{k: v[order] for k, v in cols.items()}))
    assert "destination chunks 9..9 are out of bounds" in first_line(shuffled, 0)


def test_missing_contribution_at_the_end():
    s = build(coll(K.ALLREDUCE))
    bad = without_op(s, 5)
    with pytest.raises(ScheduleError) as e:
        verify(bad)
    lines = e.value.message.splitlines()
    assert lines[0] == (
        "rank 1 at (1): output chunk 0 (elements 0..1) holds the sum of result elements 0..1 "
        "over ranks {0-1,3}; it should hold the sum of result elements 0..1 over ranks {0-3} "
        "(missing the contribution of rank(s) {2})")
    assert lines[1] == "last written by op #12 (step 3: reduce 0.i[0+2] -> 1.o[0+2] via 0)"
    assert format_schedule(bad, around=12) in e.value.message


def test_wrong_block_at_the_end():
    s = build(coll(K.ALLTOALL))
    bad = with_ops(s, src_off=np.roll(s.ops.src_off, 1))
    assert first_line(bad) == (
        "rank 0 at (0): output chunk 0 (elements 0..1, the block from rank 0) holds rank 0's "
        "input elements 4..5 (its block for rank 2); it should hold rank 0's input elements "
        "0..1 (its block for rank 0)")


def test_reduce_leaves_other_outputs_unspecified():
    s = build(coll(K.REDUCE, root=1))
    verify(s)
    # dropping the root's local copy loses its own contribution: reported
    i = int(np.flatnonzero((s.ops.src == 1) & (s.ops.dst == 1))[0])
    assert "is empty" in first_line(without_op(s, i)) or "reduces into" in first_line(
        without_op(s, i))


def test_empty_schedule_fails_on_the_outputs():
    s = build(coll(K.ALLGATHER))
    assert first_line(s.replace(ops=Ops.empty())) == (
        "rank 0 at (0): output chunk 0 (elements 0..1, the block from rank 0) is empty at the "
        "end: no op writes it; it should hold rank 0's input elements 0..1")


@pytest.mark.parametrize("kind", list(K))
def test_dropping_any_one_op_fails(kind):
    s = build(coll(kind, torus("t", (3,)), dtype=DType.INT8,
                   root=0 if kind in (K.BROADCAST, K.REDUCE) else None))
    for i in range(len(s.ops)):
        with pytest.raises(ScheduleError, match=r"empty|missing|reduces into"):
            verify(without_op(s, i))


def test_golden_format_schedule():
    c = coll(K.ALLGATHER, torus("line", (2,), wrap=(False,)))
    s = naive = build(c)
    assert naive is s
    assert format_schedule(s) == GOLDEN
    assert format_schedule(s, around=2, context=1) == GOLDEN_AROUND


GOLDEN = """\
schedule allgather: allgather on 2 ranks, 16 B fp32, algorithm naive, schedule -
  input: 1 chunks of 2 elements
  output: 2 chunks of 2 elements
  scratch: 0 chunks
   #0 step 0: copy 0.i[0] -> 0.o[0]
   #1 step 0: copy 1.i[0] -> 1.o[1]
   #2 step 1: copy 0.i[0] -> 1.o[0] via 0
   #3 step 1: copy 1.i[0] -> 0.o[1] via 1"""

GOLDEN_AROUND = """\
   #1 step 0: copy 1.i[0] -> 1.o[1]
>> #2 step 1: copy 0.i[0] -> 1.o[0] via 0
   #3 step 1: copy 1.i[0] -> 0.o[1] via 1"""


def test_split_and_merge_in_a_reduction():
    c = coll(K.ALLREDUCE, torus("r", (2,)))               # 4 elements
    b = ScheduleBuilder(c, input=[2, 2], output=[1, 3], scratch=[2, 2])
    for r in range(2):
        b.add(step=0, src=r, dst=r, count=2, src_buf=Buf.INPUT, src_off=0,
              dst_buf=Buf.OUTPUT, dst_off=0)
        b.add(step=1, src=1 - r, dst=r, route=route(b, 1 - r, r), count=2, kind=OpKind.REDUCE,
              src_buf=Buf.INPUT, src_off=0, dst_buf=Buf.OUTPUT, dst_off=0)
    verify(b.build("split"))
    b = ScheduleBuilder(c, input=[2, 2], output=[1, 3], scratch=[2, 2])
    b.add(step=0, src=0, dst=0, count=2, src_buf=Buf.INPUT, src_off=0, dst_buf=Buf.SCRATCH,
          dst_off=0)
    b.add(step=1, src=1, dst=0, route=route(b, 1, 0), kind=OpKind.REDUCE, src_buf=Buf.INPUT,
          src_off=1, dst_buf=Buf.SCRATCH, dst_off=1)
    b.add(step=2, src=0, dst=0, count=2, src_buf=Buf.SCRATCH, src_off=0, dst_buf=Buf.OUTPUT,
          dst_off=0)
    assert first_line(b.build("mixed"), 2) == (
        "op #2 (step 2: copy 0.s[0+2] -> 0.o[0+2]): rank 0's output chunk 1 would receive "
        "elements with different sets of contributions ({0} and {0-1})")
