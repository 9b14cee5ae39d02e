"""Stage 5 of the MSCCL lowering (:mod:`backends.msccl.lower`): every MSCCL instruction, with
ordering edges for messages, FIFO capacity and data hazards, and one topological order of them
that every threadblock's program order follows."""

from __future__ import annotations

import heapq
from collections import defaultdict
from dataclasses import dataclass
from itertools import pairwise

import numpy as np

from backends.msccl.channels import Channels
from backends.msccl.fusion import Accesses, dead_after
from backends.msccl.steps import Instr, Op, assigned
from cclc.errors import ScheduleError
from cclc.ir import Buf, OpKind

__all__ = ["Program", "global_order", "instructions"]


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
        u = assigned(uid)
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
         acc: Accesses | None) -> int:
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
        if reduce and acc is not None and dead_after(acc, op, (k, chain[h + 1])):
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
                    acc: Accesses | None) -> None:
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


def instructions(ops: list[Op], channels: Channels, acc: Accesses | None) -> Program:
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
