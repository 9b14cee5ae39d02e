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
    # d_from[i, v] = d(member i, v)
    d_from = shortest_path(adj, method="D", unweighted=True, indices=group)
    out = between.copy()
    if topo.routing == "source":
        d_to = shortest_path(adj.T.tocsr(), method="D", unweighted=True, indices=group)
        # a walk member -> u -> v -> member exists
        reach_u = np.isfinite(d_from).any(axis=0)[src[todo]]
        back_v = np.isfinite(d_to).any(axis=0)[dst[todo]]
        out[todo] = reach_u & back_v
        return out
    # fewest-hop routes, one source member a at a time over its shortest-path DAG (the links
    # u -> v with d(a, v) = d(a, u) + 1): v continues along it to some member when v is a
    # member or one of its DAG successors does, found layer by layer from the farthest in;
    # u -> v is used when it is a DAG link into such a v. O(links x depth) per member, where
    # comparing every pair of members (a, b) at every vertex was O(n^2 V)
    u, v = src[todo], dst[todo]
    used = np.zeros(len(todo), dtype=bool)
    okay_src, okay_dst = src[ok], dst[ok]
    for row in d_from:
        dag = row[okay_src] + 1 == row[okay_dst]
        onward = member & np.isfinite(row)
        tail, head = okay_src[dag], okay_dst[dag]
        depth = row[tail]
        finite = row[np.isfinite(row)]
        for level in range(int(finite.max(initial=0)) - 1, -1, -1):
            at = depth == level
            np.logical_or.at(onward, tail[at], onward[head[at]])
        used |= (row[u] + 1 == row[v]) & onward[v]
        if used.all():
            break
    out[todo] = used
    return out
