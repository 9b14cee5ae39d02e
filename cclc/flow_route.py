"""A feasible flow for the alltoall max-concurrent-flow LP, found by routing instead of solving:
the upper value that pins the LP's optimum from above when the LP is too large for PDLP.

Every source's bytes start on its fewest-hop paths, split evenly at each vertex over the links
that arrive from one hop closer to the source (:func:`fewest_hop_split`). Then block
Frank-Wolfe on a smoothed maximum congestion, ``(1/a) log sum_e exp(a load_e / cap_e)``: a
block of sources at a time gets the shortest-path tree of each of its sources under the
potential's gradient as link lengths (one Dijkstra per source, the tree's loads accumulated
from the leaves up, level by level across all sources at once), and moves to it by the step
that minimizes the potential (:func:`route_alltoall`). Every iterate is a convex combination
of flows that conserve exactly, so it is feasible, and its largest ``load / cap`` is an upper
value of the LP. The lengths of each pass are also link prices, so :mod:`cclc.flow_dual`
turns them into a certified lower value; the caller adds stronger prices where it has them
(the indicator of a cut's links gives that cut's bound).

Frank-Wolfe converges slowly near the optimum (on an 8x8x8 torus with faults it stalls about
1.5-2% above the LP's optimum), so this is the fallback above PDLP's limit, with the gap
printed, not a replacement for it.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import shortest_path

from cclc.errors import CclError

__all__ = ["fewest_hop_split", "line_search", "route_alltoall", "smooth_max", "tree_loads"]

#: sources whose trees move together (one line search per block)
_BLOCK = 32
#: lengths below this fraction of the longest count as this fraction: Dijkstra needs positive
#: lengths, and distances must grow along every tree link for the level order to hold
_FLOOR = 1e-9


def fewest_hop_split(n_vertices: int, src: np.ndarray, dst: np.ndarray, group: np.ndarray,
                     pair: np.ndarray) -> np.ndarray:
    """Flows ``(k, links)``: source ``group[r]`` sends ``pair[r, j]`` to ``group[j]`` along
    fewest-hop paths, each vertex's inflow of the family (what it keeps and what it passes on)
    drawn evenly from its links that come from one hop closer to the source. On a healthy
    torus this loads every link equally (it commutes with the torus's symmetries)."""
    V, E, k = n_vertices, len(src), len(group)
    graph = sp.csr_matrix((np.ones(E), (src, dst)), shape=(V, V))
    hops = shortest_path(graph, method="D", unweighted=True, indices=group)     # (k, V)
    if np.isinf(hops[:, group][pair > 0]).any():
        raise CclError("no flow routes every pair of the alltoall: the group is disconnected")
    hops = np.where(np.isinf(hops), -1.0, hops)
    # link e feeds dst[e] for family r when it comes from one hop closer to the source
    feeds = (hops[:, src] >= 0) & (hops[:, dst] == hops[:, src] + 1)          # (k, E)
    rows = np.arange(k)[:, None] * V
    at_dst = (rows + dst[None, :]).ravel()
    at_src = (rows + src[None, :]).ravel()
    n_feeds = np.bincount(at_dst, weights=feeds.ravel(), minlength=k * V).reshape(k, V)
    need = np.zeros((k, V))
    need[:, group] = pair
    need[np.arange(k), group] = 0.0
    flow = np.zeros((k, E))
    # farthest vertices first: what a vertex needs (its own bytes and what it passes on) is
    # complete once every vertex farther out has drawn from it
    for level in range(int(hops.max()), 0, -1):
        take = feeds & (hops[:, dst] == level)
        share = np.where(take, need[:, dst] / np.maximum(n_feeds[:, dst], 1.0), 0.0)
        flow += share
        need += np.bincount(at_src, weights=share.ravel(), minlength=k * V).reshape(k, V)
    return flow


def tree_loads(n_vertices: int, src: np.ndarray, dst: np.ndarray, roots: np.ndarray,
               demand: np.ndarray, length: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per root ``r``, the loads ``(k, links)`` of sending ``demand[r, v]`` from ``roots[r]``
    to every ``v`` down its shortest-path tree under ``length`` (floored at ``_FLOOR`` of the
    longest), and the lengths used. Parallel links: the shortest carries the load."""
    loads, length, _ = _tree(n_vertices, src, dst, roots, demand, length)
    return loads, length


def _tree(n_vertices: int, src: np.ndarray, dst: np.ndarray, roots: np.ndarray,
          demand: np.ndarray, length: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`tree_loads`, and each tree as the link into every vertex ``(k, V)`` (-1 at the
    root and where unreachable)."""
    V, E, k = n_vertices, len(src), len(roots)
    length = np.maximum(length, _FLOOR * float(length.max()))
    key = src.astype(np.int64) * V + dst
    order = np.lexsort((length, key))
    first = np.ones(E, dtype=bool)
    first[1:] = key[order][1:] != key[order][:-1]
    keep = order[first]
    graph = sp.csr_matrix((length[keep], (src[keep], dst[keep])), shape=(V, V))
    dist, pred = shortest_path(graph, method="D", indices=roots, return_predecessors=True)
    if np.isinf(dist[demand > 0]).any():
        raise CclError("no flow routes every pair of the alltoall: the group is disconnected")
    # hop depth in each tree, by pointer jumping from the roots (0 at a root, -1 unknown,
    # -2 unreachable)
    depth = np.where(pred >= 0, -1, 0)
    depth[np.isinf(dist)] = -2
    parent = np.where(pred >= 0, pred, 0)
    while (depth == -1).any():
        up = np.take_along_axis(depth, parent, axis=1)
        ready = (depth == -1) & (up >= 0)
        depth[ready] = up[ready] + 1
    acc = demand.astype(np.float64).copy()
    at_parent = (np.arange(k)[:, None] * V + parent).ravel()
    flat = acc.ravel()
    for level in range(int(depth.max()), 0, -1):          # leaves first
        m = (depth == level).ravel()
        flat += np.bincount(at_parent[m], weights=flat[m], minlength=k * V)
    link_of = np.full(V * V, -1, dtype=np.int64) if V <= 2048 else None
    r, v = np.nonzero(pred >= 0)
    if link_of is not None:
        link_of[key[keep]] = keep
        links = link_of[pred[r, v].astype(np.int64) * V + v]
    else:
        kk = key[keep]
        srt = np.argsort(kk)
        links = keep[srt[np.searchsorted(kk[srt], pred[r, v].astype(np.int64) * V + v)]]
    loads = np.zeros((k, E))
    loads[r, links] = acc[r, v]
    into = np.full((k, V), -1, dtype=np.int64)
    into[r, v] = links
    return loads, length, into


def smooth_max(u: np.ndarray, a: float) -> float:
    """``log(sum(exp(a u))) / a``: a smooth upper bound on ``max(u)``, at most
    ``log(len(u)) / a`` above it (computed from the largest term, so it cannot overflow)."""
    top = float(u.max())
    return top + float(np.log(np.exp(a * (u - top)).sum())) / a


def route_alltoall(n_vertices: int, src: np.ndarray, dst: np.ndarray, cap: np.ndarray,
                   group: np.ndarray, pair: np.ndarray, lower: float, passes: int,
                   target_gap: float, trace: list | None = None
                   ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Block Frank-Wolfe from :func:`fewest_hop_split` (see the module docstring): at most
    ``passes`` passes over the sources, stopping once the largest ``load / cap`` is within
    ``target_gap`` of ``lower`` (a certified lower value, which also sets how finely the
    maximum is smoothed). Yields ``(flows, lengths)`` after every pass: the flows ``(k,
    links)`` conserve exactly; the lengths are the last block's link prices.

    ``trace``, when given, receives ``(first, last, step, into)`` for every block move: sources
    ``first:last`` moved by ``step`` toward the trees ``into`` (the link into every vertex,
    ``(last - first, V)``, -1 at the root). With the start (:func:`fewest_hop_split`) that
    spells out every flow as a weighted sum of trees, which :mod:`cclc.synth.routed` cuts into
    paths per pair."""
    k, E = len(group), len(src)
    demand = np.zeros((k, n_vertices))
    demand[:, group] = pair
    demand[np.arange(k), group] = 0.0
    flows = fewest_hop_split(n_vertices, src, dst, group, pair)
    load = flows.sum(axis=0)
    log_links = float(np.log(max(E, 2)))
    for _ in range(passes):
        length = np.ones(E)
        for lo in range(0, k, _BLOCK):
            block = slice(lo, min(k, lo + _BLOCK))
            u = load / cap
            top = float(u.max())
            if top <= 0:
                break
            # smoothing within half the gap left (1e-3..2e-2 of the maximum): coarse while
            # far, so the steps are long, fine when near
            eps = min(2e-2, max(1e-3, (top / lower - 1.0) / 2 if lower > 0 else 2e-2))
            a = log_links / (eps * top)
            w = np.exp(a * (u - top))
            length = w / w.sum() / cap
            tree, length, into = _tree(n_vertices, src, dst, group[block], demand[block],
                                       length)
            old = flows[block].sum(axis=0)
            step = line_search(u, (tree.sum(axis=0) - old) / cap, a)
            flows[block] += step * (tree - flows[block])
            if trace is not None:
                trace.append((block.start, block.stop, step, into))
            load = load - old + flows[block].sum(axis=0)
        yield flows, length
        if lower > 0 and float((load / cap).max()) <= lower * (1.0 + target_gap):
            return


def line_search(u: np.ndarray, d: np.ndarray, a: float) -> float:
    """The step in [0, 1] minimizing the smoothed maximum of ``u + step d`` (convex: a
    ternary search to 1e-6)."""
    lo, hi = 0.0, 1.0
    while hi - lo > 1e-6:
        m1, m2 = lo + (hi - lo) / 3, hi - (hi - lo) / 3
        if smooth_max(u + m1 * d, a) < smooth_max(u + m2 * d, a):
            hi = m2
        else:
            lo = m1
    return (lo + hi) / 2
