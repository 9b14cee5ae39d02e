"""cclc.sorting against numpy's own: ``stable_argsort`` is ``np.argsort(kind="stable")``
exactly, ``equal_runs_order`` puts equal hashes together in index order (keys drawn to share
their high bits, so the repair of mixed runs is exercised), ``first_occurrence_ids`` is
``np.unique`` renumbered by first index; and ``intern_paths``, which groups paths with them,
against a dictionary when its hash is coarse."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cclc.ir import intern_paths
from cclc.sorting import equal_runs_order, first_occurrence_ids, lexsort_ints, stable_argsort

_INTS = st.one_of(st.integers(-5, 5), st.integers(0, 2 ** 20), st.integers(-2 ** 63, 2 ** 63 - 1),
                  # about the edge of the 16-bit range sorted by radix
                  st.integers(2 ** 16 - 3, 2 ** 16 + 3), st.integers(-2 ** 15 - 2, -2 ** 15 + 2))


@settings(max_examples=200, deadline=None)
@given(values=st.lists(_INTS, max_size=60),
       dtype=st.sampled_from([np.int64, np.int32, np.int8, np.uint8, np.uint64]))
def test_stable_argsort_is_numpys(values, dtype):
    info = np.iinfo(dtype)
    keys = np.array([min(max(v, info.min), info.max) for v in values], dtype=dtype)
    got = stable_argsort(keys)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, np.argsort(keys, kind="stable"))


def test_stable_argsort_wide_unsigned_and_refusal():
    keys = np.array([2 ** 64 - 1, 0, 2 ** 63, 0, 5], dtype=np.uint64)     # no room: numpy's
    np.testing.assert_array_equal(stable_argsort(keys), np.argsort(keys, kind="stable"))
    with pytest.raises(ValueError, match="1-D integer"):
        stable_argsort(np.zeros(3))


@settings(max_examples=200, deadline=None)
@given(high=st.lists(st.integers(0, 3), max_size=80), low=st.lists(st.integers(0, 3), max_size=80),
       shift=st.sampled_from([0, 1, 40, 58, 60, 63]))
def test_equal_runs_order_groups_equal_keys_in_index_order(high, low, shift):
    n = min(len(high), len(low))
    # keys that often share every bit above the index bits but differ below them
    keys = (np.array(high[:n], dtype=np.uint64) << np.uint64(shift)) \
        | np.array(low[:n], dtype=np.uint64)
    order = equal_runs_order(keys)
    assert sorted(order.tolist()) == list(range(n))
    k = keys[order]
    # every key's entries form one run, in increasing index
    starts = np.flatnonzero(np.concatenate([[True], k[1:] != k[:-1]])).tolist() if n else []
    assert len(starts) == len(set(keys.tolist()))
    for lo, hi in zip(starts, (starts + [n])[1:], strict=True):
        run = order[lo:hi]
        assert (np.diff(run) > 0).all()
        np.testing.assert_array_equal(run, np.flatnonzero(keys == k[lo]))


@settings(max_examples=200, deadline=None)
@given(values=st.lists(_INTS, max_size=60), order=st.sampled_from(["any", "increasing", "sorted"]))
def test_first_occurrence_ids_is_unique_by_first_index(values, order):
    """Keys in any order, sorted with repeats, and strictly increasing (numbered unsorted)."""
    if order != "any":
        values = sorted(set(values)) if order == "increasing" else sorted(values)
    keys = np.array(values, dtype=np.int64)
    ids, firsts = first_occurrence_ids(keys)
    seen: dict[int, int] = {}
    want = [seen.setdefault(v, len(seen)) for v in values]
    assert ids.tolist() == want
    assert firsts.tolist() == [values.index(v) for v in seen]


@settings(max_examples=150, deadline=None)
@given(tables=st.lists(st.lists(st.lists(st.integers(0, 3), max_size=3), max_size=10),
                       min_size=1, max_size=3))
def test_intern_paths_with_coarse_hashes(tables):
    """``intern_paths`` grouped by a hash as coarse as a path's length: equal paths share
    it, unequal ones often do too, so its check of every path against its group's first
    (link by link, across pieces) decides both ways; against a dictionary of tuples."""
    pieces, table, want_ids, want_firsts = [], {(): 0}, [], [0]
    for paths in tables:
        paths = [[]] + paths
        offsets = np.concatenate([[0], np.cumsum([len(p) for p in paths])]).astype(np.int64)
        pieces.append((offsets, np.array([x for p in paths for x in p], dtype=np.int32)))
    rows = [tuple(p) for paths in tables for p in [[]] + paths]
    for row, path in enumerate(rows):
        if path not in table:
            table[path] = len(table)
            want_firsts.append(row)
        want_ids.append(table[path])
    coarse = np.array([len(p) for p in rows], dtype=np.uint64)
    ids, firsts = intern_paths(pieces, coarse)
    assert ids.tolist() == want_ids
    assert firsts.tolist() == want_firsts


_KEY = st.one_of(st.integers(0, 3), st.integers(-3, 3), st.integers(0, 2 ** 40),
                 st.just(7), st.booleans())


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 40).flatmap(lambda n: st.lists(
    st.lists(_KEY, min_size=n, max_size=n), min_size=1, max_size=4)))
def test_step_order_islexsort_ints(columns):
    """numpy's lexsort (the planned routing's order of a step's flows), ties in index order."""
    keys = tuple(np.array(c, dtype=np.int64) for c in columns)
    assert np.array_equal(lexsort_ints(keys), np.lexsort(keys))
