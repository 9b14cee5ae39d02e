"""The bytes every link carries in every step of a layout, without building a schedule.

A :class:`~cclc.algorithms.torus_alltoall.strategies.Layout` fixes, for every piece and phase,
which ring plan moves which slots of which lane on which rings from which step: that is all
a link's traffic per step depends on. :func:`layout_traffic` adds it up per (step, link) over
whole rings and slot ranges at once (no row per op, no buffers), exactly as
:mod:`~cclc.algorithms.torus_alltoall.lowering` lays the ops out, so the lower bounds of
:mod:`cclc.load_bounds` for Pipeline, DimRotation, MATE and MATEe cost milliseconds where
building the schedule costs seconds. :func:`layout_load` is those entries' ``load`` rule
(:attr:`cclc.algorithms.Algorithm.load`). ``tests/plan/test_step_bounds.py`` checks it
against the built schedules' own ops and routes.
"""

from __future__ import annotations

import math

import numpy as np

from cclc.algorithms import NoBound
from cclc.algorithms.common import torus_link_table
from cclc.algorithms.torus_alltoall.faults import torus_dims
from cclc.algorithms.torus_alltoall.lowering import split_chunks
from cclc.algorithms.torus_alltoall.mate import mate_layout
from cclc.algorithms.torus_alltoall.ring_plans import RING, RingPlan
from cclc.algorithms.torus_alltoall.strategies import Group, Layout, ring_layout
from cclc.collective import Collective
from cclc.ir import Routes
from cclc.link_traffic import CARRIED, EARLY, LATE, Traffic
from cclc.routing import carried_routes

__all__ = ["layout_load", "layout_traffic"]


class _PlanLinks:
    """Per (dimension, group, plan): every segment's links on every ring of the group, and
    each link's role, computed once (a plan's routes do not depend on the piece or phase)."""

    def __init__(self, coll: Collective) -> None:
        self.topo = coll.topology
        self.table = torus_link_table(self.topo)
        self.link_dst = self.topo.link_dst.astype(np.int64)
        self._cache: dict[tuple[int, int, int], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    def get(self, d: int, gi: int, grp: Group, plan: RingPlan
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(seg, link, role)`` of every (segment, ring, hop) of ``plan`` on the group's
        rings: the segment index, the link, the role (:data:`CARRIED`, ...)."""
        key = (d, gi, id(plan))
        if key not in self._cache:
            self._cache[key] = self._compute(d, grp, plan)
        return self._cache[key]

    def _compute(self, d: int, grp: Group, plan: RingPlan
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        rings = grp.rings.astype(np.int64)
        segs, links, roles = [], [], []
        for pid, path in enumerate(plan.paths):
            sel = np.flatnonzero(plan.path == pid)
            if not len(sel):
                continue
            r = rings[:, plan.src[sel]]                       # (G, S_pid): start ranks
            hop_links = []
            for axis, direction in path:
                link = self.table[r, d if axis == RING else axis, direction].astype(np.int64)
                hop_links.append(link)
                r = self.link_dst[link]
            h = len(path)
            stacked = np.stack(hop_links, axis=-1)            # (G, S_pid, h)
            if h == 1:
                role = np.full(stacked.shape, CARRIED, dtype=np.int8)
            else:
                flat = stacked.reshape(-1, h)
                # route 0 is the empty route of every table; route i + 1 is path i
                offsets = np.concatenate([[0, 0], h * np.arange(1, len(flat) + 1)])
                routes = Routes(offsets, flat.ravel())
                carried = carried_routes(self.topo, routes)[1:].reshape(stacked.shape[:2])
                late = np.full(h, LATE, dtype=np.int8)
                # every segment but the last ends before the chain's last sub-step; under
                # routing none each link is a segment, otherwise only the first link is
                # surely in an earlier segment than the last
                if self.topo.routing == "none":
                    late[:-1] = EARLY
                else:
                    late[0] = EARLY
                role = np.where(carried[..., None], CARRIED, late[None, None, :]).astype(np.int8)
            segs.append(np.broadcast_to(sel[None, :, None], stacked.shape).ravel())
            links.append(stacked.ravel())
            roles.append(role.ravel())
        return np.concatenate(segs), np.concatenate(links), np.concatenate(roles)


def layout_traffic(coll: Collective, lay: Layout) -> Traffic:
    """Bytes per (step, link, role) of the uniform alltoall schedule that
    :func:`~cclc.algorithms.torus_alltoall.lowering.lower_layout` builds from ``lay``."""
    dims = torus_dims(coll.topology)
    n = math.prod(dims)
    L = len(lay.lane_weights)
    elems = split_chunks(np.array([coll.count // n]), lay.pieces,
                         lay.lane_weights).reshape(lay.pieces, L)
    chunk_bytes = elems * coll.dtype.itemsize
    links = _PlanLinks(coll)
    out_step, out_link, out_role, out_bytes = [], [], [], []
    for p in range(lay.pieces):
        for d, start in lay.phases[p]:
            m = n // dims[d]                     # slots of an aggregated block
            for gi, grp in enumerate(lay.groups[d]):
                for lane, uses in enumerate(grp.uses):
                    for use in uses:
                        w = round(use.hi * m) - round(use.lo * m)
                        if w <= 0 or chunk_bytes[p, lane] == 0:
                            continue
                        seg, link, role = links.get(d, gi, grp, use.plan)
                        out_step.append(start + use.offset + use.plan.stage[seg])
                        out_link.append(link)
                        out_role.append(role)
                        out_bytes.append(np.full(len(seg), float(w * chunk_bytes[p, lane])))
    if not out_step:
        empty = np.zeros(0, dtype=np.int64)
        return Traffic(empty, empty, empty.astype(np.int8), empty.astype(np.float64))
    return Traffic(np.concatenate(out_step), np.concatenate(out_link),
                   np.concatenate(out_role), np.concatenate(out_bytes))


def layout_load(coll: Collective, algorithm: str, schedule: str, params: dict
                ) -> Traffic | NoBound:
    """The traffic of ``algorithm+schedule`` (or ``schedule`` MATE / MATEe) serving ``coll``
    with hint ``params``: the :func:`layout_traffic` of the layout its builder lowers."""
    if coll.pair_sizes is not None:
        return NoBound("the layouts' traffic assumes equal blocks; per-pair sizes have none")
    if schedule in ("mate", "matee"):
        lay = mate_layout(coll, schedule == "matee", params)
    else:
        lay = ring_layout(coll, algorithm, schedule, params)
    if not lay.groups:
        return NoBound("a single rank: nothing crosses a link")
    t = layout_traffic(coll, lay)
    if (t.link < 0).any():
        # the builder refuses a plan over a missing link: there is nothing to bound
        return NoBound("its plan crosses a missing link")
    return t
