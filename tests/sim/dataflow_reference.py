"""The dataflow lowering as it was before it was split into passes: one loop over the ops
of each step. :func:`cclc.dataflow.lower` must give exactly the same plan."""

from __future__ import annotations

import numpy as np

from cclc.dataflow import MAX_LANES, DataflowPlan, Item, _colour
from cclc.ir import OpKind


def lower_reference(  # noqa: C901 (the loop it replaced, kept as is)
        n: int, step, src, dst, path, kind, src_buf, src_off, dst_buf, dst_off, count, dcount,
        widths: tuple[int, int, int], max_lanes: int = MAX_LANES) -> DataflowPlan:
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
