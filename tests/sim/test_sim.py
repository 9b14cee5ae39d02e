"""The cost simulator against closed forms, and the event mode against lockstep."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sim_builders import chain, direct_alltoall, ring_allgather

import cclc.sim
from cclc.collective import CollectiveKind, DType, make_collective
from cclc.errors import ScheduleError
from cclc.ir import Buf, ScheduleBuilder
from cclc.nccl_model import bus_factor
from cclc.sim import simulate
from cclc.topology import torus

B = 10e9        # 10 GB/s
LAT = 1e-6


def one_link_schedule(nbytes: int, messages: int = 1, latency: float = LAT):
    """Broadcast on two ranks joined by one link pair: ``messages`` messages 0 -> 1 in step 0."""
    t = torus("pair", (2,), wrap=[False], bandwidth=B, latency=latency)
    coll = make_collective("bc", CollectiveKind.BROADCAST, t, (0, 1), size=nbytes * messages,
                           dtype=DType.UINT8, root=0)
    b = ScheduleBuilder(coll, input=[nbytes] * messages, output=[nbytes] * messages)
    r = b.route((t.link_id(0, 1),))
    idx = np.arange(messages)
    b.add(step=0, src=0, dst=1, route=r, src_buf=Buf.INPUT, src_off=idx, dst_buf=Buf.OUTPUT,
          dst_off=idx)
    b.add(step=0, src=0, dst=0, src_buf=Buf.INPUT, src_off=idx, dst_buf=Buf.OUTPUT, dst_off=idx)
    return b.build("hand")


@pytest.mark.parametrize("mode", ["lockstep", "event"])
def test_one_link_is_latency_plus_bytes_over_bandwidth(mode):
    s = one_link_schedule(1 << 20)
    r = simulate(s, mode=mode)
    assert r.time == pytest.approx(LAT + (1 << 20) / B, rel=1e-12)
    assert r.algbw == pytest.approx((1 << 20) / r.time)
    assert r.busbw == pytest.approx(r.algbw)             # broadcast: factor 1
    link = s.topology.link_id(0, 1)
    assert r.link_bytes[link] == 1 << 20
    assert r.link_busy[link] == pytest.approx((1 << 20) / B)
    assert r.link_bytes.sum() == 1 << 20                 # the local copy uses no link
    assert r.step_busiest_link == (link,)


@pytest.mark.parametrize("mode", ["lockstep", "event"])
def test_two_messages_on_one_link_take_twice_as_long(mode):
    one = simulate(one_link_schedule(4096, 1, latency=0.0), mode=mode).time
    two = simulate(one_link_schedule(4096, 2, latency=0.0), mode=mode).time
    assert two == pytest.approx(2 * one, rel=1e-12)
    # with latency the bandwidth term doubles, the latency does not
    two_lat = simulate(one_link_schedule(4096, 2), mode=mode).time
    assert two_lat == pytest.approx(LAT + 2 * 4096 / B, rel=1e-12)


@pytest.mark.parametrize("n", [2, 3, 5, 8])
@pytest.mark.parametrize("mode", ["lockstep", "event"])
def test_ring_allgather_matches_the_closed_form(n, mode):
    size = n * 3000
    t = torus("ring", (n,), bandwidth=B, latency=LAT)
    s = ring_allgather(t, size)
    r = simulate(s, mode=mode)
    assert r.time == pytest.approx((n - 1) * (LAT + size / n / B), rel=1e-12)
    assert r.busbw == pytest.approx(size / r.time * (n - 1) / n)
    # every + link carries n-1 blocks; the - links none
    plus = [t.link_id(i, (i + 1) % n) for i in range(n)]
    assert np.allclose(r.link_bytes[plus], (n - 1) * size / n)
    assert r.link_bytes.sum() == pytest.approx(n * (n - 1) * size / n)


def test_ring_allgather_on_a_ring_of_a_torus():
    t = torus("t", (4, 3), bandwidth=B, latency=LAT)
    group = t.ring(1, 0)                                 # (0,1) (1,1) (2,1) (3,1)
    s = ring_allgather(t, 4 * 1000, group)
    assert simulate(s).time == pytest.approx(3 * (LAT + 1000 / B), rel=1e-12)


def test_lockstep_step_is_its_slowest_op():
    """A step: one op over 2 hops (latency 2a, a link busy b) and two ops sharing a link (busy
    2b, latency a): the step lasts max(2a + b, a + 2b), per op, not max latency + max busy."""
    t = torus("line", (3,), wrap=[False], bandwidth=B, latency=LAT)
    coll = make_collective("bc", CollectiveKind.BROADCAST, t, (0, 1, 2), size=3000,
                           dtype=DType.UINT8, root=0)
    b = ScheduleBuilder(coll, input=[1000] * 3, output=[1000] * 3)
    far = b.route(t.shortest_path_links(0, 2))
    near = b.route(t.shortest_path_links(2, 1))
    b.add(step=0, src=0, dst=2, route=far, src_buf=Buf.INPUT, src_off=0, dst_buf=Buf.OUTPUT,
          dst_off=0)
    b.add(step=0, src=2, dst=1, route=near, src_buf=Buf.INPUT, src_off=[1, 2],
          dst_buf=Buf.OUTPUT, dst_off=[1, 2])
    s = b.build("hand")
    bt = 1000 / B
    r = simulate(s)
    assert r.time == pytest.approx(max(2 * LAT + bt, LAT + 2 * bt), rel=1e-12)
    assert r.critical_path == ((0,) if 2 * LAT + bt >= LAT + 2 * bt else (1,))


def test_pipelined_chain_event_beats_lockstep_by_the_closed_forms():
    hops, chunks, size = 4, 8, 8 * 5000
    t = torus("line", (hops + 1,), wrap=[False], bandwidth=B, latency=LAT)
    s = chain(t, size, chunks)
    per = size / chunks / B
    lock = simulate(s, mode="lockstep")
    event = simulate(s, mode="event")
    assert lock.time == pytest.approx((chunks + hops - 1) * (LAT + per), rel=1e-12)
    # the first hop streams every chunk back to back; the last chunk then crosses the other
    # hops one after another
    assert event.time == pytest.approx(chunks * per + (hops - 1) * (per + LAT) + LAT, rel=1e-12)
    assert event.time < lock.time
    # the critical path starts at time 0, ends with the op that finishes last, and runs
    # forward in time: the last chunk's first hop waits for the 7 chunks before it on the link
    path = event.critical_path
    assert event.op_start[path[0]] == 0.0
    assert event.op_finish[path[-1]] == pytest.approx(event.time)
    assert all(np.diff(event.op_finish[list(path)]) > 0)
    assert len(path) == chunks + hops - 1


@pytest.mark.parametrize("latency", [0.0, LAT])
def test_event_equals_lockstep_on_a_single_step(latency):
    t = torus("t", (3, 4), bandwidth=B, latency=latency)
    if latency:
        # one route latency for every op: only neighbour exchanges
        s = ring_allgather(t, 4 * 800, t.ring(0, 1))
        s = s.replace(ops=s.ops.take(s.ops.step == 0))
    else:
        s = direct_alltoall(t, 12 * 1000)
    assert s.n_steps == 1
    lock, event = simulate(s, "lockstep"), simulate(s, "event")
    assert event.time == pytest.approx(lock.time, rel=1e-12)


def test_event_waits_for_readers_before_overwriting():
    """Write-after-read: step 1 overwrites a chunk that a slow step-0 op still reads."""
    t = torus("line", (3,), wrap=[False], bandwidth=B, latency=0.0)
    coll = make_collective("bc", CollectiveKind.BROADCAST, t, (0, 1, 2), size=3000,
                           dtype=DType.UINT8, root=0)
    b = ScheduleBuilder(coll, input=[1000], output=[1000])
    b.add(step=0, src=0, dst=2, route=b.route(t.shortest_path_links(0, 2)),
          src_buf=Buf.INPUT, src_off=0, dst_buf=Buf.OUTPUT, dst_off=0)
    b.add(step=1, src=1, dst=0, route=b.route(t.shortest_path_links(1, 0)),
          src_buf=Buf.INPUT, src_off=0, dst_buf=Buf.INPUT, dst_off=0)
    r = simulate(b.build("hand"), mode="event")
    assert r.op_start[1] == pytest.approx(r.op_finish[0])
    assert r.critical_path == (0, 1)


def test_event_reads_wait_for_their_writer():
    t = torus("ring", (6,), bandwidth=B, latency=LAT)
    s = ring_allgather(t, 6 * 600)
    r = simulate(s, mode="event")
    step = s.ops.step
    for k in range(1, s.n_steps):
        assert r.op_start[step == k].min() >= r.op_finish[step == k - 1].min() - 1e-18


def test_local_ops_are_free_unless_given_a_memory_bandwidth():
    s = one_link_schedule(1000)
    base = simulate(s).time
    assert simulate(s, local_bandwidth=1e12).time == pytest.approx(base)   # hidden by the link
    slow = simulate(s, local_bandwidth=1e8).time
    assert slow == pytest.approx(1000 / 1e8)
    assert simulate(s, mode="event", local_bandwidth=1e8).time == pytest.approx(slow)
    with pytest.raises(ScheduleError, match="local memory bandwidth"):
        simulate(s, local_bandwidth=0.0)


def test_unknown_mode_is_an_error():
    with pytest.raises(ScheduleError, match="unknown simulation mode 'fast'"):
        simulate(one_link_schedule(8), mode="fast")


def test_per_step_breakdown():
    t = torus("ring", (5,), bandwidth=B, latency=LAT)
    s = ring_allgather(t, 5 * 1000)
    r = simulate(s)
    assert r.n_steps == 4
    assert np.allclose(r.step_time, LAT + 1000 / B)
    assert np.allclose(r.step_start, np.arange(4) * (LAT + 1000 / B))
    assert np.allclose(r.step_bytes, 5 * 1000)
    assert all(link in {t.link_id(i, (i + 1) % 5) for i in range(5)}
               for link in r.step_busiest_link)
    assert r.percent_of(r.time / 2) == pytest.approx(50.0)
    assert list(r.busiest_links(3)) == sorted(r.busiest_links(3).tolist())   # ties: lowest id


def test_bus_factors_follow_nccl_tests():
    K = CollectiveKind
    assert bus_factor(K.ALLREDUCE, 8) == pytest.approx(1.75)
    for k in (K.ALLGATHER, K.REDUCESCATTER, K.ALLTOALL):
        assert bus_factor(k, 8) == pytest.approx(0.875)
    assert bus_factor(K.BROADCAST, 8) == bus_factor(K.REDUCE, 8) == 1.0


@st.composite
def random_schedules(draw):
    """Random ops (any routes of healthy links, random steps, chunks, sizes) on a small torus:
    the simulator does not need a correct schedule, only a well-formed one."""
    dims = draw(st.sampled_from([(3,), (4,), (2, 3), (3, 3)]))
    lat = draw(st.sampled_from([0.0, 1e-7, 1e-6]))
    t = torus("t", dims, bandwidth=draw(st.sampled_from([B, [B, B / 2]]))
              if len(dims) == 2 else B, latency=lat)
    n = t.n_ranks
    coll = make_collective("a2a", CollectiveKind.ALLTOALL, t, tuple(range(n)), size=n * 64,
                           dtype=DType.UINT8)
    b = ScheduleBuilder(coll, input=[64] * n, output=[64] * n, scratch=[64] * n)
    for _ in range(draw(st.integers(1, 25))):
        src, dst = draw(st.integers(0, n - 1)), draw(st.integers(0, n - 1))
        route = b.route(t.shortest_path_links(src, dst))
        b.add(step=draw(st.integers(0, 5)), src=src, dst=dst, route=route,
              src_buf=draw(st.sampled_from(list(Buf))), src_off=draw(st.integers(0, n - 1)),
              dst_buf=draw(st.sampled_from([Buf.OUTPUT, Buf.SCRATCH])),
              dst_off=draw(st.integers(0, n - 1)))
    return b.build("random")


@settings(max_examples=60, deadline=None)
@given(random_schedules())
def test_event_is_never_slower_than_lockstep(s):
    lock, event = simulate(s, "lockstep"), simulate(s, "event")
    assert event.time <= lock.time * (1 + 1e-12)
    assert np.array_equal(lock.link_bytes, event.link_bytes)
    # every op finishes no later than its lockstep step ends, and no earlier than its own cost
    assert (event.op_finish <= lock.op_finish * (1 + 1e-12) + 1e-18).all()
    assert (event.op_finish >= event.op_start - 1e-18).all()
    assert lock.time == pytest.approx(lock.step_time.sum(), rel=1e-12)
    # no link is busy longer than the schedule lasts
    assert (lock.link_busy <= lock.time * (1 + 1e-12)).all()
    assert (event.link_busy <= event.time * (1 + 1e-12)).all()


def test_an_op_outside_its_buffer_is_an_error_not_a_crash():
    s = one_link_schedule(100)
    cols = s.ops.columns()
    cols["src_off"] = np.array([0, 5], dtype=np.int32)     # the input has one chunk
    broken = s.replace(ops=type(s.ops)(**cols))
    for mode in ("lockstep", "event"):
        with pytest.raises(ScheduleError, match=r"op #1 reads or writes outside"):
            simulate(broken, mode=mode)


@settings(max_examples=25, deadline=None)
@given(st.sampled_from([(4,), (3, 3), (2, 3, 2)]), st.integers(1, 64), st.booleans())
def test_the_critical_path_is_each_steps_first_op_of_the_longest(dims, kib, ring):
    """The lockstep path names, in step order, the lowest-numbered op among those that set
    each step's length (every op of a ring step ties; a direct step's longest routes win)."""
    t = torus("t", dims, bandwidth=B, latency=LAT)
    s = ring_allgather(t, kib * 1024 * t.n_ranks) if ring else direct_alltoall(
        t, kib * 1024 * t.n_ranks ** 2, pipelined_steps=True)
    r = simulate(s, "lockstep")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cclc.sim, "_OP_BLOCK", 3)        # the ties looked for a few ops at a time
        assert simulate(s, "lockstep").critical_path == r.critical_path
    want = []
    for step in range(s.n_steps):
        ops = np.flatnonzero(s.ops.step == step)
        if len(ops):
            finish = r.op_finish[ops]
            want.append(int(ops[np.flatnonzero(finish == finish.max())[0]]))
    assert r.critical_path == tuple(want)
