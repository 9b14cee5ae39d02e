"""Which rings of a torus are broken where, and whether a ring-by-ring schedule can serve it.

Every torus AllToAll entry moves data ring by ring, so it needs every ring whole or cut at one
edge at most (a wrapped ring with one failed link is a line; FoldedRing, Line and MATE serve
it). A failed rank, a group that is not the whole torus, two failed links in one ring or a
failed link of a mesh dimension leave pieces that no ring schedule joins: ``direct`` serves
those.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from cclc.algorithms.common import torus_link_table
from cclc.algorithms.torus_alltoall.ring_plans import MINUS, PLUS
from cclc.collective import Collective, CollectiveKind
from cclc.errors import ScheduleError

__all__ = ["TorusFaults", "active_dims", "torus_dims", "torus_faults", "torus_reason"]


@dataclass(frozen=True)
class TorusFaults:
    """Failed links of a torus, per ring: ``broken[d]`` maps ring index -> failed edges.

    An edge ``q`` of a ring is the link pair between positions ``q`` and ``q+1``; it counts as
    failed when either direction failed. ``rings[d]`` is the ``(R, N)`` array of global ranks of
    every ring of dimension ``d`` (ring index = row).
    """

    dims: tuple[int, ...]
    wrap: tuple[bool, ...]
    rings: tuple[np.ndarray, ...]
    broken: tuple[dict[int, tuple[int, ...]], ...]

    @property
    def n_broken(self) -> int:
        return sum(len(b) for b in self.broken)

    def describe_ring(self, topo, d: int, g: int) -> str:
        r = self.rings[d][g]
        return f"the dimension-{d} ring {topo.vertex_names[r[0]]}..{topo.vertex_names[r[-1]]}"


def torus_dims(topo) -> tuple[int, ...]:
    """The torus's size per dimension (a torus always has them; other topologies are refused
    by :func:`torus_reason` before anything is built)."""
    if topo.dims is None:
        raise ScheduleError(f"internal: '{topo.name}' is a {topo.kind}, not a torus or mesh")
    return tuple(topo.dims)


def active_dims(dims: tuple[int, ...]) -> list[int]:
    """The dimensions a schedule moves data in (size 1 has no ring)."""
    return [d for d, size in enumerate(dims) if size > 1]


def _rings(dims: tuple[int, ...], d: int) -> np.ndarray:
    idx = np.arange(math.prod(dims)).reshape(dims)
    return np.moveaxis(idx, d, -1).reshape(-1, dims[d])


def _broken_edges(topo, table: np.ndarray, r: np.ndarray, d: int) -> np.ndarray:
    """``(R, N)``: edge ``q`` of ring ``g`` has a failed link (either direction)."""
    failed = topo.link_failed
    plus = table[r, d, PLUS]            # (R, N): link pos -> pos+1 (-1 if none)
    minus = np.roll(table[r, d, MINUS], -1, axis=1)   # link pos+1 -> pos
    bad = np.zeros(r.shape, dtype=bool)
    for links in (plus, minus):
        ok = links >= 0
        bad[ok] |= failed[links[ok]]
    if r.shape[1] == 2:
        bad[:, 1] = False               # one link pair only: edge 0 is the whole ring
        two = table[r[:, 1], d, PLUS]
        bad[:, 0] |= (two >= 0) & failed[np.maximum(two, 0)]
    return bad


def torus_faults(topo) -> TorusFaults:
    """Collect the failed links of a torus ring by ring."""
    dims = torus_dims(topo)
    table = torus_link_table(topo)
    rings, broken = [], []
    for d, size in enumerate(dims):
        r = _rings(dims, d)
        rings.append(r)
        out: dict[int, tuple[int, ...]] = {}
        if size > 1 and topo.link_failed.any():
            bad = _broken_edges(topo, table, r, d)
            for g in np.flatnonzero(bad.any(axis=1)).tolist():
                out[g] = tuple(np.flatnonzero(bad[g]).tolist())
        broken.append(out)
    return TorusFaults(dims=dims, wrap=tuple(topo.wrap), rings=tuple(rings),
                       broken=tuple(broken))


def torus_reason(coll: Collective, what: str) -> str | None:
    """Why no dimension-by-dimension torus schedule serves ``coll`` at all, or None."""
    topo = coll.topology
    if coll.kind is not CollectiveKind.ALLTOALL:
        return f"{what} serves alltoall only, not {coll.kind.value}"
    if topo.kind != "torus" or topo.dims is None:
        return f"{what} needs a torus or mesh; '{topo.name}' is a {topo.kind}"
    if topo.failed_ranks:
        dead = ", ".join(topo.vertex_names[r] for r in sorted(topo.failed_ranks))
        return (f"rank {dead} has failed: the collective runs on the {coll.n} surviving ranks, "
                f"which are not a full {topo.kind_name}, and {what} needs every ring whole; "
                "'direct' serves the surviving group")
    # any order of the whole torus is fine: blocks are placed by group index
    if sorted(coll.group) != list(range(topo.n_ranks)):
        return (f"{what} needs the group to be the whole {topo.kind_name} ({topo.n_ranks} "
                f"ranks), not {coll.n} of them; 'direct' serves any group")
    return _broken_ring_reason(topo, torus_faults(topo))


def _broken_ring_reason(topo, f: TorusFaults) -> str | None:
    """Why a ring's failed links leave pieces no ring schedule joins, or None."""
    for d in range(len(f.dims)):
        for g, edges in f.broken[d].items():
            if len(edges) > 1 or (not f.wrap[d] and edges):
                what_failed = (f"{len(edges)} failed links" if f.wrap[d]
                               else "a failed link on a mesh dimension")
                return (f"{f.describe_ring(topo, d, g)} has {what_failed}: it falls apart into "
                        f"pieces that no ring schedule can join; 'direct' routes around the "
                        f"failures")
            if f.dims[d] == 2 and edges:
                return (f"{f.describe_ring(topo, d, g)} (2 ranks) has lost its only link; "
                        f"'direct' routes around it")
    return None
