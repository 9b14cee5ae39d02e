"""An independent executor of MSCCL++ execution plans, for tests: it catches lowering bugs.

It reads nothing but the plan's JSON and runs it the way MSCCL++'s loader and kernel do
(microsoft/mscclpp at 1f5f065d7b13ab02df32c22568f38785d1eeec01: byte offsets from
``ExecutionPlan::Impl::getOffset``/``calcOffset`` in ``src/core/executor/execution_plan.cc``,
each op as its handler in ``src/core/include/execution_kernel.hpp`` does it):

* every threadblock (tb) of every GPU runs its ops in order, interleaved at random with the
  others (one op at a time, ``seed`` chooses the interleaving);
* a data op is done by all the tb's threads; ``signal``/``wait``/``flush``/``sem_*`` by one
  thread each. So an op's accesses are ordered after the tb's earlier ops only across a
  ``nop`` (``__syncthreads``) or a ``barrier``, and a signal carries what its tb knew at its last
  ``nop``: a missing ``nop`` between a put and its signal, or between a wait and the read it
  guards, is a race;
* memory-channel signals and waits are counting semaphores (``wait`` raises the channel's
  expected count by one and waits until the peer's signals reach it) that order data;
  ``rlxsignal``/``rlxwait`` count without ordering;
* a port-channel ``put``/``pws``/``pwsf``/``signal`` goes to a proxy, one FIFO per channel,
  that runs later (reading the source then); ``pwsf`` and ``flush`` wait for the FIFO to drain
  (``flush`` drains the first ``nOutputs`` channels, as ``handleFlush`` does);
* ``sem_release``/``sem_acquire`` are the device's counting semaphores; ``barrier`` waits for
  ``num_threadblocks`` tbs.

Vector clocks find every pair of conflicting accesses to memory (a read and a write, or two
writes) that no signal/wait, semaphore, barrier or ``nop`` orders, even when this interleaving
happened to get them right. A run fails on a race, a deadlock (no tb can move), a signal no wait
consumed or a device semaphore left changed (both would break the plan's next call), a plan the
loader or executor refuses (op names, ``MAX_OPERATION``, zero chunks, message size), and a
result that differs from the collective's postcondition computed here with numpy (sum, copies,
transposes), on in-place and out-of-place plans alike; an out-of-place plan must leave its input
as it was.

* a ``pipeline`` runs its inner ops once per iteration on the iteration's slice of every region
  (:func:`backends.mscclpp.loader.load_ops`); an iteration that starts past an op's region is
  an error (``handlePipeline``'s uint32 ``size - offset`` would wrap and the op run past it);
* a ``switch`` channel is an NVLS multicast object over its group's buffers of one type:
  ``glres`` (``handleMultiLoadReduceStore``) sums the source region of every member and stores
  the sum into the destination region of every member of its destination channel, ``gstore``
  (``handleMultiStore``) stores a local region into every member; each member's element is
  an access with the race checks above. A member that does not declare the group is refused
  (:func:`backends.mscclpp.loader.switch_channels`).

LL packet ops other than ``ppkt``/``upkt``/``repkt`` are not modelled: such a plan is refused
with :class:`Unsupported`.

Run ``python -m backends.mscclpp.executor PLAN.json [--seeds 5]`` for a one-line verdict.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from backends.mscclpp.loader import (
    CallSizes,
    PlanError,
    SwitchGroup,
    Unsupported,
    expected_outputs,
    load_channels,
    load_ops,
    switch_channels,
)

__all__ = ["PlanError", "Unsupported", "execute", "run"]

_ELEM = 4  # bytes of the float32 elements the executor moves


@dataclass
class _Actor:
    """A threadblock, or the proxy of one port channel."""

    index: int
    name: str
    ops: list = field(default_factory=list)
    windows: list = field(default_factory=list)
    """per op: the pipeline iteration's (offset, unit) in bytes, or None"""
    pc: int = 0
    clock: int = 0
    known: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int32))
    """the vector clock every thread of the tb holds"""
    pending: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int32))
    """what some thread learnt since the last nop"""
    waiting: Any = None                  # state of a blocking op in progress
    fifo: list = field(default_factory=list)
    rank: int = 0
    tb: int = 0
    chans: dict = field(default_factory=dict)  # channel type -> GPU channel id per tb index
    refs: dict = field(default_factory=dict)   # channel type -> (rank, buffer) per buffer_id


