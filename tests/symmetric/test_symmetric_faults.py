"""cclc/symmetric_faults.py and cclc/algorithms/torus_reroute.py: a torus AllToAll with failed
links stored by symmetry with exceptions, checked against its expansion (the ordinary verifier
and lockstep simulator must give the same verdict and time), and mutations of the tail that
must fail both."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from cclc.algorithms.torus_reroute import excepted_alltoall, excepted_reason
from cclc.algorithms.torus_symmetric import symmetric_allreduce, symmetric_alltoall
from cclc.collective import CollectiveKind, make_collective
from cclc.errors import CclError, ScheduleError
from cclc.ir import Buf, Ops, Routes
from cclc.sim import simulate
from cclc.symmetric import ExceptedSchedule, healthy_collective
from cclc.symmetric_check import journeys
from cclc.symmetric_faults import (
    expand_excepted,
    masked_instances,
    simulate_excepted,
    verify_excepted,
)
from cclc.topology import torus, with_faults
from cclc.verify import verify


def _faulty(shape: tuple[int, ...], picks: list[int], kind=CollectiveKind.ALLTOALL, per=2):
    """An AllToAll on torus ``shape`` with the links ``picks`` (indices into its links) failed
    both ways; ``None`` where that disconnects it."""
    topo = torus("t", shape, bandwidth=32e9, latency=100e-9, routing="none")
    pairs = set()
    for p in picks:
        a, b = int(topo.link_src[p % topo.n_links]), int(topo.link_dst[p % topo.n_links])
        pairs |= {(a, b), (b, a)}
    units = 2 * max(sum(m > 1 for m in shape), 1)
    try:
        return make_collective("a2a", kind, with_faults(topo, links=sorted(pairs)),
                               tuple(range(topo.n_ranks)), size=topo.n_ranks * units * 4 * per)
    except CclError:
        return None


def _both_ways(x: ExceptedSchedule) -> None:
    """The form's verdict and time equal its expansion's under the ordinary tools."""
    verify_excepted(x)
    whole = expand_excepted(x)
    assert len(whole.ops) == x.expanded_ops()
    verify(whole)
    for rule in ("every", "peer"):
        sim = simulate_excepted(x, step_overhead=1e-7, overhead_steps=rule)
        ref = simulate(whole, step_overhead=1e-7, overhead_steps=rule)
        assert sim.time == pytest.approx(ref.time, rel=1e-12)
        np.testing.assert_allclose(sim.link_bytes, ref.link_bytes, rtol=1e-12)
        assert sim.step_bytes.tolist() == ref.step_bytes.tolist()
        assert sim.step_busiest_link == ref.step_busiest_link
    # no kept op and no tail op crosses a failed link
    failed = np.flatnonzero(x.topology.link_failed)
    assert not np.asarray(ref.link_bytes)[failed].any()


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=st.lists(st.integers(2, 6), min_size=1, max_size=3).filter(
           lambda s: int(np.prod(s)) <= 48),
       picks=st.lists(st.integers(0, 10_000), min_size=1, max_size=2))
def test_the_form_matches_its_expansion(shape, picks):
    coll = _faulty(tuple(shape), picks)
    assume(coll is not None)
    _both_ways(excepted_alltoall(coll))


def test_one_fault_on_a_3d_torus_masks_the_journeys_over_it():
    coll = _faulty((4, 4, 4), [0])
    assert coll is not None
    x = excepted_alltoall(coll)
    _both_ways(x)
    # each direction of a link carries one 64th of every orbit's journeys through it
    assert len(x.masked_element) > 0 and len(x.tail) > 0
    t, rep = masked_instances(x)
    assert len(t) == x.masked_ops()


def _mutated(x: ExceptedSchedule, **cols) -> ExceptedSchedule:
    c = {k: v.copy() for k, v in x.tail.columns().items()}
    for k, (row, value) in cols.items():
        c[k][row] = value
    return x.replace(tail=Ops(**c))


def _fails_both(x: ExceptedSchedule, match: str) -> None:
    with pytest.raises(ScheduleError, match=match):
        verify_excepted(x)
    with pytest.raises(ScheduleError):
        verify(expand_excepted(x))


@pytest.fixture(scope="module")
def small():
    coll = _faulty((4, 4), [0])
    assert coll is not None
    return excepted_alltoall(coll)


def test_dropping_a_tail_op_fails(small):
    last = int(np.flatnonzero(small.tail.dst_buf == Buf.OUTPUT)[0])
    keep = np.arange(len(small.tail)) != last
    _fails_both(small.replace(tail=small.tail.take(keep)), "does not deliver it")


def test_a_tail_op_over_a_failed_link_fails(small):
    f = int(np.flatnonzero(small.topology.link_failed)[0])
    routes = small.tail_routes
    bad = Routes(np.r_[routes.offsets, routes.offsets[-1] + 1], np.r_[routes.links, f])
    first = int(np.flatnonzero(small.tail.step == 0)[0])
    x = _mutated(small.replace(tail_routes=bad), route=(first, len(routes)),
                 src=(first, int(small.topology.link_src[f])),
                 dst=(first, int(small.topology.link_dst[f])))
    _fails_both(x, "usable links")


def test_a_tail_unit_in_a_used_scratch_chunk_fails(small):
    wait = int(np.flatnonzero(small.tail.dst_buf == Buf.SCRATCH)[0])
    _fails_both(_mutated(small, dst_off=(wait, 0)), "scratch chunk of the base")


def test_two_tail_units_in_one_chunk_at_once_fail(small):
    t = small.tail
    wait = np.flatnonzero((t.dst_buf == Buf.SCRATCH) & (t.step == 0))
    a, b = (int(i) for i in wait[:2])
    x = _mutated(small, dst=(b, int(t.dst[a])), dst_off=(b, int(t.dst_off[a])),
                 route=(b, int(t.route[a])), src=(b, int(t.src[a])),
                 src_off=(b, int(t.src_off[a])))
    with pytest.raises(ScheduleError):
        verify_excepted(x)


def test_an_unmasked_journey_over_a_failed_link_fails(small):
    x = small.replace(masked_element=small.masked_element[1:],
                      masked_journey=small.masked_journey[1:])
    with pytest.raises(ScheduleError, match="crosses a failed link but is not masked"):
        verify_excepted(x)
    with pytest.raises(ScheduleError):
        verify(expand_excepted(x))


def test_journeys_refuse_ops_that_read_another_elements_writes():
    # an AllReduce's reductions read what the neighbours' translates wrote: no independent
    # journeys to mask, and exceptions are not offered for it
    topo = torus("t", (4, 4))
    coll = make_collective("ar", CollectiveKind.ALLREDUCE, topo, tuple(range(16)), size=4096)
    with pytest.raises(ScheduleError, match="another element"):
        journeys(symmetric_allreduce(coll))
    faulty = _faulty((4, 4), [0], kind=CollectiveKind.ALLREDUCE, per=16)
    assert faulty is not None and "alltoall only" in (excepted_reason(faulty) or "")
    alltoall = _faulty((4, 4), [0])
    assert alltoall is not None and excepted_reason(alltoall) is None
    assert excepted_reason(healthy_collective(alltoall)) == "it has no failed link"
    dead = with_faults(torus("t", (4, 4)), ranks=[0])
    lost = make_collective("a2a", CollectiveKind.ALLTOALL, dead, tuple(range(1, 16)), size=960)
    assert "failed ranks" in (excepted_reason(lost) or "")


def test_a_document_with_bad_exception_ids_is_refused_with_a_message(small):
    with pytest.raises(ScheduleError, match="outside"):
        small.replace(masked_journey=small.masked_journey + len(small.ops))
    with pytest.raises(ScheduleError, match="outside"):
        small.replace(tail_scratch_from=-1)


@pytest.mark.parametrize("shape", [(2, 2, 2), (3, 3)])
def test_a_step_left_with_local_ops_alone_pays_no_peer_step_cost(shape):
    # masking, on every element, each journey with a hop in step 0 leaves that step the local
    # copies of the own blocks alone: a cost on the steps between ranks skips it, as it does
    # in the expansion (not a complete AllToAll: the empty tail delivers nothing)
    topo = torus("t", shape, bandwidth=32e9, latency=100e-9)
    n = topo.n_ranks
    coll = make_collective("a2a", CollectiveKind.ALLTOALL, topo, tuple(range(n)), size=n * 64)
    base = symmetric_alltoall(coll)
    root = journeys(base).root
    o = base.ops
    hops = np.unique(root[(o.step == 0) & (o.src != o.dst)])
    assert not np.isin(root[o.src == o.dst], hops).any()
    element, journey = np.repeat(np.arange(n), len(hops)), np.tile(hops, n)
    x = ExceptedSchedule(collective=coll, base=base, journey=root, masked_element=element,
                         masked_journey=journey, tail=Ops.empty(),
                         tail_routes=Routes(np.zeros(2, dtype=np.int64),
                                            np.zeros(0, dtype=np.int32)),
                         tail_scratch_from=len(base.layouts[Buf.SCRATCH]))
    whole = expand_excepted(x)
    w = whole.ops
    assert (w.step == 0).any() and not ((w.step == 0) & (w.src != w.dst)).any()
    times = {}
    for rule in ("every", "peer"):
        times[rule] = simulate_excepted(x, step_overhead=1e-6, overhead_steps=rule).time
        ref = simulate(whole, step_overhead=1e-6, overhead_steps=rule).time
        assert times[rule] == pytest.approx(ref, rel=1e-12)
    assert times["every"] - times["peer"] == pytest.approx(1e-6, rel=1e-9)
