"""Growing one spanning tree under link prices: the step both tree packers repeat.

:func:`cclc.synth.trees.pack_trees` (one phase's out-trees or in-trees) and
:func:`cclc.synth.joint_trees.pack_allreduce_trees` (both AllReduce phases under one set of
prices) rip up and regrow trees the same way: a tree grows one member at a time over the
cheapest move out of it, a move's price being its links' prices (exponential in their load
relative to their share) plus a price per level of depth, under a depth limit. The
*family* (:class:`TreeFamily`) is the move graph the trees are grown over: the moves for
out-trees, the reversed moves for in-trees.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import shortest_path

if TYPE_CHECKING:                      # trees.py imports this module
    from cclc.synth.trees import HopGraph

__all__ = ["ALPHA", "TreeFamily", "grow_tree", "tree_family"]

#: steepness of the link prices in the load (prices ``exp(ALPHA * load)``)
ALPHA = 12.0
#: how much a growing tree's own uses of a link raise its price (its translates, which stand
#: for other roots' trees, always count fully): a root's own link to the network is meant to
#: carry its tree many times
SELF_WEIGHT = 0.0


@dataclass(frozen=True, eq=False)
class TreeFamily:
    """The move graph trees of one kind grow over and what growing them reads often.

    ``limit[r]``: the depth a tree of root ``r`` may reach before it must take a deeper move
    only when no other is left; ``single``: the one link of every move when each move is one
    link (a torus), else ``None``; ``edge_links[h]``: the links of move ``h``.
    """

    g: HopGraph
    inc: csr_matrix
    single: np.ndarray | None
    limit: np.ndarray
    edge_links: list


def tree_family(g: HopGraph, depth_slack: int) -> TreeFamily:
    """The family of ``g``'s moves, trees at most ``depth_slack`` levels deeper than the hop
    distance from the root to its farthest member (depth is pipeline fill, paid in steps)."""
    hops = shortest_path(csr_matrix((np.ones(g.m), (g.src, g.dst)), shape=(g.n, g.n)),
                         unweighted=True)
    limit = np.where(np.isfinite(hops), hops, 0).max(axis=1) + depth_slack
    # on a torus every move is one link: its price is that link's, no sparse product needed
    single = g.links if np.all(np.diff(g.offsets) == 1) else None
    edge_links = [g.links[g.offsets[h]:g.offsets[h + 1]] for h in range(g.m)]
    return TreeFamily(g, g.incidence(), single, limit.astype(np.int64), edge_links)


def grow_tree(fam: TreeFamily, r: int, load: np.ndarray, unit: np.ndarray,
              link_perm: np.ndarray, depth_price: float) -> tuple[np.ndarray, np.ndarray,
                                                                  np.ndarray]:
    """One tree of root ``r`` grown under the prices of ``load``.

    ``load[l]``: link ``l``'s load relative to its share; ``unit[l]``: the load one tree
    adds per use of ``l``; ``link_perm``: where every link goes under each symmetry (the
    tree's translates stand for other roots' trees, so their uses raise the prices as the
    tree grows). Returns ``(parent, edge, uses)``: the member each member receives from, the
    move it arrives by, and the uses of every link by the tree and its translates.
    """
    g = fam.g
    n = g.n
    nl = len(unit)
    parent = np.full(n, r, dtype=np.int64)
    edge = np.zeros(n, dtype=np.int64)
    depth = np.zeros(n, dtype=np.int64)
    reached = np.zeros(n, dtype=bool)
    reached[r] = True
    own = np.zeros(nl)
    own_self = np.zeros(nl)                 # the untranslated tree's own uses
    p = np.exp(np.minimum(ALPHA * load, 600.0)) * unit
    symmetric = len(link_perm) > 1
    for _ in range(n - 1):
        frontier = reached[g.src] & ~reached[g.dst]
        cand = np.flatnonzero(frontier & (depth[g.src] < fam.limit[r]))
        if not len(cand):
            cand = np.flatnonzero(frontier)
        price = p[link_perm].sum(axis=0) if symmetric else p
        move = price[fam.single[cand]] if fam.single is not None else (fam.inc @ price)[cand]
        h = int(cand[int(np.argmin(move + depth_price * (depth[g.src[cand]] + 1)))])
        v = int(g.dst[h])
        parent[v], edge[v], depth[v] = g.src[h], h, depth[g.src[h]] + 1
        reached[v] = True
        touched = link_perm[:, fam.edge_links[h]].ravel()
        np.add.at(own, touched, 1.0)
        np.add.at(own_self, fam.edge_links[h], 1.0)
        # the tree's own uses count SELF_WEIGHT (a root's few links carry all of its trees),
        # its translates' fully: they stand for other roots' trees
        felt = own[touched] - (1.0 - SELF_WEIGHT) * own_self[touched]
        p[touched] = np.exp(np.minimum(ALPHA * (load[touched] + felt * unit[touched]),
                                       600.0)) * unit[touched]
    return parent, edge, own


def depth_price(fam: TreeFamily, unit: np.ndarray, weight: float) -> float:
    """The price of one level of depth: ``weight`` times the median move's price at no load
    (on a fabric the typical move crosses the network, so trees do not grow long chains of
    cheap NVLink hops)."""
    base = fam.inc @ unit
    return weight * float(np.median(base[base > 0])) if (base > 0).any() else 1.0
