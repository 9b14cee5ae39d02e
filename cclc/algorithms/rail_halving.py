"""Hierarchical collectives with few ops: contiguous shares inside a node, recursive halving and
doubling along each rail.

:mod:`cclc.algorithms.hierarchical` gives GPU ``g`` of every node the blocks of the ranks with
GPU index ``g``: blocks ``g, g+G, g+2G, ...`` of a rank-ordered buffer, which are not contiguous,
so each intra-node step moves one op per node (``n (n - 1)`` ops per direction in all: 16.7M at
4,096 ranks). Here GPU ``g`` owns the *contiguous* share ``g`` of the buffer (chunks
``g N .. g N + N - 1`` of ``G N``), so every transfer is one op:

* ReduceScatter: the intra-node reduce-scatter of the shares (``G - 1`` steps; in step ``s``
  GPU ``g`` reduces share ``g + s`` into GPU ``g + s``: one write per slot per step), then a
  recursive-halving reduce-scatter of share ``g`` along rail ``g`` (``log2 N`` rounds), after
  which rail member ``v`` holds chunk ``g N + v`` summed over the group; one last op hands it
  to the rank that owns that block (the chunk is the block: share ``g`` is blocks ``g N ..``).
* AllGather: the mirror: every rank hands its block to the rail member that holds it, a
  recursive-doubling all-gather along each rail, an intra-node all-gather of the shares.
* AllReduce: intra-node reduce-scatter, rail halving, rail doubling, intra-node all-gather;
  no owner hand-off (the chunks are an even split of the buffer, not blocks).

Per rank that is ``2 (G - 1) + 2 log2 N`` ops plus two local copies or hand-offs: 139k ops for an
AllReduce on 512 nodes of 8 GPUs. The network carries ``1/G`` of the data, spread over all
``G`` NICs of a node, as :mod:`cclc.algorithms.hierarchical` does.

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
from cclc.algorithms.torus_collectives import KINDS
from cclc.collective import Collective, CollectiveKind
from cclc.errors import CollectiveError
from cclc.ir import Buf, OpKind, Schedule, ScheduleBuilder

__all__ = ["rail_positions"]

NAME = "rail_halving"


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
    """Every rank sends in every intra-node step and every rail round, once per phase (two
    for AllReduce), a lower bound (the build adds local copies)."""
    members, why = node_grid(coll)
    if why or members is None:
        return coll.n
    nodes, gpus = members.shape
    rounds = nodes.bit_length() - 1
    phases = 2 if coll.kind is CollectiveKind.ALLREDUCE else 1
    return coll.n * phases * (gpus - 1 + rounds)


def _slots(coll: Collective, **params) -> int:
    """Chunk slots of one rank: ``n`` chunks in every buffer but a ReduceScatter's output
    (one) and an AllGather's input (one)."""
    n = coll.n
    return {CollectiveKind.ALLREDUCE: 3 * n, CollectiveKind.REDUCESCATTER: 2 * n + 1,
            CollectiveKind.ALLGATHER: n + 1}.get(coll.kind, 1)


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


def _intra(b: ScheduleBuilder, routes: PairRouter, lay: _Layout, step: int, buf: Buf,
           kind: OpKind) -> int:
    """The intra-node exchange of shares: reduce-scatter (every GPU reduces share ``g + s``
    into GPU ``g + s``) or all-gather (GPU ``g`` copies its own share ``g`` to GPU
    ``g - s``), one partner per step so no slot is written twice in a step."""
    n, N, G = lay.rank.size, lay.nodes, lay.gpus
    ranks = np.arange(n)
    node = np.empty(n, dtype=np.int64)
    node[lay.rank] = np.arange(N)[:, None]
    for s in range(1, G):
        if kind is OpKind.REDUCE:
            share = (lay.gpu + s) % G
            dst = lay.rank[node, share]
        else:
            share = lay.gpu
            dst = lay.rank[node, (lay.gpu - s) % G]
        b.add(step=step, src=ranks, dst=dst, route=routes.ids(b, ranks, dst),
              kind=kind, src_buf=buf, src_off=share * N, dst_buf=buf, dst_off=share * N,
              count=N)
        step += 1
    return step


def _halving(b: ScheduleBuilder, routes: PairRouter, lay: _Layout, step: int) -> int:
    """Recursive halving of share ``g`` along rail ``g`` in scratch: afterwards the member at
    rail position ``v`` holds chunk ``g N + v`` reduced over every rank."""
    n, N = lay.rank.size, lay.nodes
    ranks = np.arange(n)
    mask = N >> 1
    while mask:
        w = lay.pos ^ mask
        dst = lay.at[lay.gpu, w]
        off = lay.gpu * N + (w & ~(mask - 1))
        b.add(step=step, src=ranks, dst=dst, route=routes.ids(b, ranks, dst),
              kind=OpKind.REDUCE, src_buf=Buf.SCRATCH, src_off=off, dst_buf=Buf.SCRATCH,
              dst_off=off, count=mask)
        step += 1
        mask >>= 1
    return step


