"""The per-rank dataflow tables of the NCCL backend as they were built before the columnar
:func:`backends.nccl.tables.dataflow_tables`: a Python loop over the plan's items, one
:class:`~backends.nccl.tables.DataflowEntry` per entry, and the rows of the C table printed
field by field. Kept as the reference the columnar tables must match exactly (entries and
the emitted text), and for ``benchmarks/compile_scale.py``'s side-by-side ratio."""

from __future__ import annotations

import numpy as np

from backends.nccl.tables import DataflowEntry, DataflowRole
from backends.units import UnitFacts, buffer_units
from cclc.dataflow import DataflowPlan, lower, lower_schedule
from cclc.errors import ScheduleError
from cclc.execution import NCCL_GROUP_OVERHEAD
from cclc.ir import Buf, OpKind, Schedule

__all__ = ["reference_entries", "reference_rows", "reference_tables"]


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


def reference_tables(schedule: Schedule, units: Schedule, facts: UnitFacts
                     ) -> tuple[tuple[DataflowEntry, ...], ...]:
    """Every rank's entries in issue order, op by op (the loop the columnar tables
    replaced)."""
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
    return reference_entries(plan, units)


def reference_entries(plan: DataflowPlan, units: Schedule
                      ) -> tuple[tuple[DataflowEntry, ...], ...]:
    """The entries of a plan with its groups (the part of :func:`reference_tables` after the
    plan), one Python object per entry."""
    ops = units.ops
    lanes, group = plan.lane, plan.group
    assert group is not None
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
    return tuple(entries)


def reference_rows(entries: tuple[tuple[DataflowEntry, ...], ...]
                   ) -> tuple[list[str], str, list[str]]:
    """The C table's entry rows, per-rank first entries and dependency lines, as the NCCL
    backend printed them from the entries."""
    rows: list[str] = []
    first = [0]
    deps: list[int] = []
    for rank_entries in entries:
        for e in rank_entries:
            rows.append(", ".join(str(v) for v in (
                e.step, int(e.role), e.peer, int(e.kind), int(e.src_buf), e.src_off,
                int(e.dst_buf), e.dst_off, e.count, -1 if e.stage is None else e.stage,
                -1 if e.land is None else e.land, e.lane, int(e.group), int(e.signal),
                len(deps))))
            deps.extend(e.deps)
        first.append(len(rows))
    rows.append(f"-1, 0, 0, 0, 0, 0, 0, 0, 0, -1, -1, 0, 1, 0, {len(deps)}")
    deps.append(0)
    dep_lines = [" ".join(f"{d}," for d in deps[i:i + 16]) for i in range(0, len(deps), 16)]
    return rows, ", ".join(map(str, first)), dep_lines
