"""Hierarchical collectives with few ops: contiguous shares inside a node, recursive halving and
doubling along each rail.

:mod:`cclc.algorithms.hierarchical` gives GPU ``g`` of every node the blocks of the ranks with
GPU index ``g``: blocks ``g, g+G, g+2G, ...`` of a rank-ordered buffer, which are not contiguous,
so each intra-node step moves one op per node (``n (n - 1)`` ops per direction in all: 16.7M at
4,096 ranks). Here GPU ``g`` owns the *contiguous* share ``g`` of the buffer (chunks
``g N .. g N + N - 1`` of ``G N``), so every transfer is one op:

* ReduceScatter: an intra-node reduce-scatter of the shares and a recursive-halving
  reduce-scatter of share ``g`` along rail ``g`` (``log2 N`` rounds), after which rail member
  ``v`` holds chunk ``g N + v`` summed over the group; one last op hands it to the rank that
  owns that block (the chunk is the block: share ``g`` is blocks ``g N ..``). The two phases
  are pipelined: the rounds are cut into pieces of at most ``N / PIECES`` chunks, and each
  piece is reduced inside its node just before it crosses the rail: by recursive halving over
  the node's GPUs where their number ``G`` is a power of two (``log2 G`` steps: half the
  shares' piece to the partner, then a quarter, ...), else diagonally (from each other GPU in
  a step of its own, ``G - 1`` steps, since the IR allows one write per slot per step).
* AllGather: the mirror: every rank hands its block to the rail member that holds it, then
  the recursive-doubling all-gather along each rail, cut into the same pieces, each arriving
  piece forwarded to the node's other GPUs in the next step (one op per peer).
* AllReduce: the ReduceScatter's pipelined halving, then the AllGather's pipelined doubling;
  no owner hand-off (the chunks are an even split of the buffer, not blocks).

What is left of each intra-node phase is its fill or drain, one piece (``1/PIECES`` of a
share, not the whole of it): on the 4,096-GPU fabric of ``benchmarks/fattree_scale.py`` a
1 GiB AllGather went from 52.7% of the bound (the phases one after the other) to 84.6%
(IR model), with 10x the ops.

With ``S`` the doubling's steps (:func:`rail_steps`: ``log2 N`` rounds, cut into pieces) a rank
issues ``1 + S + (G - 1)(S + 1)`` ops for an AllGather, one more for a ReduceScatter (the
halving has as many pieces, plus the kept chunk) and twice as many for an AllReduce: 1.4M ops
for an AllReduce on 512 nodes of 8 GPUs, against 33.5M for
:mod:`cclc.algorithms.hierarchical`. The network carries ``1/G`` of the data, spread over
all ``G`` NICs of a node, as :mod:`cclc.algorithms.hierarchical` does.

Rail positions are the node order *bit-reversed*: the first halving round, which moves half of
the share, pairs nodes ``h`` and ``h xor 1`` (neighbours, on the same leaf in a rail-optimized
fabric), and only the last rounds, which move ``1/N`` of it, cross pods, where three-tier
fabrics are oversubscribed. The doubling rounds run in the reverse order (largest last, between
neighbours again). The number of nodes must be a power of two.
"""

from __future__ import annotations

import numpy as np

from cclc.algorithms import Algorithm, NoBound, register
from cclc.algorithms.common import PairRouter, even_split, pair_router
from cclc.algorithms.hierarchical import node_grid
from cclc.algorithms.nic_spread import NicSpread, SpreadBuilder
from cclc.algorithms.torus_collectives import KINDS
from cclc.collective import Collective, CollectiveKind
from cclc.errors import CollectiveError
from cclc.ir import Buf, OpKind, Schedule, ScheduleBuilder

__all__ = ["PIECES", "rail_positions", "rail_steps"]

NAME = "rail_halving"

#: a rail round moves at most ``1/PIECES`` of a share per step: the node forwards each piece
#: to its other GPUs while the next one crosses the rail, so all that is left after the rail's
#: last round is the forward of its last piece (1/16 of a share: 8 MiB of a 1 GiB AllGather
#: on 512 nodes, against 64 MiB, half the share, uncut)
PIECES = 16


