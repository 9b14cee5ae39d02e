"""The bounds estimate their own long steps before running them: the torus symmetry search
is counted (not listed) first, and every long step says what it waits for."""

from __future__ import annotations

import math

import pytest

from cclc.bounds import SYMMETRY_MAX_IMAGES, bounds, symmetry_search
from cclc.collective import CollectiveKind as K
from cclc.collective import make_collective
from cclc.flow_lp import torus_automorphism_count, torus_point_maps
from cclc.topology import torus


@pytest.mark.parametrize("dims, wrap", [((5, 5, 5), True), ((4, 4, 3), True), ((2, 2, 2), True),
                                        ((3, 4), False), ((2, 3), False), ((6,), True)])
def test_the_automorphism_count_is_the_length_of_the_list(dims, wrap):
    wraps = (wrap,) * len(dims)
    point_maps, translations = torus_automorphism_count(dims, wraps)
    assert point_maps == len(torus_point_maps(dims, wraps))
    assert translations == (math.prod(dims) if wrap else 1)


def test_twelve_alike_dimensions_are_counted_without_listing_them():
    point_maps, translations = torus_automorphism_count((2,) * 12, (True,) * 12)
    assert point_maps == math.factorial(12) and translations == 4096


@pytest.mark.parametrize("dims, search", [((8, 8, 8), (True, 24576)),
                                          ((16, 16, 16), None),
                                          ((2,) * 12, None)])
def test_the_symmetry_search_is_sized_before_it_runs(dims, search):
    topo = torus("t", dims, routing="none")
    links = int((~topo.link_failed).sum())
    assert symmetry_search(topo, links) == search
    if search is not None:
        assert search[1] * links <= SYMMETRY_MAX_IMAGES


def test_a_4096_rank_alltoall_gets_its_closed_forms_and_a_note_quickly():
    topo = torus("t", (16, 16, 16), bandwidth=50e9, latency=1e-7, routing="none")
    coll = make_collective("a", K.ALLTOALL, topo, tuple(range(4096)), size=16 << 20)
    said: list[str] = []
    b = bounds(coll, on_stage=said.append)
    assert b.name == "hop_bytes"
    assert any("not reduced by symmetry" in note for note in b.notes)
    assert said == ["closed forms (hop bytes, injection, cuts, latency)"]


def test_each_long_step_says_what_it_waits_for():
    topo = torus("t", (4, 4), bandwidth=50e9, latency=1e-7, routing="none")
    coll = make_collective("a", K.ALLTOALL, topo, tuple(range(16)), size=16 * 4 * 16)
    said: list[str] = []
    bounds(coll, on_stage=said.append)
    assert said[0].startswith("closed forms")
    assert any(s.startswith("searching the torus symmetries (") for s in said)
    assert any(s.startswith("solving the flow LP (") and "variables, HiGHS)" in s
               for s in said)


@pytest.mark.parametrize("kind", [K.ALLGATHER, K.REDUCESCATTER, K.ALLREDUCE])
def test_max_flow_lps_over_too_many_links_are_skipped_with_a_note(monkeypatch, kind):
    # a node of 4,096 NICs (a mutated example) made max-flow LPs of 2.1M variables each, which
    # ran for minutes; the limit stands in here at the 48 links of a 4x4 torus less one
    import cclc.bounds as b

    topo = torus("t", (4, 4), routing="none")
    coll = make_collective("c", kind, topo, tuple(range(16)), size=16 * 64)
    assert any(x.name == "lp" for x in bounds(coll).items)
    monkeypatch.setattr(b, "LP_MAX_FLOW_LINKS", int((~topo.link_failed).sum()) - 1)
    topo2 = torus("t", (4, 4), routing="none")             # a fresh topology: no kept optimum
    coll2 = make_collective("c", kind, topo2, tuple(range(16)), size=16 * 64)
    said: list[str] = []
    found = bounds(coll2, on_stage=said.append)
    assert not any(x.name == "lp" for x in found.items)
    assert any("links >" in note and "max-flow LPs" in note for note in found.notes)
    # skipped before the symmetry search, for the bound and for its note: no symmetry makes
    # an LP over the link limit fit
    assert not any(s.startswith("searching the torus symmetries") for s in said)
    assert not any(isinstance(k, tuple) and k[0] == "torus_symmetry" for k in topo2._cache)
