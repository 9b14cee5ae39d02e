"""The numeric interpreter agrees with numpy for every dtype and op, and catches bad data."""

from __future__ import annotations

import numpy as np
import pytest
from ir_builders import K, build, coll, direct_alltoall, with_ops

from cclc.collective import DType, ReduceOp
from cclc.errors import ScheduleError
from cclc.ir import Buf, ScheduleBuilder
from cclc.numeric import _round_bf16, check_numeric
from cclc.topology import torus


@pytest.mark.parametrize("kind", list(K))
def test_every_dtype_and_op_matches_numpy(kind):
    for dtype in DType:
        s = build(coll(kind, torus("t", (2, 3)), dtype=dtype,
                       root=4 if kind in (K.BROADCAST, K.REDUCE) else None))
        check_numeric(s, seed=1)


def test_many_ranks_keep_float_sums_exact():
    # 70 ranks: more contributions than bf16 represents exactly if all were nonzero
    s = build(coll(K.ALLREDUCE, torus("r", (70,)), dtype=DType.BF16))
    check_numeric(s, dtypes=[DType.BF16, DType.FP16], ops=[ReduceOp.SUM, ReduceOp.PROD])


def test_nonuniform_alltoall():
    pairs = np.array([[4, 8, 0], [0, 4, 12], [8, 4, 4]])
    check_numeric(direct_alltoall(coll(K.ALLTOALL, torus("r", (3,)), pair_sizes=pairs)))


def test_wrong_block_is_caught():
    s = build(coll(K.ALLTOALL, dtype=DType.INT32))
    bad = with_ops(s, src_off=np.roll(s.ops.src_off, 1))
    with pytest.raises(ScheduleError, match=r"^numeric check \(int32, real chunk sizes\): rank 0 "
                       r"output element 0 \(chunk 0\) is .* but numpy's reference is "):
        check_numeric(bad, dtypes=[DType.INT32])


def test_missing_contribution_is_caught_for_every_dtype():
    s = build(coll(K.ALLREDUCE))
    keep = np.ones(len(s.ops), dtype=bool)
    keep[5] = False
    bad = s.replace(ops=s.ops.take(keep))
    for dtype in DType:
        with pytest.raises(ScheduleError, match=rf"^numeric check \({dtype.value} max, "):
            check_numeric(bad, dtypes=[dtype], ops=[ReduceOp.MAX])


def test_reading_garbage_is_caught():
    # rank 0 copies its (never written) scratch into its output: NaN / garbage shows up
    c = coll(K.ALLGATHER, torus("r", (2,)))
    b = ScheduleBuilder(c, input=[2], output=[2, 2], scratch=[2])
    b.add(step=0, src=0, dst=0, src_buf=Buf.SCRATCH, src_off=0, dst_buf=Buf.OUTPUT, dst_off=0)
    b.add(step=0, src=1, dst=1, src_buf=Buf.INPUT, src_off=0, dst_buf=Buf.OUTPUT, dst_off=1)
    b.add(step=0, src=1, dst=0, route=b.route([1]), src_buf=Buf.INPUT, src_off=0,
          dst_buf=Buf.OUTPUT, dst_off=1)
    b.add(step=0, src=0, dst=1, route=b.route([0]), src_buf=Buf.INPUT, src_off=0,
          dst_buf=Buf.OUTPUT, dst_off=0)
    for dtype in (DType.FP32, DType.INT64):
        with pytest.raises(ScheduleError, match=r"rank 0 output element 0 \(chunk 0\)"):
            check_numeric(b.build("x"), dtypes=[dtype])


def test_big_chunks_run_scaled_by_their_gcd():
    # 6000 elements per block: too big for a limit of 1000, exact at one element per 2000
    c = coll(K.REDUCESCATTER, torus("r", (3,)), size=3 * 6000 * 4)
    b = ScheduleBuilder(c, input=[2000, 4000] * 3, output=[2000, 4000])
    from ir_builders import route

    for r in range(3):
        for k in range(3):
            i = (r + k) % 3
            b.add(step=k, src=i, dst=r, route=route(b, i, r), kind=0 if k == 0 else 1, count=2,
                  src_buf=Buf.INPUT, src_off=2 * r, dst_buf=Buf.OUTPUT, dst_off=0)
    s = b.build("x")
    check_numeric(s, max_elements=1000)
    keep = np.ones(len(s.ops), dtype=bool)
    keep[-1] = False
    with pytest.raises(ScheduleError, match=r"one element per 2000"):
        check_numeric(s.replace(ops=s.ops.take(keep)), max_elements=1000, dtypes=[DType.FP64])


def test_stand_in_sizes_when_gcd_is_not_enough():
    # co-prime chunk sizes (gcd 1): stand-ins of 1..4 elements keep the shape
    pairs = np.array([[7, 11, 13], [17, 19, 23], [29, 31, 37]]) * 4
    s = direct_alltoall(coll(K.ALLTOALL, torus("r", (3,)), pair_sizes=pairs))
    check_numeric(s, max_elements=100)
    bad = with_ops(s, src_off=np.roll(s.ops.src_off, 1))
    with pytest.raises(ScheduleError, match=r"stand-in chunk sizes of 1\.\.4 elements"):
        check_numeric(bad, max_elements=100, dtypes=[DType.INT32])


def test_stand_ins_that_would_break_the_blocks_are_refused():
    # input block 0->1 is one chunk of 5 elements, output block is 2+3: stand-ins disagree
    pairs = np.array([[4, 20], [20, 4]]) * 4
    c = coll(K.ALLTOALL, torus("r", (2,)), pair_sizes=pairs)
    b = ScheduleBuilder(c, input=[[4, 20], [20, 4]], output=[[4, 9, 11], [9, 11, 4]])
    with pytest.raises(ScheduleError, match=r"the numeric check cannot run this alltoall with "
                       r"stand-in chunk sizes of 1\.\.4 elements: the blocks would no longer "
                       r"match; raise max_elements"):
        check_numeric(b.build("x"), max_elements=10)


def test_bf16_rounding():
    x = np.array([1.0, 257.0, 1 + 2**-8, 1 + 3 * 2**-9, -3.0, np.nan], dtype=np.float32)
    got = _round_bf16(x)
    assert got[:5].tolist() == [1.0, 256.0, 1.0, 1 + 2**-7, -3.0]
    assert np.isnan(got[5])
