"""Packing one piece per orbit (:mod:`cclc.synth.orbit_pack`) against the full piece set, and
the columnar op writing of the synthesized AllToAll.

The symmetric piece sets are built here, independently of the path LP: random shortest paths
from the smallest vertex of every source orbit, mapped by every element of the group (each
orbit keeps the size of the piece that generated it). For such a set, with every orbit started
at one step, the per-link-orbit loads the packer tracks must equal, step by step, the busiest
link of the whole set counted by brute force."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import shortest_path

from cclc.collective import CollectiveKind, make_collective
from cclc.synth.alltoall import _scratch_chunks, synthesize_alltoall, write_schedule
from cclc.synth.flow_solution import usable_links
from cclc.synth.flows import solve_flows
from cclc.synth.orbit_pack import pack_orbits, piece_orbits
from cclc.synth.pack import packing_time
from cclc.synth.piece_table import Piece, hop_table
from cclc.synth.symmetry import automorphisms, translations
from cclc.topology import torus, with_faults
from cclc.verify import verify

ITEM = 4


def _a2a(dims, links=(), per_pair=64):
    t = torus("t", dims, bandwidth=32e9, latency=1e-7, routing="none")
    pairs = [(t.rank_at(a), t.rank_at(b)) for a, b in links]
    topo = with_faults(t, links=pairs + [(b, a) for a, b in pairs])
    group = topo.live_ranks()
    return make_collective("a", CollectiveKind.ALLTOALL, topo, tuple(group),
                           size=len(group) * per_pair * ITEM)


def _symmetric_pieces(coll, sym, rng) -> list[Piece]:
    """Random shortest paths from every source orbit's smallest vertex to every target,
    mapped by every element; an image already present keeps the size it was given first."""
    topo = coll.topology
    ok = np.flatnonzero(usable_links(coll))
    V = topo.n_vertices
    w = 1.0 + 0.3 * rng.random(len(ok))
    g = csr_matrix((w, (topo.link_src[ok], topo.link_dst[ok])), shape=(V, V))
    group = np.asarray(coll.group)
    index = {int(v): i for i, v in enumerate(group)}
    sources = sym.vertex_representatives(group)
    _, pred = shortest_path(g, indices=sources, return_predecessors=True)
    size: dict[tuple, int] = {}
    for row, s in enumerate(sources.tolist()):
        for t in group.tolist():
            if t == s:
                continue
            links, v = [], t
            while v != s:
                u = int(pred[row, v])
                links.append(topo.link_id(u, v))
                v = u
            links = np.array(links[::-1], dtype=np.int64)
            elems = int(rng.integers(1, 9)) * 8
            for e in range(sym.order):
                key = (int(sym.vertex[e, s]), int(sym.vertex[e, t]),
                       tuple(sym.link_image(e, links).tolist()))
                size.setdefault(key, elems)
    pieces, slot = [], {}
    for (s, t, links), elems in size.items():
        k = slot.get((s, t), 0)
        slot[(s, t)] = k + 1
        pieces.append(Piece(index[s], index[t], k, elems, tuple((e,) for e in links),
                            tuple(index[int(topo.link_dst[e])] for e in links)))
    return pieces


def _loads_by_step(coll, pieces, start, n_steps):
    """Brute force: per step, the busiest link's seconds."""
    topo = coll.topology
    L = np.zeros((n_steps, topo.n_links))
    for p, s in zip(pieces, start.tolist(), strict=True):
        for k, hop in enumerate(p.hops):
            for e in hop:
                L[s + k, e] += p.elems * ITEM / topo.link_bandwidth[e]
    return L.max(axis=1)


