"""The allreduce LP bound: the joint reduce-scatter + allgather LP (the phases share each
directed link, owners' shares free) against an independent formulation, between
max(RS LP, AG LP) and RS LP + AG LP, and below every verified allreduce schedule."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from scipy.optimize import linprog

import dsl
from cclc.algorithms import algorithms_for, get
from cclc.bounds import (
    _allreduce_lp,
    _solve_lp,
    _symmetry,
    _with_kind,
    bounds,
    lp_bound,
)
from cclc.bounds_closed_form import Facts
from cclc.collective import CollectiveKind as K
from cclc.collective import Hint, make_collective
from cclc.errors import CclError, CollectiveError
from cclc.flow_lp import Symmetry
from cclc.sim import simulate
from cclc.topology import torus, with_faults
from cclc.verify import verify

B = 10e9


def reference_allreduce_lp(topo, group, size: float, uniform: bool = False) -> float:
    """The joint LP written out plainly, no symmetry: for every rank i an RS flow x_i from i
    (a_o to every other member o) and an AG flow y_i into i (a_o from every other member o);
    x_i(e) <= u(e), y_i(e) <= w(e), u(e) + w(e) <= bw(e) T; shares a_o >= 0 summing to size
    (each size / n when ``uniform``). Minimize T (seconds)."""
    ok = ~topo.link_failed
    links = [(int(s), int(d), float(b)) for s, d, b, k in zip(
        topo.link_src, topo.link_dst, topo.link_bandwidth, ok, strict=True) if k]
    E, V, n = len(links), topo.n_vertices, len(group)
    col: dict[tuple, int] = {}
    for ph in ("x", "y"):
        for i in range(n):
            for e in range(E):
                col[ph, i, e] = len(col)
    for e in range(E):
        col["u", e] = len(col)
        col["w", e] = len(col)
    for o in range(n):
        col["a", o] = len(col)
    col["T"] = len(col)
    N = len(col)
    A_eq, b_eq, A_ub, b_ub = [], [], [], []
    for ph in ("x", "y"):
        for i in range(n):
            for v in range(V):
                A_eq.append(_conservation(col, links, group, ph, i, v))
                b_eq.append(0.0)
            for e in range(E):
                row = np.zeros(N)
                row[col[ph, i, e]] = 1.0
                row[col["u" if ph == "x" else "w", e]] = -1.0
                A_ub.append(row)
                b_ub.append(0.0)
    for e, (_, _, bw) in enumerate(links):
        row = np.zeros(N)
        row[col["u", e]] = row[col["w", e]] = 1.0
        row[col["T"]] = -bw / B                     # T in units of (1 byte) / B
        A_ub.append(row)
        b_ub.append(0.0)
    bnds = [(0, None)] * N
    row = np.zeros(N)
    for o in range(n):
        row[col["a", o]] = 1.0
        if uniform:
            bnds[col["a", o]] = (size / n, size / n)
    A_eq.append(row)
    b_eq.append(size)
    cost = np.zeros(N)
    cost[col["T"]] = 1.0
    res = linprog(cost, A_ub=np.array(A_ub), b_ub=b_ub, A_eq=np.array(A_eq), b_eq=b_eq,
                  bounds=bnds, method="highs")
    assert res.status == 0, res.message
    return float(res.fun) / B


def _conservation(col, links, group, ph, i, v):
    """Family ``(ph, i)`` at vertex ``v``: out - in - net supply = 0, the net supply being
    (RS family i) sum_{o != i} a_o at i and -a_o at o; the AG family's is negated."""
    row = np.zeros(len(col))
    for e, (s, d, _) in enumerate(links):
        row[col[ph, i, e]] += (s == v) - (d == v)
    sign = 1.0 if ph == "x" else -1.0
    for o in range(len(group)):
        if o == i:
            continue
        if group[i] == v:
            row[col["a", o]] -= sign
        if group[o] == v:
            row[col["a", o]] += sign
    return row


@st.composite
def small_faulty_tori(draw):
    dims = draw(st.sampled_from([(3,), (4,), (5,), (6,), (2, 2), (3, 2), (2, 3), (3, 3)]))
    wrap = draw(st.sampled_from([None, tuple(i != 0 for i in range(len(dims)))]))
    het = draw(st.booleans())
    t = torus("t", dims, wrap=wrap,
              bandwidth=[B * (1 + i) for i in range(len(dims))] if het else B)
    picks = draw(st.lists(st.integers(0, t.n_links - 1), max_size=3, unique=True))
    both = draw(st.booleans())
    pairs = set()
    for i in picks:
        u, v = int(t.link_src[i]), int(t.link_dst[i])
        pairs.add((u, v))
        if both:
            pairs.add((v, u))
    ranks = draw(st.lists(st.integers(0, t.n_ranks - 1), max_size=1))
    return with_faults(t, links=sorted(pairs), ranks=ranks)


def facts(topo, size_per_rank: int = 1000):
    group = topo.live_ranks()
    try:
        c = make_collective("ar", K.ALLREDUCE, topo, group, size=len(group) * size_per_rank)
    except CollectiveError:
        return None
    if len(group) < 2 or not topo.is_connected(group):
        return None
    return Facts(c)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_faulty_tori())