class _Machine:
    def __init__(self, plan: dict, seed: int, chunk_bytes: int):
        self.plan = plan
        self.rng = random.Random(seed)
        self.n = len(plan["gpus"])
        self.align = int(plan.get("buffer_alignment", 16))
        self.inplace = bool(plan["inplace"])
        self.coll = plan["collective"]
        self.reuse = bool(plan.get("reuse_resources", False))
        self.packets = plan.get("protocol") == "LL"
        self.names: dict[tuple[int, int], str] = {}
        self._sizes(chunk_bytes)
        self._memory(seed)
        self._actors()

    # -- loading -------------------------------------------------------------------------
    def _sizes(self, chunk_bytes: int) -> None:
        sizes = CallSizes.of(self.plan, chunk_bytes)
        self.calc = sizes.calc
        self.in_bytes, self.out_bytes = sizes.in_bytes, sizes.out_bytes
        self.size_per_rank, self.n_chunks = sizes.size_per_rank, sizes.n_chunks
        self.upper_chunk = sizes.upper_chunk

    def _offset(self, index: int) -> int:
        return self.calc(self.size_per_rank, index, self.n_chunks)

    def _memory(self, seed: int) -> None:
        rng = np.random.default_rng(seed)
        n = self.n
        self.inputs = [rng.integers(-8, 9, self.in_bytes // _ELEM).astype(np.float64)
                       for _ in range(n)]
        self.mem: list[np.ndarray] = []
        self.base: list[dict[str, int]] = []
        for r, g in enumerate(self.plan["gpus"]):
            if int(g["id"]) != r:
                raise PlanError(f"gpus[{r}] has id {g['id']} (the loader throws 'GPU rank "
                                "does not match')")
            sc = int(g.get("scratch_chunks", 0))
            chunk = -(-self.size_per_rank // self.n_chunks)
            # calScratchBufferSize: packets take twice their data (data and flag)
            scratch = -(-chunk * sc * (2 if self.packets else 1) // self.align) * self.align
            ib, ob = self.in_bytes // _ELEM, self.out_bytes // _ELEM
            if not self.inplace:
                base = {"i": 0, "o": ib, "s": ib + ob}
                total = ib + ob
            elif self.coll == "allgather":
                base = {"o": 0, "i": r * ib, "s": ob}
                total = ob
            elif self.coll == "reducescatter":
                base = {"i": 0, "o": r * ob, "s": ib}
                total = ib
            else:
                base = {"i": 0, "o": 0, "s": ib}
                total = ib
            mem = np.full(total + scratch // _ELEM, np.nan)
            mem[base["i"]:base["i"] + ib] = self.inputs[r]
            self.mem.append(mem)
            self.base.append(base)
        size = max(len(m) for m in self.mem)
        self.mem_size = size

    def _actors(self) -> None:
        self.actors: list[_Actor] = []
        self.channels: list[dict[str, list[int]]] = []   # per rank: type -> peer per channel id
        self.switch = switch_channels(self.plan["gpus"])
        for r, g in enumerate(self.plan["gpus"]):
            peers: dict[str, list[int]] = {"memory": [], "port": []}
            for ch in g.get("channels", []):
                t = ch["channel_type"]
                if t not in ("memory", "port", "switch"):
                    raise PlanError(f"gpu {r}: channel type '{t}' ('Invalid channel type')")
                if t != "switch":
                    peers[t] += [int(p) for p in ch["connected_to"]]
            self.channels.append(peers)
            rbufs = [(int(b["rank"]), b["type"], tuple(b["access_channel_types"]))
                     for b in g.get("remote_buffers", [])]
            for k, tb in enumerate(g["threadblocks"]):
                if int(tb["id"]) != k:
                    raise PlanError(f"gpu {r}: threadblocks[{k}] has id {tb['id']}")
                a = _Actor(len(self.actors), f"gpu {r} tb {k}", rank=r, tb=k)
                steps = load_ops(a.name, list(tb["ops"]), self.upper_chunk)
                a.ops = [op for op, _ in steps]
                a.windows = [w for _, w in steps]
                a.chans, a.refs = load_channels(a.name, tb, peers, len(self.switch[r]), rbufs)
                self.actors.append(a)
        # one semaphore per channel: a rank's k-th channel to a peer is paired with the peer's
        # k-th channel to the rank (the executor connects them in that order); a port
        # channel's puts and signals go through a proxy, one FIFO per channel
        self.proxies: dict[tuple, _Actor] = {}
        self.channel_key = {}
        for r in range(self.n):
            for t in ("memory", "port"):
                seen: dict[int, int] = {}
                for cid, p in enumerate(self.channels[r][t]):
                    k = seen.get(p, 0)
                    seen[p] = k + 1
                    self.channel_key[(t, r, cid)] = (t, r, p, k)
                    if t == "port":
                        a = _Actor(len(self.actors), f"proxy gpu {r} port channel {cid}", rank=r)
                        self.actors.append(a)
                        self.proxies[(r, cid)] = a
        self.inbound: dict[tuple, int] = {}      # (t, receiver, sender, k) -> signals received
        # the join of the clocks of every signal received so far: a wait returns having seen
        # the semaphore's current value, which carries every release up to it
        self.inbound_vc: dict[tuple, np.ndarray] = {}
        self.expected: dict[tuple, int] = {}
        self.device_sems = [[int(s["init_value"]) for s in g.get("semaphores", [])]
                            for g in self.plan["gpus"]]
        self.sem_vc = [[None] * len(s) for s in self.device_sems]
        self.barriers: dict[tuple, list] = {}
        n_actors = len(self.actors)
        self.clock = _clock_type(self._most_ticks())
        # every clock has one more entry, always at its largest: the "writer" of memory no
        # one has written, so the race check needs no test for it
        self.unwritten = n_actors
        for a in self.actors:
            a.known = self._zero_clock()
            a.pending = self._zero_clock()
        # which scratch elements hold a packet of this call (LL: a reader spins on its flag)
        self.packet = [np.zeros(self.mem_size, dtype=bool) for _ in range(self.n)]
        self.last_w = [np.full(self.mem_size, n_actors, dtype=np.int64) for _ in range(self.n)]
        self.last_wc = [np.zeros(self.mem_size, dtype=self.clock) for _ in range(self.n)]
        # per rank, the clock of each reader's last read of each element, one row per actor
        # that has read that rank's memory (rows past row_actor's length are spare capacity)
        self.reads = [np.zeros((0, self.mem_size), dtype=self.clock) for _ in range(self.n)]
        self.read_rows: list[dict[int, int]] = [{} for _ in range(self.n)]
        self.row_actor = [np.zeros(0, dtype=np.int64) for _ in range(self.n)]
        self.pool = _Pool(self.rng)
        self.sleepers: dict[tuple, set[int]] = {}

    def _zero_clock(self) -> np.ndarray:
        vc = np.zeros(len(self.actors) + 1, dtype=self.clock)
        vc[-1] = np.iinfo(self.clock).max
        return vc

    def _most_ticks(self) -> int:
        """The most any actor's clock reaches: a tb ticks once per op (twice for a port
        ``pwsf``: its put and its wait for the drain), a proxy once per FIFO entry."""
        most = 0
        entries: dict[tuple[int, int], int] = {}
        for a in self.actors:
            ticks = len(a.ops)
            for op in a.ops:
                if op.get("channel_type") != "port":
                    continue
                name = op["name"]
                ticks += name == "pwsf"
                per = {"put": 1, "pws": 2, "pwsf": 2}.get(name, 0)
                chans = op.get("channel_ids", ())
                for i in range(len(op.get("dst_buff", ())) if per else 0):
                    key = (a.rank, a.chans["port"][chans[i]])
                    entries[key] = entries.get(key, 0) + per
                if name == "signal":
                    for c in chans:
                        key = (a.rank, a.chans["port"][c])
                        entries[key] = entries.get(key, 0) + 1
            most = max(most, ticks)
        return max([most, *entries.values()])

    # -- memory with race checks ------------------------------------------------------------
    def _region(self, actor: _Actor, rank: int, buf: str, index: int, size_chunks: int,
                op: dict) -> tuple[int, int]:
        if buf not in ("i", "o", "s"):
            raise PlanError(f"{actor.name}: buffer type '{buf}'")
        lo = self._offset(index)
        nbytes = self._offset(index + size_chunks) - lo
        if self.reuse and buf == "s":
            raise Unsupported("reuse_resources scratch offsets are not modelled")
        tbg = op.get("tbg_info")
        if tbg:
            k, slices = int(tbg["tb_id"]), int(tbg["tbg_size"])
            lo, nbytes = lo + self.calc(nbytes, k, slices), (
                self.calc(nbytes, k + 1, slices) - self.calc(nbytes, k, slices))
        window = actor.windows[actor.pc] if actor.pc < len(actor.windows) else None
        if window is not None:
            offset, unit = window
            if offset > nbytes:
                raise PlanError(f"{actor.name}: a pipeline iteration starts at byte {offset} "
                                f"of a {nbytes}-byte region of '{buf}' (handlePipeline's uint32 "
                                "'size - offset' wraps and the op runs past its region)")
            lo, nbytes = lo + offset, min(nbytes - offset, unit)
        start = self.base[rank][buf] + lo // _ELEM
        end = start + nbytes // _ELEM
        limit = {"i": self.in_bytes, "o": self.out_bytes,
                 "s": (len(self.mem[rank]) - self.base[rank]["s"]) * _ELEM}[buf]
        if lo + nbytes > limit:
            raise PlanError(f"{actor.name}: {buf} chunks {index}..{index + size_chunks - 1} "
                            f"of gpu {rank} run past its buffer")
        return start, end

    def _after_last_write(self, actor: _Actor, know: np.ndarray, rank: int, lo: int, hi: int,
                          verb: str) -> None:
        """A race unless every byte's last write is ordered before ``actor`` (or is its own)."""
        w = self.last_w[rank][lo:hi]
        wc = self.last_wc[rank][lo:hi]
        bad = know[w] < wc
        if not bad.any():
            return  # the common case, checked with the fewest numpy calls
        bad &= ~((w == actor.index) & (wc == actor.clock))
        if bad.any():
            j = int(np.flatnonzero(bad)[0])
            self._race(actor, rank, lo + j, int(w[j]), int(wc[j]), verb)

    def _read(self, actor: _Actor, know: np.ndarray, rank: int, span: tuple[int, int]
              ) -> np.ndarray:
        lo, hi = span
        self._after_last_write(actor, know, rank, lo, hi, "reads")
        row = self._row(rank, actor.index)  # before indexing: it may grow the array
        self.reads[rank][row, lo:hi] = actor.clock
        vals = self.mem[rank][lo:hi].copy()
        if np.isnan(vals).any():
            raise PlanError(f"{actor.name} ({self._what(actor)}) reads gpu {rank} memory that "
                            "holds no data yet")
        return vals

    def _write(self, actor: _Actor, know: np.ndarray, rank: int, span: tuple[int, int],
               values: np.ndarray) -> None:
        lo, hi = span
        self._after_last_write(actor, know, rank, lo, hi, "overwrites a write of")
        reads = self.reads[rank][:len(self.row_actor[rank]), lo:hi]
        late = reads > know[self.row_actor[rank]][:, None]
        own = self.read_rows[rank].get(actor.index)
        if own is not None:
            late[own] &= reads[own] != actor.clock
        if late.any():
            row, j = (int(x[0]) for x in np.nonzero(late))
            self._race(actor, rank, lo + j, int(self.row_actor[rank][row]), int(reads[row, j]),
                       "overwrites a read of")
        reads[:] = 0
        self.last_w[rank][lo:hi] = actor.index
        self.last_wc[rank][lo:hi] = actor.clock
        self.mem[rank][lo:hi] = values

    def _row(self, rank: int, actor_index: int) -> int:
        """The row of ``self.reads[rank]`` that records ``actor_index``'s reads (added on its
        first read: most actors never touch most ranks' memory)."""
        row = self.read_rows[rank].get(actor_index)
        if row is None:
            row = self.read_rows[rank][actor_index] = len(self.row_actor[rank])
            if row == len(self.reads[rank]):  # grow by half: a copy per row would be quadratic
                spare = np.zeros((row // 2 + 4, self.mem_size), dtype=self.clock)
                self.reads[rank] = np.vstack([self.reads[rank], spare])
            self.row_actor[rank] = np.append(self.row_actor[rank], actor_index)
        return row

    def _race(self, actor: _Actor, rank: int, elem: int, other: int, clock: int, how: str):
        where = next((f"{b} element {elem - off}" for b, off in sorted(
            self.base[rank].items(), key=lambda kv: -kv[1]) if elem >= off), str(elem))
        theirs = self.names.get((other, clock), f"op {clock}")
        raise PlanError(f"race on gpu {rank} {where}: {actor.name} ({self._what(actor)}) {how} "
                        f"{self.actors[other].name} ({theirs}) without an ordering "
                        "signal/wait, semaphore, barrier or nop between them")

    def _what(self, actor: _Actor) -> str:
        return self.names.get((actor.index, actor.clock), "?")

    # -- running ----------------------------------------------------------------------------
    def run(self) -> None:
        # candidates: actors that may be able to move; one that cannot sleeps on the events
        # that could let it (a signal on its channel, a semaphore, a barrier, packets, a proxy
        # draining) and is woken by them, so a step costs no scan of every actor
        for a in self.actors:
            if a.pc < len(a.ops) or a.fifo:
                self.pool.add(a)
        while self.pool.items:
            a = self.pool.pick()
            if not self._can_move(a):
                self.pool.remove(a)
                for key in self._wake_keys(a):
                    self.sleepers.setdefault(key, set()).add(a.index)
                continue
            self._step(a)
            if a.pc >= len(a.ops) and not a.fifo:
                self.pool.remove(a)
        stuck = [a for a in self.actors if a.pc < len(a.ops) or a.fifo]
        if stuck:
            lines = [f"{a.name} at op {a.pc} ({a.ops[a.pc]['name'] if a.pc < len(a.ops) else '-'})"
                     for a in stuck if a.pc < len(a.ops)]
            raise PlanError("deadlock: " + "; ".join(lines))
        for key, got in self.inbound.items():
            if got != self.expected.get(key, 0):
                t, r, p, k = key
                raise PlanError(f"unmatched signal: gpu {p} signalled gpu {r} {got} times on "
                                f"{t} channel #{k} and gpu {r} waited {self.expected.get(key, 0)} "
                                "times (the next call would start out of step)")
        for r, sems in enumerate(self.device_sems):
            init = [int(s["init_value"]) for s in self.plan["gpus"][r].get("semaphores", [])]
            if sems != init:
                raise PlanError(f"gpu {r}: device semaphores end at {sems}, not {init}")

    def _wake(self, key: tuple) -> None:
        for i in self.sleepers.pop(key, ()):
            self.pool.add(self.actors[i])

    def _enqueue(self, proxy: _Actor, entry: tuple) -> None:
        proxy.fifo.append(entry)
        self.pool.add(proxy)

    def _wake_keys(self, a: _Actor) -> list[tuple]:
        """The events that can let ``a``, which cannot move now, move."""
        if a.name.startswith("proxy") or a.pc >= len(a.ops):
            return []  # a proxy is woken by _enqueue
        op = a.ops[a.pc]
        name = op["name"]
        if name in ("wait", "rlxwait"):
            return [("in", key) for key, _ in a.waiting]
        if name == "sem_acquire":
            return [("sem", a.rank, s) for s in op["semaphore_ids"]]
        if name == "barrier":
            return [("bar", (a.rank, int(op["barrier_id"])))]
        if name in ("upkt", "repkt"):
            return [("pkt", a.rank)]
        if name in ("pwsf", "flush"):
            return [("fifo", self.proxies[(a.rank, a.chans["port"][op["channel_ids"][i]])].index)
                    for i in range(self._flush_count(op))]
        return []

    def _can_move(self, a: _Actor) -> bool:
        if a.name.startswith("proxy"):
            return bool(a.fifo)
        if a.pc >= len(a.ops):
            return False
        return self._ready(a, a.ops[a.pc])

    def _ready(self, a: _Actor, op: dict) -> bool:
        name = op["name"]
        if name in ("upkt", "repkt"):
            first = 0 if name == "upkt" else 1
            size = self._local(a, op["src_buff"][0], op)
            size = size[1] - size[0]
            return all(self.packet[a.rank][lo:lo + 2 * size].all()
                       for lo in (self._packet_start(a, b) for b in op["src_buff"][first:]))
        if name in ("wait", "rlxwait"):
            if a.waiting is None:
                a.waiting = [self._expect(a, op, i) for i in range(len(op["channel_ids"]))]
            return all(self.inbound.get(key, 0) >= e for key, e in a.waiting)
        if name == "sem_acquire":
            return all(self.device_sems[a.rank][s] > 0 for s in op["semaphore_ids"])
        if name == "barrier":
            key = (a.rank, int(op["barrier_id"]))
            if a.waiting is None:
                # __syncthreads on the way in: all the tb's threads arrive with what any knew
                vc = np.maximum(a.known, a.pending)
                vc[a.index] = a.clock
                self.barriers.setdefault(key, []).append(vc)
                a.waiting = len(self.barriers[key])
                self._wake(("bar", key))
            need = int(op["num_threadblocks"])
            first = (a.waiting - 1) // need * need
            return len(self.barriers[key]) >= first + need
        if name in ("pwsf", "flush"):
            if name == "pwsf" and op.get("channel_type") == "port" and a.waiting is None:
                return True  # enqueue first, then wait for the proxy
            return all(not self.proxies[(a.rank, a.chans["port"][op["channel_ids"][i]])].fifo
                       for i in range(self._flush_count(op)))
        return True

    def _flush_count(self, op: dict) -> int:
        if op["name"] == "flush":
            return len(op.get("dst_buff", ()))
        return len(op.get("dst_buff", ()))

    def _expect(self, a: _Actor, op: dict, i: int) -> tuple[tuple, int]:
        t = op["channel_type"]
        cid = a.chans[t][op["channel_ids"][i]]
        _, r, p, k = self.channel_key[(t, a.rank, cid)]
        key = (t, r, p, k)
        self.expected[key] = self.expected.get(key, 0) + 1
        return key, self.expected[key]

    def _step(self, a: _Actor) -> None:
        if a.name.startswith("proxy"):
            self._proxy_step(a)
            return
        op = a.ops[a.pc]
        name = op["name"]
        if name == "pwsf" and op.get("channel_type") == "port" and a.waiting is None:
            a.clock += 1
            self.names[(a.index, a.clock)] = f"op {a.pc} pwsf"
            self._put(a, op, signal=True)
            a.waiting = True
            return
        a.clock += 1
        self.names[(a.index, a.clock)] = f"op {a.pc} {name}"
        # the ops that change what the tb knows (nop, barrier) access no memory, so the
        # checks may read the tb's clock in place
        getattr(self, "_op_" + name)(a, op, a.known)
        a.waiting = None
        a.pc += 1

    # -- ops --------------------------------------------------------------------------------
    def _local(self, a, buff, op=None):
        return self._region(a, a.rank, buff["type"], int(buff["index"]), int(buff["size"]),
                            op if op is not None else self._cur(a))

    def _packet_start(self, a, buff) -> int:
        """Where a scratch region's packets start: the kernel doubles the offset
        (``scratch + (offset << 1)``), whatever the region's buffer type says."""
        return self.base[a.rank]["s"] + 2 * (self._offset(int(buff["index"])) // _ELEM)

    def _op_ppkt(self, a, op, know):
        if op.get("channel_type") != "memory":
            raise Unsupported(f"{a.name}: ppkt over a port channel (its source must already be "
                              "packets) is not modelled")
        src_type = op["src_buff"][0]["type"]
        for i, dbuf in enumerate(op["dst_buff"]):
            src = self._local(a, dict(op["src_buff"][i], type=src_type))
            vals = self._read(a, know, a.rank, src)
            rank, buf = a.refs["memory"][int(dbuf["buffer_id"])]
            if buf != "s":
                raise PlanError(f"{a.name}: ppkt into '{buf}'; packets land in scratch")
            lo = self.base[rank]["s"] + 2 * (self._offset(int(dbuf["index"])) // _ELEM)
            span = (lo, lo + 2 * len(vals))
            if span[1] > len(self.mem[rank]):
                raise PlanError(f"{a.name}: packets run past gpu {rank}'s scratch")
            if self.packet[rank][span[0]:span[1]].any():
                raise PlanError(f"{a.name}: packets written twice into gpu {rank}'s scratch in "
                                "one call (a reader cannot tell them apart: same flag)")
            self._write(a, know, rank, span, np.concatenate([vals, vals]))
            self.packet[rank][span[0]:span[1]] = True
            self._wake(("pkt", rank))

    def _packets(self, a, buff, size: int) -> np.ndarray:
        """The data of the packets a reader has spun on (ordered by their flags, not by
        signals: read without the ordering check, but recorded)."""
        lo = self._packet_start(a, buff)
        row = self._row(a.rank, a.index)
        self.reads[a.rank][row, lo:lo + 2 * size] = a.clock
        return self.mem[a.rank][lo:lo + size].copy()

    def _op_upkt(self, a, op, know):
        src = self._local(a, op["src_buff"][0])
        size = src[1] - src[0]
        dst = self._local(a, op["dst_buff"][0])
        self._write(a, know, a.rank, (dst[0], dst[0] + size), self._packets(a, op["src_buff"][0],
                                                                           size))

    def _op_repkt(self, a, op, know):
        first = self._local(a, op["src_buff"][0])
        total = self._read(a, know, a.rank, first)
        for buff in op["src_buff"][1:]:
            total = total + self._packets(a, buff, len(total))
        dst = self._local(a, op["dst_buff"][0])
        self._write(a, know, a.rank, (dst[0], dst[0] + len(total)), total)

    def _switch(self, a, buff) -> SwitchGroup:
        if "switch_channel_id" not in buff:
            raise PlanError(f"{a.name}: a {self._cur(a)['name']} buffer names no "
                            "switch_channel_id")
        cid = int(buff["switch_channel_id"])
        if not 0 <= cid < len(a.chans["switch"]):
            raise PlanError(f"{a.name}: switch channel {cid} is not one of its threadblock's")
        return self.switch[a.rank][a.chans["switch"][cid]]

    def _multicast(self, a, know, buff, values: np.ndarray) -> None:
        """A multimem store: ``values`` into the region ``buff`` of every member."""
        ranks, buf = self._switch(a, buff)
        for m in ranks:
            span = self._region(a, m, buf, int(buff["index"]), int(buff["size"]), self._cur(a))
            self._write(a, know, m, (span[0], span[0] + len(values)), values)

    def _op_glres(self, a, op, know):
        src = op["src_buff"][0]
        ranks, buf = self._switch(a, src)
        spans = [self._region(a, m, buf, int(src["index"]), int(src["size"]), op)
                 for m in ranks]
        total = np.sum([self._read(a, know, m, span) for m, span in zip(ranks, spans,
                                                                         strict=True)], axis=0)
        for dst in op["dst_buff"]:
            self._multicast(a, know, dst, total)

    def _op_gstore(self, a, op, know):
        vals = self._read(a, know, a.rank, self._local(a, op["src_buff"][0]))
        self._multicast(a, know, op["dst_buff"][0], vals)

    def _cur(self, a):
        return a.ops[a.pc]

    def _remote(self, a, op, buff) -> tuple[int, tuple[int, int]]:
        t = op["channel_type"]
        rank, buf = a.refs[t][int(buff["buffer_id"])]
        return rank, self._region(a, rank, buf, int(buff["index"]), int(buff["size"]), op)

    def _op_nop(self, a, op, know):
        np.maximum(a.known, a.pending, out=a.known)
        a.known[a.index] = a.clock

    def _op_barrier(self, a, op, know):
        key = (a.rank, int(op["barrier_id"]))
        need = int(op["num_threadblocks"])
        first = (a.waiting - 1) // need * need
        for vc in self.barriers[key][first:first + need]:
            np.maximum(a.pending, vc, out=a.pending)
        self._op_nop(a, op, know)

    def _op_copy(self, a, op, know):
        src = self._local(a, op["src_buff"][0])
        dst = self._local(a, op["dst_buff"][0])
        vals = self._read(a, know, a.rank, src)
        self._write(a, know, a.rank, (dst[0], dst[0] + len(vals)), vals)

    def _reduce(self, a, op, know, remote_in: bool, remote_out: bool):
        first = self._local(a, op["src_buff"][0])
        total = self._read(a, know, a.rank, first)
        size = len(total)
        for buff in op["src_buff"][1:]:
            if remote_in:
                rank, span = self._remote(a, op, buff)
            else:
                rank, span = a.rank, self._local(a, buff)
            total = total + self._read(a, know, rank, (span[0], span[0] + size))
        dst = self._local(a, op["dst_buff"][0])
        self._write(a, know, a.rank, (dst[0], dst[0] + size), total)
        if remote_out:
            for buff in op["dst_buff"][1:]:
                rank, span = self._remote(a, op, buff)
                self._write(a, know, rank, (span[0], span[0] + size), total)

    def _op_re(self, a, op, know):
        self._reduce(a, op, know, False, False)

    def _op_res(self, a, op, know):
        self._reduce(a, op, know, False, True)

    def _op_rre(self, a, op, know):
        self._reduce(a, op, know, True, False)

    def _op_rres(self, a, op, know):
        self._reduce(a, op, know, True, True)

    def _op_get(self, a, op, know):
        # handleGet reads the remote buffer at the *local* op's offset and writes the local
        # buffer at the *remote* one (the two are swapped at the commit read)
        for sbuf, dbuf in zip(op["src_buff"], op["dst_buff"], strict=True):
            rank, rspan = self._remote(a, op, sbuf)
            lspan = self._local(a, dbuf)
            size = rspan[1] - rspan[0]
            l_off = lspan[0] - self.base[a.rank][dbuf["type"]]
            r_off = rspan[0] - self.base[rank][a.refs[op["channel_type"]][
                int(sbuf["buffer_id"])][1]]
            vals = self._read(a, know, rank, (rspan[0] - r_off + l_off,
                                              rspan[0] - r_off + l_off + size))
            start = lspan[0] - l_off + r_off
            self._write(a, know, a.rank, (start, start + size), vals)

    def _put(self, a, op, signal: bool):
        t = op["channel_type"]
        src_type = op["src_buff"][0]["type"]
        for i, dbuf in enumerate(op["dst_buff"]):
            sbuf = dict(op["src_buff"][i], type=src_type)
            src = self._local(a, sbuf)
            rank, dst = self._remote(a, op, dbuf)
            size = dst[1] - dst[0]
            span = (src[0], src[0] + size)
            if t == "memory":
                vals = self._read(a, a.known, a.rank, span)
                self._write(a, a.known, rank, dst, vals)
                continue
            cid = a.chans[t][op["channel_ids"][i]]
            entry = ("put", a.known.copy(), a.rank, span, rank, dst, self.names[(a.index,
                                                                                  a.clock)])
            self._enqueue(self.proxies[(a.rank, cid)], entry)
            if signal:
                self._enqueue(self.proxies[(a.rank, cid)],
                              ("signal", a.known.copy(), self.channel_key[(t, a.rank, cid)]))

    def _op_put(self, a, op, know):
        self._put(a, op, signal=False)

    def _op_pws(self, a, op, know):
        self._put(a, op, signal=op.get("channel_type") == "port")

    def _op_pwsf(self, a, op, know):
        if op.get("channel_type") != "port":
            self._put(a, op, signal=False)  # the memory branch of handlePut neither signals
            return                          # nor flushes
        for i in range(len(op["dst_buff"])):
            proxy = self.proxies[(a.rank, a.chans["port"][op["channel_ids"][i]])]
            np.maximum(a.pending, proxy.known, out=a.pending)

    def _signal(self, a, op, ordered: bool):
        t = op["channel_type"]
        for i in range(len(op["channel_ids"])):
            cid = a.chans[t][op["channel_ids"][i]]
            if t == "port":
                self._enqueue(self.proxies[(a.rank, cid)],
                              ("signal", a.known.copy(), self.channel_key[(t, a.rank, cid)]))
                continue
            self._deliver(self.channel_key[(t, a.rank, cid)], a.known if ordered else None)

    def _deliver(self, sender_key: tuple, vc: np.ndarray | None) -> None:
        t, r, p, k = sender_key
        key = (t, p, r, k)  # the receiver's view: its k-th channel to r
        got = self.inbound.get(key, 0) + 1
        self.inbound[key] = got
        if key not in self.inbound_vc:
            self.inbound_vc[key] = self._zero_clock()
        if vc is not None:
            np.maximum(self.inbound_vc[key], vc, out=self.inbound_vc[key])
        self._wake(("in", key))

    def _op_signal(self, a, op, know):
        self._signal(a, op, True)

    def _op_rlxsignal(self, a, op, know):
        self._signal(a, op, False)

    def _op_wait(self, a, op, know):
        for key, _ in a.waiting:
            np.maximum(a.pending, self.inbound_vc[key], out=a.pending)

    def _op_rlxwait(self, a, op, know):
        pass

    def _op_flush(self, a, op, know):
        for i in range(self._flush_count(op)):
            proxy = self.proxies[(a.rank, a.chans["port"][op["channel_ids"][i]])]
            np.maximum(a.pending, proxy.known, out=a.pending)

    def _op_sem_release(self, a, op, know):
        for s in op["semaphore_ids"]:
            self.device_sems[a.rank][s] += 1
            self._wake(("sem", a.rank, s))
            prev = self.sem_vc[a.rank][s]
            self.sem_vc[a.rank][s] = a.known.copy() if prev is None else np.maximum(prev,
                                                                                    a.known)

    def _op_sem_acquire(self, a, op, know):
        for s in op["semaphore_ids"]:
            self.device_sems[a.rank][s] -= 1
            if self.sem_vc[a.rank][s] is not None:
                np.maximum(a.pending, self.sem_vc[a.rank][s], out=a.pending)

    def _proxy_step(self, p: _Actor) -> None:
        entry = p.fifo.pop(0)
        self._wake(("fifo", p.index))
        np.maximum(p.known, entry[1], out=p.known)
        p.clock += 1
        p.known[p.index] = p.clock
        if entry[0] == "put":
            _, _, rank, span, dst_rank, dst, what = entry
            self.names[(p.index, p.clock)] = f"proxy of {what}"
            vals = self._read(p, p.known, rank, span)
            self._write(p, p.known, dst_rank, dst, vals)
        else:
            self.names[(p.index, p.clock)] = "proxy signal"
            self._deliver(entry[2], p.known)


def _clock_type(ticks: int) -> type[np.signedinteger]:
    """The narrowest integer that holds every clock: the clocks' memory grows with the square
    of the actors (16,000 threadblocks: 0.5 GB per copy of every tb's clock at int16)."""
    for t in (np.int16, np.int32):
        if ticks <= np.iinfo(t).max:
            return t
    raise Unsupported(f"an actor runs {ticks} ops: past the executor's int32 clocks")


class _Pool:
    """Actors to pick from at random, with O(1) add, remove and pick."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.items: list[_Actor] = []
        self.pos: dict[int, int] = {}

    def add(self, a: _Actor) -> None:
        if a.index not in self.pos:
            self.pos[a.index] = len(self.items)
            self.items.append(a)

    def remove(self, a: _Actor) -> None:
        i = self.pos.pop(a.index)
        last = self.items.pop()
        if last is not a:
            self.items[i] = last
            self.pos[last.index] = i

    def pick(self) -> _Actor:
        return self.items[self.rng.randrange(len(self.items))]


def execute(plan: dict | str, seed: int = 0, chunk_bytes: int = 64) -> None:
    """Run ``plan`` (a dict or JSON text) once, interleaved by ``seed``, with each chunk
    ``chunk_bytes`` long; :class:`PlanError` names what is wrong."""
    doc: dict = json.loads(plan) if isinstance(plan, str) else plan
    m = _Machine(doc, seed, chunk_bytes)
    m.run()
    want = expected_outputs(m.coll, m.inputs)
    for r in range(m.n):
        ob = m.out_bytes // _ELEM
        got = m.mem[r][m.base[r]["o"]:m.base[r]["o"] + ob]
        if not np.array_equal(got, want[r]):
            bad = int(np.flatnonzero(~np.isclose(got, want[r]) | np.isnan(got))[0])
            raise PlanError(f"gpu {r} output element {bad} is {got[bad]}, not {want[r][bad]} "
                            f"({m.coll} postcondition)")
        if not m.inplace:
            ib = m.in_bytes // _ELEM
            if not np.array_equal(m.mem[r][m.base[r]["i"]:m.base[r]["i"] + ib], m.inputs[r]):
                raise PlanError(f"gpu {r}: an out-of-place plan changed its input buffer")


def run(plan: dict | str, seeds: int = 4, chunk_bytes: int = 64) -> None:
    """:func:`execute` under ``seeds`` interleavings."""
    doc: dict = json.loads(plan) if isinstance(plan, str) else plan
    for seed in range(seeds):
        execute(doc, seed, chunk_bytes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m backends.mscclpp.executor",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("plan")
    parser.add_argument("--seeds", type=int, default=4)
    args = parser.parse_args(argv)
    with open(args.plan, encoding="utf-8") as f:
        text = f.read()
    try:
        run(text, args.seeds)
    except PlanError as err:
        print(f"{args.plan}: {err}")
        return 1
    print(f"{args.plan}: ok ({args.seeds} interleavings)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
