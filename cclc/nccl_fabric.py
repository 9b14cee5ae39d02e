"""What a three-tier fabric does to NCCL's rings and trees: the channels that cross between pods
share each pod's core uplinks.

NCCL's topology search sees GPUs, NVLink, PCIe switches and NICs, never the switches behind
the NICs, so its choice of algorithm is blind to the fabric (the model of that choice is
:mod:`cclc.nccl_model`, blind in the same way). What it then runs is not: every inter-node
edge of a ring or tree carries the graph's whole bus bandwidth (all channels, one NIC each),
and an edge between nodes of different pods climbs through the pods' spine -> core links.

* **Rings**: NCCL orders the nodes of a ring as its ranks come (NVIDIA/nccl
  ``src/graph/connect.cc``, ``ncclTopoPostset``: node ``n``'s last rank to node ``n+1``'s
  first), so with ranks placed pod by pod a ring leaves each pod once; placed across pods, as
  often as the order changes pod.
* **Trees**: NCCL's double binary tree over the nodes (``src/graph/trees.cc``,
  ``ncclGetDtree``: a binary tree by the lowest set bit of the node index, and its mirror for
  an even count or its shift by one for an odd one); half the channels run on each tree and
  every edge carries data both ways (reduce up, broadcast down).

The bound on the bus bandwidth (GB/s) is, over the pods, the pod's healthy core uplink (and
downlink) capacity divided by the bus-bandwidth shares its crossing edges carry: flows spread
evenly over the uplinks, as planned routing would place them (ECMP collisions, which real
fabrics add on top, are not charged here). Nodes are in the pods :func:`cclc.topology.fat_tree`
gives them; link faults inside a pod are not charged (as NCCL's model does not).

An AllToAll (NCCL's grouped send/recv, :mod:`cclc.nccl_p2p`) follows no ring or tree: every
pair exchanges directly, so the bytes between pods are the traffic matrix's, and
:func:`pod_core_seconds` bounds its time by each pod's core capacity the same way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from cclc.topology import Topology

__all__ = ["CoreLimits", "core_limits", "dtree_edges", "pod_core_seconds", "ring_edges"]


@dataclass(frozen=True, slots=True)
class CoreLimits:
    """The most bus bandwidth (GB/s) the pods' core links let a ring and a tree carry
    (``math.inf`` where no edge crosses between pods), and the pods' count for messages."""

    ring: float
    tree: float
    pods: int


def ring_edges(n: int) -> list[tuple[int, int]]:
    """The directed edges of a ring over ``n`` nodes in order (none for one node)."""
    return [(i, (i + 1) % n) for i in range(n)] if n > 1 else []


def _btree_parent(n: int, rank: int) -> int:
    """NCCL's ``ncclGetBtree`` parent of ``rank`` among ``n`` (-1 for the root, rank 0)."""
    if rank == 0:
        return -1
    bit = 1
    while bit < n and not bit & rank:
        bit <<= 1
    up = (rank ^ bit) | (bit << 1)
    return rank ^ bit if up >= n else up


def dtree_edges(n: int) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """The (child, parent) edges of NCCL's two trees over ``n`` nodes (``ncclGetDtree``).

    >>> dtree_edges(4)
    ([(1, 2), (2, 0), (3, 2)], [(0, 1), (1, 3), (2, 1)])
    """
    first = [(r, _btree_parent(n, r)) for r in range(1, n)]
    second = []
    for r in range(n):
        if n % 2:     # odd: the tree of the shifted rank, shifted back
            u = _btree_parent(n, (r - 1 + n) % n)
            parent = -1 if u == -1 else (u + 1) % n
        else:         # even: the mirrored tree
            u = _btree_parent(n, n - 1 - r)
            parent = -1 if u == -1 else n - 1 - u
        if parent != -1:
            second.append((r, parent))
    return first, second


