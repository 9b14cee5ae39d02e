"""AllReduce trees packed jointly: each root's in-trees and out-trees share every link.

Packing the ReduceScatter in-trees and the AllGather out-trees separately, each at its own
ForestColl optimum, loads every link to its share twice over: the overlapped AllReduce then
takes the sum of the two phases' optimal times. The joint AllReduce bound of
:mod:`cclc.bounds` is lower wherever the faults leave the phases' bottlenecks on different
links: on a 5x5 torus with one failed link the rank beside the fault limits AllGather (24
blocks through 3 links) and ReduceScatter alike, yet the whole AllReduce needs only the
hop-bytes time, 2 x 24 tree edges per root spread over the 98 live links (76% of the sum).

So here both families are grown under one set of link prices (negotiated congestion, as in
:func:`cclc.synth.trees.pack_trees`): every root gets ``k`` out-trees over the moves and
``k`` in-trees over the reversed moves, each carrying ``1/k`` of the root's block, and a link's
load counts the trees of both phases that cross it. The in-tree of a root tends to take the
opposite directions of its out-tree's links (what NCCL's tree AllReduce does, reducing up and
broadcasting down at once); where a fault makes a direction scarce, the price moves one phase
off it. Loads are relative to the rate at which the whole AllReduce meets the bandwidth bound.
"""

from __future__ import annotations

import time

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import shortest_path

from cclc.synth.trees import HopGraph, TreePacking, _link_perm, _orbit_reps

__all__ = ["link_use", "pack_allreduce_trees"]

#: price of one level of depth relative to the median move (as in pack_trees): shallow trees
_DEPTH_WEIGHT = 0.25
#: rounds without a lower peak load after which the search stops
_PATIENCE = 4
#: how much a growing tree's own uses of a link raise its price (its translates always count)
_SELF_WEIGHT = 0.0
#: steepness of the link prices in the load (prices ``exp(alpha * load)``)
_ALPHA = 12.0


def link_use(g: HopGraph, p: TreePacking) -> np.ndarray:
    """Trees of ``p`` crossing each physical link of ``g`` (a tree counts once per move)."""
    n, k, _ = p.parent.shape
    nonroot = np.ones((n, k, n), dtype=bool)
    nonroot[np.arange(n), :, np.arange(n)] = False
    moves = np.bincount(p.edge[nonroot].ravel(), minlength=g.m)
    return g.incidence().T @ moves.astype(float)


