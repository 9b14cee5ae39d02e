"""The torus lowering's run coalescing against a brute-force merge of sorted rows."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from cclc.algorithms.torus_alltoall.lowering import _coalesce

KEYS = ("step", "src", "dst", "route", "src_buf", "dst_buf", "src_off")


def brute_force(rows: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """Sort by the keys (stable), then extend a run while the next row continues it."""
    idx = {k: i for i, k in enumerate(KEYS + ("dst_off",))}
    out: list[list[int]] = []
    for r in sorted(rows, key=lambda r: tuple(r[idx[k]] for k in KEYS)):
        if out:
            last = out[-1]
            same = all(r[idx[k]] == last[idx[k]] for k in KEYS[:-1])
            if (same and r[idx["src_off"]] == last[idx["src_off"]] + last[-1]
                    and r[idx["dst_off"]] == last[idx["dst_off"]] + last[-1]):
                last[-1] += 1
                continue
        out.append(list(r) + [1])
    return [tuple(r) for r in out]


def run(rows: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
    a = np.array(rows, dtype=np.int64).reshape(-1, 8)
    cols = {k: a[:, i] for i, k in enumerate(KEYS + ("dst_off",))}
    cols["hop"] = np.zeros(len(a), dtype=np.int64)
    got = _coalesce(cols)
    order = KEYS + ("dst_off", "count")
    return [tuple(int(got[k][i]) for k in order) for i in range(len(got["count"]))]


def rows_strategy(wide: bool):
    big = 2**31 - 1 if wide else 3
    small = st.integers(0, 3)
    return st.lists(st.tuples(small, st.integers(0, big), small, st.integers(0, big), small,
                              small, st.integers(0, 6), st.integers(0, 6)), max_size=60)


@settings(max_examples=150, deadline=None)
@given(rows_strategy(wide=False))
def test_coalesce_matches_brute_force(rows):
    assert run(rows) == brute_force(rows)


@settings(max_examples=50, deadline=None)
@given(rows_strategy(wide=True))
def test_coalesce_of_rows_too_wide_to_pack(rows):
    # src and route up to 2^31 each: the packed key would need more than 62 bits
    assert run(rows) == brute_force(rows)


def test_runs_merge_and_break():
    rows = [(0, 1, 2, 5, 0, 2, k, 10 + k) for k in (3, 1, 2, 0)]      # one run of 4
    rows += [(0, 1, 2, 5, 0, 2, 4, 20)]                                # dst_off jumps
    rows += [(1, 1, 2, 5, 0, 2, 5, 21)]                                # next step
    assert run(rows) == [(0, 1, 2, 5, 0, 2, 0, 10, 4), (0, 1, 2, 5, 0, 2, 4, 20, 1),
                         (1, 1, 2, 5, 0, 2, 5, 21, 1)]


def test_wide_rows_take_the_unpacked_path():
    from cclc.algorithms.torus_alltoall.lowering import _packed_key

    top = 2**31 - 1
    rows = [(0, s, 0, r, 0, 2, k, k) for s in (0, top) for r in (top, 0) for k in (1, 0, 2)]
    a = np.array(rows, dtype=np.int64)
    assert _packed_key([a[:, i] for i in range(7)]) is None
    assert run(rows) == brute_force(rows)
    assert len(run(rows)) == 4


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 99)), max_size=20),
                min_size=1, max_size=5))
def test_merge_by_step_is_a_stable_sort_of_the_concatenation(batches):
    from cclc.algorithms.torus_alltoall.lowering import _merge_by_step

    cols = []
    for rows in batches:
        a = np.array(sorted(rows, key=lambda r: r[0]), dtype=np.int64).reshape(-1, 2)
        cols.append({"step": a[:, 0], "src_off": a[:, 1], "hop": a[:, 1]})
    got = _merge_by_step(cols)
    assert set(got) == {"step", "src_off"}
    step = np.concatenate([c["step"] for c in cols])
    order = np.argsort(step, kind="stable")
    assert np.array_equal(got["step"], step[order])
    assert np.array_equal(got["src_off"], np.concatenate([c["src_off"] for c in cols])[order])
