"""The symmetric form (cclc/symmetric.py, cclc/symmetric_check.py) against the expanded schedule
run through the ordinary verifier and simulator (the reference): same verdict, same lockstep
time, same bytes on every link, on tori of 1-3 dimensions of sides 2..5."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cclc.algorithms import get
from cclc.algorithms.torus_symmetric import (
    form_size,
    symmetric_allgather,
    symmetric_allreduce,
    symmetric_alltoall,
    symmetric_reason,
    symmetric_reducescatter,
)
from cclc.bounds import bounds
from cclc.collective import CollectiveKind, make_collective
from cclc.errors import CollectiveError, ScheduleError
from cclc.ir import Ops
from cclc.sim import simulate
from cclc.symmetric import TranslationGroup, expand, symmetric_form
from cclc.symmetric_check import link_loads, simulate_lockstep, verify_symmetric
from cclc.topology import torus, with_faults
from cclc.verify import verify

shapes = st.lists(st.integers(2, 5), min_size=1, max_size=3).filter(
    lambda d: int(np.prod(d)) <= 64)


def _alltoall(dims, per_pair=4, bandwidth=25e9, latency=1e-6):
    topo = torus("t", tuple(dims), bandwidth=bandwidth, latency=latency)
    n = topo.n_ranks
    return make_collective("a2a", CollectiveKind.ALLTOALL, topo, tuple(range(n)),
                           size=4 * n * per_pair)


def _verdict(fn, s) -> bool:
    try:
        fn(s)
    except ScheduleError:
        return False
    return True


def _expanded_verdict(sym) -> bool:
    """The ordinary verifier's verdict on the expansion (an op that crosses a block has no
    expansion: the form refuses it)."""
    try:
        full = expand(sym)
    except ScheduleError:
        return False
    return _verdict(verify, full)


def _same_as_expanded(sym) -> None:
    full = expand(sym)
    assert len(full.ops) == sym.expanded_ops()
    verify_symmetric(sym)
    verify(full)
    ref = simulate(full)
    got = simulate_lockstep(sym)
    assert got.time == pytest.approx(ref.time, rel=1e-12)
    assert np.allclose(got.step_time, ref.step_time, rtol=1e-12, atol=0)
    assert np.allclose(got.link_bytes, ref.link_bytes, rtol=1e-12, atol=0)
    assert np.allclose(link_loads(sym), ref.link_bytes, rtol=1e-12, atol=0)
    # whole bytes: exact in float64 in any order, so the busiest link ties break alike
    assert got.step_bytes.tolist() == ref.step_bytes.tolist()
    assert got.step_busiest_link == ref.step_busiest_link
    # a cost per step, on every step or on the steps between ranks alone (AllReduce's last
    # step only copies locally)
    for rule in ("every", "peer"):
        ref = simulate(full, step_overhead=1e-6, overhead_steps=rule)
        got = simulate_lockstep(sym, step_overhead=1e-6, overhead_steps=rule)
        assert got.time == pytest.approx(ref.time, rel=1e-12)


def _check_alltoall(dims, per_pair, latency) -> None:
    coll = _alltoall(dims, per_pair, latency=latency)
    sym = symmetric_alltoall(coll)
    _same_as_expanded(sym)
    assert simulate_lockstep(sym).time >= bounds(coll, lp=False).best * (1 - 1e-12)
    # compressing the expansion gives the representatives back (the ops rank 0 sends)
    again = symmetric_form(expand(sym))
    assert again.expanded_ops() == sym.expanded_ops()


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shapes, st.integers(6, 13), st.sampled_from([0.0, 1e-6]))
def test_symmetric_alltoall_matches_its_expansion(dims, per_pair, latency):
    _check_alltoall(dims, per_pair, latency)


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shapes, st.integers(6, 13), st.sampled_from([0.0, 1e-6]))
def test_symmetric_alltoall_matches_its_expansion_many(dims, per_pair, latency):
    _check_alltoall(dims, per_pair, latency)


def _allreduce(dims, per_rank=4, latency=1e-6):
    topo = torus("t", tuple(dims), bandwidth=25e9, latency=latency)
    n = topo.n_ranks
    return make_collective("ar", CollectiveKind.ALLREDUCE, topo, tuple(range(n)),
                           size=4 * n * per_rank)


def _check_allreduce(dims, per_rank, latency) -> None:
    coll = _allreduce(dims, per_rank, latency)
    sym = symmetric_allreduce(coll)
    _same_as_expanded(sym)
    assert simulate_lockstep(sym).time >= bounds(coll, lp=False).best * (1 - 1e-12)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shapes, st.integers(6, 13), st.sampled_from([0.0, 1e-6]))
def test_symmetric_allreduce_matches_its_expansion(dims, per_rank, latency):
    _check_allreduce(dims, per_rank, latency)


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shapes, st.integers(6, 13), st.sampled_from([0.0, 1e-6]))
def test_symmetric_allreduce_matches_its_expansion_many(dims, per_rank, latency):
    _check_allreduce(dims, per_rank, latency)


def _half(kind, dims, per_rank, latency):
    topo = torus("t", tuple(dims), bandwidth=25e9, latency=latency)
    n = topo.n_ranks
    return make_collective("c", kind, topo, tuple(range(n)), size=4 * n * per_rank)


_HALVES = {CollectiveKind.ALLGATHER: symmetric_allgather,
           CollectiveKind.REDUCESCATTER: symmetric_reducescatter}


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shapes, st.integers(6, 13), st.sampled_from([0.0, 1e-6]),
       st.sampled_from(sorted(_HALVES, key=lambda k: k.value)))
def test_symmetric_allgather_and_reducescatter_match_their_expansion(dims, per_rank, latency,
                                                                     kind):
    coll = _half(kind, dims, per_rank, latency)
    sym = _HALVES[kind](coll)
    _same_as_expanded(sym)
    assert simulate_lockstep(sym).time >= bounds(coll, lp=False).best * (1 - 1e-12)


@pytest.mark.parametrize("kind", sorted(_HALVES, key=lambda k: k.value))
@pytest.mark.parametrize("dims", [(4,), (4, 4), (2, 2, 2), (3, 3, 3)])
def test_symmetric_allgather_and_reducescatter_meet_the_bandwidth_bound(dims, kind):
    # latency 0: half the AllReduce's bandwidth term, (n-1)/n S over the links out of a rank
    coll = _half(kind, dims, 12 * len(dims), latency=0.0)
    time = simulate_lockstep(_HALVES[kind](coll)).time
    n, links = coll.n, sum(1 if m == 2 else 2 for m in dims)
    assert time == pytest.approx((n - 1) / n * coll.size / (links * 25e9), rel=1e-9)


@pytest.mark.parametrize("dims", [(4,), (3, 3), (2, 2, 2)])
def test_a_step_of_local_copies_pays_no_peer_step_cost(dims):
    # the symmetric AllReduce ends with a step of local copies alone: under a cost charged on
    # the steps between ranks only it pays one step's cost less than under one on every step
    sym = symmetric_allreduce(_allreduce(dims, per_rank=12))
    o = sym.ops
    local_steps = set(range(o.n_steps)) - set(o.step[o.src != o.dst].tolist())
    assert len(local_steps) == 1
    every = simulate_lockstep(sym, step_overhead=1e-6).time
    peer = simulate_lockstep(sym, step_overhead=1e-6, overhead_steps="peer").time
    assert every - peer == pytest.approx(1e-6, rel=1e-9)
    assert peer == pytest.approx(simulate_lockstep(sym).time + (o.n_steps - 1) * 1e-6,
                                 rel=1e-12)


@pytest.mark.parametrize("dims", [(4, 4), (4, 4, 4), (6, 6, 6)])
def test_symmetric_allreduce_keeps_every_link_alike_busy_in_every_step(dims):
    # on alike even sides every link carries the same bytes in every step (docs/limits.md
    # counts on it: a failed cable's ops moved onto detours overload its ends in every step)
    coll = _allreduce(dims, 12 * len(dims))
    e = expand(symmetric_allreduce(coll))
    o = e.ops
    remote = o.src != o.dst
    assert (e.routes.lengths()[o.route[remote]] == 1).all()
    link = e.routes.links[e.routes.offsets[:-1][o.route[remote]]]
    table = np.zeros((o.n_steps, coll.topology.n_links))
    np.add.at(table, (o.step[remote], link), o.count[remote])
    busy = table[table.any(axis=1)]
    assert len(busy) == o.n_steps - 1                  # all but the step of local copies
    assert (busy == busy[:, :1]).all()


@pytest.mark.parametrize("dims", [(4,), (4, 4), (2, 2, 2), (3, 3, 3)])
def test_symmetric_allreduce_meets_the_bandwidth_bound_on_alike_sides(dims):
    # latency 0: the bandwidth term alone, 2 (n-1)/n S over the links out of a rank (two per
    # dimension, one where a side of 2 joins the same two ranks both ways round)
    coll = _allreduce(dims, 12 * len(dims), latency=0.0)
    time = simulate_lockstep(symmetric_allreduce(coll)).time
    n, links = coll.n, sum(1 if m == 2 else 2 for m in dims)
    assert time == pytest.approx(2 * (n - 1) / n * coll.size / (links * 25e9), rel=1e-9)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shapes, st.sampled_from(["alltoall", "allreduce", "allgather", "reducescatter"]),
       st.data())
def test_a_mutated_representative_gets_the_same_verdict(dims, kind, data):
    # 12 elements per block: every one of the (at most 6) units holds data, so an op dropped
    # loses some
    sym = {"alltoall": lambda: symmetric_alltoall(_alltoall(dims, 12)),
           "allreduce": lambda: symmetric_allreduce(_allreduce(dims, 12)),
           "allgather": lambda: symmetric_allgather(
               _half(CollectiveKind.ALLGATHER, dims, 12, 1e-6)),
           "reducescatter": lambda: symmetric_reducescatter(
               _half(CollectiveKind.REDUCESCATTER, dims, 12, 1e-6))}[kind]()
    ops = sym.ops
    i = data.draw(st.integers(0, len(ops) - 1), label="op")
    field = data.draw(st.sampled_from(["drop", "step", "dst", "src_off", "dst_off",
                                       "dst_buf", "kind"]), label="field")
    cols = ops.columns()
    if field == "drop":
        keep = np.arange(len(ops)) != i
        cols = {k: v[keep] for k, v in cols.items()}
    else:
        col = cols[field].astype(np.int64).copy()
        limit = {"step": int(ops.step.max()) + 2, "dst": sym.n, "dst_buf": 3, "kind": 2}.get(
            field, max(len(lay) for lay in sym.layouts))
        col[i] = data.draw(st.integers(0, limit - 1).filter(lambda v: v != col[i]),
                           label="value")
        cols[field] = col
    bad = sym.replace(ops=Ops(**cols))
    assert _verdict(verify_symmetric, bad) == _expanded_verdict(bad)
    if field == "drop":
        assert not _verdict(verify_symmetric, bad)


@pytest.mark.parametrize("dims", [(3,), (2, 3), (3, 5), (4, 4), (2, 3, 2)])
@pytest.mark.parametrize("kind, name", [(CollectiveKind.ALLGATHER, "ring+dimrotation"),
                                        (CollectiveKind.ALLGATHER, "direct"),
                                        (CollectiveKind.ALLTOALL, "direct")])
def test_builders_that_are_symmetric_compress_and_check_alike(dims, kind, name):
    topo = torus("t", dims, latency=1e-6)
    n = topo.n_ranks
    coll = make_collective("c", kind, topo, tuple(range(n)), size=4 * n * 6)
    entry = get(name)
    if entry.applicable(coll) is not None:
        pytest.skip(entry.applicable(coll))
    schedule = entry.build(coll)
    try:
        sym = symmetric_form(schedule)
    except ScheduleError:
        # direct's ties on an even ring pick a side by rank: not a translate of rank 0's
        assert name == "direct" and any(d % 2 == 0 for d in dims)
        return
    _same_as_expanded(sym)
    assert simulate_lockstep(sym).time == pytest.approx(simulate(schedule).time, rel=1e-12)


def test_a_schedule_that_is_not_symmetric_is_refused():
    coll = _alltoall((4, 4))
    schedule = get("halfring+dimrotation").build(coll)
    with pytest.raises(ScheduleError, match="not the same from every rank"):
        symmetric_form(schedule)


def test_a_failed_link_breaks_the_translations():
    topo = with_faults(torus("t", (4, 4)), links=[(0, 1)])
    coll = make_collective("a", CollectiveKind.ALLTOALL, topo, tuple(range(16)), size=4 * 16)
    with pytest.raises(ScheduleError, match="failed link breaks the translations"):
        TranslationGroup.of(coll)
    sym = symmetric_alltoall(_alltoall((4, 4), 4))
    with pytest.raises(ScheduleError, match="failed link"):
        verify_symmetric(sym.replace(collective=coll))


def test_blocks_too_small_for_the_units_are_refused_with_the_reason():
    coll = _alltoall((3, 3), per_pair=3)            # 3 elements per block, 4 units
    assert "too small to cut into 4 units" in (symmetric_reason(coll) or "")
    with pytest.raises(CollectiveError, match="too small"):
        symmetric_alltoall(coll)
    assert symmetric_reason(_allreduce((3, 3), per_rank=4)) is None


def test_group_actions_are_translations():
    g = TranslationGroup((3, 4))
    ranks = np.arange(12)
    for t in range(12):
        image = g.act(ranks, t)
        assert sorted(image.tolist()) == ranks.tolist()            # a permutation
        assert image[0] == t
        assert (g.act(image, g.inverse(t)) == ranks).all()
    a, b = 5, 7
    assert (g.act(g.act(ranks, a), b) == g.act(ranks, g.act(np.array(a), b))).all()


def test_a_mesh_or_a_partial_group_has_no_translations():
    mesh = torus("m", (3, 3), wrap=(False, False))
    coll = make_collective("a", CollectiveKind.ALLTOALL, mesh, tuple(range(9)), size=4 * 9)
    with pytest.raises(ScheduleError, match="mesh"):
        TranslationGroup.of(coll)
    part = make_collective("a", CollectiveKind.ALLTOALL, torus("t", (3, 3)), (0, 1, 2),
                           size=4 * 3)
    with pytest.raises(ScheduleError, match="every rank"):
        TranslationGroup.of(part)


_BUILDERS = {CollectiveKind.ALLTOALL: symmetric_alltoall,
             CollectiveKind.ALLREDUCE: symmetric_allreduce, **_HALVES}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(1, 7), min_size=1, max_size=3).filter(
    lambda d: 1 < int(np.prod(d)) <= 150), st.sampled_from(sorted(_BUILDERS, key=str)))
def test_the_size_check_counts_what_the_builders_make(dims, kind):
    # cclc.symmetric_plan.form_estimate refuses from these counts: they must be the builders'
    topo = torus("t", tuple(dims))
    n = topo.n_ranks
    coll = make_collective("c", kind, topo, tuple(range(n)), size=4 * n * n * 6)
    sym = _BUILDERS[kind](coll)
    size = form_size(coll)
    assert (size.ops, size.steps, size.slots) == (len(sym.ops), sym.ops.n_steps,
                                                  sum(len(lay) for lay in sym.layouts))


@pytest.mark.parametrize("kind", [CollectiveKind.ALLREDUCE, *_HALVES])
@pytest.mark.parametrize("dims", [(4, 8), (4, 4, 8), (4, 12), (3, 6), (6, 12)])
def test_a_shorter_ring_runs_in_waves_so_that_no_step_waits_on_it(dims, kind):
    # unequal sides: a phase on a ring of 4 fits twice into a ring of 8's; run at once it put
    # twice the longer ring's bytes a step on its links (66.7% of the bound on 8x8x16), in
    # waves it carries no more a step than the longest ring's links do (a side of 2, whose
    # two ranks one link joins each way, carries both chains on it: twice, in every wave)
    topo = torus("t", dims, bandwidth=25e9, latency=0.0)
    n = topo.n_ranks
    coll = make_collective("c", kind, topo, tuple(range(n)), size=4 * n * 48)
    e = expand(_BUILDERS[kind](coll))
    o = e.ops
    remote = o.src != o.dst
    link = e.routes.links[e.routes.offsets[:-1][o.route[remote]]]
    table = np.zeros((o.n_steps, topo.n_links))
    np.add.at(table, (o.step[remote], link), o.count[remote])
    ends = np.array([np.unravel_index(topo.link_src, dims), np.unravel_index(topo.link_dst, dims)])
    dim_of = np.argmax(ends[0] != ends[1], axis=0)
    longest = np.isin(dim_of, [d for d, m in enumerate(dims) if m == max(dims)])
    assert (table[:, ~longest].max(axis=1) <= table[:, longest].max(axis=1)).all()
