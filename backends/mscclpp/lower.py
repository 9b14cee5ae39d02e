"""Lowering a schedule's two-sided moves into MSCCL++'s one-sided operations.

A cclc op moves chunks of one rank's buffer into another's at a step; MSCCL++ has only the
sender writing into the peer's memory (``put`` over a channel) and counting semaphores
(``signal``/``wait`` on the same channel) to say when. Each rank runs one program, in steps:

1. **credit waits**: before writing into peer ``p`` at step ``s``, wait for ``p``'s *credit*:
   ``p`` signals it once it has finished everything of its steps before ``s`` (its reads of
   the region about to be overwritten, its consumption of earlier staging, the earlier writers'
   data it waited for), then ``nop`` (one thread waited; every thread must know). This is the
   reverse direction MSCCL++'s own plans guard with a ``signal``/``wait`` pair before their
   first write;
2. **puts** of the step's remote moves, then ``nop`` (a block-wide barrier: every thread's
   stores are done before thread 0 signals);
3. **data signals** to every peer written to (on a port channel each put is a ``pwsf``: put,
   signal and flush, so the proxy has read the source before the program may change it; a
   ``flush`` op would not do: ``handleFlush`` counts its channels in ``nOutputs``, which only a
   ``dst_buff`` sets, and MSCCL++'s own DSL writes none);
4. **data waits** for every peer that writes into this rank at this step, then ``nop``;
5. **local work**: the schedule's local ops, and the *landings* of moves that went through
   staging (a copy, or a ``re`` that adds the staged data to its destination: a remote reduce
   is put into the receiver's scratch and summed there once), ordered so that every read of a
   region comes before the write that replaces it, with a ``nop`` between conflicting ones;
6. ``nop``, then **credits** for the next step to every peer that will write here.

A remote copy lands in its destination directly unless the receiver reads that region at the
same step (the IR's steps read the previous step's state; a one-sided write cannot wait for
that read), in which case it is staged too. Staging lives in scratch after the schedule's own
scratch chunks and is reused every step: the credit protocol orders its reuse.

Signals and waits on one channel are counted, not named, so both ends must agree on their
order: a rank sends ``p`` its credit for step ``s`` before its data of step ``s``, and ``p``
waits in that same order. Every signal has exactly one wait.

The rank's program is then cut into threadblocks of at most ``MAX_OPERATION`` operations, 16
channels and 16 remote buffers each (:data:`backends.mscclpp.limits.LIMITS`), run one after
another: block ``k`` ends with ``sem_release`` of device semaphore ``k`` and block ``k + 1``
starts with ``sem_acquire`` of it. With the LL protocol the steps are simpler (packets carry
their own flags; see :func:`lower`). ``get`` is not used: at the commit read, ``handleGet`` in
``execution_kernel.hpp`` reads the remote buffer at the local offset and writes the local buffer
at the remote one, right only when the two indices are equal.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from backends.mscclpp.limits import LIMITS
from backends.units import UnitFacts, UnitsTooLong, to_units, units_refusal
from cclc.errors import NotExpressible, ScheduleError
from cclc.ir import Buf, OpKind, Ops, Schedule

__all__ = ["BUF_LETTER", "Instr", "LoweredPlan", "Region", "channel_type", "chunk_refusal",
           "lower", "lowering_refusal", "switch_groups"]

#: MSCCL++'s buffer spellings (execution_plan.cc ``convertToBufferType``)
BUF_LETTER = {Buf.INPUT: "i", Buf.OUTPUT: "o", Buf.SCRATCH: "s"}

#: the most ops of a schedule this output lowers. The lowering and the two plans hold every
#: instruction as an object (6.5 KB of peak memory and 190 us per op: 262,144 ops of a 512-GPU
#: AllToAll added 1.7 GB and 50 s to its compile), and MSCCL++'s executor parses the whole
#: plan file, every GPU's part, on each rank (microsoft/mscclpp 1f5f065,
#: src/core/executor/execution_plan.cc, ``ExecutionPlan::Impl::loadExecutionPlan``:
#: ``json::parse(file)`` then ``gpus[rank]``), a file of 370 bytes per op. At this cap: about
#: 14 GB and 400 s here, and plans of 0.8 GB; the 4,096-GPU fabric's AllReduce (rail_halving,
#: 1,376,256 ops) fits (241 s, 10.9 GiB peak, plans of 0.45 GB), its AllToAll (16.7M) does not.
MAX_OPS = 1 << 21

#: the bytes of plan JSON per op of the schedule (each of the two files; measured as above)
PLAN_BYTES_PER_OP = 370

#: the lowering's peak memory per op of the schedule (measured as above)
LOWERING_BYTES_PER_OP = 6.5e3

#: the most chunks a buffer is cut into: a call's size must be a multiple of
#: ``buffer_alignment`` x chunks (execution_plan.cc ``checkMessageSize``), so more chunks make
#: the plan serve fewer sizes; beyond it a schedule's uneven chunks are made near-equal
MAX_UNITS = 4096


@dataclass(frozen=True, slots=True)
class Region:
    """Chunks ``index .. index + size - 1`` of one buffer (of the rank that runs the op, or of
    the peer a ``put`` writes to)."""

    buf: Buf
    index: int
    size: int

    def overlaps(self, other: Region) -> bool:
        return (self.buf == other.buf and self.index < other.index + other.size
                and other.index < self.index + self.size)


@dataclass(frozen=True, slots=True)
class Instr:
    """One MSCCL++ operation before channel and buffer ids are given: ``peers`` are the ranks
    at the other end of the channels it uses; a ``put``'s ``dst`` is in ``peers[0]``'s memory;
    ``semaphores`` are device semaphore ids (``sem_acquire``/``sem_release``)."""

    name: str
    channel: str | None = None
    peers: tuple[int, ...] = ()
    src: tuple[Region, ...] = ()
    dst: tuple[Region, ...] = ()
    semaphores: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class LoweredPlan:
    """Each rank's threadblocks (each a tuple of :class:`Instr`), the channel type of every
    pair of ranks that talk, the chunk counts of the plan (``staging_chunks``: the part of each
    rank's scratch that receives staged moves), the unit (elements per chunk at the compiled
    size; ``exact`` False when the schedule's near-equal chunks were made equal, see
    :func:`backends.units.to_units`), the buffer mode and the protocol."""

    threadblocks: tuple[tuple[tuple[Instr, ...], ...], ...]
    channels: dict[tuple[int, int], str]
    input_chunks: int
    output_chunks: int
    scratch_chunks: tuple[int, ...]
    staging_chunks: tuple[int, ...]
    unit: int
    exact: bool
    inplace: bool = False
    protocol: str = "Simple"


def channel_type(schedule: Schedule, src: int, dst: int) -> str:
    """``memory`` between GPUs of one server (NVLink or PCIe peer access), ``port`` otherwise
    (through MSCCL++'s proxy: the network, or a torus's point-to-point links, which are not
    GPU peer memory)."""
    topo = schedule.topology
    nodes = topo.node_of_rank
    group = schedule.collective.group
    if nodes is not None and nodes[group[src]] == nodes[group[dst]]:
        return "memory"
    return "port"


def switch_groups(schedule: Schedule) -> dict[int, tuple[int, ...]]:
    """Rank -> the ranks of its server that an NVLS multicast store reaches (itself
    included), for ranks on a node that declares ``multicast`` and shares it with another
    rank of the collective; empty when the machine has no multicast."""
    topo = schedule.topology
    nodes = topo.node_of_rank
    if not topo.multicast or nodes is None:
        return {}
    group = schedule.collective.group
    members: dict[int, list[int]] = defaultdict(list)
    for r, g in enumerate(group):
        members[int(nodes[g])].append(r)
    return {r: tuple(m) for m in members.values() if len(m) > 1 for r in m}


def lower(schedule: Schedule, inplace: bool = False, protocol: str = "Simple") -> LoweredPlan:
    """The MSCCL++ program of every rank of ``schedule`` (verified, uniform buffers).

    ``inplace``: for calls whose send and receive buffers overlap as NCCL defines in-place
    (one buffer; allgather's input is the rank's slice of its output, reducescatter's output
    the rank's slice of its input). Each rank first copies its input into scratch and the
    schedule reads that copy, so writes into the output never clobber input still to be read;
    no peer writes into a rank before the rank's first credit, sent after the copy.

    On a node that declares ``multicast`` (Simple protocol), a rank that copies one region
    into the same place on every GPU of its server at one step (itself included) does it with
    one ``gstore`` through a switch channel (NVLS multicast) instead of a put per peer,
    unless a member reads that place at the same step; the credits and data signals are those
    of the puts it replaces.

    ``protocol="LL"``: every remote move is written as LL packets (``ppkt``: data and a flag
    the reader spins on, so no signal or wait per step) into a scratch slot of its own for the
    whole call (a reused slot would hold packets with the same flag), then unpacked (``upkt``)
    or summed (``repkt``) by the receiver. The only synchronization left is one credit per
    pair at the start of a call (the peer finished its previous call). Memory channels only:
    a port channel's ``ppkt`` sends a source that is already packets.

    :class:`ScheduleError` names what MSCCL++ cannot run: a write into the input buffer, or a
    step whose local ops read and write each other's regions in a cycle.
    """
    units, facts = _in_units(schedule)
    n = units.n
    ops = units.ops
    channels = _channels(schedule, ops)
    own_scratch = np.count_nonzero(units.chunk_elems(Buf.SCRATCH), axis=1)
    snapshot = own_scratch.copy()
    if inplace:
        ops, own_scratch = _read_snapshot(ops, snapshot, units.n_chunks(Buf.INPUT))
    traffic = _Traffic.of(ops, channels)
    staging = [0] * n
    programs: list[list[Instr]] = [[] for _ in range(n)]
    if protocol not in ("Simple", "LL"):
        raise ScheduleError(f"MSCCL++ plans have the protocols Simple and LL, not {protocol}")
    if protocol == "LL" and "port" in channels.values():
        raise ScheduleError("LL plans use memory channels only (GPUs of one server): this "
                            "schedule crosses the network, where MSCCL++'s ppkt sends data "
                            "that is already packets (handlePutPackets); use the Simple "
                            "protocol")
    if inplace:
        size = units.n_chunks(Buf.INPUT)
        for r in range(n):
            programs[r] += [Instr("copy", src=(Region(Buf.INPUT, 0, size),),
                                  dst=(Region(Buf.SCRATCH, int(snapshot[r]), size),)),
                            Instr("nop")]
    if protocol == "LL":
        _packet_programs(ops, programs, own_scratch, staging, traffic, channels)
    else:
        _simple_programs(ops, programs, own_scratch, staging, traffic, channels,
                         switch_groups(schedule))
    tbs = tuple(_split(prog, r) for r, prog in enumerate(programs))
    return LoweredPlan(
        threadblocks=tbs, channels=channels, input_chunks=units.n_chunks(Buf.INPUT),
        output_chunks=units.n_chunks(Buf.OUTPUT),
        scratch_chunks=tuple(int(own_scratch[r]) + staging[r] for r in range(n)),
        staging_chunks=tuple(staging), unit=facts.unit, exact=facts.exact, inplace=inplace,
        protocol=protocol)


def _simple_programs(ops: Ops, programs: list[list[Instr]], own_scratch: np.ndarray,
                     staging: list[int], traffic: _Traffic,
                     channels: dict[tuple[int, int], str],
                     switch: dict[int, tuple[int, ...]]) -> None:
    """Each rank's steps with puts, credits and data signals (the module docstring)."""
    n = len(programs)
    for r in range(n):
        # credits for step 0: nothing happened yet, but the writer must not start before
        # this rank's previous call of the plan is done with its buffers
        programs[r] += _signals(sorted(traffic.writers[0][r]), r, channels)
    by_step = _by_step(ops)
    moves = _moves(ops)
    for s in range(ops.n_steps):
        rows = by_step.get(s, [])
        per_rank = _step_moves(moves, rows, own_scratch, staging, channels, switch)
        for r in range(n):
            programs[r] += _rank_step(r, s, per_rank.get(r, ([], [], [])), traffic, channels)


def _packet_programs(ops: Ops, programs: list[list[Instr]], own_scratch: np.ndarray,
                     staging: list[int], traffic: _Traffic,
                     channels: dict[tuple[int, int], str]) -> None:
    """Each rank's steps with LL packets: one slot per remote move, one credit per pair."""
    n = len(programs)
    writers_ever: list[set[int]] = [set() for _ in range(n)]
    for s in range(ops.n_steps):
        for d, peers in traffic.writers[s].items():
            writers_ever[d] |= peers
    for r in range(n):
        # the call's only credit: this rank finished its previous call
        programs[r] += _signals(sorted(writers_ever[r]), r, channels)
    written: list[set[int]] = [set() for _ in range(n)]
    by_step = _by_step(ops)
    moves = _moves(ops)
    for s in range(ops.n_steps):
        rows = by_step.get(s, [])
        for r, (puts, landings, local) in _packet_moves(moves, rows, own_scratch,
                                                        staging).items():
            prog = programs[r]
            first = sorted({p for op in puts for p in op.peers} - written[r])
            written[r] |= set(first)
            prog += _fenced(_waits(first, r, channels))
            prog += _fenced(puts)
            prog += _fenced(_ordered(local + landings, r, s))


def _packet_moves(moves: list[_Move], rows: list[int], own_scratch: np.ndarray,
                  staging: list[int]) -> dict[int, _Moves]:
    """Per rank at one step: its ``ppkt`` puts, its landings (``upkt`` or ``repkt``) and its
    local ops; ``staging[d]`` counts the slots rank ``d`` has handed out in this call."""
    out: dict[int, _Moves] = defaultdict(lambda: ([], [], []))
    for i in rows:
        a, b, src, dst, reduce = moves[i]
        if a == b:
            out[a][2].append(_combine(reduce, src, dst))
            continue
        slot = Region(Buf.SCRATCH, int(own_scratch[b]) + staging[b], src.size)
        staging[b] += src.size
        out[a][0].append(Instr("ppkt", "memory", (b,), (src,), (slot,)))
        out[b][1].append(_combine(reduce, slot, dst, packets=True))
    return out


_Move = tuple[int, int, Region, Region, bool]


def _moves(ops: Ops) -> list[_Move]:
    """Every op as (sender, receiver, source region, destination region, reduces), read from
    the columns once (indexing numpy arrays op by op costs more than the lowering itself)."""
    bufs = {int(b): b for b in Buf}
    return [(a, b, Region(bufs[sb], so, c), Region(bufs[db], do, c), k == OpKind.REDUCE)
            for a, b, sb, so, db, do, c, k in zip(
                ops.src.tolist(), ops.dst.tolist(), ops.src_buf.tolist(), ops.src_off.tolist(),
                ops.dst_buf.tolist(), ops.dst_off.tolist(), ops.count.tolist(),
                ops.kind.tolist(), strict=True)]


def _combine(reduce: bool, src: Region, dst: Region, packets: bool = False) -> Instr:
    """The local op that puts ``src`` into ``dst``: a copy, or a reduce that sums ``src`` into
    ``dst`` once (``upkt``/``repkt`` when ``src`` holds LL packets)."""
    if reduce:
        return Instr("repkt" if packets else "re", src=(dst, src), dst=(dst,))
    return Instr("upkt" if packets else "copy", src=(src,), dst=(dst,))


def _in_units(schedule: Schedule) -> tuple[Schedule, UnitFacts]:
    """The schedule in equal chunks (MSCCL++'s), or why it has none."""
    if bool((schedule.ops.dst_buf == Buf.INPUT).any()):
        raise ScheduleError("the schedule writes its input buffer; an MSCCL++ plan must leave "
                            "the caller's send buffer as it was (out-of-place)")
    totals = schedule.chunk_starts(Buf.INPUT)[:, -1]
    if (totals != totals[0]).any():
        # the loader computes a peer's offsets from its own call's size, so every rank must
        # cut its buffers alike; src/ext/nccl/nccl.cc answers ncclAllToAllv "currently
        # unavailable"
        raise NotExpressible(
            f"the ranks send different amounts ({int(totals.min())} to {int(totals.max())} "
            "elements: a non-uniform alltoall); an MSCCL++ plan takes one buffer size on "
            "every rank and MSCCL++ has no alltoallv: use the NCCL library (--emit nccl), "
            "which pads every rank's buffers to the largest")
    try:
        units, facts = to_units(schedule, max_units=MAX_UNITS)
    except UnitsTooLong as err:
        raise ScheduleError(_too_many_chunks(err.message)) from None
    longest = max(units.n_chunks(Buf.INPUT), units.n_chunks(Buf.OUTPUT))
    if longest > MAX_UNITS:
        raise ScheduleError(_too_many_chunks(
            f"this schedule's buffers need {longest} equal chunks"))
    return units, facts


def _channels(schedule: Schedule, ops: Ops) -> dict[tuple[int, int], str]:
    """The channel type of every pair of ranks that talk (both directions: credits flow back)."""
    channels: dict[tuple[int, int], str] = {}
    remote = ops.src != ops.dst
    for a, b in {(int(x), int(y)) for x, y in zip(ops.src[remote], ops.dst[remote],
                                                    strict=True)}:
        channels[(a, b)] = channels[(b, a)] = channel_type(schedule, a, b)
    return channels


@dataclass(frozen=True, slots=True)
class _Traffic:
    """Who writes whom at each step: ``writers[s][d]`` the peers writing into ``d``,
    ``targets[s][r]`` the peers ``r`` writes into, ``port_puts[s][d][p]`` how many puts ``p``
    makes into ``d`` over a port channel (each signals once). One step past the last is empty."""

    writers: list
    targets: list
    port_puts: list

    @classmethod
    def of(cls, ops: Ops, channels: dict[tuple[int, int], str]) -> _Traffic:
        steps = ops.n_steps + 1
        writers: list = [defaultdict(set) for _ in range(steps)]
        targets: list = [defaultdict(set) for _ in range(steps)]
        port_puts: list = [defaultdict(lambda: defaultdict(int)) for _ in range(steps)]
        for i in np.flatnonzero(ops.src != ops.dst):
            s, a, b = int(ops.step[i]), int(ops.src[i]), int(ops.dst[i])
            if channels[(a, b)] == "port":
                port_puts[s][b][a] += 1
            writers[s][b].add(a)
            targets[s][a].add(b)
        return cls(writers, targets, port_puts)


def _rank_step(r: int, s: int, moves: tuple[list[Instr], list[Instr], list[Instr]],
               traffic: _Traffic, channels: dict[tuple[int, int], str]) -> list[Instr]:
    """Rank ``r``'s program for step ``s`` (the numbered phases of the module docstring)."""
    puts, landings, local = moves
    prog: list[Instr] = []
    credits = _waits(sorted(traffic.targets[s][r]), r, channels)
    # one thread per channel waited: every thread must know before it puts
    prog += _fenced(credits)
    prog += _fenced(puts)
    # a port channel's put is a ``pwsf`` (put, signal, flush: the proxy has read the source
    # when it returns) and signals by itself; a memory channel's puts are done when every
    # thread passed the nop, then one signal per peer says so
    memory = [p for p in sorted(traffic.targets[s][r]) if channels[(r, p)] == "memory"]
    prog += _signals(memory, r, channels)
    incoming = sorted(traffic.writers[s][r])
    waits = _waits([p for p in incoming if channels[(r, p)] == "memory"], r, channels)
    for p, k in sorted(traffic.port_puts[s][r].items()):
        waits += [Instr("wait", "port", (p,))] * k
    prog += _fenced(waits)
    prog += _fenced(_ordered(local + landings, r, s))
    prog += _signals(sorted(traffic.writers[s + 1][r]), r, channels)
    return prog


def lowering_refusal(schedule: Schedule) -> str | None:
    """Why :func:`lower` (Simple, out-of-place) would refuse ``schedule``, without building
    its programs: its refusals are the equal-chunk ones of :func:`_in_units` and a step whose
    local ops read and write each other's regions in a cycle, and the landings it adds to a
    step cannot join a cycle (they read staging that no local op writes)."""
    try:
        units, _ = _in_units(schedule)
        moves = _moves(units.ops)
        for s, rows in _by_step(units.ops).items():
            local: dict[int, list[Instr]] = defaultdict(list)
            for i in rows:
                a, b, src, dst, reduce = moves[i]
                if a == b:
                    local[a].append(_combine(reduce, src, dst))
            for r, work in local.items():
                _ordered(work, r, s)
    except ScheduleError as err:
        return err.message
    return None


def size_refusal(schedule: Schedule) -> str | None:
    """Why the schedule is too large for this output (:data:`MAX_OPS`), or None: checked
    before anything is lowered, since the lowering of an oversized schedule is what would
    run away."""
    n = len(schedule.ops)
    if n <= MAX_OPS:
        return None
    return (f"its {n:,} ops are over the {MAX_OPS:,} cclc lowers into an MSCCL++ plan: each "
            f"plan would be about {n * PLAN_BYTES_PER_OP / 1e9:.1f} GB of JSON, which "
            "MSCCL++'s executor parses whole on every rank (execution_plan.cc "
            "loadExecutionPlan), and lowering it would take about "
            f"{n * LOWERING_BYTES_PER_OP / 1e9:.0f} GB here; --emit json or nccl write this "
            "schedule")


def chunk_refusal(schedule: Schedule) -> str | None:
    """Why the schedule's chunks cannot be MSCCL++ chunks (cheap: nothing is built), or
    None."""
    why = units_refusal(schedule, MAX_UNITS)
    return None if why is None else _too_many_chunks(why)


def _too_many_chunks(why: str) -> str:
    # the units pass words its refusal for MSCCL, whose chunks are equal too
    return ("MSCCL++ cuts every buffer into equal chunks (execution_plan.cc getOffset): "
            + why.split(": ", 1)[-1] + f"; cclc keeps plans to {MAX_UNITS} chunks per buffer so "
            "that they serve sizes of 16 B x chunks")


def _read_snapshot(ops: Ops, snapshot: np.ndarray, input_chunks: int
                   ) -> tuple[Ops, np.ndarray]:
    """``ops`` reading the copy of each rank's input at scratch chunk ``snapshot[rank]``
    instead of the input, and each rank's scratch grown by the copy."""
    cols = ops.columns()
    reads_input = ops.src_buf == Buf.INPUT
    cols["src_buf"] = np.where(reads_input, int(Buf.SCRATCH), ops.src_buf)
    cols["src_off"] = np.where(reads_input, ops.src_off + snapshot[ops.src], ops.src_off)
    return Ops(**cols), snapshot + input_chunks


def _by_step(ops) -> dict[int, list[int]]:
    """Step -> the rows of its ops, in order."""
    order = np.argsort(ops.step, kind="stable")
    steps = ops.step[order]
    cuts = np.flatnonzero(np.diff(steps)) + 1
    return ({int(steps[g[0]]): g.tolist() for g in np.split(order, cuts) if len(g)}
            if len(order) else {})


_Moves = tuple[list[Instr], list[Instr], list[Instr]]


def _step_moves(moves: list[_Move], rows: list[int], own_scratch: np.ndarray,
                staging: list[int], channels: dict[tuple[int, int], str],
                switch: dict[int, tuple[int, ...]] | None = None) -> dict[int, _Moves]:
    """Per rank, the puts (and multicast stores) it issues, the landings it runs and its
    local ops at one step; ``staging[d]`` grows to the most staged chunks rank ``d`` receives
    at any step."""
    reads: dict[int, _Regions] = defaultdict(_Regions)
    for i in rows:
        a, b, src, dst, reduce = moves[i]
        reads[a].add(src)
        if reduce and a == b:
            reads[b].add(dst)
    out: dict[int, _Moves] = defaultdict(lambda: ([], [], []))
    switch = switch or {}
    stored = _multicast_stores(moves, rows, reads, switch)
    done: set[tuple] = set()
    used: defaultdict[int, int] = defaultdict(int)
    for i in rows:
        a, b, src, dst, reduce = moves[i]
        if (a, src, dst) in stored:
            if (a, src, dst) not in done:
                done.add((a, src, dst))
                out[a][0].append(Instr("gstore", "switch", switch[a], (src,), (dst,)))
            continue
        if a == b:
            out[a][2].append(_combine(reduce, src, dst))
            continue
        put = "put" if channels[(a, b)] == "memory" else "pwsf"
        if reduce or reads[b].meets(dst):
            land = Region(Buf.SCRATCH, int(own_scratch[b]) + used[b], src.size)
            used[b] += src.size
            out[a][0].append(Instr(put, channels[(a, b)], (b,), (src,), (land,)))
            out[b][1].append(_combine(reduce, land, dst))
        else:
            out[a][0].append(Instr(put, channels[(a, b)], (b,), (src,), (dst,)))
    for b, k in used.items():
        staging[b] = max(staging[b], k)
    return out


def _multicast_stores(moves: list[_Move], rows: list[int], reads: dict[int, _Regions],
                      switch: dict[int, tuple[int, ...]]) -> set[tuple]:
    """The copies at one step that become one ``gstore`` each, as (sender, source,
    destination): a sender that copies a source into the same destination on every member of
    its multicast group, itself included (or every other member, when the destination is the
    source itself: the store rewrites the sender's own copy with the same values), where no
    other op of the step reads the destination on a member."""
    if not switch:
        return set()
    receivers: dict[tuple, set[int]] = defaultdict(set)
    for i in rows:
        a, b, src, dst, reduce = moves[i]
        if not reduce and a in switch and b in switch[a]:
            receivers[(a, src, dst)].add(b)
    out = set()
    for (a, src, dst), got in receivers.items():
        group = set(switch[a])
        if got == group:
            readers = group
        elif src == dst and got == group - {a}:
            readers = got  # the sender reads its own region to store it
        else:
            continue
        if not any(reads[m].meets(dst) for m in readers):
            out.add((a, src, dst))
    return out


class _Regions:
    """A set of regions that answers "does this region meet any of them?" by bisection."""

    __slots__ = ("_spans", "_sorted")

    def __init__(self) -> None:
        self._spans: dict[Buf, list[tuple[int, int]]] = defaultdict(list)
        self._sorted: dict[Buf, tuple[list[int], list[int]]] = {}

    def add(self, region: Region) -> None:
        self._spans[region.buf].append((region.index, region.index + region.size))
        self._sorted.pop(region.buf, None)

    def disjoint(self) -> bool:
        """Whether no two of the regions overlap."""
        for spans in self._spans.values():
            spans.sort()
            if any(spans[k][0] < spans[k - 1][1] for k in range(1, len(spans))):
                return False
        return True

    def meets(self, region: Region) -> bool:
        if region.buf not in self._spans:
            return False
        if region.buf not in self._sorted:
            # merged into disjoint spans: then starts and ends are both sorted
            merged: list[list[int]] = []
            for lo, hi in sorted(self._spans[region.buf]):
                if merged and lo <= merged[-1][1]:
                    merged[-1][1] = max(merged[-1][1], hi)
                else:
                    merged.append([lo, hi])
            self._sorted[region.buf] = ([m[0] for m in merged], [m[1] for m in merged])
        starts, ends = self._sorted[region.buf]
        k = bisect_right(ends, region.index)
        return k < len(starts) and starts[k] < region.index + region.size


def _fenced(ops: list[Instr]) -> list[Instr]:
    """``ops`` and a ``nop`` after them (a block-wide barrier: what one thread waited for or
    every thread wrote is known to all before the next op), or nothing when there are none."""
    return [*ops, Instr("nop")] if ops else []


def _signals(peers: list[int], rank: int, channels) -> list[Instr]:
    return _per_channel("signal", peers, rank, channels)


def _waits(peers: list[int], rank: int, channels) -> list[Instr]:
    return _per_channel("wait", peers, rank, channels)


def _per_channel(name: str, peers: list[int], rank: int, channels) -> list[Instr]:
    """One op per channel type and per ``MAX_CHANNEL_PER_OPERATION`` peers."""
    out = []
    per_op = LIMITS["channels_per_op"].value
    for kind in ("memory", "port"):
        mine = tuple(p for p in peers if channels[(rank, p)] == kind)
        for k in range(0, len(mine), per_op):
            out.append(Instr(name, kind, mine[k:k + per_op]))
    return out


def _ordered(work: list[Instr], rank: int, step: int) -> list[Instr]:
    """``work`` ordered so that an op reading a region runs before the op that overwrites it
    (a step reads the state the previous step left), with a ``nop`` between ops that touch
    one region (different threads run them)."""
    if len(work) <= 1 or _independent(work):
        return list(work)
    n = len(work)
    # before[j] holds the ops that must run before j: those reading what j writes
    before = [[i for i in range(n) if i != j
               and any(w.overlaps(x) for w in work[j].dst for x in work[i].src)] for j in range(n)]
    done: list[int] = []
    left = set(range(n))
    while left:
        ready = [j for j in sorted(left) if all(i not in left for i in before[j])]
        if not ready:
            raise ScheduleError(f"step {step}: rank {rank}'s local ops read and write each "
                                "other's chunks in a cycle (a swap); MSCCL++ runs them one "
                                "after another, so this step has no order that keeps its "
                                "meaning")
        done += ready
        left -= set(ready)
    out: list[Instr] = []
    since: list[Instr] = []
    for j in done:
        op = work[j]
        if any(_conflict(op, prev) for prev in since):
            out.append(Instr("nop"))
            since = []
        out.append(op)
        since.append(op)
    return out


def _independent(work: list[Instr]) -> bool:
    """Whether no op writes a region another op reads or writes (then any order is right and
    no ``nop`` is needed): the usual step, found without comparing every pair."""
    written = _Regions()
    for op in work:
        for w in op.dst:
            written.add(w)
    if not written.disjoint():
        return False
    for op in work:
        own = op.dst[0] if op.dst else None
        for x in op.src:
            # a reduce reads its own destination; only another op's write conflicts
            if x != own and written.meets(x):
                return False
    return True


def _conflict(a: Instr, b: Instr) -> bool:
    return (any(w.overlaps(x) for w in a.dst for x in b.src + b.dst)
            or any(w.overlaps(x) for w in b.dst for x in a.src))


def _split(program: list[Instr], rank: int) -> tuple[tuple[Instr, ...], ...]:
    """Cut one rank's program into threadblocks run one after another (chained by device
    semaphores), each inside the per-threadblock limits."""
    max_ops = LIMITS["ops_per_tb"].value
    max_channels = LIMITS["channels_per_tb"].value
    max_buffers = LIMITS["remote_buffers_per_tb"].value
    # a cut costs "nop, sem_release" at the end and "sem_acquire, nop" at the start
    room = max_ops - 4
    blocks: list[list[Instr]] = []
    cur: list[Instr] = []
    # per channel type, the peers and the remote (peer, buffer)s the current block holds
    chans: dict[str, set] = defaultdict(set)
    bufs: dict[str, set] = defaultdict(set)
    for op in program:
        kind, peers, remote = _held_by(op)
        if cur and (len(cur) >= room or kind is not None and (
                len(chans[kind] | peers) > max_channels
                or len(bufs[kind] | remote) > max_buffers)):
            blocks.append(cur)
            cur = []
            chans.clear()
            bufs.clear()
        cur.append(op)
        if kind is not None:
            chans[kind] |= peers
            bufs[kind] |= remote
    if cur or not blocks:
        blocks.append(cur)
    out = []
    for k, block in enumerate(blocks):
        body = list(block)
        if k > 0:
            body = [Instr("sem_acquire", semaphores=(k - 1,)), Instr("nop")] + body
        if k < len(blocks) - 1:
            body = body + [Instr("nop"), Instr("sem_release", semaphores=(k,))]
        out.append(tuple(body))
    return tuple(out)


def _held_by(op: Instr) -> tuple[str | None, set, set]:
    """The channel type an op uses, the peers it needs channels to and the remote buffers
    (peer, buffer) it writes: what a threadblock must hold for it."""
    if op.channel is None or not op.peers:
        return None, set(), set()
    if op.channel == "switch":
        # one switch channel per multicast group and buffer
        return op.channel, {(op.peers, op.dst[0].buf)}, set()
    remote = ({(op.peers[0], d.buf) for d in op.dst} if op.name in ("put", "pwsf", "ppkt")
              else set())
    return op.channel, set(op.peers), remote
