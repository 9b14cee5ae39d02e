"""The event-driven simulator as it was first written: one Python loop over the ops. Kept as
the reference the columnar :func:`cclc.sim._event` must reproduce bit for bit."""

from __future__ import annotations

import numpy as np

from cclc.ir import Schedule
from cclc.sim import Prepared, _slot_bases, dest_counts


def reference_event(s: Schedule, p: Prepared, local: np.ndarray,
           overhead: float = 0.0) -> tuple[np.ndarray, np.ndarray, tuple[int, ...]]:
    """One pass over the ops in step order (they are sorted by step): linear in ops + slots.

    Per slot it keeps the last writer (op, finish time) and the latest-finishing reader since
    that write; per link the op it served last and when that ended. Ops of a step only see the
    slot state of earlier steps, so a step's updates are applied after the whole step.
    """
    ops = s.ops
    n_ops = len(ops)
    bases, widths = _slot_bases(s)
    n_slots = bases[-1] + s.n * widths[-1]
    write_t = [0.0] * n_slots        # finish of the last writer
    write_op = [-1] * n_slots        # internal sentinel: no writer yet (never leaves here)
    read_t = [0.0] * n_slots         # latest finish of a reader since the last write
    read_op = [-1] * n_slots
    link_free = [0.0] * s.topology.n_links
    link_last = [-1] * s.topology.n_links
    bw = s.topology.link_bandwidth.tolist()

    step = ops.step.tolist()
    src, dst = ops.src.tolist(), ops.dst.tolist()
    src_buf, dst_buf = ops.src_buf.tolist(), ops.dst_buf.tolist()
    src_off, dst_off = ops.src_off.tolist(), ops.dst_off.tolist()
    count = ops.count.tolist()
    nbytes = p.op_bytes.tolist()
    lat = p.route_latency.tolist()
    loc = local.tolist()
    offsets = s.routes.offsets.tolist()
    route = ops.route.tolist()
    links = s.routes.links.tolist()
    dcount = dest_counts(s).tolist()

    start = [0.0] * n_ops
    finish = [0.0] * n_ops
    pred = [-1] * n_ops              # the op this one waited for last (-1: none)
    pending: list[tuple[int, float, list[int], list[int]]] = []   # this step's slot updates
    order = np.argsort(ops.step, kind="stable").tolist()
    cur_step = step[order[0]] if n_ops else 0
    for o in order:
        if step[o] != cur_step:
            _apply(pending, write_t, write_op, read_t, read_op)
            pending = []
            cur_step = step[o]
        sb = bases[src_buf[o]] + src[o] * widths[src_buf[o]] + src_off[o]
        reads = list(range(sb, sb + count[o]))
        db = bases[dst_buf[o]] + dst[o] * widths[dst_buf[o]] + dst_off[o]
        # the element totals match, but chunk counts may differ between buffers: the write
        # range is every destination chunk the op's elements land in
        writes = list(range(db, db + dcount[o]))
        ready, why = 0.0, -1
        for slot in reads:
            if write_t[slot] > ready:
                ready, why = write_t[slot], write_op[slot]
        for slot in writes:
            # a reduce reads its destination; any write waits for the previous writer and
            # for everyone who read the old value
            if write_t[slot] > ready:
                ready, why = write_t[slot], write_op[slot]
            if read_t[slot] > ready:
                ready, why = read_t[slot], read_op[slot]
        ready += overhead
        r0, r1 = offsets[route[o]], offsets[route[o] + 1]
        if r0 == r1:
            start[o] = ready
            finish[o] = ready + loc[o]
            pred[o] = why
        else:
            first_start = float("inf")
            last_end, last_why = -1.0, why
            for k in range(r0, r1):
                ln = links[k]
                if link_free[ln] > ready:
                    begin, by = link_free[ln], link_last[ln]
                else:
                    begin, by = ready, why
                end = begin + nbytes[o] / bw[ln]
                link_free[ln] = end
                link_last[ln] = o
                first_start = min(first_start, begin)
                if end > last_end:
                    last_end, last_why = end, by
            start[o] = first_start
            finish[o] = last_end + lat[o]
            pred[o] = last_why
        pending.append((o, finish[o], reads, writes))
    path: list[int] = []
    if n_ops:
        o = int(np.argmax(finish))
        while o >= 0:
            path.append(o)
            o = pred[o]
        path.reverse()
    return np.array(start), np.array(finish), tuple(path)


def _apply(pending, write_t, write_op, read_t, read_op) -> None:
    """Record a finished step's reads, then its writes (a write resets the slot's readers)."""
    for o, t, reads, _ in pending:
        for slot in reads:
            if t > read_t[slot]:
                read_t[slot], read_op[slot] = t, o
    for o, t, _, writes in pending:
        for slot in writes:
            write_t[slot], write_op[slot] = t, o
            read_t[slot], read_op[slot] = 0.0, -1