def _pod_capacity(topo: Topology) -> tuple[np.ndarray, np.ndarray]:
    """Healthy spine -> core and core -> spine capacity of every pod (GB/s)."""
    assert topo.pod_of_node is not None and topo.node_of_rank is not None
    names, src, dst = topo.vertex_names, topo.link_src, topo.link_dst
    pod_of_vertex = np.full(topo.n_vertices, -1, dtype=np.int64)
    nic_node = topo.nic_nodes()
    nics = np.flatnonzero(nic_node >= 0)
    pod_of_vertex[nics] = topo.pod_of_node[nic_node[nics]]
    # a leaf is in the pod of the NICs it serves, a spine in the pod of its leaves (of those
    # that serve NICs: a pod with fewer servers than ports has leaves that serve none, and
    # their spines must not take their "no pod")
    for lower, upper in (("node", "leaf"), ("leaf", "spine")):
        wired = np.array([names[u].startswith(lower) and names[v].startswith(upper)
                          for u, v in zip(src.tolist(), dst.tolist(), strict=True)])
        wired &= pod_of_vertex[src] >= 0
        pod_of_vertex[dst[wired]] = pod_of_vertex[src[wired]]
    core = np.array([n.startswith("core") for n in names])
    ok = ~topo.link_failed
    pods = int(topo.pod_of_node.max()) + 1
    up, down = np.zeros(pods), np.zeros(pods)
    bw = topo.link_bandwidth / 1e9
    lift = ok & core[dst] & (pod_of_vertex[src] >= 0)
    drop = ok & core[src] & (pod_of_vertex[dst] >= 0)
    np.add.at(up, pod_of_vertex[src[lift]], bw[lift])
    np.add.at(down, pod_of_vertex[dst[drop]], bw[drop])
    return up, down


def _limit(edges: list[tuple[int, int]], pod: np.ndarray, up: np.ndarray, down: np.ndarray,
           share: float, both_ways: bool) -> float:
    """The least, over pods, of capacity / (crossing edges x ``share`` of the bus each)."""
    out = np.zeros(len(up))
    inn = np.zeros(len(up))
    for a, b in edges:
        if pod[a] != pod[b]:
            out[pod[a]] += share
            inn[pod[b]] += share
            if both_ways:
                out[pod[b]] += share
                inn[pod[a]] += share
    best = math.inf
    for load, cap in ((out, up), (inn, down)):
        crossing = load > 0
        if crossing.any():
            best = min(best, float((cap[crossing] / load[crossing]).min()))
    return best


def core_limits(topo: Topology, group: tuple[int, ...] | list[int]) -> CoreLimits | None:
    """The core's bound on the bus bandwidth of NCCL's ring and tree for ranks ``group`` of
    ``topo``; ``None`` on a machine without pods (or with the group in one pod).

    The ring's edges carry the whole bus each way round; each tree edge half of it (half the
    channels per tree), in both directions.
    """
    if topo.pod_of_node is None or topo.node_of_rank is None:
        return None
    nodes = list(dict.fromkeys(int(topo.node_of_rank[r]) for r in group))
    pod = topo.pod_of_node[nodes]
    if len(set(pod.tolist())) < 2:
        return None
    up, down = _pod_capacity(topo)
    first, second = dtree_edges(len(nodes))
    return CoreLimits(ring=_limit(ring_edges(len(nodes)), pod, up, down, 1.0, False),
                      tree=_limit(first + second, pod, up, down, 0.5, True),
                      pods=len(set(pod.tolist())))


def pod_core_seconds(topo: Topology, group: tuple[int, ...] | list[int],
                     sent: np.ndarray | float) -> tuple[float, int] | None:
    """The least time (seconds) the pods' core links need to carry a traffic matrix, and the
    pods' count; ``None`` on a machine without pods (or with the group in one pod).

    ``sent[i, j]`` is the bytes group member ``i`` sends to member ``j`` (an AllToAll's pairs,
    NCCL's grouped send/recv); a number stands for the same bytes between every pair. Every
    byte between members of different pods leaves its pod through the pod's healthy spine ->
    core links and enters the other through core -> spine; spread evenly over them (ECMP
    collisions are not charged), a pod's outgoing bytes over its uplink capacity bound the
    time, as do its incoming bytes over its downlinks.
    """
    if topo.pod_of_node is None or topo.node_of_rank is None:
        return None
    pod = topo.pod_of_node[topo.node_of_rank[np.asarray(group)]]
    pods = np.unique(pod)
    if len(pods) < 2:
        return None
    up, down = _pod_capacity(topo)
    # bytes each member sends to / receives from each pod (members x pods)
    onehot = (pod[:, None] == pods[None, :]).astype(np.float64)
    if np.ndim(sent) == 0:
        # the same bytes to every member: no n x n matrix (16.7M pairs at 4,096 ranks)
        to_pod = np.broadcast_to(float(sent) * onehot.sum(axis=0), onehot.shape)
        from_pod = to_pod
    else:
        matrix = np.asarray(sent, dtype=np.float64)
        to_pod, from_pod = matrix @ onehot, matrix.T @ onehot
    worst = 0.0
    for k, p in enumerate(pods.tolist()):
        mine = pod == p
        out = float(to_pod[mine].sum() - to_pod[mine, k].sum())
        inn = float(from_pod[mine].sum() - from_pod[mine, k].sum())
        for load, cap in ((out, up[p]), (inn, down[p])):
            if load > 0:
                worst = max(worst, math.inf if cap <= 0 else load / (cap * 1e9))
    return float(worst), len(pods)
