"""The links a group's schedules can use on the declared machine, for the lower bounds.

A schedule of a collective moves data only between members of its group: every op goes from a
member to a member along a route the topology's routing carries (:mod:`cclc.routing`), and a
route the routing does not carry is cut into carried pieces at member ranks
(:func:`cclc.relay.lower_relays`), which refuses to relay through a rank outside the group: a
GPU that does not run the collective forwards nothing. So every byte of every schedule crosses
only links that lie on a *carried route between two members*, and a bound computed over those
links alone still holds for every schedule the machine can run. Which links those are depends
on the routing:

``none``
    A route is one link: the links between two members.
``shortest``, ``ecmp``, ``adaptive``, ``dimension_order``
    A route is a fewest-hop path over healthy links (dimension-order paths are among them):
    the links ``u -> v`` with ``d(a, u) + 1 + d(v, b) = d(a, b)`` for some members ``a``, ``b``.
    On a machine of NVSwitch servers a NIC hangs off its own GPU (:mod:`cclc.topology`), so a
    GPU reaches another GPU's NIC only through that GPU: a fewest-hop route does so when the
    NIC's rail is where the destination is (NCCL's PXN), never to leave through a rail the
    destination is not on; on the rail-0 AllGather of a rail-optimized fabric only the members'
    own NICs carry anything.
``source``
    Any healthy path: the links on some walk from a member to a member.

The links between two members are always usable (a healthy link is a fewest-hop route), so a
collective over every rank keeps every healthy link.
"""

from __future__ import annotations

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import shortest_path

from cclc.topology import Topology

__all__ = ["group_links"]


def group_links(topo: Topology, group: np.ndarray) -> np.ndarray:
    """Boolean per link of ``topo``: healthy and on a route the declared routing carries
    between two members of ``group`` (see the module docstring). Kept on the topology.

    >>> from cclc.topology import torus                                          # doctest: +SKIP
    >>> group_links(torus("t", (4,), routing="none"), np.array([0, 1])).sum()    # doctest: +SKIP
    2
    """
    group = np.asarray(group, dtype=np.int64)
    key = ("group_links", topo.routing, group.tobytes())
    if key not in topo._cache:
        mask = _group_links(topo, group)
        mask.setflags(write=False)
        topo._cache[key] = mask
    return topo._cache[key]


def _group_links(topo: Topology, group: np.ndarray) -> np.ndarray:
    healthy = ~topo.link_failed
    src, dst = topo.link_src.astype(np.int64), topo.link_dst.astype(np.int64)
    member = np.zeros(topo.n_vertices, dtype=bool)
    member[group] = True
    between = healthy & member[src] & member[dst]
    if topo.routing == "none" or len(group) < 2:
        return between
    todo = np.flatnonzero(healthy & ~between)
    if not len(todo):
        return between
    V = topo.n_vertices
    ok = np.flatnonzero(healthy)
    adj = csr_matrix((np.ones(len(ok)), (src[ok], dst[ok])), shape=(V, V))
    out = between.copy()
    if topo.routing == "source":
        d_from = shortest_path(adj, method="D", unweighted=True, indices=group)
        d_to = shortest_path(adj.T.tocsr(), method="D", unweighted=True, indices=group)
        # a walk member -> u -> v -> member exists
        reach_u = np.isfinite(d_from).any(axis=0)[src[todo]]
        back_v = np.isfinite(d_to).any(axis=0)[dst[todo]]
        out[todo] = reach_u & back_v
        return out
    # fewest-hop routes, a batch of source members a at a time over their shortest-path DAGs
    # (the links u -> v with d(a, v) = d(a, u) + 1): v continues along a's DAG to some member
    # when v is a member or one of its DAG successors does, found layer by layer from the
    # farthest in; u -> v is used when it is a DAG link into such a v. O(links x depth) per
    # member, where comparing every pair of members (a, b) at every vertex was O(n^2 V); the
    # members of a batch share each numpy call (4,096 members one by one: 10 s)
    # a member of every node first, on every rail: with the two-hop routes settled up front,
    # those members' routes usually cover every link a route between members can use, and the
    # search ends there (4,096 GPUs in 512 servers: 10 s -> 2)
    u, v = src[todo], dst[todo]
    used = _on_two_hop_routes(topo, member, healthy, u, v)
    okay_src, okay_dst = src[ok], dst[ok]
    order = _one_per_node_first(topo, group)
    for first in range(0, len(group), _BATCH):
        # rows[i, v] = d(member, v) for the batch's members
        rows = shortest_path(adj, method="D", unweighted=True,
                             indices=order[first:first + _BATCH])    # (B, V)
        # inf + 1 == inf: links among vertices the member cannot reach are no DAG links
        dag = (rows[:, okay_src] + 1 == rows[:, okay_dst]) & np.isfinite(rows[:, okay_src])
        onward = member[None, :] & np.isfinite(rows)
        b, e = np.nonzero(dag)
        tail, head = okay_src[e], okay_dst[e]
        depth = rows[b, tail]
        flat_tail = b * onward.shape[1] + tail
        flat_head = b * onward.shape[1] + head
        flat = onward.ravel()                                         # a view: written through
        for level in range(int(depth.max(initial=-1)), -1, -1):
            at = depth == level
            hit = flat_tail[at][flat[flat_head[at]]]
            flat[hit] = True
        used |= ((rows[:, u] + 1 == rows[:, v]) & onward[:, v]).any(axis=0)
        if used.all():
            break
    out[todo] = used
    return out


