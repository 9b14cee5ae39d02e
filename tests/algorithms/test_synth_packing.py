"""AllToAll synthesis after the path LP: the basic optimum of :mod:`cclc.synth.vertex` (checked
against the node-arc LP of cclc.bounds and by recomputing every link's load with numpy), the
pieces budget, and packing for the execution model the schedule is priced with."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from cclc.bounds import lp_bound
from cclc.collective import CollectiveKind, Hint, make_collective
from cclc.execution import IR_MODEL, MODELS, MSCCL_MODEL, predict
from cclc.numeric import check_numeric
from cclc.plan import plan
from cclc.sim import simulate
from cclc.synth.alltoall import (
    MAX_PATHS,
    MAX_PIECES,
    MIN_WEIGHT,
    default_split,
    synthesize_alltoall,
    write_schedule,
)
from cclc.synth.flow_solution import pair_bytes, usable_links
from cclc.synth.flows import solve_flows
from cclc.synth.pack import pieces_of
from cclc.synth.pricing import step_cost
from cclc.synth.vertex import basic_paths
from cclc.topology import torus, with_faults
from cclc.verify import verify

A2A = CollectiveKind.ALLTOALL


def _faulty(dims, links=(), ranks=(), wrap=None):
    t = torus("t", dims, wrap=wrap, bandwidth=32e9, latency=1e-7, routing="none")
    pairs = list(links) + [(b, a) for a, b in links]
    return with_faults(t, links=pairs, ranks=ranks)


def _a2a(topo, size_per_pair=1 << 14, algorithm="auto", **params):
    group = topo.live_ranks()
    n = len(group)
    return make_collective("a", A2A, topo, tuple(group), size=n * size_per_pair,
                           algorithm=Hint(algorithm, tuple(params.items())))


CASES = {
    "5x5 two faults in one ring": _faulty((5, 5), [(10, 15), (11, 16)]),
    "3x3x3 one fault": _faulty((3, 3, 3), [(0, 9)]),
    "4x4 failed rank": _faulty((4, 4), ranks=[5]),
    "3x4 mesh": _faulty((3, 4), wrap=(False, False)),
    # hypothesis's find: PDLP routes small shares of many pairs over long detours, and
    # dropping them as stray long paths left the kept paths' busiest link 16% above the LP
    "3x3 two faults, long detours": _faulty((3, 3), [(3, 5), (0, 6)]),
}


def _link_seconds(coll, src, dst, weight, paths) -> np.ndarray:
    """Every link's busy time when pair (s, d) sends ``weight`` of its bytes on each path."""
    topo = coll.topology
    d = pair_bytes(coll)
    busy = np.zeros(topo.n_links)
    for s, j, w, p in zip(src.tolist(), dst.tolist(), weight.tolist(), paths, strict=True):
        busy[list(p)] += w * d[s, j] / topo.link_bandwidth[list(p)]
    return busy


def _check_basic(coll):
    flows = solve_flows(coll)
    basic = basic_paths(coll, flows)
    # the same LP time, recomputed from the paths, and the node-arc LP's optimum
    busy = _link_seconds(coll, basic.src, basic.dst, basic.weight, basic.path)
    assert busy.max() == pytest.approx(flows.lp_time, rel=2e-3)
    assert busy.max() >= lp_bound(coll).seconds * (1 - 1e-6)
    # shares of every pair add up to one, on paths the LP had, over usable links
    tot = np.zeros((coll.n, coll.n))
    np.add.at(tot, (basic.src, basic.dst), basic.weight)
    assert np.allclose(tot[~np.eye(coll.n, dtype=bool)], 1.0)
    assert set(basic.path) <= set(flows.path)
    assert usable_links(coll)[[e for p in basic.path for e in p]].all()
    # a vertex: at most one path per pair beyond the first for each link row
    n_pairs = coll.n * (coll.n - 1)
    assert len(basic.path) <= n_pairs + coll.topology.n_links
    assert len(basic.path) <= len(flows.path)
    return flows, basic


@pytest.mark.parametrize("name", list(CASES))
def test_basic_paths_keep_the_lp_time_with_fewer_paths(name):
    _check_basic(_a2a(CASES[name]))


