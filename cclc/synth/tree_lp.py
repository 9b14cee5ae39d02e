"""Fractional packings of spanning out-trees by column generation, rounded to whole trees.

The congestion heuristic of :mod:`cclc.synth.trees` can stop a few percent above the optimal
rate ``x*`` (the PCIe fabric example: 7% with eight trees per root). Edmonds' branching theorem
says weighted trees reach ``x*`` exactly on a rank-only graph that keeps it (what
:mod:`cclc.synth.splitting` leaves), and a linear program over trees finds such weights:

    minimise ``sum_w c_w z_w``  subject to
        ``sum_T use_w(l, T) y_T <= z_w cap_l / x*``  for every window ``w`` and link ``l``,
        ``sum_{T rooted at r} y_T = 1``               for every root ``r``,

with ``y >= 0``. A *window* is a range of tree levels and ``use_w(l, T)`` counts the edges of
``T`` on those levels that cross link ``l``. With one window of all levels (weight 1), ``z`` is
the busiest link's load and ``z = 1`` is reached exactly when the trees reach ``x*``. The
windows are what a lockstep pipeline pays: with ``C`` chunks per tree, the edges on level
``s`` (its members send chunk ``c`` in step ``s + c``) are active in the steps ``s .. s + C -
1``, so a step's busiest link sees the levels of one window and the pipeline's bandwidth time
is ``sum_w (steps with window w) z_w`` (:func:`windows`). With ``C = 1`` each level is its own
step: trees whose levels share the links evenly need no pipeline at all (a depth-2 tree of the
PCIe fabric pays two latencies instead of one per chunk).

The LP has a column per spanning arborescence, so it is solved by column generation (the
master LP in HiGHS): a root's cheapest tree under the duals is priced by
:func:`_cheapest_tree` and enters when it costs less than the root's dual; the search ends
when none does, or at the deadline with the columns found so far. Pricing is heuristic:
Edmonds' minimum arborescence (``networkx.minimum_spanning_arborescence``) is exact for one
window but its trees are chains here (depth 11-16 on the PCIe fabric: pipeline fill), and the
cheapest tree of bounded depth is NP-hard, so the LP's value is optimal over the trees found.

The schedules carry ``k`` equal trees per root (each ``1/k`` of the root's data), so the
weights are rounded (:func:`rounded_packing`): each root's ``k * y`` by largest remainders,
then single swaps of one tree for another of its root while the objective falls.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_matrix, csr_matrix, hstack
from scipy.sparse.csgraph import shortest_path

from cclc.synth.hop_graph import HopGraph
from cclc.synth.trees import TreePacking

__all__ = ["FractionalPacking", "depth_limit", "fractional_packing", "rounded_packing",
           "windows"]

#: a column enters when its reduced cost is below this (relative to the root's dual)
_ENTER = 1e-7
#: column-generation rounds at most (each prices every root once)
_MAX_ROUNDS = 200
#: levels a tree may grow beyond its root's farthest member (as the congestion heuristic's)
DEPTH_SLACK = 1
#: one window of every level: the busiest link's load
ALL_LEVELS = ((0, 1 << 30, 1.0),)


def _hops(g: HopGraph) -> np.ndarray:
    return shortest_path(csr_matrix((np.ones(g.m), (g.src, g.dst)), shape=(g.n, g.n)),
                         unweighted=True)


def _limits(hops: np.ndarray) -> np.ndarray:
    """Each root's depth limit: its farthest member's hop distance plus :data:`DEPTH_SLACK`."""
    return np.where(np.isfinite(hops), hops, 0).max(axis=1).astype(np.int64) + DEPTH_SLACK


def depth_limit(g: HopGraph) -> int:
    """The most levels a tree of the column generation on ``g`` may have."""
    return int(_limits(_hops(g)).max())


def windows(height: int, chunks: int) -> tuple[tuple[int, int, float], ...]:
    """``(first level, last level, steps)`` of the lockstep steps of a pipeline of ``chunks``
    chunks over trees of ``height`` levels: step ``t`` moves the levels ``t - chunks + 1 ..
    t``."""
    count: dict[tuple[int, int], int] = {}
    for t in range(height + chunks - 1):
        key = (max(0, t - chunks + 1), min(height - 1, t))
        count[key] = count.get(key, 0) + 1
    return tuple((lo, hi, float(c)) for (lo, hi), c in sorted(count.items()))


@dataclass(frozen=True, eq=False)
class FractionalPacking:
    """Trees found by column generation and their LP weights.

    ``trees[i]`` is ``(root, moves)`` (the move into every non-root member, in member order
    with the root left out); ``weight[i]`` its share of its root's data (a root's weights add
    up to 1); ``z`` the LP's objective (one window: the busiest link's load relative to the
    share at the rate); ``status`` ``"optimal"`` when no tree prices out, ``"budget"`` when the
    deadline came first.
    """

    trees: tuple[tuple[int, np.ndarray], ...]
    weight: np.ndarray
    z: float
    status: str


def _tree_of(parent_edge: np.ndarray, root: int) -> np.ndarray:
    return np.delete(parent_edge, root)


def _levels(g: HopGraph, root: int, moves: np.ndarray, reduce: bool) -> np.ndarray:
    """The level (step offset) of every edge of a tree: ``depth - 1`` of the member it enters
    for out-trees; ``height - depth`` of the member that sends for in-trees (all members of a
    depth send together, :func:`cclc.synth.tree_schedule.reduce_offsets`)."""
    n = g.n
    others = np.delete(np.arange(n), root)
    parent = np.full(n, root, dtype=np.int64)
    parent[others] = g.src[moves]
    depth = np.zeros(n, dtype=np.int64)
    for _ in range(n):
        nxt = depth[parent] + 1
        nxt[root] = 0
        if np.array_equal(nxt, depth):
            break
        depth = nxt
    d = depth[others]
    return int(d.max()) - d if reduce else d - 1


class _Columns:
    """Trees and their per-window link uses."""

    def __init__(self, g: HopGraph, wins, reduce: bool):
        self.g, self.wins, self.reduce = g, wins, reduce
        self.move_links = g.incidence().T.tocsr()            # (links, moves)
        self.trees: list[tuple[int, np.ndarray]] = []
        self.uses: list[np.ndarray] = []                      # (windows * links,) each
        self.totals: list[np.ndarray] = []                    # (links,): every level
        self.seen: set[tuple[int, bytes]] = set()

    def add(self, root: int, moves: np.ndarray) -> bool:
        key = (root, moves.tobytes())
        if key in self.seen:
            return False
        self.seen.add(key)
        lev = _levels(self.g, root, moves, self.reduce)
        n_links = self.move_links.shape[0]
        use = np.zeros((len(self.wins), n_links))
        for w, (lo, hi, _) in enumerate(self.wins):
            sel = moves[(lev >= lo) & (lev <= hi)]
            if len(sel):
                use[w] = np.asarray(self.move_links[:, sel].sum(axis=1)).ravel()
        self.trees.append((root, moves))
        self.uses.append(use.ravel())
        self.totals.append(np.asarray(self.move_links[:, moves].sum(axis=1)).ravel())
        return True

    def matrix(self) -> np.ndarray:
        return np.stack(self.uses, axis=1)                    # (windows * links, cols)


def _cheapest_tree(g: HopGraph, root: int, price: np.ndarray, limit: int,
                   reduce: bool) -> np.ndarray | None:
    """A cheap spanning arborescence rooted at ``root`` at most ``limit`` levels deep, or
    ``None`` when the moves do not span the members from it. ``price[s, h]``: the price of
    move ``h`` on level ``s``; an in-tree's levels count from its leaves and are taken as
    those of a tree of height ``limit`` (the true height is known only at the end).

    Prim's growth over the cheapest move out of the tree whose tail is above the depth limit,
    then leaves re-hung from the cheapest parent that keeps the limit.
    """
    n = g.n

    def level(d_parent: np.ndarray) -> np.ndarray:
        return np.clip(limit - 1 - d_parent if reduce else d_parent, 0, len(price) - 1)

    reached = np.zeros(n, dtype=bool)
    reached[root] = True
    depth = np.zeros(n, dtype=np.int64)
    edge = np.full(n, -1, dtype=np.int64)
    for _ in range(n - 1):
        cand = np.flatnonzero(reached[g.src] & ~reached[g.dst] & (depth[g.src] < limit))
        if not len(cand):
            return None
        cost = price[level(depth[g.src[cand]]), cand]
        h = int(cand[np.argmin(cost)])
        v = int(g.dst[h])
        edge[v], depth[v], reached[v] = h, depth[g.src[h]] + 1, True
    for _ in range(2):
        changed = False
        has_child = np.zeros(n, dtype=bool)
        has_child[g.src[np.delete(edge, root)]] = True
        for v in np.flatnonzero(~has_child).tolist():
            if v == root or has_child[v]:
                continue
            cand = np.flatnonzero((g.dst == v) & (depth[g.src] < limit) & (g.src != v))
            cost = price[level(depth[g.src[cand]]), cand]
            i = int(np.argmin(cost))
            now = price[level(depth[g.src[edge[v:v + 1]]])[0], edge[v]]
            if cost[i] < now - 1e-15:
                h = int(cand[i])
                edge[v], depth[v] = h, depth[g.src[h]] + 1
                has_child[g.src[h]] = True
                changed = True
        if not changed:
            break
    return _tree_of(edge, root)


def _master(cols: _Columns, n: int, cap_share: np.ndarray):
    """The master LP: ``(weights, objective, duals (windows, links) >= 0, root duals)``."""
    wins = cols.wins
    n_links = len(cap_share)
    live = np.flatnonzero(np.tile(cap_share > 0, len(wins)))
    a = csr_matrix(cols.matrix())[live]
    nc = a.shape[1]
    # one z per window: -cap_share in that window's rows
    win_of = live // n_links
    z_block = coo_matrix((-np.tile(cap_share, len(wins))[live], (np.arange(len(live)), win_of)),
                         shape=(len(live), len(wins)))
    a_ub = hstack([a, z_block]).tocsr()
    roots = np.array([r for r, _ in cols.trees])
    a_eq = coo_matrix((np.ones(nc), (roots, np.arange(nc))), shape=(n, nc + len(wins))).tocsr()
    c = np.concatenate([np.zeros(nc), [w for *_, w in wins]])
    res = linprog(c, A_ub=a_ub, b_ub=np.zeros(len(live)), A_eq=a_eq, b_eq=np.ones(n),
                  bounds=(0, None), method="highs")
    if res.status != 0:
        return None
    duals = np.zeros(len(wins) * n_links)
    duals[live] = -res.ineqlin.marginals              # HiGHS: <= rows have duals <= 0
    return (res.x[:nc], float(res.fun), np.maximum(duals, 0.0).reshape(len(wins), n_links),
            res.eqlin.marginals)


def _level_prices(g: HopGraph, wins, duals: np.ndarray, height: int) -> np.ndarray:
    """``(height, m)``: a move's price on each level, the duals of every window holding it."""
    move_price = np.asarray(g.incidence() @ duals.T)          # (m, windows)
    out = np.zeros((height, g.m))
    for w, (lo, hi, _) in enumerate(wins):
        for s in range(max(0, lo), min(height - 1, hi) + 1):
            out[s] += move_price[:, w]
    return out


