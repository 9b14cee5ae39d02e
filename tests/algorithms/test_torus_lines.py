"""ring+dimrotation on tori whose rings a failed (or a mesh's missing) link cuts: each cut ring
runs as a line (:func:`cclc.algorithms.torus_collectives.line_cuts`), every op one healthy
hop, the numbers numpy's, the size the stated estimate, and the time a count by hand."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cclc.algorithms import get
from cclc.algorithms.torus_collectives import line_cuts
from cclc.budget import estimate_ops
from cclc.collective import CollectiveKind as K
from cclc.collective import make_collective
from cclc.numeric import check_numeric
from cclc.sim import simulate
from cclc.topology import torus, with_faults
from cclc.verify import verify

RING_KINDS = (K.ALLGATHER, K.REDUCESCATTER, K.ALLREDUCE)
DIMROT = get("ring+dimrotation")


def _cable(topo, a: tuple[int, ...], dim: int) -> list[tuple[int, int]]:
    """Both directions of the link from ``a`` to its next neighbour along ``dim``."""
    b = list(a)
    b[dim] = (b[dim] + 1) % topo.dims[dim]
    u, v = (int(np.ravel_multi_index(c, topo.dims)) for c in (a, tuple(b)))
    return [(u, v), (v, u)]


def _cuts_by_hand(topo, dims) -> dict[tuple[int, tuple[int, ...]], int]:
    """(dimension, line) -> how many of its ring's hops lack a healthy link each way."""
    count: dict[tuple[int, tuple[int, ...]], int] = {}
    for r in range(topo.n_ranks):
        c = list(np.unravel_index(r, topo.dims))
        for d in dims:
            nxt = list(c)
            nxt[d] = (c[d] + 1) % topo.dims[d]
            v = int(np.ravel_multi_index(nxt, topo.dims))
            ok = all(topo.link_id(x, y) is not None and not topo.link_failed[topo.link_id(x, y)]
                     for x, y in ((r, v), (v, r)))
            line = tuple(int(x) for i, x in enumerate(c) if i != d)
            count[(d, line)] = count.get((d, line), 0) + (not ok)
    return count


@st.composite
def faulty_tori(draw):
    dims = tuple(draw(st.lists(st.integers(3, 5), min_size=2, max_size=3)))
    wrap = tuple(draw(st.lists(st.booleans(), min_size=len(dims), max_size=len(dims)))
                 ) if draw(st.booleans()) else None
    topo = torus("t", dims, wrap=wrap, bandwidth=10e9, latency=1e-7)
    faults = []
    for _ in range(draw(st.integers(0 if wrap else 1, 2))):
        dim = draw(st.integers(0, len(dims) - 1))
        at = tuple(draw(st.integers(0, m - 1)) for m in dims)
        if wrap is not None and not wrap[dim] and at[dim] == dims[dim] - 1:
            continue                       # a mesh has no link there to fail
        pair = _cable(topo, at, dim)
        faults += pair if draw(st.booleans()) else pair[:1]
    return with_faults(topo, faults) if faults else topo


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(topo=faulty_tori(), kind=st.sampled_from(RING_KINDS), blocks=st.integers(1, 7))
def test_cut_rings_run_as_lines_and_compute_the_right_numbers(topo, kind, blocks):
    n = topo.n_ranks
    coll = make_collective("c", kind, topo, topo.all_ranks(), size=4 * (n * blocks + 1)
                           if kind is K.ALLREDUCE else 4 * n * blocks)
    twice = [key for key, k in _cuts_by_hand(topo, range(len(topo.dims))).items() if k > 1]
    why = DIMROT.applicable(coll)
    if twice:
        assert why is not None and "cut 2 times" in why
        return
    assert why is None
    s = DIMROT.build(coll)
    verify(s)
    check_numeric(s)
    # every op is one healthy hop (or local): nothing crosses a cut, nothing needs a relay
    lengths = s.routes.lengths()[s.ops.route]
    assert lengths.max(initial=0) <= 1
    links = s.routes.links
    assert not topo.link_failed[links].any()
    assert len(s.ops) == estimate_ops(coll, DIMROT, {})


def test_line_cuts_names_each_ring_cut_and_where():
    topo = torus("t", (4, 5, 3))
    topo = with_faults(topo, _cable(topo, (1, 2, 0), 1) + _cable(topo, (3, 0, 2), 0)[:1])
    coll = make_collective("c", K.ALLREDUCE, topo, topo.all_ranks(), size=4 * 60)
    cuts, why = line_cuts(coll, [0, 1, 2])
    assert why is None and sorted(cuts) == [0, 1]
    coords = np.stack(np.unravel_index(np.arange(60), (4, 5, 3)), axis=1)
    # the y ring through (1, *, 0) is cut between y = 2 and 3, the x ring through (*, 0, 2)
    # between x = 3 and 0 (one direction failed is a cut too); every other ring is whole
    on_y = (coords[:, 0] == 1) & (coords[:, 2] == 0)
    assert (cuts[1][on_y] == 2).all() and (cuts[1][~on_y] == -1).all()
    on_x = (coords[:, 1] == 0) & (coords[:, 2] == 2)
    assert (cuts[0][on_x] == 3).all() and (cuts[0][~on_x] == -1).all()


