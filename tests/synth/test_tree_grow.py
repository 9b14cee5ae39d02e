"""The tree grower (cclc.synth.tree_grow) against a direct re-implementation of its rule.

The grower keeps the frontier's prices up to date incrementally; the reference below
recomputes every move's price over the whole symmetry in every step (the rule as stated:
cheapest move from a member to a non-member, links' prices summed over the translations plus
a price per level, moves from members within the depth limit first, ties to the lowest move).
Both must grow the same trees, move for move, on faulty and healthy tori (symmetric: prices
summed over the translations), a torus with a failed rank, and a fabric (moves of several
links).
"""

from __future__ import annotations

import os

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from synth_tori import FAULTY_5X5X5, faulty_torus, torus_with_cuts

import dsl
from cclc.collective import CollectiveKind as K
from cclc.collective import make_collective
from cclc.synth.hop_graph import hop_graph
from cclc.synth.tree_grow import ALPHA, SELF_WEIGHT, grow_tree, tree_family
from cclc.synth.trees import link_permutation, translations

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples")


def _reference(fam, r, load, unit, link_perm, depth_price):
    g = fam.g
    n = g.n
    parent = np.full(n, r, dtype=np.int64)
    edge = np.zeros(n, dtype=np.int64)
    depth = np.zeros(n, dtype=np.int64)
    reached = np.zeros(n, dtype=bool)
    reached[r] = True
    own = np.zeros(len(unit))
    own_self = np.zeros(len(unit))
    p = np.exp(np.minimum(ALPHA * load, 600.0)) * unit
    inc = g.incidence()
    for _ in range(n - 1):
        frontier = reached[g.src] & ~reached[g.dst]
        cand = np.flatnonzero(frontier & (depth[g.src] < fam.limit[r]))
        if not len(cand):
            cand = np.flatnonzero(frontier)
        price = np.cumsum(p[link_perm], axis=0)[-1]    # row by row, as the grower adds
        move = (inc @ price)[cand]
        h = int(cand[int(np.argmin(move + depth_price * (depth[g.src[cand]] + 1)))])
        v = int(g.dst[h])
        parent[v], edge[v], depth[v] = g.src[h], h, depth[g.src[h]] + 1
        reached[v] = True
        links = g.links[g.offsets[h]:g.offsets[h + 1]]
        touched = link_perm[:, links].ravel()
        np.add.at(own, touched, 1.0)
        np.add.at(own_self, links, 1.0)
        felt = own[touched] - (1.0 - SELF_WEIGHT) * own_self[touched]
        p[touched] = np.exp(np.minimum(ALPHA * (load[touched] + felt * unit[touched]),
                                       600.0)) * unit[touched]
    return parent, edge, own


def _same_trees(coll, seed: int, slack: int = 1) -> None:
    g = hop_graph(coll)
    _, edge_perm = translations(coll, g)
    link_perm = link_permutation(g, edge_perm)
    rng = np.random.default_rng(seed)
    live = g.capacity > 0
    # loads around 1 (where the prices decide) and coarse, so that ties occur
    load = np.round(rng.uniform(0.0, 1.3, len(g.capacity)), 1) * live
    unit = np.where(live, rng.choice([0.02, 0.05], len(g.capacity)), 0.0)
    for graph in (g, g.reversed()):
        fam = tree_family(graph, slack)
        for r in rng.choice(g.n, size=min(3, g.n), replace=False).tolist():
            got = grow_tree(fam, r, load, unit, link_perm, 0.01)
            want = _reference(fam, r, load, unit, link_perm, 0.01)
            for a, b in zip(got, want, strict=True):
                np.testing.assert_array_equal(a, b)


def _faulty(dims, links, ranks=()):
    topo = faulty_torus(dims, links, ranks)
    group = topo.live_ranks()
    return make_collective("ar", K.ALLREDUCE, topo, group, size=4 * len(group) * 64)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dims=st.sampled_from([(4, 4), (5, 5), (3, 3, 3), (4, 3)]),
       links=st.lists(st.integers(0, 10**6), min_size=1, max_size=3),
       seed=st.integers(0, 10**6), slack=st.integers(0, 1))
def test_same_trees_on_faulty_tori(dims, links, seed, slack):
    coll = _faulty(dims, links)
    g = hop_graph(coll)
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import connected_components
    mat = csr_matrix((np.ones(g.m), (g.src, g.dst)), shape=(g.n, g.n))
    if connected_components(mat, directed=True, connection="strong")[0] != 1:
        return                           # the faults cut the torus: no spanning tree
    _same_trees(coll, seed, slack)


def test_same_trees_under_translations():
    # healthy: every translation keeps the torus, prices are summed over 16 of them
    coll = _faulty((4, 4), [])
    g = hop_graph(coll)
    assert len(translations(coll, g)[0]) == 16
    _same_trees(coll, 1)


def test_same_trees_with_a_failed_rank():
    _same_trees(_faulty((4, 4), [], ranks=[5]), 2)


def test_same_trees_on_a_fabric():
    program = dsl.load(os.path.join(EXAMPLES, "fabric6_single_gpu.ccl"))
    topo = next(iter(program.topologies.values()))
    group = topo.live_ranks()
    coll = make_collective("ag", K.ALLGATHER, topo, group, size=4 * len(group) * 64)
    g = hop_graph(coll)
    assert np.diff(g.offsets).max() > 1           # moves of several links
    _same_trees(coll, 3)


def test_same_trees_on_the_faulty_5x5x5_torus_at_the_packers_depth_price():
    from cclc.synth.tree_grow import depth_price

    topo = torus_with_cuts((5, 5, 5), FAULTY_5X5X5)
    coll = make_collective("ar", K.ALLREDUCE, topo, list(range(125)), size=4 * 125 * 64)
    g = hop_graph(coll)
    _, edge_perm = translations(coll, g)
    link_perm = link_permutation(g, edge_perm)
    assert len(link_perm) == 1                   # the faults leave no translation
    rng = np.random.default_rng(5)
    unit = np.where(g.capacity > 0, 0.01, 0.0)
    load = rng.uniform(0.0, 1.1, len(g.capacity)) * (g.capacity > 0)
    for graph in (g, g.reversed()):
        fam = tree_family(graph, 0)
        price = depth_price(fam, unit, 0.25)
        for r in (0, 1, 77):
            got = grow_tree(fam, r, load, unit, link_perm, price)
            want = _reference(fam, r, load, unit, link_perm, price)
            for a, b in zip(got, want, strict=True):
                np.testing.assert_array_equal(a, b)
