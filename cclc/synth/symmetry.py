"""Torus translations that a collective's faults leave intact.

A translation ``t`` of a torus maps rank ``c`` to ``c + t`` (mod each wrapped dimension; a
mesh dimension admits only ``t = 0``). It is a symmetry of a collective when it maps the usable
links onto usable links of the same bandwidth and latency and the group onto itself (and, for a
non-uniform alltoall, every pair's size onto the translated pair's). Translations act freely
(only the identity fixes a rank), so every orbit of ranks or links has one member per
translation: an optimization over one representative per orbit, translated, is an
optimization over the whole machine (see :mod:`cclc.synth.flows`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from cclc.collective import Collective

__all__ = ["Symmetry", "identity_symmetry", "translations"]


@dataclass(frozen=True, eq=False)
class Symmetry:
    """A group of translations: per element, the image of every vertex and every link.

    ``vertex[g, v]`` / ``link[g, e]`` are the images under translation ``g`` (row 0 is the
    identity); ``link`` maps only the ``usable`` links (others map to -1).
    """

    vertex: np.ndarray
    link: np.ndarray

    @property
    def order(self) -> int:
        return int(self.vertex.shape[0])

    def link_orbits(self, usable: np.ndarray) -> np.ndarray:
        """Per link: the smallest link id of its orbit (-1 for links not usable)."""
        img = np.where(usable[None, :], self.link, np.iinfo(np.int64).max)
        out = img.min(axis=0)
        return np.where(usable, out, -1)

    def vertex_representatives(self, vertices: np.ndarray) -> np.ndarray:
        """The vertices of ``vertices`` that are the smallest of their orbit."""
        vertices = np.asarray(vertices, dtype=np.int64)
        return vertices[self.vertex[:, vertices].min(axis=0) == vertices]


def identity_symmetry(n_vertices: int, n_links: int) -> Symmetry:
    """The trivial group (no symmetry used)."""
    return Symmetry(vertex=np.arange(n_vertices, dtype=np.int64)[None, :],
                    link=np.arange(n_links, dtype=np.int64)[None, :])


def translations(coll: Collective, usable: np.ndarray) -> Symmetry:
    """The translations of ``coll``'s torus that preserve the usable links, their bandwidth and
    latency, the group and the per-pair sizes; the identity alone off a torus."""
    topo = coll.topology
    V, E = topo.n_vertices, topo.n_links
    if topo.dims is None or topo.n_vertices != topo.n_ranks:
        return identity_symmetry(V, E)
    dims = np.asarray(topo.dims, dtype=np.int64)
    coords = np.stack(np.unravel_index(np.arange(V), tuple(dims)), axis=1)
    link_at = np.full((V, V), -1, dtype=np.int64)
    ok = np.flatnonzero(usable)
    link_at[topo.link_src[ok], topo.link_dst[ok]] = ok
    group = np.asarray(coll.group, dtype=np.int64)
    in_group = np.zeros(V, dtype=bool)
    in_group[group] = True
    index = np.full(V, -1, dtype=np.int64)
    index[group] = np.arange(len(group))
    pair = coll.pair_sizes
    shifts = [range(d) if w else range(1) for d, w in zip(dims.tolist(), topo.wrap, strict=True)]
    vmaps, lmaps = [], []
    for t in itertools.product(*shifts):
        vmap = np.ravel_multi_index(tuple(((coords + np.array(t)) % dims).T), tuple(dims))
        if not (in_group[vmap] == in_group).all():
            continue
        img = link_at[vmap[topo.link_src[ok]], vmap[topo.link_dst[ok]]]
        if (img < 0).any():
            continue
        if not (np.array_equal(topo.link_bandwidth[img], topo.link_bandwidth[ok])
                and np.array_equal(topo.link_latency[img], topo.link_latency[ok])):
            continue
        if pair is not None:
            gi = index[vmap[group]]
            if not np.array_equal(pair[np.ix_(gi, gi)], pair):
                continue
        lmap = np.full(E, -1, dtype=np.int64)
        lmap[ok] = img
        vmaps.append(vmap)
        lmaps.append(lmap)
    return Symmetry(vertex=np.array(vmaps, dtype=np.int64), link=np.array(lmaps, dtype=np.int64))
