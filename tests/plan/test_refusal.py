"""``auto`` and the outputs' refusals: a candidate the requested outputs refuse is ranked after
every one they take (issue 17), so a compile writes every output when some candidate fits."""

from __future__ import annotations

import pytest

from backends.msccl import render_xml
from backends.units import UnitsTooLong, buffer_units, to_units, units_refusal
from cclc.algorithms import get
from cclc.collective import CollectiveKind, Hint, make_collective
from cclc.errors import ScheduleError
from cclc.plan import plan
from cclc.topology import torus


def _coll(kind=CollectiveKind.ALLGATHER, n=8, size=None):
    topo = torus("t", (n,), bandwidth=10e9, latency=1e-6)
    return make_collective("c", kind, topo, topo.all_ranks(), size=size or 4 * n * 4096,
                           algorithm=Hint("auto"), schedule=Hint("auto"))


def _times(p):
    return {c.name: c.time for c in p.candidates if c.applicable and c.time is not None}


def test_a_refused_winner_gives_way_to_the_fastest_taken():
    for kind in (CollectiveKind.ALLGATHER, CollectiveKind.REDUCESCATTER):
        coll = _coll(kind)
        free = plan(coll, prune=False)
        times = _times(free)
        fastest = free.schedule.algorithm

        p = plan(coll, prune=False,
                 refusal=lambda s, f=fastest: "no" if s.algorithm == f else None)
        rest = {name: t for name, t in times.items()
                if get(name).build(coll).algorithm != fastest}
        assert p.schedule.algorithm != fastest
        assert p.time == min(rest.values())          # the fastest of the others
        refused = [c for c in p.candidates if c.refused is not None]
        assert refused and all(c.refused == "no" for c in refused)


def test_the_outputs_are_asked_of_the_fastest_only():
    # the MSCCL output lowers what it is asked about: asking every candidate that became the
    # fastest so far lowered schedules that then lost
    coll = _coll(CollectiveKind.ALLREDUCE)
    asked = []
    p = plan(coll, prune=False, refusal=lambda s: asked.append(s.algorithm))
    assert asked == [p.schedule.algorithm]


def test_the_schedule_asked_about_is_the_one_planned(monkeypatch):
    # the fastest may be moved out of memory while later candidates are built: the outputs
    # are asked of the schedule the plan returns (MSCCL keeps its lowering by identity)
    import cclc.spill

    monkeypatch.setattr(cclc.spill, "KEEP_BEST_OPS", 0)
    for refuse_first in (False, True):
        asked = []

        def refusal(s, refuse_first=refuse_first, asked=asked):
            asked.append(s)
            return "no" if refuse_first and len(asked) == 1 else None
        p = plan(_coll(CollectiveKind.ALLREDUCE), prune=False, refusal=refusal)
        assert asked[-1] is p.schedule
        assert len(asked) == 1 + refuse_first


def test_pruned_candidates_that_could_beat_the_next_are_evaluated():
    # pruning against the fastest's time, which the outputs then refuse, must not lose the
    # candidate the outputs take: the same choice as without pruning
    for kind in (CollectiveKind.ALLGATHER, CollectiveKind.REDUCESCATTER,
                 CollectiveKind.ALLREDUCE):
        coll = _coll(kind)
        fastest = plan(coll).schedule.algorithm
        refuse = lambda s, f=fastest: "no" if s.algorithm == f else None  # noqa: E731
        pruned, unpruned = plan(coll, refusal=refuse), plan(coll, prune=False, refusal=refuse)
        assert pruned.schedule.algorithm == unpruned.schedule.algorithm != fastest
        assert pruned.time == unpruned.time
        assert refuse(pruned.schedule) is None


def test_everything_refused_keeps_the_fastest():
    coll = _coll()
    free = plan(coll, prune=False)
    p = plan(coll, prune=False, refusal=lambda s: "never")
    assert p.time == free.time and p.schedule.algorithm == free.schedule.algorithm


def test_no_refusal_same_choice():
    coll = _coll(CollectiveKind.ALLREDUCE)
    assert plan(coll).time == plan(coll, refusal=lambda s: None).time


def test_units_refusal_agrees_with_to_units():
    # k * C chunks that do not divide a block: the gcd with the count is one element
    for kind in (CollectiveKind.ALLGATHER, CollectiveKind.REDUCESCATTER):
        coll = _coll(kind, size=4 * 8 * 4096)
        for chunks in (4, 7):
            s = get("synth").build(coll, chunks=chunks, trees=1, race=0)
            for limit in (64, 10**9):
                why = units_refusal(s, limit)
                # the reference: the unit form the MSCCL lowering starts from
                try:
                    units, _ = to_units(s, limit)
                    refused = max(buffer_units(units)) > limit
                except UnitsTooLong:
                    refused = True
                assert (why is not None) == refused, (kind, chunks, limit)
                if chunks == 4:
                    assert why is None               # 4 chunks divide every block
    s = get("synth").build(_coll(CollectiveKind.REDUCESCATTER), chunks=7, trees=1, race=0)
    assert units_refusal(s, 64) is not None          # receive slots of two sizes


def _asking(*names):
    """The pipeline's refusal check of the outputs ``names`` with the default options."""
    from backends import load
    from backends.contract import EmitOptions
    from cclc.pipeline import _refusal

    return _refusal([load(name) for name in names], EmitOptions())


