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
from typing import NamedTuple

import numpy as np

from cclc.ir import Buf, OpKind, Schedule

__all__ = ["MAX_LANES", "DataflowPlan", "Item", "dataflow_time", "lower", "lower_schedule"]

#: at most this many lane communicators per call (each NCCL communicator costs memory and
#: setup): pairs beyond an edge colouring with this many colours share a lane
MAX_LANES = 32


class Item(NamedTuple):
    """One thing issued: op ``op`` (``snap`` False) or the snapshot of its source (True).

    ``deps``: (item, rank) edges, item before this one, rank the one whose memory orders them.
    ``stage``: staging slot (units or chunks) of a snapshot, and of the send or local op that
    reads it; ``land``: where a reducing receive lands before it is reduced into place;
    ``None`` when unused. A named tuple, not a frozen dataclass: a plan has one per op and
    snapshot (millions at hundreds of ranks), and a tuple is several times cheaper to build.
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
    #: the time :func:`place_local_ops` found while placing (it runs the plan as
    #: :func:`dataflow_time` does) and the ``op_overhead`` it used; None when not placed
    placed_time: float | None = None
    placed_overhead: float | None = None


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
    ``widths[buf]`` slots per rank of each buffer (see the module docstring).

    Columnar: every (op, slot) read and write is a row, and each edge kind is a search in
    those rows sorted by (slot, step), so the work is numpy's, not a loop over the ops."""
    step = np.asarray(step, dtype=np.int64)
    src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
    count = np.asarray(count, dtype=np.int64)
    lane = _colour(src, dst, np.asarray(path), n, max_lanes)
    n_lanes = int(lane.max()) + 1 if len(lane) and lane.max() >= 0 else 0
    if not len(step):
        return DataflowPlan((), lane, n_lanes, 0, 0)
    rd, wr = _atoms(src, dst, src_buf, src_off, dst_buf, dst_off, count, dcount, widths)
    # steps renumbered 0.. in order; ops of a step keep their index order (the issue order)
    steps, sidx = np.unique(step, return_inverse=True)
    sidx = sidx.reshape(-1)
    snapped = _snapped(sidx, rd, wr, len(steps))
    ids = _number_items(sidx, snapped, len(steps))
    red = (src != dst) & (np.asarray(kind) == OpKind.REDUCE)
    edges = _edges(sidx, src, dst, snapped, ids, rd, wr, len(steps))
    return _plan(ids, snapped, red, count, edges, lane, n_lanes)


@dataclass(frozen=True, slots=True)
class _Pairs:
    """(op, slot) rows of the reads or the writes, ``op`` ascending."""

    op: np.ndarray
    slot: np.ndarray


@dataclass(frozen=True, slots=True)
class _ItemIds:
    """Where each op's items sit in the issue order: ``op_item`` per op, ``snap_item`` per op
    (-1 when it has no snapshot), and ``item_op``/``item_snap`` per item."""

    op_item: np.ndarray
    snap_item: np.ndarray
    item_op: np.ndarray
    item_snap: np.ndarray


def _expand(lo: np.ndarray, hi: np.ndarray) -> _Pairs:
    cnt = hi - lo
    op = np.repeat(np.arange(len(lo)), cnt)
    start = np.cumsum(cnt) - cnt
    return _Pairs(op, np.repeat(lo, cnt) + np.arange(len(op)) - np.repeat(start, cnt))


def _atoms(src, dst, src_buf, src_off, dst_buf, dst_off, count, dcount, widths
           ) -> tuple[_Pairs, _Pairs]:
    """Each op's read and written slots as rows: slots are atoms, the pieces every op boundary
    cuts each (rank, buffer) into, so the state stays linear in the ops however long the
    buffers are."""
    span = int(max(widths)) + 1
    r0 = (src * 3 + np.asarray(src_buf, dtype=np.int64)) * span + \
        np.asarray(src_off, dtype=np.int64)
    r1 = r0 + count
    w0 = (dst * 3 + np.asarray(dst_buf, dtype=np.int64)) * span + \
        np.asarray(dst_off, dtype=np.int64)
    w1 = w0 + np.asarray(dcount, dtype=np.int64)
    cuts = _distinct(np.concatenate([r0, r1, w0, w1]))
    return (_expand(np.searchsorted(cuts, r0), np.searchsorted(cuts, r1)),
            _expand(np.searchsorted(cuts, w0), np.searchsorted(cuts, w1)))


