"""Small torus AllToAll cases whose built schedules are kept as reference data.

``torus_alltoall_reference.npz`` holds, per case, every ops column, the routes and the chunk
layouts of the schedule the registered entry built before the torus AllToAll code became a
package (the single-module builder, commit 2fcf978). The refactored builder must reproduce
them exactly. Regenerating the file from the current builder would make the test compare the
builder with itself: do it only for an intended change of the schedules, and say so in the
commit (``python tests/algorithms/torus_reference_cases.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from cclc.algorithms import get
from cclc.collective import CollectiveKind, make_collective
from cclc.ir import OP_COLUMNS, Schedule
from cclc.topology import torus, with_faults

DATA = Path(__file__).parent / "data" / "torus_alltoall_reference.npz"

# (dims, wrap or None, failed edges [(coord a, coord b, both directions)], entry, params,
#  non-uniform seed or None)
CASES: list[tuple] = [
    ((3, 3), None, [], "ring+pipeline", {}, None),
    ((3, 3), None, [], "ring+dimrotation", {}, None),
    ((3, 4), None, [], "halfring+pipeline", {"chunks": 2, "order": "10"}, None),
    ((4, 4), None, [], "halfring+dimrotation", {}, None),
    ((4, 2), None, [], "halfring+dimrotation", {}, None),
    ((3, 4, 2), (True, False, True), [], "halfring+pipeline", {"chunks": 3}, None),
    ((6,), None, [((1,), (2,), True)], "foldedring+pipeline", {}, None),
    ((6,), None, [((1,), (2,), True)], "line+dimrotation", {}, None),
    ((4, 4), None, [((0, 0), (1, 0), True)], "foldedring+dimrotation", {}, None),
    ((4, 4), None, [((0, 0), (1, 0), True)], "line+pipeline", {}, None),
    ((4, 4), None, [((0, 0), (1, 0), True), ((2, 2), (2, 3), False)],
     "foldedring+dimrotation", {}, None),
    ((4, 4), None, [((0, 0), (1, 0), True)], "mate", {}, None),
    ((4, 4), None, [((0, 0), (1, 0), True)], "matee", {}, None),
    ((4, 4), None, [((0, 0), (1, 0), True)], "mate", {"rho": "artifact"}, None),
    ((4, 4), None, [((0, 0), (1, 0), True)], "mate", {"rho": 0.5}, None),
    ((5, 3), None, [((0, 0), (1, 0), True)], "mate", {"rho": "lockstep"}, None),
    ((5, 3), None, [((0, 1), (1, 1), True)], "matee", {"rho": "lockstep"}, None),
    ((4, 4), None, [((0, 0), (1, 0), True)], "matee", {"shares": "slots"}, None),
    ((3, 3, 3), None, [((0, 0, 0), (0, 1, 0), True)], "mate", {}, None),
    ((3, 3, 3), None, [((0, 0, 0), (0, 1, 0), True)], "matee", {"shares": "slots"}, None),
    ((3, 3, 3), None, [((0, 0, 0), (0, 1, 0), False)], "foldedring+pipeline", {}, None),
    ((3, 3, 3), None, [((0, 0, 0), (0, 1, 0), True)], "line+dimrotation", {}, None),
    ((4, 3), None, [], "ring+pipeline", {}, 1),
    ((4, 3), None, [((1, 0), (2, 0), True)], "foldedring+dimrotation", {}, 2),
    ((4, 3), None, [((1, 0), (2, 0), True)], "mate", {}, 3),
]


def case_name(i: int) -> str:
    dims, _, faults, name, params, seed = CASES[i]
    return f"{i:02d}_{'x'.join(map(str, dims))}_{name}"


def build_case(i: int) -> Schedule:
    """The schedule of case ``i`` from the registered entry (what a user gets)."""
    dims, wrap, faults, name, params, seed = CASES[i]
    t = torus("t", dims, wrap=wrap, bandwidth=32e9, latency=100e-9)
    links = []
    for a, b, both in faults:
        u, v = t.rank_at(a), t.rank_at(b)
        links += [(u, v), (v, u)] if both else [(u, v)]
    if links:
        t = with_faults(t, links=links)
    n = t.n_ranks
    if seed is None:
        c = make_collective("a2a", CollectiveKind.ALLTOALL, t, t.live_ranks(), size=n * 4 * 60)
    else:
        pairs = np.random.default_rng(seed).integers(0, 40, size=(n, n)) * 4
        c = make_collective("a2a", CollectiveKind.ALLTOALL, t, t.live_ranks(), pair_sizes=pairs)
    return get(name).build(c, **params)


def schedule_arrays(s: Schedule) -> dict[str, np.ndarray]:
    """Everything about a schedule's moves that the builder decides, as arrays."""
    out = {f"ops.{k}": getattr(s.ops, k) for k in OP_COLUMNS}
    out["routes.offsets"] = s.routes.offsets
    out["routes.links"] = s.routes.links
    for k, lay in enumerate(s.layouts):
        out[f"layout.{k}"] = lay
    out["params"] = np.array(json.dumps([list(p) for p in s.params]))
    return out


def main() -> None:
    data = {}
    for i in range(len(CASES)):
        for k, v in schedule_arrays(build_case(i)).items():
            data[f"{case_name(i)}/{k}"] = v
    DATA.parent.mkdir(exist_ok=True)
    np.savez_compressed(DATA, **data)


if __name__ == "__main__":
    main()
