"""A certified lower bound on the alltoall max-concurrent-flow LP from link lengths.

Weak duality of max-concurrent-flow: for ANY lengths ``l_e >= 0`` of the healthy links,

    T* >= sum_{s, t} d(s, t) * dist_l(s, t) / sum_e c_e * l_e

where ``T*`` is the LP's optimum (the time to route every pair's bytes ``d`` within ``T``
times every link's capacity ``c``) and ``dist_l`` the shortest path under ``l``. (Any flow
of time ``T`` puts at most ``T c_e`` on ``e``, so ``T sum c_e l_e`` is at least the length
the flow travels, which is at least every pair's bytes times its shortest distance.) The
inequality holds whatever the lengths are and however they were found, so a solver run to a
loose tolerance, stopped early, or wrong gives a valid bound: only how close it comes to
``T*`` depends on the lengths. ``l = 1`` gives the hop-bytes bound; the LP's optimal dual
link prices give ``T*`` itself.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import shortest_path

__all__ = ["certified_time"]

#: sources per batch of Dijkstra runs (a batch's distances are batch x vertices floats)
_BATCH = 256


def certified_time(n_vertices: int, src: np.ndarray, dst: np.ndarray, cap: np.ndarray,
                   group: np.ndarray, pair: np.ndarray, length: np.ndarray) -> float:
    """The weak-duality bound on the max-concurrent-flow time for the link lengths ``length``
    (one per link ``src -> dst`` of capacity ``cap``; negative lengths count as 0): every
    ``pair[i, j]`` from ``group[i]`` to ``group[j]`` times its shortest distance, over the
    total capacity weighted by length. Every source runs its own Dijkstra, so the bound does
    not rely on the lengths being symmetric.

    >>> import numpy as np
    >>> ring = np.arange(4)                  # a 4-ring, both directions, capacity 1
    >>> src = np.concatenate([ring, (ring + 1) % 4])
    >>> dst = np.concatenate([(ring + 1) % 4, ring])
    >>> pair = np.ones((4, 4)) - np.eye(4)
    >>> certified_time(4, src, dst, np.ones(8), ring, pair, np.ones(8))    # hop-bytes: 16 / 8
    2.0
    """
    length = np.maximum(np.asarray(length, dtype=np.float64), 0.0)
    if not (length > 0).any():
        return 0.0
    # csgraph reads an explicit zero as a missing link, so zero lengths become the smallest
    # positive float: the bound is then the one of those lengths, still valid
    length = np.maximum(length, np.finfo(np.float64).tiny)
    total = float((cap * length).sum())
    # parallel links: the shortest one is the distance (csgraph would add duplicates up)
    key = src.astype(np.int64) * n_vertices + dst
    order = np.lexsort((length, key))
    first = np.ones(len(order), dtype=bool)
    first[1:] = key[order][1:] != key[order][:-1]
    keep = order[first]
    graph = sp.csr_matrix((length[keep], (src[keep], dst[keep])),
                          shape=(n_vertices, n_vertices))
    travelled = 0.0
    for lo in range(0, len(group), _BATCH):
        dist = shortest_path(graph, method="D", indices=group[lo:lo + _BATCH])[:, group]
        rows = pair[lo:lo + _BATCH]
        # a pair with bytes and no path: no flow routes it, there is no finite bound
        if np.isinf(dist[rows > 0]).any():
            return float("inf")
        travelled += float((rows * np.where(rows > 0, dist, 0.0)).sum())
    return travelled / total
