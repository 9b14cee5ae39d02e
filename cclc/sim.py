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
each step as one group of sends and receives pays a launch and a synchronization per step),
either on every step or only on the *peer steps*, those with an op between two ranks (a
runtime that synchronizes ranks only where one writes into another pays nothing for a step of
local ops alone: :data:`OVERHEAD_STEPS`), and ``event`` a fixed cost per op (a runtime that
issues each op from its own queue pays an issue cost per op); :mod:`cclc.execution` says which
backend pays which and where the numbers come from. Both are 0 unless asked for.

Both modes report the same per-link bytes and busy time (bytes / bandwidth) and per-step
breakdown; per-op start/finish times and a critical path come with either (lockstep: the op
that sets each step's length; event: the chain of ops and link waits that ends last).

Bandwidths follow nccl-tests: ``algbw = size / time`` with ``size`` the collective's size (see
:class:`cclc.collective.Collective`), ``busbw = algbw * factor`` with factor ``2(n-1)/n`` for
allreduce, ``(n-1)/n`` for allgather, reducescatter and alltoall, ``1`` for broadcast and reduce
(:func:`cclc.nccl_model.bus_factor`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from cclc.errors import ScheduleError
from cclc.ir import Buf, Schedule, format_schedule
from cclc.nccl_model import bus_factor

__all__ = ["OVERHEAD_STEPS", "SIM_MODES", "OverheadSteps", "Prepared", "SimResult",
           "busiest_links", "dest_counts", "prepare", "rank_in_runs", "simulate", "step_charges"]

SIM_MODES = ("lockstep", "event")

#: which lockstep steps pay the per-step software cost: ``"every"`` step, or only the
#: ``"peer"`` steps, those with at least one op between two ranks (``src != dst``)
OverheadSteps = Literal["every", "peer"]
OVERHEAD_STEPS: tuple[OverheadSteps, ...] = ("every", "peer")


def step_charges(step: np.ndarray, remote: np.ndarray, n_steps: int, overhead: float,
                 overhead_steps: OverheadSteps = "every") -> np.ndarray:
    """The software cost (seconds) each of ``n_steps`` lockstep steps pays: ``overhead`` on
    every step, or with ``overhead_steps="peer"`` only on the steps that hold an op with
    ``remote`` true (``step``: the step of every op; ``remote``: whether it runs between two
    ranks), 0 on the others.

    >>> step_charges(np.array([0, 1, 1, 2]), np.array([True, False, False, True]), 3, 2.0,
    ...              "peer").tolist()
    [2.0, 0.0, 2.0]
    """
    if overhead_steps not in OVERHEAD_STEPS:
        raise ScheduleError(f"unknown overhead_steps '{overhead_steps}': use one of "
                            f"{', '.join(OVERHEAD_STEPS)}")
    if overhead_steps == "every":
        return np.full(n_steps, float(overhead))
    peer = np.zeros(n_steps, dtype=bool)
    peer[np.asarray(step, dtype=np.int64)[np.asarray(remote, dtype=bool)]] = True
    return np.where(peer, float(overhead), 0.0)


def _ro(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    a.setflags(write=False)
    return a


def busiest_links(link_busy: np.ndarray, k: int = 5) -> np.ndarray:
    """Ids of the ``k`` links with the most busy time in ``link_busy`` (seconds per link),
    busiest first, ties by id; unused links left out."""
    used = np.flatnonzero(link_busy > 0)
    return used[np.lexsort((used, -link_busy[used]))][:k]


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
        return busiest_links(self.link_busy, k)

    def percent_of(self, bound: float) -> float:
        """``bound / time`` in percent: how close the schedule comes to a lower bound."""
        return 100.0 * bound / self.time if self.time > 0 else float("nan")


# --------------------------------------------------------------------------------------------
# shared preparation


@dataclass(frozen=True)
class Prepared:
    """The (op, link) pairs of every network op, expanded from the CSR routes."""

    op_bytes: np.ndarray      # float64 per op
    route_latency: np.ndarray  # per op, seconds (0 for local ops)
    pair_op: np.ndarray       # per (op, link) pair, grouped by op in op order
    pair_link: np.ndarray
    pair_starts: np.ndarray   # first pair of every networked op (ops with a route), in op order
    net_ops: np.ndarray       # indices of ops with a non-empty route


def prepare(s: Schedule, pair_links: np.ndarray | None = None) -> Prepared:
    """The (op, link) pairs, bytes and route latencies of ``s``'s ops, checked against its
    routes: what the simulator and the dataflow runner both start from. ``pair_links``: the
    links of the pairs in place of the routes' (see :func:`simulate`)."""
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
    if "ranges_checked" not in s._cache:    # (ECMP's pricing prepares the schedule again)
        _check_ranges(s)
        s._cache["ranges_checked"] = True
    lengths = routes.lengths()[route]
    first = np.cumsum(lengths) - lengths           # index of each op's first pair
    if pair_links is None:
        pair_op, pair_link = s.op_links()
    else:
        # (the routes' own links are not read: ECMP's pricing lets them go first)
        pair_op = s.pair_ops()
        if len(pair_links) != len(pair_op) or (len(pair_links) and (
                pair_links.min() < 0 or pair_links.max() >= topo.n_links)):
            raise ScheduleError(f"{len(pair_links)} links given for the {len(pair_op)} "
                                "(op, link) pairs of the schedule's routes, or a link outside "
                                f"0..{topo.n_links - 1}")
        pair_link = pair_links
    # route latency of every op: the sum of its links' latencies (an op's pairs are
    # consecutive and blocks split no op's pairs, so each sum adds in the same order)
    lat = np.zeros(len(ops))
    for lo, hi in _op_blocks(pair_op):
        first_op, end_op = int(pair_op[lo]), int(pair_op[hi - 1]) + 1
        lat[first_op:end_op] = np.bincount(pair_op[lo:hi] - first_op,
                                           weights=topo.link_latency[pair_link[lo:hi]],
                                           minlength=end_op - first_op)
    net_ops = np.flatnonzero(lengths > 0)
    return Prepared(op_bytes=s.op_bytes().astype(np.float64), route_latency=lat,
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


def _local_time(s: Schedule, p: Prepared, local_bandwidth: float | None) -> np.ndarray:
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
             op_overhead: float = 0.0, overhead_steps: OverheadSteps = "every",
             pair_links: np.ndarray | None = None) -> SimResult:
    """Simulate ``schedule`` on its topology; see the module docstring for the cost model.

    ``local_bandwidth`` (B/s) charges local ops (``src == dst``, empty route) for the bytes they
    copy or reduce; by default they are free. ``step_overhead`` (seconds, lockstep) is the
    software cost of issuing a step: each step starts that long after the previous barrier;
    ``overhead_steps`` says which steps pay it (every step, or only the ``"peer"`` steps that
    hold an op between two ranks: :func:`step_charges`).
    ``op_overhead`` (seconds, event) is the software cost of issuing an op: it starts that
    long after its inputs are ready. Both default to 0 (the schedule's own cost);
    :mod:`cclc.execution` gives each backend's values and their sources.
    ``pair_links``: the link of every (op, link) pair of :meth:`~cclc.ir.Schedule.op_links`
    to charge instead of the routes' (each op keeps its route's length: ECMP's spines,
    :func:`cclc.fabric_routing.ecmp_pair_links`, priced without a new route table).

    >>> from cclc.topology import torus                                  # doctest: +SKIP
    >>> r = simulate(sched, mode="event")                                  # doctest: +SKIP
    >>> r.time, r.busbw                                                    # doctest: +SKIP
    """
    if mode not in SIM_MODES:
        raise ScheduleError(f"unknown simulation mode '{mode}': use one of {', '.join(SIM_MODES)}")
    if not (step_overhead >= 0 and op_overhead >= 0):
        raise ScheduleError("software overheads must be >= 0")
    p = prepare(schedule, pair_links)
    local = _local_time(schedule, p, local_bandwidth)
    topo = schedule.topology
    bw = topo.link_bandwidth
    # lockstep and the per-step breakdown share the (step, link) table
    keys, busy, worst, cell_bytes = _step_link_busy(schedule, p)
    # a link's bytes are its cells' (whole bytes: exact in float64 summed in any order)
    link_bytes = np.bincount(keys % topo.n_links, weights=cell_bytes,
                             minlength=topo.n_links).astype(np.float64)
    link_busy = link_bytes / bw
    step = schedule.ops.step.astype(np.int64)
    if mode == "lockstep":
        ops = schedule.ops
        charges = step_charges(ops.step, ops.src != ops.dst, schedule.n_steps, step_overhead,
                               overhead_steps)
        start, finish, path = _lockstep(schedule, p, step, local, charges, worst)
    else:
        start, finish, path = _event(schedule, p, local, op_overhead)
    # what is left needs only the ops' bytes and the (step, link) cells: the per-op arrays
    # of the run let go (a 4,096-GPU alltoall: 0.1 GB each, and this is the compile's peak)
    op_bytes, net_ops = p.op_bytes, p.net_ops
    del p, local, worst

    n_steps = schedule.n_steps
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
    step_bytes = np.bincount(step[net_ops], weights=op_bytes[net_ops],
                             minlength=n_steps).astype(np.float64)
    del step, op_bytes, net_ops
    busiest = _busiest_of_steps(topo.n_links, n_steps, keys, busy)
    total = float(finish.max()) if len(finish) else 0.0
    coll = schedule.collective
    algbw = coll.size / total if total > 0 else float("inf")
    return SimResult(mode=mode, time=total, size=coll.size, algbw=algbw,
                     busbw=algbw * bus_factor(coll.kind, coll.n),
                     link_bytes=_ro(link_bytes), link_busy=_ro(link_busy),
                     step_start=_ro(step_start), step_time=_ro(step_time),
                     step_bytes=_ro(step_bytes), step_busiest_link=busiest,
                     op_start=_ro(start), op_finish=_ro(finish), critical_path=path)


#: most (step, link) cells counted in a dense table; beyond it the used cells are sorted
_DENSE_CELLS = 1 << 25

#: ops whose ties a pass looks for at once (:func:`_lockstep`)
_OP_BLOCK = 1 << 21

#: (op, link) pairs whose values a pass gathers at once: a 4,096-GPU alltoall has 130M,
#: whose gathered bytes or latencies would each take 1 GB of fresh memory
_PAIR_BLOCK = 1 << 24


def _op_blocks(pair_op: np.ndarray) -> list[tuple[int, int]]:
    """``[lo, hi)`` blocks of about :data:`_PAIR_BLOCK` pairs, none splitting an op's pairs
    (``pair_op`` is grouped by op)."""
    n = len(pair_op)
    cuts = [0]
    while n - cuts[-1] > _PAIR_BLOCK:
        op = pair_op[cuts[-1] + _PAIR_BLOCK]
        # at the first pair of the op the block ends in, or after it if that op is the block
        cut = int(np.searchsorted(pair_op, op, side="left"))
        cuts.append(cut if cut > cuts[-1] else int(np.searchsorted(pair_op, op, side="right")))
    if cuts[-1] < n:
        cuts.append(n)
    return list(zip(cuts[:-1], cuts[1:], strict=False))


def _step_link_busy(s: Schedule, p: Prepared
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Busy time of every used (step, link) pair: sorted keys, their busy time, the busiest
    cell of each networked op (``p.net_ops``) among its pairs' cells, and the cells' bytes."""
    n_links = s.topology.n_links
    bw = s.topology.link_bandwidth
    # (one step: the key is the link; at 4,096 GPUs each pass over the 130M pairs is seconds)
    key = (p.pair_link if s.n_steps <= 1
           else s.ops.step.astype(np.int64)[p.pair_op] * n_links + p.pair_link)
    n_cells = s.n_steps * n_links
    if 0 < n_cells <= _DENSE_CELLS:
        # a table over every (step, link) cell: counting instead of sorting, same sums (whole
        # bytes: exact in float64 in any order, so the pairs' bytes are gathered a block at a
        # time where the table is small beside a block)
        # (counted a block at a time too: numpy counts 64-bit ids, and a one-step key is the
        # pairs' 32-bit links, a gigabyte widened at once)
        blocks = (_op_blocks(p.pair_op) if n_cells <= _PAIR_BLOCK // 8
                  else [(0, len(key))])
        count = np.zeros(n_cells, dtype=np.int64)
        for lo, hi in blocks:
            count += np.bincount(key[lo:hi], minlength=n_cells)
        keys = np.flatnonzero(count)
        net_bytes = p.op_bytes[p.net_ops]
        if len(net_bytes) and net_bytes.min() == net_bytes.max():
            # every networked op moves the same bytes (an alltoall's blocks): a cell's bytes
            # are its count of pairs times them, exact as the sum is, with no pass over the
            # pairs' bytes
            dense = count * net_bytes[0]
        else:
            dense = np.zeros(n_cells)
            for lo, hi in blocks:
                dense += np.bincount(key[lo:hi], weights=p.op_bytes[p.pair_op[lo:hi]],
                                     minlength=n_cells)
        del count
        cell_bytes = dense[keys]
        busy = cell_bytes / bw[keys % n_links]
        dense[keys] = busy                      # now every used cell's busy time
        return keys, busy, _busiest_cell(p, key, dense), cell_bytes
    keys, inverse = np.unique(key, return_inverse=True)
    inverse = inverse.reshape(-1)
    # (bincount of nothing is int64: cast, an empty schedule is still a schedule)
    cell_bytes = np.bincount(inverse, weights=p.op_bytes[p.pair_op],
                             minlength=len(keys)).astype(np.float64)
    busy = cell_bytes / bw[keys % n_links]
    return keys, busy, _busiest_cell(p, inverse, busy), cell_bytes


def _busiest_cell(p: Prepared, cell_of_pair: np.ndarray, cell_busy: np.ndarray) -> np.ndarray:
    """The busiest of every networked op's pairs' cells, a block of whole ops at a time (a
    maximum is the same in any grouping; the busy time of every pair of a 4,096-GPU alltoall
    at once would be 1 GB)."""
    worst = np.empty(len(p.pair_starts))
    for lo, hi in _op_blocks(p.pair_op):
        # every pair belongs to a networked op, so the block starts at one's first pair
        a, b = np.searchsorted(p.pair_starts, [lo, hi])
        worst[a:b] = np.maximum.reduceat(cell_busy[cell_of_pair[lo:hi]], p.pair_starts[a:b] - lo)
    return worst


def _busiest_of_steps(n_links: int, n_steps: int, keys: np.ndarray, busy: np.ndarray
                      ) -> tuple[int | None, ...]:
    """The busiest link of every step (``None`` for a step without network traffic), from the
    used (step, link) cells' sorted keys and busy times."""
    busiest: list[int | None] = [None] * n_steps
    if len(keys):
        steps = keys // n_links
        # keys are sorted step-major: the busiest link of a step is the last of its group
        # after a stable sort by (step, busy)
        order = np.lexsort((-keys, busy, steps))
        last = np.flatnonzero(np.diff(np.append(steps[order], -1)) != 0)
        for i in order[last].tolist():
            busiest[int(steps[i])] = int(keys[i] % n_links)
    return tuple(busiest)


# --------------------------------------------------------------------------------------------
# lockstep


def _lockstep(s: Schedule, p: Prepared, step: np.ndarray, local: np.ndarray,
              overhead: np.ndarray, worst: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray, tuple[int, ...]]:
    """Start and finish of every op, and the op that sets each step (``step``: every op's, as
    int64); ``overhead``: the software cost of every step (:func:`step_charges`); ``worst``:
    the busiest cell of every networked op (:func:`_step_link_busy`). ``local`` becomes the
    ops' times (the caller's last use of it: a copy was 0.1 GB at 4,096 GPUs, at the
    compile's peak)."""
    n_ops = len(s.ops)
    op_time = local
    if len(p.net_ops):
        op_time[p.net_ops] = p.route_latency[p.net_ops] + worst
    n_steps = s.n_steps
    step_time = np.zeros(n_steps)
    np.maximum.at(step_time, step, op_time)
    # a step's ops are issued its ``overhead`` after the previous barrier
    slot = step_time + overhead
    step_start = np.concatenate([[0.0], np.cumsum(slot)[:-1]]) if n_steps else slot
    start = step_start[step] + overhead[step] if n_ops else np.zeros(0)
    finish = start + op_time
    # the op that sets each step's length (the first of equals), in step order
    path = []
    if n_ops:
        # the first of each step's (ops in op order): the least index, with no sort of the
        # ties, a block of ops at a time (every op of a one-step alltoall ties: 16.7M at 4,096
        # GPUs, where this was the compile's peak)
        first = np.full(n_steps, n_ops, dtype=np.int64)
        for lo in range(0, n_ops, _OP_BLOCK):
            at = step[lo:lo + _OP_BLOCK]
            sets = np.flatnonzero(op_time[lo:lo + _OP_BLOCK] == step_time[at])
            np.minimum.at(first, at[sets], sets + lo)
        path = first[first < n_ops].tolist()
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


def _event(s: Schedule, p: Prepared, local: np.ndarray,
           overhead: float = 0.0) -> tuple[np.ndarray, np.ndarray, tuple[int, ...]]:
    """The ops in step order, one step at a time, each step columnar: linear in ops + slots.

    Per slot it keeps the last writer (op, finish time) and the latest-finishing reader since
    that write; per link the op it served last and when that ended. Ops of a step only see the
    slot state of earlier steps, so a step's updates are applied after the whole step. Inside
    a step the links serve their (op, link) pairs first come, first served in op order: round
    ``q`` serves the ``q``-th pair of every link at once, with exactly the arithmetic of a
    one-op-at-a-time loop (the same maxima and sums in the same order), so the times are the
    same to the last bit.
    """
    ops = s.ops
    n_ops = len(ops)
    bases, widths = _slot_bases(s)
    n_slots = bases[-1] + s.n * widths[-1]
    write_t = np.zeros(n_slots)                   # finish of the last writer
    write_op = np.full(n_slots, -1, dtype=np.int64)   # internal: -1 = no writer yet
    read_t = np.zeros(n_slots)                    # latest finish of a reader since the write
    read_op = np.full(n_slots, -1, dtype=np.int64)
    n_links = s.topology.n_links
    link_free = np.zeros(n_links)
    link_last = np.full(n_links, -1, dtype=np.int64)
    bw = s.topology.link_bandwidth.astype(np.float64)

    base = np.asarray(bases, dtype=np.int64)
    width = np.asarray(widths, dtype=np.int64)
    count = ops.count.astype(np.int64)
    dcount = dest_counts(s)
    read0 = base[ops.src_buf] + ops.src.astype(np.int64) * width[ops.src_buf] + ops.src_off
    write0 = base[ops.dst_buf] + ops.dst.astype(np.int64) * width[ops.dst_buf] + ops.dst_off
    n_pairs = np.bincount(p.pair_op, minlength=n_ops)
    pair_first = np.cumsum(n_pairs) - n_pairs

    start = np.zeros(n_ops)
    finish = np.zeros(n_ops)
    pred = np.full(n_ops, -1, dtype=np.int64)      # the op this one waited for last
    local_of = np.empty(n_ops, dtype=np.int64)    # an op's index within its step
    order = np.argsort(ops.step, kind="stable")
    steps = ops.step[order]
    cuts = np.flatnonzero(np.diff(steps)) + 1
    for group in np.split(order, cuts) if n_ops else []:
        g = group
        # -- ready: the latest of the slot state it depends on, first such op on a tie -----
        rd_op, rd_slot = _expand(g, read0[g], count[g])
        wr_op, wr_slot = _expand(g, write0[g], dcount[g])
        local_of[g] = np.arange(len(g))
        ready, why = _ready(len(g), rd_op, rd_slot, wr_op, wr_slot, count, local_of, write_t,
                            write_op, read_t, read_op)
        ready = ready + overhead

        # -- links: every link serves its pairs in op order, all links at once per round --
        n_p = n_pairs[g]
        local_ops = np.flatnonzero(n_p == 0)
        o_loc = g[local_ops]
        start[o_loc] = ready[local_ops]
        finish[o_loc] = ready[local_ops] + local[o_loc]
        pred[o_loc] = why[local_ops]
        if not n_p.any():
            _settle(g, finish, rd_op, rd_slot, wr_op, wr_slot, write_t, write_op, read_t,
                    read_op)
            continue
        pr_local = np.repeat(np.arange(len(g)), n_p)
        pr = np.repeat(pair_first[g], n_p) + rank_in_runs(pr_local)
        pr_link = p.pair_link[pr]
        # per link, its pairs in op order (then route order): round q serves the q-th
        by_link = np.lexsort((np.arange(len(pr)), pr_link))
        links_sorted = pr_link[by_link]
        q_of = rank_in_runs(links_sorted)
        begin = np.empty(len(pr))
        end = np.empty(len(pr))
        by = np.empty(len(pr), dtype=np.int64)
        nbytes = p.op_bytes[g[pr_local]]
        rounds = np.argsort(q_of, kind="stable")
        round_cuts = np.flatnonzero(np.diff(q_of[rounds])) + 1
        for idx in np.split(by_link[rounds], round_cuts):
            ln = pr_link[idx]
            r = ready[pr_local[idx]]
            busy = link_free[ln] > r
            begin[idx] = np.where(busy, link_free[ln], r)
            by[idx] = np.where(busy, link_last[ln], why[pr_local[idx]])
            end[idx] = begin[idx] + nbytes[idx] / bw[ln]
            link_free[ln] = end[idx]
            link_last[ln] = g[pr_local[idx]]
        net = np.flatnonzero(n_p > 0)
        first_pair = np.cumsum(n_p) - n_p
        op_start = np.minimum.reduceat(begin, first_pair[net])
        last_end = np.maximum.reduceat(end, first_pair[net])
        # the loop keeps the first link (route order) whose end is the latest
        hit = np.flatnonzero(end == last_end[np.searchsorted(net, pr_local)])
        first_hit = hit[np.r_[True, np.diff(pr_local[hit]) != 0]]
        o_net = g[net]
        start[o_net] = op_start
        finish[o_net] = last_end + p.route_latency[o_net]
        pred[o_net] = by[first_hit]
        _settle(g, finish, rd_op, rd_slot, wr_op, wr_slot, write_t, write_op, read_t, read_op)
    return start, finish, _critical_path(finish, pred)


def _critical_path(finish: np.ndarray, pred: np.ndarray) -> tuple[int, ...]:
    """The ops the last one to finish waited for, back to one that waited for nothing."""
    path: list[int] = []
    if len(finish):
        o = int(np.argmax(finish))
        while o >= 0:
            path.append(o)
            o = int(pred[o])
        path.reverse()
    return tuple(path)


def _ready(n: int, rd_op: np.ndarray, rd_slot: np.ndarray, wr_op: np.ndarray,
           wr_slot: np.ndarray, count: np.ndarray, local_of: np.ndarray, write_t: np.ndarray,
           write_op: np.ndarray, read_t: np.ndarray, read_op: np.ndarray
           ) -> tuple[np.ndarray, np.ndarray]:
    """For the ``n`` ops of one step (``local_of`` numbers them): when each is ready, the
    latest finish of the slot state it depends on (the writers of the slots it reads, the
    writer and readers of the slots it writes), and the op it waited for (-1: none; on a tie
    the first in the one-op-at-a-time loop's order)."""
    # candidates in the loop's order per op: each read slot's writer, then each written
    # slot's writer and its readers
    cand_op = np.concatenate([rd_op, np.repeat(wr_op, 2)])
    cand_seq = np.concatenate([rank_in_runs(rd_op), count[np.repeat(wr_op, 2)]
                               + 2 * np.repeat(rank_in_runs(wr_op), 2)
                               + np.tile([0, 1], len(wr_op))])
    ws2 = np.repeat(wr_slot, 2)
    is_rt = np.tile([False, True], len(wr_op))
    cand_t = np.concatenate([write_t[rd_slot], np.where(is_rt, read_t[ws2], write_t[ws2])])
    cand_who = np.concatenate([write_op[rd_slot],
                               np.where(is_rt, read_op[ws2], write_op[ws2])])
    ready = np.zeros(n)
    why = np.full(n, -1, dtype=np.int64)
    if len(cand_op):
        li = local_of[cand_op]
        np.maximum.at(ready, li, cand_t)
        top = np.flatnonzero((cand_t == ready[li]) & (cand_t > 0))
        if len(top):
            first = np.lexsort((cand_seq[top], li[top]))
            keep = top[first][np.r_[True, np.diff(li[top][first]) != 0]]
            why[li[keep]] = cand_who[keep]
    return ready, why


def _expand(op: np.ndarray, first: np.ndarray, count: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray]:
    """(op, slot) for the slots ``first .. first + count - 1`` of every op, in op order."""
    slots = np.repeat(first - np.cumsum(count) + count, count) + np.arange(int(count.sum()))
    return np.repeat(op, count), slots


def rank_in_runs(keys: np.ndarray) -> np.ndarray:
    """Position of every element within its run of equal consecutive keys."""
    if not len(keys):
        return np.zeros(0, dtype=np.int64)
    new = np.r_[True, keys[1:] != keys[:-1]]
    starts = np.flatnonzero(new)
    return np.arange(len(keys)) - np.repeat(starts, np.diff(np.r_[starts, len(keys)]))


def _settle(g, finish, rd_op, rd_slot, wr_op, wr_slot, write_t, write_op, read_t,
            read_op) -> None:
    """Record a finished step's reads, then its writes (a write resets the slot's readers),
    as the loop does op by op: the first reader with the latest finish, the last writer."""
    if len(rd_slot):
        t = finish[rd_op]
        order = np.lexsort((np.arange(len(rd_slot)), -t, rd_slot))   # slot, latest, first
        sl = rd_slot[order]
        lead = order[np.r_[True, sl[1:] != sl[:-1]]]
        better = t[lead] > read_t[rd_slot[lead]]
        read_t[rd_slot[lead[better]]] = t[lead[better]]
        read_op[rd_slot[lead[better]]] = rd_op[lead[better]]
    if len(wr_slot):
        # the last writer of a slot in the step wins
        rev = np.arange(len(wr_slot))[::-1]
        _, last = np.unique(wr_slot[rev], return_index=True)
        w = rev[last]
        write_t[wr_slot[w]] = finish[wr_op[w]]
        write_op[wr_slot[w]] = wr_op[w]
        read_t[wr_slot[w]] = 0.0
        read_op[wr_slot[w]] = -1


def dest_counts(s: Schedule) -> np.ndarray:
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