def _doubling(b: ScheduleBuilder, routes: PairRouter, lay: _Layout, step: int,
              first_buf: Buf) -> int:
    """Recursive doubling of share ``g`` along rail ``g`` into the outputs; the member at
    rail position ``v`` starts with chunk ``g N + v`` in its output (round 0 reads it from
    ``first_buf``, where it is as well)."""
    n, N = lay.rank.size, lay.nodes
    ranks = np.arange(n)
    mask = 1
    while mask < N:
        dst = lay.at[lay.gpu, lay.pos ^ mask]
        off = lay.gpu * N + (lay.pos & ~(mask - 1))
        b.add(step=step, src=ranks, dst=dst, route=routes.ids(b, ranks, dst),
              src_buf=first_buf if mask == 1 else Buf.OUTPUT, src_off=off, dst_buf=Buf.OUTPUT,
              dst_off=off, count=mask)
        step += 1
        mask <<= 1
    return step


def _build(coll: Collective, **params) -> Schedule:
    members, why = node_grid(coll)
    if why or members is None:
        raise CollectiveError(f"{NAME} cannot serve collective '{coll.name}': {why}")
    lay = _Layout(members)
    n, N = coll.n, lay.nodes
    ranks = np.arange(n)
    held = lay.gpu * N + lay.pos            # the chunk each rank holds after the halving
    if coll.kind is CollectiveKind.ALLREDUCE:
        chunks = even_split(coll.count, n)
        b = ScheduleBuilder(coll, input=chunks, output=chunks, scratch=chunks)
        routes = pair_router(coll)
        b.add(step=0, src=ranks, dst=ranks, src_buf=Buf.INPUT, src_off=0, dst_buf=Buf.SCRATCH,
              dst_off=0, count=n)
        step = _halving(b, routes, lay, _intra(b, routes, lay, 1, Buf.SCRATCH, OpKind.REDUCE))
        b.add(step=step, src=ranks, dst=ranks, src_buf=Buf.SCRATCH, src_off=held,
              dst_buf=Buf.OUTPUT, dst_off=held)
        step = _doubling(b, routes, lay, step, Buf.SCRATCH)
        _intra(b, routes, lay, step, Buf.OUTPUT, OpKind.COPY)
        return b.build(NAME)
    per = coll.count // n
    if coll.kind is CollectiveKind.REDUCESCATTER:
        b = ScheduleBuilder(coll, input=[per] * n, output=[per], scratch=[per] * n)
        routes = pair_router(coll)
        b.add(step=0, src=ranks, dst=ranks, src_buf=Buf.INPUT, src_off=0, dst_buf=Buf.SCRATCH,
              dst_off=0, count=n)
        step = _halving(b, routes, lay, _intra(b, routes, lay, 1, Buf.SCRATCH, OpKind.REDUCE))
        # chunk g N + v is block g N + v: its owner is that group index
        b.add(step=step, src=ranks, dst=held, route=routes.ids(b, ranks, held),
              src_buf=Buf.SCRATCH, src_off=held, dst_buf=Buf.OUTPUT, dst_off=0)
        return b.build(NAME)
    # allgather: the mirror; the rank holding block i after the hand-off is at[i // N, i % N]
    b = ScheduleBuilder(coll, input=[per], output=[per] * n)
    routes = pair_router(coll)
    holder = lay.at[ranks // N, ranks % N]
    b.add(step=0, src=ranks, dst=holder, route=routes.ids(b, ranks, holder),
          src_buf=Buf.INPUT, src_off=0, dst_buf=Buf.OUTPUT, dst_off=ranks)
    _intra(b, routes, lay, _doubling(b, routes, lay, 1, Buf.OUTPUT), Buf.OUTPUT, OpKind.COPY)
    return b.build(NAME)


register(Algorithm(
    name=NAME, collectives=KINDS, applicable=_applicable, build=_build, ops=_ops, slots=_slots,
    load=NoBound("no traffic rule: its rounds' link loads are not derived before building "
                 "(it has few ops, so building it is cheap)"),
    description="contiguous shares: intra-node reduce-scatter/all-gather, recursive halving "
                "and doubling along each rail (bit-reversed node order), one op per transfer"))
