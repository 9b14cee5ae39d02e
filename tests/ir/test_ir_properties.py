"""Property tests: hand-built schedules on random small machines verify, and any single
corrupted op is rejected."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from ir_builders import K, build, with_ops, without_op

from cclc.collective import DType, ReduceOp, make_collective
from cclc.errors import CollectiveError, ScheduleError
from cclc.ir import Buf, OpKind
from cclc.numeric import check_numeric
from cclc.topology import torus, with_faults
from cclc.verify import verify

SETTINGS = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


@st.composite
def collectives(draw):
    nd = draw(st.integers(1, 3))
    dims = tuple(draw(st.integers(1, 4)) for _ in range(nd))
    wrap = tuple(draw(st.booleans()) for _ in range(nd))
    topo = torus("t", dims, wrap=wrap)
    if topo.n_links and draw(st.booleans()):
        link = draw(st.integers(0, topo.n_links - 1))
        topo = with_faults(topo, links=[(int(topo.link_src[link]), int(topo.link_dst[link]))])
    ranks = draw(st.lists(st.integers(0, topo.n_ranks - 1), min_size=1, max_size=6,
                          unique=True))
    kind = draw(st.sampled_from(list(K)))
    dtype = draw(st.sampled_from(list(DType)))
    per = draw(st.integers(1, 3))
    n = len(ranks)
    split = kind in (K.ALLTOALL, K.ALLGATHER, K.REDUCESCATTER)
    size = per * dtype.itemsize * (n if split else 2)
    pair_sizes = None
    if kind is K.ALLTOALL and draw(st.booleans()):
        pair_sizes = np.array(draw(st.lists(st.integers(0, 3), min_size=n * n, max_size=n * n)))
        pair_sizes = pair_sizes.reshape(n, n) * dtype.itemsize
        assume(pair_sizes.sum(axis=1).max() > 0)
    root = draw(st.integers(0, n - 1)) if kind in (K.BROADCAST, K.REDUCE) else None
    try:
        return make_collective("c", kind, topo, tuple(ranks), size, dtype=dtype,
                               op=draw(st.sampled_from(list(ReduceOp))), root=root,
                               pair_sizes=pair_sizes)
    except CollectiveError:
        # the fault cut the group apart: not a machine this test is about
        assume(False)


@SETTINGS
@given(collectives())
def test_hand_built_schedules_verify_and_match_numpy(c):
    s = build(c)
    verify(s)
    check_numeric(s, dtypes=[c.dtype], ops=[c.op])


@SETTINGS
@given(collectives(), st.data())
def test_any_single_op_corruption_is_rejected(c, data):
    s = build(c)
    o = s.ops
    # an op that moves zero elements (a zero-size alltoall pair) changes nothing when dropped
    moving = np.flatnonzero(s.op_elems() > 0)
    i = int(data.draw(st.sampled_from(moving.tolist())))
    ways = ["drop", "kind"]
    if int(o.dst_buf[i]) == Buf.OUTPUT and s.n_chunks(Buf.OUTPUT) > 1 \
            and s.collective.kind in (K.ALLTOALL, K.ALLGATHER):
        ways.append("dst_off")
    others = [r for r in range(1, len(s.routes)) if r != int(o.route[i])]
    if others:
        ways.append("route")
    way = data.draw(st.sampled_from(ways))
    if way == "drop":
        bad = without_op(s, i)
    elif way == "kind":
        kind = o.kind.copy()
        kind[i] = OpKind.COPY if kind[i] == OpKind.REDUCE else OpKind.REDUCE
        bad = with_ops(s, kind=kind)
    elif way == "dst_off":
        off = o.dst_off.copy()
        off[i] = (off[i] + data.draw(st.integers(1, s.n_chunks(Buf.OUTPUT) - 1))) \
            % s.n_chunks(Buf.OUTPUT)
        bad = with_ops(s, dst_off=off)
    else:
        rt = o.route.copy()
        rt[i] = data.draw(st.sampled_from(others))
        bad = with_ops(s, route=rt)
    try:
        verify(bad)
    except ScheduleError:
        return
    raise AssertionError(f"corruption '{way}' of op {i} was accepted")


@SETTINGS
@given(collectives(), st.data())
def test_the_verdict_does_not_depend_on_the_order_the_ops_are_stored_in(c, data):
    """The verifier reads a step's ops in place where they lie together in op order and
    gathers them otherwise: a schedule and its ops in another order pass or fail alike,
    whole or with an op dropped."""
    s = build(c)
    moving = np.flatnonzero(s.op_elems() > 0)
    if len(moving) and data.draw(st.booleans()):
        s = without_op(s, int(data.draw(st.sampled_from(moving.tolist()))))
    order = np.array(data.draw(st.permutations(range(len(s.ops)))), dtype=np.int64)
    shuffled = s.replace(ops=type(s.ops)(**{k: v[order] for k, v in s.ops.columns().items()}))
    verdicts = []
    for x in (s, shuffled):
        try:
            verify(x)
            verdicts.append("passes")
        except ScheduleError:
            verdicts.append("fails")
    assert verdicts[0] == verdicts[1]
