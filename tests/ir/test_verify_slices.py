"""The verifier holding a reduction's contributor sets a slice of ranks at a time gives the
verdict and the message it gives holding them whole, on random schedules and on corrupted
ones (``cclc.verify``: ``verify(schedule, slice_ranks_per_pass)``)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ir_builders import (
    K,
    coll,
    direct_allreduce,
    direct_reduce,
    direct_reducescatter,
    route,
    with_ops,
)

from cclc.algorithms import algorithms_for
from cclc.collective import make_collective
from cclc.errors import CclError, ScheduleError
from cclc.ir import Buf, OpKind, ScheduleBuilder
from cclc.topology import torus
from cclc.verify import SLICE_BYTES, holds_whole_sets, verify

SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


def _verdict(schedule, width=None) -> str | None:
    try:
        verify(schedule, width)
    except ScheduleError as e:
        return str(e)
    return None


def _split_and_merge(c):
    """An AllReduce on 2 ranks whose reductions split 2+2-element chunks into 1+3."""
    b = ScheduleBuilder(c, input=[2, 2], output=[1, 3], scratch=[2, 2])
    for r in range(2):
        b.add(step=0, src=r, dst=r, count=2, src_buf=Buf.INPUT, src_off=0,
              dst_buf=Buf.SCRATCH, dst_off=0)
        b.add(step=1, src=1 - r, dst=r, route=route(b, 1 - r, r), count=2,
              kind=OpKind.REDUCE, src_buf=Buf.INPUT, src_off=0, dst_buf=Buf.SCRATCH,
              dst_off=0)
        b.add(step=2, src=r, dst=r, count=2, src_buf=Buf.SCRATCH, src_off=0,
              dst_buf=Buf.OUTPUT, dst_off=0)
    return b.build("split")


def _registered(kind, n, draw):
    """A registered algorithm's schedule of ``kind`` on an ``n``-rank ring."""
    topo = torus("t", (n,))
    root = 0 if kind is K.REDUCE else None
    c = make_collective("c", kind, topo, tuple(range(n)), size=4 * n * n * 2, root=root)
    entries = [e for e in algorithms_for(c) if e.synthesize is None]
    entry = draw(st.sampled_from(entries))
    try:
        if entry.applicable(c) is not None:
            return None
        return entry.build(c)
    except CclError:
        return None


@st.composite
def schedules(draw):
    """A reduction's schedule (hand-built, registered, or splitting chunks), then corrupted
    in up to three op fields."""
    source = draw(st.sampled_from(["direct", "registered", "split"]))
    n = draw(st.integers(2, 7))
    if source == "split":
        s = _split_and_merge(coll(K.ALLREDUCE, torus("r", (2,))))
    elif source == "registered":
        s = _registered(draw(st.sampled_from([K.REDUCESCATTER, K.ALLREDUCE, K.REDUCE])), n,
                        draw)
        if s is None:
            s = direct_reducescatter(coll(K.REDUCESCATTER, n=n))
    else:
        kind = draw(st.sampled_from([K.REDUCESCATTER, K.ALLREDUCE, K.REDUCE]))
        c = coll(kind, n=n, root=0 if kind is K.REDUCE else None)
        s = {K.REDUCESCATTER: direct_reducescatter, K.ALLREDUCE: direct_allreduce,
             K.REDUCE: direct_reduce}[kind](c)
    for _ in range(draw(st.integers(0, 3))):
        s = _corrupt(s, draw)
    return s


