"""The dataflow tables the NCCL library and its MPI build run, executed by an adversarial
interpreter: every interleaving the tables allow (an entry starts once its edges are done and
its lane has finished the groups before it; a message moves at any moment after both ends
started; local work happens at any moment after it started) must give the numpy reference
result and never deadlock. The MPI runs check one interleaving for real; this checks many."""

from __future__ import annotations

import random

import numpy as np
import pytest
from backend_helpers import (
    random_allgather,
    random_reducescatter,
    reference,
    swap_allreduce,
    swap_alltoall,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from backends.nccl.tables import DataflowRole, dataflow_tables
from backends.units import buffer_units, to_units
from cclc.collective import CollectiveKind, ReduceOp, make_collective
from cclc.ir import Buf, OpKind

_RED = {ReduceOp.SUM: np.add, ReduceOp.MAX: np.maximum, ReduceOp.MIN: np.minimum,
        ReduceOp.PROD: np.multiply}


def _run_tables(schedule, seed: int) -> None:
    t = dataflow_tables(schedule, *to_units(schedule, split=True))
    widths = buffer_units(t.units)
    coll = schedule.collective
    n = coll.n
    rng = np.random.default_rng(seed)
    pick = random.Random(seed)
    # at count = count_units every unit is one element
    inputs = [rng.integers(-50, 50, size=widths[Buf.INPUT]).astype(np.int64) for _ in range(n)]
    mem = [[inputs[r].copy(), np.zeros(widths[Buf.OUTPUT], np.int64),
            np.zeros(widths[Buf.SCRATCH], np.int64)] for r in range(n)]
    staging = [np.zeros(t.staging_units, np.int64) for _ in range(n)]
    red = _RED[coll.op]
    entries = t.entries
    groups = []                                  # per rank: lists of entry indices
    for r in range(n):
        gs = []
        for j, e in enumerate(entries[r]):
            if e.group:
                gs.append([j])
            else:
                assert gs and entries[r][gs[-1][0]].lane == e.lane
                gs[-1].append(j)
        groups.append(gs)
    lanes_q = [{} for _ in range(n)]             # rank -> lane -> queue of groups
    for r in range(n):
        for g in groups[r]:
            lanes_q[r].setdefault(entries[r][g[0]].lane, []).append(g)
    state = [[0] * len(entries[r]) for r in range(n)]     # 0 waiting, 1 started, 2 done
    posted: dict[tuple[int, int, int], list] = {}          # (src, dst, lane) -> sends/recvs
    local_started: set[tuple[int, int]] = set()

    def src_of(r, e):
        if e.stage is not None and e.role is not DataflowRole.SNAP:
            return staging[r][e.stage:e.stage + e.count]
        return mem[r][e.src_buf][e.src_off:e.src_off + e.count]

    def write(r, e, data):
        d = mem[r][e.dst_buf]
        sl = slice(e.dst_off, e.dst_off + e.count)
        d[sl] = red(d[sl], data) if e.kind is OpKind.REDUCE else data

    left = sum(len(x) for x in entries)
    while left:
        actions = []
        for r in range(n):
            for lane, q in lanes_q[r].items():
                if not q:
                    continue
                g = q[0]
                if state[r][g[0]] == 0 and all(state[r][d] == 2 for j in g
                                               for d in entries[r][j].deps):
                    actions.append(("start", r, lane))
        actions.extend(("local", r, j) for r, j in sorted(local_started))
        for key, (sends, recvs) in posted.items():
            if sends and recvs:
                actions.append(("move", key))
        assert actions, "deadlock: nothing can proceed"
        act = pick.choice(actions)
        if act[0] == "start":
            _, r, lane = act
            for j in lanes_q[r][lane][0]:
                e = entries[r][j]
                state[r][j] = 1
                if e.role is DataflowRole.SEND:
                    posted.setdefault((r, e.peer, lane), ([], []))[0].append(j)
                elif e.role is DataflowRole.RECV:
                    posted.setdefault((e.peer, r, lane), ([], []))[1].append(j)
                else:
                    local_started.add((r, j))
        elif act[0] == "local":
            _, r, j = act
            e = entries[r][j]
            if e.role is DataflowRole.SNAP:
                staging[r][e.stage:e.stage + e.count] = src_of(r, e)
            else:
                write(r, e, src_of(r, e).copy())
            state[r][j] = 2
            local_started.discard((r, j))
            left -= 1
        else:
            a, b, _ = act[1]
            sends, recvs = posted[act[1]]
            js, jr = sends.pop(0), recvs.pop(0)
            es, er = entries[a][js], entries[b][jr]
            assert es.count == er.count, "matched messages of different sizes"
            data = src_of(a, es).copy()
            if er.land is not None:            # lands in staging, then is reduced into place
                staging[b][er.land:er.land + er.count] = data
                data = staging[b][er.land:er.land + er.count].copy()
            write(b, er, data)
            state[a][js] = state[b][jr] = 2
            left -= 2
        for r in range(n):                     # a lane moves on when its head group is done
            for q in lanes_q[r].values():
                while q and all(state[r][j] == 2 for j in q[0]):
                    q.pop(0)
    want = reference(coll.kind, coll.op, inputs, coll.root)
    for r in range(n):
        if want[r] is not None:
            np.testing.assert_array_equal(mem[r][Buf.OUTPUT][:len(want[r])], want[r],
                                          err_msg=f"rank {r}")


@settings(max_examples=15, deadline=None)
@given(st.integers(2, 6), st.integers(0, 10**6), st.integers(0, 10**6))
def test_random_allgathers_under_any_interleaving(n, seed, order):
    _run_tables(random_allgather(n, seed), order)


@settings(max_examples=15, deadline=None)
@given(st.integers(2, 6), st.integers(0, 10**6), st.integers(0, 10**6))
def test_random_reducescatters_under_any_interleaving(n, seed, order):
    _run_tables(random_reducescatter(n, seed, op=ReduceOp.MAX), order)


@pytest.mark.parametrize("order", range(3))
def test_same_step_hazards_and_relayed_torus_schedules(order):
    # swaps read slots their own step rewrites (snapshots); MATE on a faulty 3x3x3 torus
    # under routing none relays through scratch
    _run_tables(swap_allreduce(), order)
    _run_tables(swap_alltoall(), order)
    from backend_helpers import pick as pick_schedule

    from cclc.relay import lower_relays
    from cclc.topology import torus, with_faults

    topo = with_faults(torus("t", (3, 3), routing="none"), links=[(0, 1), (1, 0)])
    coll = make_collective("a2a", CollectiveKind.ALLTOALL, topo, tuple(range(9)), 9 * 9 * 8)
    for alg in ("mate", "matee"):
        _, s = pick_schedule(coll, [alg])
        _run_tables(lower_relays(s), order)

