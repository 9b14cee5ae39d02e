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
    """Run the tables of ``schedule`` on every rank, one random action at a time (a lane
    starting its next group, a local entry, a matched send and receive), and compare the
    outputs with numpy's reference."""
    m = _TableMachine(schedule, seed)
    pick = random.Random(seed)
    while m.left:
        actions = m.actions()
        assert actions, "deadlock: nothing can proceed"
        act = pick.choice(actions)
        if act[0] == "start":
            m.start(act[1], act[2])
        elif act[0] == "local":
            m.local(act[1], act[2])
        else:
            m.move(act[1])
        m.advance_lanes()
    coll = schedule.collective
    want = reference(coll.kind, coll.op, m.inputs, coll.root)
    for r in range(coll.n):
        if want[r] is not None:
            np.testing.assert_array_equal(m.mem[r][Buf.OUTPUT][:len(want[r])], want[r],
                                          err_msg=f"rank {r}")


class _TableMachine:
    """Every rank's memory, staging and table state while the tables run."""

    def __init__(self, schedule, seed: int):
        t = dataflow_tables(schedule, *to_units(schedule, split=True))
        widths = buffer_units(t.units)
        n = schedule.collective.n
        rng = np.random.default_rng(seed)
        self.red = _RED[schedule.collective.op]
        # at count = count_units every unit is one element
        self.inputs = [rng.integers(-50, 50, size=widths[Buf.INPUT]).astype(np.int64)
                       for _ in range(n)]
        self.mem = [[self.inputs[r].copy(), np.zeros(widths[Buf.OUTPUT], np.int64),
                     np.zeros(widths[Buf.SCRATCH], np.int64)] for r in range(n)]
        self.staging = [np.zeros(t.staging_units, np.int64) for _ in range(n)]
        self.entries = entries = t.entries
        self.lanes_q: list[dict] = [{} for _ in range(n)]    # rank -> lane -> queue of groups
        for r in range(n):
            for g in self._groups(r):
                self.lanes_q[r].setdefault(entries[r][g[0]].lane, []).append(g)
        self.state = [[0] * len(entries[r]) for r in range(n)]  # 0 waiting, 1 started, 2 done
        self.posted: dict[tuple[int, int, int], tuple[list, list]] = {}  # (src, dst, lane)
        self.local_started: set[tuple[int, int]] = set()
        self.left = sum(len(x) for x in entries)

    def _groups(self, r: int) -> list[list[int]]:
        gs: list[list[int]] = []
        for j, e in enumerate(self.entries[r]):
            if e.group:
                gs.append([j])
            else:
                assert gs and self.entries[r][gs[-1][0]].lane == e.lane
                gs[-1].append(j)
        return gs

    def src_of(self, r, e):
        if e.stage is not None and e.role is not DataflowRole.SNAP:
            return self.staging[r][e.stage:e.stage + e.count]
        return self.mem[r][e.src_buf][e.src_off:e.src_off + e.count]

    def write(self, r, e, data) -> None:
        d = self.mem[r][e.dst_buf]
        sl = slice(e.dst_off, e.dst_off + e.count)
        d[sl] = self.red(d[sl], data) if e.kind is OpKind.REDUCE else data

    def actions(self) -> list[tuple]:
        actions: list[tuple] = []
        for r, lanes in enumerate(self.lanes_q):
            for lane, q in lanes.items():
                if not q:
                    continue
                g = q[0]
                if self.state[r][g[0]] == 0 and all(self.state[r][d] == 2 for j in g
                                                    for d in self.entries[r][j].deps):
                    actions.append(("start", r, lane))
        actions.extend(("local", r, j) for r, j in sorted(self.local_started))
        for key, (sends, recvs) in self.posted.items():
            if sends and recvs:
                actions.append(("move", key))
        return actions

    def start(self, r: int, lane: int) -> None:
        for j in self.lanes_q[r][lane][0]:
            e = self.entries[r][j]
            self.state[r][j] = 1
            if e.role is DataflowRole.SEND:
                self.posted.setdefault((r, e.peer, lane), ([], []))[0].append(j)
            elif e.role is DataflowRole.RECV:
                self.posted.setdefault((e.peer, r, lane), ([], []))[1].append(j)
            else:
                self.local_started.add((r, j))

    def local(self, r: int, j: int) -> None:
        e = self.entries[r][j]
        if e.role is DataflowRole.SNAP:
            self.staging[r][e.stage:e.stage + e.count] = self.src_of(r, e)
        else:
            self.write(r, e, self.src_of(r, e).copy())
        self.state[r][j] = 2
        self.local_started.discard((r, j))
        self.left -= 1

    def move(self, key: tuple[int, int, int]) -> None:
        a, b, _ = key
        sends, recvs = self.posted[key]
        js, jr = sends.pop(0), recvs.pop(0)
        es, er = self.entries[a][js], self.entries[b][jr]
        assert es.count == er.count, "matched messages of different sizes"
        data = self.src_of(a, es).copy()
        if er.land is not None:            # lands in staging, then is reduced into place
            self.staging[b][er.land:er.land + er.count] = data
            data = self.staging[b][er.land:er.land + er.count].copy()
        self.write(b, er, data)
        self.state[a][js] = self.state[b][jr] = 2
        self.left -= 2

    def advance_lanes(self) -> None:
        for r, lanes in enumerate(self.lanes_q):   # a lane moves on when its head group is done
            for q in lanes.values():
                while q and all(self.state[r][j] == 2 for j in q[0]):
                    q.pop(0)


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

