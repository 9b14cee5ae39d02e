"""Per-ring AllToAll plans (cclc.algorithms.torus_alltoall.ring_plans): link loads against the
closed forms."""

from __future__ import annotations

import itertools

import pytest

from cclc.algorithms.torus_alltoall.ring_plans import (
    MINUS,
    PLUS,
    RING,
    detour_plan,
    folded_order,
    folded_plan,
    halfring_plan,
    line_plan,
    per_link_blocks,
    ring_plan,
)


def _delivers_everything(plan) -> None:
    n = plan.n
    finals = {(o, d) for o, d, f in zip(plan.origin.tolist(), plan.dest.tolist(),
                                        plan.final.tolist(), strict=True) if f}
    assert finals == {(a, b) for a in range(n) for b in range(n) if a != b}


def _journeys_are_connected(plan) -> None:
    # segment k of a journey starts where segment k-1 ended, one stage later
    by_journey: dict = {}
    for i in range(len(plan.src)):
        by_journey.setdefault((int(plan.origin[i]), int(plan.dest[i])), []).append(i)
    for (o, d), rows in by_journey.items():
        rows.sort(key=lambda i: int(plan.hop[i]))
        assert int(plan.src[rows[0]]) == o and int(plan.dst[rows[-1]]) == d
        for a, b in itertools.pairwise(rows):
            assert plan.dst[a] == plan.src[b] and plan.stage[b] > plan.stage[a]


@pytest.mark.parametrize("n", range(2, 10))
def test_ring_both_directions_moves_n_minus_1_quarter(n):
    # two lanes of S/2, one per direction: (N-1) S/4 per link direction
    for direction in (PLUS, MINUS):
        plan = ring_plan(n, direction)
        _delivers_everything(plan)
        _journeys_are_connected(plan)
        loads = per_link_blocks(plan)
        assert set(loads.values()) == {n * (n - 1) / 2}
        assert plan.n_stages == n - 1
        # per link direction, one lane of half the data: blocks * (S/n) / 2
        assert loads[(0, direction)] * 0.5 / n == pytest.approx((n - 1) / 4)


@pytest.mark.parametrize("n", range(3, 10))
def test_halfring_closed_form(n):
    plans = [halfring_plan(n, PLUS), halfring_plan(n, MINUS)]
    total: dict = {}
    for p in plans:
        _delivers_everything(p)
        _journeys_are_connected(p)
        for k, v in per_link_blocks(p).items():
            total[k] = total.get(k, 0.0) + v / 2        # two lanes of half the data
    # bytes per link direction in units of S: blocks / n
    want = (n * n - 1) / (8 * n) if n % 2 else n / 8
    assert len(total) == 2 * n
    for v in total.values():
        assert v / n == pytest.approx(want)
    assert plans[0].n_stages == (n - 1) // 2 + (n % 2 == 0)


@pytest.mark.parametrize("n", range(2, 10))
@pytest.mark.parametrize("cut", [0, 1, 4])
def test_foldedring_loads_every_surviving_link_evenly(n, cut):
    cut %= n
    plan = folded_plan(n, cut)
    _delivers_everything(plan)
    _journeys_are_connected(plan)
    loads = per_link_blocks(plan)
    failed = {(cut, PLUS), ((cut + 1) % n, MINUS)}
    assert not failed & set(loads)
    # every surviving directed link carries n(n-1)/2 blocks = (n-1) S/2
    expect = 2 * (n - 1) if n > 2 else 2
    assert len(loads) == expect
    assert set(loads.values()) == {n * (n - 1) / 2}


def test_folded_order_is_the_classic_embedding():
    assert folded_order(5) == [0, 2, 4, 3, 1]
    assert folded_order(6) == [0, 2, 4, 5, 3, 1]
    assert folded_order(2) == [0, 1]


@pytest.mark.parametrize("n", range(2, 10))
@pytest.mark.parametrize("cut", [None, 0, 3])
def test_line_uses_shortest_paths_and_one_block_per_link_per_stage(n, cut):
    if cut is not None:
        cut %= n
    plan = line_plan(n, cut)
    _delivers_everything(plan)
    _journeys_are_connected(plan)
    loads = per_link_blocks(plan)
    if cut is not None:
        assert (cut, PLUS) not in loads and ((cut + 1) % n, MINUS) not in loads
    # the middle of the line carries floor(n/2) ceil(n/2) blocks per direction
    assert max(loads.values()) == (n // 2) * ((n + 1) // 2)
    per_stage: dict = {}
    for s, src, pid in zip(plan.stage.tolist(), plan.src.tolist(), plan.path.tolist(),
                           strict=True):
        key = (s, src, plan.paths[pid])
        per_stage[key] = per_stage.get(key, 0) + 1
    assert max(per_stage.values()) == 1


def test_detour_plan_leaves_and_rejoins_the_ring():
    plan = detour_plan(5, axis=1, sign=PLUS)
    _delivers_everything(plan)
    for path in plan.paths:
        assert path[0] == (1, PLUS) and path[-1] == (1, MINUS)
        assert all(axis == RING for axis, _ in path[1:-1])
