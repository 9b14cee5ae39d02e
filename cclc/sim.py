"""The cost simulator: how long a schedule takes on its topology, and where the time goes.

Links follow the alpha-beta model: a message of ``b`` bytes over a route of links costs the
sum of the links' latencies plus ``b`` over the bandwidth it gets on the route's slowest link
(cut-through, not store-and-forward: the bytes stream through every hop at once).

Two modes:

``lockstep``
    Steps run one after another, separated by barriers. Inside a step, the messages that cross
    one link share its bandwidth, so a link ``l`` is busy for ``busy(s, l) = bytes(s, l) /
    bandwidth(l)`` in step ``s``. Op ``o`` of step ``s`` takes ``latency(route(o)) +
    max over l in route(o) of busy(s, l)`` (a local op takes ``bytes / local_bandwidth``, or
    nothing by default), and the step lasts as long as its slowest op::

        time(s) = max over ops o of step s of (latency(route(o)) + max_{l in route(o)} busy(s, l))

    On a step where every op has one route latency ``a`` this is ``a + max_l busy(s, l)`` — "a
    step lasts as long as its busiest link". Total time = sum of step times.

``event``
    No barriers. An op is *ready* when every op it depends on has finished: the last earlier
    writer of each slot it reads (and, for a reduce, of each slot it writes), the last earlier
    writer of each slot it overwrites, and every earlier reader of those slots since that write
    (write-after-read). Dependencies come from the chunk reads and writes per buffer slot, not
    from anything stored in the IR; ops of the same step never depend on each other (they read
    the state left by the previous step, as in lockstep). Each link serves its ops first come,
    first served in step order (then op order): op ``o`` occupies link ``l`` for ``bytes(o) /
    bandwidth(l)`` from ``max(ready(o), end of the previous op on l)``, and finishes
    ``latency(route(o))`` after its last link is done. Under this model an op is never later
    than in lockstep, so ``event <= lockstep``; pipelining across steps is what makes it
    shorter. With one step and one route latency the two agree.

Software overhead: ``lockstep`` can charge a fixed cost per step (a runtime that launches
each step as one group of sends and receives pays a launch and a synchronization per step) and
``event`` a fixed cost per op (a runtime that issues each op from its own queue pays an issue
cost per op); :mod:`cclc.execution` says which backend pays which and where the numbers come
from. Both are 0 unless asked for.

Both modes report the same per-link bytes and busy time (bytes / bandwidth) and per-step
breakdown; per-op start/finish times and a critical path come with either (lockstep: the op
that sets each step's length; event: the chain of ops and link waits that ends last).

Bandwidths follow nccl-tests: ``algbw = size / time`` with ``size`` the collective's size (see
:class:`cclc.collective.Collective`), ``busbw = algbw * factor`` with factor ``2(n-1)/n`` for
allreduce, ``(n-1)/n`` for allgather, reducescatter and alltoall, ``1`` for broadcast and reduce.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from cclc.collective import CollectiveKind
from cclc.errors import ScheduleError
from cclc.ir import Buf, Schedule, format_schedule

__all__ = ["SIM_MODES", "SimResult", "bus_factor", "simulate"]

SIM_MODES = ("lockstep", "event")


def bus_factor(kind: CollectiveKind, n: int) -> float:
    """nccl-tests' bus-bandwidth factor for ``kind`` on ``n`` ranks."""
    if kind is CollectiveKind.ALLREDUCE:
        return 2.0 * (n - 1) / n
    if kind in (CollectiveKind.ALLGATHER, CollectiveKind.REDUCESCATTER, CollectiveKind.ALLTOALL):
        return (n - 1) / n
    return 1.0


