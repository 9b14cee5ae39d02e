"""A schedule moved along an orbit: verified and numpy-correct on the image machine."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cclc.catalog.build import build_catalog, faulted, member_schedule
from cclc.catalog.faultsets import FaultSet, symmetry_maps
from cclc.catalog.relabel import relabel, split_at_blocks
from cclc.collective import CollectiveKind, Hint, make_collective
from cclc.numeric import check_numeric
from cclc.plan import plan
from cclc.topology import torus
from cclc.verify import verify

KINDS = (CollectiveKind.ALLTOALL, CollectiveKind.ALLGATHER, CollectiveKind.REDUCESCATTER,
         CollectiveKind.ALLREDUCE)


def _coll(kind, dims=(4, 4), algorithm="auto"):
    t = torus("t", dims)
    n = t.n_ranks
    c = make_collective("a", kind, t, tuple(range(n)), size=n * 64 * 4)
    return dataclasses.replace(c, algorithm=Hint(algorithm))


@pytest.mark.parametrize("kind", [CollectiveKind.ALLTOALL, CollectiveKind.ALLGATHER])
def test_bruck_ops_are_cut_at_blocks_and_relabel_correctly(kind):
    # bruck moves runs of several ranks' blocks in one op: the cut makes them relabelable
    coll = _coll(kind, algorithm="bruck")
    s = plan(coll).schedule
    cut = split_at_blocks(s)
    assert len(cut.ops) > len(s.ops)
    assert cut.op_elems().sum() == s.op_elems().sum()       # the same moves, cut
    verify(cut)
    for g in symmetry_maps(coll)[[1, 7, -1]]:
        moved = relabel(cut, coll, g)
        verify(moved)
        check_numeric(moved)


@pytest.mark.slow
@settings(max_examples=6, deadline=None)
@given(kind=st.sampled_from(KINDS), member=st.integers(0, 10_000))
def test_every_member_is_served_by_its_orbit_schedule(kind, member):
    coll = _coll(kind, dims=(3, 3))
    catalog = _CATALOGS.get(kind) or _CATALOGS.setdefault(kind, build_catalog(coll, ("link",)))
    k = member % len(catalog.classes[0].members)
    s = member_schedule(catalog, 0, k)
    faults = catalog.classes[0].members[k].faults
    assert s.collective.topology.link_failed[list(faults.links)].all()
    verify(s)
    check_numeric(s)
    # none of its moves crosses a failed link
    assert not s.collective.topology.link_failed[s.routes.links].any()


_CATALOGS: dict = {}


def test_a_lost_rank_is_served_relabeled():
    coll = _coll(CollectiveKind.ALLGATHER, dims=(3, 3))
    catalog = build_catalog(coll, ("rank",))
    assert catalog.classes[0].n_orbits == 1 and len(catalog.classes[0].members) == 9
    for k in (0, 4, 8):
        s = member_schedule(catalog, 0, k)
        assert s.n == 8 and catalog.classes[0].members[k].faults.ranks[0] not in \
            s.collective.group
        verify(s)
        check_numeric(s)


@pytest.mark.slow
def test_the_healthy_machine_comes_first():
    coll = _coll(CollectiveKind.ALLREDUCE, dims=(3, 3))
    catalog = build_catalog(coll, ("link",))
    assert catalog.schedules[0].faults == FaultSet()
    assert not catalog.schedules[0].collective.topology.link_failed.any()
    assert faulted(coll, FaultSet()).topology.n_failed_links == 0
    summary = catalog.summary()
    assert summary["schedules_compiled"] == 2 and summary["members"] == 18
    assert summary["worst_pct_of_bound"] <= summary["median_pct_of_bound"] <= 100
