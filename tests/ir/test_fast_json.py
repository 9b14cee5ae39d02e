"""The numpy-formatted schedule document against :mod:`json` (the reference): byte for byte."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from cclc import serialize
from cclc.algorithms import get
from cclc.collective import CollectiveKind, make_collective
from cclc.serialize import document_pieces, dumps, from_json, int_array_json, save, to_json
from cclc.topology import torus, with_faults


def _reference(a: np.ndarray) -> bytes:
    return json.dumps(a.tolist(), separators=(",", ":")).encode()


@settings(max_examples=200, deadline=None)
@given(hnp.arrays(st.sampled_from([np.int8, np.int16, np.int32, np.int64, np.uint8,
                                   np.uint32, np.uint64, np.bool_]),
                  hnp.array_shapes(min_dims=1, max_dims=2, min_side=0, max_side=40)))
def test_int_arrays_are_written_as_json_writes_them(a):
    assert int_array_json(a) == _reference(a)


def test_extremes_and_every_digit_count():
    for dtype in (np.int8, np.int32, np.int64, np.uint64):
        info = np.iinfo(dtype)
        a = np.array([v for v in (info.min, info.max, 0, 1, 9, 10, 99, 100, 999, 1000)
                      if info.min <= v <= info.max], dtype=dtype)
        assert int_array_json(a) == _reference(a)
    powers = np.array([10 ** k + d for k in range(18) for d in (-1, 0, 1)], dtype=np.int64)
    assert int_array_json(powers) == _reference(powers)
    assert int_array_json(-powers) == _reference(-powers)


def test_batches_join_with_commas(monkeypatch):
    import cclc.serialize as ser

    monkeypatch.setattr(ser, "_INT_BATCH", 7)
    a = np.arange(-30, 30, dtype=np.int32) * 12345
    assert int_array_json(a) == _reference(a)


def test_floats_are_refused():
    with pytest.raises(ValueError):
        int_array_json(np.zeros(3))


@pytest.mark.parametrize("batch", [None, 7])
@pytest.mark.parametrize("algo, dims, fault", [("direct", (3, 3), True), ("mate", (4, 4), True),
                                               ("ring", (5,), False), ("bruck", (2, 3), False)])
def test_the_document_is_what_json_dumps_writes(algo, dims, fault, batch, tmp_path,
                                                monkeypatch):
    if batch is not None:
        # columns of many batches: formatted by the threads, in order, batch by batch
        monkeypatch.setattr(serialize, "_INT_BATCH", batch)
    t = torus("t", dims, bandwidth=25e9, latency=1e-7)
    if fault:
        a, b = t.rank_at((1,) * len(dims)), t.rank_at((2,) + (1,) * (len(dims) - 1))
        t = with_faults(t, links=[(a, b), (b, a)])
    kind = CollectiveKind.ALLGATHER if algo == "ring" else CollectiveKind.ALLTOALL
    c = make_collective("c\u00e9 \"x\"", kind, t, t.all_ranks(), size=t.n_ranks * 4 * 96)
    s = get(algo).build(c)
    want = json.dumps(to_json(s), separators=(",", ":"), allow_nan=False).encode()
    assert dumps(s) == want
    assert b"".join(document_pieces(s)) == want
    save(s, tmp_path / "s.json")
    assert (tmp_path / "s.json").read_bytes() == want + b"\n"
    back = from_json(json.loads(want))
    assert all(np.array_equal(x, y) for x, y in zip(back.ops.columns().values(),
                                                     s.ops.columns().values(), strict=True))


@settings(max_examples=50, deadline=None)
@given(hnp.arrays(st.sampled_from([np.int8, np.int32, np.uint8]),
                  st.integers(1, 50), elements=st.integers(0, 9)))
def test_single_digit_columns(a):
    assert int_array_json(a) == _reference(a)
