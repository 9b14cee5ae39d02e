"""The closed-form lower bounds on the time of a collective: hop bytes, injection, cuts and
latency (:func:`cclc.bounds.bounds` adds the LP and gathers them), faults included.

Every bound is in seconds and holds for any schedule the cost model of :mod:`cclc.sim` can
time; :class:`Facts` holds the arrays every bound (the LP's too) reads.

"Links" below are only those a schedule of the group can use (:mod:`cclc.group_links`): on a
route the declared routing carries between two members. A GPU outside the group runs nothing
and relays nothing (the relay lowering refuses it), so a member of a sub-group never reaches
the NIC of another GPU of its server unless a fewest-hop route to a member goes that way. Each
bound below is a bound for flows on some subgraph; every schedule's flows live on these links,
so each stays a lower bound for every schedule the declared machine runs, and for a group of
every rank they are every healthy link (nothing changes).

``hop_bytes``
    Bytes times the fewest links they must cross, over the total healthy link bandwidth.
    Alltoall: every pair's bytes times its shortest hop distance (tight on tori with minimal
    routing). Allgather / broadcast: a block reaches each other rank over a distinct link into
    that rank, so it crosses at least ``n-1`` links: ``(n-1) S``. Reducescatter / reduce: the
    same by duality (a reduction tree spans the group). Allreduce: ``2 (n-1) S`` (an element
    crosses ``n-1`` links to be complete at one rank, then enters the ``n-1`` others).
``injection``
    The bytes one rank must send over its healthy outgoing bandwidth, or receive over its
    incoming bandwidth, the worst rank. Alltoall: its row / column of the size matrix;
    allgather receives ``(n-1)/n S``; reducescatter sends ``(n-1)/n S``; allreduce sends
    ``2 (n-1)/n S`` (the standard bound without in-network reduction: some rank must send that
    much, Patarasuk & Yuan) over the largest outgoing bandwidth of a rank; on a machine made of
    nodes with members in ``N >= 2`` of them, also ``2 (N-1) S`` over the nodes' total
    outgoing (incoming) bandwidth, whichever is larger: a node's GPUs share what they know
    through its switch, so the nodes are the parties of a one-way gossip, which needs ``2 N -
    2`` messages (Harary & Schwenk), so every element leaves some node ``2 (N-1)`` times
    (hgx16_leafspine: 629 us at 128 MiB where the rank form gives 533 us); broadcast / reduce:
    the root sends / receives ``S`` and every other rank receives / sends ``S``.
``cut``
    A vertex set ``A`` and the healthy capacity of the links leaving (entering) it: the data
    that must cross, over that capacity. Alltoall: the bytes between the two sides.
    Allgather: ``|A| S/n`` must enter the other side (each block at least once);
    reducescatter: ``|rest| S/n`` must leave ``A`` (one reduced block per destination
    outside); allreduce: ``S`` each way (a partial sum of every element); broadcast/reduce:
    ``S`` across any cut separating the root from a rank. The cuts tried: on a torus or mesh,
    the bisection of every dimension at every offset (half the ring on one side; for a mesh
    every prefix) — for a healthy torus the largest dimension's bisection, ``2 n / d_max``
    links each way; on machines made of nodes, every node (its GPUs, switch and NICs); on a
    leaf/spine fabric, every pod that remains connected when the spines (and cores) are removed
    (its leaf-spine uplinks are the cut, which is where oversubscription shows); on a
    three-tier fabric also every pod that remains connected when the cores are removed (its
    spine-core uplinks, where the core's oversubscription shows).
``latency``
    The latency of the slowest pair that must communicate: the group's diameter latency (via
    :meth:`Topology.diameter_latency`); broadcast / reduce: the root's eccentricity.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import networkx as nx
import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import dijkstra, shortest_path

from cclc.collective import Collective, CollectiveKind
from cclc.errors import CclError, ScheduleError
from cclc.group_links import group_links
from cclc.symmetric import TranslationGroup

__all__ = ["Bound", "Facts", "candidate_cuts", "cut_bound", "cut_time", "hop_bytes_bound",
           "injection_bound", "latency_bound", "latency_graph", "vertex_nodes"]

K = CollectiveKind


@dataclass(frozen=True, slots=True)
class Bound:
    """One lower bound: ``seconds``, and what it counts in one line."""

    name: str
    seconds: float
    description: str



class Facts:
    """Arrays every bound needs: healthy links, the group, per-pair bytes (alltoall)."""

    def __init__(self, coll: Collective, say: Callable[[str], None] | None = None):
        topo = coll.topology
        self.coll = coll
        #: told what a long step waits for (a progress line), before it starts
        self.say = say or (lambda what: None)
        self.topo = topo
        self.kind = coll.kind
        self.n = coll.n
        self.S = float(coll.size)
        self.group = np.asarray(coll.group, dtype=np.int64)
        # only the links some schedule of this group can use (cclc.group_links): a bound
        # over them holds for every schedule the declared machine runs
        ok = group_links(topo, self.group)
        self.ok = ok
        #: whether those are every healthy link (then the torus shortcuts apply)
        self.all_healthy = bool((ok == ~topo.link_failed).all())
        self.src = topo.link_src.astype(np.int64)[ok]
        self.dst = topo.link_dst.astype(np.int64)[ok]
        self.bw = topo.link_bandwidth[ok]
        V = topo.n_vertices
        self.cap_out = np.bincount(self.src, weights=self.bw, minlength=V)
        self.cap_in = np.bincount(self.dst, weights=self.bw, minlength=V)
        self.root = None if coll.root is None else int(coll.root)

    def pair_bytes(self) -> np.ndarray:
        """``(n, n)`` bytes member i sends member j (alltoall), diagonal zero."""
        if self.coll.pair_sizes is not None:
            m = self.coll.pair_sizes.astype(np.float64).copy()
        else:
            m = np.full((self.n, self.n), self.S / self.n)
        np.fill_diagonal(m, 0.0)
        return m


def _describe_rate(bw: float) -> str:
    return f"{bw / 1e9:.4g} GB/s"


# --------------------------------------------------------------------------------------------
# closed forms


def hop_bytes_bound(coll: Collective) -> Bound:
    """Bytes x fewest links crossed, over the total healthy link bandwidth."""
    f = Facts(coll)
    total_bw = float(f.bw.sum())
    n, S = f.n, f.S
    if n < 2 or total_bw <= 0:
        return Bound("hop_bytes", 0.0, "nothing to move")
    if f.kind is K.ALLTOALL:
        volume = _pair_hop_bytes(f)
        what = "all pairs' bytes x shortest hops"
    elif f.kind is K.ALLREDUCE:
        volume = 2 * (n - 1) * S
        what = "2(n-1) S: reduce-scatter and allgather trees, n-1 links per block each"
    else:
        volume = (n - 1) * S
        what = {K.ALLGATHER: "(n-1) S: every block enters n-1 ranks",
                K.REDUCESCATTER: "(n-1) S: every reduced block spans n ranks",
                K.BROADCAST: "(n-1) S: the buffer enters n-1 ranks",
                K.REDUCE: "(n-1) S: a reduction tree over n ranks"}[f.kind]
    return Bound("hop_bytes", volume / total_bw,
                 f"{what} / total link bandwidth {_describe_rate(total_bw)}")


def _pair_hop_bytes(f: Facts) -> float:
    """Sum over pairs of alltoall bytes x fewest hops."""
    topo = f.topo
    healthy = not topo.link_failed.any() and not topo.failed_ranks and f.all_healthy
    if topo.dims is None or not healthy or f.coll.pair_sizes is not None:
        return float((f.pair_bytes() * _hop_matrix(f)).sum())
    # a healthy torus or mesh: hops add up per dimension (ring or line distance), so the sum
    # over uniform pairs needs only how many members sit at each coordinate of each dimension
    coords = np.array(np.unravel_index(f.group, topo.dims))
    total = 0.0
    for d, (m, wrapped) in enumerate(zip(topo.grid_dims, topo.grid_wrap, strict=True)):
        count = np.bincount(coords[d], minlength=m).astype(np.float64)
        delta = np.abs(np.arange(m)[:, None] - np.arange(m)[None, :])
        dist = np.minimum(delta, m - delta) if wrapped else delta
        total += float(count @ dist @ count)
    return total * f.S / f.n


def _hop_matrix(f: Facts) -> np.ndarray:
    """Fewest healthy links from each group member to each other (BFS, in source blocks)."""
    if f.all_healthy and not f.topo.failed_ranks:
        # the group may use every healthy link: the topology's own searches, which routing
        # and relay checks share (one 3.7 s search at 4,096 GPUs instead of two)
        return f.topo.fewest_hops(f.group)[0][:, f.group]
    V = f.topo.n_vertices
    adj = sp.csr_matrix((np.ones(len(f.src)), (f.src, f.dst)), shape=(V, V))
    out = np.empty((f.n, f.n))
    for lo in range(0, f.n, 256):
        d = shortest_path(adj, method="D", unweighted=True, indices=f.group[lo:lo + 256])
        out[lo:lo + 256] = d[:, f.group]
    return out


def injection_bound(coll: Collective) -> Bound:
    """The worst rank's bytes to send (receive) over its healthy outgoing (incoming) bandwidth."""
    f = Facts(coll)
    n, S, g = f.n, f.S, f.group
    if n < 2:
        return Bound("injection", 0.0, "nothing to move")
    out_bw, in_bw = f.cap_out[g], f.cap_in[g]
    send = np.zeros(n)
    recv = np.zeros(n)
    if f.kind is K.ALLTOALL:
        m = f.pair_bytes()
        send, recv = m.sum(axis=1), m.sum(axis=0)
    elif f.kind is K.ALLGATHER:
        send[:], recv[:] = S / n, (n - 1) / n * S
    elif f.kind is K.REDUCESCATTER:
        send[:], recv[:] = (n - 1) / n * S, S / n
    elif f.kind is K.ALLREDUCE:
        # some rank must send 2(n-1)/n S: charge it the best outgoing bandwidth of any rank
        if (out_bw <= 0).any() or (in_bw <= 0).any():
            _cut_off(f, g[int(np.argmin(np.minimum(out_bw, in_bw)))])
        t = 2 * (n - 1) / n * S / float(out_bw.max())
        ranks = Bound("injection", t, f"2(n-1)/n S sent by some rank at the best rank "
                                      f"outgoing bandwidth {_describe_rate(float(out_bw.max()))}")
        nodes = _allreduce_parties(f)
        return nodes if nodes is not None and nodes.seconds > ranks.seconds else ranks
    elif f.kind is K.BROADCAST:
        send[f.root], recv[:] = S, S
        recv[f.root] = 0.0
    else:  # REDUCE
        send[:], recv[f.root] = S, S
        send[f.root] = 0.0
    stuck = ((send > 0) & (out_bw <= 0)) | ((recv > 0) & (in_bw <= 0))
    if stuck.any():
        _cut_off(f, g[int(np.argmax(stuck))])
    with np.errstate(divide="ignore", invalid="ignore"):
        t_send = np.where(send > 0, send / out_bw, 0.0)
        t_recv = np.where(recv > 0, recv / in_bw, 0.0)
    i_s, i_r = int(np.argmax(t_send)), int(np.argmax(t_recv))
    names = f.topo.vertex_names
    if t_send[i_s] >= t_recv[i_r]:
        return Bound("injection", float(t_send[i_s]),
                     f"{names[g[i_s]]} sends {send[i_s]:.6g} B at {_describe_rate(out_bw[i_s])}")
    return Bound("injection", float(t_recv[i_r]),
                 f"{names[g[i_r]]} receives {recv[i_r]:.6g} B at {_describe_rate(in_bw[i_r])}")


