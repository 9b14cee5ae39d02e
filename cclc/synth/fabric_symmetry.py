"""Automorphisms of a machine that permute its ranks freely: the fabric's analogue of a torus's
translations, so that trees are packed for one root per orbit and moved to the others.

Sixteen identical servers on a rail-optimized fabric can be permuted without changing
anything a schedule sees: links, capacities, latencies, faults, which vertices are ranks,
which ranks are in the group and which share a server. A failed leaf--spine cable breaks the
symmetry between rails, not between servers. Such a map is found without knowing what the
machine is, by *individualization and refinement* (the method of graph-isomorphism tools
such as nauty and bliss), on two copies of the machine side by side:

1. colour every vertex by what a map must keep (rank or not, member or not) and refine the
   colours of both copies together, Weisfeiler--Leman style: a vertex's next colour is its
   colour and the multiset of (link attributes, neighbour's colour) over its out- and
   in-links, until no class splits;
2. map the first member ``a`` to a target ``b`` of its colour (``a`` in the first copy and
   ``b`` in the second get one new colour) and refine again; then, while a class holds more
   than one vertex of the first copy, map its first such vertex ``v`` to itself when its twin
   is still free in that class (so what need not move stays put), else to the next free
   vertex after ``v`` (so the map runs on as one long cycle: server 0 to 1, 1 to 2, ...);
3. the result is *verified exactly* (:func:`is_automorphism`); it is used only when it is an
   automorphism and its powers move every member (``sigma^t(r) != r`` for ``0 < t < L``), so
   that the ``L`` powers form a group that acts freely on the members, as translations do.

Targets ``b`` are tried in index order until one gives such a map (a refinement that cannot
continue, or a map that fails the check, just moves on to the next target), within a budget
of link visits (``_MAX_WORK``): past it the search finds nothing and the synthesis runs
without the symmetry.

What it is used for: the ForestColl rate search runs one max-flow per orbit of members
(:func:`member_powers`), exact since an automorphism maps cuts onto cuts, and so do the
switch splitting's tests of whole levels while the graph being split stays invariant
(:mod:`cclc.synth.splitting`). Trees are *not*
packed one root per orbit on a fabric, as they are on a torus: on the 128-GPU fabric example
(16 servers, one failed leaf--spine cable) the packings invariant under the server shift
reach a load of 2.0 times the optimal share with one tree per root (2.4, 2.5 and 3.7 under
its subgroups of order 8, 4 and 2) where the plain packing reaches the optimum (1.0).
"""

from __future__ import annotations

import numpy as np

from cclc.collective import Collective
from cclc.topology import Topology

__all__ = ["find_free_automorphism", "is_automorphism", "link_map", "member_powers"]

