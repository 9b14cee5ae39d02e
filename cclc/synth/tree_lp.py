"""Exact fractional packing of spanning out-trees by column generation, rounded to whole trees.

The congestion heuristic of :mod:`cclc.synth.trees` can stop a few percent above the optimal
rate ``x*`` (the PCIe fabric example: 7% with eight trees per root). Edmonds' branching theorem
says weighted trees reach ``x*`` exactly on a rank-only graph that keeps it (what
:mod:`cclc.synth.splitting` leaves), and a linear program over trees finds such weights:

    minimise ``z``  subject to  ``sum_T [l in T] y_T <= z cap_l / x*``  for every link ``l``,
                                ``sum_{T rooted at r} y_T = 1``        for every root ``r``,

with ``y >= 0``. ``z = 1`` is the optimum exactly when the trees reach ``x*``. The LP has a
column per spanning arborescence, so it is solved by column generation (the master LP in
HiGHS): a root's cheapest tree under the link duals is a minimum-cost spanning arborescence,
Edmonds' algorithm (``networkx.minimum_spanning_arborescence``), and it enters when it costs
less than the root's dual. The search ends when no tree prices out, or at the deadline with
the columns found so far.

The schedules carry ``k`` equal trees per root (each ``1/k`` of the root's data), so the
weights are rounded: a small integer program (HiGHS MILP, under the same deadline) picks ``k``
trees per root, with repetition, among the LP's trees and the heuristic's, minimising the
busiest link's load. The LP optimum ``z`` is a lower bound on that load, so the gap of the
rounding is known (reported as the packing's ``load``).

Depth is pipeline fill: among trees of equal cost Edmonds' choice is arbitrary, so every move
costs a little (a millionth of the median link price) per hop it is away from the root in a
breadth-first tree over all moves; cheap trees then prefer moves near the root.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_matrix, csr_matrix
from scipy.sparse.csgraph import shortest_path

from cclc.synth.trees import HopGraph, TreePacking

__all__ = ["FractionalPacking", "fractional_packing", "rounded_packing"]

#: a column enters when its reduced cost is below this (relative to the root's dual)
_ENTER = 1e-7
#: levels a tree may grow beyond its root's farthest member (as the congestion heuristic's)
DEPTH_SLACK = 1
#: column-generation rounds at most (each prices every root once)
_MAX_ROUNDS = 200


@dataclass(frozen=True, eq=False)
class FractionalPacking:
    """Trees found by column generation and their LP weights.

    ``trees[i]`` is ``(root, moves)`` (the move into every non-root member, in member order
    with the root left out); ``weight[i]`` its share of its root's data (a root's weights add up
    to 1); ``z`` the LP's busiest-link load relative to the share at the rate (1.0: the trees
    reach it); ``status`` ``"optimal"`` when no tree prices out, ``"budget"`` when the
    deadline came first (``z`` is then an upper bound, not the LP optimum).
    """

    trees: tuple[tuple[int, np.ndarray], ...]
    weight: np.ndarray
    z: float
    status: str


def _move_links(g: HopGraph) -> csr_matrix:
    """``(n_links, m)``: which links each move uses."""
    return g.incidence().T.tocsr()


def _tree_of(parent_edge: np.ndarray, root: int) -> np.ndarray:
    return np.delete(parent_edge, root)


def _depth_tiebreak(g: HopGraph) -> tuple[np.ndarray, np.ndarray]:
    """``(n, m)`` hops from root ``r`` to the tail of move ``h`` (a move nearer the root is
    preferred among trees of equal cost), and each root's depth limit: its farthest member's
    hop distance plus :data:`DEPTH_SLACK`."""
    hops = shortest_path(csr_matrix((np.ones(g.m), (g.src, g.dst)), shape=(g.n, g.n)),
                         unweighted=True)
    limit = np.where(np.isfinite(hops), hops, 0).max(axis=1).astype(np.int64) + DEPTH_SLACK
    hops = np.where(np.isfinite(hops), hops, g.n)
    return hops[:, g.src], limit


def _cheapest_tree(g: HopGraph, root: int, price: np.ndarray, limit: int) -> np.ndarray | None:
    """A cheap spanning arborescence rooted at ``root`` at most ``limit`` levels deep under
    move prices ``price``, or ``None`` when the moves do not span the members from it.

    Prim's growth over the cheapest move out of the tree whose tail is above the depth limit,
    then every member re-hung from the cheapest parent that keeps the limit (a member with
    children only beside its own level). The cheapest tree of bounded depth is NP-hard to find
    (Edmonds' unbounded one is a chain here: depth 11-16 on the PCIe fabric, pipeline fill),
    so pricing is heuristic and the LP's ``z`` is optimal over the trees it can find.
    """
    n = g.n
    reached = np.zeros(n, dtype=bool)
    reached[root] = True
    depth = np.zeros(n, dtype=np.int64)
    edge = np.full(n, -1, dtype=np.int64)
    for _ in range(n - 1):
        cand = np.flatnonzero(reached[g.src] & ~reached[g.dst] & (depth[g.src] < limit))
        if not len(cand):
            return None
        h = int(cand[np.argmin(price[cand])])
        v = int(g.dst[h])
        edge[v], depth[v], reached[v] = h, depth[g.src[h]] + 1, True
    # re-hang leaves from cheaper parents (a leaf's depth may change freely within the limit)
    for _ in range(2):
        changed = False
        has_child = np.zeros(n, dtype=bool)
        has_child[g.src[np.delete(edge, root)]] = True
        for v in np.flatnonzero(~has_child).tolist():
            if v == root or has_child[v]:
                continue
            cand = np.flatnonzero((g.dst == v) & (depth[g.src] < limit) & (g.src != v))
            h = int(cand[np.argmin(price[cand])])
            if price[h] < price[edge[v]] - 1e-15:
                edge[v], depth[v] = h, depth[g.src[h]] + 1
                has_child[g.src[h]] = True
                changed = True
        if not changed:
            break
    return _tree_of(edge, root)


def _master(cols: list[tuple[int, np.ndarray]], link_use: csr_matrix, n: int,
            cap_share: np.ndarray) -> tuple[np.ndarray, float, np.ndarray, np.ndarray] | None:
    """The master LP over ``cols``: ``(weights, z, link duals >= 0, root duals)``."""
    n_links = link_use.shape[0]
    live = np.flatnonzero(cap_share > 0)
    rows, colidx, vals = [], [], []
    for j, (_, moves) in enumerate(cols):
        a = np.asarray(link_use[:, moves].sum(axis=1)).ravel()
        nz = np.flatnonzero(a)
        rows.append(nz)
        colidx.append(np.full(len(nz), j))
        vals.append(a[nz])
    nc = len(cols)
    a_use = coo_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(colidx))),
                       shape=(n_links, nc)).tocsr()[live]
    # columns: y_0..y_{nc-1}, z
    a_ub = _hstack(a_use, -cap_share[live][:, None])
    roots = np.array([r for r, _ in cols])
    a_eq = coo_matrix((np.ones(nc), (roots, np.arange(nc))), shape=(n, nc + 1)).tocsr()
    c = np.zeros(nc + 1)
    c[-1] = 1.0
    res = linprog(c, A_ub=a_ub, b_ub=np.zeros(len(live)), A_eq=a_eq, b_eq=np.ones(n),
                  bounds=(0, None), method="highs")
    if res.status != 0:
        return None
    duals = np.zeros(n_links)
    duals[live] = -res.ineqlin.marginals              # HiGHS: <= rows have duals <= 0
    return res.x[:-1], float(res.x[-1]), np.maximum(duals, 0.0), res.eqlin.marginals


def _hstack(a: csr_matrix, col: np.ndarray) -> csr_matrix:
    from scipy.sparse import hstack

    return hstack([a, csr_matrix(col)]).tocsr()


def fractional_packing(g: HopGraph, rate: float, deadline: float,
                       seeds: TreePacking | None = None) -> FractionalPacking | None:
    """Column generation for the LP of the module docstring on the moves of ``g`` at per-root
    rate ``rate``; ``seeds`` (a packing of ``g``) gives the first columns. ``None`` when the
    deadline passes before the first master LP is solved or some root spans nothing."""
    n = g.n
    link_use = _move_links(g)
    cap_share = np.where(g.capacity > 0, g.capacity / rate, 0.0)
    cols: list[tuple[int, np.ndarray]] = []
    seen: set[tuple[int, bytes]] = set()

    def add(root: int, moves: np.ndarray) -> bool:
        key = (root, moves.tobytes())
        if key in seen:
            return False
        seen.add(key)
        cols.append((root, moves))
        return True

    if seeds is not None:
        for r in range(n):
            for j in range(seeds.k):
                add(r, _tree_of(seeds.edge[r, j], r))
    tie, limit = _depth_tiebreak(g)
    unit = np.asarray(link_use.T @ np.where(cap_share > 0, 1.0 / np.maximum(cap_share, 1e-300),
                                            0.0)).ravel()
    for r in range(n):
        if not any(c[0] == r for c in cols):
            t = _cheapest_tree(g, r, unit + 1e-6 * np.median(unit) * tie[r], int(limit[r]))
            if t is None:
                return None
            add(r, t)
    status = "budget"
    solved = None
    for _ in range(_MAX_ROUNDS):
        solved = _master(cols, link_use, n, cap_share)
        if solved is None:
            return None
        weight, z, link_dual, root_dual = solved
        if time.monotonic() > deadline:
            break
        price = np.asarray(link_use.T @ link_dual).ravel()
        scale = float(np.median(price[price > 0])) if (price > 0).any() else 1.0
        entered = 0
        for r in range(n):
            if time.monotonic() > deadline:
                break
            t = _cheapest_tree(g, r, price + 1e-6 * scale * tie[r], int(limit[r]))
            if t is None:
                return None
            if float(price[t].sum()) < root_dual[r] - _ENTER * max(1.0, abs(root_dual[r])):
                entered += add(r, t)
        if not entered and time.monotonic() <= deadline:
            status = "optimal"
            break
    if solved is None:
        return None
    weight, z, _, _ = solved
    weight = weight[:len(cols)] if len(weight) >= len(cols) else np.concatenate(
        [weight, np.zeros(len(cols) - len(weight))])
    return FractionalPacking(tuple(cols), weight, z, status)


def rounded_packing(g: HopGraph, frac: FractionalPacking, rate: float, k: int,
                    deadline: float, seeds: TreePacking | None = None,
                    solve_s: float = 0.0) -> TreePacking | None:
    """``k`` trees per root (repetition allowed) among ``frac``'s trees with positive weight
    and ``seeds``' trees: each root's LP weights times ``k`` rounded by largest remainders,
    then single swaps (one copy of a tree for another tree of its root) while they lower the
    busiest link's load, or keep it and lower the sum of ``exp(40 load)`` over links; ``None``
    when the deadline has passed."""
    if time.monotonic() > deadline:
        return None
    n = g.n
    cols = [c for c, w in zip(frac.trees, frac.weight, strict=True) if w > 1e-9]
    weight = [w for w in frac.weight.tolist() if w > 1e-9]
    keys = {(r, m.tobytes()) for r, m in cols}
    if seeds is not None:
        for r in range(n):
            for j in range(seeds.k):
                t = _tree_of(seeds.edge[r, j], r)
                if (r, t.tobytes()) not in keys:
                    keys.add((r, t.tobytes()))
                    cols.append((r, t))
                    weight.append(0.0)
    link_use = _move_links(g)
    ok = g.capacity > 0
    per_use = np.where(ok, rate / k / np.where(ok, g.capacity, 1.0), 0.0)
    a = np.stack([np.asarray(link_use[:, m].sum(axis=1)).ravel() for _, m in cols], axis=1)
    a = a * per_use[:, None]
    a = a[a.any(axis=1)]
    roots = np.array([r for r, _ in cols])
    mult = _largest_remainders(roots, np.asarray(weight) * k, n, k)
    load = a @ mult
    by_root = [np.flatnonzero(roots == r) for r in range(n)]
    while time.monotonic() <= deadline:
        top = float(load.max())
        busy = int(np.argmax(load))
        best = None                       # (max, potential, out, in)
        potential = float(np.exp(_SHARP * (load - top)).sum())
        for j in np.flatnonzero((mult > 0) & (a[busy] > 0)).tolist():
            alt = by_root[roots[j]]
            alt = alt[alt != j]
            if not len(alt):
                continue
            trial = (load - a[:, j])[:, None] + a[:, alt]
            peak = trial.max(axis=0)
            pot = np.exp(_SHARP * (trial - top)).sum(axis=0)
            i = int(np.lexsort((pot, peak))[0])
            cand = (float(peak[i]), float(pot[i]), j, int(alt[i]))
            if best is None or cand[:2] < best[:2]:
                best = cand
        if best is None or not (best[0] < top - 1e-12 or (best[0] <= top + 1e-12
                                                          and best[1] < potential - 1e-9)):
            break
        _, _, out, into = best
        mult[out] -= 1
        mult[into] += 1
        load += a[:, into] - a[:, out]
    parent = np.zeros((n, k, n), dtype=np.int64)
    edge = np.zeros((n, k, n), dtype=np.int64)
    slot = np.zeros(n, dtype=np.int64)
    for (r, moves), times in zip(cols, mult.tolist(), strict=True):
        others = np.delete(np.arange(n), r)
        full = np.zeros(n, dtype=np.int64)
        full[others] = moves
        par = np.full(n, r, dtype=np.int64)
        par[others] = g.src[moves]
        for _ in range(times):
            parent[r, slot[r]], edge[r, slot[r]] = par, full
            slot[r] += 1
    worst = float(load.max()) if len(load) else 0.0
    status = "optimal" if worst <= 1 + 1e-9 else "feasible"
    return TreePacking(parent, edge, worst, status, solve_s)


#: sharpness of the swaps' tie-break potential (a link 0.025 below the busiest counts e^-1)
_SHARP = 40.0


def _largest_remainders(roots: np.ndarray, want: np.ndarray, n: int, k: int) -> np.ndarray:
    """Whole multiplicities near ``want`` adding up to ``k`` per root."""
    mult = np.floor(want + 1e-9).astype(np.int64)
    for r in range(n):
        cols = np.flatnonzero(roots == r)
        short = k - int(mult[cols].sum())
        if short > 0:
            order = cols[np.argsort(-(want[cols] - mult[cols]), kind="stable")]
            mult[order[:short]] += 1
        elif short < 0:
            order = cols[np.argsort(want[cols] - mult[cols], kind="stable")]
            for j in order:
                while short < 0 and mult[j] > 0:
                    mult[j] -= 1
                    short += 1
    return mult
