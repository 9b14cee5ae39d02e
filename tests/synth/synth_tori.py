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


def assert_receive_slots_per_member(s) -> None:
    """A tree schedule's receive slots (the scratch after its partial-sum region, which is
    as long as the input) are as many of each size as the member that uses the most of that
    size: counted from the ops, rank by rank."""
    import numpy as np

    from cclc.ir import Buf

    base = s.n_chunks(Buf.INPUT)
    lay = s.layouts[Buf.SCRATCH]
    assert lay.ndim == 1
    o = s.ops
    used: list[set[int]] = [set() for _ in range(s.n)]
    for rank, buf, off in ((o.src, o.src_buf, o.src_off), (o.dst, o.dst_buf, o.dst_off)):
        for i in np.flatnonzero(buf == Buf.SCRATCH).tolist():
            used[int(rank[i])].update(c for c in range(int(off[i]), int(off[i] + o.count[i]))
                                      if c >= base)
    sizes = {int(x) for x in lay[base:].tolist()}
    most = sum(max(sum(1 for c in u if lay[c] == size) for u in used) for size in sizes)
    assert s.n_chunks(Buf.SCRATCH) - base == most
