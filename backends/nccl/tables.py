"""The dataflow tables the NCCL library and its MPI build run (see :mod:`cclc.dataflow`).

Every rank gets its entries in issue order. An entry names its lane (a communicator and a
stream in the NCCL build, a tag and a queue in the MPI build), whether it starts a group (one
``ncclGroupStart`` ... ``ncclGroupEnd``: the entries after it on the same lane with ``group``
0 belong to it), whether another entry waits for it (``signal``: it records a CUDA event), and
its dependency edges (entries of the same rank, always earlier in the issue order).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import numpy as np

from backends.units import UnitFacts, buffer_units, writes_input
from cclc.dataflow import DataflowPlan, lower, lower_schedule
from cclc.errors import ScheduleError
from cclc.execution import NCCL_GROUP_OVERHEAD
from cclc.ir import Buf, OpKind, Schedule

__all__ = ["DataflowEntry", "DataflowRole", "DataflowTables", "dataflow_tables"]


class DataflowRole(IntEnum):
    """What a rank does for one item (the C tables use these numbers)."""

    SEND = 0
    RECV = 1
    LOCAL = 2
    SNAP = 3        # copy the source aside into the staging area (see cclc.dataflow)


@dataclass(frozen=True, slots=True)
class DataflowEntry:
    """One item of one rank; offsets and counts in units.

    ``stage``: for a snapshot where it copies the source to, for a send or local op where it
    reads the snapshot from; ``land``: where a reducing receive lands before it is reduced into
    place; ``None`` when unused.
    """

    step: int
    role: DataflowRole
    peer: int
    kind: OpKind
    src_buf: Buf
    src_off: int
    dst_buf: Buf
    dst_off: int
    count: int
    stage: int | None
    land: int | None
    lane: int
    group: bool
    signal: bool
    deps: tuple[int, ...]


@dataclass(frozen=True, eq=False)
class DataflowTables:
    """Every rank's entries in issue order, the lanes and the staging area each rank needs;
    ``units`` is the schedule in units the entries count in (see :func:`backends.units.to_units`).
    """

    units: Schedule
    facts: UnitFacts
    entries: tuple[tuple[DataflowEntry, ...], ...]
    n_lanes: int
    n_local: int
    staging_units: int
    input_copy: bool


def _issue_order(plan: DataflowPlan, group: list[int], src: list[int], dst: list[int]
                 ) -> list[list[int]]:
    """Items in issue order as groups (lists of items). A message stays in its group only if
    the group is still open on its lane at both ranks and all of its edges come before the
    group's first item (as :func:`cclc.dataflow.place_local_ops` chose, re-checked here on the
    unit-level edges); otherwise it starts a group of its own."""
    lane = plan.lane.tolist()
    out: list[list[int]] = []
    open_at: dict[tuple[int, int], int] = {}      # (rank, lane) -> index in out of its group
    first_of: dict[int, int] = {}                 # group id -> index in out
    for k, it in enumerate(plan.items):
        o = it.op
        net = not it.snap and src[o] != dst[o]
        ends = (src[o], dst[o]) if net else (src[o],)
        keys = [(r, lane[o]) for r in ends]
        g = group[o]
        at = first_of.get(g) if net and g != o else None
        if at is not None and all(open_at.get(x) == at for x in keys) and \
                all(d < out[at][0] for d, _ in it.deps):
            out[at].append(k)
        else:
            at = len(out)
            out.append([k])
            if net:
                first_of[o] = at
        for x in keys:
            open_at[x] = at
    return out


def _entry(row: list, signal: bool) -> DataflowEntry:
    """The entry of a row of :func:`dataflow_tables` (every field but ``signal``, which is known
    once the rank's later rows are)."""
    (step, role, peer, kind, src_buf, src_off, dst_buf, dst_off, count, stage, land, lane,
     group, deps) = row
    return DataflowEntry(step, role, peer, kind, src_buf, src_off, dst_buf, dst_off, count,
                         stage, land, lane, group, signal, tuple(deps))


def dataflow_tables(schedule: Schedule, units: Schedule, facts: UnitFacts) -> DataflowTables:
    """The per-rank dataflow entries of ``schedule`` in units (``units`` and ``facts`` from
    :func:`backends.units.to_units`; see the module docstring)."""
    # lanes of local ops and groups are chosen on the schedule's own chunks, with the
    # simulator's times at its size and the library's launch cost
    chunk_plan = lower_schedule(schedule, op_overhead=NCCL_GROUP_OVERHEAD)
    ops = units.ops
    unit_count = ops.count.astype(np.int64)
    unit_plan = lower(units.n, ops.step, ops.src, ops.dst, ops.route, ops.kind, ops.src_buf,
                      ops.src_off, ops.dst_buf, ops.dst_off, unit_count, unit_count,
                      buffer_units(units))
    net = ops.src != ops.dst
    if not np.array_equal(unit_plan.lane[net], chunk_plan.lane[net]):
        raise ScheduleError("internal error: lanes differ between chunks and units")
    lanes, group = chunk_plan.lane, chunk_plan.group
    if group is None:
        raise ScheduleError("internal error: the chunk plan has no message groups")
    plan = DataflowPlan(unit_plan.items, lanes, chunk_plan.n_lanes, chunk_plan.n_local,
                        unit_plan.staging, group)
    src, dst = ops.src.tolist(), ops.dst.tolist()
    groups = _issue_order(plan, group.tolist(), src, dst)
    n = units.n
    local: list[dict[int, int]] = [{} for _ in range(n)]
    rows: list[list[list]] = [[] for _ in range(n)]
    lane_of: list[list[int]] = [[] for _ in range(n)]
    for grp in groups:
        for pos, k in enumerate(grp):
            it = plan.items[k]
            o = it.op
            a, b = src[o], dst[o]
            kind = OpKind(int(ops.kind[o]))
            if it.snap:
                sides = [(a, DataflowRole.SNAP, a)]
            elif a == b:
                sides = [(a, DataflowRole.LOCAL, a)]
            else:
                sides = [(a, DataflowRole.SEND, b), (b, DataflowRole.RECV, a)]
            for r, role, peer in sides:
                deps = []
                for d, rr in it.deps:
                    if rr != r:
                        continue
                    j = local[r].get(d)
                    if j is None:
                        raise ScheduleError("internal error: a dependency edge to an item the "
                                            "rank does not run")
                    if lane_of[r][j] != int(lanes[o]):     # the lane's own order implies it
                        deps.append(j)
                local[r][k] = len(rows[r])
                lane_of[r].append(int(lanes[o]))
                rows[r].append([int(ops.step[o]), role, peer, kind, Buf(int(ops.src_buf[o])),
                                int(ops.src_off[o]), Buf(int(ops.dst_buf[o])),
                                int(ops.dst_off[o]), int(ops.count[o]),
                                it.stage if role is not DataflowRole.RECV else None,
                                it.land if role is DataflowRole.RECV else None,
                                int(lanes[o]), pos == 0, sorted(set(deps))])
    entries = []
    for r in range(n):
        waited = {j for row in rows[r] for j in row[-1]}
        entries.append(tuple(
            _entry(row, signal=j in waited) for j, row in enumerate(rows[r])))
    return DataflowTables(units=units, facts=facts, entries=tuple(entries),
                          n_lanes=plan.n_lanes, n_local=plan.n_local,
                          staging_units=plan.staging, input_copy=writes_input(units))
