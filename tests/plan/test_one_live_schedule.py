"""``auto`` keeps one large schedule in memory at a time: a best so far that is moved to a
temporary file while the next candidate is built comes back bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

import cclc.spill as spill
from cclc.algorithms import synth_flows
from cclc.collective import CollectiveKind, make_collective
from cclc.ir import Buf
from cclc.plan import plan
from cclc.topology import torus, with_faults


@pytest.fixture(autouse=True)
def _no_synthesis(monkeypatch):
    # templates only: synth (which auto considers on a faulty torus of up to 125 ranks) reports
    # its wall-clock solve time, so two plans of it are not bit for bit alike
    monkeypatch.setattr(synth_flows, "AUTO_MAX_RANKS", 32)


def _coll():
    # 36 ranks (no synthesis): a winner registered before MATE and MATEe, which follow it
    t = torus("t", (6, 6), bandwidth=25e9, latency=1e-7, routing="none")
    a, b = t.rank_at((1, 1)), t.rank_at((2, 1))
    t = with_faults(t, links=[(a, b), (b, a)])
    return make_collective("a", CollectiveKind.ALLTOALL, t, t.all_ranks(), size=36 * 36 * 64)


def _same(x, y) -> None:
    for a, b in zip(x.ops.columns().values(), y.ops.columns().values(), strict=True):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    assert np.array_equal(x.routes.offsets, y.routes.offsets)
    assert np.array_equal(x.routes.links, y.routes.links)
    for buf in Buf:
        assert np.array_equal(x.layouts[buf], y.layouts[buf])
    assert (x.algorithm, x.schedule, x.params) == (y.algorithm, y.schedule, y.params)
    assert x.collective is y.collective


def test_a_spilled_best_comes_back_bit_for_bit(monkeypatch):
    c = _coll()
    kept = plan(c, prune=False)
    assert kept.name not in ("mate", "matee")
    monkeypatch.setattr(spill, "KEEP_BEST_OPS", 0)         # spill every best before a build
    spilled = []
    real = spill.HeldSchedule.restored

    def spy(self):
        spilled.append(self.schedule is None)
        return real(self)

    monkeypatch.setattr(spill.HeldSchedule, "restored", spy)
    again = plan(c, prune=False)
    assert spilled == [True]                                # the winner was read back
    assert again.name == kept.name and again.time == kept.time
    assert again.candidates == kept.candidates
    _same(again.schedule, kept.schedule)


def test_small_schedules_stay_in_memory():
    s = plan(_coll()).schedule
    best = spill.HeldSchedule(s)
    assert best.make_room() is best
    assert best.restored() is s


def test_make_room_and_restore_round_trip(monkeypatch):
    s = plan(_coll()).schedule
    monkeypatch.setattr(spill, "KEEP_BEST_OPS", 0)
    best = spill.HeldSchedule(s).make_room()
    assert best.schedule is None and best.spilled is not None
    _same(best.restored(), s)


def test_the_best_is_moved_out_only_before_a_build(monkeypatch):
    # candidates that do not apply are not built: the best stays in memory for them (at
    # 4,096 GPUs direct was written out and read back for the AllToAll's 13 others)
    from cclc.algorithms import get
    from cclc.plan import Resolution

    t = torus("t", (8,), bandwidth=25e9, latency=1e-7, routing="none")
    c = make_collective("a", CollectiveKind.ALLTOALL, t, t.all_ranks(), size=8 * 8 * 64)
    monkeypatch.setattr(spill, "KEEP_BEST_OPS", 0)
    saved = []
    real = spill.HeldSchedule.make_room

    def spy(self):
        saved.append(self.schedule is not None)
        return real(self)

    monkeypatch.setattr(spill.HeldSchedule, "make_room", spy)
    # mate accelerates a ring with a failed link: not applicable on a healthy one
    p = plan(c, resolution=Resolution(c, (get("direct"), get("mate")), explicit=False),
             prune=False)
    assert p.name == "direct" and saved == []
    p = plan(c, resolution=Resolution(c, (get("direct"), get("bruck")), explicit=False),
             prune=False)
    assert saved == [True]                                  # before bruck's build
