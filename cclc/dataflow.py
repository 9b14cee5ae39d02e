"""Dataflow lowering: the lanes, issue order and dependency edges the NCCL library runs.

The generated NCCL library (and its MPI build) runs a schedule without a barrier per step:

* Every op that crosses between two ranks goes to a *lane*, a communicator of its own (NCCL:
  one ``ncclCommSplit`` of the caller's communicator per lane, on a CUDA stream of its own;
  MPI: one tag per lane). All messages of one directed pair of ranks use one lane, and the
  lanes are an edge colouring of the pairs, so a rank's different peers land on different
  lanes where :data:`MAX_LANES` allows; local ops go to a rank's local lane.
* Every rank issues its share of the ops in one global *issue order* (step, then op index),
  each on its lane, after its dependency edges: the last earlier-step writer of every slot it
  reads or writes, and every reader of a slot it overwrites since that slot's last write.
* A send whose source another op of the same step overwrites first copies it aside (a
  *snapshot*, at the start of the step, on the send's lane), as the IR's rule that ops of one
  step read the state left by the previous step requires; a reducing receive lands in a
  staging area of its own and is reduced into place on its lane.

Why this cannot deadlock: every edge and every lane predecessor of an op comes earlier in the
issue order, and every rank issues in that order (so, on each lane communicator, the two
ranks of every message post it in the same order, NCCL's rule for point-to-point calls, and
kernels of different communicators are launched in the same relative order on every GPU).
Take the earliest op not yet done: everything before it is done, so both of its ranks have
reached it on its lane and nothing it waits for is pending; it completes. By induction all do.

:func:`lower` computes the plan from per-op arrays (chunks for the simulator, units for the
generated tables); :func:`dataflow_time` is the time of that plan under the simulator's link
model (the ``nccl`` execution model of :mod:`cclc.execution`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cclc.ir import Buf, OpKind, Schedule

__all__ = ["MAX_LANES", "DataflowPlan", "Item", "dataflow_time", "lower", "lower_schedule"]

#: at most this many lane communicators per call (each NCCL communicator costs memory and
#: setup): pairs beyond an edge colouring with this many colours share a lane
MAX_LANES = 32


@dataclass(frozen=True, slots=True)
class Item:
    """One thing issued: op ``op`` (``snap`` False) or the snapshot of its source (True).

    ``deps``: (item, rank) edges, item before this one, rank the one whose memory orders them.
    ``stage``: staging slot (units or chunks) of a snapshot, and of the send or local op that
    reads it; ``land``: where a reducing receive lands before it is reduced into place;
    ``None`` when unused.
    """

    op: int
    snap: bool
    deps: tuple[tuple[int, int], ...]
    stage: int | None
    land: int | None


@dataclass(frozen=True, eq=False)
class DataflowPlan:
    """Items in issue order, each op's lane and the staging size.

    Lanes ``0 .. n_lanes - 1`` carry messages (a communicator each, the same lane on both
    ranks of a message); ``n_lanes .. n_lanes + n_local - 1`` are each rank's local lanes (a
    stream each, no communicator), where local ops run (-1 until :func:`place_local_ops`).
    """

    items: tuple[Item, ...]
    lane: np.ndarray
    n_lanes: int
    n_local: int
    staging: int
    #: per op, the first op of its group (itself when it starts one; see place_local_ops)
    group: np.ndarray | None = None


def _colour(src: np.ndarray, dst: np.ndarray, path: np.ndarray, n: int, cap: int
            ) -> np.ndarray:
    """A lane per op: greedy edge colouring of the (pair, path) connections in order of first
    use, so that no rank has two connections on one lane unless more than ``cap`` lanes would
    be needed. A pair whose messages take different paths gets a lane per path: they share
    no link, so they must not wait for each other."""
    lane = np.full(len(src), -1, dtype=np.int64)
    net = np.flatnonzero(src != dst)
    if not len(net):
        return lane
    keys = np.stack([src[net], dst[net], np.asarray(path, dtype=np.int64)[net]], axis=1)
    conns, first, inv = np.unique(keys, axis=0, return_index=True, return_inverse=True)
    inv = inv.reshape(-1)
    used = [[0] * cap for _ in range(n)]
    colour = np.zeros(len(conns), dtype=np.int64)
    for p in np.argsort(first, kind="stable").tolist():
        a, b = int(conns[p, 0]), int(conns[p, 1])
        ua, ub = used[a], used[b]
        # the first colour free at both ranks, else the least used one
        c = min(range(cap), key=lambda k: (ua[k] + ub[k] > 0, ua[k] + ub[k], k))
        colour[p] = c
        ua[c] += 1
        ub[c] += 1
    lane[net] = colour[inv]
    return lane


def lower(n: int, step, src, dst, path, kind, src_buf, src_off, dst_buf, dst_off, count,
          dcount, widths: tuple[int, int, int], max_lanes: int = MAX_LANES) -> DataflowPlan:
    """The dataflow plan of ops given as arrays; ``count`` slots are read, ``dcount`` written;
    ``path`` names each op's route (ops of a pair with different routes get different lanes);
    ``widths[buf]`` slots per rank of each buffer (see the module docstring)."""
    step = np.asarray(step, dtype=np.int64)
    src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
    lane = _colour(src, dst, np.asarray(path), n, max_lanes)
    n_lanes = int(lane.max()) + 1 if len(lane) and lane.max() >= 0 else 0
    reads, writes, n_slots = _atoms(src, dst, src_buf, src_off, dst_buf, dst_off, count, dcount,
                                    widths)
    ops = _OpLists(src.tolist(), dst.tolist(), np.asarray(kind).tolist(),
                   np.asarray(count).tolist(), reads, writes)
    state = _Hazards(ops, n_slots)
    order = np.argsort(step, kind="stable")
    # the ops of one step are consecutive in ``order``: cut it where the step changes
    bounds = np.flatnonzero(np.diff(step[order])) + 1
    for group in np.split(order, bounds) if len(order) else ():
        state.lower_step(group.tolist())
    return DataflowPlan(tuple(state.items), lane, n_lanes, 0, state.staging)


def _atoms(src, dst, src_buf, src_off, dst_buf, dst_off, count, dcount, widths
           ) -> tuple[list[range], list[range], int]:
    """Each op's read and written slots as ranges of atoms: the pieces every op boundary cuts
    each (rank, buffer) into, so the state stays linear in the ops however long the buffers
    are."""
    span = int(max(widths)) + 1
    r0 = (src * 3 + np.asarray(src_buf, dtype=np.int64)) * span + \
        np.asarray(src_off, dtype=np.int64)
    r1 = r0 + np.asarray(count, dtype=np.int64)
    w0 = (dst * 3 + np.asarray(dst_buf, dtype=np.int64)) * span + \
        np.asarray(dst_off, dtype=np.int64)
    w1 = w0 + np.asarray(dcount, dtype=np.int64)
    cuts = np.unique(np.concatenate([r0, r1, w0, w1]))
    reads = list(map(range, np.searchsorted(cuts, r0).tolist(),
                     np.searchsorted(cuts, r1).tolist()))
    writes = list(map(range, np.searchsorted(cuts, w0).tolist(),
                      np.searchsorted(cuts, w1).tolist()))
    return reads, writes, len(cuts)


@dataclass(frozen=True, slots=True)
class _OpLists:
    """The per-op columns :class:`_Hazards` reads, as Python lists (indexed op by op)."""

    src: list[int]
    dst: list[int]
    kind: list[int]
    count: list[int]
    reads: list[range]
    writes: list[range]


class _Hazards:
    """The items issued so far and, per slot, the last earlier-step writer and the readers
    since: what the next step's ops must wait for."""

    def __init__(self, ops: _OpLists, n_slots: int) -> None:
        self.ops = ops
        self.writer = [-1] * n_slots                      # item of the last earlier-step write
        self.readers: list[list[int]] = [[] for _ in range(n_slots)]   # items reading it since
        self.items: list[Item] = []
        self.staging = 0

    def _read_deps(self, o: int) -> set[tuple[int, int]]:
        writer, rank = self.writer, self.ops.src[o]
        return {(writer[x], rank) for x in self.ops.reads[o] if writer[x] >= 0}

    def lower_step(self, group: list[int]) -> None:
        """Issue the items of one step's ops (in op order) and update the slot state."""
        written: set[int] = set()
        for o in group:
            written.update(self.ops.writes[o])
        snap_of, snap_reads = self._snapshots(group, written)
        step_writes: dict[int, int] = {}            # slot -> item writing it this step
        done = [self._op(o, snap_of, snap_reads, step_writes) for o in group]
        readers, writer, reads = self.readers, self.writer, self.ops.reads
        for slot, its in snap_reads.items():
            readers[slot].extend(its)
        for me, o in zip(done, group, strict=True):
            if o not in snap_of:
                for x in reads[o]:
                    readers[x].append(me)
        for me, o in zip(done, group, strict=True):
            for x in self.ops.writes[o]:
                writer[x] = me
                readers[x] = []

    def _snapshots(self, group: list[int], written: set[int]
                   ) -> tuple[dict[int, int], dict[int, list[int]]]:
        """Snapshots first: the sources this step also overwrites. Returns op -> its
        snapshot item, and slot -> the snapshots reading it."""
        snap_of: dict[int, int] = {}
        snap_reads: dict[int, list[int]] = {}
        for o in group:
            rs = self.ops.reads[o]
            if written.isdisjoint(rs):
                continue
            me = snap_of[o] = len(self.items)
            self.items.append(Item(o, True, tuple(sorted(self._read_deps(o))), self.staging,
                                   None))
            for x in rs:
                snap_reads.setdefault(x, []).append(me)
            self.staging += self.ops.count[o]
        return snap_of, snap_reads

    def _op(self, o: int, snap_of: dict[int, int], snap_reads: dict[int, list[int]],
            step_writes: dict[int, int]) -> int:
        """Issue op ``o`` after its edges; returns its item."""
        ops, writer, readers = self.ops, self.writer, self.readers
        me = len(self.items)
        stage = land = None
        if o in snap_of:
            deps = {(snap_of[o], ops.src[o])}
            stage = self.items[snap_of[o]].stage
        else:
            deps = self._read_deps(o)
        d = ops.dst[o]
        for x in ops.writes[o]:
            if writer[x] >= 0:
                deps.add((writer[x], d))
            deps.update((r, d) for r in readers[x])
            # only snapshots read what this step writes: they come first
            deps.update((r, d) for r in snap_reads.get(x, ()))
            if x in step_writes:     # two writes of one slot in a step: in issue order
                deps.add((step_writes[x], d))
        if ops.src[o] != d and ops.kind[o] == OpKind.REDUCE:
            land = self.staging
            self.staging += ops.count[o]
        self.items.append(Item(o, False, tuple(sorted(deps)), stage, land))
        for x in ops.writes[o]:
            step_writes[x] = me
        return me


