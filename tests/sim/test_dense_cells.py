"""The simulator's dense (step, link) table against the sorted one it replaces above a size, and
its passes over the (op, link) pairs a block at a time against one pass over them all."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cclc.sim as sim
from cclc.algorithms import get
from cclc.collective import CollectiveKind, make_collective
from cclc.topology import torus, with_faults

FIELDS = ("link_bytes", "link_busy", "step_start", "step_time", "step_bytes", "op_start",
          "op_finish")


def _faulty_alltoall(algo: str, dims: tuple[int, ...]):
    """``algo``'s alltoall on a torus with one failed cable."""
    t = torus("t", dims, bandwidth=25e9, latency=1e-7)
    a, b = t.rank_at((1,) * len(dims)), t.rank_at((2,) + (1,) * (len(dims) - 1))
    t = with_faults(t, links=[(a, b), (b, a)])
    c = make_collective("c", CollectiveKind.ALLTOALL, t, t.all_ranks(), size=t.n_ranks * 4 * 96)
    return get(algo).build(c)


@pytest.mark.parametrize("algo, dims", [("direct", (3, 4)), ("mate", (4, 4)), ("bruck", (5,)),
                                        ("line+pipeline", (4, 3))])
@pytest.mark.parametrize("mode", ["lockstep", "event"])
def test_dense_and_sorted_tables_give_the_same_result(algo, dims, mode, monkeypatch):
    s = _faulty_alltoall(algo, dims)
    dense = sim.simulate(s, mode=mode)
    monkeypatch.setattr(sim, "_DENSE_CELLS", 0)
    sorted_ = sim.simulate(s, mode=mode)
    assert dense.time == sorted_.time
    for field in FIELDS:
        assert np.array_equal(getattr(dense, field), getattr(sorted_, field)), field
    assert dense.step_busiest_link == sorted_.step_busiest_link
    assert dense.critical_path == sorted_.critical_path


@pytest.mark.parametrize("algo, dims", [("direct", (3, 4)), ("direct", (3, 2, 3)),
                                        ("mate", (4, 4)), ("bruck", (5,))])
@pytest.mark.parametrize("mode", ["lockstep", "event"])
@pytest.mark.parametrize("block", [1, 5, 64])
def test_pairs_gathered_in_blocks_give_the_same_result(algo, dims, mode, block, monkeypatch):
    """Route latencies and cell bytes summed a block of pairs at a time, to the bit."""
    s = _faulty_alltoall(algo, dims)
    whole = sim.simulate(s, mode=mode)
    monkeypatch.setattr(sim, "_PAIR_BLOCK", block)
    blocked = sim.simulate(s.replace(), mode=mode)
    assert whole.time == blocked.time
    for field in FIELDS:
        assert np.array_equal(getattr(whole, field), getattr(blocked, field)), field


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 6), max_size=40), st.integers(1, 9))
def test_op_blocks_cover_the_pairs_and_split_no_op(lengths, block):
    pair_op = np.repeat(np.arange(len(lengths)), lengths)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(sim, "_PAIR_BLOCK", block)
        blocks = sim._op_blocks(pair_op)
    assert [lo for lo, _ in blocks[1:]] == [hi for _, hi in blocks[:-1]]
    assert (blocks[0][0], blocks[-1][1]) == (0, len(pair_op)) if len(pair_op) else blocks == []
    for lo, hi in blocks:
        assert hi > lo
        assert lo == 0 or pair_op[lo] != pair_op[lo - 1]