def rail_positions(nodes: int) -> np.ndarray:
    """``node[v]``: the node at rail position ``v`` (``nodes`` a power of two), the bit
    reversal of ``v``, so that positions ``v`` and ``v xor nodes/2`` are nodes ``2k`` and
    ``2k + 1``.

    >>> rail_positions(8).tolist()
    [0, 4, 2, 6, 1, 5, 3, 7]
    """
    bits = nodes.bit_length() - 1
    v = np.arange(nodes, dtype=np.int64)
    out = np.zeros(nodes, dtype=np.int64)
    for k in range(bits):
        out |= ((v >> k) & 1) << (bits - 1 - k)
    return out


def _applicable(coll: Collective, **params) -> str | None:
    if coll.kind not in KINDS:
        return f"{NAME} does not serve {coll.kind.value}"
    if params:
        return f"{NAME} takes no parameters (got {', '.join(sorted(params))})"
    members, why = node_grid(coll)
    if why or members is None:
        return why
    nodes = members.shape[0]
    if nodes & (nodes - 1):
        return (f"{NAME} needs a power-of-two number of nodes (the group spans {nodes}); "
                "use hierarchical")
    if coll.count < coll.n:
        return (f"{NAME} needs at least one element per rank ({coll.count} elements of "
                f"{coll.dtype.value} on {coll.n} ranks)")
    return None


def _ops(coll: Collective, **params) -> int:
    """The ops the build issues (the module docstring counts them; a member whose NIC failed
    adds a part per live NIC of its server to each of its rail ops, :mod:`.nic_spread`)."""
    members, why = node_grid(coll)
    if why or members is None:
        return coll.n
    nodes, gpus = members.shape
    gather = 1 + rail_steps(nodes) * gpus + gpus - 1       # 1 + S + (G - 1)(S + 1)
    per_rank = {CollectiveKind.ALLGATHER: gather, CollectiveKind.REDUCESCATTER: gather + 1,
                CollectiveKind.ALLREDUCE: 2 * gather}[coll.kind]
    lay = _Layout(members)
    spread, _ = _spread(coll, lay)
    extra = spread.extra_ops(*_rail_ops(lay, coll.kind)) if spread.active else 0
    return coll.n * per_rank + extra


