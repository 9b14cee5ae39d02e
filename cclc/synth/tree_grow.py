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

import heapq
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import shortest_path

if TYPE_CHECKING:
    from cclc.synth.hop_graph import HopGraph

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
    link (a torus), else ``None``; ``edge_links[h]``: the links of move ``h``; ``out[v]`` and
    ``into[v]``: the moves leaving and entering member ``v``; ``link_moves``: the transposed
    incidence (which moves use each link); ``move_of[l]``: with ``single``, the move of link
    ``l`` (a link is one move at most: moves join distinct pairs), -1 for none;
    ``out_moves[v]``: the moves leaving ``v`` as ``(move, the member it reaches)`` and
    ``src_list``: every move's source, Python lists (the loop of :func:`_grow_static` reads
    them).
    """

    g: HopGraph
    inc: csr_matrix
    single: np.ndarray | None
    limit: np.ndarray
    edge_links: list
    out: list
    into: list
    link_moves: csr_matrix
    move_of: np.ndarray | None
    out_moves: list
    src_list: list


def tree_family(g: HopGraph, depth_slack: int) -> TreeFamily:
    """The family of ``g``'s moves, trees at most ``depth_slack`` levels deeper than the hop
    distance from the root to its farthest member (depth is pipeline fill, paid in steps)."""
    hops = shortest_path(csr_matrix((np.ones(g.m), (g.src, g.dst)), shape=(g.n, g.n)),
                         unweighted=True)
    limit = np.where(np.isfinite(hops), hops, 0).max(axis=1) + depth_slack
    # on a torus every move is one link: its price is that link's, no sparse product needed
    single = g.links if np.all(np.diff(g.offsets) == 1) else None
    edge_links = [g.links[g.offsets[h]:g.offsets[h + 1]] for h in range(g.m)]
    inc = g.incidence()
    move_of = None
    if single is not None:
        move_of = np.full(len(g.capacity), -1, dtype=np.int64)
        move_of[single] = np.arange(g.m)
    out = _by(g.src, g.n)
    dst = g.dst.tolist()
    out_moves = [[(h, dst[h]) for h in o.tolist()] for o in out]
    return TreeFamily(g, inc, single, limit.astype(np.int64), edge_links, out,
                      _by(g.dst, g.n), inc.T.tocsr(), move_of, out_moves, g.src.tolist())


def _by(ends: np.ndarray, n: int) -> list:
    """The moves of each member, ascending, grouped by the member at ``ends``."""
    order = np.argsort(ends, kind="stable")
    return np.split(order, np.searchsorted(ends[order], np.arange(1, n)))


def grow_tree(fam: TreeFamily, r: int, load: np.ndarray, unit: np.ndarray,
              link_perm: np.ndarray, depth_price: float) -> tuple[np.ndarray, np.ndarray,
                                                                  np.ndarray]:
    """One tree of root ``r`` grown under the prices of ``load``.

    ``load[l]``: link ``l``'s load relative to its share; ``unit[l]``: the load one tree
    adds per use of ``l``; ``link_perm``: where every link goes under each symmetry (the
    tree's translates stand for other roots' trees, so their uses raise the prices as the
    tree grows). Returns ``(parent, edge, uses)``: the member each member receives from, the
    move it arrives by, and the uses of every link by the tree and its translates.

    Every step takes the cheapest move from a member to a non-member (a move's price is its
    links' prices summed over the symmetry, plus ``depth_price`` per level of the member it
    reaches), among the moves from members above the depth limit while there are any; ties go
    to the lowest move. The prices of the frontier's moves are kept up to date as links' loads
    change, rather than recomputed over every move in every step.
    """
    if len(link_perm) == 1 and SELF_WEIGHT == 0.0:
        return _grow_static(fam, r, load, unit, depth_price)
    g = fam.g
    n, m = g.n, g.m
    nl = len(unit)
    parent = np.full(n, r, dtype=np.int64)
    edge = np.zeros(n, dtype=np.int64)
    depth = np.zeros(n, dtype=np.int64)
    reached = np.zeros(n, dtype=bool)
    own = np.zeros(nl)
    own_self = np.zeros(nl)                 # the untranslated tree's own uses
    p = np.exp(np.minimum(ALPHA * load, 600.0)) * unit
    symmetric = len(link_perm) > 1
    price = _orbit_sum(p, link_perm) if symmetric else p.copy()     # summed over the orbit
    move = price[fam.single] if fam.single is not None else fam.inc @ price
    # the frontier's costs: moves from members within the depth limit, and beyond it
    near = np.full(m, np.inf)
    far = np.full(m, np.inf)
    limit = fam.limit[r]

    def reach(v: int) -> None:
        reached[v] = True
        near[fam.into[v]] = np.inf
        far[fam.into[v]] = np.inf
        hs = fam.out[v]
        hs = hs[~reached[g.dst[hs]]]
        (near if depth[v] < limit else far)[hs] = move[hs] + depth_price * (depth[v] + 1)

    reach(r)
    for _ in range(n - 1):
        h = int(np.argmin(near))
        if near[h] == np.inf:
            h = int(np.argmin(far))
        v = int(g.dst[h])
        parent[v], edge[v], depth[v] = g.src[h], h, depth[g.src[h]] + 1
        mine = fam.edge_links[h]                 # distinct links: a path does not repeat one
        own_self[mine] += 1.0
        if symmetric:
            touched = link_perm[:, mine].ravel()     # translates may meet on a link
            np.add.at(own, touched, 1.0)
        else:
            touched = mine
            own[touched] += 1.0
        # the tree's own uses count SELF_WEIGHT (a root's few links carry all of its trees),
        # its translates' fully: they stand for other roots' trees
        felt = own[touched] - (1.0 - SELF_WEIGHT) * own_self[touched]
        p[touched] = np.exp(np.minimum(ALPHA * (load[touched] + felt * unit[touched]),
                                       600.0)) * unit[touched]
        # the orbit of a link is the orbit of its translates: only touched links' sums change
        if symmetric:
            links = np.unique(touched)
            price[links] = _orbit_sum(p, link_perm[:, links])
        else:
            links = touched
            price[links] = p[links]
        if fam.single is not None and fam.move_of is not None:     # set together
            hs = fam.move_of[links]
            hs = hs[hs >= 0]
            move[hs] = price[fam.single[hs]]
        else:
            hs = np.unique(fam.link_moves[links].indices)
            move[hs] = fam.inc[hs] @ price
        for cost in (near, far):
            live = hs[np.isfinite(cost[hs])]
            cost[live] = move[live] + depth_price * (depth[g.src[live]] + 1)
        reach(v)
    return parent, edge, own


def _grow_static(fam: TreeFamily, r: int, load: np.ndarray, unit: np.ndarray,
                 depth_price: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`grow_tree` without a symmetry: the tree's own uses do not count in its prices
    (``SELF_WEIGHT`` 0) and it has no translates, so every move keeps its price while the
    tree grows, and the rule is Prim's algorithm under a depth limit: a heap of the
    frontier's moves per side of the limit, keyed by (cost, move) for the same ties.

    A move is pushed only when it costs no more than every move already offered to the same
    member from the same side: a costlier one can never be the cheapest of its heap (the
    cheaper offer stays there until its member is reached), so the trees are the same, with
    fewer pushes and pops."""
    g = fam.g
    n = g.n
    p = np.exp(np.minimum(ALPHA * load, 600.0)) * unit
    move = (p[fam.single] if fam.single is not None else fam.inc @ p).tolist()
    out, src = fam.out_moves, fam.src_list
    limit = int(fam.limit[r])
    parent = [r] * n
    edge = [0] * n
    depth = [0] * n
    reached = [False] * n
    offered = ([math.inf] * n, [math.inf] * n)     # the cheapest offer per member and side
    heaps: tuple[list, list] = ([], [])             # (near, far): within the limit, beyond
    near, far = heaps
    push, pop = heapq.heappush, heapq.heappop
    v = r
    for left in range(n - 1, -1, -1):
        # v joins: its moves are offered to the members not reached yet
        reached[v] = True
        d = depth[v]
        side = 0 if d < limit else 1
        heap, best = heaps[side], offered[side]
        step = depth_price * (d + 1)
        for h, w in out[v]:
            if not reached[w]:
                c = move[h] + step
                if c <= best[w]:
                    best[w] = c
                    push(heap, (c, h, w))
        if not left:
            break
        while near and reached[near[0][2]]:
            pop(near)
        if near:
            _, h, v = pop(near)
        else:
            while reached[far[0][2]]:
                pop(far)
            _, h, v = pop(far)
        u = src[h]
        parent[v], edge[v], depth[v] = u, h, depth[u] + 1
    parent_a = np.array(parent, dtype=np.int64)
    edge_a = np.array(edge, dtype=np.int64)
    for_links = np.delete(edge_a, r)
    lengths = np.diff(g.offsets)[for_links]
    starts = np.repeat(g.offsets[for_links], lengths)
    within = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    own = np.bincount(g.links[starts + within], minlength=len(unit)).astype(np.float64)
    return parent_a, edge_a, own


def _orbit_sum(p: np.ndarray, perm: np.ndarray) -> np.ndarray:
    """``p[perm].sum(axis=0)``, added in the order of the rows whatever the shape (a plain
    sum may add a column pairwise or in order depending on the shape; prices updated a few
    links at a time must equal prices computed for every link, or ties break otherwise)."""
    return np.cumsum(p[perm], axis=0)[-1]


def depth_price(fam: TreeFamily, unit: np.ndarray, weight: float) -> float:
    """The price of one level of depth: ``weight`` times the median move's price at no load
    (on a fabric the typical move crosses the network, so trees do not grow long chains of
    cheap NVLink hops)."""
    base = fam.inc @ unit
    return weight * float(np.median(base[base > 0])) if (base > 0).any() else 1.0
