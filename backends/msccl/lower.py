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
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from backends.msccl.channels import Channels, assign_channels
from backends.msccl.fusion import Accesses, chains, fuse
from backends.msccl.instructions import Program, global_order, instructions
from backends.msccl.runtimes import Runtime
from backends.msccl.steps import (
    DepidLimitError,
    Instr,
    LimitError,
    Lowered,
    Op,
    StepLimitError,
    Threadblock,
    ThreadblockLimitError,
    assigned,
)
from backends.msccl.threadblocks import LOCAL_SHARES, dependencies, threadblocks
from backends.units import UnitFacts, UnitsTooLong, buffer_units, rank_units, to_units, writes_input
from cclc.ir import Buf, OpKind, Schedule

__all__ = ["Channels", "DepidLimitError", "Instr", "LimitError", "Lowered", "Op",
           "Program", "Threadblock", "ThreadblockLimitError", "assign_channels",
           "check_chunks", "chunks_limit_message", "counted_refusal", "dependencies",
           "fuse", "global_order", "instructions", "lower", "lower_to_fit",
           "relocate_input", "threadblocks"]


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
    send-only and receive-only streams; ``local_share``: the share of the step limit a local
    threadblock is filled to (both: see :func:`backends.msccl.threadblocks.threadblocks`).
    The stages of the module docstring, in order, except that the threadblocks (4) take their
    steps in the global order (5)."""
    _quick_limits(us, rt)
    ops, units, scratch = relocate_input(us, rt.max_cnt)
    acc = Accesses(ops) if fuse_ops else None
    nxt = fuse(ops, acc) if acc is not None else {}
    channels = assign_channels(ops, chains(ops, nxt), rt, nchannels, us.n)
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
                ins.tb = new_id[assigned(ins.tb)]
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
