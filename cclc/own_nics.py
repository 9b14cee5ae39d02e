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

from cclc.ir import Routes, Schedule, csr_take, csr_take_pieces, intern_paths
from cclc.routing import FewestHopPaths
from cclc.sorting import first_occurrence_ids

__all__ = ["own_nic_routes"]


def own_nic_routes(s: Schedule) -> Schedule:
    """``s`` with each op between servers whose two GPUs have a healthy NIC of their own routed
    from the source's NIC to the destination's (see the module docstring); ``s`` itself where
    no route changes (off a fabric of servers, for one).

    The ops that keep their routes keep them in the order they first take them; the new
    paths follow, in the order their ops first take them, each once."""
    topo = s.topology
    if topo.kind != "fabric" or topo.node_of_rank is None:
        return s
    group = np.asarray(s.collective.group, dtype=np.int64)
    ops = s.ops
    src, dst = group[ops.src], group[ops.dst]
    rank, nic, usable = topo.gpu_nics()
    own = np.full(topo.n_ranks, -1, dtype=np.int64)
    first = np.flatnonzero(usable)[::-1]        # a GPU's first healthy NIC wins
    own[rank[first]] = nic[first]
    cross = np.flatnonzero((topo.node_of_rank[src] != topo.node_of_rank[dst])
                           & (own[src] >= 0) & (own[dst] >= 0))
    if not len(cross):
        return s
    # each distinct pair of GPUs once, in the order its ops first come
    pair_of, firsts = first_occurrence_ids(src[cross] * topo.n_ranks + dst[cross])
    a, c = src[cross[firsts]], dst[cross[firsts]]
    del firsts, src, dst
    offsets, links, ok = _nic_paths(s, own, a, c)
    del a, c
    # an op keeps its route where its pair has no such path
    moved = ok[pair_of]
    cross, pair_of = cross[moved], pair_of[moved]
    row_of_pair = np.cumsum(ok) - 1
    offsets, links = csr_take(offsets, links, np.flatnonzero(ok)) if not ok.all() \
        else (offsets, links)
    pair_of = row_of_pair[pair_of]
    del ok, moved, row_of_pair
    if not len(cross):
        return s
    old = s.routes
    if _same_paths(old, ops.route[cross], offsets, links, pair_of):
        return s
    # the table: the routes the ops not moved take, then the new paths
    keep = np.ones(len(ops), dtype=bool)
    keep[cross] = False
    old_rank, old_first = first_occurrence_ids(np.concatenate(
        [[0], ops.route[keep].astype(np.int64)]))
    kept_rows = np.concatenate([[0], ops.route[keep]])[old_first]
    kept = csr_take(old.offsets, old.links, kept_rows)
    ids, distinct = intern_paths([kept, (offsets, links)])
    route = np.empty(len(ops), dtype=np.int64)
    route[keep] = ids[old_rank[1:]]
    route[cross] = ids[len(kept_rows) + pair_of]
    del keep, old_rank, old_first, pair_of
    table = Routes(*csr_take_pieces([kept, (offsets, links)], distinct))
    cols = ops.columns()
    cols["route"] = route.astype(cols["route"].dtype)
    return s.replace(ops=type(ops)(**cols), routes=table)


def _same_paths(old: Routes, routes: np.ndarray, offsets: np.ndarray, links: np.ndarray,
                rows: np.ndarray) -> bool:
    """Whether route ``routes[i]`` of ``old`` is path ``rows[i]`` of the CSR table
    ``offsets``/``links``, for every ``i`` (a block of paths at a time, up to the first that
    differs)."""
    old_lengths, lengths = old.lengths(), np.diff(offsets)
    for lo in range(0, len(routes), _SAME_BLOCK):
        was_routes, now_rows = routes[lo:lo + _SAME_BLOCK], rows[lo:lo + _SAME_BLOCK]
        if not (old_lengths[was_routes] == lengths[now_rows]).all():
            return False
        _, was = csr_take(old.offsets, old.links, was_routes)
        _, now = csr_take(offsets, links, now_rows)
        if not (was == now).all():
            return False
    return True


#: paths :func:`_same_paths` compares at once
_SAME_BLOCK = 1 << 18


def _nic_paths(s: Schedule, own: np.ndarray, a: np.ndarray, c: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each pair's route (GPUs ``a[i] -> c[i]``) as a CSR table: the source's hop to its NIC,
    the fewest hops from that NIC to the destination's over healthy links, the hop from it
    to the destination; and whether the pair has one (a pair whose NICs are joined by no
    route free of GPUs, or whose hops to or from them are down, has none: its row is
    empty)."""
    topo = s.topology
    keys, hop_links = topo.hop_links()
    v = topo.n_vertices

    def link(tail: np.ndarray, head: np.ndarray) -> np.ndarray:
        """The link of each hop ``tail -> head``; -1 where none."""
        cell = tail * v + head
        at = np.minimum(np.searchsorted(keys, cell), len(keys) - 1)
        return np.where(keys[at] == cell, hop_links[at], -1)

    gpus = np.flatnonzero(own >= 0)
    up, down = np.full(len(own), -1), np.full(len(own), -1)
    up[gpus], down[gpus] = link(gpus, own[gpus]), link(own[gpus], gpus)
    # the NICs of the sources, each a row of the searches (a table, not a search of 16.7M
    # entries at 4,096 GPUs)
    sends = np.zeros(len(own), dtype=bool)
    sends[a] = True
    sources = np.unique(own[sends])
    row_of = np.full(v, -1, dtype=np.int32)
    row_of[sources] = np.arange(len(sources), dtype=np.int32)
    paths = FewestHopPaths.of(topo, sources)
    rows = row_of[own[a]]
    ends = own[c].astype(np.int32)
    hops = paths.hops(rows, ends)
    ok = np.isfinite(hops) & (up[a] >= 0) & (down[c] >= 0)
    lengths = np.where(ok, hops + 2, 0).astype(np.int64)
    del hops
    offsets = np.zeros(len(a) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    links = np.empty(int(offsets[-1]), dtype=np.int32)
    walk = np.flatnonzero(ok)
    links[offsets[walk]] = up[a[walk]]
    links[offsets[walk + 1] - 1] = down[c[walk]]
    # a path through a GPU is one that GPU would forward: none
    crosses = paths.write(rows[walk], ends[walk], links, offsets[walk + 1] - 2,
                          avoid=np.arange(v) < topo.n_ranks)
    ok[walk[crosses]] = False
    return offsets, links, ok