def _corrupt(s, draw):
    """``s`` with one field of one op changed, or one op dropped or repeated (in its step or
    after the last)."""
    o = s.ops
    i = draw(st.integers(0, len(o) - 1))
    way = draw(st.sampled_from(["drop", "repeat", "again", "kind", "src", "src_off", "dst_off",
                                "step", "count", "src_buf", "dst_buf"]))
    if way == "drop":
        keep = np.ones(len(o), dtype=bool)
        keep[i] = False
        return s.replace(ops=o.take(keep))
    if way in ("repeat", "again"):
        s = s.replace(ops=o.take(np.append(np.arange(len(o)), i)))
        if way == "again":          # once more in a step of its own, at the end
            step = s.ops.step.copy()
            step[-1] = int(step.max()) + 1
            s = with_ops(s, step=step)
        return s
    col = getattr(o, way).copy()
    if way == "kind":
        col[i] = OpKind.COPY if col[i] == OpKind.REDUCE else OpKind.REDUCE
    elif way == "src":
        col[i] = draw(st.integers(0, s.n - 1))
    elif way in ("src_buf", "dst_buf"):
        col[i] = draw(st.sampled_from(list(Buf)))
    else:
        col[i] = max(0, int(col[i]) + draw(st.sampled_from([-1, 1, 2])))
    return with_ops(s, **{way: col})


@SETTINGS
@given(schedules(), st.sampled_from([1, 2, 3, 5]))
def test_sliced_and_whole_give_the_same_verdict_and_message(s, width):
    assert _verdict(s, width) == _verdict(s)


@pytest.mark.parametrize("width", [1, 2, 3, 64])
def test_a_contribution_added_twice_is_found_in_the_slice_that_holds_it(width):
    s = direct_reducescatter(coll(K.REDUCESCATTER, n=4))
    i = len(s.ops) - 1
    src, rt = s.ops.src.copy(), s.ops.route.copy()
    src[i], rt[i] = 3, 0          # rank 3 re-sends its own contribution to itself
    bad = with_ops(s, src=src, route=rt)
    assert _verdict(bad, width) == _verdict(bad)
    assert "adds the contribution of rank(s) {3} twice" in (_verdict(bad, width) or "")


def test_slices_of_whole_words_beyond_the_first_word():
    # 70 ranks: a slice of 64 and one of 6; the repeated op re-adds rank 68's contribution
    s = direct_reducescatter(coll(K.REDUCESCATTER, n=70))
    i = int(np.flatnonzero((s.ops.src == 68) & (s.ops.kind == OpKind.REDUCE))[0])
    step = np.append(s.ops.step, int(s.ops.step.max()) + 1)
    bad = with_ops(s.replace(ops=s.ops.take(np.append(np.arange(len(s.ops)), i))), step=step)
    assert _verdict(s, 64) is None
    assert _verdict(bad, 64) == _verdict(bad)
    assert "adds the contribution of rank(s) {68} twice" in (_verdict(bad) or "")


def test_the_sets_are_held_whole_up_to_the_slice_size():
    # 4,096 ranks, 2n + 1 chunk slots each: 64 words of contributor bits per slot whole
    # (16 GiB) are numbered instead; 2,048 ranks' with 2n slots each (32 words) are 2 GiB
    assert SLICE_BYTES == 2 << 30
    assert not holds_whole_sets(4096, 4096 * (2 * 4096 + 1))
    assert holds_whole_sets(2048, 2048 * 2 * 2048)
    assert not holds_whole_sets(2049, 2049 * 2 * 2049)


def test_verify_numbers_the_sets_when_whole_they_pass_the_slice_size(monkeypatch):
    import cclc.verify as verify_module

    s = direct_reducescatter(coll(K.REDUCESCATTER, n=5))
    i = len(s.ops) - 1
    src, rt = s.ops.src.copy(), s.ops.route.copy()
    src[i], rt[i] = int(s.ops.dst[i]), 0
    bad = with_ops(s, src=src, route=rt)
    whole = _verdict(bad)
    # a slice size below one word per slot: verify's own choice is the sliced run
    monkeypatch.setattr(verify_module, "SLICE_BYTES", 8)
    assert not holds_whole_sets(5, 5 * sum(s.n_chunks(b) for b in Buf))
    assert _verdict(s) is None
    assert _verdict(bad) == whole and "twice" in (whole or "")
