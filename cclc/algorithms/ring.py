"""Ring: the members pass blocks to their successor on a ring embedded in the group.

The ring visits the group in :func:`~cclc.algorithms.common.ring_order` (a snake through a
whole torus, so every hop is one link; group order elsewhere); each hop travels a shortest
healthy path. One direction only.

* allgather: ``n - 1`` steps; in step ``t`` ring position ``p`` forwards the block that
  originated at position ``p - t``.
* reducescatter: a local step that copies every input block into scratch, then ``n - 1``
  steps in which position ``p`` sends its partial sum of the block owned by ``p - t`` to
  ``p + 1``, which adds its own; the last hop lands in the owner's output.
* allreduce: reduce-scatter then allgather over ``n`` near-equal blocks of the buffer.
* broadcast: a pipelined chain from the root along the ring, the buffer cut in ``chunks``
  pieces (default: the count that balances per-hop latency against pipeline fill).
* reduce: the same chain run backwards: after a local step that seeds every member's output
  with its own input (but the far end's), each piece leaves the far end of the chain and
  every member adds its partial sum into the next one towards the root, one hop per step.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.sparse.csgraph import dijkstra

from cclc.algorithms import Algorithm, NoBound, register
from cclc.algorithms.common import (
    add_pair_routes,
    bad_int_param,
    chunks_reason,
    even_split,
    hint_int,
    ring_order,
)
from cclc.algorithms.member_sends import block_bytes
from cclc.collective import Collective, CollectiveKind
from cclc.ir import Buf, OpKind, Schedule, ScheduleBuilder
from cclc.sends import Sends, sends

__all__ = ["build_ring", "chain_chunks"]

_KINDS = frozenset({CollectiveKind.ALLGATHER, CollectiveKind.REDUCESCATTER,
                    CollectiveKind.ALLREDUCE, CollectiveKind.BROADCAST, CollectiveKind.REDUCE})
#: the collectives the ring serves as a pipelined chain, cut in ``chunks`` pieces
_CHAINS = frozenset({CollectiveKind.BROADCAST, CollectiveKind.REDUCE})

#: most pieces a chain cuts the buffer into (beyond this, latency dominates anyway)
MAX_CHAIN_CHUNKS = 64


def _applicable(coll: Collective, **params) -> str | None:
    if coll.kind not in _KINDS:
        return f"ring does not serve {coll.kind.value}"
    extra = set(params) - ({"chunks"} if coll.kind in _CHAINS else set())
    if extra:
        return f"ring takes no parameter {', '.join(sorted(extra))} for {coll.kind.value}"
    return bad_int_param(params, "chunks") or chunks_reason(coll, params, coll.count,
                                                            "the buffer")


def _ops(coll: Collective, **params) -> int:
    """The ops the builder makes before relay lowering (which only adds ops): ``n`` local
    copies and ``n (n - 1)`` forwards for allgather; ``n^2`` local copies and ``n (n - 1)``
    partial sums for reducescatter; for allreduce ``3n - 2`` ops per non-empty block (a local
    copy on every rank, ``n - 1`` partial sums, ``n - 1`` forwards); a broadcast chain moves
    each of its ``chunks`` pieces over each of its ``n - 1`` hops, after the root's copy; a
    reduce chain seeds ``n - 1`` members' pieces and adds each piece over each hop."""
    n = coll.n
    if coll.kind in _CHAINS:
        chunks = hint_int(params, "chunks", None)
        k = chain_chunks(coll, n - 1) if chunks is None else min(chunks, coll.count)
        if coll.kind is CollectiveKind.REDUCE and n > 1:
            return 2 * k * (n - 1)
        return k * n
    if coll.kind is CollectiveKind.ALLGATHER:
        return n * n
    if coll.kind is CollectiveKind.REDUCESCATTER:
        return 2 * n * n - n if n > 1 else 1
    return min(coll.count, n) * (3 * n - 2)


def _slots(coll: Collective, **params) -> int:
    """One rank's chunk slots: its block and the ``n`` blocks of the output (allgather); ``n``
    input blocks, ``n`` partial sums and its output block (reducescatter); ``n`` blocks of input
    and output (allreduce); the pieces of input and output (broadcast, reduce)."""
    n = coll.n
    if coll.kind in _CHAINS:
        chunks = hint_int(params, "chunks", None)
        k = chain_chunks(coll, n - 1) if chunks is None else min(chunks, coll.count)
        return 2 * k
    return {CollectiveKind.ALLGATHER: n + 1, CollectiveKind.REDUCESCATTER: 2 * n + 1,
            CollectiveKind.ALLREDUCE: 2 * n}[coll.kind]