def test_rounding_the_basic_paths_loses_little():
    # 4x4 torus with a failed rank: after rounding the shares to whole units, the busiest link
    # stays within 1% of the LP (PDLP's interior optimum, truncated to 4 paths, did not)
    coll = _a2a(CASES["4x4 failed rank"], size_per_pair=1 << 20)
    _, basic = _check_basic(coll)
    pieces, _ = pieces_of(coll, basic.src, basic.dst, basic.weight, basic.path, MAX_PATHS,
                          MIN_WEIGHT)
    item = coll.dtype.itemsize
    busy = np.zeros(coll.topology.n_links)
    for p in pieces:
        for hop in p.hops:
            busy[list(hop)] += p.elems * item / coll.topology.link_bandwidth[list(hop)]
    assert busy.max() <= 1.01 * basic.lp_time


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dims=st.sampled_from([(3, 3), (4, 3), (2, 2, 3), (5,), (4, 4)]),
       seed=st.integers(0, 2**16), n_faults=st.integers(0, 2))
# hypothesis's find, not fixed yet: on this 4x4 torus with one failed link, HiGHS finds no
# reweighting of PDLP's paths within 0.1% of the LP's time, so basic_paths keeps PDLP's
# weights, whose busiest link is 1% above it; adding paths priced by the LP's duals (column
# generation) would close it
@example(dims=(4, 4), seed=9596, n_faults=1).xfail(
    reason="PDLP's path set misses the LP optimum by 1% on this fault", raises=AssertionError)
def test_basic_paths_property_random_faulty_tori(dims, seed, n_faults):
    topo = torus("t", dims, bandwidth=32e9, latency=1e-7, routing="none")
    rng = np.random.default_rng(seed)
    cands = [(int(topo.link_src[e]), int(topo.link_dst[e])) for e in range(topo.n_links)
             if topo.link_src[e] < topo.link_dst[e]]
    picked = [cands[i] for i in rng.choice(len(cands), size=n_faults, replace=False)]
    faulty = with_faults(topo, links=picked + [(b, a) for a, b in picked])
    if not faulty.is_connected(faulty.live_ranks()):
        return                    # two faults in a ring of 5 can cut it: no collective there
    _check_basic(_a2a(faulty, size_per_pair=1 << 12))


def test_default_split_stays_within_the_pieces_budget():
    assert default_split(1) == 8
    assert default_split(MAX_PIECES // 8) == 8
    assert default_split(MAX_PIECES // 8 + 1) == 4
    assert default_split(MAX_PIECES) == 1
    assert default_split(10 * MAX_PIECES) == 1


def test_the_planner_hands_synthesis_its_model(monkeypatch):
    # the model travels as a parameter (cclc.algorithms.BuildContext), not through state
    import cclc.synth.alltoall as alltoall

    seen = []
    real = alltoall.synthesize_alltoall

    def spy(*args, model=None, **kw):
        seen.append(model)
        return real(*args, model=model, **kw)
    monkeypatch.setattr(alltoall, "synthesize_alltoall", spy)
    msccl = MSCCL_MODEL
    plan(_a2a(CASES["4x4 failed rank"], algorithm="synth"), model=msccl)
    assert seen == [msccl]
    plan(_a2a(CASES["4x4 failed rank"], algorithm="synth"))
    assert seen == [msccl, IR_MODEL]
    assert step_cost(msccl) == pytest.approx(3.4e-6)
    assert step_cost(IR_MODEL) == 0.0


@pytest.mark.slow
@pytest.mark.parametrize("model_name", ["msccl", "nccl"])
@pytest.mark.parametrize("name", ["5x5 two faults in one ring", "4x4 failed rank"])
def test_packing_for_the_model_is_never_slower_under_it(name, model_name):
    # 1 MiB per rank, where a step's software cost is a visible share of the time
    topo = CASES[name]
    coll = _a2a(topo, size_per_pair=(1 << 20) // len(topo.live_ranks()) // 4 * 4)
    model = MODELS[model_name]
    flows = solve_flows(coll)
    lockstep = write_schedule(coll, synthesize_alltoall(coll, flows, model=IR_MODEL), ())
    tuned = write_schedule(coll, synthesize_alltoall(coll, flows, model=model), ())
    verify(tuned)
    check_numeric(tuned)
    assert predict(tuned, model).time <= predict(lockstep, model).time * (1 + 1e-12)
    # the lockstep packing is exactly what the IR model prices, and never under the LP
    assert simulate(lockstep).time >= flows.lp_time * (1 - 1e-9)


@pytest.mark.slow
def test_plan_builds_synth_for_its_model():
    coll = _a2a(CASES["4x4 failed rank"], algorithm="synth")
    msccl = MSCCL_MODEL
    p = plan(coll, model=msccl)
    assert p.time == pytest.approx(predict(p.schedule, msccl).time)
    # the synthesized schedule (or the template it fell back to) beats every template there
    auto = plan(_a2a(CASES["4x4 failed rank"]), explain=True, model=msccl)
    others = [c.time for c in auto.candidates if c.name != "synth" and c.time is not None]
    assert p.time <= min(others) * (1 + 1e-9)
