"""Torus automorphisms that a collective's faults leave intact.

An automorphism of a torus (or mesh) maps rank ``c`` to ``P F c + t``: ``P`` permutes
dimensions of equal size and wrap, ``F`` reflects some dimensions (``c -> -c`` on a ring,
``c -> n - 1 - c`` on a line) and ``t`` translates along wrapped dimensions. It is a symmetry
of a collective when it maps the usable links onto usable links of the same bandwidth and
latency and the group onto itself (and, for a non-uniform alltoall, every pair's size onto the
mapped pair's). The translations alone act freely (only the identity fixes a rank); with
reflections and permutations a rank, a pair or a link can be fixed by several elements (its
*stabilizer*), and an orbit then has ``|G| / |stabilizer|`` members. An optimization over one
representative per orbit, mapped by every element, is an optimization over the whole machine
(see :mod:`cclc.synth.flows` for the weights that make this exact).

One fault on a 5x5x5 torus leaves no translation but 16 reflections and permutations (the
reflection of its own dimension that swaps the failed link's ends, the reflections of the two
others through the link, and their exchange).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from cclc.collective import Collective
from cclc.flow_lp import torus_automorphism_count, torus_point_maps

__all__ = ["MAX_MAP_ENTRIES", "Symmetry", "automorphisms", "identity_symmetry", "translations"]

#: the group is kept as one vertex map per element: at most this many entries (|G| x vertices);
#: a larger group keeps its translations only (a healthy 8x8x8 torus has 24 576 elements, 12.6
#: million entries, and its 512 translations alone already leave one source)
MAX_MAP_ENTRIES = 1 << 22


@dataclass(frozen=True, eq=False)
class Symmetry:
    """A group of vertex permutations that map the usable links onto usable links.

    ``vertex[g, v]`` is the image of vertex ``v`` under element ``g`` (row 0 is the identity).
    ``link_src``/``link_dst``/``link_id`` hold the usable links sorted by ``src * V + dst`` so
    that the image of a link is a lookup (:meth:`link_image`).
    """

    vertex: np.ndarray
    link_keys: np.ndarray
    link_ids: np.ndarray
    link_src: np.ndarray
    link_dst: np.ndarray

    @property
    def order(self) -> int:
        return int(self.vertex.shape[0])

    def link_image(self, g: int, links: np.ndarray) -> np.ndarray:
        """The images of usable ``links`` (global ids, any shape) under element ``g``."""
        V = self.vertex.shape[1]
        vmap = self.vertex[g]
        key = vmap[self.link_src[links]].astype(np.int64) * V + vmap[self.link_dst[links]]
        return self.link_ids[np.searchsorted(self.link_keys, key)]

    def link_orbits(self, usable: np.ndarray) -> np.ndarray:
        """Per link: the smallest link id of its orbit (-1 for links not usable)."""
        ok = np.flatnonzero(usable)
        out = ok.copy()
        for g in range(1, self.order):
            out = np.minimum(out, self.link_image(g, ok))
        full = np.full(len(usable), -1, dtype=np.int64)
        full[ok] = out
        return full

    def vertex_representatives(self, vertices: np.ndarray) -> np.ndarray:
        """The vertices of ``vertices`` that are the smallest of their orbit."""
        vertices = np.asarray(vertices, dtype=np.int64)
        return vertices[self.vertex[:, vertices].min(axis=0) == vertices]

    def pair_representatives(self, source: int, targets: np.ndarray
                             ) -> tuple[np.ndarray, np.ndarray]:
        """For pairs ``(source, t)``: the targets that are the smallest of their orbit under the
        stabilizer of ``source``, and each one's stabilizer size (the elements that fix both
        ``source`` and the target)."""
        targets = np.asarray(targets, dtype=np.int64)
        stab = self.vertex[self.vertex[:, source] == source]        # elements fixing source
        images = stab[:, targets]
        keep = images.min(axis=0) == targets
        fixed = (images[:, keep] == targets[keep][None, :]).sum(axis=0)
        return targets[keep], fixed


def _links_of(topo, usable: np.ndarray) -> tuple[np.ndarray, ...]:
    V = topo.n_vertices
    src = topo.link_src.astype(np.int64)
    dst = topo.link_dst.astype(np.int64)
    ok = np.flatnonzero(usable)
    key = src[ok] * V + dst[ok]
    order = np.argsort(key, kind="stable")
    return key[order], ok[order], src, dst


def identity_symmetry(coll_or_topo, usable: np.ndarray) -> Symmetry:
    """The trivial group (no symmetry used)."""
    topo = getattr(coll_or_topo, "topology", coll_or_topo)
    keys, ids, src, dst = _links_of(topo, usable)
    return Symmetry(vertex=np.arange(topo.n_vertices, dtype=np.int64)[None, :],
                    link_keys=keys, link_ids=ids, link_src=src, link_dst=dst)


def _point_maps(dims: tuple[int, ...], wrap: tuple[bool, ...], translations_only: bool
                ) -> list[tuple[tuple[int, ...], tuple[bool, ...]]]:
    """Dimension permutations (among dimensions alike in size and wrap) and reflections
    (where a reflection is not already a translation: rings of more than two ranks, lines);
    the identity first."""
    nd = len(dims)
    if translations_only:
        return [(tuple(range(nd)), (False,) * nd)]
    return torus_point_maps(dims, wrap)


def _group(coll: Collective, usable: np.ndarray, translations_only: bool) -> Symmetry:
    topo = coll.topology
    V = topo.n_vertices
    if topo.dims is None or V != topo.n_ranks:
        return identity_symmetry(topo, usable)
    dims, wrap = tuple(topo.grid_dims), tuple(topo.grid_wrap)
    nd = len(dims)
    keys, ids, src, dst = _links_of(topo, usable)
    ok = np.flatnonzero(usable)
    # a V x V table of the usable links' (bandwidth, latency) class: 0 where there is none
    classes = np.unique(np.stack([topo.link_bandwidth[ok], topo.link_latency[ok]]), axis=1,
                        return_inverse=True)[1].ravel() + 1
    table = np.zeros(V * V, dtype=np.int32)
    table[src[ok] * V + dst[ok]] = classes
    link_class = table[src[ok] * V + dst[ok]]
    group = np.asarray(coll.group, dtype=np.int64)
    member = np.zeros(V, dtype=bool)
    member[group] = True
    index = np.full(V, -1, dtype=np.int64)
    index[group] = np.arange(len(group))
    pair = coll.pair_sizes
    coords = np.array(np.unravel_index(np.arange(V), dims), dtype=np.int64)     # (nd, V)
    shifts = np.array(np.meshgrid(*[np.arange(m) if w else np.zeros(1, dtype=np.int64)
                                    for m, w in zip(dims, wrap, strict=True)],
                                  indexing="ij")).reshape(nd, -1)              # (nd, shifts)
    batch = max(1, (1 << 22) // max(1, len(ok)))
    maps = []
    for perm, flip in _point_maps(dims, wrap, translations_only):
        base = np.array([(-coords[perm[d]]) % dims[d] if flip[d] and wrap[d]
                         else dims[d] - 1 - coords[perm[d]] if flip[d]
                         else coords[perm[d]] for d in range(nd)])
        for lo in range(0, shifts.shape[1], batch):
            t = shifts[:, lo:lo + batch]
            img = np.zeros((t.shape[1], V), dtype=np.int64)
            for d in range(nd):
                img = img * dims[d] + (base[d][None, :] + t[d][:, None]) % dims[d]
            img = img[(member[img] == member[None, :]).all(axis=1)]
            if not len(img):
                continue
            moved = table[img[:, src[ok]] * V + img[:, dst[ok]]]                # (batch, E)
            img = img[(moved == link_class[None, :]).all(axis=1)]
            for vmap in img:
                if pair is not None:
                    gi = index[vmap[group]]
                    if not np.array_equal(pair[np.ix_(gi, gi)], pair):
                        continue
                maps.append(vmap)
    # the identity passes every test and comes first (identity point map, zero shift)
    return Symmetry(vertex=np.array(maps, dtype=np.int64), link_keys=keys, link_ids=ids,
                    link_src=src, link_dst=dst)


def translations(coll: Collective, usable: np.ndarray) -> Symmetry:
    """The translations of ``coll``'s torus that preserve the usable links, their bandwidth and
    latency, the group and the per-pair sizes; the identity alone off a torus."""
    return _group(coll, usable, translations_only=True)


def automorphisms(coll: Collective, usable: np.ndarray) -> Symmetry:
    """Every automorphism of ``coll``'s torus (translations, reflections, permutations of alike
    dimensions) that preserves the usable links, their bandwidth and latency, the group and the
    per-pair sizes; the translations alone when the whole group would take more than
    :data:`MAX_MAP_ENTRIES` map entries; the identity alone off a torus."""
    topo = coll.topology
    if topo.dims is None or topo.n_vertices != topo.n_ranks:
        return identity_symmetry(topo, usable)
    # counted, not listed: twelve alike dimensions have 12! permutations
    dims, wrap = topo.grid_dims, topo.grid_wrap
    bound = torus_automorphism_count(dims, wrap)[0] * topo.n_vertices
    shifts = math.prod(m if w else 1 for m, w in zip(dims, wrap, strict=True))
    if bound * shifts > MAX_MAP_ENTRIES:
        # the whole group might not fit: keep it only if the translations leave room for it
        trans = translations(coll, usable)
        if trans.order * bound > MAX_MAP_ENTRIES:
            return trans
    return _group(coll, usable, translations_only=False)
