"""``auto`` keeps one large schedule at a time: a dropped best is rebuilt, and must match."""

from __future__ import annotations

import numpy as np
import pytest

import cclc.plan as planner
from cclc.collective import CollectiveKind, make_collective
from cclc.errors import ScheduleError
from cclc.plan import fingerprint, plan
from cclc.topology import torus, with_faults


def _coll():
    # 36 ranks (no synthesis): a winner registered before MATE and MATEe, which follow it
    t = torus("t", (6, 6), bandwidth=25e9, latency=1e-7, routing="none")
    a, b = t.rank_at((1, 1)), t.rank_at((2, 1))
    t = with_faults(t, links=[(a, b), (b, a)])
    return make_collective("a", CollectiveKind.ALLTOALL, t, t.all_ranks(), size=36 * 36 * 64)


def test_dropping_and_rebuilding_the_best_changes_nothing(monkeypatch):
    c = _coll()
    kept = plan(c, prune=False)
    assert kept.name not in ("mate", "matee")
    monkeypatch.setattr(planner, "KEEP_BEST_OPS", 0)       # drop every best before a build
    builds = []
    real = planner._Best.rebuilt

    def spy(self, coll):
        builds.append(self.schedule is None)
        return real(self, coll)

    monkeypatch.setattr(planner._Best, "rebuilt", spy)
    dropped = plan(c, prune=False)
    assert builds == [True]                                 # the winner came back by a rebuild
    assert dropped.name == kept.name and dropped.time == kept.time
    assert dropped.candidates == kept.candidates
    assert fingerprint(dropped.schedule) == fingerprint(kept.schedule)
    for x, y in zip(dropped.schedule.ops.columns().values(),
                    kept.schedule.ops.columns().values(), strict=True):
        assert np.array_equal(x, y)


def test_a_rebuild_that_differs_is_refused(monkeypatch):
    c = _coll()
    best = plan(c, prune=False)
    assert best.name != "bruck"
    monkeypatch.setattr(planner, "KEEP_BEST_OPS", 0)
    # the best's fingerprint, but another entry to rebuild it with
    entry = planner._Best((best.time, 0), best.schedule, best.candidates[0],
                          planner.get("bruck")).make_room()
    assert entry.schedule is None and entry.fingerprint is not None
    with pytest.raises(ScheduleError, match="another schedule"):
        entry.rebuilt(c)


def test_the_fingerprint_sees_every_column():
    s = plan(_coll()).schedule
    base = fingerprint(s)
    for name, col in s.ops.columns().items():
        changed = col.copy()
        changed[-1] += 1
        other = s.replace(ops=s.ops.__class__(**{**s.ops.columns(), name: changed}))
        assert fingerprint(other) != base, name