def pack_allreduce_trees(g: HopGraph, rate: float, k: int, node_perm: np.ndarray,
                         edge_perm: np.ndarray, deadline: float, depth_slack: int = 1,
                         rounds: int = 40, seed: int = 0) -> tuple[TreePacking, TreePacking]:
    """``k`` in-trees (returned as out-trees of ``g.reversed()``) and ``k`` out-trees of ``g``
    per root, under one set of link prices.

    ``rate`` is the per-root rate at which the AllReduce meets its bandwidth bound (a root's
    block over the bound's time); a tree carries ``rate / k``. Returns ``(rs, ag)``, both with
    ``load`` the peak of the two phases together (1.0: the bound is met) and ``status``
    ``optimal`` / ``feasible`` / ``budget`` as :func:`cclc.synth.trees.pack_trees`.
    ``depth_slack``: levels a tree may grow beyond the hop distance from its root to the
    farthest member (depth is pipeline fill; fewer levels also leave fewer ways to balance).
    """
    t0 = time.monotonic()
    n = g.n
    cap = g.capacity
    link_perm = _link_perm(g, edge_perm)
    reps = _orbit_reps(node_perm)
    share = rate / k
    unit = np.where(cap > 0, share / np.where(cap > 0, cap, 1.0), 0.0)
    symmetric = len(link_perm) > 1
    families = [_Family(g.reversed(), depth_slack), _Family(g, depth_slack)]
    base = families[0].inc @ unit
    depth_price = _DEPTH_WEIGHT * float(np.median(base[base > 0])) if (base > 0).any() else 1.0
    load = np.zeros(len(cap))
    rng = np.random.default_rng(seed)

    def build(fam: _Family, r: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        # grow the tree one member at a time over the cheapest move out of it; its own
        # translates (other roots' trees) raise the prices as it grows
        parent = np.full(n, r, dtype=np.int64)
        edge = np.zeros(n, dtype=np.int64)
        depth = np.zeros(n, dtype=np.int64)
        reached = np.zeros(n, dtype=bool)
        reached[r] = True
        own = np.zeros(len(cap))
        own_self = np.zeros(len(cap))           # the untranslated tree's own uses
        p = np.exp(np.minimum(_ALPHA * load, 600.0)) * unit
        for _ in range(n - 1):
            frontier = reached[fam.g.src] & ~reached[fam.g.dst]
            cand = np.flatnonzero(frontier & (depth[fam.g.src] < fam.limit[r]))
            if not len(cand):
                cand = np.flatnonzero(frontier)
            price = p[link_perm].sum(axis=0) if symmetric else p
            move = (price[fam.single[cand]] if fam.single is not None
                    else (fam.inc @ price)[cand])
            h = int(cand[int(np.argmin(move + depth_price * (depth[fam.g.src[cand]] + 1)))])
            v = int(fam.g.dst[h])
            parent[v], edge[v], depth[v] = fam.g.src[h], h, depth[fam.g.src[h]] + 1
            reached[v] = True
            touched = link_perm[:, fam.edge_links[h]].ravel()
            np.add.at(own, touched, 1.0)
            np.add.at(own_self, fam.edge_links[h], 1.0)
            # the tree's own uses do not count (a root's few links carry all of its trees),
            # its translates' do: they stand for other roots' trees
            felt = own[touched] - (1.0 - _SELF_WEIGHT) * own_self[touched]
            p[touched] = np.exp(np.minimum(_ALPHA * (load[touched] + felt * unit[touched]),
                                           600.0)) * unit[touched]
        return parent, edge, own

    trees: dict[tuple[int, int, int], tuple[np.ndarray, np.ndarray]] = {}
    usage: dict[tuple[int, int, int], np.ndarray] = {}
    # interleave the phases so that neither takes the cheap links first
    keys = [(f, r, j) for r in reps for j in range(k) for f in (0, 1)]
    for key in keys:
        parent, edge, use = build(families[key[0]], key[1])
        trees[key], usage[key] = (parent, edge), use
        load += use * unit
    best_load, best = float(load.max()), dict(trees)
    status, stale = "feasible", 0
    for _ in range(rounds):
        if best_load <= 1.0 + 1e-9:
            break
        if time.monotonic() > deadline:
            status = "budget"
            break
        for i in rng.permutation(len(keys)):
            key = keys[i]
            load -= usage[key] * unit
            parent, edge, use = build(families[key[0]], key[1])
            trees[key], usage[key] = (parent, edge), use
            load += use * unit
        if load.max() < best_load - 1e-12:
            best_load, best, stale = float(load.max()), dict(trees), 0
        else:
            stale += 1
            if stale >= _PATIENCE:
                break
    if best_load <= 1.0 + 1e-9:
        status = "optimal"
    solve_s = time.monotonic() - t0
    rs, ag = (_translate({(r, j): tree for (fam, r, j), tree in best.items() if fam == f},
                         n, k, node_perm, edge_perm) for f in (0, 1))
    return (TreePacking(*rs, best_load, status, solve_s),
            TreePacking(*ag, best_load, status, solve_s))


def _translate(trees: dict, n: int, k: int, node_perm: np.ndarray, edge_perm: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray]:
    """``(parent, edge)`` of every root from the trees of one root per orbit."""
    parent = np.zeros((n, k, n), dtype=np.int64)
    edge = np.zeros((n, k, n), dtype=np.int64)
    for (r, j), (p, e) in trees.items():
        for t in range(len(node_perm)):
            nodes = node_perm[t]
            parent[nodes[r], j, nodes] = nodes[p]
            edge[nodes[r], j, nodes] = edge_perm[t][e]
    return parent, edge


class _Family:
    """One phase's move graph and what growing its trees reads often."""

    def __init__(self, g: HopGraph, depth_slack: int):
        self.g = g
        self.inc = g.incidence()
        # on a torus every move is one link: its price is that link's
        self.single = g.links if np.all(np.diff(g.offsets) == 1) else None
        hops = shortest_path(csr_matrix((np.ones(g.m), (g.src, g.dst)), shape=(g.n, g.n)),
                             unweighted=True)
        self.limit = np.where(np.isfinite(hops), hops, 0).max(axis=1) + depth_slack
        self.edge_links = [g.links[g.offsets[h]:g.offsets[h + 1]] for h in range(g.m)]