def build_ring(coll: Collective, **params) -> Schedule:
    """The ring schedule of ``coll``; ``chunks=K`` sets a chain's pipeline depth."""
    order = ring_order(coll)
    if coll.kind is CollectiveKind.BROADCAST:
        return _broadcast(coll, order, hint_int(params, "chunks", None))
    if coll.kind is CollectiveKind.REDUCE:
        return _reduce(coll, order, hint_int(params, "chunks", None))
    return _BUILDERS[coll.kind](coll, order)


class _Ring:
    """Routes of the ring's hops: ``hop_route[p]`` carries position ``p`` to ``p + 1``."""

    def __init__(self, b: ScheduleBuilder, coll: Collective, order: np.ndarray):
        self.order = order
        self.n = len(order)
        self.next = np.roll(order, -1)
        self.hop_route = add_pair_routes(b, coll, order, self.next)


def _allgather(coll: Collective, order: np.ndarray) -> Schedule:
    n = coll.n
    per_block = coll.count // n
    b = ScheduleBuilder(coll, input=[per_block], output=[per_block] * n)
    ring = _Ring(b, coll, order)
    members = np.arange(n)
    b.add(step=0, src=members, dst=members, src_buf=Buf.INPUT, src_off=0, dst_buf=Buf.OUTPUT,
          dst_off=members)
    _ring_allgather_steps(b, ring, first_step=0, first_buf=Buf.INPUT, block_of=lambda g: 0,
                          slot_of=lambda g: g)
    return b.build("ring")


def _ring_allgather_steps(b: ScheduleBuilder, ring: _Ring, first_step: int, first_buf: Buf,
                          block_of, slot_of) -> int:
    """Forward every position's block around the ring (``n - 1`` steps); returns the next step.

    Position ``p`` starts with the block of group index ``order[p]``, held in its
    ``first_buf`` chunk ``block_of(g)``; every copy lands in output chunk ``slot_of(g)``.
    """
    n = ring.n
    pos = np.arange(n)
    for t in range(n - 1):
        origin = ring.order[(pos - t) % n]
        src_buf = first_buf if t == 0 else Buf.OUTPUT
        src_off = block_of(origin) if t == 0 else slot_of(origin)
        b.add(step=first_step + t, src=ring.order, dst=ring.next, route=ring.hop_route,
              src_buf=src_buf, src_off=src_off, dst_buf=Buf.OUTPUT, dst_off=slot_of(origin))
    return first_step + max(n - 1, 0)


def _reducescatter(coll: Collective, order: np.ndarray) -> Schedule:
    n = coll.n
    per_block = coll.count // n
    b = ScheduleBuilder(coll, input=[per_block] * n, output=[per_block],
                        scratch=[per_block] * n)
    ring = _Ring(b, coll, order)
    members = np.arange(n)
    if n == 1:
        b.add(step=0, src=0, dst=0, src_buf=Buf.INPUT, src_off=0, dst_buf=Buf.OUTPUT, dst_off=0)
        return b.build("ring")
    # step 0 (local): partial sums start as each rank's own input; the owner's in its output
    src = np.repeat(members, n)
    blk = np.tile(members, n)
    own = src == blk
    b.add(step=0, src=src, dst=src, src_buf=Buf.INPUT, src_off=blk,
          dst_buf=np.where(own, Buf.OUTPUT, Buf.SCRATCH), dst_off=np.where(own, 0, blk))
    pos = np.arange(n)
    for t in range(1, n):
        # the block owned by position q leaves q + 1 in step 1 and reaches q after step n - 1
        owner = order[(pos - t) % n]
        arrives = t == n - 1
        b.add(step=t, src=ring.order, dst=ring.next, route=ring.hop_route, kind=OpKind.REDUCE,
              src_buf=Buf.SCRATCH, src_off=owner,
              dst_buf=Buf.OUTPUT if arrives else Buf.SCRATCH, dst_off=0 if arrives else owner)
    return b.build("ring")


