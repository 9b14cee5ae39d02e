"""The small tori, healthy or with one failed link (both directions), that the planner's
bounds and estimates are checked on."""

from __future__ import annotations

from cclc.topology import torus, with_faults


def faulty_torus(dims, fault_seed: int | None, routing="none"):
    t = torus("t", dims, bandwidth=25e9, latency=1e-7, routing=routing)
    if fault_seed is not None and t.n_links:
        k = fault_seed % t.n_links
        u, v = int(t.link_src[k]), int(t.link_dst[k])
        t2 = with_faults(t, links=[(u, v), (v, u)])
        t = t2 if t2.is_connected(t2.all_ranks()) else t
    return t
