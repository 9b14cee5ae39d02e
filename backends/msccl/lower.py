"""Lowering a schedule (in equal units) to MSCCL threadblocks, steps and dependencies.

The IR is lock-step: ops of one step run together and read the previous step's state. MSCCL
is data-flow: every threadblock (tb) runs its own step list in order, sends and receives pair
up in FIFO order per (sender, receiver, channel), and a step can wait for one step of another
tb of its GPU. The lowering, in order:

1. ``relocate_input``: if the schedule writes its input buffer, copy the input into extra
   scratch first (the user's ``sendbuff`` is const) and read it from there.
2. ``fuse``: a receive whose data is the next thing sent from that slot becomes one fused
   instruction (``rcs``; ``rrcs``/``rrs`` after a reduction), forming chains A->x->B->... that
   move together. Only when it cannot change what anyone reads (see ``fuse``).
3. ``assign_channels``: every message of a chain shares a channel; concurrent messages on one
   pair get distinct channels (parallel tbs), within the limit; a GPU keeps at most 32 send
   peers and 32 receive peers on one channel (the loaders' per-channel arrays), so peers are
   spread over channels by their offset.
4. ``threadblocks``: one tb per (send peer, recv peer, channel) on each GPU (fused steps tie a
   recv peer to a send peer; otherwise a send stream and a receive stream of one channel are
   paired into one tb, as msccl-tools does); local copies and reductions get their own tb.
5. ``instructions`` and ``global_order``: a graph of every instruction with edges for
   messages (send before receive), FIFO capacity (a connection's next send after its previous
   receive) and data hazards on each unit (RAW, WAR, WAW in the IR's step order). A
   topological order of it, ties broken by IR step, is every tb's program order. Because the
   same global order serves all tbs and every wait points backwards in it, the smallest
   unfinished instruction can always run: no deadlock, even with one message of buffering
   per connection.
6. ``dependencies``: hazards between tbs of one GPU become ``depid``/``deps``; waits already
   implied by an earlier wait of the same tb are dropped; more than one left becomes ``nop``s.
   The runtimes keep ``depid`` in an int8, so the tbs waited on get the smallest ids.
7. ``_check_limits``: every loader limit of :mod:`backends.msccl.runtimes`, counted on the
   result (threadblocks, steps, per-channel peers, XML nodes per rank, depids).
"""

from __future__ import annotations

import gc
import heapq
from collections import defaultdict, deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import pairwise
from typing import NamedTuple

import numpy as np

from backends.msccl.runtimes import Runtime
from backends.units import UnitFacts, UnitsTooLong, buffer_units, rank_units, to_units, writes_input
from cclc.errors import ScheduleError
from cclc.ir import Buf, OpKind, Schedule

__all__ = ["Channels", "DepidLimitError", "Instr", "LimitError", "Lowered", "Op", "Program",
           "Threadblock", "ThreadblockLimitError", "assign_channels", "check_chunks",
           "chunks_limit_message",
           "dependencies", "fuse", "global_order", "instructions", "lower", "lower_to_fit",
           "relocate_input", "threadblocks"]


class LimitError(ScheduleError):
    """The schedule does not fit a limit of the runtime (the message names it).
    ``channels``: how many channels the lowering that failed could use (None: not known)."""

    channels: int | None = None


class ThreadblockLimitError(LimitError):
    """A GPU needs ``needed`` threadblocks, more than the runtime allows."""

    def __init__(self, message: str, needed: int):
        super().__init__(message)
        self.needed = needed


class StepLimitError(LimitError):
    """A threadblock needs more steps than the runtime allows; ``local``: it is one of the
    threadblocks of local copies and reductions (no peer)."""

    def __init__(self, message: str, local: bool):
        super().__init__(message)
        self.local = local


class DepidLimitError(ThreadblockLimitError):
    """Steps of a GPU (with ``needed`` threadblocks) wait on more threadblocks than an int8
    ``depid`` can name."""


class Op(NamedTuple):
    """An op in units after input relocation; ``ir`` is its row in the schedule (None for
    the copies that relocate the input, which run at step -1, before the schedule). A named
    tuple, not a frozen dataclass: there is one per op, and a tuple is cheaper to build."""

    ir: int | None
    step: int
    src: int
    dst: int
    kind: OpKind
    sb: Buf
    so: int
    db: Buf
    do: int
    cnt: int


@dataclass(slots=True)
class Instr:
    """One MSCCL step before numbering; ``key`` orders ties in the topological sort."""

    rank: int
    type: str
    sb: Buf
    so: int | None               # None: a nop, which names no data
    db: Buf
    do: int | None
    cnt: int
    key: tuple
    send: int | None = None      # send peer it needs (its tb's)
    recv: int | None = None      # recv peer it needs
    chan: int = 0
    tb: int | None = None        # set by stage 4
    pos: int | None = None       # index in the global order (stage 5)
    index: int | None = None     # step index in its tb (final after stage 6)
    depid: int | None = None     # the tb it waits on, and that tb's step (stage 6)
    deps: int | None = None
    hasdep: bool = False
    uid: int | None = None       # index in the list of all instructions


@dataclass(slots=True)
class Threadblock:
    """One MSCCL threadblock of a GPU: its peers (None: it sends, or receives, nothing),
    channel and steps. Stages 4 and 6 build it up; :class:`Lowered` hands it out."""

    id: int
    send: int | None
    recv: int | None
    chan: int
    steps: list[Instr] = field(default_factory=list)


@dataclass(frozen=True, eq=False)
class Lowered:
    """The lowered program: per GPU its tbs (ids dense from 0) and buffer sizes in units."""

    tbs: tuple[tuple[Threadblock, ...], ...]
    units: tuple[int, int, int]
    scratch: tuple[int, ...]     # s_chunks of each GPU
    nchannels: int
    n_fused: int


def relocate_input(units: Schedule, max_cnt: int
                   ) -> tuple[list[Op], tuple[int, int, int], tuple[int, ...]]:
    """The ops in units, none longer than ``max_cnt`` (longer ones are cut into consecutive
    pieces, as the runtime itself cuts a step's ``cnt`` by its maximum); the buffer sizes and
    each GPU's scratch. If the input is ever written, it moves to scratch behind the largest
    scratch, filled by local copies before step 0 (the user's ``sendbuff`` is const)."""
    n_in, n_out, n_scr = sizes = buffer_units(units)
    o = units.ops
    cols = zip(o.step.tolist(), o.src.tolist(), o.dst.tolist(), o.kind.tolist(),
               o.src_buf.tolist(), o.src_off.tolist(), o.dst_buf.tolist(), o.dst_off.tolist(),
               o.count.tolist(), strict=True)
    moved = writes_input(units)

    bufs, kinds = tuple(Buf), tuple(OpKind)

    def at(buf: int, off: int) -> tuple[Buf, int]:
        # the relocated input lies in scratch, behind the largest scratch
        return (Buf.SCRATCH, off + n_scr) if moved and buf == Buf.INPUT else (bufs[buf], off)

    ops = []
    for i, (step, src, dst, kind, sb, so, db, do, total) in enumerate(cols):
        if total <= max_cnt and not moved:          # the common case, without the cutting
            ops.append(Op(i, step, src, dst, kinds[kind], bufs[sb], so, bufs[db], do, total))
            continue
        for lo in range(0, total, max_cnt):
            ops.append(Op(i, step, src, dst, kinds[kind], *at(sb, so + lo), *at(db, do + lo),
                          min(max_cnt, total - lo)))
    if not moved:
        return ops, sizes, rank_units(units, Buf.SCRATCH)
    first = [Op(None, -1, r, r, OpKind.COPY, Buf.INPUT, lo, Buf.SCRATCH, n_scr + lo,
                min(max_cnt, n_in - lo))
             for r in range(units.n) for lo in range(0, n_in, max_cnt)]
    return first + ops, (n_in, n_out, n_scr + n_in), (n_scr + n_in,) * units.n


