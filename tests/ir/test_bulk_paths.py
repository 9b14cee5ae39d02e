"""Paths of many pairs at once: :meth:`Topology.shortest_path_table` gives every pair the path
:meth:`Topology.shortest_path_links` gives it alone, and :meth:`ScheduleBuilder.routes` the ids
that :meth:`ScheduleBuilder.route` gives the same paths one by one (duplicates, empty paths and
routes the builder already holds included), on fabrics with random failed links; and the CSR
helpers under them, and a schedule's (op, link) pairs, against plain lists."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cclc import ir
from cclc.algorithms import get
from cclc.collective import CollectiveKind as K
from cclc.collective import make_collective
from cclc.errors import TopologyError
from cclc.ir import ScheduleBuilder, csr_take, csr_take_pieces, intern_paths, run_positions
from cclc.topology import NodeType, fat_tree, torus, with_faults

HGX4 = NodeType("hgx4", "nvswitch", 4, 450e9, 1e-6, nics=4, nic_bandwidth=50e9)


def _fabric(faults: list[int]):
    topo = fat_tree("f", 4, HGX4, pods=2, rails=4, leaves=4, spines=2, cores=2,
                    oversubscription=(1.0, 1.0), bandwidth=50e9, latency=1e-6)
    picks = np.asarray(faults, dtype=np.int64) % topo.n_links
    return with_faults(topo, links=sorted({(int(topo.link_src[k]), int(topo.link_dst[k]))
                                           for k in picks}))


@settings(max_examples=20, deadline=None)
@given(faults=st.lists(st.integers(0, 10 ** 6), max_size=6), seed=st.integers(0, 2 ** 16))
def test_shortest_path_table_is_shortest_path_links(faults, seed):
    topo = _fabric(faults)
    ranks = np.arange(topo.n_ranks)
    src, dst = np.meshgrid(ranks, ranks, indexing="ij")
    src, dst = src.ravel(), dst.ravel()
    try:
        want = [topo.shortest_path_links(int(u), int(v)) for u, v in zip(src, dst, strict=True)]
    except TopologyError as err:     # a fault cut a rank off: both say so alike
        try:
            topo.shortest_path_table(src, dst)
        except TopologyError as got:
            assert str(got) == str(err)
            return
        raise AssertionError("shortest_path_table found a path shortest_path_links did "
                             "not") from err
    offsets, links = topo.shortest_path_table(src, dst)
    got = [tuple(links[offsets[i]:offsets[i + 1]].tolist()) for i in range(len(src))]
    assert got == want


@settings(max_examples=30, deadline=None)
@given(paths=st.lists(st.lists(st.integers(0, 40), max_size=5), max_size=30),
       earlier=st.lists(st.lists(st.integers(0, 40), min_size=1, max_size=5), max_size=5))
def test_builder_routes_numbers_as_route_does(paths, earlier):
    topo = _fabric([])
    coll = make_collective("a", K.ALLTOALL, topo, tuple(range(4)), size=64)
    one, bulk = (ScheduleBuilder(coll, input=[4] * 4, output=[4] * 4) for _ in range(2))
    for b in (one, bulk):
        for p in earlier:
            b.route(p)
        b.add_routes(np.array([0, 2]), np.array([7, 8]))    # not deduplicated: never matched
    want = [one.route(p) for p in paths]
    offsets = np.concatenate([[0], np.cumsum([len(p) for p in paths])]).astype(np.int64)
    links = np.array([x for p in paths for x in p], dtype=np.int32)
    assert bulk.routes(offsets, links).tolist() == want
    # and afterwards both builders hold the same table and know the same paths
    assert [bulk.route(p) for p in paths + earlier] == [one.route(p) for p in paths + earlier]
    a, b = one.build("x").routes, bulk.build("x").routes
    np.testing.assert_array_equal(a.offsets, b.offsets)
    np.testing.assert_array_equal(a.links, b.links)


_LINK = st.one_of(st.integers(0, 6), st.integers(0, 10 ** 6))


@settings(max_examples=80, deadline=None)
@given(tables=st.lists(st.lists(st.lists(_LINK, max_size=4), max_size=12),
                       min_size=1, max_size=3),
       collide=st.booleans(), one_empty=st.booleans(), block=st.sampled_from([1, 3, 1 << 20]),
       ends_table=st.sampled_from([0, 1 << 27]))
def test_intern_paths_numbers_first_occurrences(tables, collide, one_empty, block, ends_table):
    """Against a dictionary of tuples; with every hash equal (all paths collide), the exact
    packed sort takes over and gives the same numbering. Links drawn from a wide range and
    one empty path (``one_empty``: only the first table starts with it) give tables whose
    paths all differ in their ends, numbered without hashing (their ends read ``block``
    paths at a time, marked in a table of flags or, with ``ends_table`` 0, sorted)."""
    tables = [[[]] + paths if i == 0 or not one_empty else paths
              for i, paths in enumerate(tables)]
    pieces = []
    for paths in tables:
        offsets = np.concatenate([[0], np.cumsum([len(p) for p in paths])]).astype(np.int64)
        pieces.append((offsets, np.array([x for p in paths for x in p], dtype=np.int32)))
    table: dict[tuple[int, ...], int] = {(): 0}
    want_ids, want_firsts = [], [0]
    for row, path in enumerate(tuple(p) for paths in tables for p in paths):
        if path not in table:
            table[path] = len(table)
            want_firsts.append(row)
        want_ids.append(table[path])
    n = sum(len(o) - 1 for o, _ in pieces)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(ir, "_ENDS_BLOCK", block)
        m.setattr(ir, "_ENDS_TABLE", ends_table)
        ids, firsts = intern_paths(pieces, np.zeros(n, dtype=np.uint64) if collide else None)
    assert ids.tolist() == want_ids
    assert firsts.tolist() == want_firsts
    offsets, links = csr_take_pieces(pieces, firsts)
    assert [tuple(links[offsets[i]:offsets[i + 1]].tolist()) for i in range(len(firsts))] == \
        list(table)


@settings(max_examples=60, deadline=None)
@given(paths=st.lists(st.lists(_LINK, max_size=5), min_size=1, max_size=20),
       picks=st.lists(st.integers(0, 10 ** 6), max_size=25),
       order=st.sampled_from(["any", "increasing", "sorted"]), into=st.booleans(),
       block=st.sampled_from([1, 2, 1 << 20]))
def test_csr_take_is_the_paths_taken(paths, picks, order, into, block):
    """Rows in any order, sorted with repeats, and increasing (taken through a mask over the
    links): the paths of those rows, as lists of tuples say; ``into``: written into a slice
    of a larger array, which is what it returns, and nothing outside the slice changes; rows
    gathered ``block`` at a time, links through a mask ``3 block`` at a time."""
    offsets = np.concatenate([[0], np.cumsum([len(p) for p in paths])]).astype(np.int64)
    links = np.array([x for p in paths for x in p], dtype=np.int32)
    rows = np.array([k % len(paths) for k in picks], dtype=np.int64)
    if order != "any":
        rows = np.unique(rows) if order == "increasing" else np.sort(rows)
    n = int(sum(len(paths[r]) for r in rows.tolist()))
    buffer = np.full(n + 4, -7, dtype=np.int32)
    view = buffer[2:2 + n]
    with pytest.MonkeyPatch.context() as m:
        m.setattr(ir, "_TAKE_BLOCK", block)
        m.setattr(ir, "_MASK_BLOCK", 3 * block)
        new_offs, new_links = csr_take(offsets, links, rows, out=view if into else None)
    if into:
        assert new_links is view
        assert (buffer[:2] == -7).all() and (buffer[2 + n:] == -7).all()
    assert new_links.dtype == np.int32
    assert [tuple(new_links[new_offs[i]:new_offs[i + 1]].tolist()) for i in range(len(rows))] \
        == [tuple(paths[r]) for r in rows.tolist()]


@settings(max_examples=100, deadline=None)
@given(runs=st.lists(st.tuples(st.integers(0, 50), st.integers(0, 4)), max_size=20))
def test_run_positions_are_each_runs_range(runs):
    starts = np.array([s for s, _ in runs], dtype=np.int64)
    lengths = np.array([n for _, n in runs], dtype=np.int64)
    want = [s + k for s, n in runs for k in range(n)]
    assert run_positions(starts, lengths).tolist() == want


@pytest.mark.parametrize("block", [1, 3, 1 << 22])
@pytest.mark.parametrize("algo, dims", [("direct", (3, 4)), ("bruck", (5,)), ("ring", (4, 2))])
def test_op_links_are_every_ops_route_in_order(algo, dims, block, monkeypatch):
    """The (op, link) pairs, gathered a block of ops at a time: each op's route, op by op."""
    monkeypatch.setattr(ir, "_GATHER_OPS", block)
    t = torus("t", dims, bandwidth=25e9, latency=1e-7)
    kind = K.ALLGATHER if algo == "ring" else K.ALLTOALL
    s = get(algo).build(make_collective("c", kind, t, t.all_ranks(), size=t.n_ranks * 4 * 96))
    pair_op, pair_link = s.op_links()
    offs, links = s.routes.offsets, s.routes.links
    want = [(op, int(x)) for op, r in enumerate(s.ops.route.tolist())
            for x in links[offs[r]:offs[r + 1]]]
    assert list(zip(pair_op.tolist(), pair_link.tolist(), strict=True)) == want
    # in 32 bits, as the route table's links are (op ids: where they fit)
    assert pair_op.dtype == pair_link.dtype == np.int32