#: at most this many local lanes (streams) per rank
MAX_LOCAL_LANES = 8


def lower_schedule(s: Schedule, op_overhead: float = 0.0, max_lanes: int = MAX_LANES
                   ) -> DataflowPlan:
    """:func:`lower` in the schedule's own chunks (the simulator's slots), local ops placed
    by :func:`place_local_ops`."""
    from cclc.sim import _dest_counts

    o = s.ops
    plan = lower(s.n, o.step, o.src, o.dst, o.route, o.kind, o.src_buf, o.src_off, o.dst_buf,
                 o.dst_off, o.count, _dest_counts(s), tuple(s.n_chunks(b) for b in Buf),
                 max_lanes)
    return place_local_ops(s, plan, op_overhead)


def place_local_ops(s: Schedule, plan: DataflowPlan, op_overhead: float = 0.0
                    ) -> DataflowPlan:
    """Lanes for local ops and groups for messages, chosen with the simulator's times at the
    schedule's size (any choice is correct; these make the library as fast as event mode).

    A local op costs nothing, so a lane of local ops only delays one when an earlier one is
    not ready yet: each goes to the local lane of its rank whose last op was ready latest but
    no later than this one, else a new lane (at most :data:`MAX_LOCAL_LANES`, then the lane
    ready earliest). A message joins the open group of its lane (one ``ncclGroupStart`` ...
    ``ncclGroupEnd``, one launch) when nothing else used the lane on either rank since the
    group began, every edge it has comes before the group's first item, and it is ready when
    the group starts: then it waits for nothing more and the group pays one launch."""
    _, lanes, group = _run(s, plan, op_overhead, place=True)
    n_local = int(lanes.max()) + 1 - plan.n_lanes if len(lanes) else 0
    return DataflowPlan(plan.items, lanes, plan.n_lanes, max(n_local, 0), plan.staging, group)