def _on_two_hop_routes(topo: Topology, member: np.ndarray, healthy: np.ndarray, u: np.ndarray,
                       v: np.ndarray) -> np.ndarray:
    """Per link ``u -> v``: whether it lies on a two-link route ``a -> w -> b`` between two
    members with no link ``a -> b`` (a fewest-hop route, so carried): a link out of a member
    into a vertex with a link on to another member, or into a member from a vertex reached
    from another. A sufficient condition only (the search decides the others); it settles the
    links between GPUs and their NVSwitch, which only their own GPU's routes use otherwise."""
    src, dst = topo.link_src.astype(np.int64), topo.link_dst.astype(np.int64)
    direct = set(zip(src[healthy & member[src] & member[dst]].tolist(),
                     dst[healthy & member[src] & member[dst]].tolist(), strict=True))
    into: dict[int, list[int]] = {}          # w -> the members with a link into w
    onto: dict[int, list[int]] = {}          # w -> the members w has a link to
    for a, w in zip(src[healthy & member[src]].tolist(), dst[healthy & member[src]].tolist(),
                    strict=True):
        into.setdefault(w, []).append(a)
    for w, b in zip(src[healthy & member[dst]].tolist(), dst[healthy & member[dst]].tolist(),
                    strict=True):
        onto.setdefault(w, []).append(b)
    out = np.zeros(len(u), dtype=bool)
    for i, (a, w) in enumerate(zip(u.tolist(), v.tolist(), strict=True)):
        if member[a]:
            out[i] = any(b != a and (a, b) not in direct for b in onto.get(w, ()))
        if not out[i] and member[w]:
            out[i] = any(c != w and (c, w) not in direct for c in into.get(a, ()))
    return out


#: source members per batch of the fewest-hop search (a (batch x links) table each)
_BATCH = 64


def _one_per_node_first(topo: Topology, group: np.ndarray) -> np.ndarray:
    """``group`` reordered one member of every node at a time, the ``k``-th pass taking GPU
    ``(node + k) mod size`` of each node (so the first pass already has a GPU on every rail of
    a rail-optimized fabric), in group order within each pass; as it is on a machine without
    nodes."""
    nodes = topo.node_of_rank
    if nodes is None:
        return group
    node = np.asarray(nodes)[group]
    order = np.argsort(node, kind="stable")
    sorted_node = node[order]
    start = np.searchsorted(sorted_node, sorted_node)       # each node's first place
    size = np.searchsorted(sorted_node, sorted_node, side="right") - start
    local = np.empty(len(group), dtype=np.int64)
    local[order] = np.arange(len(group)) - start
    count = np.empty(len(group), dtype=np.int64)
    count[order] = size
    return group[np.argsort((local - node) % count, kind="stable")]
