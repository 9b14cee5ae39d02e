"""Stage 2 of the MSCCL lowering (:mod:`backends.msccl.lower`): a receive whose data is the next
thing sent from that slot becomes one fused instruction, forming chains of messages that move
together, only where no other op's read or write could see the difference."""

from __future__ import annotations

from collections import defaultdict
from itertools import pairwise

import numpy as np

from backends.msccl.steps import Op
from cclc.ir import Buf, OpKind

__all__ = ["Accesses", "chains", "dead_after", "fuse"]


class Accesses:
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


def fuse(ops: list[Op], acc: Accesses | None = None) -> dict[int, int]:
    """Stage 2: fused hops, ``nxt[m1] = m2`` when message m2 forwards what m1 delivered (see
    the module docstring); ``acc``: the ops' accesses, if already indexed."""
    if acc is None:
        acc = Accesses(ops)
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


def dead_after(acc: Accesses, op: Op, skip: tuple[int, ...]) -> bool:
    """A reduced value that is only forwarded (``rrs``: no local write): the slot is scratch
    (nobody looks at it in the end) and no later step reads it, so its stale value is never
    seen; reads in the reduction's own step see the old value in the IR too."""
    return op.db is Buf.SCRATCH and not acc.clash(op.dst, op.db, op.do, op.do + op.cnt,
                                                  op.step + 1, 1 << 30, skip, reads_only=True)


def chains(ops: list[Op], nxt: dict[int, int]) -> list[tuple[int, ...]]:
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