def _first_columns(cols: _Columns, seeds: TreePacking | None, cap_share: np.ndarray,
                   tie: np.ndarray, limit: np.ndarray, height: int) -> bool:
    """The seeds' trees, and for a root without any the cheapest tree by bandwidth time;
    ``False`` when some root spans nothing."""
    g = cols.g
    if seeds is not None:
        for r in range(g.n):
            for j in range(seeds.k):
                cols.add(r, _tree_of(seeds.edge[r, j], r))
    unit = np.asarray(g.incidence() @ np.where(cap_share > 0, 1.0 / np.maximum(cap_share,
                                                                             1e-300), 0.0))
    for r in range(g.n):
        if not any(c[0] == r for c in cols.trees):
            t = _cheapest_tree(g, r, np.tile(unit + 1e-6 * np.median(unit) * tie[r],
                                             (height, 1)), int(limit[r]), cols.reduce)
            if t is None:
                return False
            cols.add(r, t)
    return True


def fractional_packing(g: HopGraph, rate: float, deadline: float,
                       seeds: TreePacking | None = None, wins=ALL_LEVELS,
                       reduce: bool = False, columns=()) -> FractionalPacking | None:
    """Column generation for the LP of the module docstring on the moves of ``g`` at per-root
    rate ``rate`` over the windows ``wins`` (:func:`windows`; levels of in-trees when
    ``reduce``); ``seeds`` (a packing of ``g``) and ``columns`` (``(root, moves)`` trees, such
    as another LP's) give the first columns. ``None`` when some root spans nothing or the
    master LP fails."""
    n = g.n
    cap_share = np.where(g.capacity > 0, g.capacity / rate, 0.0)
    cols = _Columns(g, wins, reduce)
    hops = _hops(g)
    limit = _limits(hops)
    height = int(limit.max())
    # among trees of equal price, moves whose tail is nearer the root (shallower trees)
    tie = np.where(np.isfinite(hops), hops, n)[:, g.src]
    for r, moves in columns:
        cols.add(r, moves)
    if not _first_columns(cols, seeds, cap_share, tie, limit, height):
        return None
    status = "budget"
    solved = None
    for _ in range(_MAX_ROUNDS):
        solved = _master(cols, n, cap_share)
        if solved is None:
            return None
        _, _, duals, root_dual = solved
        if time.monotonic() > deadline:
            break
        price = _level_prices(g, wins, duals, height)
        scale = float(np.median(price[price > 0])) if (price > 0).any() else 1.0
        entered = 0
        for r in range(n):
            if time.monotonic() > deadline:
                break
            t = _cheapest_tree(g, r, price + 1e-6 * scale * tie[r], int(limit[r]), reduce)
            if t is None:
                return None
            lev = _levels(g, r, t, reduce)
            cost = float(price[np.minimum(lev, height - 1), t].sum())
            if cost < root_dual[r] - _ENTER * max(1.0, abs(root_dual[r])):
                entered += cols.add(r, t)
        if not entered and time.monotonic() <= deadline:
            status = "optimal"
            break
    assert solved is not None, "the loop above runs at least once"
    weight, z, _, _ = solved
    return FractionalPacking(tuple(cols.trees), weight, z, status)