def _distinct(a: np.ndarray) -> np.ndarray:
    """The distinct values of ``a``, sorted (``np.unique`` by a plain sort, which is several
    times faster on millions of integers than its hash table)."""
    a = np.sort(a)
    return a[np.concatenate([[True], a[1:] != a[:-1]])] if len(a) else a


def _key(sidx: np.ndarray, pairs: _Pairs, n_steps: int) -> np.ndarray:
    """(slot, step) of each row as one sortable number."""
    return pairs.slot * (n_steps + 1) + sidx[pairs.op]


def _snapped(sidx: np.ndarray, rd: _Pairs, wr: _Pairs, n_steps: int) -> np.ndarray:
    """Per op: whether a slot it reads is written in its own step (then its source is copied
    aside first)."""
    written = _distinct(_key(sidx, wr, n_steps))
    rkey = _key(sidx, rd, n_steps)
    at = np.minimum(np.searchsorted(written, rkey), max(len(written) - 1, 0))
    hit = written[at] == rkey if len(written) else np.zeros(len(rkey), dtype=bool)
    return np.bincount(rd.op[hit], minlength=len(sidx)) > 0


def _number_items(sidx: np.ndarray, snapped: np.ndarray, n_steps: int) -> _ItemIds:
    """Per step: its snapshots (in op order), then its ops (in op order)."""
    m = len(sidx)
    # sort key: step, then snapshots before ops, then op index
    op_key = (sidx * 2 + 1) * m + np.arange(m)
    snap_ops = np.flatnonzero(snapped)
    snap_key = (sidx[snap_ops] * 2) * m + snap_ops
    keys = np.concatenate([op_key, snap_key])
    order = np.argsort(keys, kind="stable")
    pos = np.empty(len(keys), dtype=np.int64)
    pos[order] = np.arange(len(keys))
    snap_item = np.full(m, -1, dtype=np.int64)
    snap_item[snap_ops] = pos[m:]
    item_op = np.concatenate([np.arange(m), snap_ops])[order]
    return _ItemIds(pos[:m], snap_item, item_op, order >= m)


