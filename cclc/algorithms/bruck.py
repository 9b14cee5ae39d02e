"""Bruck: AllToAll and AllGather in ``ceil(log2 n)`` rounds, for any ``n``.

Source: Bruck et al., "Efficient algorithms for all-to-all communications in multiport
message-passing systems" (IEEE TPDS 1997): the index algorithm and the concatenation algorithm.

AllToAll (the "index" algorithm)
    A local step rotates rank ``i``'s blocks so that the block for rank ``j`` sits at position
    ``(j - i) mod n`` of a scratch buffer. In round ``k`` rank ``i`` sends every position whose
    bit ``k`` is set to rank ``i + 2^k``, which overwrites the same positions: a block at
    position ``p`` travels ``+p`` in binary hops and ends at its destination, where position
    ``p`` holds the block *from* rank ``i - p``; a last local step puts it in output block
    ``i - p``. Each round moves about half the data, so the bandwidth is ``log2(n)/2`` times
    that of a direct exchange: it wins only where latency dominates.

AllGather (concatenation)
    Rank ``i`` keeps the blocks of ranks ``i, i+1, ...`` contiguous; in round ``k`` it sends
    the ``2^k`` blocks it has to rank ``i - 2^k``, which stores them at the same block indices,
    so they land in place and no final rotation is needed. For ``n`` not a power of two the last
    round sends only the first ``n - 2^floor(log2 n)`` blocks. ``(n-1)`` blocks per rank in
    total: bandwidth-optimal, but the biggest transfer goes farthest (PAT reverses that).
"""

from __future__ import annotations

import numpy as np

from cclc.algorithms import Algorithm, register
from cclc.algorithms.common import add_pair_routes
from cclc.algorithms.member_sends import block_bytes, shift
from cclc.algorithms.pair_traffic import bruck_traffic
from cclc.collective import Collective, CollectiveKind
from cclc.ir import Buf, Schedule, ScheduleBuilder
from cclc.sends import Sends

__all__ = ["bruck_rounds"]

_KINDS = frozenset({CollectiveKind.ALLTOALL, CollectiveKind.ALLGATHER})


def bruck_rounds(n: int) -> int:
    """Communication rounds of Bruck on ``n`` ranks: ``ceil(log2 n)``."""
    return (n - 1).bit_length()