def _allreduce(coll: Collective, order: np.ndarray) -> Schedule:
    n = coll.n
    blocks = even_split(coll.count, n)  # block q is owned by ring position q
    b = ScheduleBuilder(coll, input=blocks, output=blocks)
    ring = _Ring(b, coll, order)
    members = np.arange(n)
    src = np.repeat(members, n)
    blk = np.tile(members, n)
    b.add(step=0, src=src, dst=src, src_buf=Buf.INPUT, src_off=blk, dst_buf=Buf.OUTPUT,
          dst_off=blk)
    pos = np.arange(n)
    for t in range(1, n):
        b.add(step=t, src=ring.order, dst=ring.next, route=ring.hop_route, kind=OpKind.REDUCE,
              src_buf=Buf.OUTPUT, src_off=(pos - t) % n, dst_buf=Buf.OUTPUT,
              dst_off=(pos - t) % n)
    # after the reduce-scatter position q holds the full block q: circulate it
    _ring_allgather_steps(b, ring, first_step=n, first_buf=Buf.OUTPUT,
                          block_of=lambda g: _position_of(order, g),
                          slot_of=lambda g: _position_of(order, g))
    s = b.build("ring")
    if coll.count < n:
        # fewer elements than ranks: some blocks are empty, and moving nothing still costs a
        # message's latency
        s = s.replace(ops=s.ops.take(s.op_elems() > 0))
    return s


def _position_of(order: np.ndarray, g: np.ndarray) -> np.ndarray:
    pos = np.empty(len(order), dtype=np.int64)
    pos[order] = np.arange(len(order))
    return pos[g]


def chain_chunks(coll: Collective, hops: int) -> int:
    """Pieces that minimise a pipelined chain's alpha-beta time over ``hops`` hops.

    Time is ``(k + hops - 1) * (alpha + S / (k B))``, minimal at ``k = sqrt((hops - 1) S /
    (alpha B))``, using the slowest healthy link's bandwidth and the latency of the slowest
    hop between ring neighbours (:func:`_hop_latency`): a lockstep step lasts as long as its
    slowest hop, which on a fabric crosses several switches (the Reduce of
    examples/pcie_oversubscribed.ccl: 26 pieces, 1.05 ms, where one link's latency gave 63
    pieces and 1.18 ms; IR model).
    """
    topo = coll.topology
    healthy = ~topo.link_failed
    bandwidth = float(topo.link_bandwidth[healthy].min()) if healthy.any() else 1.0
    limit = max(1, min(MAX_CHAIN_CHUNKS, coll.count))
    if hops <= 1:
        return 1
    latency = _hop_latency(coll)
    if latency <= 0:
        return limit
    k = math.sqrt((hops - 1) * coll.size / (latency * bandwidth))
    return int(min(limit, max(1, round(k))))


#: ring neighbours whose path latency :func:`_hop_latency` reads, evenly spaced along the ring
_LATENCY_SAMPLES = 32


def _hop_latency(coll: Collective) -> float:
    """The largest latency of the fastest live path between two ring neighbours, over
    :data:`_LATENCY_SAMPLES` of them evenly spaced (the chain's pieces move one hop per
    step, so its slowest hop sets the pace); kept on the topology per group (the op count,
    the slot count and the build each ask)."""
    topo = coll.topology
    group = np.asarray(coll.group, dtype=np.int64)
    key = ("chain_hop_latency", group.tobytes())
    if key not in topo._cache:
        order = ring_order(coll)
        n = len(order)
        pick = np.unique(np.linspace(0, n - 1, min(n, _LATENCY_SAMPLES)).round()
                         .astype(np.int64))
        src, dst = group[order[pick]], group[order[(pick + 1) % n]]
        dist = dijkstra(topo.latency_matrix(), indices=src)[np.arange(len(pick)), dst]
        reached = dist[np.isfinite(dist)]
        topo._cache[key] = float(reached.max()) if len(reached) else 0.0
    return topo._cache[key]


def _chain(coll: Collective, order: np.ndarray, chunks: int | None
           ) -> tuple[np.ndarray, int, ScheduleBuilder]:
    """A chain's members from the root on (the ring order rotated to start there), its number
    of pieces, and a builder of its buffers cut in those pieces."""
    start = int(np.flatnonzero(order == coll.root)[0])
    k = chain_chunks(coll, coll.n - 1) if chunks is None else min(chunks, coll.count)
    pieces = even_split(coll.count, k)
    return np.roll(order, -start), k, ScheduleBuilder(coll, input=pieces, output=pieces)


