"""Small, obviously correct schedules built by hand for the IR tests (not algorithms)."""

from __future__ import annotations

import numpy as np

from cclc.collective import CollectiveKind, DType, ReduceOp, make_collective
from cclc.ir import Buf, OpKind, ScheduleBuilder
from cclc.topology import torus

K = CollectiveKind


def coll(kind, topo=None, n=4, size=None, dtype=DType.FP32, op=ReduceOp.SUM, root=None,
         pair_sizes=None, group=None):
    topo = topo if topo is not None else torus("ring", (n,))
    group = tuple(range(topo.n_ranks)) if group is None else group
    n = len(group)
    if size is None and pair_sizes is None:
        per = 2 * dtype.itemsize
        split = kind in (K.ALLTOALL, K.ALLGATHER, K.REDUCESCATTER)
        size = per * n if split else per * 2
    return make_collective(f"{kind.value}", kind, topo, group, size, dtype=dtype, op=op,
                           root=root, pair_sizes=pair_sizes)


def route(b: ScheduleBuilder, i: int, j: int) -> int:
    """The route id of a shortest healthy path from group member i to j (0 when local)."""
    c = b.collective
    if i == j:
        return 0
    return b.route(c.topology.shortest_path_links(c.group[i], c.group[j]))


def _elems(c):
    return c.count


def direct_alltoall(c):
    """Step 0: every rank keeps its own block; step 1: every block goes straight to its rank."""
    n = c.n
    if c.pair_sizes is not None:
        pairs = c.pair_sizes // c.dtype.itemsize
        b = ScheduleBuilder(c, input=pairs, output=pairs.T)
    else:
        b = ScheduleBuilder(c, input=[c.count // n] * n, output=[c.count // n] * n)
    for i in range(n):
        for j in range(n):
            b.add(step=0 if i == j else 1, src=i, dst=j, route=route(b, i, j),
                  src_buf=Buf.INPUT, src_off=j, dst_buf=Buf.OUTPUT, dst_off=i)
    return b.build("direct")


def naive_allgather(c):
    n = c.n
    b = ScheduleBuilder(c, input=[c.count // n], output=[c.count // n] * n)
    for i in range(n):
        for j in range(n):
            b.add(step=0 if i == j else 1, src=i, dst=j, route=route(b, i, j),
                  src_buf=Buf.INPUT, src_off=0, dst_buf=Buf.OUTPUT, dst_off=i)
    return b.build("naive")


def direct_reducescatter(c):
    """Step 0: rank r copies its own block r; step k: rank r+k adds its block r into r."""
    n = c.n
    b = ScheduleBuilder(c, input=[c.count // n] * n, output=[c.count // n])
    for r in range(n):
        for k in range(n):
            i = (r + k) % n
            b.add(step=k, src=i, dst=r, route=route(b, i, r),
                  kind=OpKind.COPY if k == 0 else OpKind.REDUCE,
                  src_buf=Buf.INPUT, src_off=r, dst_buf=Buf.OUTPUT, dst_off=0)
    return b.build("direct")


def direct_allreduce(c, chunks=2):
    n = c.n
    b = ScheduleBuilder(c, input=[c.count // chunks] * chunks, output=[c.count // chunks] * chunks)
    for r in range(n):
        for k in range(n):
            i = (r + k) % n
            b.add(step=k, src=i, dst=r, route=route(b, i, r), count=chunks,
                  kind=OpKind.COPY if k == 0 else OpKind.REDUCE,
                  src_buf=Buf.INPUT, src_off=0, dst_buf=Buf.OUTPUT, dst_off=0)
    return b.build("direct")


def direct_broadcast(c):
    n = c.n
    b = ScheduleBuilder(c, input=[c.count], output=[c.count])
    for j in range(n):
        b.add(step=0, src=c.root, dst=j, route=route(b, c.root, j), src_buf=Buf.INPUT,
              src_off=0, dst_buf=Buf.OUTPUT, dst_off=0)
    return b.build("direct")


def direct_reduce(c):
    n = c.n
    b = ScheduleBuilder(c, input=[c.count], output=[c.count])
    for k in range(n):
        i = (c.root + k) % n
        b.add(step=k, src=i, dst=c.root, route=route(b, i, c.root),
              kind=OpKind.COPY if k == 0 else OpKind.REDUCE, src_buf=Buf.INPUT, src_off=0,
              dst_buf=Buf.OUTPUT, dst_off=0)
    return b.build("direct")


BUILDERS = {K.ALLTOALL: direct_alltoall, K.ALLGATHER: naive_allgather,
            K.REDUCESCATTER: direct_reducescatter, K.ALLREDUCE: direct_allreduce,
            K.BROADCAST: direct_broadcast, K.REDUCE: direct_reduce}


def build(c):
    return BUILDERS[c.kind](c)


def with_ops(s, **cols):
    """``s`` with some op columns replaced (arrays of the same length)."""
    from cclc.ir import Ops

    new = {k: np.array(v) for k, v in s.ops.columns().items()}
    new.update({k: np.asarray(v) for k, v in cols.items()})
    return s.replace(ops=Ops(**new))


def without_op(s, i):
    keep = np.ones(len(s.ops), dtype=bool)
    keep[i] = False
    return s.replace(ops=s.ops.take(keep))
