"""Multi-dimensional torus AllToAll: per-ring algorithms composed by Pipeline, DimRotation, MATE.

Data for destination ``t`` travels dimension by dimension. A *phase* on dimension ``d`` is a
per-ring all-to-all among the ranks of every ring of ``d`` in which a rank's blocks are
aggregated by the destination's coordinate in ``d``. Every rank keeps the same amount of data in
every phase. Each chunk is cut into *pieces* (the chunks of Pipeline, DimRotation's ``D``
pieces) and *lanes* (fractions of a piece that take different paths: the two directions of the
Ring baseline and of an even ring's antipode, MATE's exact shares).

**Schedules** (``K`` pieces, ``D`` dimensions of size > 1; ``T(x)`` = one phase of ``x`` data):

* ``pipeline`` -- ``K`` pieces (``chunks=``, default 6), all in one dimension ``order=``
  (default ascending, e.g. ``order="210"``); at pipeline stage ``t`` piece ``k`` runs phase
  ``t - k``: ``(K + D - 1) T(S/K)``.
* ``dimrotation`` -- ``D`` pieces, piece ``c`` visits dimensions ``c, c+1, ...``: at every stage
  every dimension carries one piece: ``D T(S/D) = T(S)``.
* ``mate`` / ``matee`` -- DimRotation on a torus with one failed link, the faulty ring
  accelerated over detours through its neighbour rings.

Stage lengths are the longest ring plan of the stage, so the lockstep simulation charges a
stage for its slowest ring; in a schedule every op is a single-link hop of a ring, except
FoldedRing's logical edges (routes of 1-2 links) and MATE's detours (routes of 3 links).

Sizes: blocks are cut into pieces and lanes with integer elements (largest remainder first), so
any size works; pieces of one block differ by at most one element, lanes by rounding.

One idea per module, in the order data flows through them:

* :mod:`~cclc.algorithms.torus_alltoall.ring_plans` -- the per-ring algorithms (Ring, HalfRing,
  FoldedRing, Line, MATE's detours) as journeys of blocks on one ring;
* :mod:`~cclc.algorithms.torus_alltoall.faults` -- which rings are broken where, and what no
  ring schedule can serve;
* :mod:`~cclc.algorithms.torus_alltoall.strategies` -- layouts: which plan runs on which ring,
  lane, piece and stage (Pipeline, DimRotation);
* :mod:`~cclc.algorithms.torus_alltoall.mate` -- MATE's and MATEe's layouts and shares;
* :mod:`~cclc.algorithms.torus_alltoall.lowering` -- a layout into ops, buffers and routes;
* :mod:`~cclc.algorithms.torus_alltoall.entries` -- the registry entries.
"""

from __future__ import annotations

from cclc.algorithms.torus_alltoall.entries import (
    ALGORITHMS,
    MAX_PIPELINE_CHUNKS,
    SCHEDULES,
    build_for_sizes,
    build_torus_alltoall,
)
from cclc.algorithms.torus_alltoall.faults import TorusFaults, torus_faults

__all__ = [
    "ALGORITHMS",
    "MAX_PIPELINE_CHUNKS",
    "SCHEDULES",
    "TorusFaults",
    "build_for_sizes",
    "build_torus_alltoall",
    "torus_faults",
]