def _broadcast(coll: Collective, order: np.ndarray, chunks: int | None) -> Schedule:
    n = coll.n
    chain, k, b = _chain(coll, order, chunks)
    root = int(chain[0])
    b.add(step=0, src=root, dst=root, src_buf=Buf.INPUT, src_off=np.arange(k),
          dst_buf=Buf.OUTPUT, dst_off=np.arange(k))
    if n == 1:
        return b.build("ring", params=(("chunks", k),))
    hop_route = add_pair_routes(b, coll, chain[:-1], chain[1:])
    hop = np.arange(n - 1)
    for t in range(k + n - 2):
        piece = t - hop
        live = (piece >= 0) & (piece < k)
        h = hop[live]
        b.add(step=t, src=chain[h], dst=chain[h + 1], route=hop_route[h],
              src_buf=np.where(h == 0, Buf.INPUT, Buf.OUTPUT), src_off=piece[live],
              dst_buf=Buf.OUTPUT, dst_off=piece[live])
    return b.build("ring", params=(("chunks", k),))


def _reduce(coll: Collective, order: np.ndarray, chunks: int | None) -> Schedule:
    n = coll.n
    # pieces flow from the chain's far end to the root
    chain, k, b = _chain(coll, order, chunks)
    piece_ids = np.arange(k)
    if n == 1:
        b.add(step=0, src=int(chain[0]), dst=int(chain[0]), src_buf=Buf.INPUT,
              src_off=piece_ids, dst_buf=Buf.OUTPUT, dst_off=piece_ids)
        return b.build("ring", params=(("chunks", k),))
    # step 0 (local): every member but the far end starts its partial sums from its input
    seeders = np.repeat(chain[:-1], k)
    b.add(step=0, src=seeders, dst=seeders, src_buf=Buf.INPUT, src_off=np.tile(piece_ids, n - 1),
          dst_buf=Buf.OUTPUT, dst_off=np.tile(piece_ids, n - 1))
    # hop h carries chain[h + 1]'s partial sum into chain[h]; the far end's hop is n - 2, and
    # piece p crosses hop h in step 1 + p + (n - 2 - h)
    hop_route = add_pair_routes(b, coll, chain[1:], chain[:-1])
    hop = np.arange(n - 1)
    for t in range(k + n - 2):
        piece = t - (n - 2 - hop)
        live = (piece >= 0) & (piece < k)
        h = hop[live]
        b.add(step=t + 1, src=chain[h + 1], dst=chain[h], route=hop_route[h],
              kind=OpKind.REDUCE, src_buf=np.where(h == n - 2, Buf.INPUT, Buf.OUTPUT),
              src_off=piece[live], dst_buf=Buf.OUTPUT, dst_off=piece[live])
    return b.build("ring", params=(("chunks", k),))


def _sends(coll: Collective, **params) -> tuple[Sends, ...] | NoBound:
    """Every position sends one block to its successor in each of ``n - 1`` steps (allgather,
    reducescatter) or ``2 (n - 1)`` (allreduce: at least the smallest of its ``n`` blocks);
    a chain (broadcast, reduce) has no rule."""
    n = coll.n
    if coll.kind in _CHAINS:
        return NoBound(f"no rule for the sends of the {coll.kind.value} chain")
    if n < 2:
        return ()
    order = ring_order(coll)
    if coll.kind is CollectiveKind.ALLREDUCE:
        block, steps = int(even_split(coll.count, n).min()) * coll.dtype.itemsize, 2 * (n - 1)
    else:
        block, steps = block_bytes(coll), n - 1
    return (sends(order, np.roll(order, -1), block, steps),)


_BUILDERS = {CollectiveKind.ALLGATHER: _allgather, CollectiveKind.REDUCESCATTER: _reducescatter,
             CollectiveKind.ALLREDUCE: _allreduce}

register(Algorithm(
    name="ring", collectives=_KINDS, applicable=_applicable, build=build_ring, ops=_ops,
    slots=_slots, exact_ops=True, sends=_sends,
    load=NoBound("no traffic rule: the ring's and the chain's link loads are not derived "
                 "before building, so it is always built"),
    description="blocks passed to the successor on a ring over the group (one direction); "
                "broadcast and reduce as a pipelined chain"))