def _orbit_loads_by_step(coll, pieces, orbits, rep_start, n_steps):
    """The packer's model: per step, the busiest link-orbit row, each representative adding
    its orbit's size over the row's size times its seconds."""
    topo = coll.topology
    rows = np.zeros((n_steps, len(orbits.row_size)))
    for o, i in enumerate(orbits.reps.tolist()):
        p = pieces[i]
        for k, hop in enumerate(p.hops):
            for e in hop:
                r = orbits.link_row[e]
                rows[rep_start[o] + k, r] += (orbits.size[o] / orbits.row_size[r]
                                              * p.elems * ITEM / topo.link_bandwidth[e])
    return rows.max(axis=1)


def _check_exact(coll, sym, seed):
    rng = np.random.default_rng(seed)
    pieces = _symmetric_pieces(coll, sym, rng)
    table = hop_table(coll.topology, pieces)
    orbits = piece_orbits(coll, pieces, sym, usable_links(coll), table)
    assert orbits.size.sum() == len(pieces)
    # every orbit's pieces are images of its representative: equal sizes and hop counts
    rep = orbits.reps[orbits.orbit]
    assert all(pieces[i].elems == pieces[r].elems and len(pieces[i].hops) == len(pieces[r].hops)
               for i, r in enumerate(rep.tolist()))
    n_steps = max(len(p.hops) for p in pieces) + 2
    rep_start = np.array([rng.integers(0, n_steps - len(pieces[i].hops) + 1)
                          for i in orbits.reps.tolist()], dtype=np.int64)
    start = rep_start[orbits.orbit]
    np.testing.assert_allclose(_orbit_loads_by_step(coll, pieces, orbits, rep_start, n_steps),
                               _loads_by_step(coll, pieces, start, n_steps), rtol=1e-9)
    # the packing of the orbits: one start per orbit, its time that of every piece
    packed = pack_orbits(coll, pieces, orbits, n_steps, 0.0, table)
    assert (packed.start == packed.start[orbits.reps][orbits.orbit]).all()
    assert (packed.start + np.array([len(p.hops) for p in pieces]) <= n_steps).all()
    assert packed.time == pytest.approx(packing_time(coll, pieces, packed.start, n_steps))
    return len(orbits.reps), len(pieces)


@pytest.mark.parametrize("dims, links, full", [
    ((4, 4), (), True),                                 # 128 elements: stabilizers of 8
    ((4, 4, 4), (), False),                             # 64 translations, acting freely
    ((5, 5), [((0, 2), (1, 2))], True),                 # reflections only
    ((3, 3, 3), [((0, 0, 0), (1, 0, 0))], True),        # 16 elements, as 8x8x8 with one fault
])
def test_orbit_loads_equal_the_full_loads(dims, links, full):
    coll = _a2a(dims, links)
    ok = usable_links(coll)
    sym = automorphisms(coll, ok) if full else translations(coll, ok)
    assert sym.order > 1
    reps, pieces = _check_exact(coll, sym, 0)
    assert reps < pieces


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(k=st.sampled_from([4, 5]), axis=st.integers(0, 1), at=st.integers(0, 4),
       along=st.integers(0, 4), seed=st.integers(0, 100))
def test_orbit_loads_property_one_fault(k, axis, at, along, seed):
    """One failed link anywhere on a k x k torus leaves reflections (and, k = 4, no more);
    the orbit model is exact for any symmetric set of pieces."""
    a = [along % k, at % k]
    a[axis] = along % k
    b = list(a)
    b[axis] = (a[axis] + 1) % k
    coll = _a2a((k, k), [(tuple(a), tuple(b))])
    sym = automorphisms(coll, usable_links(coll))
    assume(sym.order > 1)
    _check_exact(coll, sym, seed)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.sampled_from([8, 16]), st.integers(0, 7)),
                min_size=1, max_size=60))
