"""The registry entries of the torus AllToAll: what applies when, and the builders.

``<algorithm>+<schedule>`` for every per-ring algorithm in :data:`ALGORITHMS` composed by every
schedule in :data:`SCHEDULES`, plus ``mate`` and ``matee``.
"""

from __future__ import annotations

from cclc.algorithms import Algorithm, register
from cclc.algorithms.common import pair_distance
from cclc.algorithms.torus_alltoall.faults import (
    active_dims,
    torus_dims,
    torus_faults,
    torus_reason,
)
from cclc.algorithms.torus_alltoall.lowering import lower_layout, single_rank
from cclc.algorithms.torus_alltoall.mate import mate_applicable, mate_layout
from cclc.algorithms.torus_alltoall.strategies import order_param, pipeline_chunks, ring_layout
from cclc.algorithms.torus_alltoall.traffic import layout_load
from cclc.collective import Collective, CollectiveKind
from cclc.errors import CollectiveError
from cclc.ir import Schedule

__all__ = ["ALGORITHMS", "MAX_PIPELINE_CHUNKS", "SCHEDULES", "build_for_sizes",
           "build_torus_alltoall"]

ALGORITHMS = ("ring", "halfring", "foldedring", "line")
SCHEDULES = ("pipeline", "dimrotation")
_KINDS = frozenset({CollectiveKind.ALLTOALL})

#: most pieces a pipeline(chunks=K) schedule takes
MAX_PIPELINE_CHUNKS = 64


def _param_reason(coll: Collective, what: str, schedule: str, params: dict) -> str | None:
    """Why the parameters of ``algorithm+schedule`` are wrong, or None."""
    allowed = {"pipeline": {"chunks", "order"}, "dimrotation": set()}[schedule]
    extra = set(params) - allowed
    if extra:
        return (f"{what} takes " + (f"only {', '.join(sorted(allowed))}" if allowed
                                    else "no parameters") + f" (got {', '.join(sorted(extra))})")
    if schedule == "pipeline":
        try:
            k = pipeline_chunks(params)
            order_param(params, active_dims(torus_dims(coll.topology)))
        except CollectiveError as e:
            return e.message
        if k > MAX_PIPELINE_CHUNKS:
            # ops grow with K while the pipeline's gain, (K+D-1)/K, is spent long before
            return (f"pipeline(chunks={k}) is over the limit of {MAX_PIPELINE_CHUNKS} chunks: "
                    "more pieces multiply the ops without shortening the pipeline")
    return None


def _applicable(coll: Collective, algorithm: str, schedule: str, params: dict) -> str | None:
    if schedule in ("mate", "matee"):
        return mate_applicable(coll, schedule == "matee", params)
    what = f"{algorithm}+{schedule}"
    reason = torus_reason(coll, what) or _param_reason(coll, what, schedule, params)
    if reason:
        return reason
    f = torus_faults(coll.topology)
    if algorithm in ("ring", "halfring") and f.n_broken:
        d = next(d for d in range(len(f.dims)) if f.broken[d])
        g = next(iter(f.broken[d]))
        return (f"{f.describe_ring(coll.topology, d, g)} has a failed link; {algorithm} needs "
                f"whole rings: foldedring+{schedule}, line+{schedule}, mate or matee serve it")
    if algorithm in ("foldedring", "line") and not f.n_broken:
        return (f"{algorithm} is the fault-tolerant form of halfring and this "
                f"{coll.topology.kind_name} has no failed link: halfring+{schedule} is the same "
                "schedule")
    return None


def build_torus_alltoall(coll: Collective, algorithm: str, schedule: str, **params) -> Schedule:
    """``algorithm`` in :data:`ALGORITHMS` composed by ``schedule`` in :data:`SCHEDULES`, or
    ``("halfring", "mate"|"matee")``."""
    return build_for_sizes(coll, [coll.size], algorithm, schedule, **params)[0]


def build_for_sizes(coll: Collective, sizes: list[int], algorithm: str, schedule: str,
                    **params) -> list[Schedule]:
    """The same schedule for several sizes (uniform alltoall): the ops do not depend on the
    size, only the chunk layouts do, so a size sweep builds the ops once."""
    reason = _applicable(coll, algorithm, schedule, params)
    if reason:
        raise CollectiveError(reason, coll.span)
    if coll.pair_sizes is not None and sizes != [coll.size]:
        raise CollectiveError("a non-uniform alltoall has its sizes in the matrix; it cannot be "
                              "resized")
    mate = schedule in ("mate", "matee")
    if mate:
        lay = mate_layout(coll, schedule == "matee", params)
    else:
        lay = ring_layout(coll, algorithm, schedule, params)
    if not lay.groups:
        return single_rank(coll, sizes, algorithm, schedule)
    if mate:
        return lower_layout(coll, lay, schedule, "-", sizes)
    return lower_layout(coll, lay, algorithm, schedule, sizes)


def _entry(algorithm: str, schedule: str, description: str) -> Algorithm:
    name = schedule if schedule in ("mate", "matee") else f"{algorithm}+{schedule}"
    return register(Algorithm(
        name=name, collectives=_KINDS,
        applicable=lambda coll, **p: _applicable(coll, algorithm, schedule, p),
        build=lambda coll, **p: build_torus_alltoall(coll, algorithm, schedule, **p),
        # blocks move hop by hop between neighbours, one block per op at the least
        ops=lambda coll, **p: pair_distance(coll),
        # the layout the builder lowers, added up per link without building it
        load=lambda coll, **p: layout_load(coll, algorithm, schedule, p),
        description=description))


_DESCRIPTIONS = {
    "ring": "two-direction store-and-forward ring per dimension",
    "halfring": "shortest direction per block (antipode split) per dimension",
    "foldedring": "halfring; a ring with a failed link runs FoldedRing over its surviving links",
    "line": "halfring; a ring with a failed link runs shortest paths on the remaining line",
}
for _alg in ALGORITHMS:
    _entry(_alg, "pipeline", _DESCRIPTIONS[_alg] + ", K chunks pipelined over the dimensions")
    _entry(_alg, "dimrotation", _DESCRIPTIONS[_alg] + ", D pieces with rotated dimension orders")
_entry("halfring", "mate", "one failed link: the faulty ring's data takes 3-hop detours "
       "through the neighbouring rings in an acceleration stage (MATE)")
_entry("halfring", "matee", "MATE, and the faulty ring also moves a share by FoldedRing in the "
       "normal stage (MATEe)")
