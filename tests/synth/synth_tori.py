"""Faulty tori the synthesis tests share."""

from __future__ import annotations

from cclc.topology import torus, with_faults


def faulty_torus(dims, links=(), ranks=(), bandwidth: float = 20e9):
    """A torus (100 ns links) with both directions of each link index in ``links`` failed
    (indices taken modulo the number of links, so any integer names one) and the ranks in
    ``ranks`` (modulo the number of ranks)."""
    topo = torus("t", dims, bandwidth=bandwidth, latency=1e-7)
    pairs = []
    for i in links:
        i %= topo.n_links
        u, v = int(topo.link_src[i]), int(topo.link_dst[i])
        pairs += [(u, v), (v, u)]
    return with_faults(topo, pairs, ranks=[r % topo.n_ranks for r in ranks])


def torus_with_cuts(dims, cuts, bandwidth: float = 32e9):
    """A torus (100 ns links) with both directions of the link between each pair of
    coordinates in ``cuts`` failed."""
    topo = torus("t", dims, bandwidth=bandwidth, latency=1e-7)
    pairs = []
    for a, b in cuts:
        u, v = topo.rank_at(a), topo.rank_at(b)
        pairs += [(u, v), (v, u)]
    return with_faults(topo, pairs)


#: the faulty 5x5x5 torus of the benchmarks: two failed links in different rings
FAULTY_5X5X5 = (((0, 0, 0), (1, 0, 0)), ((2, 3, 4), (2, 3, 0)))
