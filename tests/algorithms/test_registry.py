"""The algorithm table: every entry carries all its rules, and a new algorithm is one module
plus one registration (here a toy one, defined, registered, compiled and removed in this file).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from cclc import serialize
from cclc.algorithms import (
    REGISTRY,
    Algorithm,
    NoBound,
    every_rank_ops,
    get,
    register,
    unregister,
)
from cclc.algorithms.common import add_pair_routes, pair_hops
from cclc.algorithms.pair_traffic import pair_traffic
from cclc.budget import MAX_OPS
from cclc.collective import Collective, CollectiveKind, make_collective
from cclc.errors import CclError
from cclc.ir import Buf, Schedule, ScheduleBuilder
from cclc.link_traffic import Traffic, traffic_rows
from cclc.pipeline import Request, compile_source
from cclc.topology import torus
from cclc.verify import verify

# -- every entry has its rules --------------------------------------------------------------


def _small(kind: CollectiveKind) -> Collective:
    t = torus("t", (4, 4))
    n = t.n_ranks
    root = 0 if kind in (CollectiveKind.BROADCAST, CollectiveKind.REDUCE) else None
    return make_collective("c", kind, t, t.all_ranks(), size=n * n * 4 * 8, root=root)


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_entry_states_its_op_count_and_its_load_bound(name):
    entry = get(name)
    assert callable(entry.ops), f"{name}: no op-count rule"
    assert callable(entry.load) or isinstance(entry.load, NoBound), f"{name}: no load rule"
    if isinstance(entry.load, NoBound):
        assert entry.load.reason, f"{name}: a NoBound must say why"
    # a merged entry dispatches on the kind: each kind it serves answers both rules
    for kind in entry.collectives:
        coll = _small(kind)
        if entry.applicable(coll) is not None:
            continue
        assert entry.min_ops(coll) >= every_rank_ops(coll)
        got = entry.traffic(coll)
        assert isinstance(got, (Traffic, NoBound)), f"{name} on {kind.value}: {got!r}"
        if isinstance(got, NoBound):
            assert got.reason


def test_an_entry_without_its_rules_cannot_be_made():
    with pytest.raises(TypeError, match="ops|load"):
        Algorithm("norules", frozenset({CollectiveKind.ALLGATHER}),  # type: ignore[call-arg]
                  lambda c, **p: None, lambda c, **p: None)


# -- a toy algorithm: one module's worth, and one registration ------------------------------

def _shifted_applicable(coll: Collective, **params) -> str | None:
    if params:
        return f"shifted takes no parameters (got {', '.join(params)})"
    return None


def _shifted_pairs(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    # step s - 1: rank i sends its block to rank i + s
    src = np.tile(np.arange(n), n - 1)
    shift = np.repeat(np.arange(1, n), n)
    return src, (src + shift) % n, shift - 1


def _shifted_build(coll: Collective, **params) -> Schedule:
    """AllGather: in step ``s - 1`` every rank sends its block ``s`` ranks on."""
    n, block = coll.n, coll.count // coll.n
    b = ScheduleBuilder(coll, input=[block], output=[block] * n)
    ranks = np.arange(n)
    b.add(step=0, src=ranks, dst=ranks, src_buf=Buf.INPUT, src_off=0, dst_buf=Buf.OUTPUT,
          dst_off=ranks)
    src, dst, step = _shifted_pairs(n)
    routes = add_pair_routes(b, coll, src, dst)
    b.add(step=step, src=src, dst=dst, route=routes, src_buf=Buf.INPUT, src_off=0,
          dst_buf=Buf.OUTPUT, dst_off=src)
    return b.build("shifted")


def _shifted_load(coll: Collective, **params) -> Traffic:
    src, dst, _ = _shifted_pairs(coll.n)
    nbytes = np.full(len(src), coll.count // coll.n * coll.dtype.itemsize)
    t = pair_traffic(coll, src, dst, nbytes)
    # every step's bytes counted in one step: a lower bound on the busiest link's share
    return traffic_rows(0, t.link, t.nbytes)


SHIFTED = Algorithm(
    name="shifted", collectives=frozenset({CollectiveKind.ALLGATHER}),
    applicable=_shifted_applicable, build=_shifted_build,
    ops=lambda coll, **params: pair_hops(coll), load=_shifted_load,
    description="a test's toy: every rank sends its block s ranks on in step s - 1")

# a mesh: no translations, so auto plans the whole schedule alone (on a torus it also plans
# the form stored by symmetry, which is faster here)
SOURCE = """\
topology ring = mesh(6) { link 10 GB/s, 1 us }
collective ag = allgather on ring { size 6 MiB; algorithm shifted }
"""


@pytest.fixture
def shifted():
    register(SHIFTED)                   # the one line a new algorithm module adds
    try:
        yield get("shifted")
    finally:
        unregister("shifted")
    assert get("shifted") is None


def test_a_registered_toy_algorithm_compiles_through_the_pipeline(tmp_path, shifted):
    (r,) = compile_source(SOURCE, tmp_path / "out", Request(emit=("json",), explain=True))
    assert r.plan is not None and r.plan.name == "shifted"
    written = serialize.load(tmp_path / "out" / "ag.schedule.json")
    verify(written)
    # five steps, cut into sub-steps where relay lowering relays the longer routes
    assert written.n_steps >= 5 and written.algorithm == "shifted"
    # explain: every other entry serving the collective is evaluated beside it
    assert {"shifted", "ring", "direct"} <= {c.name for c in r.plan.candidates}


def test_the_toy_is_a_candidate_of_auto_and_its_op_count_drives_the_size_check(
        tmp_path, shifted):
    auto = SOURCE.replace("; algorithm shifted", "")
    (r,) = compile_source(auto, tmp_path / "a", Request(emit=("json",)))
    rows = {c.name: c for c in r.plan.candidates}
    # its load bound is in the table, below its time; the entries without one say why
    assert rows["shifted"].estimate is not None
    assert rows["shifted"].time is None \
        or rows["shifted"].estimate <= rows["shifted"].time * (1 + 1e-12)
    assert rows["synth"].no_bound is not None and rows["synth"].estimate is None
    # an entry that claims more ops than the size check allows is refused up front, by name
    unregister("shifted")
    register(dataclasses.replace(SHIFTED, ops=lambda coll, **params: MAX_OPS + 1))
    with pytest.raises(CclError, match="its shifted schedule alone has at least"):
        compile_source(SOURCE, tmp_path / "b", Request(emit=("json",)))