def vertex_nodes(topo) -> np.ndarray:
    """The node of every vertex (-1 outside every node) on a machine made of nodes: a rank's
    own, and node ``i`` for a switch or NIC whose name starts with ``node<i>.``."""
    vnode = np.full(topo.n_vertices, -1)
    vnode[:topo.n_ranks] = topo.node_of_rank
    for v in range(topo.n_ranks, topo.n_vertices):
        name = topo.vertex_names[v]
        if name.startswith("node") and "." in name:
            vnode[v] = int(name[4:name.index(".")])
    return vnode


def _allreduce_parties(f: Facts) -> Bound | None:
    """AllReduce over the group's nodes as parties: ``2 (N - 1) S`` over what the N nodes
    can send (receive) together, or ``None`` on a machine not made of nodes or with the
    group in one node.

    Every element must be summed from the contributions of all N nodes and the sum known in
    every node. A node's GPUs share what they know for free, so a node is one party of a
    one-way gossip, and one-way gossip among N parties needs at least ``2 N - 2`` messages
    (Harary and Schwenk, 1974): every element crosses between nodes at least ``2 (N - 1)``
    times, each time leaving one node (its GPUs, switch and NICs) over a link out of it and
    entering another. Merged partial sums only add messages; reductions in switches, which
    this cost model has not, would beat it. For single-GPU nodes this is the rank form of
    :func:`injection_bound` with the sum of the ranks' bandwidths in place of the best.
    """
    topo = f.topo
    if topo.node_of_rank is None:
        return None
    vnode = vertex_nodes(topo)
    parties = np.unique(vnode[f.group])
    N = len(parties)
    if N < 2:
        return None
    inside = np.isin(vnode, parties)
    crossing = (vnode[f.src] != vnode[f.dst]) & (inside[f.src] | inside[f.dst])
    out_bw = float(f.bw[crossing & inside[f.src]].sum())
    in_bw = float(f.bw[crossing & inside[f.dst]].sum())
    if out_bw <= 0 or in_bw <= 0:
        return None                         # the cut bound names the node that is cut off
    bw = min(out_bw, in_bw)
    return Bound("injection", 2 * (N - 1) * f.S / bw,
                 f"2(N-1) S: every element crosses between the N = {N} nodes 2(N-1) times "
                 f"(one-way gossip), at the nodes' total "
                 f"{'outgoing' if out_bw <= in_bw else 'incoming'} bandwidth "
                 f"{_describe_rate(bw)}")