def test_a_ring_cut_twice_is_refused_with_the_reason():
    topo = torus("t", (5, 4))
    topo = with_faults(topo, _cable(topo, (0, 1), 0) + _cable(topo, (2, 1), 0))
    coll = make_collective("c", K.ALLGATHER, topo, topo.all_ranks(), size=4 * 20)
    why = DIMROT.applicable(coll)
    assert "dimension 0" in why and "cut 2 times" in why


def test_a_ring_of_two_whose_cable_failed_is_refused_as_such():
    topo = torus("t", (2, 4))
    topo = with_faults(topo, _cable(topo, (0, 1), 0))
    coll = make_collective("c", K.ALLREDUCE, topo, topo.all_ranks(), size=4 * 8 * 3)
    why = DIMROT.applicable(coll)
    assert "two ranks whose one cable failed" in why and "dimension 0" in why


@pytest.mark.parametrize("m", [3, 4, 6])
@pytest.mark.parametrize("kind", [K.REDUCESCATTER, K.ALLGATHER])
def test_one_cut_ring_costs_what_the_count_by_hand_says(m, kind):
    # an m x m torus, one failed cable along dimension 0, latency 0. Pieces: the rotation
    # (0, 1) one per direction, the rotation (1, 0) two (P = 6), a chunk c = S / (6 n).
    # Reduce-scatter, per step, the busiest link: steps 1..m-1, 2 m c (the line's two pieces
    # each way, or the rotation (1, 0)'s two pieces along dimension 1, m blocks each); then
    # the rotation (1, 0) along the line, one block, four pieces each way: 4 c for m - 1
    # steps, while the rotation (0, 1) is one local step behind, its last step alone: c.
    # The all-gather is the mirror, without the local steps: (m - 1) (4 c + 2 m c).
    topo = torus("t", (m, m), bandwidth=8e9, latency=0.0)
    topo = with_faults(topo, _cable(topo, (1, 1), 0))
    n = m * m
    size = 4 * 6 * n * 5
    coll = make_collective("c", kind, topo, topo.all_ranks(), size=size)
    c = size / (6 * n) / 8e9
    want = ((m - 1) * (2 * m * c + 4 * c) + c if kind is K.REDUCESCATTER
            else (m - 1) * (4 * c + 2 * m * c))
    assert simulate(DIMROT.build(coll)).time == pytest.approx(want, rel=1e-12)


def _busiest_per_dimension(s, topo) -> np.ndarray:
    """``(steps, dimensions)``: the bytes on the busiest link of each dimension in each step,
    counted from the ops (an independent count, not the simulator's)."""
    nbytes = s.op_bytes()
    remote = s.routes.lengths()[s.ops.route] == 1
    link = s.routes.links[s.routes.offsets[s.ops.route[remote]]]
    load = np.zeros((s.n_steps, topo.n_links))
    np.add.at(load, (s.ops.step[remote], link), nbytes[remote])
    dim_of = np.array([int(np.flatnonzero(np.subtract(
        np.unravel_index(int(topo.link_src[k]), topo.dims),
        np.unravel_index(int(topo.link_dst[k]), topo.dims)))[0]) for k in range(topo.n_links)])
    return np.stack([load[:, dim_of == d].max(axis=1) for d in range(len(topo.dims))], axis=1)


@pytest.mark.parametrize("cut_dims, steps", [((0,), range(1, 6)), ((0, 1), range(1, 6)),
                                             ((0, 1), range(7, 11))])
def test_cut_and_whole_dimensions_are_alike_busy(cut_dims, steps):
    # the weights: the rotations that start on a whole dimension carry twice the pieces, so
    # in the first (largest) phase a line's links and the whole rings' are alike busy; with
    # two cut dimensions the rotation from the whole one takes them in opposite orders by
    # direction, so its second phase (steps 7..10 on 6x6x6, where the others' second phases
    # run beside it) loads both lines as the two others load the whole dimension
    topo = torus("t", (6, 6, 6), bandwidth=10e9, latency=0.0)
    faults = [pair for d in cut_dims for pair in _cable(topo, (2, 2, 2), d)]
    topo = with_faults(topo, faults)
    coll = make_collective("c", K.ALLREDUCE, topo, topo.all_ranks(), size=4 * 216 * 10 * 8)
    busiest = _busiest_per_dimension(DIMROT.build(coll), topo)
    for t in steps:
        assert busiest[t, 0] == busiest[t, 1] == busiest[t, 2] > 0, (t, busiest[t])