def _runs(ranks: np.ndarray, start: np.ndarray, length: int, n: int
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Split the cyclic block ranges ``start .. start+length-1 (mod n)`` into contiguous runs:
    rows (rank, offset, count)."""
    first = np.minimum(length, n - start)
    rest = length - first
    r = np.concatenate([ranks, ranks[rest > 0]])
    off = np.concatenate([start, np.zeros(int((rest > 0).sum()), dtype=np.int64)])
    cnt = np.concatenate([first, rest[rest > 0]])
    return r, off, cnt


def _allgather(coll: Collective) -> Schedule:
    n = coll.n
    per = coll.count // n
    b = ScheduleBuilder(coll, input=[per], output=[per] * n)
    ranks = np.arange(n)
    b.add(step=0, src=ranks, dst=ranks, src_buf=Buf.INPUT, src_off=0, dst_buf=Buf.OUTPUT,
          dst_off=ranks)
    held, k = 1, 0
    while held < n:
        dist = 1 << k
        send = min(held, n - held)
        peer = (ranks - dist) % n
        if held == 1:
            b.add(step=k, src=ranks, dst=peer, route=add_pair_routes(b, coll, ranks, peer),
                  src_buf=Buf.INPUT, src_off=0, dst_buf=Buf.OUTPUT, dst_off=ranks)
        else:
            r, off, cnt = _runs(ranks, ranks, send, n)
            dst = (r - dist) % n
            b.add(step=k, src=r, dst=dst, route=add_pair_routes(b, coll, r, dst),
                  src_buf=Buf.OUTPUT, src_off=off, dst_buf=Buf.OUTPUT, dst_off=off, count=cnt)
        held += send
        k += 1
    return b.build("bruck")


def _alltoall(coll: Collective) -> Schedule:
    n = coll.n
    per = coll.count // n
    b = ScheduleBuilder(coll, input=[per] * n, output=[per] * n, scratch=[per] * n)
    ranks = np.arange(n)
    # step 0 (local): own block straight to the output; block j to position (j - i) mod n
    b.add(step=0, src=ranks, dst=ranks, src_buf=Buf.INPUT, src_off=ranks, dst_buf=Buf.OUTPUT,
          dst_off=ranks)
    hi = ranks < n - 1  # blocks i+1 .. n-1 -> positions 1 .. n-1-i
    b.add(step=0, src=ranks[hi], dst=ranks[hi], src_buf=Buf.INPUT, src_off=ranks[hi] + 1,
          dst_buf=Buf.SCRATCH, dst_off=1, count=n - 1 - ranks[hi])
    lo = ranks > 0  # blocks 0 .. i-1 -> positions n-i .. n-1
    b.add(step=0, src=ranks[lo], dst=ranks[lo], src_buf=Buf.INPUT, src_off=0,
          dst_buf=Buf.SCRATCH, dst_off=n - ranks[lo], count=ranks[lo])
    rounds = bruck_rounds(n)
    for k in range(rounds):
        dist = 1 << k
        # positions with bit k set come in runs of 2^k starting at odd multiples of 2^k
        starts = np.arange(dist, n, 2 * dist)
        counts = np.minimum(dist, n - starts)
        r = np.repeat(ranks, len(starts))
        off = np.tile(starts, n)
        cnt = np.tile(counts, n)
        dst = (r + dist) % n
        b.add(step=1 + k, src=r, dst=dst, route=add_pair_routes(b, coll, r, dst),
              src_buf=Buf.SCRATCH, src_off=off, dst_buf=Buf.SCRATCH, dst_off=off, count=cnt)
    # final local step: position p of rank i holds the block from rank i - p
    pos = np.arange(1, n)
    r = np.repeat(ranks, n - 1)
    p = np.tile(pos, n)
    b.add(step=1 + rounds, src=r, dst=r, src_buf=Buf.SCRATCH, src_off=p, dst_buf=Buf.OUTPUT,
          dst_off=(r - p) % n)
    return b.build("bruck")


def _applicable(coll: Collective, **params) -> str | None:
    if coll.kind not in _KINDS:
        return f"bruck does not serve {coll.kind.value}"
    if params:
        return f"bruck takes no parameters (got {', '.join(sorted(params))})"
    if coll.n < 2:
        return "bruck needs at least 2 ranks"
    if coll.pair_sizes is not None:
        return "bruck moves blocks of one size; this alltoall has per-pair sizes"
    return None


def _ops(coll: Collective, **params) -> int:
    """AllToAll: a run of positions per round and rank, and the final local step's ``n (n-1)``
    moves (before relay lowering adds hops); AllGather: a send per round and rank."""
    n = coll.n
    if coll.kind is CollectiveKind.ALLGATHER:
        return n * bruck_rounds(n)
    runs = sum(len(range(1 << k, n, 2 << k)) for k in range(bruck_rounds(n)))
    return n * runs + n * (n - 1)


def _sends(coll: Collective, **params) -> tuple[Sends, ...]:
    """One step per round: AllGather, the ``min(held, n - held)`` blocks to ``i - 2^k``;
    AllToAll, the positions with bit ``k`` set to ``i + 2^k``."""
    n, block = coll.n, block_bytes(coll)
    out = []
    if coll.kind is CollectiveKind.ALLGATHER:
        held, k = 1, 0
        while held < n:
            send = min(held, n - held)
            out.append(shift(n, -(1 << k), send * block))
            held, k = held + send, k + 1
        return tuple(out)
    for k in range(bruck_rounds(n)):
        positions = sum(min(1 << k, n - start) for start in range(1 << k, n, 2 << k))
        out.append(shift(n, 1 << k, positions * block))
    return tuple(out)


def _build(coll: Collective, **params) -> Schedule:
    return _allgather(coll) if coll.kind is CollectiveKind.ALLGATHER else _alltoall(coll)


register(Algorithm(
    name="bruck", collectives=_KINDS, applicable=_applicable, build=_build, ops=_ops,
    load=bruck_traffic, sends=_sends,
    description="ceil(log2 n) rounds at distances 1, 2, 4, ...; wins on small sizes"))