def rounded_packing(g: HopGraph, frac: FractionalPacking, rate: float, k: int,
                    deadline: float, seeds: TreePacking | None = None,
                    solve_s: float = 0.0, wins=ALL_LEVELS, reduce: bool = False
                    ) -> TreePacking | None:
    """``k`` trees per root (repetition allowed) among ``frac``'s trees with positive weight
    and ``seeds``' trees: each root's LP weights times ``k`` rounded by largest remainders,
    then single swaps (one copy of a tree for another tree of its root) while they lower the
    objective ``sum_w c_w (busiest link's load in window w)``, or keep it and lower the sum
    of ``exp(40 load)`` over links and windows; ``None`` when the deadline has passed.

    The packing's ``load`` is its busiest link's load over all levels (as
    :class:`cclc.synth.trees.TreePacking` defines it), whatever the windows."""
    if time.monotonic() > deadline:
        return None
    n = g.n
    cols = _Columns(g, wins, reduce)
    weight = []
    for (r, m), w in zip(frac.trees, frac.weight, strict=True):
        if w > 1e-9 and cols.add(r, m):
            weight.append(w)
    if seeds is not None:
        for r in range(n):
            for j in range(seeds.k):
                if cols.add(r, _tree_of(seeds.edge[r, j], r)):
                    weight.append(0.0)
    n_links = len(g.capacity)
    ok = g.capacity > 0
    per_use = np.where(ok, rate / k / np.where(ok, g.capacity, 1.0), 0.0)
    a = cols.matrix() * np.tile(per_use, len(wins))[:, None]
    rows = np.flatnonzero(a.any(axis=1))
    a = a[rows]
    win_of = rows // n_links
    cost = np.array([c for *_, c in wins])
    roots = np.array([r for r, _ in cols.trees])
    mult = _largest_remainders(roots, np.asarray(weight) * k, n, k)
    load = a @ mult
    by_root = [np.flatnonzero(roots == r) for r in range(n)]
    n_w = len(wins)

    def objective(loads: np.ndarray) -> np.ndarray:
        """Per column of ``loads`` (rows, options): ``sum_w c_w max``."""
        peak = np.zeros((n_w,) + loads.shape[1:])
        np.maximum.at(peak, win_of, loads)
        return (cost.reshape((n_w,) + (1,) * (loads.ndim - 1)) * peak).sum(axis=0)

    while time.monotonic() <= deadline:
        now = float(objective(load[:, None])[0])
        top = load.max()
        potential = float(np.exp(_SHARP * (load - top)).sum())
        # the rows at their window's peak: only a swap off one of them lowers the objective
        peak = np.zeros(n_w)
        np.maximum.at(peak, win_of, load)
        hot = np.flatnonzero(load >= peak[win_of] - 1e-12)
        best = None
        for j in np.flatnonzero((mult > 0) & a[hot].any(axis=0)).tolist():
            alt = by_root[roots[j]]
            alt = alt[alt != j]
            if not len(alt):
                continue
            trial = (load - a[:, j])[:, None] + a[:, alt]
            obj = objective(trial)
            pot = np.exp(_SHARP * (trial - top)).sum(axis=0)
            i = int(np.lexsort((pot, obj))[0])
            cand = (float(obj[i]), float(pot[i]), j, int(alt[i]))
            if best is None or cand[:2] < best[:2]:
                best = cand
        if best is None or not (best[0] < now - 1e-12 or (best[0] <= now + 1e-12
                                                          and best[1] < potential - 1e-9)):
            break
        _, _, out, into = best
        mult[out] -= 1
        mult[into] += 1
        load += a[:, into] - a[:, out]
    parent, edge = _assemble(g, cols.trees, mult, k)
    total = (np.stack(cols.totals, axis=1) * per_use[:, None]) @ mult
    worst = float(total.max()) if len(total) else 0.0
    status = "optimal" if worst <= 1 + 1e-9 else "feasible"
    return TreePacking(parent, edge, worst, status, solve_s)


def _assemble(g: HopGraph, trees, mult: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """``(parent, edge)`` arrays of :class:`cclc.synth.trees.TreePacking`: every tree as many
    times as its multiplicity."""
    n = g.n
    parent = np.zeros((n, k, n), dtype=np.int64)
    edge = np.zeros((n, k, n), dtype=np.int64)
    slot = np.zeros(n, dtype=np.int64)
    for (r, moves), times in zip(trees, mult.tolist(), strict=True):
        others = np.delete(np.arange(n), r)
        full = np.zeros(n, dtype=np.int64)
        full[others] = moves
        par = np.full(n, r, dtype=np.int64)
        par[others] = g.src[moves]
        for _ in range(times):
            parent[r, slot[r]], edge[r, slot[r]] = par, full
            slot[r] += 1
    return parent, edge


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
