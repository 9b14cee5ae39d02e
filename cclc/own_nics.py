"""Routes between servers through each GPU's own NIC: what a runtime that sends a GPU's
messages only through that GPU's NIC runs (MSCCL++'s port channels,
:attr:`backends.contract.Backend.own_nics`).

On a rail-optimized fabric the fewest-hop routes between GPUs of different rails on two
servers tie: through the source's NIC, its leaf, a spine, the destination's leaf and NIC; or
over NVLink to the GPU on the destination's rail and out through that GPU's NIC (NCCL's PXN).
The searches may take either, and NCCL's runtimes take the second. :func:`own_nic_routes`
gives every op between servers whose two GPUs have a healthy NIC of their own the fewest-hop
route from the one NIC to the other (on a leaf/spine or three-tier fabric it passes no GPU);
the routing pass then plans its spines as any other op's. The ops of a GPU without a healthy
NIC of its own keep their routes (its traffic crosses another GPU, which a runtime that sends
through its own NIC only cannot do: that output refuses the schedule).
"""

from __future__ import annotations

import numpy as np

from cclc.ir import Schedule, ScheduleBuilder

__all__ = ["own_nic_routes"]


def own_nic_routes(s: Schedule) -> Schedule:
    """``s`` with each op between servers whose two GPUs have a healthy NIC of their own routed
    from the source's NIC to the destination's (see the module docstring); ``s`` itself where
    no route changes (off a fabric of servers, for one)."""
    topo = s.topology
    if topo.kind != "fabric" or topo.node_of_rank is None:
        return s
    group = np.asarray(s.collective.group, dtype=np.int64)
    ops = s.ops
    src, dst = group[ops.src], group[ops.dst]
    cross = np.flatnonzero(topo.node_of_rank[src] != topo.node_of_rank[dst])
    if not len(cross):
        return s
    rank, nic, usable = topo.gpu_nics()
    own = np.full(topo.n_ranks, -1, dtype=np.int64)
    first = np.flatnonzero(usable)[::-1]        # a GPU's first healthy NIC wins
    own[rank[first]] = nic[first]
    cross = cross[(own[src[cross]] >= 0) & (own[dst[cross]] >= 0)]
    pairs, inverse = np.unique(np.stack([src[cross], dst[cross]]), axis=1, return_inverse=True)
    paths = _nic_paths(s, own, pairs)
    b = ScheduleBuilder(s.collective, *s.layouts)
    route = b.routes(s.routes.offsets, s.routes.links)[ops.route]
    # each pair's new route id, -1 where it has none
    pair_route = np.array([b.route(paths[p]) if p in paths else -1
                           for p in map(tuple, pairs.T.tolist())], dtype=np.int64)
    new = pair_route[inverse.reshape(-1)]
    take = new >= 0
    new = new[take]
    if (route[cross[take]] == new).all():
        return s
    route[cross[take]] = new
    b.add(step=ops.step, src=ops.src, dst=ops.dst, route=route, kind=ops.kind,
          src_buf=ops.src_buf, src_off=ops.src_off, dst_buf=ops.dst_buf, dst_off=ops.dst_off,
          count=ops.count)
    return b.build(s.algorithm, s.schedule, s.params)


def _nic_paths(s: Schedule, own: np.ndarray, pairs: np.ndarray
               ) -> dict[tuple[int, int], list[int]]:
    """The links of each pair's route (GPUs ``pairs[0] -> pairs[1]``): the source's hop to
    its NIC, the fewest hops from that NIC to the destination's over healthy links, the hop
    from it to the destination; a pair whose NICs are joined by no route free of GPUs, or
    whose hops to or from them are down, has none."""
    topo = s.topology
    keys, links = topo.hop_links()
    v = topo.n_vertices

    def link(tail: int, head: int) -> int | None:
        at = int(np.searchsorted(keys, tail * v + head))
        return int(links[at]) if at < len(keys) and keys[at] == tail * v + head else None

    sources = np.unique(own[pairs[0]])
    dist, pred = topo.fewest_hops(sources)
    row = {int(n): i for i, n in enumerate(sources.tolist())}
    out: dict[tuple[int, int], list[int]] = {}
    for a, c in pairs.T.tolist():
        start, end = int(own[a]), int(own[c])
        r = row[start]
        if not np.isfinite(dist[r, end]):
            continue
        verts = [end]
        while verts[-1] != start:
            verts.append(int(pred[r, verts[-1]]))
        verts.reverse()
        if any(x < topo.n_ranks for x in verts):
            continue
        hops = [link(a, start)] + [link(x, y) for x, y in zip(verts, verts[1:], strict=False)] \
            + [link(end, c)]
        if None not in hops:
            out[(a, c)] = [h for h in hops if h is not None]
    return out
