"""Fault classes and their orbits, against brute force over the torus's automorphisms."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from cclc.catalog.faultsets import MAX_MEMBERS, cables, fault_orbits, fault_sets, symmetry_maps
from cclc.collective import CollectiveKind, make_collective
from cclc.errors import CclError
from cclc.topology import torus, with_faults


def _coll(dims, kind=CollectiveKind.ALLTOALL, topo=None):
    t = topo or torus("t", dims)
    n = t.n_ranks
    return make_collective("a", kind, t, tuple(range(n)), size=n * n * 4)


def test_single_links_of_a_cube_form_one_orbit():
    # every cable of a 3x3x3 torus maps onto every other (translations and dimension swaps)
    orbits = fault_orbits(_coll((3, 3, 3)), "link")
    assert len(orbits.members) == 27 * 3
    assert orbits.n_orbits == 1


def test_unlike_dimensions_make_one_orbit_each():
    # 4x3: the dimensions cannot be swapped, so each dimension's cables are an orbit
    orbits = fault_orbits(_coll((4, 3)), "link")
    assert len(orbits.members) == 24 and orbits.n_orbits == 2


def test_orbits_match_brute_force_over_the_group():
    coll = _coll((4, 4))
    maps = symmetry_maps(coll)
    topo = coll.topology
    orbits = fault_orbits(coll, "link-pairs")
    # brute force: two pairs are in one orbit when some automorphism maps one onto the other
    def image(links, vmap):
        return tuple(sorted(topo.link_id(int(vmap[topo.link_src[x]]), int(vmap[topo.link_dst[x]]))
                            for x in links))
    by_orbit = {}
    for m in orbits.members:
        by_orbit.setdefault(m.orbit, []).append(m)
        rep = orbits.representatives[m.orbit]
        assert image(rep.links, m.vertex) == m.faults.links      # the stored map is right
    reps = orbits.representatives
    for a, b in itertools.combinations(range(len(reps)), 2):
        assert all(image(reps[a].links, g) != reps[b].links for g in maps)
    assert sum(len(v) for v in by_orbit.values()) == len(fault_sets(coll, "link-pairs"))


def test_a_declared_fault_is_kept_by_every_symmetry():
    t = with_faults(torus("t", (4, 4)), links=[(0, 4), (4, 0)])
    coll = _coll(None, topo=t)
    maps = symmetry_maps(coll)
    failed = set(np.flatnonzero(t.link_failed).tolist())
    for g in maps:
        assert {t.link_id(int(g[t.link_src[x]]), int(g[t.link_dst[x]])) for x in failed} == failed
    assert len(cables(t)) == 31


def test_rank_class_and_root():
    coll = make_collective("b", CollectiveKind.BROADCAST, torus("t", (3, 3)), tuple(range(9)),
                           size=36, root=4)
    # the centre of a 3x3 torus is moved by translations: only maps fixing the root are used
    assert (symmetry_maps(coll)[:, 4] == 4).all()
    assert len(fault_orbits(coll, "rank").members) == 9


def test_refusals_name_the_reason():
    with pytest.raises(CclError, match="fabrics"):
        fault_sets(_coll((4, 4)), "cable")
    with pytest.raises(CclError, match="no NICs"):
        fault_sets(_coll((4, 4)), "nic")
    with pytest.raises(CclError, match=f"more than the {MAX_MEMBERS}"):
        fault_sets(_coll((8, 8, 8), topo=torus("t", (8, 8, 8))), "link-pairs")
    with pytest.raises(CclError, match="unknown fault class"):
        fault_sets(_coll((4, 4)), "cosmic-ray")
