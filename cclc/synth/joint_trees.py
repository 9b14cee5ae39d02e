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

from cclc.synth.hop_graph import HopGraph
from cclc.synth.tree_grow import depth_price, grow_tree, tree_family
from cclc.synth.trees import TreePacking, link_permutation, negotiate, orbit_reps, translated

__all__ = ["link_use", "pack_allreduce_trees"]

#: price of one level of depth relative to the median move (as in pack_trees): shallow trees
_DEPTH_WEIGHT = 0.25
#: rounds without a lower peak load after which the search stops
_PATIENCE = 4


def link_use(g: HopGraph, p: TreePacking) -> np.ndarray:
    """Trees of ``p`` crossing each physical link of ``g`` (a tree counts once per move)."""
    n, k, _ = p.parent.shape
    nonroot = np.ones((n, k, n), dtype=bool)
    nonroot[np.arange(n), :, np.arange(n)] = False
    moves = np.bincount(p.edge[nonroot].ravel(), minlength=g.m)
    return g.incidence().T @ moves.astype(float)


def pack_allreduce_trees(g: HopGraph, rate: float, k: int, node_perm: np.ndarray,
                         edge_perm: np.ndarray, deadline: float, depth_slack: int = 1,
                         rounds: int = 40, seed: int = 0
                         ) -> tuple[TreePacking, TreePacking] | None:
    """``k`` in-trees (returned as out-trees of ``g.reversed()``) and ``k`` out-trees of ``g``
    per root, under one set of link prices.

    ``rate`` is the per-root rate at which the AllReduce meets its bandwidth bound (a root's
    block over the bound's time); a tree carries ``rate / k``. Returns ``(rs, ag)``, both with
    ``load`` the peak of the two phases together (1.0: the bound is met) and ``status``
    ``optimal`` / ``feasible`` / ``budget`` as :func:`cclc.synth.trees.pack_trees`; ``None``
    when ``deadline`` passes before every root has its trees (the clock is read before every
    tree is grown).
    ``depth_slack``: levels a tree may grow beyond the hop distance from its root to the
    farthest member (depth is pipeline fill; fewer levels also leave fewer ways to balance).
    """
    t0 = time.monotonic()
    n = g.n
    cap = g.capacity
    link_perm = link_permutation(g, edge_perm)
    reps = orbit_reps(node_perm)
    share = rate / k
    unit = np.where(cap > 0, share / np.where(cap > 0, cap, 1.0), 0.0)
    families = [tree_family(g.reversed(), depth_slack), tree_family(g, depth_slack)]
    price_depth = depth_price(families[0], unit, _DEPTH_WEIGHT)
    load = np.zeros(len(cap))
    # interleave the phases so that neither takes the cheap links first
    keys = [(f, r, j) for r in reps for j in range(k) for f in (0, 1)]
    found = negotiate(keys, lambda key: grow_tree(families[key[0]], key[1], load, unit,
                                                  link_perm, price_depth),
                      load, unit, rounds, _PATIENCE, np.random.default_rng(seed), deadline)
    if found is None:
        return None                               # no complete packing to return
    best, best_load, status = found
    solve_s = time.monotonic() - t0
    rs, ag = (translated({(r, j): tree for (fam, r, j), tree in best.items() if fam == f},
                         n, k, node_perm, edge_perm) for f in (0, 1))
    return (TreePacking(*rs, best_load, status, solve_s),
            TreePacking(*ag, best_load, status, solve_s))