class _Accesses:
    """Every (op, unit) read and write, sorted by (rank, buffer, unit, step, write, op), for
    the fusion checks: ``seg`` maps a unit's slot to its rows, which a check scans in step
    order (a unit has few accesses)."""

    def __init__(self, ops: list[Op]):
        cols = np.array([(op.step, op.src, op.sb, op.so, op.dst, op.db, op.do, op.cnt,
                          op.kind is OpKind.REDUCE) for op in ops],
                        dtype=np.int64).reshape(-1, 9)
        step, src, sb, so, dst, db, do, cnt, red = cols.T
        k = np.arange(len(ops))
        # rows: the reads of every op's source, the writes of its destination, and the reads
        # of a reduction's destination
        rr = np.flatnonzero(red)
        rank = np.concatenate([src, dst, dst[rr]])
        buf = np.concatenate([sb, db, db[rr]])
        lo = np.concatenate([so, do, do[rr]])
        length = np.concatenate([cnt, cnt, cnt[rr]])
        write = np.concatenate([np.zeros(len(ops), bool), np.ones(len(ops), bool),
                                np.zeros(len(rr), bool)])
        who = np.concatenate([k, k, rr])
        row = np.repeat(np.arange(len(rank)), length)
        unit = lo[row] + (np.arange(len(row)) - np.repeat(np.cumsum(length) - length, length))
        self.n_units = int(unit.max()) + 1 if len(unit) else 1
        slot = (rank[row] * 3 + buf[row]) * self.n_units + unit
        order = np.lexsort((who[row], write[row], step[who[row]], slot))
        slot = slot[order]
        self.step: list[int] = step[who[row]][order].tolist()
        self.write: list[bool] = write[row][order].tolist()
        self.op: list[int] = who[row][order].tolist()
        cut = np.flatnonzero(np.concatenate([[True], slot[1:] != slot[:-1], [True]])).tolist()
        self.seg = dict(zip(slot[cut[:-1]].tolist(), pairwise(cut), strict=False))

    def clash(self, rank: int, buf: Buf, lo: int, hi: int, t0: int, t1: int,
              skip: tuple[int, ...], writes_only: bool = False, reads_only: bool = False
              ) -> bool:
        """Does an op other than ``skip`` touch [lo, hi) in steps t0..t1 (only writes if
        ``writes_only``, only reads if ``reads_only``)?"""
        step, write, op, seg = self.step, self.write, self.op, self.seg
        base = (rank * 3 + buf) * self.n_units
        for u in range(lo, hi):
            rows = seg.get(base + u)
            if rows is None:
                continue
            for i in range(*rows):
                if step[i] < t0:
                    continue
                if step[i] > t1:
                    break
                if (op[i] not in skip and (write[i] or not writes_only)
                        and not (write[i] and reads_only)):
                    return True
        return False


def fuse(ops: list[Op], acc: _Accesses | None = None) -> dict[int, int]:
    """Stage 2: fused hops, ``nxt[m1] = m2`` when message m2 forwards what m1 delivered (see
    the module docstring); ``acc``: the ops' accesses, if already indexed."""
    if acc is None:
        acc = _Accesses(ops)
    senders: dict[tuple, list[int]] = defaultdict(list)
    for k, op in enumerate(ops):
        if op.src != op.dst:
            senders[(op.src, op.sb, op.so, op.cnt)].append(k)
    nxt: dict[int, int] = {}
    prev: dict[int, int] = {}
    head_time: dict[int, int] = {}
    visited: dict[int, set[int]] = {}
    for k in sorted(range(len(ops)), key=lambda k: (ops[k].step, k)):
        m1 = ops[k]
        if m1.src == m1.dst:
            continue
        if k not in prev:
            head_time[k] = m1.step
            visited[k] = {m1.src, m1.dst}
        t0 = head_time[k]
        for k2 in senders.get((m1.dst, m1.db, m1.do, m1.cnt), ()):
            m2 = ops[k2]
            if m2.step <= m1.step or k2 in prev:
                continue
            if m2.dst in visited[k]:
                break
            x, b = m1.dst, m2.dst
            lo, hi = m1.do, m1.do + m1.cnt
            # at x: nothing else writes the slot until the forward, nobody reads the old value
            # after the (possibly moved) receive
            if acc.clash(x, m1.db, lo, hi, t0, m2.step, (k, k2), writes_only=True):
                break
            if t0 < m1.step and acc.clash(x, m1.db, lo, hi, t0, m1.step, (k, k2)):
                break
            # at the next receiver: nobody touches the slot in the window its write moves over
            if acc.clash(b, m2.db, m2.do, m2.do + m2.cnt, t0, m2.step, (k2,)):
                break
            nxt[k], prev[k2] = k2, k
            head_time[k2] = t0
            visited[k2] = visited[k] | {b}
            break
    return nxt


def _dead_after(acc: _Accesses, op: Op, skip: tuple[int, ...]) -> bool:
    """A reduced value that is only forwarded (``rrs``: no local write): the slot is scratch
    (nobody looks at it in the end) and no later step reads it, so its stale value is never
    seen; reads in the reduction's own step see the old value in the IR too."""
    return op.db is Buf.SCRATCH and not acc.clash(op.dst, op.db, op.do, op.do + op.cnt,
                                                  op.step + 1, 1 << 30, skip, reads_only=True)


def check_chunks(schedule: Schedule, units: Schedule, facts: UnitFacts, rt: Runtime) -> None:
    """:class:`LimitError` when ``units`` (``schedule`` in units) has more chunks per buffer
    than ``rt`` can address; checked before anything proportional to the chunk count."""
    n_in, n_out, n_scr = buffer_units(units)
    nchunks = max(n_in, n_out, n_scr + (n_in if writes_input(units) else 0))
    if nchunks > rt.max_chunks:
        sizes = sorted({int(x) for b in Buf for x in np.unique(schedule.chunk_elems(b))
                        if x > 0})
        shown = ", ".join(map(str, sizes[:6])) + (", ..." if len(sizes) > 6 else "")
        raise LimitError(f"MSCCL needs equal chunks: the gcd of this schedule's chunk sizes "
                         f"({shown} elements) and its count is {facts.unit} element(s), which "
                         f"makes {nchunks} chunks per buffer, more than {rt.title} can "
                         f"address ({rt.max_chunks}, {rt.limit('offset').cite()}); choose "
                         "chunk counts that divide the buffer evenly, or fewer chunks")