def _rail_ops(lay: _Layout, kind: CollectiveKind) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(src, dst, times)``: the ops between servers that the build issues, as pairs of
    group indices and how many ops each pair has (every rail round's pieces in the halving or
    the doubling, and a ReduceScatter's or AllGather's hand-off)."""
    n, N = lay.rank.size, lay.nodes
    ranks = np.arange(n)
    rounds = 2 if kind is CollectiveKind.ALLREDUCE else 1
    src, dst, times = [], [], []
    mask = 1
    while mask < N:
        src.append(ranks)
        dst.append(lay.at[lay.gpu, lay.pos ^ mask])
        times.append(np.full(n, rounds * -(-mask // _piece(N))))
        mask <<= 1
    if kind is CollectiveKind.REDUCESCATTER:
        src.append(ranks)
        dst.append(lay.gpu * N + lay.pos)
        times.append(np.ones(n, dtype=np.int64))
    elif kind is CollectiveKind.ALLGATHER:
        src.append(ranks)
        dst.append(lay.at[ranks // N, ranks % N])
        times.append(np.ones(n, dtype=np.int64))
    return np.concatenate(src), np.concatenate(dst), np.concatenate(times)


def _slots(coll: Collective, **params) -> int:
    """Chunk slots of one rank: ``n`` chunks in every buffer but a ReduceScatter's output
    (one) and an AllGather's input (one), plus the chunks cut for members whose NIC failed
    (:func:`_spread`)."""
    n = coll.n
    slots = {CollectiveKind.ALLREDUCE: 3 * n, CollectiveKind.REDUCESCATTER: 2 * n + 1,
             CollectiveKind.ALLGATHER: n + 1}.get(coll.kind, 1)
    members, why = node_grid(coll)
    if why or members is None:
        return slots
    spread, cut = _spread(coll, _Layout(members))
    return slots + _cut_slots(spread, cut)


def _cut_slots(spread: NicSpread, cut: tuple[np.ndarray, ...]) -> int:
    """The slots per rank that cutting ``cut`` adds: ``factor - 1`` per cut chunk, and as
    many on every rank for a one-chunk buffer cut by rank (the others pad it)."""
    f = spread.factor
    return sum((f - 1) * (1 if m.ndim == 2 else int(m.sum())) for m in cut)


#: the most chunk slots (over all ranks) that cutting chunks for members whose NIC failed may
#: add: beyond it the schedule keeps one relay per such member (its verification would cost
#: more than the fault does)
MAX_CUT_SLOTS = 1 << 26


def _spread(coll: Collective, lay: _Layout) -> tuple[NicSpread, tuple[np.ndarray, ...]]:
    """How the members whose NIC failed are spread over their servers' live NICs
    (:mod:`.nic_spread`) and which chunks of each buffer (input, output, scratch) are cut
    for it: the shares of those members' rails, the chunks their rail rounds move, and of a
    ReduceScatter's output or an AllGather's input (one chunk) the ranks whose block is in
    such a share (the hand-off of chunk ``i`` joins rank ``i``'s one chunk). Nothing is cut
    where that would add more than :data:`MAX_CUT_SLOTS` slots."""
    n, N = coll.n, lay.nodes
    spread = NicSpread(coll, coll.count // n)
    shared = np.zeros(n, dtype=bool)
    for g in np.unique(lay.gpu[spread.dead]).tolist():
        shared[g * N:(g + 1) * N] = True
    by_rank = shared[:, None]            # chunk i of the shares is rank i's block
    none = np.zeros(0, dtype=bool)
    cut = {CollectiveKind.ALLREDUCE: (shared, shared, shared),
           CollectiveKind.REDUCESCATTER: (shared, by_rank, shared),
           CollectiveKind.ALLGATHER: (by_rank, shared, none)}.get(coll.kind, (none,) * 3)
    if not spread.active or n * _cut_slots(spread, cut) > MAX_CUT_SLOTS:
        return spread.kept_whole(), tuple(np.zeros_like(m) for m in cut)
    return spread, cut


class _Layout:
    """Where everything is: ``rank[h, g]`` the group index of GPU ``g`` of node ``h`` (nodes
    by first appearance), ``pos[i]`` the rail position of group index ``i``, ``at[g, v]``
    the group index at rail position ``v`` of rail ``g``."""

    def __init__(self, members: np.ndarray):
        self.rank = members
        self.nodes, self.gpus = members.shape
        node_at = rail_positions(self.nodes)
        self.at = members[node_at].T                      # (gpus, nodes)
        self.pos = np.empty(members.size, dtype=np.int64)
        self.gpu = np.empty(members.size, dtype=np.int64)
        self.pos[self.at] = np.arange(self.nodes)[None, :]
        self.gpu[members] = np.arange(self.gpus)[None, :]


def _node_of(lay: _Layout) -> np.ndarray:
    """The node index of every group index."""
    node = np.empty(lay.rank.size, dtype=np.int64)
    node[lay.rank] = np.arange(lay.nodes)[:, None]
    return node


def _forward(b: ScheduleBuilder, routes: PairRouter, lay: _Layout, step: int, buf: Buf,
             off: np.ndarray, count: int) -> None:
    """Every GPU copies chunks ``off .. off + count - 1`` of its own share from ``buf`` to the
    same place in the outputs of its node's other GPUs, one op per peer (each peer receives
    a different share from each sender, so no slot is written twice in the step)."""
    ranks = np.arange(lay.rank.size)
    node = _node_of(lay)
    for s in range(1, lay.gpus):
        dst = lay.rank[node, (lay.gpu + s) % lay.gpus]
        b.add(step=step, src=ranks, dst=dst, route=routes.ids(b, ranks, dst), src_buf=buf,
              src_off=off, dst_buf=Buf.OUTPUT, dst_off=off, count=count)


def _halving_items(nodes: int) -> list[tuple[int, int, int]]:
    """``(mask, first, count)`` of what the halving sends, in order: each round's half (``mask``
    chunks, ``N/2`` first) cut into pieces of :func:`_piece` chunks, then the chunk a rank
    keeps (``mask`` 0). At rail position ``v`` an item covers the share's chunks from
    ``((v xor mask) & ~(mask - 1)) + first`` (the kept one: ``v``)."""
    piece, mask = _piece(nodes), nodes >> 1
    items: list[tuple[int, int, int]] = []
    while mask:
        items.extend((mask, k, min(piece, mask - k)) for k in range(0, mask, piece))
        mask >>= 1
    return items + [(0, 0, 1)]


def _item_start(item: tuple[int, int, int], pos: np.ndarray) -> np.ndarray:
    mask, first, _ = item
    if mask == 0:
        return pos
    return ((pos ^ mask) & ~(mask - 1)) + first


def _intra_stages(gpus: int) -> list[np.ndarray]:
    """The intra-node reduce-scatter of one item, stage by stage: rows ``(src, dst, share)``
    (GPU indices), one op each, that add ``src``'s copy of the item in share ``share`` into
    ``dst``'s. With a power-of-two number of GPUs, recursive halving: stage ``b`` (``G/2``
    down to 1) has GPU ``g`` add the ``b`` shares of its block that the partner ``g xor b``
    keeps into the partner's, so the stages must run in order, and a piece is reduced in
    ``log2 G`` steps. Otherwise the diagonal: stage ``s`` has GPU ``g`` receive its own share
    from GPU ``g - s``, ``G - 1`` stages in any order. Either way a GPU sends and receives
    ``G - 1`` pieces per item, and a slot is written once per stage."""
    g = np.arange(gpus)
    if gpus & (gpus - 1):
        return [np.stack([(g - s) % gpus, g, g], axis=1) for s in range(1, gpus)]
    stages = []
    b = gpus >> 1
    while b:
        # the shares of x's block (their bits above b are x's) in the partner's half
        rows = [(x, x ^ b, (x & ~(2 * b - 1)) + ((x ^ b) & b) + k)
                for x in range(gpus) for k in range(b)]
        stages.append(np.array(rows, dtype=np.int64))
        b >>= 1
    return stages


def _halving_steps(lay: _Layout, items: list[tuple[int, int, int]], step: int,
                   ordered: bool) -> tuple[np.ndarray, list[int]]:
    """When each piece is reduced inside its node and when it crosses the rail.

    ``into[i, v, k]``: the step in which, on the nodes at rail position ``v``, stage ``k``
    of :func:`_intra_stages` runs for item ``i``; ``sent[i]``: the step in which every rank
    sends item ``i`` to its rail partner (the kept item: the step after the halving). Each
    stage takes the items in order, one per step (so the items' stages overlap: a pipeline a
    piece ahead of the rail), an item's stages in different steps (in order where
    ``ordered``), never in a step in which the rail partner's piece lands on one of the
    item's chunks (one write per slot per step), and a piece crosses the rail the step after
    its last stage.
    """
    nodes, stages = lay.nodes, len(_intra_stages(lay.gpus))
    pos = np.arange(nodes)
    into = np.zeros((len(items), nodes, stages), dtype=np.int64)
    sent: list[int] = []
    busy = np.full((nodes, stages), step - 1, dtype=np.int64)
    for i, item in enumerate(items):
        lo = _item_start(item, pos)
        hi = lo + item[2]
        # the steps in which an earlier round's piece lands on this item, per rail position
        lands: list[set[int]] = [set() for _ in range(nodes)]
        for j, (mask, first, count) in enumerate(items[:i]):
            if item[0] and mask <= item[0]:
                continue                  # this round or later: lands elsewhere
            r_lo = (pos & ~(mask - 1)) + first
            for hit in np.flatnonzero((r_lo < hi) & (lo < r_lo + count)).tolist():
                lands[hit].add(sent[j])
        for v in range(nodes):
            taken = set(lands[v])
            after = step - 1
            for k in range(stages):
                t = max(int(busy[v, k]), after) + 1 if ordered else int(busy[v, k]) + 1
                while t in taken:
                    t += 1
                taken.add(t)
                into[i, v, k] = busy[v, k] = after = t
        last = int(into[i].max()) if stages else step - 1
        sent.append(max(last + 1, sent[-1] + 1 if sent else step))
    return into, sent


def _halving(b: ScheduleBuilder, routes: PairRouter, lay: _Layout, step: int) -> int:
    """The intra-node reduce-scatter of the shares and the recursive halving of share ``g``
    along rail ``g``, pipelined (:func:`_halving_steps`), in scratch; returns the step after
    it. Afterwards the member at rail position ``v`` holds chunk ``g N + v`` reduced over
    every rank."""
    n, N = lay.rank.size, lay.nodes
    ranks = np.arange(n)
    items = _halving_items(N)
    stages = _intra_stages(lay.gpus)
    into, sent = _halving_steps(lay, items, step, ordered=not lay.gpus & (lay.gpus - 1))
    on_node = lay.rank[rail_positions(N)]                        # (N, G): by rail position
    for i, item in enumerate(items):
        start = _item_start(item, np.arange(N))
        for k, rows in enumerate(stages):
            src, dst = on_node[:, rows[:, 0]], on_node[:, rows[:, 1]]    # (N, rows)
            off = rows[None, :, 2] * N + start[:, None]
            at = np.broadcast_to(into[i, :, k][:, None], dst.shape)
            b.add(step=at.ravel(), src=src.ravel(), dst=dst.ravel(),
                  route=routes.ids(b, src.ravel(), dst.ravel()), kind=OpKind.REDUCE,
                  src_buf=Buf.SCRATCH, src_off=off.ravel(), dst_buf=Buf.SCRATCH,
                  dst_off=off.ravel(), count=item[2])
        if item[0]:
            dst = lay.at[lay.gpu, lay.pos ^ item[0]]
            off = lay.gpu * N + _item_start(item, lay.pos)
            b.add(step=sent[i], src=ranks, dst=dst, route=routes.ids(b, ranks, dst),
                  kind=OpKind.REDUCE, src_buf=Buf.SCRATCH, src_off=off, dst_buf=Buf.SCRATCH,
                  dst_off=off, count=item[2])
    return sent[-1]


def _doubling(b: ScheduleBuilder, routes: PairRouter, lay: _Layout, step: int,
              first_buf: Buf) -> int:
    """Recursive doubling of share ``g`` along rail ``g`` into the outputs, each piece that
    arrives forwarded to the node's other GPUs in the next step; the member at rail position
    ``v`` starts with chunk ``g N + v`` in its output (round 0 and its forward read it from
    ``first_buf``, where it is as well). Rounds of more than :func:`_piece` chunks are cut
    into pieces of that many, one step each."""
    n, N = lay.rank.size, lay.nodes
    ranks = np.arange(n)
    piece = _piece(N)
    pending: tuple[Buf, np.ndarray, int] = (first_buf, lay.gpu * N + lay.pos, 1)
    mask = 1
    while mask < N:
        dst = lay.at[lay.gpu, lay.pos ^ mask]
        own = lay.gpu * N + (lay.pos & ~(mask - 1))
        gained = lay.gpu * N + ((lay.pos ^ mask) & ~(mask - 1))
        route = routes.ids(b, ranks, dst)
        for k in range(0, mask, piece):
            count = min(piece, mask - k)
            b.add(step=step, src=ranks, dst=dst, route=route,
                  src_buf=first_buf if mask == 1 else Buf.OUTPUT, src_off=own + k,
                  dst_buf=Buf.OUTPUT, dst_off=own + k, count=count)
            _forward(b, routes, lay, step, *pending)
            pending = (Buf.OUTPUT, gained + k, count)
            step += 1
        mask <<= 1
    _forward(b, routes, lay, step, *pending)
    return step + 1


def _piece(nodes: int) -> int:
    """The most chunks a rail round moves in one step: ``nodes / PIECES`` (at least one)."""
    return max(1, nodes // PIECES)


def rail_steps(nodes: int) -> int:
    """The steps of the rail doubling (or halving) on ``nodes`` nodes: every round of
    ``2^r`` chunks takes ``ceil(2^r / piece)`` steps."""
    piece = _piece(nodes)
    return sum(-(-(1 << r) // piece) for r in range(nodes.bit_length() - 1))


def _build(coll: Collective, **params) -> Schedule:
    members, why = node_grid(coll)
    if why or members is None:
        raise CollectiveError(f"{NAME} cannot serve collective '{coll.name}': {why}")
    lay = _Layout(members)
    n, N = coll.n, lay.nodes
    ranks = np.arange(n)
    held = lay.gpu * N + lay.pos            # the chunk each rank holds after the halving
    # a GPU whose NIC failed leaves its server through all the live NICs, not one
    spread, cut = _spread(coll, lay)
    if coll.kind is CollectiveKind.ALLREDUCE:
        chunks = even_split(coll.count, n)
        b = SpreadBuilder(coll, spread, input=chunks, output=chunks, scratch=chunks, cut=cut)
        routes = pair_router(coll)
        b.add(step=0, src=ranks, dst=ranks, src_buf=Buf.INPUT, src_off=0, dst_buf=Buf.SCRATCH,
              dst_off=0, count=n)
        step = _halving(b, routes, lay, 1)
        b.add(step=step, src=ranks, dst=ranks, src_buf=Buf.SCRATCH, src_off=held,
              dst_buf=Buf.OUTPUT, dst_off=held)
        _doubling(b, routes, lay, step, Buf.SCRATCH)
        return b.build(NAME)
    per = coll.count // n
    if coll.kind is CollectiveKind.REDUCESCATTER:
        b = SpreadBuilder(coll, spread, input=[per] * n, output=[per], scratch=[per] * n,
                          cut=cut)
        routes = pair_router(coll)
        b.add(step=0, src=ranks, dst=ranks, src_buf=Buf.INPUT, src_off=0, dst_buf=Buf.SCRATCH,
              dst_off=0, count=n)
        step = _halving(b, routes, lay, 1)
        # chunk g N + v is block g N + v: its owner is that group index
        b.add(step=step, src=ranks, dst=held, route=routes.ids(b, ranks, held),
              src_buf=Buf.SCRATCH, src_off=held, dst_buf=Buf.OUTPUT, dst_off=0)
        return b.build(NAME)
    # allgather: the mirror; the rank holding block i after the hand-off is at[i // N, i % N]
    b = SpreadBuilder(coll, spread, input=[per], output=[per] * n, cut=cut)
    routes = pair_router(coll)
    holder = lay.at[ranks // N, ranks % N]
    b.add(step=0, src=ranks, dst=holder, route=routes.ids(b, ranks, holder),
          src_buf=Buf.INPUT, src_off=0, dst_buf=Buf.OUTPUT, dst_off=ranks)
    _doubling(b, routes, lay, 1, Buf.OUTPUT)
    return b.build(NAME)


register(Algorithm(
    name=NAME, collectives=KINDS, applicable=_applicable, build=_build, ops=_ops, slots=_slots,
    exact_ops=True,
    load=NoBound("no traffic rule: its rounds' link loads are not derived before building "
                 "(it has few ops, so building it is cheap)"),
    description="contiguous shares: intra-node reduce-scatter, recursive halving and doubling "
                "along each rail (bit-reversed node order), each doubled piece forwarded in "
                "the node a step later; one op per transfer"))