def _cut_off(f: Facts, v: int) -> None:
    """Raise: member ``v`` has no link its group's schedules can use in some direction."""
    raise CclError(f"collective '{f.coll.name}': {f.topo.vertex_names[v]} has no healthy link "
                   "its schedules can use: " + _unreachable_hint(f))


def _unreachable_hint(f: Facts) -> str:
    return (f"its members do not reach each other over routes the declared routing "
            f"'{f.topo.routing}' carries, relayed only by members (add the ranks on the way to "
            "the group, or declare the routing the network has)")


def candidate_cuts(f: Facts) -> Iterator[tuple[str, np.ndarray]]:
    """Vertex sets worth trying as cuts (boolean masks over all vertices), with a name.

    One at a time: a 1000x1000 mesh has 2000 cuts of a million vertices each. Where the
    torus's translations are a symmetry of the collective (:class:`cclc.symmetric.
    TranslationGroup`), a dimension's bisections are translates of each other, so one stands
    for them all (a 2x131072 torus tried 131072 cuts of 262144 ranks each, for minutes).
    """
    topo = f.topo
    if topo.dims is not None:
        try:
            TranslationGroup.of(f.coll)
            offsets = 1
        except ScheduleError:
            offsets = 0
        coords = np.array(np.unravel_index(np.arange(topo.n_ranks), topo.dims))
        for d, (m, wrapped) in enumerate(zip(topo.grid_dims, topo.grid_wrap, strict=True)):
            if m < 2:
                continue
            c = coords[d]
            if wrapped and m > 2:
                for off in range(offsets or m):
                    last = (off + m // 2 - 1) % m
                    name = f"bisection of dimension {d} (coordinates {off}..{last} on one side)"
                    yield name, (c - off) % m < m // 2
            else:
                for k in range(1, m):
                    yield f"cut of dimension {d} between coordinates {k - 1} and {k}", c < k
    if topo.node_of_rank is not None:
        vnode = vertex_nodes(topo)
        if topo.n_nodes > 1:
            for i in range(topo.n_nodes):
                yield f"node {i}", vnode == i
        yield from _tier_cuts(topo)


def _tier_cuts(topo) -> Iterator[tuple[str, np.ndarray]]:
    """The pods of a fabric, one tier at a time: what stays connected without the spines and
    cores (cut: its leaves' spine uplinks), then without the cores alone (cut: its spines'
    core uplinks, where a three-tier fabric's core oversubscription shows)."""
    V, names = topo.n_vertices, topo.vertex_names
    tiers = {t: [v for v in range(topo.n_ranks, V) if names[v].startswith(t)]
             for t in ("spine", "core")}
    for removed, uplinks in ((tiers["spine"] + tiers["core"], "spine"), (tiers["core"], "core")):
        if not removed or (uplinks == "spine" and not tiers["spine"]):
            continue
        g = topo.healthy_graph().to_undirected(as_view=False)
        g.remove_nodes_from(removed)
        comps = [c for c in nx.connected_components(g) if any(v < topo.n_ranks for v in c)]
        if len(comps) < 2:
            continue
        for c in comps:
            mask = np.zeros(V, dtype=bool)
            mask[list(c)] = True
            leaves = sorted(names[v] for v in c if names[v].startswith("leaf"))
            yield ("pod under " + ", ".join(leaves[:4]) + (" ..." if len(leaves) > 4 else "")
                   + f" (its {uplinks} uplinks)", mask)


def cut_time(f: Facts, side: np.ndarray, pair: np.ndarray | None) -> float:
    """The bound from one vertex set ``side`` (both directions across it); ``pair`` is the
    alltoall size matrix, ``None`` when uniform."""
    n, S = f.n, f.S
    a = side[f.group]
    k = int(a.sum())
    if k == 0 or k == n:
        return 0.0
    leaving = side[f.src] & ~side[f.dst]
    entering = ~side[f.src] & side[f.dst]
    cap_ab, cap_ba = float(f.bw[leaving].sum()), float(f.bw[entering].sum())
    if f.kind is K.ALLTOALL and pair is None:      # uniform: S/n per ordered pair
        need_ab = need_ba = k * (n - k) * S / n
    elif f.kind is K.ALLTOALL and pair is not None:
        need_ab, need_ba = float(pair[a][:, ~a].sum()), float(pair[~a][:, a].sum())
    elif f.kind is K.ALLGATHER:
        need_ab, need_ba = k * S / n, (n - k) * S / n
    elif f.kind is K.REDUCESCATTER:
        need_ab, need_ba = (n - k) * S / n, k * S / n
    elif f.kind is K.ALLREDUCE:
        need_ab = need_ba = S
    elif f.kind is K.BROADCAST:
        need_ab, need_ba = (S, 0.0) if a[f.root] else (0.0, S)
    else:  # REDUCE: everything flows towards the root
        need_ab, need_ba = (0.0, S) if a[f.root] else (S, 0.0)
    t = 0.0
    for need, cap in ((need_ab, cap_ab), (need_ba, cap_ba)):
        if need > 0:
            if cap <= 0:
                raise CclError(f"collective '{f.coll.name}': a cut of its group has no healthy "
                               "link its schedules can use: " + _unreachable_hint(f))
            t = max(t, need / cap)
    return t


def cut_bound(coll: Collective) -> Bound:
    """The best of the candidate cuts (bisections, nodes, pods); see the module docstring."""
    f = Facts(coll)
    cuts = candidate_cuts(f)
    # the size matrix only when it is not uniform (a 4096-rank matrix per cut adds up)
    pair = f.pair_bytes() if f.coll.pair_sizes is not None else None
    best, what = 0.0, "no candidate cut separates the group (see injection)"
    for name, side in cuts:
        t = cut_time(f, side, pair)
        if t > best:
            best, what = t, name
    return Bound("cut", best, what)


def latency_graph(src: np.ndarray, dst: np.ndarray, lat: np.ndarray, n_vertices: int
                  ) -> sp.csr_matrix:
    """The links as a sparse matrix of latencies for ``scipy.sparse.csgraph``: csr_matrix sums
    duplicate entries, so the fastest of parallel links is kept; zero latencies stay edges
    because they are stored explicitly."""
    order = np.lexsort((lat, dst, src))
    src, dst, lat = src[order], dst[order], lat[order]
    first = np.ones(len(src), dtype=bool)
    first[1:] = (src[1:] != src[:-1]) | (dst[1:] != dst[:-1])
    return sp.csr_matrix((lat[first], (src[first], dst[first])), shape=(n_vertices, n_vertices))


def latency_bound(coll: Collective) -> Bound:
    """The slowest pair that must communicate: diameter latency (root eccentricity), over the
    links the group can use (a route relayed by members is a chain of those links, and its
    latency at least their sum)."""
    if coll.n < 2:
        return Bound("latency", 0.0, "a single rank")

    f = Facts(coll)
    adj = latency_graph(f.src, f.dst, f.topo.link_latency[f.ok], f.topo.n_vertices)
    g = f.group
    if f.kind in (K.BROADCAST, K.REDUCE):
        root = g[f.root]
        if f.kind is K.BROADCAST:
            dist = dijkstra(adj, directed=True, indices=[root])[0, g]
        else:
            dist = dijkstra(adj.T.tocsr(), directed=True, indices=[root])[0, g]
        return Bound("latency", float(dist[np.isfinite(dist)].max(initial=0.0)),
                     "latency from the root to the farthest rank"
                     if f.kind is K.BROADCAST else "latency from the farthest rank to the root")
    # exact up to 64 sources; beyond, an evenly spaced sample (still a lower bound)
    sources = g[::max(1, len(g) // 64)]
    best = 0.0
    for lo in range(0, len(sources), 8):
        dist = dijkstra(adj, directed=True, indices=sources[lo:lo + 8])[:, g]
        reached = dist[np.isfinite(dist)]
        if reached.size:
            best = max(best, float(reached.max()))
    return Bound("latency", best, "diameter latency of the group")