@contextmanager
def _without_cyclic_gc() -> Iterator[None]:
    """The lowering builds millions of small objects (ops, instructions, keys) that live
    until it returns and form no reference cycles; the cyclic garbage collector would walk
    all of them again at every full collection (a sixth of the lowering's time at 260k ops).
    It is paused meanwhile and resumed as it was; reference counting still frees memory."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


#: shares of the step limit that a GPU's local threadblocks are filled to, tried in order
LOCAL_SHARES = (0.75, 0.5, 0.25)


def lower_to_fit(schedule: Schedule, rt: Runtime, *, fuse: bool = True,
                 nchannels: int | None = None) -> tuple[Lowered, Schedule, UnitFacts]:
    """``schedule`` in units (:func:`backends.units.to_units`) and its first lowering that
    fits every limit of ``rt``; :class:`LimitError` (the first attempt's) when none does."""
    with _without_cyclic_gc():
        return _lower_to_fit(schedule, rt, fuse, nchannels)


def counted_refusal(schedule: Schedule, rt: Runtime) -> str | None:
    """Why lowering ``schedule`` for ``rt`` would fail on a limit that counting shows (the
    chunks per buffer, a GPU's local steps, peers, <step> nodes, one pair's messages), or
    None; the schedule in units is built, nothing is lowered. Limits found only while lowering
    (threadblock waits) are not seen."""
    try:
        units, facts = to_units(schedule, rt.max_chunks)
        check_chunks(schedule, units, facts, rt)
        _quick_limits(units, rt)
    except UnitsTooLong as err:
        return chunks_limit_message(err.message, rt)
    except LimitError as err:
        return err.message
    return None


def chunks_limit_message(message: str, rt: Runtime) -> str:
    """A message about too many equal chunks, with the limit's source: the largest chunk
    offset the runtime's loader stores."""
    return f"{message} ({rt.limit('offset').cite()})"


def _lower_to_fit(schedule: Schedule, rt: Runtime, fuse: bool, nchannels: int | None
                  ) -> tuple[Lowered, Schedule, UnitFacts]:
    try:
        units, facts = to_units(schedule, rt.max_chunks)
    except UnitsTooLong as err:
        raise LimitError(chunks_limit_message(err.message, rt)) from None
    check_chunks(schedule, units, facts, rt)
    first: LimitError | None = None
    # the local tbs are filled to a share of the step limit, leaving room for the nops of
    # their waits on other tbs; when the nops still overflow one, fill them less
    for share in LOCAL_SHARES:
        try:
            return _lower_forms(units, facts, rt, fuse, nchannels, share)
        except StepLimitError as err:
            first = first or err
            if not err.local:
                break
        except LimitError as err:
            first = first or err
            break
    assert first is not None
    raise first from None


def _lower_forms(units: Schedule, facts: UnitFacts, rt: Runtime, fuse: bool,
                 nchannels: int | None, local_share: float
                 ) -> tuple[Lowered, Schedule, UnitFacts]:
    """The first of the looser forms (fusion, paired streams, fewer channels) that fits."""
    # fused steps tie threadblocks together, and paired send/receive streams make longer
    # ones (nops included); if a limit is exceeded, looser forms may spread out enough to fit
    tries = [(fuse, True), (fuse, False)]
    if fuse:
        tries += [(False, True), (False, False)]
    first: LimitError | None = None
    last: LimitError | None = None
    for fuse_ops, pair in tries:
        if not pair and (last is None or "steps" not in last.message):
            continue        # unpaired streams only help a threadblock that is too long
        # too many threadblocks, or a GPU whose steps wait on more than 128 of them (the
        # int8 depid): lower the same form again with fewer channels, so fewer threadblocks
        channels = nchannels
        for _ in range(4):
            try:
                low = lower(units, rt, fuse_ops=fuse_ops, nchannels=channels, pair=pair,
                            local_share=local_share)
                return low, units, facts
            except LimitError as err:
                first, last = first or err, err
                channels = _fewer_channels(err, rt)
                if channels is None:
                    break
    assert first is not None
    raise first from None


def _fewer_channels(err: LimitError, rt: Runtime) -> int | None:
    """Channels to lower with after ``err`` so that fewer threadblocks are needed (None: fewer
    channels cannot help)."""
    if not isinstance(err, ThreadblockLimitError) or err.channels is None:
        return None
    target = rt.max_depid + 1 if isinstance(err, DepidLimitError) else rt.max_tbs
    fewer = min(err.channels - 1, err.channels * target // err.needed)
    return fewer if fewer >= 1 else None


def lower(us: Schedule, rt: Runtime, *, fuse_ops: bool = True,
          nchannels: int | None = None, pair: bool = True,
          local_share: float = LOCAL_SHARES[0]) -> Lowered:
    """Lower ``us`` (a schedule in units, see :func:`backends.units.to_units`) for runtime
    ``rt``; :class:`ScheduleError` when a limit is exceeded. ``pair``: share tbs between
    send-only and receive-only streams (see ``_pair_streams``); ``local_share``: the share of
    the step limit a local threadblock is filled to (see ``threadblocks``). The stages of the module
    docstring, in order, except that the threadblocks (4) take their steps in the global
    order (5)."""
    _quick_limits(us, rt)
    ops, units, scratch = relocate_input(us, rt.max_cnt)
    acc = _Accesses(ops) if fuse_ops else None
    nxt = fuse(ops, acc) if acc is not None else {}
    channels = assign_channels(ops, _chains(ops, nxt), rt, nchannels, us.n)
    program = instructions(ops, channels, acc if nxt else None)
    order = global_order(program)
    tbs = threadblocks(program, order, rt, us.n, pair, local_share)
    dependencies(tbs, program)
    _renumber_for_depids(tbs, rt)
    try:
        _check_limits(tbs, rt, us.n)
    except LimitError as err:
        err.channels = channels.limit
        raise
    chans = {tb.chan for rank_tbs in tbs for tb in rank_tbs}
    return Lowered(tuple(tuple(t) for t in tbs), units, scratch,
                   max(chans) + 1 if chans else 1, program.n_fused)


def _chains(ops: list[Op], nxt: dict[int, int]) -> list[tuple[int, ...]]:
    """Chains of fused messages in IR order (a lone message is a chain of one hop)."""
    heads = set(range(len(ops))) - set(nxt.values())
    chains: list[tuple[int, ...]] = []
    for k, op in enumerate(ops):
        if op.src != op.dst and k in heads:
            chain = [k]
            while chain[-1] in nxt:
                chain.append(nxt[chain[-1]])
            chains.append(tuple(chain))
    chains.sort(key=lambda c: (ops[c[0]].step, c[0]))
    return chains


@dataclass(frozen=True, slots=True)
class Channels:
    """The messages in the chains they travel in (fused hops share one), each chain's
    channel (``chan_of``, per message), and how many channels the lowering could use."""

    placed: tuple[tuple[int, ...], ...]
    chan_of: dict[int, int]
    limit: int


def _channel_limits(ops: list[Op], rt: Runtime, nchannels: int | None) -> tuple[int, int]:
    """The channels a lowering may use, and the channels a GPU's peers must be spread over."""
    allowed = min(rt.max_channels, nchannels or rt.max_channels)
    # each peer of a GPU costs a threadblock per channel (a send stream and a receive stream
    # share one, see _pair_streams): keep the busiest GPU within the threadblock limit
    # (leaving a few for local ops)
    peers: dict[tuple[int, str], set[int]] = defaultdict(set)
    for op in ops:
        if op.src != op.dst:
            peers[(op.src, "s")].add(op.dst)
            peers[(op.dst, "r")].add(op.src)
    most = max((len(p) for p in peers.values()), default=1)
    # ... but a channel holds at most max_tbs_per_channel send peers (and receive peers) of a
    # GPU, so a GPU with many peers needs that many channels whatever the threadblock budget
    spread = -(-most // rt.max_tbs_per_channel)
    if spread > allowed:
        raise LimitError(
            f"a GPU exchanges with {most} peers; {rt.title} keeps at most "
            f"{rt.max_tbs_per_channel} send and {rt.max_tbs_per_channel} receive peers per "
            f"channel ({rt.limit('tbs_per_channel').cite()}), so it needs {spread} channels, "
            f"more than {allowed}")
    return max(spread, min(allowed, (rt.max_tbs - 4) // most)), spread


class _ChannelPlan:
    """The state of :func:`assign_channels` while it places chains one by one."""

    def __init__(self, ops: list[Op], rt: Runtime, limit: int, spread: int, n: int):
        self.ops, self.rt, self.limit, self.spread, self.n = ops, rt, limit, spread, n
        # (rank, "s"/"r", channel) -> the peers it sends to / receives from on that channel
        self.chan_peers: dict[tuple[int, str, int], set[int]] = defaultdict(set)
        self.busy: set[tuple[int, int, int, int]] = set()
        # (rank, chan, recv peer) -> send peer of a fused step, and the reverse
        self.partner_recv: dict[tuple[int, int, int], int] = {}
        self.partner_send: dict[tuple[int, int, int], int] = {}
        self.chan_of: dict[int, int] = {}
        # steps each (rank, direction, peer, channel) threadblock would get: a channel that
        # is full is skipped, so long schedules spread over more channels, not one long tb
        self.load: dict[tuple[int, str, int, int], int] = defaultdict(int)
        self.cap = max(1, rt.max_steps_per_tb // 2)     # the rest is room for nops
        self.most = rt.max_tbs_per_channel
        self.orders: dict[int, list[int]] = {}

    def order(self, src: int, dst: int) -> list[int]:
        """Channels to try for a message, in order."""
        # when peers must be spread, start at a channel picked by the offset dst - src: in a
        # direct alltoall each sender then puts n/spread consecutive offsets on a channel and
        # each receiver gets the same offsets there, so both sides fit (a first-fit search
        # from channel 0 fills a sender's channels in an order its receivers cannot match)
        first = 0 if self.spread == 1 else (dst - src) % self.n * self.spread // self.n
        order = self.orders.get(first)
        if order is None:
            order = self.orders[first] = [(first + i) % self.limit for i in range(self.limit)]
        return order

    def peer_fits(self, src: int, dst: int, c: int) -> bool:
        out, inn = self.chan_peers[(src, "s", c)], self.chan_peers[(dst, "r", c)]
        most = self.most
        return (dst in out or len(out) < most) and (src in inn or len(inn) < most)

    def tb_load(self, rank: int, way: str, peer: int, c: int) -> int:
        # a fused step ties a recv peer to a send peer: both directions share one tb
        if way == "s":
            other = self.partner_send.get((rank, c, peer))
            return self.load[(rank, "s", peer, c)] + (self.load[(rank, "r", other, c)]
                                                      if other is not None else 0)
        other = self.partner_recv.get((rank, c, peer))
        return self.load[(rank, "r", peer, c)] + (self.load[(rank, "s", other, c)]
                                                  if other is not None else 0)

    def fits(self, chain: tuple[int, ...], c: int, t: int) -> bool:
        ops = self.ops
        for k in chain:
            src, dst = ops[k].src, ops[k].dst
            if (src, dst, t, c) in self.busy or not self.peer_fits(src, dst, c):
                return False
            if (self.tb_load(src, "s", dst, c) >= self.cap
                    or self.tb_load(dst, "r", src, c) >= self.cap):
                return False
        for a, b in pairwise(chain):
            x, pa, pb = ops[a].dst, ops[a].src, ops[b].dst
            if (self.partner_recv.get((x, c, pa), pb) != pb
                    or self.partner_send.get((x, c, pb), pa) != pa):
                return False
        return True

    def least_loaded(self, src: int, dst: int, t: int) -> int:
        """When every channel is taken or full: the least loaded one that still has room for
        the pair (the global order still keeps it deadlock-free, or says why not)."""
        room = [cc for cc in self.order(src, dst) if self.peer_fits(src, dst, cc)]
        if not room:
            raise LimitError(
                f"GPU {src} -> GPU {dst}: every one of the {self.limit} channels already "
                f"holds {self.rt.max_tbs_per_channel} peers of one of them "
                f"({self.rt.limit('tbs_per_channel').cite()}); use more channels")
        free = [cc for cc in room if (src, dst, t, cc) not in self.busy] or room
        return min(free, key=lambda cc: self.load[(src, "s", dst, cc)])

    def place(self, chain: tuple[int, ...], c: int, t: int) -> None:
        ops = self.ops
        for k in chain:
            src, dst = ops[k].src, ops[k].dst
            self.chan_peers[(src, "s", c)].add(dst)
            self.chan_peers[(dst, "r", c)].add(src)
            self.busy.add((src, dst, t, c))
            self.load[(src, "s", dst, c)] += 1
            self.load[(dst, "r", src, c)] += 1
            self.chan_of[k] = c
        for a, b in pairwise(chain):
            x, pa, pb = ops[a].dst, ops[a].src, ops[b].dst
            self.partner_recv[(x, c, pa)] = pb
            self.partner_send[(x, c, pb)] = pa


def assign_channels(ops: list[Op], chains: list[tuple[int, ...]], rt: Runtime,
                    nchannels: int | None, n: int) -> Channels:
    """Stage 3 (see the module docstring): a channel for every chain, in IR order."""
    limit, spread = _channel_limits(ops, rt, nchannels)
    plan = _ChannelPlan(ops, rt, limit, spread, n)
    work = deque(chains)
    placed: list[tuple[int, ...]] = []
    while work:
        chain = work.popleft()
        t = ops[chain[0]].step
        src, dst = ops[chain[0]].src, ops[chain[0]].dst
        busy = plan.busy
        # a channel this pair already uses in this step cannot take the chain's first hop
        c = next((c for c in plan.order(src, dst)
                  if (src, dst, t, c) not in busy and plan.fits(chain, c, t)), None)
        if c is None and len(chain) > 1:
            # no channel keeps the fused tbs consistent: send the hops separately
            work.extendleft((k,) for k in reversed(chain))
            continue
        if c is None:
            c = plan.least_loaded(src, dst, t)
        plan.place(chain, c, t)
        placed.append(chain)
    return Channels(tuple(placed), plan.chan_of, limit)


@dataclass(frozen=True, slots=True)
class Program:
    """Every MSCCL instruction (``uid`` = index), the ordering edges between them (messages
    and FIFO capacity, and the data hazards, which ``hazard`` also lists per instruction: the
    ones it must wait for), and how many fused instructions there are. ``edges`` and
    ``hazard`` are in compressed rows (:meth:`waits_for`): the successors of ``j`` are
    ``succ[start[j]:start[j + 1]]``, each edge once; ``indegree`` counts each instruction's
    predecessors. Rows, not a list per instruction: hundreds of thousands of small lists
    cost more to build (and to garbage-collect) than the lowering's own work."""

    instrs: list[Instr]
    edges: tuple[list[int], list[int]]
    indegree: list[int]
    hazard: tuple[list[int], list[int]]
    n_fused: int

    def waits_for(self, uid: int | None) -> list[int]:
        """The instructions that instruction ``uid`` must wait for (its data hazards)."""
        start, flat = self.hazard
        u = _set(uid)
        return flat[start[u]:start[u + 1]]


class _ProgramBuilder:
    """The instructions of :func:`instructions` and every unit each one reads or writes."""

    def __init__(self) -> None:
        self.instrs: list[Instr] = []
        # ordering edges as (before, after) pairs, possibly repeated
        self.before: list[int] = []
        self.after: list[int] = []
        # every access as one row (instr, rank, buffer, lo, hi, step, phase, op, write): a
        # range of units, expanded per unit only by the columnar hazard search
        self.access: list[tuple[int, int, int, int, int, int, int, int, bool]] = []
        # (sender, receiver, channel) -> its messages: (order key, send, receive)
        self.conn_msgs: dict[tuple[int, int, int], list[tuple[tuple, int, int]]] = \
            defaultdict(list)
        self.n_fused = 0

    def add(self, instr: Instr) -> int:
        instr.uid = len(self.instrs)
        self.instrs.append(instr)
        return instr.uid

    def touch(self, i: int, rank: int, buf: Buf, lo: int, hi: int, when: tuple,
              write: bool) -> None:
        self.access.append((i, rank, int(buf), lo, hi, *when, write))


def _hop(b: _ProgramBuilder, ops: list[Op], chain: tuple[int, ...], h: int, c: int,
         acc: _Accesses | None) -> int:
    """The instruction that receives hop ``h`` of ``chain`` (and forwards it if fused)."""
    k = chain[h]
    op = ops[k]
    t = ops[chain[0]].step
    reduce = op.kind is OpKind.REDUCE
    if h == len(chain) - 1:
        typ = "rrc" if reduce else "r"
        i = b.add(Instr(op.dst, typ, op.db if reduce else op.sb, op.do if reduce else op.so,
                        op.db, op.do, op.cnt, (t, 1, k), recv=op.src, chan=c))
    else:
        b.n_fused += 1
        out = ops[chain[h + 1]]
        if reduce and acc is not None and _dead_after(acc, op, (k, chain[h + 1])):
            typ = "rrs"
            i = b.add(Instr(op.dst, typ, op.db, op.do, out.db, out.do, op.cnt, (t, 1, k),
                            recv=op.src, send=out.dst, chan=c))
        else:
            typ = "rrcs" if reduce else "rcs"
            i = b.add(Instr(op.dst, typ, op.db, op.do, op.db, op.do, op.cnt, (t, 1, k),
                            recv=op.src, send=out.dst, chan=c))
    if typ != "rrs":
        b.touch(i, op.dst, op.db, op.do, op.do + op.cnt, (t, 1, k), True)
    if reduce:
        b.touch(i, op.dst, op.db, op.do, op.do + op.cnt, (t, 1, k), False)
    return i


def _message_instrs(b: _ProgramBuilder, ops: list[Op], channels: Channels,
                    acc: _Accesses | None) -> None:
    """A send, then one receive (fused: receive-and-send) per hop, for every chain."""
    for chain in channels.placed:
        t = ops[chain[0]].step
        c = channels.chan_of[chain[0]]
        first = ops[chain[0]]
        s = b.add(Instr(first.src, "s", first.sb, first.so, first.db, first.do, first.cnt,
                        (t, 0, chain[0]), send=first.dst, chan=c))
        b.touch(s, first.src, first.sb, first.so, first.so + first.cnt, (t, 0, chain[0]),
                False)
        sender = s
        for h, k in enumerate(chain):
            i = _hop(b, ops, chain, h, c, acc)
            b.before.append(sender)
            b.after.append(i)
            b.conn_msgs[(ops[k].src, ops[k].dst, c)].append(((t, k), sender, i))
            sender = i


def _local_instrs(b: _ProgramBuilder, ops: list[Op]) -> None:
    """A copy or reduction step for every local op."""
    for k, op in enumerate(ops):
        if op.src == op.dst:
            typ = "re" if op.kind is OpKind.REDUCE else "cpy"
            i = b.add(Instr(op.src, typ, op.sb, op.so, op.db, op.do, op.cnt, (op.step, 1, k)))
            b.touch(i, op.src, op.sb, op.so, op.so + op.cnt, (op.step, 0, k), False)
            b.touch(i, op.dst, op.db, op.do, op.do + op.cnt, (op.step, 1, k), True)
            if op.kind is OpKind.REDUCE:
                b.touch(i, op.dst, op.db, op.do, op.do + op.cnt, (op.step, 1, k), False)


def _hazard_pairs(access: list[tuple[int, int, int, int, int, int, int, int, bool]]
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Data hazards per unit, in IR order (reads of a step before its writes): RAW, WAR and
    WAW, as (waiter, waited) pairs of instructions, each pair once, sorted.

    Columnar: every (access, unit) is a row, sorted by unit and then by (step, phase, writes
    before reads, op, order of recording); in that order a read waits for the last write
    before it, a write for the last write and every read since."""
    none = np.zeros(0, dtype=np.int64)
    if not access:
        return none, none
    cols = np.array([a[:8] for a in access], dtype=np.int64).reshape(-1, 8)
    instr, rank, buf, lo, hi, step, phase, op = cols.T
    write = np.fromiter((a[8] for a in access), dtype=bool, count=len(access))
    length = hi - lo
    row = np.repeat(np.arange(len(access)), length)          # the access of each unit row
    unit = lo[row] + (np.arange(len(row)) - np.repeat(np.cumsum(length) - length, length))
    n_units = int(unit.max()) + 1 if len(unit) else 1
    slot = (rank[row] * 3 + buf[row]) * n_units + unit
    order = np.lexsort((row, op[row], write[row] == 0, phase[row], step[row], slot))
    slot, row = slot[order], row[order]
    is_write, who = write[row], instr[row]
    pos = np.arange(len(row))
    first = np.concatenate([[True], slot[1:] != slot[:-1]])
    start = np.maximum.accumulate(np.where(first, pos, 0))      # the first row of each unit
    # the last write strictly before each row, of the same unit (-1: none)
    last = np.maximum.accumulate(np.where(is_write, pos, -1))
    prev = np.concatenate([[-1], last[:-1]])
    prev[prev < start] = -1
    has = prev >= 0
    waiter = [who[has]]
    waited = [who[prev[has]]]
    # a write also waits for every read since that write (or since the unit's first row)
    w = np.flatnonzero(is_write)
    since = np.where(prev[w] >= 0, prev[w] + 1, start[w])
    n_reads = w - since
    readers = np.repeat(since, n_reads) + (np.arange(int(n_reads.sum()))
                                           - np.repeat(np.cumsum(n_reads) - n_reads, n_reads))
    waiter.append(np.repeat(who[w], n_reads))
    waited.append(who[readers])
    a, b = np.concatenate(waiter), np.concatenate(waited)
    keep = a != b
    size = int(instr.max()) + 1
    pairs = _distinct(a[keep] * size + b[keep])
    return pairs // size, pairs % size


def _distinct(a: np.ndarray) -> np.ndarray:
    """The distinct values of ``a``, sorted (a sort and a mask: cheaper than np.unique)."""
    a = np.sort(a)
    return a[np.concatenate([[True], a[1:] != a[:-1]])] if len(a) else a


def _rows(head: np.ndarray, tail: np.ndarray, n: int) -> tuple[list[int], list[int]]:
    """Sorted (head, tail) pairs as compressed rows over heads 0 .. n - 1."""
    return np.searchsorted(head, np.arange(n + 1)).tolist(), tail.tolist()


def instructions(ops: list[Op], channels: Channels, acc: _Accesses | None) -> Program:
    """Stage 5's graph (see the module docstring): every instruction, with edges for
    messages, FIFO capacity and data hazards."""
    b = _ProgramBuilder()
    _message_instrs(b, ops, channels, acc)
    _local_instrs(b, ops)
    # FIFO capacity: a connection's next send waits (in the global order) for the previous
    # message's receive
    for msgs in b.conn_msgs.values():
        msgs.sort()
        for (_, _, r_prev), (_, s_next, _) in pairwise(msgs):
            b.before.append(r_prev)
            b.after.append(s_next)
    waiter, waited = _hazard_pairs(b.access)
    hazard = _rows(waiter, waited, len(b.instrs))
    n = len(b.instrs)
    edge = _distinct(np.concatenate([np.array(b.before, dtype=np.int64), waited]) * n
                     + np.concatenate([np.array(b.after, dtype=np.int64), waiter]))
    indegree = np.bincount(edge % n, minlength=n).tolist()
    return Program(b.instrs, _rows(edge // n, edge % n, n), indegree, hazard, b.n_fused)


def global_order(program: Program) -> list[int]:
    """Stage 5: a topological order of the instruction graph (Kahn's algorithm, ties by IR
    step); sets every instruction's ``pos``."""
    instrs = program.instrs
    start, succ = program.edges
    indeg = list(program.indegree)
    n = len(instrs)
    # each (key, index) as one integer that sorts the same: a key is (step, phase, op) with
    # step >= -1 and phase 0 or 1
    keys = np.array([ins.key for ins in instrs], dtype=np.int64).reshape(-1, 3)
    span = int(keys[:, 2].max()) + 1 if n else 1
    prio = ((((keys[:, 0] + 1) * 2 + keys[:, 1]) * span + keys[:, 2]) * n
            + np.arange(n)).tolist()
    heap = [prio[i] for i in range(n) if indeg[i] == 0]
    heapq.heapify(heap)
    order: list[int] = []
    while heap:
        j = heapq.heappop(heap) % n
        instrs[j].pos = len(order)
        order.append(j)
        for i in succ[start[j]:start[j + 1]]:
            indeg[i] -= 1
            if indeg[i] == 0:
                heapq.heappush(heap, prio[i])
    if len(order) != len(instrs):
        raise ScheduleError("the schedule's messages and buffer hazards form a cycle that no "
                            "MSCCL threadblock order can serve (a pair of ranks exchanging "
                            "the same slots over one channel in one step); lower it with "
                            "more channels or without fusion")
    return order


def _keys_of(ins: Instr) -> list[tuple]:
    """The (rank, direction, peer, channel) streams an instruction belongs to."""
    keys = []
    if ins.send is not None:
        keys.append((ins.rank, "s", ins.send, ins.chan))
    if ins.recv is not None:
        keys.append((ins.rank, "r", ins.recv, ins.chan))
    return keys


class _Union:
    """Union-find over stream keys: the streams that share one threadblock."""

    def __init__(self) -> None:
        self.parent: dict[tuple, tuple] = {}

    def root(self, k: tuple) -> tuple:
        parent = self.parent
        parent.setdefault(k, k)
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    def join(self, a: tuple, b: tuple) -> None:
        """``b``'s set joins ``a``'s (under ``a``'s root)."""
        self.parent[self.root(b)] = self.root(a)


def _set(value: int | None) -> int:
    """A number an earlier stage has set (an internal error otherwise)."""
    if value is None:
        raise ScheduleError("internal: the MSCCL lowering used a number before setting it")
    return value


def _local_tb(ins: Instr, tbs: list[list[Threadblock]], pools: dict[int, list[Threadblock]],
              local_tb: dict[int, Threadblock], program: Program, quota: int, cap: int
              ) -> Threadblock:
    """The threadblock of a local copy or reduction: the one of the op it waits on if that
    has room, else a new one while the GPU has fewer than ``quota``, else the emptiest."""
    pool = pools[ins.rank]
    instrs = program.instrs
    preds = sorted((_set(instrs[p].pos), local_tb[p]) for p in program.waits_for(ins.uid)
                   if p in local_tb and instrs[p].rank == ins.rank)
    tb = preds[-1][1] if preds and len(preds[-1][1].steps) < cap else None
    if tb is None and len(pool) < quota:
        tb = Threadblock(len(tbs[ins.rank]), None, None, 0)
        tbs[ins.rank].append(tb)
        pool.append(tb)
    if tb is None:
        tb = min(pool, key=lambda t: len(t.steps))
    return tb


def _stream_tb(ins: Instr, tbs: list[list[Threadblock]], tb_of_root: dict[tuple, Threadblock],
               union: _Union) -> Threadblock:
    """The threadblock of a message instruction: the one of its (joined) streams."""
    r = union.root(_keys_of(ins)[0])
    tb = tb_of_root.get(r)
    if tb is None:
        tb = tb_of_root[r] = Threadblock(len(tbs[ins.rank]), None, None, ins.chan)
        tbs[ins.rank].append(tb)
    for way, peer in (("send", ins.send), ("recv", ins.recv)):
        if peer is None:
            continue
        have = getattr(tb, way)
        if have not in (None, peer):
            verb = "send to" if way == "send" else "receive from"
            raise ScheduleError(f"internal: threadblock on GPU {ins.rank} would {verb} "
                                f"{have} and {peer}")
        setattr(tb, way, peer)
    return tb


def threadblocks(program: Program, order: list[int], rt: Runtime, n: int, pair: bool,
                 local_share: float = LOCAL_SHARES[0]) -> list[list[Threadblock]]:
    """Stage 4: one tb per (send peer, recv peer, channel) of each GPU, joined by fused
    steps (and, with ``pair``, send-only with receive-only streams); local ops in as few
    local tbs as ``local_share`` of the step limit allows (room for nops), an op in the tb
    of the op it waits on, so that chains stay in one tb. Steps in the global order."""
    instrs = program.instrs
    union = _Union()
    for ins in instrs:
        ks = _keys_of(ins)
        for k in ks[1:]:
            union.join(ks[0], k)
    if pair:
        _pair_streams(instrs, union, rt)
    tbs: list[list[Threadblock]] = [[] for _ in range(n)]
    tb_of_root: dict[tuple, Threadblock] = {}
    n_local: dict[int, int] = defaultdict(int)
    for ins in instrs:
        if ins.send is None and ins.recv is None:
            n_local[ins.rank] += 1
    cap = max(1, int(rt.max_steps_per_tb * local_share))
    pools: dict[int, list[Threadblock]] = defaultdict(list)
    local_tb: dict[int, Threadblock] = {}
    for j in order:
        ins = instrs[j]
        if ins.send is None and ins.recv is None:
            tb = _local_tb(ins, tbs, pools, local_tb, program,
                           -(-n_local[ins.rank] // cap), cap)
            local_tb[j] = tb
        else:
            tb = _stream_tb(ins, tbs, tb_of_root, union)
        tb.steps.append(ins)
    _sort_tbs(tbs)
    return tbs


def _waits(tb: Threadblock, program: Program) -> None:
    """A tb's waits on other tbs of its GPU: the last one wanted before each step becomes its
    ``depid``/``deps``, the others ``nop`` steps before it; waits an earlier one implies are
    dropped. ``deps`` still counts steps without the nops."""
    instrs = program.instrs
    steps: list[Instr] = []
    waited: dict[int, int] = {}
    for ins in tb.steps:
        need: dict[int, int] = {}
        for p in (instrs[j] for j in program.waits_for(ins.uid)):
            t, s = _set(p.tb), _set(p.index)
            if t != ins.tb and (t not in need or need[t] < s):
                need[t] = s
        need = {t: s for t, s in need.items() if t not in waited or waited[t] < s}
        waits = sorted(need.items())
        for t, s in waits[:-1]:
            steps.append(Instr(ins.rank, "nop", Buf.INPUT, None, Buf.OUTPUT, None, 0, ins.key,
                               tb=tb.id, chan=tb.chan, depid=t, deps=s))
        for t, s in waits[-1:]:
            ins.depid, ins.deps = t, s
        waited.update(need)
        steps.append(ins)
    tb.steps = steps


def dependencies(tbs: list[list[Threadblock]], program: Program) -> None:
    """Stage 6: hazards between tbs of one GPU become ``depid``/``deps`` and ``nop`` steps;
    steps are renumbered and every ``deps`` points at its step's final index."""
    for rank_tbs in tbs:
        for tb in rank_tbs:
            _waits(tb, program)
        # renumber, then map deps from pre-nop indices to final ones
        old_to_new: dict[tuple[int, int | None], int] = {}
        for tb in rank_tbs:
            for idx, ins in enumerate(tb.steps):
                if ins.type != "nop":
                    old_to_new[(tb.id, ins.index)] = idx
        for tb in rank_tbs:
            for idx, ins in enumerate(tb.steps):
                ins.index = idx
        for tb in rank_tbs:
            for ins in tb.steps:
                if ins.depid is not None:
                    ins.deps = old_to_new[(ins.depid, ins.deps)]
                    rank_tbs[ins.depid].steps[ins.deps].hasdep = True


def _pair_streams(instrs: list[Instr], union: _Union, rt: Runtime) -> None:
    """Join a GPU's send-only and receive-only streams of one channel into shared tbs.

    An MSCCL tb has one send peer and one receive peer, so a tb that only sends (or only
    receives) wastes half of one; msccl-tools pairs them too. Joining keeps every connection's
    sends (and receives) in one tb, so FIFO order per (peer, channel) is unchanged, and the
    joined tb runs its steps in the global order like every other tb, so the deadlock argument
    (the smallest unfinished instruction can always run) still holds. A pair whose steps would
    leave too little room for nops under the runtime's step limit stays apart.
    """
    size: dict[tuple, int] = defaultdict(int)
    ways: dict[tuple, set[str]] = defaultdict(set)
    for ins in instrs:
        ks = _keys_of(ins)
        if not ks:
            continue
        r = union.root(ks[0])
        size[r] += 1
        for k in ks:
            ways[r].add(k[1])
    # per (rank, channel): streams that only send and streams that only receive
    sends: dict[tuple[int, int], list[tuple]] = defaultdict(list)
    recvs: dict[tuple[int, int], list[tuple]] = defaultdict(list)
    for r, w in ways.items():
        if w == {"s"}:
            sends[(r[0], r[3])].append(r)
        elif w == {"r"}:
            recvs[(r[0], r[3])].append(r)
    cap = max(1, rt.max_steps_per_tb * 3 // 4)
    for key, ss in sends.items():
        rs = recvs.get(key)
        if not rs:
            continue
        # the longest streams pair with the shortest that still fit; ties by peer, so the
        # result does not depend on dict order
        ss.sort(key=lambda k: (-size[k], k[2]))
        rs.sort(key=lambda k: (size[k], k[2]))
        used = [False] * len(rs)
        for s_key in ss:
            for j, r_key in enumerate(rs):
                if not used[j] and size[s_key] + size[r_key] <= cap:
                    used[j] = True
                    union.join(s_key, r_key)
                    break


def _peer_key(peer: int | None) -> int:
    """A peer for sorting: none before GPU 0, as msccl-tools' -1 sorts."""
    return -1 if peer is None else peer


def _sort_tbs(tbs: list[list[Threadblock]]) -> None:
    """Steps of each tb in the global order; tb ids sorted by (send, recv, chan) so tbs that
    use the same link sit together, as msccl-tools does."""
    for rank_tbs in tbs:
        rank_tbs.sort(key=lambda tb: (_peer_key(tb.send), _peer_key(tb.recv), tb.chan))
        for new_id, tb in enumerate(rank_tbs):
            tb.id = new_id
            tb.steps.sort(key=lambda ins: _set(ins.pos))
            for idx, ins in enumerate(tb.steps):
                ins.tb, ins.index = new_id, idx


def _renumber_for_depids(tbs: list[list[Threadblock]], rt: Runtime) -> None:
    """The runtimes store a dependency's threadblock id in an int8 (``dependentBid``), so a
    wait on threadblock 128 or above wraps to a negative id: give the threadblocks that are
    waited on the smallest ids (the order of the others is kept). Ids only name
    threadblocks, so renumbering changes nothing else."""
    for rank_tbs in tbs:
        waited = {ins.depid for tb in rank_tbs for ins in tb.steps if ins.depid is not None}
        if not waited or max(waited) <= rt.max_depid:
            continue
        order = sorted(rank_tbs, key=lambda tb: (tb.id not in waited, tb.id))
        new_id = {tb.id: k for k, tb in enumerate(order)}
        for tb in rank_tbs:
            for ins in tb.steps:
                ins.tb = new_id[_set(ins.tb)]
                if ins.depid is not None:
                    ins.depid = new_id[ins.depid]
        for tb in rank_tbs:
            tb.id = new_id[tb.id]
        rank_tbs.sort(key=lambda tb: tb.id)


def _quick_limits(units: Schedule, rt: Runtime) -> None:
    """Limits that counting alone shows are exceeded, checked before the (slower) lowering:
    a GPU's local ops need their steps in some threadblocks, and the messages from one GPU to
    one peer share at most ``max_channels`` threadblocks."""
    n = units.n
    src, dst = units.ops.src.astype(np.int64), units.ops.dst.astype(np.int64)
    pieces = -(-units.ops.count.astype(np.int64) // rt.max_cnt)
    local = src == dst
    per_rank = np.bincount(src[local], weights=pieces[local], minlength=n)
    if writes_input(units):
        per_rank += -(-buffer_units(units)[0] // rt.max_cnt)
    r = int(per_rank.argmax()) if len(per_rank) else 0
    if len(per_rank) and per_rank[r] > rt.max_steps_per_tb * rt.max_tbs:
        raise LimitError(f"GPU {r} has {int(per_rank[r])} local copy/reduce steps; "
                         f"{rt.title} fits at most {rt.max_steps_per_tb * rt.max_tbs} "
                         f"({rt.max_tbs} threadblocks x {rt.max_steps_per_tb} steps; "
                         f"{rt.limit('steps_per_tb').cite()})")
    remote = ~local
    # a threadblock has one send peer and one receive peer
    pairs = np.unique(src[remote] * n + dst[remote])
    for way, ranks in (("sends to", pairs // n), ("receives from", pairs % n)):
        peers = np.bincount(ranks, minlength=n)
        r = int(peers.argmax()) if len(peers) else 0
        if len(peers) and peers[r] > rt.max_tbs:
            raise LimitError(f"GPU {r} {way} {int(peers[r])} peers, and a threadblock has one "
                             f"send and one receive peer; {rt.title} allows {rt.max_tbs} "
                             f"threadblocks per GPU ({rt.limit('tbs').cite()})")
    # every message is a step at its sender and at its receiver (a fused step is one receive
    # and one send), every local op a step: a floor on each rank's <step> nodes
    sends = np.bincount(src[remote], weights=pieces[remote], minlength=n)
    recvs = np.bincount(dst[remote], weights=pieces[remote], minlength=n)
    floor = np.maximum(sends, recvs) + per_rank
    r = int(floor.argmax()) if len(floor) else 0
    if len(floor) and 1 + n + floor[r] >= rt.max_xml_nodes:
        raise LimitError(f"GPU {r} needs at least {int(floor[r])} <step> nodes (plus <algo> and "
                         f"{n} <gpu>); {rt.title}'s parser reads at most "
                         f"{rt.max_xml_nodes - 1} XML nodes per rank "
                         f"({rt.limit('xml_nodes').cite()}). Use fewer chunks or steps")
    pair = src[remote] * n + dst[remote]
    msgs = np.bincount(pair, weights=pieces[remote], minlength=n * n)
    worst = int(msgs.argmax()) if len(msgs) else 0
    if len(msgs) and msgs[worst] > rt.max_steps_per_tb * rt.max_channels:
        raise LimitError(f"GPU {worst // n} sends {int(msgs[worst])} messages to GPU "
                         f"{worst % n}; {rt.title} fits at most "
                         f"{rt.max_steps_per_tb * rt.max_channels} ({rt.max_channels} "
                         f"channels x {rt.max_steps_per_tb} steps; "
                         f"{rt.limit('steps_per_tb').cite()}). Use fewer chunks or steps")


def _check_limits(tbs: list[list[Threadblock]], rt: Runtime, ngpus: int) -> None:
    """Every limit the loaders check (see :data:`backends.msccl.runtimes.LIMITS`), each
    message naming the limit and where it comes from."""
    for r, rank_tbs in enumerate(tbs):
        if len(rank_tbs) > rt.max_tbs:
            raise ThreadblockLimitError(f"GPU {r} needs {len(rank_tbs)} threadblocks; "
                                        f"{rt.title} allows {rt.max_tbs} "
                                        f"({rt.limit('tbs').cite()})", len(rank_tbs))
        # the parser keeps <algo>, every <gpu>, and this rank's <tb> and <step> nodes; it
        # checks for room before reading each node, closing tags included
        nodes = 1 + ngpus + len(rank_tbs) + sum(len(tb.steps) for tb in rank_tbs)
        if nodes >= rt.max_xml_nodes:
            raise LimitError(f"GPU {r} needs {nodes} XML nodes (<algo>, {ngpus} <gpu>, "
                             f"{len(rank_tbs)} <tb>, {nodes - 1 - ngpus - len(rank_tbs)} "
                             f"<step>); {rt.title}'s parser reads at most "
                             f"{rt.max_xml_nodes - 1} ({rt.limit('xml_nodes').cite()}). Use "
                             "fewer chunks or steps")
        for way in ("send", "recv"):
            per_chan: dict[int, set[int]] = defaultdict(set)
            for tb in rank_tbs:
                if getattr(tb, way) is not None:
                    per_chan[tb.chan].add(getattr(tb, way))
            worst = max(per_chan.items(), key=lambda kv: len(kv[1]), default=(0, set()))
            if len(worst[1]) > rt.max_tbs_per_channel:
                raise LimitError(f"GPU {r} has {len(worst[1])} {way} peers on channel "
                                 f"{worst[0]}; {rt.title} allows {rt.max_tbs_per_channel} "
                                 f"({rt.limit('tbs_per_channel').cite()})")
        for tb in rank_tbs:
            bad = next((ins for ins in tb.steps
                        if ins.depid is not None and ins.depid > rt.max_depid), None)
            if bad is not None:
                raise DepidLimitError(f"GPU {r} threadblock {tb.id} waits on threadblock "
                                      f"{bad.depid}; {rt.title} stores that id in an int8, "
                                      f"so at most {rt.max_depid} "
                                      f"({rt.limit('depid').cite()}), and more than that "
                                      "many threadblocks are waited on", len(rank_tbs))
        for tb in rank_tbs:
            if tb.chan >= rt.max_channels:
                raise LimitError(f"GPU {r} threadblock {tb.id} uses channel {tb.chan}; "
                                 f"{rt.title} has {rt.max_channels} channels "
                                 f"({rt.limit('channels').cite()})")
            if len(tb.steps) > rt.max_steps_per_tb:
                raise StepLimitError(
                    f"GPU {r} threadblock {tb.id} (send {tb.send}, recv {tb.recv}, channel "
                    f"{tb.chan}) needs {len(tb.steps)} steps; {rt.title} allows "
                    f"{rt.max_steps_per_tb} per threadblock "
                    f"({rt.limit('steps_per_tb').cite()}). Use fewer chunks or steps, more "
                    "channels, or a runtime built with a larger MSCCL_MAX_NUM_STEPS",
                    local=tb.send is None and tb.recv is None)
