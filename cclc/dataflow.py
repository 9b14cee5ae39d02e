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
from functools import cached_property
from typing import NamedTuple

import numpy as np

from cclc.ir import Buf, OpKind, Schedule
from cclc.sim import dest_counts, prepare, rank_in_runs

__all__ = ["MAX_LANES", "DataflowPlan", "Item", "dataflow_time", "lane_colouring", "lower",
           "lower_schedule"]

#: at most this many lane communicators per call (each NCCL communicator costs memory and
#: setup, priced by cclc.lane_cost, which may choose fewer under a memory budget): pairs
#: beyond an edge colouring with this many colours share a lane
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

    ``item_tuple``: the items, or None for a plan that has them as ``columns`` only
    (:func:`lower`'s: timing it needs no tuples, and millions of them take seconds and GiBs);
    :attr:`items` makes them when asked (the emitters ask).
    """

    item_tuple: tuple[Item, ...] | None
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
    #: the items as columns (:func:`lower` makes them; None: read them from ``items``)
    columns: _Columns | None = None

    @cached_property
    def items(self) -> tuple[Item, ...]:
        """The items in issue order."""
        if self.item_tuple is not None:
            return self.item_tuple
        assert self.columns is not None, "a plan has its items as a tuple or as columns"
        return self.columns.items()


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
    path = np.asarray(path, dtype=np.int64)[net]
    paths = int(path.max()) + 1
    if n * n * paths < _ONE_KEY_LIMIT:
        # (src, dst, path) as one number: the same order as rows, and numpy's unique of
        # rows (a sort of a structured view) takes seconds at millions of ops
        key, first, inv = np.unique((src[net] * n + dst[net]) * paths + path,
                                    return_index=True, return_inverse=True)
        conns = np.stack([key // paths // n, key // paths % n], axis=1)
    else:
        keys = np.stack([src[net], dst[net], path], axis=1)
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


def lane_colouring(n: int, src: np.ndarray, dst: np.ndarray, path: np.ndarray, cap: int
                   ) -> np.ndarray:
    """The lane of every op (-1 for local ops) as :func:`lower` chooses it with at most
    ``cap`` lanes (what :mod:`cclc.lane_cost` prices before a plan is made)."""
    return _colour(np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64),
                   np.asarray(path), n, cap)


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
    items, waited, ranks = (np.concatenate(c) for c in zip(*out, strict=True))
    return items, waited, ranks


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
    cut = np.searchsorted(item, np.arange(n_items + 1)).astype(np.int64)
    columns = _Columns(o, ids.item_snap, cut, dep, rank, stage, land)
    return DataflowPlan(None, lane, n_lanes, 0, int(uses.sum()), columns=columns)


#: at most this many local lanes (streams) per rank
MAX_LOCAL_LANES = 8


def lower_schedule(s: Schedule, op_overhead: float = 0.0, max_lanes: int = MAX_LANES,
                   grouping: bool = True) -> DataflowPlan:
    """:func:`lower` in the schedule's own chunks (the simulator's slots), local ops placed
    by :func:`place_local_ops` (``grouping``: whether ready messages of a lane share a
    launch)."""
    o = s.ops
    plan = lower(s.n, o.step, o.src, o.dst, o.route, o.kind, o.src_buf, o.src_off, o.dst_buf,
                 o.dst_off, o.count, dest_counts(s),
                 (s.n_chunks(Buf.INPUT), s.n_chunks(Buf.OUTPUT), s.n_chunks(Buf.SCRATCH)),
                 max_lanes)
    return place_local_ops(s, plan, op_overhead, grouping)


def place_local_ops(s: Schedule, plan: DataflowPlan, op_overhead: float = 0.0,
                    grouping: bool = True) -> DataflowPlan:
    """Lanes for local ops and groups for messages, chosen with the simulator's times at the
    schedule's size (any choice is correct; these make the library as fast as event mode).

    A local op costs nothing, so a lane of local ops only delays one when an earlier one is
    not ready yet: each goes to the local lane of its rank whose last op was ready latest but
    no later than this one, else a new lane (at most :data:`MAX_LOCAL_LANES`, then the lane
    ready earliest). A message joins the open group of its lane (one ``ncclGroupStart`` ...
    ``ncclGroupEnd``, one launch) when nothing else used the lane on either rank since the
    group began, every edge it has comes before the group's first item, and it is ready when
    the group starts: then it waits for nothing more and the group pays one launch. Without
    ``grouping`` (a runtime that pays per message) every message is a group of its own."""
    time, lanes, group = _run(s, plan, op_overhead, place=True, grouping=grouping)
    n_local = int(lanes.max()) + 1 - plan.n_lanes if len(lanes) else 0
    return DataflowPlan(plan.item_tuple, lanes, plan.n_lanes, max(n_local, 0), plan.staging,
                        group, time, op_overhead, plan.columns)


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


@dataclass(frozen=True, slots=True)
class _Columns:
    """The items as columns: each item's op and snapshot flag, its edges' items and ranks
    (``dep_item[dep_ptr[k]:dep_ptr[k + 1]]`` for item ``k``), and (from :func:`lower`) its
    staging and landing slots (-1: none)."""

    op: np.ndarray
    snap: np.ndarray
    dep_ptr: np.ndarray
    dep_item: np.ndarray
    dep_rank: np.ndarray | None = None
    stage: np.ndarray | None = None
    land: np.ndarray | None = None

    def items(self) -> tuple[Item, ...]:
        """The items as tuples (what the emitters walk)."""
        assert self.dep_rank is not None and self.stage is not None and self.land is not None
        cut = self.dep_ptr.tolist()
        pairs = list(zip(self.dep_item.tolist(), self.dep_rank.tolist(), strict=True))
        deps = map(tuple, map(pairs.__getitem__, map(slice, cut[:-1], cut[1:])))
        none = np.array(None, dtype=object)
        stage = np.where(self.stage < 0, none, self.stage.astype(object)).tolist()
        land = np.where(self.land < 0, none, self.land.astype(object)).tolist()
        return tuple(map(Item, self.op.tolist(), self.snap.tolist(), deps, stage, land))


def _columns_of(items) -> _Columns:
    """The columns of a plan made elsewhere (a plan from :func:`lower` carries its own)."""
    n = len(items)
    counts = np.fromiter((len(it.deps) for it in items), dtype=np.int64, count=n)
    return _Columns(np.fromiter((it.op for it in items), dtype=np.int64, count=n),
                    np.fromiter((it.snap for it in items), dtype=bool, count=n),
                    np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
                    np.fromiter((d for it in items for d, _ in it.deps), dtype=np.int64,
                                count=int(counts.sum())))


def _stable_order(key: np.ndarray) -> np.ndarray:
    """``np.argsort(key, kind="stable")`` for keys ``>= 0``, by 16-bit radix passes where the
    keys fit in 32 bits (numpy radix-sorts 16-bit keys, several times faster than its merge
    sort of 64-bit ones)."""
    top = int(key.max()) if len(key) else 0
    if top < 2 ** 16:
        return np.argsort(key.astype(np.uint16), kind="stable")
    if top >= 2 ** 32:
        return np.argsort(key, kind="stable")
    order = np.argsort((key & 0xFFFF).astype(np.uint16), kind="stable")
    return order[np.argsort((key[order] >> 16).astype(np.uint16), kind="stable")]


def _next_on_key(key: np.ndarray, item: np.ndarray) -> np.ndarray:
    """Per row (rows in issue order), the item of the next row with the same key (-1 for
    none, or when it is the same item: a route through one link twice)."""
    nxt = np.full(len(key), -1, dtype=np.int64)
    if len(key):
        order = _stable_order(key)
        ks = key[order]
        same = np.flatnonzero(ks[1:] == ks[:-1])
        then = item[order[same + 1]]
        nxt[order[same]] = np.where(then != item[order[same]], then, -1)
    return nxt


@dataclass(frozen=True, slots=True)
class _Succ:
    """Who waits for whom: per item the items that may not start before it, from three
    sources: the next item on each of its lane slots (``slot_ptr`` rows into ``slot_next``),
    on each link of its route (``pair_ptr`` rows into ``pair_next``), and the items whose
    edges name it (``dep_ptr`` into ``dep_then``); -1 where there is none."""

    slot_ptr: np.ndarray
    slot_next: np.ndarray
    pair_ptr: np.ndarray
    pair_next: np.ndarray
    dep_ptr: np.ndarray
    dep_then: np.ndarray

    def indegree(self, n_items: int) -> np.ndarray:
        """How many of these edges end at each item."""
        ends = np.concatenate([self.slot_next, self.pair_next, self.dep_then])
        return np.bincount(ends[ends >= 0], minlength=n_items)

    def after(self, w: np.ndarray) -> np.ndarray:
        """The edges out of items ``w`` (their ends, with repeats)."""
        out = np.concatenate([
            self.slot_next[_expand(self.slot_ptr[w], self.slot_ptr[w + 1]).slot],
            self.pair_next[_expand(self.pair_ptr[w], self.pair_ptr[w + 1]).slot],
            self.dep_then[_expand(self.dep_ptr[w], self.dep_ptr[w + 1]).slot]])
        return out[out >= 0]


def _successors(cols: _Columns) -> tuple[np.ndarray, np.ndarray]:
    """The edges of the columns reversed: per item, the items whose edges name it (CSR)."""
    n_items = len(cols.op)
    order = _stable_order(cols.dep_item)
    then = np.repeat(np.arange(n_items, dtype=np.int64), np.diff(cols.dep_ptr))[order]
    ptr = np.concatenate([[0], np.cumsum(np.bincount(cols.dep_item, minlength=n_items))])
    return ptr.astype(np.int64), then


def _run(s: Schedule, plan: DataflowPlan, op_overhead: float, place: bool = False,
         grouping: bool = True) -> tuple[float, np.ndarray, np.ndarray]:
    """The plan's items in issue order under the simulator's link model (see
    :func:`dataflow_time` and :func:`place_local_ops`): the time, every op's lane and group.

    Columnar: an item depends on its edges, the item before it on each of its lane slots and
    links (which serve in issue order), and, while placing, the rank's previous local item (a
    rank's local lanes are chosen in order); no other state. So the items run in waves, each
    the items whose predecessors have all run (Kahn's order), all at once, with exactly the
    loop's arithmetic (the same maxima and sums of the same numbers), so the times are the
    same to the last bit (``tests/sim/dataflow_run_reference.py`` keeps the loop)."""
    p = prepare(s)
    o = s.ops
    cols = plan.columns if plan.columns is not None else _columns_of(plan.items)
    lane = plan.lane.astype(np.int64, copy=True)
    # an op of a plan not placed is a group of its own
    group = np.arange(len(o), dtype=np.int64) if place or plan.group is None else \
        plan.group.astype(np.int64, copy=True)
    n_items = len(cols.op)
    if not n_items:
        return 0.0, lane, group
    st = _RunState.start(s, p, plan, cols, place, lane, grouping)
    succ = st.successors(cols, place, lane)
    indegree = succ.indegree(n_items)
    wave = np.flatnonzero(indegree == 0)
    mark = np.zeros(n_items, dtype=np.int64)
    while len(wave):
        st.wave(wave, op_overhead, lane, group)
        after = succ.after(wave)
        np.subtract.at(indegree, after, 1)
        free = after[indegree[after] == 0]
        # each item once (an item may end several edges of the wave): the one position of it
        # that the scatter below kept; a wave's order does not matter (its items share
        # nothing)
        at = np.arange(len(free))
        mark[free] = at
        wave = free[mark[free] == at]
    return float(st.finish.max()), lane, group


@dataclass(eq=False)
class _RunState:
    """What the run keeps between waves: per item its finish; per lane slot its free time and
    last item; per link its free time; per group its start and first item; while placing,
    every rank's local lanes and when each was last ready. Mutable on purpose: one run's
    scratch, never seen outside :func:`_run`."""

    place: bool
    n: int
    n_lanes: int
    width: int
    op: np.ndarray
    snap: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    net: np.ndarray
    local: np.ndarray
    dep_ptr: np.ndarray
    dep_item: np.ndarray
    max_dep: np.ndarray
    pair_ptr: np.ndarray
    pair_link: np.ndarray
    pair_cost: np.ndarray
    pair_round: np.ndarray | None
    latency: np.ndarray
    finish: np.ndarray
    link_free: np.ndarray
    lane_free: np.ndarray
    lane_last: np.ndarray
    g_start: np.ndarray
    g_first: np.ndarray
    pool_ready: np.ndarray
    pool_size: np.ndarray
    #: while placing, whether messages join groups (see place_local_ops)
    grouping: bool = True

    @classmethod
    def start(cls, s: Schedule, p, plan: DataflowPlan, cols: _Columns, place: bool,
              lane: np.ndarray, grouping: bool = True) -> _RunState:
        o = s.ops
        io = cols.op
        n_items, n_ops = len(io), len(o)
        src, dst = o.src.astype(np.int64)[io], o.dst.astype(np.int64)[io]
        local = src == dst
        net = ~cols.snap & ~local
        # each network item's (item, link) pairs, in route order
        offsets = s.routes.offsets.astype(np.int64)
        route = o.route.astype(np.int64)[io]
        lo = offsets[route]
        n_pairs = np.where(net, offsets[route + 1] - lo, 0)
        pairs = _expand(lo, lo + n_pairs)
        pair_link = s.routes.links.astype(np.int64)[pairs.slot]
        bw = s.topology.link_bandwidth.astype(np.float64)
        pair_cost = p.op_bytes[io[pairs.op]] / bw[pair_link]
        counts = np.diff(cols.dep_ptr)
        max_dep = np.full(n_items, -1, dtype=np.int64)
        has = np.flatnonzero(counts)
        if len(has):
            max_dep[has] = np.maximum.reduceat(cols.dep_item, cols.dep_ptr[has])
        width = plan.n_lanes + (MAX_LOCAL_LANES if place else plan.n_local)
        return cls(place, s.n, plan.n_lanes, width, io, cols.snap, src, dst, net, local,
                   cols.dep_ptr, cols.dep_item, max_dep,
                   np.concatenate([[0], np.cumsum(n_pairs)]).astype(np.int64), pair_link,
                   pair_cost, _rounds(pairs.op, pair_link, s.topology.n_links),
                   p.route_latency[io].astype(np.float64), np.zeros(n_items),
                   np.zeros(s.topology.n_links), np.zeros(s.n * width),
                   np.full(s.n * width, -1, dtype=np.int64), np.full(n_ops, -1.0),
                   np.full(n_ops, -1, dtype=np.int64),
                   np.zeros((s.n, MAX_LOCAL_LANES)), np.zeros(s.n, dtype=np.int64), grouping)

    def successors(self, cols: _Columns, place: bool, lane: np.ndarray) -> _Succ:
        """The next item on each lane slot of every item, on each link of its route and
        (placing) on its rank's local lanes, and the items whose edges name it."""
        n_items = len(self.op)
        ln = lane[self.op]
        # every item's lane slot at its source (a message's, a snapshot's, a local op's); a
        # message's second at its destination. Placing, a rank's local items share one key
        # (its lanes are chosen in order) past the slots
        key0 = self.src * self.width + ln
        if place:
            key0 = np.where(self.local, self.n * self.width + self.src, key0)
        per = 1 + self.net.astype(np.int64)
        slot_ptr = np.concatenate([[0], np.cumsum(per)]).astype(np.int64)
        key = np.empty(int(slot_ptr[-1]), dtype=np.int64)
        key[slot_ptr[:-1]] = key0
        two = np.flatnonzero(self.net)
        key[slot_ptr[two] + 1] = self.dst[two] * self.width + ln[two]
        items = np.arange(n_items, dtype=np.int64)
        slot_next = _next_on_key(key, np.repeat(items, per))
        pair_item = np.repeat(items, np.diff(self.pair_ptr))
        dep_ptr, dep_then = _successors(cols)
        return _Succ(slot_ptr, slot_next, self.pair_ptr, _next_on_key(self.pair_link, pair_item),
                     dep_ptr, dep_then)

    def wave(self, w: np.ndarray, op_overhead: float, lane: np.ndarray, group: np.ndarray
             ) -> None:
        """Run items ``w``: no two share a lane slot, a link or (placing) a rank's local
        lanes, and everything they wait for has run."""
        ready = self._dep_ready(w)
        op, src, net = self.op[w], self.src[w], self.net[w]
        if self.place:
            self._choose_local_lanes(w, ready, lane)
        ln = lane[op]
        x0 = src * self.width + ln
        x1 = np.where(net, self.dst[w] * self.width + ln, x0)
        if self.place and self.grouping:
            self._join_groups(w, ready, x0, x1, group)
        member = net & (group[op] != op)
        ready = np.where(member, self.g_start[group[op]],
                         np.maximum(np.maximum(ready, self.lane_free[x0]), self.lane_free[x1]))
        if self.place:
            mine = np.flatnonzero(self.local[w] & ~self.snap[w])
            self.pool_ready[src[mine], ln[mine] - self.n_lanes] = ready[mine]
        end = self._links(w, ready, member, op, op_overhead)
        self.finish[w] = end
        free0 = self.lane_free[x0]
        self.lane_free[x0] = np.where(member, np.maximum(free0, end), end)
        self.lane_last[x0] = w
        x1n, en, mn = x1[net], end[net], member[net]
        self.lane_free[x1n] = np.where(mn, np.maximum(self.lane_free[x1n], en), en)
        self.lane_last[x1n] = w[net]

    def _dep_ready(self, w: np.ndarray) -> np.ndarray:
        """The latest finish of each item's edges (0 without any)."""
        lo, hi = self.dep_ptr[w], self.dep_ptr[w + 1]
        ready = np.zeros(len(w))
        has = np.flatnonzero(hi > lo)
        if len(has):
            d = _expand(lo[has], hi[has])
            first = np.cumsum(hi[has] - lo[has]) - (hi[has] - lo[has])
            ready[has] = np.maximum.reduceat(self.finish[self.dep_item[d.slot]], first)
        return ready

    def _choose_local_lanes(self, w: np.ndarray, ready: np.ndarray, lane: np.ndarray) -> None:
        """A local op's lane, at its first item: the lane of its rank ready latest but no later
        than the item, else a new one (up to :data:`MAX_LOCAL_LANES`), else the one ready
        earliest; the first such lane on a tie."""
        sel = np.flatnonzero(self.local[w] & (lane[self.op[w]] < 0))
        if not len(sel):
            return
        r = self.src[w[sel]]
        rows, size = self.pool_ready[r], self.pool_size[r]
        fits = (np.arange(MAX_LOCAL_LANES) < size[:, None]) & (rows <= ready[sel][:, None])
        fit = fits.any(axis=1)
        c = np.argmax(np.where(fits, rows, -np.inf), axis=1)
        grow = ~fit & (size < MAX_LOCAL_LANES)
        c[grow] = size[grow]
        full = ~fit & ~grow
        c[full] = np.argmin(rows[full], axis=1)
        self.pool_ready[r[grow], c[grow]] = 0.0
        self.pool_size[r[grow]] += 1
        lane[self.op[w[sel]]] = self.n_lanes + c

    def _join_groups(self, w, ready, x0, x1, group) -> None:
        """A message joins the open group of its lane when the lane's last item on both ranks
        is that group's message, the group starts no earlier than the message is ready, and
        every edge of the message comes before the group's first item."""
        m = np.flatnonzero(self.net[w])
        prev = self.lane_last[x0[m]]
        at = np.maximum(prev, 0)
        g = group[self.op[at]]
        ok = (prev >= 0) & (self.lane_last[x1[m]] == prev) & ~self.snap[at] \
            & (self.g_start[g] >= ready[m]) & (self.max_dep[w[m]] < self.g_first[g])
        group[self.op[w[m[ok]]]] = g[ok]

    def _links(self, w, ready, member, op, op_overhead: float) -> np.ndarray:
        """Each item's end: a group's first message pays ``op_overhead`` and opens the
        group; a message takes each link of its route when the link is free, first come,
        first served, and ends its route's latency after its last link."""
        lo, hi = self.pair_ptr[w], self.pair_ptr[w + 1]
        has = np.flatnonzero(hi > lo)
        lead = has[~member[has]]
        ready[lead] = ready[lead] + op_overhead
        self.g_start[op[lead]] = ready[lead]
        self.g_first[op[lead]] = w[lead]
        end = ready.copy()
        if not len(has):
            return end
        d = _expand(lo[has], hi[has])
        link, start = self.pair_link[d.slot], ready[has][d.op]
        done = np.empty(len(link))
        rounds = [np.arange(len(link))] if self.pair_round is None else \
            [np.flatnonzero(self.pair_round[d.slot] == q)
             for q in range(int(self.pair_round[d.slot].max()) + 1)]
        for i in rounds:      # a route through a link twice takes it again after itself
            done[i] = np.maximum(start[i], self.link_free[link[i]]) + self.pair_cost[d.slot[i]]
            self.link_free[link[i]] = done[i]
        first = np.cumsum(hi[has] - lo[has]) - (hi[has] - lo[has])
        last = np.maximum(ready[has], np.maximum.reduceat(done, first))
        end[has] = last + self.latency[w[has]]
        return end


def _rounds(pair_item: np.ndarray, pair_link: np.ndarray, n_links: int) -> np.ndarray | None:
    """Per (item, link) pair, how many earlier pairs of its item take the same link (routes
    through a link twice); None when no route does, as in every schedule cclc builds."""
    longest = int(np.bincount(pair_item).max()) if len(pair_item) else 0
    # an item's pairs are consecutive: a repeat is d apart for some d below the longest route
    if not any(((pair_item[d:] == pair_item[:-d]) & (pair_link[d:] == pair_link[:-d])).any()
               for d in range(1, longest)):
        return None
    key = pair_item * max(n_links, 1) + pair_link
    order = np.argsort(key, kind="stable")
    ks = key[order]
    out = np.empty(len(key), dtype=np.int64)
    out[order] = rank_in_runs(ks)
    return out