def _edges(sidx, src, dst, snapped, ids: _ItemIds, rd: _Pairs, wr: _Pairs, n_steps: int
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every dependency edge as (item, item it waits for, rank), unsorted, with repeats:
    the last earlier-step writer of every slot read or written, the readers since that write,
    the step's snapshots of a slot written, and an earlier write of the slot in the step."""
    # write rows sorted by (slot, step, item): the last row of a (slot, step) is its writer
    wkey = _key(sidx, wr, n_steps)
    wo = np.lexsort((ids.op_item[wr.op], wkey))
    wkey_s, witem_s = wkey[wo], ids.op_item[wr.op][wo]
    wstep_s = sidx[wr.op][wo]

    def last_write_before(key):
        """The item and step of the last write of each key's slot in an earlier step."""
        at = np.searchsorted(wkey_s, key, side="left") - 1
        ok = at >= 0
        ok[ok] = wkey_s[at[ok]] // (n_steps + 1) == key[ok] // (n_steps + 1)
        return np.where(ok, witem_s[np.maximum(at, 0)], -1), \
            np.where(ok, wstep_s[np.maximum(at, 0)], -1)

    out = []
    # reads: a snapshot reads for its op; an op with no snapshot reads itself
    reader = np.where(snapped[rd.op], ids.snap_item[rd.op], ids.op_item[rd.op])
    rkey = _key(sidx, rd, n_steps)
    w_item, _ = last_write_before(rkey)
    keep = w_item >= 0
    out.append((reader[keep], w_item[keep], src[rd.op][keep]))
    sn = np.flatnonzero(snapped)
    out.append((ids.op_item[sn], ids.snap_item[sn], src[sn]))
    # writes: the last earlier writer, and every reader since it (earlier steps) ...
    me, rank = ids.op_item[wr.op], dst[wr.op]
    w_item, w_step = last_write_before(wkey)
    keep = w_item >= 0
    out.append((me[keep], w_item[keep], rank[keep]))
    ro = np.argsort(rkey, kind="stable")
    rkey_s, reader_s = rkey[ro], reader[ro]
    base = wkey - sidx[wr.op]
    out.append(_ranges(rkey_s, reader_s, base + w_step + 1, wkey, me, rank))
    # ... the snapshots of this step reading it (they come first) ...
    snap_rows = snapped[rd.op]
    sk = rkey[snap_rows]
    so = np.argsort(sk, kind="stable")
    out.append(_ranges(sk[so], reader[snap_rows][so], wkey, wkey + 1, me, rank))
    # ... and an earlier write of the slot in this step (the one just before, in issue order)
    same = np.flatnonzero(wkey_s[1:] == wkey_s[:-1]) + 1
    out.append((witem_s[same], witem_s[same - 1], dst[wr.op][wo][same]))
    return tuple(np.concatenate(c) for c in zip(*out, strict=True))


def _ranges(keys_s, vals_s, lo_key, hi_key, me, rank):
    """(me, v, rank) for every v whose key lies in [lo_key, hi_key) of each row."""
    lo, hi = np.searchsorted(keys_s, lo_key), np.searchsorted(keys_s, hi_key)
    pairs = _expand(lo, np.maximum(hi, lo))
    return me[pairs.op], vals_s[pairs.slot], rank[pairs.op]


#: edges are sorted on one int64 key (item, dep, rank) when it cannot overflow
_ONE_KEY_LIMIT = 2 ** 62


def _plan(ids: _ItemIds, snapped, red, count, edges, lane, n_lanes) -> DataflowPlan:
    """The items in issue order, each with its sorted edges and staging."""
    item, dep, rank = edges
    n_items = len(ids.item_op)
    o = ids.item_op
    # staging, allocated in issue order: a snapshot's copy, a reducing receive's landing
    uses = np.where(ids.item_snap | red[o], count[o], 0)
    at = np.cumsum(uses) - uses
    stage = np.where(ids.item_snap, at, -1)
    stage[~ids.item_snap & snapped[o]] = stage[ids.snap_item[o[~ids.item_snap & snapped[o]]]]
    land = np.where(~ids.item_snap & red[o], at, -1)
    # sorted, distinct edges per item
    n_ranks = int(rank.max()) + 1 if len(rank) else 1
    if n_items * n_items * n_ranks < _ONE_KEY_LIMIT:       # one sort key, or three
        key = _distinct((item * n_items + dep) * n_ranks + rank)
        item, dep, rank = key // (n_items * n_ranks), key // n_ranks % n_items, key % n_ranks
    elif len(item):
        order = np.lexsort((rank, dep, item))
        item, dep, rank = item[order], dep[order], rank[order]
        new = np.concatenate([[True], (np.diff(item) != 0) | (np.diff(dep) != 0)
                              | (np.diff(rank) != 0)])
        item, dep, rank = item[new], dep[new], rank[new]
    cut = np.searchsorted(item, np.arange(n_items + 1)).tolist()
    pairs = list(zip(dep.tolist(), rank.tolist(), strict=True))
    deps = map(tuple, map(pairs.__getitem__, map(slice, cut[:-1], cut[1:])))
    none = np.array(None, dtype=object)
    stage_o = np.where(stage < 0, none, stage.astype(object)).tolist()
    land_o = np.where(land < 0, none, land.astype(object)).tolist()
    items = tuple(map(Item, o.tolist(), ids.item_snap.tolist(), deps, stage_o, land_o))
    return DataflowPlan(items, lane, n_lanes, 0, int(uses.sum()))


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
    time, lanes, group = _run(s, plan, op_overhead, place=True)
    n_local = int(lanes.max()) + 1 - plan.n_lanes if len(lanes) else 0
    return DataflowPlan(plan.items, lanes, plan.n_lanes, max(n_local, 0), plan.staging, group,
                        time, op_overhead)


def dataflow_time(s: Schedule, op_overhead: float = 0.0, plan: DataflowPlan | None = None
                  ) -> float:
    """The time of the dataflow library on ``s``: the simulator's links (each served first
    come, first served in issue order, cut-through, as in event mode) with the library's
    order: a group starts when its edges are done and its lane is free on both of its ranks
    and pays ``op_overhead`` (one launch); snapshots and local ops are free, as in the
    simulator's default. A plan placed at this ``op_overhead`` already knows its time (placing
    runs it: the same decisions, so the same time), so it is not run twice."""
    plan = plan or lower_schedule(s)
    if plan.placed_time is not None and plan.placed_overhead == op_overhead:
        return plan.placed_time
    return _run(s, plan, op_overhead)[0]


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