def test_joint_lp_matches_an_independent_formulation(topo):
    f = facts(topo)
    assume(f is not None)
    try:
        got = _allreduce_lp(f, _symmetry(f))
    except CclError:
        assume(False)                       # a member with no healthy link
    want = reference_allreduce_lp(topo, topo.live_ranks(), f.S)
    assert got == pytest.approx(want, rel=1e-6)
    # the symmetry reduction is exact
    full = _allreduce_lp(f, Symmetry.trivial(topo.n_vertices, f.src, f.dst))
    assert got == pytest.approx(full, rel=1e-6)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_faulty_tori())
def test_joint_lp_lies_between_the_max_and_the_sum_of_the_phases(topo):
    f = facts(topo)
    assume(f is not None)
    sym = _symmetry(f)
    try:
        rs = _solve_lp(_with_kind(f, K.REDUCESCATTER), sym)
        ag = _solve_lp(_with_kind(f, K.ALLGATHER), sym)
        joint = _allreduce_lp(f, sym)
    except CclError:
        assume(False)
    assert max(rs, ag) * (1 - 1e-6) <= joint <= (rs + ag) * (1 + 1e-6)
    # free owners' shares relax the uniform ones (a schedule picks where each element's
    # reduction completes)
    uniform = _allreduce_lp(f, sym, free_owners=False)
    assert joint <= uniform * (1 + 1e-6)
    assert uniform <= (rs + ag) * (1 + 1e-6)


def test_a_ring_with_two_failed_links_gains_from_uneven_owners():
    """On this ring free owners' shares give a smaller LP than S/n each: a schedule that
    completes more elements at some ranks is not bound by the uniform-share LP."""
    t = with_faults(torus("r", (6,), bandwidth=B), links=[(0, 1), (2, 3)])
    f = facts(t)
    sym = _symmetry(f)
    free, uniform = _allreduce_lp(f, sym), _allreduce_lp(f, sym, free_owners=False)
    assert free < uniform * (1 - 1e-3)
    assert free == pytest.approx(reference_allreduce_lp(t, t.live_ranks(), f.S), rel=1e-6)
    assert uniform == pytest.approx(reference_allreduce_lp(t, t.live_ranks(), f.S, True),
                                    rel=1e-6)


def _failed_rank_torus():
    here = __file__.rsplit("/tests/", 1)[0]
    program = dsl.load(f"{here}/examples/torus4x4_failed_rank.ccl")
    return next(iter(program.topologies.values()))


def _faulty(dims, cuts, rank=None):
    t = torus("t", dims, bandwidth=32e9, latency=1e-7)
    pairs = []
    for coords, dim in cuts:
        a = t.rank_at(coords)
        nxt = list(coords)
        nxt[dim] = (nxt[dim] + 1) % dims[dim]
        b = t.rank_at(nxt)
        pairs += [(a, b), (b, a)]
    return with_faults(t, links=pairs, ranks=() if rank is None else (rank,))


MACHINES = {
    "4x4 failed rank": _failed_rank_torus,
    "4x4 two faults": lambda: _faulty((4, 4), [((0, 0), 0), ((2, 1), 1)]),
    "3x3 failed rank": lambda: _faulty((3, 3), [], rank=4),
    "5x5 two in one ring": lambda: _faulty((5, 5), [((0, 0), 0), ((3, 0), 0)]),
    "3x3x3 one fault": lambda: _faulty((3, 3, 3), [((0, 0, 0), 0)]),
}


def test_the_failed_rank_torus_bound_is_the_joint_lp():
    topo = _failed_rank_torus()
    f = facts(topo, 4 * 1024)
    sym = _symmetry(f)
    rs = _solve_lp(_with_kind(f, K.REDUCESCATTER), sym)
    ag = _solve_lp(_with_kind(f, K.ALLGATHER), sym)
    lp = lp_bound(f.coll).seconds
    assert lp == pytest.approx(_allreduce_lp(f, sym), rel=1e-12)
    assert max(rs, ag) < lp < rs + ag
    assert "joint" in lp_bound(f.coll).description


@pytest.mark.slow
@pytest.mark.parametrize("machine", list(MACHINES))
@pytest.mark.parametrize("per_rank", [4, 1024, 64 * 1024])
def test_no_verified_allreduce_beats_the_bound(machine, per_rank):
    topo = MACHINES[machine]()
    group = topo.live_ranks()
    n = len(group)
    coll = make_collective("ar", K.ALLREDUCE, topo, group, size=4 * n * per_rank)
    best = bounds(coll).best
    timed = 0
    for algo in algorithms_for(coll):
        c = replace(coll, algorithm=Hint(algo.name))
        params = {"race": 0} if algo.name == "synth" else {}
        if algo.applicable(c, **params) is not None:
            continue
        try:
            s = algo.build(c, **params)
        except CclError:
            continue
        verify(s)
        t = float(simulate(s).time)
        assert t >= best * (1 - 1e-9), (algo.name, t, best)
        timed += 1
    assert timed >= 1
    s = get("synth").build(replace(coll, algorithm=Hint("synth")), race=0)
    verify(s)
    assert float(simulate(s).time) >= best * (1 - 1e-9)
    # synth's lp_fraction measures AllReduce against the same valid bound
    assert 0 < dict(s.params)["lp_fraction"] <= 1 + 1e-9
