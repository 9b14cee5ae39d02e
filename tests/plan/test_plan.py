"""The planner: name lookup and its errors, auto picks the fastest verified candidate."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from cclc.algorithms import REGISTRY, Algorithm, NoBound, every_rank_ops, get
from cclc.collective import CollectiveKind, Hint, make_collective
from cclc.errors import CollectiveError, ScheduleError, Span, render_error
from cclc.ir import Buf, ScheduleBuilder
from cclc.plan import crossover_table, hint_key, plan
from cclc.topology import torus
from cclc.verify import verify

SPAN = Span("x.ccl", 7, 15, 7, 19)


def _coll(kind=CollectiveKind.ALLGATHER, n=8, size=None, algorithm="auto", schedule="auto",
          params=(), latency=1e-6, root=None):
    topo = torus("t", (n,), bandwidth=10e9, latency=latency)
    if kind in (CollectiveKind.BROADCAST, CollectiveKind.REDUCE):
        root = 0 if root is None else root
    return make_collective("c", kind, topo, topo.all_ranks(), size=size or 4 * n * 1024,
                           root=root, algorithm=Hint(algorithm, params, SPAN),
                           schedule=Hint(schedule, (), SPAN))


def test_auto_keeps_the_fastest():
    for kind in (CollectiveKind.ALLGATHER, CollectiveKind.REDUCESCATTER,
                 CollectiveKind.BROADCAST):
        for size in (4 * 8, 4 * 8 * 2 ** 18):
            # unpruned, so every applicable candidate has a time (test_estimate.py checks
            # that pruning keeps the choice)
            p = plan(_coll(kind, size=size), prune=False)
            times = {c.name: c.time for c in p.candidates if c.applicable}
            assert len(times) >= 2
            assert p.time == min(times.values())
            assert p.name == min(times, key=times.get)


def test_auto_winner_depends_on_size():
    # 64 ranks on a ring: a tiny broadcast wants log2(n) tree steps, a huge one the pipeline
    small = plan(_coll(CollectiveKind.BROADCAST, n=64, size=64, latency=1e-5))
    large = plan(_coll(CollectiveKind.BROADCAST, n=64, size=2 ** 28, latency=1e-7))
    assert small.name == "tree" and large.name == "ring"


def test_explicit_algorithm():
    p = plan(_coll(algorithm="ring"))
    assert p.schedule.algorithm == "ring"
    assert [c.name for c in p.candidates] == ["ring"]
    verify(p.schedule)              # a plan holds a verified schedule
    assert p.bounds is not None and p.bound == p.bounds.best
    explained = plan(_coll(algorithm="ring"), explain=True)
    assert {c.name for c in explained.candidates} >= {"ring", "direct"}
    assert explained.name == "ring"


def test_hint_params_reach_the_algorithm():
    p = plan(_coll(CollectiveKind.BROADCAST, algorithm="ring", params=(("chunks", 3),)))
    assert dict(p.schedule.params)["chunks"] == 3


def test_unknown_algorithm_names_the_closest_and_the_span():
    with pytest.raises(CollectiveError) as info:
        plan(_coll(algorithm="rign"))
    err = info.value
    assert err.span == SPAN
    assert "did you mean 'ring'" in err.message and "direct" in err.message
    assert render_error(err).startswith("x.ccl:7:15: error: unknown algorithm 'rign'")


def test_algorithm_that_does_not_serve_the_collective():
    with pytest.raises(CollectiveError, match="'tree' does not serve allgather") as info:
        plan(_coll(algorithm="tree"))
    assert info.value.span == SPAN


def test_explicit_algorithm_not_applicable_gives_its_reason():
    with pytest.raises(CollectiveError, match="takes no parameter") as info:
        plan(_coll(algorithm="direct", params=(("chunks", 2),)))
    assert info.value.span == SPAN


def test_unknown_schedule():
    with pytest.raises(CollectiveError, match="unknown schedule 'nosuch'"):
        plan(_coll(schedule="nosuch"))
    assert hint_key(_coll(algorithm="ring", schedule="pipeline")) == "ring+pipeline"
    assert hint_key(_coll()) is None


def _broken_allgather(coll, **params):
    # forgets every remote copy: the outputs stay incomplete
    n = coll.n
    b = ScheduleBuilder(coll, input=[coll.count // n], output=[coll.count // n] * n)
    b.add(step=0, src=np.arange(n), dst=np.arange(n), src_buf=Buf.INPUT, src_off=0,
          dst_buf=Buf.OUTPUT, dst_off=np.arange(n))
    return b.build("broken")


@pytest.fixture
def broken(monkeypatch):
    get("ring")  # load the table first so the patch is not undone by a later import
    algo = Algorithm("broken", frozenset({CollectiveKind.ALLGATHER}), lambda c, **p: None,
                     _broken_allgather, every_rank_ops, NoBound("a test's broken entry"))
    monkeypatch.setitem(REGISTRY, "broken", algo)
    return algo


def test_auto_never_picks_a_schedule_that_fails_verification(broken):
    p = plan(_coll())
    row = {c.name: c for c in p.candidates}["broken"]
    assert not row.applicable and row.reason.startswith("failed verification")
    assert p.name != "broken"


def test_explicit_broken_algorithm_raises(broken):
    with pytest.raises(ScheduleError):
        plan(_coll(algorithm="broken"))


def test_build_errors_propagate(monkeypatch):
    get("ring")

    def explode(coll, **params):
        raise RuntimeError("bug")

    monkeypatch.setitem(REGISTRY, "explode", Algorithm(
        "explode", frozenset({CollectiveKind.ALLGATHER}), lambda c, **p: None, explode,
        every_rank_ops, NoBound("a test's exploding entry")))
    with pytest.raises(RuntimeError):
        plan(_coll())


def test_no_candidate_applies(monkeypatch):
    get("ring")
    only = {k: v for k, v in REGISTRY.items() if k == "tree"}
    monkeypatch.setattr("cclc.algorithms.REGISTRY", only)
    monkeypatch.setattr("cclc.plan.REGISTRY", only)
    with pytest.raises(CollectiveError, match="no algorithm can serve"):
        plan(_coll(CollectiveKind.ALLGATHER))


def test_bound_and_percent():
    p = plan(_coll())
    if p.bound is None:
        pytest.skip("cclc.bounds is not installed")
    assert 0 < p.bound <= p.time * (1 + 1e-9)
    for c in p.candidates:
        if c.applicable and c.pruned is None:     # a pruned candidate has no time
            assert c.pct_of_bound == pytest.approx(100 * p.bound / c.time)


def test_crossover_table():
    coll = _coll(CollectiveKind.BROADCAST, n=64, latency=1e-5)
    rows = crossover_table(coll, [64, 2 ** 28])
    assert [r.size for r in rows] == [64, 2 ** 28]
    assert rows[0].winner == "tree" and rows[1].winner == "ring"
    assert all(r.time > 0 for r in rows)
    nonuniform = make_collective("c", CollectiveKind.ALLTOALL, torus("t", (2,)), (0, 1),
                                 pair_sizes=np.full((2, 2), 4))
    with pytest.raises(CollectiveError, match="per-pair"):
        crossover_table(nonuniform, [8])


def test_plan_of_a_replaced_collective_keeps_the_hint_span():
    coll = dataclasses.replace(_coll(), algorithm=Hint("zzz", (), None))
    with pytest.raises(CollectiveError) as info:
        plan(coll)
    assert info.value.span is None  # no span: rendered without a place, never a crash