def dataflow_time(s: Schedule, op_overhead: float = 0.0, plan: DataflowPlan | None = None
                  ) -> float:
    """The time of the dataflow library on ``s``: the simulator's links (each served first
    come, first served in issue order, cut-through, as in event mode) with the library's
    order: a group starts when its edges are done and its lane is free on both of its ranks
    and pays ``op_overhead`` (one launch); snapshots and local ops are free, as in the
    simulator's default."""
    return _run(s, plan or lower_schedule(s), op_overhead)[0]


def _run(s: Schedule, plan: DataflowPlan, op_overhead: float, place: bool = False
         ) -> tuple[float, np.ndarray, np.ndarray]:
    from cclc.sim import _prepare

    p = _prepare(s)
    o = s.ops
    src, dst = o.src.tolist(), o.dst.tolist()
    lane = plan.lane.tolist()
    group = list(range(len(src))) if place else plan.group.tolist()
    n_lanes = plan.n_lanes
    width = n_lanes + (MAX_LOCAL_LANES if place else plan.n_local)
    offsets, route, links = s.routes.offsets.tolist(), o.route.tolist(), s.routes.links.tolist()
    nbytes, lat = p.op_bytes.tolist(), p.route_latency.tolist()
    bw = s.topology.link_bandwidth.tolist()
    link_free = [0.0] * s.topology.n_links
    lane_free = [0.0] * (s.n * width)
    lane_last = [-1] * (s.n * width)          # the item that used the lane last
    local_last: list[list[float]] = [[] for _ in range(s.n)]   # per rank: last ready per lane
    g_first: dict[int, int] = {}               # group (its first op) -> first item
    g_start: dict[int, float] = {}             # group -> when its members start
    finish = [0.0] * len(plan.items)
    for k, it in enumerate(plan.items):
        op = it.op
        ready = max((finish[d] for d, _ in it.deps), default=0.0)
        net = not it.snap and src[op] != dst[op]
        ends = (src[op], dst[op]) if net else (src[op],)
        if place and src[op] == dst[op] and lane[op] < 0:
            pool = local_last[src[op]]
            fits = [i for i, t in enumerate(pool) if t <= ready]
            if fits:
                c = max(fits, key=lambda i: pool[i])
            elif len(pool) < MAX_LOCAL_LANES:
                c = len(pool)
                pool.append(0.0)
            else:
                c = min(range(len(pool)), key=lambda i: pool[i])
            lane[op] = n_lanes + c
        ln = lane[op]
        slots = [r * width + ln for r in ends]
        if place and net:
            prev = lane_last[slots[0]]
            if prev >= 0 and all(lane_last[x] == prev for x in slots) and \
                    not plan.items[prev].snap:
                g = group[plan.items[prev].op]
                if g_start.get(g, -1.0) >= ready and \
                        all(d < g_first[g] for d, _ in it.deps):
                    group[op] = g
        member = net and group[op] != op
        if member:
            ready = g_start[group[op]]
        else:
            for x in slots:
                ready = max(ready, lane_free[x])
        if place and src[op] == dst[op] and not it.snap:
            local_last[src[op]][ln - n_lanes] = ready
        if not net or offsets[route[op]] == offsets[route[op] + 1]:
            end = ready
        else:
            if not member:
                g_start[op] = ready = ready + op_overhead
                g_first[op] = k
            last = ready
            for q in range(offsets[route[op]], offsets[route[op] + 1]):
                li = links[q]
                begin = max(ready, link_free[li])
                link_free[li] = begin + nbytes[op] / bw[li]
                last = max(last, link_free[li])
            end = last + lat[op]
        finish[k] = end
        for x in slots:
            lane_free[x] = max(lane_free[x], end) if member else end
            lane_last[x] = k
    return (max(finish, default=0.0), np.array(lane, dtype=np.int64),
            np.array(group, dtype=np.int64))
