"""The dataflow tables the NCCL library and its MPI build run (see :mod:`cclc.dataflow`).

Every rank gets its entries in issue order. An entry names its lane (a communicator and a
stream in the NCCL build, a tag and a queue in the MPI build), whether it starts a group (one
``ncclGroupStart`` ... ``ncclGroupEnd``: the entries after it on the same lane with ``group``
0 belong to it), whether another entry waits for it (``signal``: it records a CUDA event), and
its dependency edges (entries of the same rank, always earlier in the issue order).

The tables are columns (numpy): one row per entry, every rank's rows one after another, and
the edges in compressed rows, so that a schedule of millions of ops is not a Python object
per entry; :attr:`DataflowTables.entries` gives the same tables entry by entry.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from itertools import chain

import numpy as np

from backends.units import UnitFacts, buffer_units, writes_input
from cclc.dataflow import MAX_LANES, DataflowPlan, lower, lower_schedule
from cclc.errors import ScheduleError
from cclc.execution import NCCL_GROUP_OVERHEAD
from cclc.ir import Buf, OpKind, Schedule
from cclc.lane_cost import LaneCost, lane_cost

__all__ = ["COLUMNS", "DataflowEntry", "DataflowRole", "DataflowTables", "dataflow_tables",
           "table_lane_cost", "tables_of_plan", "unit_plan"]


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


#: the columns of :attr:`DataflowTables.rows`, in the order of the C table's ``cclc_entry``
COLUMNS = ("step", "role", "peer", "kind", "src_buf", "src_off", "dst_buf", "dst_off", "count",
           "stage", "land", "lane", "group", "signal")


@dataclass(frozen=True, eq=False)
class DataflowTables:
    """Every rank's entries in issue order, the lanes and the staging area each rank needs;
    ``units`` is the schedule in units the entries count in (see :func:`backends.units.to_units`).

    ``rows``: one row per entry (columns :data:`COLUMNS`, offsets and counts in units), rank
    ``r``'s entries are rows ``first[r]`` to ``first[r + 1] - 1``; ``stage`` and ``land`` are
    -1 where the entry has none, as the C table spells it. Entry ``e``'s dependency edges
    (indices among its rank's entries) are ``deps[dep_first[e]:dep_first[e + 1]]``, sorted.
    """

    units: Schedule
    facts: UnitFacts
    rows: np.ndarray
    first: np.ndarray
    dep_first: np.ndarray
    deps: np.ndarray
    n_lanes: int
    n_local: int
    staging_units: int
    input_copy: bool

    @property
    def entries(self) -> tuple[tuple[DataflowEntry, ...], ...]:
        """The same tables, one :class:`DataflowEntry` per entry (for tests and tools; the
        backend prints the columns)."""
        deps = self.deps.tolist()
        dep_first = self.dep_first.tolist()
        bounds = self.first.tolist()
        roles, kinds, bufs = tuple(DataflowRole), tuple(OpKind), tuple(Buf)
        out = []
        for r in range(len(bounds) - 1):
            out.append(tuple(
                DataflowEntry(step, roles[role], peer, kinds[kind], bufs[sb], so, bufs[db], do,
                              count, None if stage < 0 else stage, None if land < 0 else land,
                              lane, bool(group), bool(signal),
                              tuple(deps[dep_first[e]:dep_first[e + 1]]))
                for e, (step, role, peer, kind, sb, so, db, do, count, stage, land, lane, group,
                        signal) in enumerate(self.rows[bounds[r]:bounds[r + 1]].tolist(),
                                             start=bounds[r])))
        return tuple(out)


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


def unit_plan(schedule: Schedule, units: Schedule, max_lanes: int = MAX_LANES) -> DataflowPlan:
    """The dataflow plan the tables run: items and edges on ``units`` (the schedule in
    units), lanes of local ops and message groups chosen on the schedule's own chunks, with
    the simulator's times at its size and the library's launch cost; at most ``max_lanes``
    message lanes (:func:`cclc.lane_cost.choose_lanes` chooses them under a memory budget)."""
    chunk_plan = lower_schedule(schedule, op_overhead=NCCL_GROUP_OVERHEAD, max_lanes=max_lanes)
    ops = units.ops
    unit_count = ops.count.astype(np.int64)
    plan = lower(units.n, ops.step, ops.src, ops.dst, ops.route, ops.kind, ops.src_buf,
                 ops.src_off, ops.dst_buf, ops.dst_off, unit_count, unit_count,
                 buffer_units(units), max_lanes)
    net = ops.src != ops.dst
    if not np.array_equal(plan.lane[net], chunk_plan.lane[net]):
        raise ScheduleError("internal error: lanes differ between chunks and units")
    if chunk_plan.group is None:
        raise ScheduleError("internal error: the chunk plan has no message groups")
    return DataflowPlan(plan.items, chunk_plan.lane, chunk_plan.n_lanes, chunk_plan.n_local,
                        plan.staging, chunk_plan.group)


def dataflow_tables(schedule: Schedule, units: Schedule, facts: UnitFacts,
                    max_lanes: int = MAX_LANES) -> DataflowTables:
    """The per-rank dataflow tables of ``schedule`` in units (``units`` and ``facts`` from
    :func:`backends.units.to_units`; see the module docstring), with at most ``max_lanes``
    message lanes."""
    return tables_of_plan(unit_plan(schedule, units, max_lanes), units, facts)


def tables_of_plan(plan: DataflowPlan, units: Schedule, facts: UnitFacts) -> DataflowTables:
    """The tables of ``plan`` (from :func:`unit_plan`), in columns: the items in issue order,
    cut into one entry per rank that runs them, and their edges mapped to entry indices."""
    ops, n = units.ops, units.n
    assert plan.group is not None           # unit_plan's plans have their groups
    items = plan.items
    op_of, snap_of, item_deps, stage_of, land_of = (
        zip(*items, strict=True) if items else ((), (), (), (), ()))
    item_op = np.array(op_of, dtype=np.int64)
    snap = np.array(snap_of, dtype=bool)
    src, dst = ops.src.astype(np.int64), ops.dst.astype(np.int64)
    lanes = np.asarray(plan.lane, dtype=np.int64)
    groups = _issue_order(plan, plan.group.tolist(), src.tolist(), dst.tolist())
    seq = np.fromiter(chain.from_iterable(groups), dtype=np.int64, count=len(items))
    size = np.array([len(g) for g in groups], dtype=np.int64)
    opens = np.zeros(len(items), dtype=bool)
    opens[np.cumsum(size) - size] = True
    # every item's entries, in issue order: a message is a send at its source and a receive
    # at its destination, a snapshot or a local op one entry at its rank
    o = item_op[seq]
    a, b = src[o], dst[o]
    message = ~snap[seq] & (a != b)
    sides = 1 + message
    row_item = np.repeat(seq, sides)
    second = np.zeros(len(row_item), dtype=bool)
    second[np.cumsum(sides)[message] - 1] = True
    role = np.where(np.repeat(message, sides),
                    np.where(second, DataflowRole.RECV, DataflowRole.SEND),
                    np.where(snap[row_item], DataflowRole.SNAP, DataflowRole.LOCAL))
    a, b = np.repeat(a, sides), np.repeat(b, sides)
    rank = np.where(role == DataflowRole.RECV, b, a)
    peer = np.where(role == DataflowRole.SEND, b, a)
    # each rank's entries in issue order, ranks one after another
    order = np.argsort(rank, kind="stable")
    row_item, role, rank, peer = row_item[order], role[order], rank[order], peer[order]
    row_open = np.repeat(opens, sides)[order]
    first = np.searchsorted(rank, np.arange(n + 1))
    deps, dep_first, signal = _entry_deps(item_op, item_deps, row_item, rank, first, lanes, n)
    o = item_op[row_item]
    recv = role == DataflowRole.RECV
    stage, land = _or_minus_one(stage_of), _or_minus_one(land_of)
    columns = (ops.step[o], role, peer, ops.kind[o], ops.src_buf[o], ops.src_off[o],
               ops.dst_buf[o], ops.dst_off[o], ops.count[o],
               np.where(recv, -1, stage[row_item] if len(stage) else 0),
               np.where(recv, land[row_item] if len(land) else 0, -1),
               lanes[o], row_open, signal)
    rows = np.stack([np.asarray(c, dtype=np.int64) for c in columns], axis=1) \
        if len(row_item) else np.zeros((0, len(COLUMNS)), dtype=np.int64)
    return DataflowTables(units=units, facts=facts, rows=rows, first=first, dep_first=dep_first,
                          deps=deps, n_lanes=plan.n_lanes, n_local=plan.n_local,
                          staging_units=plan.staging, input_copy=writes_input(units))


def _or_minus_one(values: tuple) -> np.ndarray:
    """Whole numbers or None as int64, None as -1 (through floats, where None is NaN: exact
    for the staging offsets, which are far below 2**53)."""
    f = np.array(values, dtype=np.float64)
    return np.where(np.isnan(f), -1, f).astype(np.int64)


def _entry_deps(item_op: np.ndarray, item_deps: tuple, row_item: np.ndarray, rank: np.ndarray,
                first: np.ndarray, lanes: np.ndarray, n: int
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each entry's edges as indices among its rank's entries (sorted, each once, without the
    ones its lane's own order implies), in compressed rows, and which entries are waited on.

    An item's edge (d, r) belongs to the item's entry at rank r (an item with no entry there
    has no use for it) and names item d's entry at r, which must come earlier."""
    n_rows = len(row_item)
    counts = np.fromiter(map(len, item_deps), dtype=np.int64, count=len(item_deps))
    flat = np.fromiter(chain.from_iterable(chain.from_iterable(item_deps)), dtype=np.int64,
                       count=2 * int(counts.sum())).reshape(-1, 2)
    waiter_item = np.repeat(np.arange(len(item_deps)), counts)
    dep_item, dep_rank = flat[:, 0], flat[:, 1]
    # entry of (item, rank): rows sorted by that key, found by bisection
    key = row_item * n + rank
    by_key = np.argsort(key)
    sorted_key = key[by_key]

    def find(items: np.ndarray, ranks: np.ndarray) -> np.ndarray:
        want = items * n + ranks
        at = np.minimum(np.searchsorted(sorted_key, want), max(n_rows - 1, 0))
        found = sorted_key[at] == want if n_rows else np.zeros(len(want), dtype=bool)
        return np.where(found, by_key[at] if n_rows else 0, -1)

    waiter = find(waiter_item, dep_rank)
    used = waiter >= 0
    waiter, dep_item, dep_rank = waiter[used], dep_item[used], dep_rank[used]
    dep = find(dep_item, dep_rank)
    if (dep < 0).any() or (dep >= waiter).any():
        raise ScheduleError("internal error: a dependency edge to an item the rank does not "
                            "run")
    # the lane's own order implies an edge between entries of one lane
    keep = lanes[item_op[dep_item]] != lanes[item_op[row_item[waiter]]]
    edge = np.unique(waiter[keep] * max(n_rows, 1) + dep[keep])
    waiter, dep = edge // max(n_rows, 1), edge % max(n_rows, 1)
    signal = np.zeros(n_rows, dtype=bool)
    signal[dep] = True
    dep_first = np.concatenate([[0], np.cumsum(np.bincount(waiter, minlength=n_rows))])
    return dep - first[rank[dep]], dep_first, signal


def table_lane_cost(tables: DataflowTables, lane_ctas: int) -> LaneCost:
    """What the library makes and allocates for ``tables`` on its most loaded rank (see
    :mod:`cclc.lane_cost`): connections from the send and receive entries' (peer, lane), an
    event per entry."""
    n = len(tables.first) - 1
    rank = np.repeat(np.arange(n), np.diff(tables.first))
    rows = tables.rows
    role, peer, lane = (rows[:, COLUMNS.index(c)] for c in ("role", "peer", "lane"))
    send = role == DataflowRole.SEND
    return lane_cost(n, rank[send], peer[send], lane[send], tables.n_lanes, tables.n_local,
                     np.diff(tables.first), lane_ctas)
