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
    # slots are atoms: the pieces every op boundary cuts each (rank, buffer) into, so the
    # state stays linear in the ops however long the buffers are
    rb_r = src * 3 + np.asarray(src_buf, dtype=np.int64)
    rb_w = dst * 3 + np.asarray(dst_buf, dtype=np.int64)
    span = int(max(widths)) + 1
    r0 = rb_r * span + np.asarray(src_off, dtype=np.int64)
    r1 = r0 + np.asarray(count, dtype=np.int64)
    w0 = rb_w * span + np.asarray(dst_off, dtype=np.int64)
    w1 = w0 + np.asarray(dcount, dtype=np.int64)
    cuts = np.unique(np.concatenate([r0, r1, w0, w1]))
    ra, rb = np.searchsorted(cuts, r0).tolist(), np.searchsorted(cuts, r1).tolist()
    wa, wb = np.searchsorted(cuts, w0).tolist(), np.searchsorted(cuts, w1).tolist()
    n_slots = len(cuts)
    writer = [-1] * n_slots               # item of the last earlier-step write
    readers: list[list[int]] = [[] for _ in range(n_slots)]   # items reading it since
    order = np.argsort(step, kind="stable").tolist()
    steps = step.tolist()
    s_l, d_l = src.tolist(), dst.tolist()
    k_l = np.asarray(kind).tolist()
    c_l = np.asarray(count).tolist()

    def reads(o):
        return range(ra[o], rb[o])

    def writes(o):
        return range(wa[o], wb[o])

    lanes = lane.tolist()     # local ops: -1 until place_local_ops
    items: list[Item] = []
    staging = 0
    i = 0
    while i < len(order):
        j = i
        while j < len(order) and steps[order[j]] == steps[order[i]]:
            j += 1
        group = order[i:j]
        i = j
        written = set()
        for o in group:
            written.update(writes(o))
        # snapshots first: sources this step also overwrites
        snap_of: dict[int, int] = {}
        snap_reads: dict[int, list[int]] = {}      # slot -> snapshots reading it
        for o in group:
            if any(x in written for x in reads(o)):
                deps = {(writer[x], s_l[o]) for x in reads(o) if writer[x] >= 0}
                snap_of[o] = len(items)
                items.append(Item(o, True, tuple(sorted(deps)), staging, None))
                for x in reads(o):
                    snap_reads.setdefault(x, []).append(len(items) - 1)
                staging += c_l[o]
        step_writes: dict[int, int] = {}            # slot -> item writing it this step
        done: list[tuple[int, range, range | None]] = []
        for o in group:
            me = len(items)
            deps: set[tuple[int, int]] = set()
            stage = land = None
            if o in snap_of:
                deps.add((snap_of[o], s_l[o]))
                stage = items[snap_of[o]].stage
            else:
                deps.update((writer[x], s_l[o]) for x in reads(o) if writer[x] >= 0)
            w = writes(o)
            for x in w:
                if writer[x] >= 0:
                    deps.add((writer[x], d_l[o]))
                deps.update((r, d_l[o]) for r in readers[x])
                # only snapshots read what this step writes: they come first
                deps.update((r, d_l[o]) for r in snap_reads.get(x, ()))
                if x in step_writes:     # two writes of one slot in a step: in issue order
                    deps.add((step_writes[x], d_l[o]))
            if s_l[o] != d_l[o] and k_l[o] == OpKind.REDUCE:
                land = staging
                staging += c_l[o]
            items.append(Item(o, False, tuple(sorted(deps)), stage, land))
            for x in w:
                step_writes[x] = me
            done.append((me, w, None if o in snap_of else reads(o)))
        for slot, its in snap_reads.items():
            readers[slot].extend(its)
        for me, _, rs in done:
            if rs is not None:
                for x in rs:
                    readers[x].append(me)
        for me, w, _ in done:
            for x in w:
                writer[x] = me
                readers[x] = []
    return DataflowPlan(tuple(items), np.array(lanes, dtype=np.int64), n_lanes, 0, staging)


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
