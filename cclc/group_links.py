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

#: member-pair tests per chunk of the fewest-hop check (bounds memory to ~32 MB of floats)
_CHUNK_ELEMENTS = 1 << 22


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
    # d_from[i, v] = d(member i, v); d_to[j, v] = d(v, member j)
    d_from = shortest_path(adj, method="D", unweighted=True, indices=group)
    d_to = shortest_path(adj.T.tocsr(), method="D", unweighted=True, indices=group)
    out = between.copy()
    if topo.routing == "source":
        # a walk member -> u -> v -> member exists
        reach_u = np.isfinite(d_from).any(axis=0)[src[todo]]
        back_v = np.isfinite(d_to).any(axis=0)[dst[todo]]
        out[todo] = reach_u & back_v
        return out
    # fewest-hop routes: per source member a, the vertices v from which a fewest-hop path
    # from a continues to some member b (d(a, v) + d(v, b) = d(a, b)); the link u -> v is on
    # such a path when it is one hop further from a than u is
    n = len(group)
    d_mm = d_from[:, group]                                       # d(a, b)
    rows = max(1, _CHUNK_ELEMENTS // max(1, n * V))
    u, v = src[todo], dst[todo]
    used = np.zeros(len(todo), dtype=bool)
    for lo in range(0, n, rows):
        da = d_from[lo:lo + rows]                                 # (r, V)
        onward = ((da[:, None, :] + d_to[None, :, :] == d_mm[lo:lo + rows, :, None])
                  & np.isfinite(d_mm[lo:lo + rows, :, None])).any(axis=1)   # (r, V)
        used |= ((da[:, u] + 1 == da[:, v]) & onward[:, v]).any(axis=0)
    out[todo] = used
    return out