def _ro(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    a.setflags(write=False)
    return a


@dataclass(frozen=True, eq=False)
class SimResult:
    """What :func:`simulate` found. Times in seconds, bytes in bytes, bandwidths in B/s.

    ``link_bytes``/``link_busy`` are indexed by global link id of the topology. ``step_*`` are
    indexed by step: ``step_start``/``step_time`` (lockstep: the step's slot between barriers;
    event: from its first op's start to its last op's finish), ``step_bytes`` (bytes sent over
    links), ``step_busiest_link`` (the link with the most busy time in the step, ``None`` for a
    step without network traffic). ``op_start``/``op_finish`` are per op of the schedule.
    """

    mode: str
    time: float
    size: int
    algbw: float
    busbw: float
    link_bytes: np.ndarray
    link_busy: np.ndarray
    step_start: np.ndarray
    step_time: np.ndarray
    step_bytes: np.ndarray
    step_busiest_link: tuple[int | None, ...]
    op_start: np.ndarray
    op_finish: np.ndarray
    critical_path: tuple[int, ...]

    @property
    def n_steps(self) -> int:
        return len(self.step_time)

    def busiest_links(self, k: int = 5) -> np.ndarray:
        """Ids of the ``k`` links with the most busy time, busiest first (unused links left out)."""
        used = np.flatnonzero(self.link_busy > 0)
        order = np.lexsort((used, -self.link_busy[used]))
        return used[order[:k]]

    def percent_of(self, bound: float) -> float:
        """``bound / time`` in percent: how close the schedule comes to a lower bound."""
        return 100.0 * bound / self.time if self.time > 0 else float("nan")


# --------------------------------------------------------------------------------------------
# shared preparation


@dataclass(frozen=True)
class _Prepared:
    """The (op, link) pairs of every network op, expanded from the CSR routes."""

    op_bytes: np.ndarray      # float64 per op
    route_latency: np.ndarray  # per op, seconds (0 for local ops)
    pair_op: np.ndarray       # per (op, link) pair, grouped by op in op order
    pair_link: np.ndarray
    pair_starts: np.ndarray   # first pair of every networked op (ops with a route), in op order
    net_ops: np.ndarray       # indices of ops with a non-empty route


def _prepare(s: Schedule) -> _Prepared:
    topo = s.topology
    ops = s.ops
    routes = s.routes
    route = ops.route.astype(np.int64)
    if len(ops) and (route.min() < 0 or route.max() >= len(routes)):
        bad = int(np.flatnonzero((route < 0) | (route >= len(routes)))[0])
        raise ScheduleError(f"op #{bad} names route {int(route[bad])}, but the schedule has "
                            f"{len(routes)} routes")
    if len(routes.links) and (routes.links.min() < 0 or routes.links.max() >= topo.n_links):
        raise ScheduleError(f"a route names a link outside 0..{topo.n_links - 1} of topology "
                            f"'{topo.name}'")
    _check_ranges(s)
    lengths = routes.lengths()[route]
    first = np.cumsum(lengths) - lengths           # index of each op's first pair
    pair_op, pair_link = s.op_links()
    # route latency of every op: the sum of its links' latencies
    lat = np.bincount(pair_op, weights=topo.link_latency[pair_link],
                      minlength=len(ops)).astype(np.float64)
    net_ops = np.flatnonzero(lengths > 0)
    return _Prepared(op_bytes=s.op_bytes().astype(np.float64), route_latency=lat,
                     pair_op=pair_op, pair_link=pair_link, pair_starts=first[net_ops],
                     net_ops=net_ops)


def _check_ranges(s: Schedule) -> None:
    """Ranks, buffers and chunk ranges inside the schedule's layouts (the simulator indexes
    with them; the verifier says more about a schedule that is wrong in other ways)."""
    ops = s.ops
    bad = (ops.src < 0) | (ops.src >= s.n) | (ops.dst < 0) | (ops.dst >= s.n) | (ops.count < 0)
    for side in ("src", "dst"):
        buf = getattr(ops, f"{side}_buf")
        off = getattr(ops, f"{side}_off").astype(np.int64)
        bad |= (buf < 0) | (buf > max(Buf))
        for b in Buf:
            m = buf == b
            bad[m] |= (off[m] < 0) | (off[m] + ops.count[m] > s.n_chunks(b))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ScheduleError(f"op #{i} reads or writes outside the ranks or buffers of the "
                            f"schedule:\n{format_schedule(s, around=i)}")


def _local_time(s: Schedule, p: _Prepared, local_bandwidth: float | None) -> np.ndarray:
    """Time of every op spent in local memory (only local ops, and only with a bandwidth)."""
    t = np.zeros(len(s.ops))
    if local_bandwidth is not None:
        if not local_bandwidth > 0:
            raise ScheduleError(f"local memory bandwidth must be > 0, got {local_bandwidth:g}")
        local = s.routes.lengths()[s.ops.route] == 0
        t[local] = p.op_bytes[local] / local_bandwidth
    return t


def simulate(schedule: Schedule, mode: Literal["lockstep", "event"] = "lockstep",
             local_bandwidth: float | None = None, step_overhead: float = 0.0,
             op_overhead: float = 0.0) -> SimResult:
    """Simulate ``schedule`` on its topology; see the module docstring for the cost model.

    ``local_bandwidth`` (B/s) charges local ops (``src == dst``, empty route) for the bytes they
    copy or reduce; by default they are free. ``step_overhead`` (seconds, lockstep) is the
    software cost of issuing a step: each step starts that long after the previous barrier.
    ``op_overhead`` (seconds, event) is the software cost of issuing an op: it starts that
    long after its inputs are ready. Both default to 0 (the schedule's own cost);
    :mod:`cclc.execution` gives each backend's values and their sources.

    >>> from cclc.topology import torus                                  # doctest: +SKIP
    >>> r = simulate(sched, mode="event")                                  # doctest: +SKIP
    >>> r.time, r.busbw                                                    # doctest: +SKIP
    """
    if mode not in SIM_MODES:
        raise ScheduleError(f"unknown simulation mode '{mode}': use one of {', '.join(SIM_MODES)}")
    if not (step_overhead >= 0 and op_overhead >= 0):
        raise ScheduleError("software overheads must be >= 0")
    p = _prepare(schedule)
    local = _local_time(schedule, p, local_bandwidth)
    topo = schedule.topology
    bw = topo.link_bandwidth
    link_bytes = np.bincount(p.pair_link, weights=p.op_bytes[p.pair_op],
                             minlength=topo.n_links).astype(np.float64)
    link_busy = link_bytes / bw
    if mode == "lockstep":
        start, finish, path = _lockstep(schedule, p, local, step_overhead)
    else:
        start, finish, path = _event(schedule, p, local, op_overhead)

    n_steps = schedule.n_steps
    step = schedule.ops.step.astype(np.int64)
    if mode == "lockstep":
        # barriers: a step's slot runs from the end of the previous one to its own end
        step_end = np.zeros(n_steps)
        np.maximum.at(step_end, step, finish)
        step_end = np.maximum.accumulate(step_end) if n_steps else step_end
        step_start = np.concatenate([[0.0], step_end[:-1]]) if n_steps else step_end
    else:
        step_start = np.full(n_steps, np.inf)
        step_end = np.zeros(n_steps)
        np.minimum.at(step_start, step, start)
        np.maximum.at(step_end, step, finish)
        step_start[~np.isfinite(step_start)] = 0.0
    step_time = np.maximum(step_end - step_start, 0.0)
    step_bytes, busiest = _step_links(schedule, p)
    total = float(finish.max()) if len(finish) else 0.0
    coll = schedule.collective
    algbw = coll.size / total if total > 0 else float("inf")
    return SimResult(mode=mode, time=total, size=coll.size, algbw=algbw,
                     busbw=algbw * bus_factor(coll.kind, coll.n),
                     link_bytes=_ro(link_bytes), link_busy=_ro(link_busy),
                     step_start=_ro(step_start), step_time=_ro(step_time),
                     step_bytes=_ro(step_bytes), step_busiest_link=busiest,
                     op_start=_ro(start), op_finish=_ro(finish), critical_path=path)


def _step_link_busy(s: Schedule, p: _Prepared) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Busy time of every used (step, link) pair: sorted keys, their busy time, and the
    index of each (op, link) pair's key."""
    n_links = s.topology.n_links
    key = s.ops.step.astype(np.int64)[p.pair_op] * n_links + p.pair_link
    keys, inverse = np.unique(key, return_inverse=True)
    # (bincount of nothing is int64: cast, an empty schedule is still a schedule)
    busy = np.bincount(inverse, weights=p.op_bytes[p.pair_op], minlength=len(keys))
    busy = busy.astype(np.float64) / s.topology.link_bandwidth[keys % n_links]
    return keys, busy, inverse


def _step_links(s: Schedule, p: _Prepared) -> tuple[np.ndarray, tuple[int | None, ...]]:
    n_steps, n_links = s.n_steps, s.topology.n_links
    step_bytes = np.bincount(s.ops.step.astype(np.int64)[p.net_ops],
                             weights=p.op_bytes[p.net_ops], minlength=n_steps).astype(np.float64)
    keys, busy, _ = _step_link_busy(s, p)
    busiest: list[int | None] = [None] * n_steps
    if len(keys):
        steps = keys // n_links
        # keys are sorted step-major: the busiest link of a step is the last of its group
        # after a stable sort by (step, busy)
        order = np.lexsort((-keys, busy, steps))
        last = np.flatnonzero(np.diff(np.append(steps[order], -1)) != 0)
        for i in order[last].tolist():
            busiest[int(steps[i])] = int(keys[i] % n_links)
    return step_bytes, tuple(busiest)


# --------------------------------------------------------------------------------------------
# lockstep


def _lockstep(s: Schedule, p: _Prepared, local: np.ndarray,
              overhead: float = 0.0) -> tuple[np.ndarray, np.ndarray, tuple[int, ...]]:
    n_ops = len(s.ops)
    step = s.ops.step.astype(np.int64)
    _, busy, inverse = _step_link_busy(s, p)
    op_time = local.copy()
    if len(p.net_ops):
        pair_busy = busy[inverse]
        worst = np.maximum.reduceat(pair_busy, p.pair_starts)
        op_time[p.net_ops] = p.route_latency[p.net_ops] + worst
    n_steps = s.n_steps
    step_time = np.zeros(n_steps)
    np.maximum.at(step_time, step, op_time)
    # a step's ops are issued ``overhead`` after the previous barrier
    slot = step_time + overhead
    step_start = np.concatenate([[0.0], np.cumsum(slot)[:-1]]) if n_steps else slot
    start = step_start[step] + overhead if n_ops else np.zeros(0)
    finish = start + op_time
    # the op that sets each step's length (the first of equals), in step order
    path = []
    if n_ops:
        sets = np.flatnonzero(op_time == step_time[step])
        first = np.unique(step[sets], return_index=True)[1]
        path = sets[first].tolist()
    return start, finish, tuple(int(i) for i in path)


# --------------------------------------------------------------------------------------------
# event-driven


def _slot_bases(s: Schedule) -> tuple[list[int], list[int]]:
    """Flat slot numbering: slot of (rank, buf, chunk) = base[buf] + rank * width[buf] + chunk."""
    bases, widths, total = [], [], 0
    for buf in Buf:
        w = s.n_chunks(buf)
        bases.append(total)
        widths.append(w)
        total += s.n * w
    return bases, widths


def _event(s: Schedule, p: _Prepared, local: np.ndarray,
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
    dcount = _dest_counts(s).tolist()

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


def _dest_counts(s: Schedule) -> np.ndarray:
    """Destination chunks each op writes: ``count``, unless the destination buffer is cut
    differently from the source, then every chunk its elements land in."""
    ops = s.ops
    out = ops.count.astype(np.int64)
    elems = s.op_elems()
    for buf in Buf:
        m = np.flatnonzero(ops.dst_buf == buf)
        if not len(m):
            continue
        starts = s.chunk_starts(buf)
        r, off = ops.dst[m].astype(np.int64), ops.dst_off[m].astype(np.int64)
        end = np.minimum(off + out[m], starts.shape[1] - 1)
        odd = np.flatnonzero(starts[r, end] - starts[r, off] != elems[m])
        for i in odd.tolist():
            row = starts[r[i]]
            last = int(np.searchsorted(row, row[off[i]] + elems[m[i]], side="left"))
            out[m[i]] = max(last - int(off[i]), 1)
    return out


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
