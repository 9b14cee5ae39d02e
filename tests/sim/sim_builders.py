"""Hand-built schedules for the simulator and bound tests (built op by op, no algorithm code)."""

from __future__ import annotations

import numpy as np

from cclc.collective import CollectiveKind, DType, make_collective
from cclc.ir import Buf, OpKind, ScheduleBuilder
from cclc.topology import Topology


def ring_allgather(topo: Topology, size: int, group=None):
    """Ring allgather over ``group`` (a ring of ``topo``): N-1 steps, each rank forwards one
    block to its + neighbour; step 0 also copies the own block locally."""
    group = tuple(range(topo.n_ranks)) if group is None else tuple(group)
    n = len(group)
    coll = make_collective("ag", CollectiveKind.ALLGATHER, topo, group, size=size,
                           dtype=DType.UINT8)
    b = ScheduleBuilder(coll, input=[size // n], output=[size // n] * n)
    nxt = [topo.shortest_path_links(group[r], group[(r + 1) % n]) for r in range(n)]
    routes = [b.route(p) for p in nxt]
    for r in range(n):
        b.add(step=0, src=r, dst=r, src_buf=Buf.INPUT, src_off=0, dst_buf=Buf.OUTPUT, dst_off=r)
        b.add(step=0, src=r, dst=(r + 1) % n, route=routes[r], src_buf=Buf.INPUT, src_off=0,
              dst_buf=Buf.OUTPUT, dst_off=r)
    for k in range(1, n - 1):
        for r in range(n):
            blk = (r - k) % n
            b.add(step=k, src=r, dst=(r + 1) % n, route=routes[r], src_buf=Buf.OUTPUT,
                  src_off=blk, dst_buf=Buf.OUTPUT, dst_off=blk)
    return b.build("ring")


def direct_alltoall(topo: Topology, size: int, group=None, pipelined_steps: bool = False):
    """Every pair over a shortest path in one step (or one step per distance when
    ``pipelined_steps``); the own block is copied locally."""
    group = tuple(range(topo.n_ranks)) if group is None else tuple(group)
    n = len(group)
    coll = make_collective("a2a", CollectiveKind.ALLTOALL, topo, group, size=size,
                           dtype=DType.UINT8)
    b = ScheduleBuilder(coll, input=[size // n] * n, output=[size // n] * n)
    for i in range(n):
        for j in range(n):
            path = topo.shortest_path_links(group[i], group[j])
            step = (j - i) % n if pipelined_steps else 0
            b.add(step=step, src=i, dst=j, route=b.route(path), src_buf=Buf.INPUT, src_off=j,
                  dst_buf=Buf.OUTPUT, dst_off=i)
    return b.build("direct")


def chain(topo: Topology, size: int, chunks: int):
    """A pipelined broadcast down the line 0 -> 1 -> ... -> n-1 in ``chunks`` pieces, one
    chunk per step per hop (chunk c crosses hop h in step c + h)."""
    n = topo.n_ranks
    coll = make_collective("bc", CollectiveKind.BROADCAST, topo, tuple(range(n)), size=size,
                           dtype=DType.UINT8, root=0)
    per = size // chunks
    b = ScheduleBuilder(coll, input=[per] * chunks, output=[per] * chunks)
    b.add(step=0, src=0, dst=0, src_buf=Buf.INPUT, src_off=np.arange(chunks),
          dst_buf=Buf.OUTPUT, dst_off=np.arange(chunks))
    for h in range(n - 1):
        r = b.route(topo.shortest_path_links(h, h + 1))
        for c in range(chunks):
            b.add(step=c + h, src=h, dst=h + 1, route=r, src_buf=Buf.INPUT if h == 0 else
                  Buf.OUTPUT, src_off=c, dst_buf=Buf.OUTPUT, dst_off=c)
    return b.build("chain")


def folded_reducescatter(topo: Topology, size: int, dtype: DType = DType.UINT8,
                         name: str = "rs"):
    """ReduceScatter that folds each peer's partial sum in a step of its own: each rank
    copies its own block into its output (step 0, local), then for ``k = 1 .. n-1`` sends its
    block ``r + k`` into that rank's one receive slot (step ``2k - 1``) and the receiver
    reduces the slot into its output (step ``2k``, local ops alone): ``n`` steps of local
    ops between ``n - 1`` with an op between two ranks, the slot reused from one peer step
    to the next. ``size``: bytes per rank's input."""
    n = topo.n_ranks
    coll = make_collective(name, CollectiveKind.REDUCESCATTER, topo, tuple(range(n)),
                           size=size, dtype=dtype)
    per = size // n // dtype.itemsize
    b = ScheduleBuilder(coll, input=[per] * n, output=[per], scratch=[per])
    ranks = np.arange(n)
    b.add(step=0, src=ranks, dst=ranks, src_buf=Buf.INPUT, src_off=ranks, dst_buf=Buf.OUTPUT,
          dst_off=0)
    for k in range(1, n):
        for r in range(n):
            d = (r + k) % n
            b.add(step=2 * k - 1, src=r, dst=d, route=b.route(topo.shortest_path_links(r, d)),
                  src_buf=Buf.INPUT, src_off=d, dst_buf=Buf.SCRATCH, dst_off=0)
        b.add(step=2 * k, src=ranks, dst=ranks, kind=OpKind.REDUCE, src_buf=Buf.SCRATCH,
              src_off=0, dst_buf=Buf.OUTPUT, dst_off=0)
    return b.build("folded")
