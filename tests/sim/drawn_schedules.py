"""Schedules of every applicable algorithm on small tori, with and without a failed link: the
draws the columnar simulations are compared with their loops on."""

from __future__ import annotations

from cclc.algorithms import algorithms_for
from cclc.collective import CollectiveKind, make_collective
from cclc.errors import CclError
from cclc.topology import torus, with_faults

KINDS = [CollectiveKind.ALLTOALL, CollectiveKind.ALLGATHER, CollectiveKind.ALLREDUCE,
         CollectiveKind.REDUCESCATTER, CollectiveKind.BROADCAST, CollectiveKind.REDUCE]


def schedules(dims, seed, kind, routing, fault, mult):
    t = torus("t", dims, bandwidth=10e9 + seed, latency=1e-7 * (1 + seed % 3), routing=routing)
    if fault and t.n_links:
        k = seed % t.n_links
        u, v = int(t.link_src[k]), int(t.link_dst[k])
        t2 = with_faults(t, links=[(u, v), (v, u)])
        t = t2 if t2.is_connected(t2.all_ranks()) else t
    n = t.n_ranks
    root = 0 if kind in (CollectiveKind.BROADCAST, CollectiveKind.REDUCE) else None
    c = make_collective("c", kind, t, t.all_ranks(), size=n * n * 4 * mult, root=root)
    for algo in algorithms_for(c):
        if algo.applicable(c) is not None:
            continue
        try:
            yield algo.name, algo.build(c)
        except CclError:
            continue
