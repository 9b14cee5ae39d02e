"""Lowering a schedule (in equal units) to MSCCL threadblocks, steps and dependencies.

The IR is lock-step: ops of one step run together and read the previous step's state. MSCCL
is data-flow: every threadblock (tb) runs its own step list in order, sends and receives pair
up in FIFO order per (sender, receiver, channel), and a step can wait for one step of another
tb of its GPU. The lowering, in order:

1. ``relocate_input``: if the schedule writes its input buffer, copy the input into extra
   scratch first (the user's ``sendbuff`` is const) and read it from there.
2. ``fuse``: a receive whose data is the next thing sent from that slot becomes one fused
   instruction (``rcs``; ``rrcs``/``rrs`` after a reduction), forming chains A->x->B->... that
   move together. Only when it cannot change what anyone reads (see ``_can_fuse``).
3. ``assign_channels``: every message of a chain shares a channel; concurrent messages on one
   pair get distinct channels (parallel tbs), within the limit; a GPU keeps at most 32 send
   peers and 32 receive peers on one channel (the loaders' per-channel arrays), so peers are
   spread over channels by their offset.
4. ``threadblocks``: one tb per (send peer, recv peer, channel) on each GPU (fused steps tie a
   recv peer to a send peer; otherwise a send stream and a receive stream of one channel are
   paired into one tb, as msccl-tools does); local copies and reductions get their own tb.
5. ``order``: a graph of every instruction with edges for messages (send before receive),
   FIFO capacity (a connection's next send after its previous receive) and data hazards on
   each unit (RAW, WAR, WAW in the IR's step order). A topological order of it, ties broken by
   IR step, is every tb's program order. Because the same global order serves all tbs and
   every wait points backwards in it, the smallest unfinished instruction can always run: no
   deadlock, even with one message of buffering per connection.
6. ``dependencies``: hazards between tbs of one GPU become ``depid``/``deps``; waits already
   implied by an earlier wait of the same tb are dropped; more than one left becomes ``nop``s.
   The runtimes keep ``depid`` in an int8, so the tbs waited on get the smallest ids.
7. ``_check_limits``: every loader limit of :mod:`backends.msccl.runtimes`, counted on the
   result (threadblocks, steps, per-channel peers, XML nodes per rank, depids).
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right
from collections import defaultdict, deque
from dataclasses import dataclass, field
from itertools import pairwise

import numpy as np

from backends.msccl.runtimes import Runtime
from backends.units import UnitFacts, buffer_units, rank_units, to_units, writes_input
from cclc.errors import ScheduleError
from cclc.ir import Buf, OpKind, Schedule

__all__ = ["DepidLimitError", "Instr", "LimitError", "Lowered", "Op", "Threadblock",
           "ThreadblockLimitError", "check_chunks", "lower", "lower_to_fit"]


class LimitError(ScheduleError):
    """The schedule does not fit a limit of the runtime (the message names it).
    ``channels``: how many channels the lowering that failed could use (None: not known)."""

    channels: int | None = None


class ThreadblockLimitError(LimitError):
    """A GPU needs ``needed`` threadblocks, more than the runtime allows."""

    def __init__(self, message: str, needed: int):
        super().__init__(message)
        self.needed = needed


class DepidLimitError(ThreadblockLimitError):
    """Steps of a GPU (with ``needed`` threadblocks) wait on more threadblocks than an int8
    ``depid`` can name."""


@dataclass(slots=True)
class Op:
    """An op in units after input relocation; ``ir`` is its row in the schedule (or None)."""

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
    so: int
    db: Buf
    do: int
    cnt: int
    key: tuple
    send: int | None = None      # send peer it needs (its tb's)
    recv: int | None = None      # recv peer it needs
    chan: int = 0
    tb: int = -1
    pos: int = -1                # index in the global order
    index: int = -1              # final step index in its tb
    depid: int = -1
    deps: int = -1
    hasdep: bool = False
    uid: int = -1                # index in the list of all instructions


@dataclass(slots=True)
class Threadblock:
    id: int
    send: int
    recv: int
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
    ops = []
    for i, (step, src, dst, kind, sb, so, db, do, total) in enumerate(cols):
        for lo in range(0, total, max_cnt):
            ops.append(Op(i, step, src, dst, OpKind(kind), Buf(sb), so + lo, Buf(db), do + lo,
                          min(max_cnt, total - lo)))
    if not writes_input(units):
        return ops, sizes, rank_units(units, Buf.SCRATCH)
    for op in ops:
        if op.sb is Buf.INPUT:
            op.sb, op.so = Buf.SCRATCH, op.so + n_scr
        if op.db is Buf.INPUT:
            op.db, op.do = Buf.SCRATCH, op.do + n_scr
    first = [Op(None, -1, r, r, OpKind.COPY, Buf.INPUT, lo, Buf.SCRATCH, n_scr + lo,
                min(max_cnt, n_in - lo))
             for r in range(units.n) for lo in range(0, n_in, max_cnt)]
    return first + ops, (n_in, n_out, n_scr + n_in), (n_scr + n_in,) * units.n


class _Accesses:
    """Per (rank, buffer, unit): every op touching the unit, sorted by step, for the fusion
    checks (indexed by unit, not by range, so a check reads only the ops of its own units)."""

    def __init__(self, ops: list[Op]):
        by: dict[tuple[int, int, int], list[tuple[int, bool, int]]] = defaultdict(list)
        for k, op in enumerate(ops):
            for u in range(op.so, op.so + op.cnt):
                by[(op.src, op.sb, u)].append((op.step, False, k))
            for u in range(op.do, op.do + op.cnt):
                by[(op.dst, op.db, u)].append((op.step, True, k))
                if op.kind is OpKind.REDUCE:
                    by[(op.dst, op.db, u)].append((op.step, False, k))
        self.by = {key: sorted(v) for key, v in by.items()}
        self.steps = {key: [a[0] for a in v] for key, v in self.by.items()}

    def clash(self, rank: int, buf: Buf, lo: int, hi: int, t0: int, t1: int,
              skip: tuple[int, ...], writes_only: bool = False, reads_only: bool = False
              ) -> bool:
        """Does an op other than ``skip`` touch [lo, hi) in steps t0..t1 (only writes if
        ``writes_only``, only reads if ``reads_only``)?"""
        for u in range(lo, hi):
            key = (rank, buf, u)
            acc = self.by.get(key)
            if acc is None:
                continue
            steps = self.steps[key]
            for i in range(bisect_left(steps, t0), bisect_right(steps, t1)):
                _, write, k = acc[i]
                if (k not in skip and (write or not writes_only)
                        and not (write and reads_only)):
                    return True
        return False


def fuse(ops: list[Op]) -> dict[int, int]:
    """Fused hops: ``nxt[m1] = m2`` when message m2 forwards what m1 delivered (see module doc)."""
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


def lower_to_fit(schedule: Schedule, rt: Runtime, *, fuse: bool = True,
                 nchannels: int | None = None) -> tuple[Lowered, Schedule, UnitFacts]:
    """``schedule`` in units (:func:`backends.units.to_units`) and its first lowering that
    fits every limit of ``rt``; :class:`LimitError` (the first attempt's) when none does."""
    units, facts = to_units(schedule, rt.max_chunks)
    check_chunks(schedule, units, facts, rt)
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
                low = lower(units, rt, fuse_ops=fuse_ops, nchannels=channels, pair=pair)
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
          nchannels: int | None = None, pair: bool = True) -> Lowered:
    """Lower ``us`` (a schedule in units, see :func:`backends.units.to_units`) for runtime
    ``rt``; :class:`ScheduleError` when a limit is exceeded. ``pair``: share tbs between
    send-only and receive-only streams (see ``_pair_streams``)."""
    _quick_limits(us, rt)
    ops, units, scratch = relocate_input(us, rt.max_cnt)
    nxt = fuse(ops) if fuse_ops else {}
    prev = {v: k for k, v in nxt.items()}
    acc = _Accesses(ops) if nxt else None

    # chains of messages (a lone message is a chain of one hop)
    chains: list[list[int]] = []
    for k, op in enumerate(ops):
        if op.src != op.dst and k not in prev:
            chain = [k]
            while chain[-1] in nxt:
                chain.append(nxt[chain[-1]])
            chains.append(chain)
    chains.sort(key=lambda c: (ops[c[0]].step, c[0]))

    # channels
    limit = min(rt.max_channels, nchannels or rt.max_channels)
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
    limit = max(spread, min(limit, (rt.max_tbs - 4) // most))
    if spread > min(rt.max_channels, nchannels or rt.max_channels):
        raise LimitError(
            f"a GPU exchanges with {most} peers; {rt.title} keeps at most "
            f"{rt.max_tbs_per_channel} send and {rt.max_tbs_per_channel} receive peers per "
            f"channel ({rt.limit('tbs_per_channel').cite()}), so it needs {spread} channels, "
            f"more than {min(rt.max_channels, nchannels or rt.max_channels)}")
    # (rank, "s"/"r", channel) -> the peers it sends to / receives from on that channel
    chan_peers: dict[tuple[int, str, int], set[int]] = defaultdict(set)

    def channel_order(src: int, dst: int) -> list[int]:
        # when peers must be spread, start at a channel picked by the offset dst - src: in a
        # direct alltoall each sender then puts n/spread consecutive offsets on a channel and
        # each receiver gets the same offsets there, so both sides fit (a first-fit search
        # from channel 0 fills a sender's channels in an order its receivers cannot match)
        if spread == 1:
            return list(range(limit))
        first = (dst - src) % us.n * spread // us.n
        return [(first + i) % limit for i in range(limit)]

    def peer_fits(src: int, dst: int, c: int) -> bool:
        out, inn = chan_peers[(src, "s", c)], chan_peers[(dst, "r", c)]
        return ((dst in out or len(out) < rt.max_tbs_per_channel)
                and (src in inn or len(inn) < rt.max_tbs_per_channel))
    busy: set[tuple[int, int, int, int]] = set()
    partner_recv: dict[tuple[int, int, int], int] = {}   # (rank, chan, recv peer) -> send peer
    partner_send: dict[tuple[int, int, int], int] = {}
    chan_of: dict[int, int] = {}

    # steps each (rank, direction, peer, channel) threadblock would get: a channel that is
    # full is skipped, so long schedules spread over more channels instead of one long tb
    load: dict[tuple[int, str, int, int], int] = defaultdict(int)
    cap = max(1, rt.max_steps_per_tb // 2)     # the rest is room for nops

    def tb_load(rank: int, way: str, peer: int, c: int) -> int:
        # a fused step ties a recv peer to a send peer: both directions share one tb
        if way == "s":
            other = partner_send.get((rank, c, peer))
            return load[(rank, "s", peer, c)] + (load[(rank, "r", other, c)]
                                                  if other is not None else 0)
        other = partner_recv.get((rank, c, peer))
        return load[(rank, "r", peer, c)] + (load[(rank, "s", other, c)]
                                              if other is not None else 0)

    def fits(chain: list[int], c: int, t: int) -> bool:
        for k in chain:
            if (ops[k].src, ops[k].dst, t, c) in busy:
                return False
            if not peer_fits(ops[k].src, ops[k].dst, c):
                return False
            if (tb_load(ops[k].src, "s", ops[k].dst, c) >= cap
                    or tb_load(ops[k].dst, "r", ops[k].src, c) >= cap):
                return False
        for a, b in pairwise(chain):
            x, pa, pb = ops[a].dst, ops[a].src, ops[b].dst
            if partner_recv.get((x, c, pa), pb) != pb or partner_send.get((x, c, pb), pa) != pa:
                return False
        return True

    work = deque(chains)
    placed: list[list[int]] = []
    while work:
        chain = work.popleft()
        t = ops[chain[0]].step
        to_try = channel_order(ops[chain[0]].src, ops[chain[0]].dst)
        c = next((c for c in to_try if fits(chain, c, t)), None)
        if c is None and len(chain) > 1:
            # no channel keeps the fused tbs consistent: send the hops separately
            for k in chain:
                nxt.pop(k, None)
                prev.pop(k, None)
            work.extendleft([k] for k in reversed(chain))
            continue
        if c is None:
            # every channel is taken or full: share the least loaded one (the global order
            # below still keeps it deadlock-free, or says why not)
            src, dst = ops[chain[0]].src, ops[chain[0]].dst
            room = [cc for cc in channel_order(src, dst) if peer_fits(src, dst, cc)]
            if not room:
                raise LimitError(
                    f"GPU {src} -> GPU {dst}: every one of the {limit} channels already holds "
                    f"{rt.max_tbs_per_channel} peers of one of them "
                    f"({rt.limit('tbs_per_channel').cite()}); use more channels")
            free = [cc for cc in room if (src, dst, t, cc) not in busy] or room
            c = min(free, key=lambda cc: load[(src, "s", dst, cc)])
        for k in chain:
            chan_peers[(ops[k].src, "s", c)].add(ops[k].dst)
            chan_peers[(ops[k].dst, "r", c)].add(ops[k].src)
            busy.add((ops[k].src, ops[k].dst, t, c))
            load[(ops[k].src, "s", ops[k].dst, c)] += 1
            load[(ops[k].dst, "r", ops[k].src, c)] += 1
            chan_of[k] = c
        for a, b in pairwise(chain):
            x, pa, pb = ops[a].dst, ops[a].src, ops[b].dst
            partner_recv[(x, c, pa)] = pb
            partner_send[(x, c, pb)] = pa
        placed.append(chain)

    # instructions
    instrs: list[Instr] = []
    edges: dict[int, set[int]] = defaultdict(set)
    access: dict[tuple[int, int, int], list[tuple[tuple, int, bool]]] = defaultdict(list)

    def add(instr: Instr) -> int:
        instr.uid = len(instrs)
        instrs.append(instr)
        return instr.uid

    def touch(i: int, rank: int, buf: Buf, lo: int, hi: int, when: tuple, write: bool) -> None:
        for u in range(lo, hi):
            access[(rank, int(buf), u)].append((when, i, write))

    n_fused = 0
    conn_msgs: dict[tuple[int, int, int], list[tuple[tuple, int, int]]] = defaultdict(list)
    for chain in placed:
        t = ops[chain[0]].step
        c = chan_of[chain[0]]
        first = ops[chain[0]]
        s = add(Instr(first.src, "s", first.sb, first.so, first.db, first.do, first.cnt,
                      (t, 0, chain[0]), send=first.dst, chan=c))
        touch(s, first.src, first.sb, first.so, first.so + first.cnt, (t, 0, chain[0]), False)
        sender = s
        for h, k in enumerate(chain):
            op = ops[k]
            last = h == len(chain) - 1
            reduce = op.kind is OpKind.REDUCE
            if last:
                typ = "rrc" if reduce else "r"
                i = add(Instr(op.dst, typ, op.db if reduce else op.sb, op.do if reduce else op.so,
                              op.db, op.do, op.cnt, (t, 1, k), recv=op.src, chan=c))
            else:
                n_fused += 1
                out = ops[chain[h + 1]]
                if reduce and acc is not None and _dead_after(acc, op, (k, chain[h + 1])):
                    typ = "rrs"
                    i = add(Instr(op.dst, typ, op.db, op.do, out.db, out.do, op.cnt, (t, 1, k),
                                  recv=op.src, send=out.dst, chan=c))
                else:
                    typ = "rrcs" if reduce else "rcs"
                    i = add(Instr(op.dst, typ, op.db, op.do, op.db, op.do, op.cnt, (t, 1, k),
                                  recv=op.src, send=out.dst, chan=c))
            when = (t, 1, k)
            if typ != "rrs":
                touch(i, op.dst, op.db, op.do, op.do + op.cnt, when, True)
            if reduce:
                touch(i, op.dst, op.db, op.do, op.do + op.cnt, when, False)
            edges[sender].add(i)
            conn_msgs[(op.src, op.dst, c)].append(((ops[chain[0]].step, k), sender, i))
            sender = i
    for k, op in enumerate(ops):
        if op.src == op.dst:
            typ = "re" if op.kind is OpKind.REDUCE else "cpy"
            i = add(Instr(op.src, typ, op.sb, op.so, op.db, op.do, op.cnt, (op.step, 1, k)))
            touch(i, op.src, op.sb, op.so, op.so + op.cnt, (op.step, 0, k), False)
            touch(i, op.dst, op.db, op.do, op.do + op.cnt, (op.step, 1, k), True)
            if op.kind is OpKind.REDUCE:
                touch(i, op.dst, op.db, op.do, op.do + op.cnt, (op.step, 1, k), False)

    # FIFO capacity: a connection's next send waits (in the global order) for the previous
    # message's receive
    for msgs in conn_msgs.values():
        msgs.sort()
        for (_, _, r_prev), (_, s_next, _) in pairwise(msgs):
            edges[r_prev].add(s_next)
    # data hazards per unit, in IR order (reads of a step before its writes)
    hazard: dict[int, set[int]] = defaultdict(set)
    for lst in access.values():
        lst.sort(key=lambda a: (a[0][0], a[0][1], not a[2], a[0][2]))
        last_write: int | None = None
        reads: list[int] = []
        for _, i, write in lst:
            if write:
                for j in reads + ([last_write] if last_write is not None else []):
                    if j != i:
                        hazard[i].add(j)
                last_write, reads = i, []
            else:
                if last_write is not None and last_write != i:
                    hazard[i].add(last_write)
                reads.append(i)
    for i, preds in hazard.items():
        for j in preds:
            edges[j].add(i)

    # global order: Kahn's algorithm, ties by IR step
    indeg = [0] * len(instrs)
    for j, succ in edges.items():
        for i in succ:
            indeg[i] += 1
    heap = [(instrs[i].key, i) for i in range(len(instrs)) if indeg[i] == 0]
    heapq.heapify(heap)
    order: list[int] = []
    while heap:
        _, j = heapq.heappop(heap)
        instrs[j].pos = len(order)
        order.append(j)
        for i in edges.get(j, ()):
            indeg[i] -= 1
            if indeg[i] == 0:
                heapq.heappush(heap, (instrs[i].key, i))
    if len(order) != len(instrs):
        raise ScheduleError("the schedule's messages and buffer hazards form a cycle that no "
                            "MSCCL threadblock order can serve (a pair of ranks exchanging "
                            "the same slots over one channel in one step); lower it with "
                            "more channels or without fusion")

    # threadblocks: union of (direction, peer, chan) keys per rank, joined by fused steps
    parent: dict[tuple, tuple] = {}

    def root(k: tuple) -> tuple:
        parent.setdefault(k, k)
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    def keys_of(ins: Instr) -> list[tuple]:
        keys = []
        if ins.send is not None:
            keys.append((ins.rank, "s", ins.send, ins.chan))
        if ins.recv is not None:
            keys.append((ins.rank, "r", ins.recv, ins.chan))
        return keys

    for ins in instrs:
        ks = keys_of(ins)
        for k in ks[1:]:
            parent[root(k)] = root(ks[0])
    if pair:
        _pair_streams(instrs, parent, root, keys_of, rt)
    tbs: list[list[Threadblock]] = [[] for _ in range(us.n)]
    tb_of_root: dict[tuple, Threadblock] = {}
    # local copies and reductions: as few local tbs as the step limit allows (with room for
    # nops); an op joins the tb of the op it waits on, so chains stay in one tb
    n_local: dict[int, int] = defaultdict(int)
    for ins in instrs:
        if ins.send is None and ins.recv is None:
            n_local[ins.rank] += 1
    cap = max(1, rt.max_steps_per_tb * 3 // 4)
    local_pool: dict[int, list[Threadblock]] = defaultdict(list)
    local_tb: dict[int, Threadblock] = {}
    for j in order:
        ins = instrs[j]
        if ins.send is None and ins.recv is None:
            pool = local_pool[ins.rank]
            preds = sorted((instrs[p].pos, local_tb[p]) for p in hazard.get(ins.uid, ())
                           if p in local_tb and instrs[p].rank == ins.rank)
            tb = preds[-1][1] if preds and len(preds[-1][1].steps) < cap else None
            if tb is None and len(pool) < -(-n_local[ins.rank] // cap):
                tb = Threadblock(len(tbs[ins.rank]), -1, -1, 0)
                tbs[ins.rank].append(tb)
                pool.append(tb)
            if tb is None:
                tb = min(pool, key=lambda t: len(t.steps))
            local_tb[ins.uid] = tb
            tb.steps.append(ins)
            continue
        ks = keys_of(ins)
        tb = tb_of_root.get(root(ks[0]))
        if tb is None:
            tb = tb_of_root[root(ks[0])] = Threadblock(len(tbs[ins.rank]), -1, -1, ins.chan)
            tbs[ins.rank].append(tb)
        if ins.send is not None:
            if tb.send not in (-1, ins.send):
                raise ScheduleError(f"internal: threadblock on GPU {ins.rank} would send to "
                                    f"{tb.send} and {ins.send}")
            tb.send = ins.send
        if ins.recv is not None:
            if tb.recv not in (-1, ins.recv):
                raise ScheduleError(f"internal: threadblock on GPU {ins.rank} would receive "
                                    f"from {tb.recv} and {ins.recv}")
            tb.recv = ins.recv
        tb.steps.append(ins)
    _sort_tbs(tbs)

    # dependencies between tbs of one GPU
    for rank_tbs in tbs:
        for tb in rank_tbs:
            steps: list[Instr] = []
            waited: dict[int, int] = {}
            for ins in tb.steps:
                need: dict[int, int] = {}
                for p in (instrs[j] for j in hazard.get(ins.uid, ())):
                    if p.tb != ins.tb:
                        need[p.tb] = max(need.get(p.tb, -1), p.index)
                need = {t: s for t, s in need.items() if waited.get(t, -1) < s}
                for t, s in sorted(need.items())[:-1]:
                    nop = Instr(ins.rank, "nop", Buf.INPUT, -1, Buf.OUTPUT, -1, 0, ins.key,
                                tb=tb.id, chan=tb.chan, depid=t, deps=s)
                    steps.append(nop)
                for t, s in sorted(need.items())[-1:]:
                    ins.depid, ins.deps = t, s
                waited.update(need)
                steps.append(ins)
            tb.steps = steps
        # renumber, then map deps from pre-nop indices to final ones
        old_to_new: dict[tuple[int, int], int] = {}
        for tb in rank_tbs:
            for idx, ins in enumerate(tb.steps):
                if ins.type != "nop":
                    old_to_new[(tb.id, ins.index)] = idx
        for tb in rank_tbs:
            for idx, ins in enumerate(tb.steps):
                ins.index = idx
        for tb in rank_tbs:
            for ins in tb.steps:
                if ins.depid >= 0:
                    ins.deps = old_to_new[(ins.depid, ins.deps)]
                    rank_tbs[ins.depid].steps[ins.deps].hasdep = True
    _renumber_for_depids(tbs, rt)
    try:
        _check_limits(tbs, rt, us.n)
    except LimitError as err:
        err.channels = limit
        raise
    chans = {tb.chan for rank_tbs in tbs for tb in rank_tbs}
    return Lowered(tuple(tuple(t) for t in tbs), units, scratch,
                   max(chans) + 1 if chans else 1, n_fused)


def _pair_streams(instrs: list[Instr], parent: dict, root, keys_of, rt: Runtime) -> None:
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
        ks = keys_of(ins)
        if not ks:
            continue
        r = root(ks[0])
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
                    parent[root(r_key)] = root(s_key)
                    break


def _sort_tbs(tbs: list[list[Threadblock]]) -> None:
    """Steps of each tb in the global order; tb ids sorted by (send, recv, chan) so tbs that
    use the same link sit together, as msccl-tools does."""
    for rank_tbs in tbs:
        rank_tbs.sort(key=lambda tb: (tb.send, tb.recv, tb.chan))
        for new_id, tb in enumerate(rank_tbs):
            tb.id = new_id
            tb.steps.sort(key=lambda ins: ins.pos)
            for idx, ins in enumerate(tb.steps):
                ins.tb, ins.index = new_id, idx


def _renumber_for_depids(tbs: list[list[Threadblock]], rt: Runtime) -> None:
    """The runtimes store a dependency's threadblock id in an int8 (``dependentBid``), so a
    wait on threadblock 128 or above wraps to a negative id: give the threadblocks that are
    waited on the smallest ids (the order of the others is kept). Ids only name
    threadblocks, so renumbering changes nothing else."""
    for rank_tbs in tbs:
        waited = {ins.depid for tb in rank_tbs for ins in tb.steps if ins.depid >= 0}
        if not waited or max(waited) <= rt.max_depid:
            continue
        order = sorted(rank_tbs, key=lambda tb: (tb.id not in waited, tb.id))
        new_id = {tb.id: k for k, tb in enumerate(order)}
        for tb in rank_tbs:
            for ins in tb.steps:
                ins.tb = new_id[ins.tb]
                if ins.depid >= 0:
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
                if getattr(tb, way) >= 0:
                    per_chan[tb.chan].add(getattr(tb, way))
            worst = max(per_chan.items(), key=lambda kv: len(kv[1]), default=(0, set()))
            if len(worst[1]) > rt.max_tbs_per_channel:
                raise LimitError(f"GPU {r} has {len(worst[1])} {way} peers on channel "
                                 f"{worst[0]}; {rt.title} allows {rt.max_tbs_per_channel} "
                                 f"({rt.limit('tbs_per_channel').cite()})")
        for tb in rank_tbs:
            bad = next((ins for ins in tb.steps if ins.depid > rt.max_depid), None)
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
                raise LimitError(
                    f"GPU {r} threadblock {tb.id} (send {tb.send}, recv {tb.recv}, channel "
                    f"{tb.chan}) needs {len(tb.steps)} steps; {rt.title} allows "
                    f"{rt.max_steps_per_tb} per threadblock "
                    f"({rt.limit('steps_per_tb').cite()}). Use fewer chunks or steps, more "
                    "channels, or a runtime built with a larger MSCCL_MAX_NUM_STEPS")