def test_scratch_chunks_never_overwrite_a_live_chunk(writes):
    """Brute force over the writes: a chunk written in step t is read in t + 1, so no other
    write may reach it in t or t + 1, and its size is the size written."""
    rank, elems, step = (np.array(c, dtype=np.int64) for c in zip(*writes, strict=True))
    chunk, lay = _scratch_chunks(4, rank, elems, step, np.ones(len(rank), dtype=bool))
    assert (lay[rank, chunk] == elems).all()
    for i in range(len(rank)):
        for j in range(i + 1, len(rank)):
            if rank[i] == rank[j] and chunk[i] == chunk[j]:
                assert abs(int(step[i]) - int(step[j])) >= 2
    # no chunk more than the two parities' busiest steps need
    for r in range(4):
        for e in (8, 16):
            sel = (rank == r) & (elems == e)
            need = sum(np.bincount(step[sel & (step % 2 == par)], minlength=1).max()
                       for par in (0, 1))
            assert (lay[r] == e).sum() == need


def test_orbit_packing_writes_a_verified_schedule(monkeypatch):
    """With the threshold lowered, a healthy 4x4x4 torus goes through the orbit packing end to
    end: the schedule verifies and its simulated time is the packing's."""
    from cclc.sim import simulate
    from cclc.synth import alltoall

    monkeypatch.setattr(alltoall, "ORBIT_PACK_ABOVE", 0)
    coll = _a2a((4, 4, 4), per_pair=256)
    flows = solve_flows(coll)
    synth = synthesize_alltoall(coll, flows, lp_time_limit=None, model=None)
    s = write_schedule(coll, synth, ())
    verify(s)
    assert float(simulate(s).time) == pytest.approx(synth.packing.time, rel=1e-9)


def _busiest(coll, flows) -> float:
    """Brute force: the busiest link's seconds under the weighted paths."""
    topo = coll.topology
    load = np.zeros(topo.n_links)
    for x, path in zip(flows.weight.tolist(), flows.path, strict=True):
        for e in path:
            load[e] += x * coll.size / coll.n / topo.link_bandwidth[e]
    return float(load.max())


@pytest.mark.parametrize("dims, links", [
    ((4, 4), ()),                                       # 128 elements
    ((3, 3, 3), [((0, 0, 0), (1, 0, 0))]),              # 16 elements, stabilizers
    ((5, 5), [((0, 2), (1, 2))]),                       # reflections only
])
def test_basic_orbit_paths_keep_the_lp_time_and_the_symmetry(dims, links):
    from cclc.synth.vertex import basic_orbit_paths

    coll = _a2a(dims, links, per_pair=1024)
    flows = solve_flows(coll, full_group=True)
    sym = automorphisms(coll, usable_links(coll))
    basic = basic_orbit_paths(coll, flows, sym)
    assert len(basic.path) <= len(flows.path)
    # every pair keeps shares summing to one
    total: dict[tuple[int, int], float] = {}
    for s, t, x in zip(basic.src.tolist(), basic.dst.tolist(), basic.weight.tolist(),
                       strict=True):
        total[(s, t)] = total.get((s, t), 0.0) + x
    assert len(total) == coll.n * (coll.n - 1)
    assert all(abs(v - 1.0) < 1e-9 for v in total.values())
    # the LP's time, recomputed from the paths (the PDLP optimum is within 1e-4)
    assert _busiest(coll, basic) == pytest.approx(flows.lp_time, rel=1e-3)
    # one share per orbit: every element maps a path onto a path of the same share, wherever
    # the image was among the LP's paths (the LP's cut to four paths per pair can leave an
    # orbit incomplete)
    given = set(zip(flows.src.tolist(), flows.dst.tolist(), flows.path, strict=True))
    group = np.asarray(coll.group)
    index = {int(v): i for i, v in enumerate(group)}
    share = {(s, t, p): x for s, t, p, x in zip(basic.src.tolist(), basic.dst.tolist(),
                                                basic.path, basic.weight.tolist(), strict=True)}
    for g in range(sym.order):
        for (s, t, p), x in share.items():
            img = (index[int(sym.vertex[g, group[s]])], index[int(sym.vertex[g, group[t]])],
                   tuple(sym.link_image(g, np.array(p)).tolist()))
            if img in given:
                assert share.get(img, 0.0) == pytest.approx(x, rel=1e-6, abs=1e-9)
