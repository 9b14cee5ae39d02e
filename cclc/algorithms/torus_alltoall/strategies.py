"""Layouts: which ring plan runs on which ring, in which lane, piece and stage.

A :class:`Layout` is everything a strategy decides and the lowering needs: the lanes (fractions
of every chunk that take different paths) and their weights, the pieces and, per piece, the
dimension and start step of each phase, and per dimension the :class:`Group` s of rings that run
the same plans. This module holds the layouts of Pipeline and DimRotation over Ring, HalfRing,
FoldedRing and Line; :mod:`cclc.algorithms.torus_alltoall.mate` builds MATE's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from cclc.algorithms.common import hint_int
from cclc.algorithms.torus_alltoall.faults import TorusFaults, active_dims, torus_faults
from cclc.algorithms.torus_alltoall.ring_plans import (
    MINUS,
    PLUS,
    RingPlan,
    folded_plan,
    halfring_plan,
    line_plan,
    ring_plan,
)
from cclc.collective import Collective
from cclc.errors import CollectiveError

__all__ = ["Group", "Layout", "PlanUse", "dim_groups", "needs_direction_lanes", "order_param",
           "phase_len", "pipeline_chunks", "ring_layout", "rotated_phases"]


class PlanUse(NamedTuple):
    """One plan a lane runs: from ``offset`` stages after its phase starts, moving the slots
    ``[lo m, hi m)`` of every aggregated block of ``m`` slots (MATE's slot shares cut a block
    into parts that take different plans; everything else uses ``0, 1``)."""

    plan: RingPlan
    offset: int
    lo: float
    hi: float


@dataclass(frozen=True)
class Group:
    """Rings of one dimension (``rings``: ``(G, N)`` global ranks) that run the same plans;
    ``uses[l]`` lists what lane ``l`` does."""

    rings: np.ndarray
    uses: tuple[tuple[PlanUse, ...], ...]


@dataclass(frozen=True)
class Layout:
    """What a strategy decides: lanes, pieces, per-piece phases and per-dimension groups."""

    lane_weights: np.ndarray
    pieces: int
    phases: tuple[tuple[tuple[int, int], ...], ...]   # per piece: (dim, start step)
    groups: dict[int, list[Group]]                     # per dim
    params: tuple[tuple[str, int | float | str], ...] = field(default=())


def needs_direction_lanes(algorithm: str, f: TorusFaults, active: list[int]) -> bool:
    """Two lanes, one per direction: Ring always, HalfRing for an even ring's antipode."""
    if algorithm == "ring":
        return True
    return any(f.wrap[d] and f.dims[d] % 2 == 0 and f.dims[d] >= 4 for d in active)


def _healthy_plan(algorithm: str, N: int, wrap: bool, lane: int) -> RingPlan:
    """The plan of a ring without failures (lane parity picks a direction where it matters)."""
    if not wrap:
        return line_plan(N, None)
    if algorithm == "ring":
        return ring_plan(N, PLUS if lane % 2 == 0 else MINUS)
    return halfring_plan(N, PLUS if lane % 2 == 0 else MINUS)


def dim_groups(algorithm: str, f: TorusFaults, d: int, L: int, cache: dict,
               skip: int | None = None) -> list[Group]:
    """Healthy rings share one group; every broken ring gets its own (FoldedRing or Line).

    Ring ``skip`` is left out (MATE gives the faulty ring lanes of its own). ``cache`` keeps
    one plan object per kind, so that the lowering builds the routes of a plan once.
    """
    N, wrap = f.dims[d], f.wrap[d]

    def plan(kind, *args):
        key = (kind, algorithm, N, wrap) + args
        if key not in cache:
            cache[key] = {"healthy": lambda lane: _healthy_plan(algorithm, N, wrap, lane),
                          "folded": lambda cut: folded_plan(N, cut),
                          "line": lambda cut: line_plan(N, cut)}[kind](*args)
        return cache[key]

    R = f.rings[d].shape[0]
    broken = f.broken[d]
    healthy = np.array([g for g in range(R) if g not in broken and g != skip], dtype=np.int64)
    groups = []
    if len(healthy):
        groups.append(Group(f.rings[d][healthy],
                            tuple((PlanUse(plan("healthy", lane % 2), 0, 0.0, 1.0),)
                                  for lane in range(L))))
    kind = "folded" if algorithm == "foldedring" else "line"
    for g, (cut,) in broken.items():
        if g == skip:
            continue
        groups.append(Group(f.rings[d][[g]],
                            tuple((PlanUse(plan(kind, cut), 0, 0.0, 1.0),) for _ in range(L))))
    return groups


def phase_len(groups: list[Group]) -> int:
    """Steps of a phase: the longest plan of any group and lane, from its offset."""
    return max((u.plan.n_stages + u.offset for g in groups for lane in g.uses for u in lane),
               default=0)


def pipeline_chunks(params: dict) -> int:
    """The ``chunks=`` of a pipeline (default 6)."""
    k = hint_int(params, "chunks", 6)
    assert k is not None        # a default is given
    return k


def order_param(params: dict, active: list[int]) -> list[int]:
    """The ``order=`` of a pipeline: each active dimension once (default ascending)."""
    order = params.get("order")
    if order is None:
        return list(active)
    text = str(order).replace(",", "").replace(" ", "")
    try:
        got = [int(ch) for ch in text]
    except ValueError:
        raise CollectiveError(f"order must list dimensions, like \"012\"; got {order!r}") from None
    if sorted(got) != sorted(active):
        raise CollectiveError(f"order {order!r} must list each dimension of size > 1 once: "
                              f"{''.join(map(str, active))} in some order")
    return got


def ring_layout(coll: Collective, algorithm: str, schedule: str, params: dict) -> Layout:
    """The layout of ``algorithm`` composed by Pipeline (``K`` pieces, one dimension after
    another, piece ``k`` runs phase ``t - k`` at stage ``t``) or DimRotation (``D`` pieces,
    piece ``c`` visits dimensions ``c, c+1, ...``)."""
    f = torus_faults(coll.topology)
    active = active_dims(f.dims)
    L = 2 if needs_direction_lanes(algorithm, f, active) else 1
    cache: dict = {}
    groups = {d: dim_groups(algorithm, f, d, L, cache) for d in active}
    lens = {d: phase_len(groups[d]) for d in active}
    weights = np.full(L, 1.0 / L)
    if schedule == "pipeline":
        K = pipeline_chunks(params)
        order = order_param(params, active)
        D = len(order)
        stage_len = [max([lens[order[t - k]] for k in range(K) if 0 <= t - k < D], default=0)
                     for t in range(K + D - 1)]
        starts = np.concatenate([[0], np.cumsum(stage_len)]).astype(int)
        phases = tuple(tuple((order[i], int(starts[k + i])) for i in range(D)) for k in range(K))
        return Layout(weights, K, phases, groups,
                      (("chunks", K), ("order", "".join(map(str, order)))))
    D = len(active)
    stage = max(lens.values(), default=0)
    return Layout(weights, max(D, 1), rotated_phases(active, stage), groups)


def rotated_phases(active: list[int], stage: int) -> tuple[tuple[tuple[int, int], ...], ...]:
    """DimRotation: piece ``c`` runs dimension ``active[(c + i) % D]`` from step ``i stage``."""
    D = len(active)
    return tuple(tuple((active[(c + i) % D], i * stage) for i in range(D))
                 for c in range(max(D, 1)))
