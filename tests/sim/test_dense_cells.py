"""The simulator's dense (step, link) table against the sorted one it replaces above a size."""

from __future__ import annotations

import numpy as np
import pytest

import cclc.sim as sim
from cclc.algorithms import get
from cclc.collective import CollectiveKind, make_collective
from cclc.topology import torus, with_faults


@pytest.mark.parametrize("algo, dims", [("direct", (3, 4)), ("mate", (4, 4)), ("bruck", (5,)),
                                        ("line+pipeline", (4, 3))])
@pytest.mark.parametrize("mode", ["lockstep", "event"])
def test_dense_and_sorted_tables_give_the_same_result(algo, dims, mode, monkeypatch):
    t = torus("t", dims, bandwidth=25e9, latency=1e-7)
    a, b = t.rank_at((1,) * len(dims)), t.rank_at((2,) + (1,) * (len(dims) - 1))
    t = with_faults(t, links=[(a, b), (b, a)])
    c = make_collective("c", CollectiveKind.ALLTOALL, t, t.all_ranks(), size=t.n_ranks * 4 * 96)
    s = get(algo).build(c)
    dense = sim.simulate(s, mode=mode)
    monkeypatch.setattr(sim, "_DENSE_CELLS", 0)
    sorted_ = sim.simulate(s, mode=mode)
    assert dense.time == sorted_.time
    for field in ("link_bytes", "link_busy", "step_start", "step_time", "step_bytes",
                  "op_start", "op_finish"):
        assert np.array_equal(getattr(dense, field), getattr(sorted_, field)), field
    assert dense.step_busiest_link == sorted_.step_busiest_link
    assert dense.critical_path == sorted_.critical_path