#: targets tried for the first member before giving up (each try costs a few refinements)
_MAX_TRIES = 32
#: link visits of every refinement of a search, at the most, before it gives up (no map: the
#: synthesis then runs without the symmetry). A map individualizes about 0.6 of the vertices
#: one at a time (182 on the 288 of the 128-GPU example: 1.6e5 visits); a node of 4,096 alike
#: NICs (a mutated example) asked for some 15,000 refinements of 50,000 links, minutes
_MAX_WORK = 50_000_000
_MASK = np.uint64(0xFFFFFFFFFFFFFFFF)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64: a well-spread 64-bit hash of each value (for multiset sums)."""
    with np.errstate(over="ignore"):
        z = (x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)) & _MASK
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def _link_labels(topo: Topology) -> np.ndarray:
    """One integer per link for the attributes a map must keep."""
    attrs = np.stack([topo.link_bandwidth.astype(float), topo.link_latency.astype(float),
                      topo.link_failed.astype(float), np.asarray(topo.link_kind, dtype=float)],
                     axis=1)
    return np.unique(attrs, axis=0, return_inverse=True)[1].reshape(-1).astype(np.int64)


def _vertex_labels(topo: Topology, members: np.ndarray) -> np.ndarray:
    label = np.zeros(topo.n_vertices, dtype=np.int64)
    label[:topo.n_ranks] = 1
    label[members] = 2
    for r in topo.failed_ranks:
        label[r] = 3
    return label


class _Refiner:
    """Colour refinement on two copies of a machine (vertices ``0..V-1`` and ``V..2V-1``)."""

    def __init__(self, topo: Topology, members: np.ndarray):
        v = topo.n_vertices
        self.v = v
        lab = _link_labels(topo)
        self.src = np.concatenate([topo.link_src, topo.link_src + v]).astype(np.int64)
        self.dst = np.concatenate([topo.link_dst, topo.link_dst + v]).astype(np.int64)
        self.lab = np.concatenate([lab, lab]).astype(np.uint64)
        base = _vertex_labels(topo, members)
        #: link visits so far (each round of a refinement visits every link of both copies)
        self.work = 0
        self.start = self.refine(np.concatenate([base, base]))

    def refine(self, colors: np.ndarray) -> np.ndarray:
        n_classes = len(np.unique(colors))
        while True:
            self.work += len(self.src)
            c = colors.astype(np.uint64)
            with np.errstate(over="ignore"):
                out = _mix(self.lab * np.uint64(1 << 20) + c[self.dst] * np.uint64(2) + 1)
                inc = _mix(self.lab * np.uint64(1 << 20) + c[self.src] * np.uint64(2))
                h_out = np.zeros(2 * self.v, dtype=np.uint64)
                h_in = np.zeros(2 * self.v, dtype=np.uint64)
                np.add.at(h_out, self.src, out)
                np.add.at(h_in, self.dst, inc)
                # one 64-bit key per vertex (a collision could only merge two classes, and
                # every map found is verified exactly)
                key = _mix(c) ^ _mix(h_out ^ np.uint64(0x5851F42D4C957F2D)) ^ _mix(
                    _mix(h_in) + np.uint64(1))
            colors = np.unique(key, return_inverse=True)[1].reshape(-1).astype(np.int64)
            count = int(colors.max()) + 1
            if count == n_classes:
                return colors
            n_classes = count

    def balanced(self, colors: np.ndarray) -> bool:
        """Whether every colour has as many vertices in one copy as in the other."""
        size = int(colors.max()) + 1
        return bool((np.bincount(colors[:self.v], minlength=size)
                     == np.bincount(colors[self.v:], minlength=size)).all())

    def individualize(self, colors: np.ndarray, a: int, b: int) -> np.ndarray:
        colors = colors.copy()
        new = int(colors.max()) + 1
        colors[a] = new
        colors[self.v + b] = new
        return self.refine(colors)

    def map_from(self, a: int, b: int) -> np.ndarray | None:
        """The vertex map that sends ``a`` to ``b`` (step 2 of the module docstring), or
        ``None`` when the refinement cannot be continued."""
        v = self.v
        colors = self.individualize(self.start, a, b)
        while self.balanced(colors) and self.work <= _MAX_WORK:
            size = int(colors.max()) + 1
            first = np.bincount(colors[:v], minlength=size)
            open_ = np.flatnonzero(first[colors[:v]] > 1)
            if not len(open_):
                perm = np.empty(v, dtype=np.int64)
                pos = np.empty(size, dtype=np.int64)
                pos[colors[v:]] = np.arange(v)
                perm[:] = pos[colors[:v]]
                return perm
            x = int(open_[0])
            cell = np.flatnonzero(colors[v:] == colors[x])
            if colors[v + x] == colors[x]:
                y = x
            else:
                after = cell[cell > x]
                y = int(after[0]) if len(after) else int(cell[0])
            colors = self.individualize(colors, x, y)
        return None


def is_automorphism(topo: Topology, members, perm: np.ndarray) -> bool:
    """Whether the vertex map ``perm`` keeps everything a schedule sees: it is a bijection,
    maps ranks to ranks, members to members, failed ranks to failed ranks, servers onto
    servers, and links onto links of equal bandwidth, latency, kind and health (as a
    multiset: parallel links count), and fault groups onto fault groups."""
    v, nr = topo.n_vertices, topo.n_ranks
    perm = np.asarray(perm, dtype=np.int64)
    if perm.shape != (v,) or not np.array_equal(np.sort(perm), np.arange(v)):
        return False
    if not ((perm[:nr] < nr).all() and (perm[nr:] >= nr).all()):
        return False
    member = np.zeros(v, dtype=bool)
    member[np.asarray(members, dtype=np.int64)] = True
    if not np.array_equal(member[perm], member):
        return False
    failed = np.zeros(v, dtype=bool)
    failed[list(topo.failed_ranks)] = True
    if not np.array_equal(failed[perm], failed):
        return False
    node = topo.node_of_rank
    if node is not None:
        # ranks that share a server go to ranks that share a server, and only those
        pairs = np.unique(np.stack([node, node[perm[:nr]]], axis=1), axis=0)
        if len(np.unique(pairs[:, 0])) != len(pairs) or len(np.unique(pairs[:, 1])) != len(pairs):
            return False
    return link_map(topo, perm) is not None


def link_map(topo: Topology, perm: np.ndarray) -> np.ndarray | None:
    """``out[l]``: the link that link ``l`` goes to under vertex map ``perm`` (parallel links
    of equal attributes in index order), or ``None`` when the links are not kept."""
    lab = _link_labels(topo)
    v = topo.n_vertices
    ends = (topo.link_src.astype(np.int64) * v + topo.link_dst) * (int(lab.max()) + 1) + lab
    moved = (perm[topo.link_src].astype(np.int64) * v + perm[topo.link_dst]) \
        * (int(lab.max()) + 1) + lab
    order_ends = np.argsort(ends, kind="stable")
    order_moved = np.argsort(moved, kind="stable")
    if not np.array_equal(ends[order_ends], moved[order_moved]):
        return None
    out = np.empty(len(ends), dtype=np.int64)
    out[order_moved] = order_ends
    for _, links in topo.fault_groups:
        image = set(out[list(links)].tolist())
        if not any(image == set(other) for _, other in topo.fault_groups):
            return None
    return out


def _powers(perm: np.ndarray, members: np.ndarray) -> int | None:
    """The order ``L`` of ``perm`` on ``members`` when every member lies on a cycle of length
    ``L > 1`` (the powers then act freely), else ``None``."""
    seen = np.zeros(len(perm), dtype=bool)
    length = None
    for start in members.tolist():
        if seen[start]:
            continue
        n, x = 0, start
        while not seen[x]:
            seen[x] = True
            x = int(perm[x])
            n += 1
        if x != start or (length is not None and n != length):
            return None
        length = n
    return length if length is not None and length > 1 else None


def find_free_automorphism(topo: Topology, members) -> np.ndarray | None:
    """A verified automorphism of ``topo`` (vertex map) whose powers move every member, or
    ``None`` (module docstring)."""
    members = np.asarray(sorted(members), dtype=np.int64)
    if len(members) < 2:
        return None
    ref = _Refiner(topo, members)
    a = int(members[0])
    targets = np.flatnonzero(ref.start[ref.v:] == ref.start[a])
    for b in [int(t) for t in targets if t != a][:_MAX_TRIES]:
        if ref.work > _MAX_WORK:
            return None
        perm = ref.map_from(a, b)
        if perm is None or _powers(perm, members) is None:
            continue
        if is_automorphism(topo, members, perm):
            return perm
    return None


def member_powers(coll: Collective, perm: np.ndarray | None = None) -> np.ndarray | None:
    """``(L, n)``: member ``v`` (group index) goes to ``out[t, v]`` under the ``t``-th power
    of a free automorphism of the collective's machine (row 0 the identity), or ``None``.

    Every power maps the machine, its members and capacities onto themselves, so it maps
    cuts onto cuts of equal capacity: the ForestColl rate search needs one max-flow per
    orbit (:func:`cclc.synth.trees.forestcoll_rate`'s ``probe_members``). ``perm``: the
    automorphism (vertex map) when already found by :func:`find_free_automorphism`.
    """
    group = np.asarray(coll.group, dtype=np.int64)
    if perm is None:
        perm = find_free_automorphism(coll.topology, group)
    if perm is None:
        return None
    index = np.full(coll.topology.n_vertices, -1, dtype=np.int64)
    index[group] = np.arange(coll.n)
    step = index[perm[group]]
    rows = [np.arange(coll.n)]
    while True:
        nxt = step[rows[-1]]
        if np.array_equal(nxt, rows[0]):
            return np.array(rows)
        rows.append(nxt)