def test_the_pipeline_asks_the_requested_outputs():
    coll = _coll(CollectiveKind.REDUCESCATTER)
    uneven = get("synth").build(coll, chunks=7, trees=1, race=0)
    even = get("synth").build(coll, chunks=4, trees=1, race=0)
    assert _asking("json")(uneven) is None                    # json takes every schedule
    ask = _asking("json", "msccl")
    assert ask(even) is None
    assert render_xml(even)                                    # the writer takes it too
    # 7 chunks of 4096 elements: receive slots of two sizes, gcd 1, 33939 chunks per buffer
    assert "33939" in ask(uneven)
    with pytest.raises(ScheduleError, match="equal chunks"):
        render_xml(uneven)                                     # what the refusal foretells


def test_auto_asked_for_msccl_chooses_what_msccl_writes():
    ask = _asking("json", "msccl")
    for kind in (CollectiveKind.ALLGATHER, CollectiveKind.REDUCESCATTER,
                 CollectiveKind.ALLREDUCE):
        p = plan(_coll(kind, size=4 * 8 * 4099), refusal=ask)   # blocks of 4099 elements
        assert ask(p.schedule) is None
        assert render_xml(p.schedule)


def test_counted_refusal_foretells_the_lowering():
    # 1024 chunks per block: every GPU sends and receives thousands of messages, more <step>
    # nodes than the runtimes' parsers read; counting says so without lowering
    from backends.contract import EmitOptions
    from backends.msccl import BACKEND
    from backends.msccl.lower import LimitError

    coll = _coll(CollectiveKind.ALLGATHER, size=4 * 8 * 8192)
    big = get("synth").build(coll, chunks=1024, trees=1, race=0)
    why = BACKEND.refusal(big, EmitOptions())
    assert why is not None and "<step> nodes" in why
    with pytest.raises(LimitError, match="<step> nodes"):
        render_xml(big)
    small = get("synth").build(coll, chunks=4, trees=1, race=0)
    assert BACKEND.refusal(small, EmitOptions()) is None
    assert render_xml(small)


def test_every_schedule_is_lowered_to_ask(monkeypatch):
    # limits only the lowering finds (threadblock waits, int8 dependency ids) refuse a
    # schedule whatever its op count
    import backends.msccl as M
    from backends.contract import EmitOptions
    from backends.msccl.lower import LimitError

    s = get("synth").build(_coll(CollectiveKind.ALLGATHER), chunks=4, trees=1, race=0)

    def refuse(*args, **kwargs):
        raise LimitError("waits on threadblock 132")
    monkeypatch.setattr(M, "lower_to_fit", refuse)
    assert M.BACKEND.refusal(s, EmitOptions()) == "waits on threadblock 132"


def test_the_lowering_asked_about_is_the_one_rendered(monkeypatch):
    import backends.msccl as M
    from backends.contract import EmitOptions

    s = get("synth").build(_coll(CollectiveKind.ALLGATHER), chunks=4, trees=1, race=0)
    calls = []
    lower = M.lower_to_fit

    def counted(*args, **kwargs):
        calls.append(1)
        return lower(*args, **kwargs)
    monkeypatch.setattr(M, "lower_to_fit", counted)
    assert M.BACKEND.refusal(s, EmitOptions()) is None
    assert render_xml(s)
    assert len(calls) == 1


TORUS_4X4X4 = ("topology t = torus(4, 4, 4) {\n    link 32 GB/s, 100 ns\n"
               "    routing none\n    fault link (0,0,0) -- (1,0,0)\n"
               "    fault link (2,1,3) -- (2,2,3)\n}\n"
               "collective a2a = alltoall on t { size 64 MiB }\n")


@pytest.mark.slow  # synthesis of a 64-rank AllToAll: a minute or more
def test_a_4x4x4_torus_whose_synthesized_alltoall_msccl_refuses_writes_its_xml(tmp_path):
    # the synthesized schedule (over 100k ops) waits on more threadblocks than microsoft/msccl's
    # int8 dependentBid names: only its lowering shows it, and auto asks the lowering whatever
    # the op count, so it chooses a schedule the XML takes
    from cclc.cli import main

    source = tmp_path / "t.ccl"
    source.write_text(TORUS_4X4X4, encoding="utf-8")
    out = tmp_path / "out"
    assert main(["compile", str(source), "-o", str(out), "--emit", "json,msccl"]) == 0
    assert (out / "a2a.msccl.xml").is_file() and (out / "a2a.schedule.json").is_file()


@pytest.mark.slow  # synthesis of a 64-rank AllToAll: a minute or more
def test_the_4x4x4_torus_writes_its_mscclpp_plans(tmp_path):
    # the same case asked for MSCCL++ plans: auto lowers every candidate it ranks, so the
    # compile ends with both plans written (port channels on a torus: no LL plans)
    import json

    from backends.mscclpp.executor import run
    from cclc.cli import main

    source = tmp_path / "t.ccl"
    source.write_text(TORUS_4X4X4, encoding="utf-8")
    out = tmp_path / "out"
    assert main(["compile", str(source), "-o", str(out), "--emit", "json,mscclpp"]) == 0
    for name in ("a2a.mscclpp.json", "a2a.inplace.mscclpp.json"):
        plan = json.loads((out / name).read_text())
        assert len(plan["gpus"]) == 64
        run(plan, seeds=1)
