"""cclc/symmetric_plan.py and its path through the pipeline: a collective the size check refuses
is planned stored by symmetry where auto can, written in that form by the JSON output, expanded
for an output that needs every rank's ops where that fits, and refused with the reason where not.

The size check is made to refuse a small torus (its estimate replaced), so the path runs in
milliseconds; the 4,096-rank compile itself is in tests/cli/test_runaway_inputs.py."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

import cclc.budget
import cclc.symmetric_plan
import dsl
from backends import load
from backends.contract import symmetric_refusal
from cclc.algorithms.torus_symmetric import symmetric_alltoall
from cclc.cli import main as cli_main
from cclc.collective import CollectiveKind, make_collective
from cclc.errors import CclError
from cclc.execution import IR_MODEL, MSCCL_MODEL
from cclc.pipeline import Request, compile_source
from cclc.plan import plan, resolve
from cclc.serialize import load as load_schedule
from cclc.serialize import read_document, symmetric_document_pieces
from cclc.sim import simulate
from cclc.symmetric import ExceptedSchedule, SymmetricSchedule, expand
from cclc.symmetric_check import verify_symmetric
from cclc.symmetric_faults import expand_excepted, verify_excepted
from cclc.symmetric_lines import verify_lined
from cclc.symmetric_plan import expand_form, plan_symmetric, symmetric_model, symmetric_reason
from cclc.topology import torus
from cclc.verify import verify

SOURCE = """topology t = torus(4, 4) {{
    link 50 GB/s, 100 ns{fault}
}}
collective a2a = {kind} on t {{ size 64 KiB }}
"""


@pytest.fixture
def refuse_everything(monkeypatch):
    """The size check sees every collective as far too large (its estimate, not its limit)."""
    real = cclc.budget.candidate_estimate

    def huge(*args, **kwargs):
        return replace(real(*args, **kwargs), ops=10 ** 12)

    # every candidate's own estimate, from which the collective's is taken
    monkeypatch.setattr(cclc.budget, "candidate_estimate", huge)


def test_a_refused_healthy_torus_alltoall_is_compiled_stored_by_symmetry(
        tmp_path, refuse_everything):
    (r,) = compile_source(SOURCE.format(fault="", kind="alltoall"), tmp_path / "o",
                          Request(emit=("json",)))
    assert r.plan is None and r.symmetric is not None and not r.failed and not r.missing
    doc = read_document(tmp_path / "o" / "a2a.schedule.json")
    assert isinstance(doc, SymmetricSchedule) and doc.group.shape == (4, 4)
    verify_symmetric(doc)
    whole = expand(doc)
    verify(whole)
    assert simulate(whole).time == pytest.approx(r.symmetric.time, rel=1e-12)
    assert r.symmetric.pct_of_bound is not None and r.symmetric.pct_of_bound <= 100.0 + 1e-9
    # a reader of whole schedules refuses the document and says why
    with pytest.raises(CclError, match="stored by symmetry"):
        load_schedule(tmp_path / "o" / "a2a.schedule.json")


@pytest.mark.parametrize("kind", ["allreduce", "allgather", "reducescatter"])
def test_a_refused_healthy_torus_ring_collective_is_compiled_stored_by_symmetry(
        tmp_path, refuse_everything, kind):
    (r,) = compile_source(SOURCE.format(fault="", kind=kind), tmp_path / "o",
                          Request(emit=("json",)))
    assert r.symmetric is not None and not r.failed
    doc = read_document(tmp_path / "o" / "a2a.schedule.json")
    assert isinstance(doc, SymmetricSchedule)
    whole = expand(doc)
    verify(whole)
    assert simulate(whole).time == pytest.approx(r.symmetric.time, rel=1e-12)


def test_a_small_collective_is_planned_whole(tmp_path):
    text = ("topology t = torus(4) { link 50 GB/s, 100 ns }\n"
            "collective a2a = alltoall on t { size 64 KiB }\n")
    (r,) = compile_source(text, tmp_path / "o")
    assert r.plan is not None and r.symmetric is None


def test_an_output_that_needs_every_rank_gets_the_expansion_where_it_fits(
        tmp_path, refuse_everything):
    (r,) = compile_source(SOURCE.format(fault="", kind="alltoall"), tmp_path / "o",
                          Request(emit=("json", "msccl")))
    assert r.symmetric is not None and not r.missing
    assert (tmp_path / "o" / "a2a.msccl.xml").is_file()
    # the symmetric plan is timed under the IR model (msccl's dataflow model has no symmetric
    # simulation)
    assert r.symmetric.model == IR_MODEL == symmetric_model(MSCCL_MODEL)


def test_an_output_refuses_an_expansion_over_the_limit_with_the_reason():
    coll = make_collective("a2a", CollectiveKind.ALLTOALL, torus("t", (4, 4)), tuple(range(16)),
                           size=64 << 10)
    sym = symmetric_alltoall(coll)
    why = symmetric_refusal(load("msccl"), sym, max_ops=sym.expanded_ops() - 1)
    assert why is not None and f"{sym.expanded_ops():,} ops" in why and "--emit json" in why
    assert symmetric_refusal(load("msccl"), sym, max_ops=sym.expanded_ops()) is None
    assert symmetric_refusal(load("json"), sym, max_ops=0) is None


@pytest.mark.parametrize("fault, kind, why", [
    ("\n    fault link (0,0) -- (1,0)\n    fault link (2,0) -- (3,0)", "allreduce",
     "failed link breaks the translations.*nor with exceptions for them: .*cut 2 times"),
    ("\n    fault link (0,0) -- (1,0)", "broadcast",
     "alltoall, allreduce, allgather and reducescatter only, not broadcast"),
    ("", "broadcast", "alltoall, allreduce, allgather and reducescatter only, not broadcast")])
def test_what_cannot_be_stored_by_symmetry_keeps_the_refusal_and_says_why(
        tmp_path, refuse_everything, fault, kind, why):
    with pytest.raises(CclError, match=f"too large to plan here.*nor can it be stored by "
                                       f"symmetry: .*{why}"):
        compile_source(SOURCE.format(fault=fault, kind=kind), tmp_path / "o")
    assert not (tmp_path / "o").exists()


def test_a_refused_alltoall_with_failed_links_is_compiled_with_exceptions(
        tmp_path, refuse_everything, capsys):
    from cclc.cli import main

    fault = "\n    fault link (1,1) -- (1,2)\n    fault link (3,0) -- (0,0)"
    (r,) = compile_source(SOURCE.format(fault=fault, kind="alltoall"), tmp_path / "o",
                          Request(emit=("json",)))
    assert r.symmetric is not None and not r.failed and not r.missing
    path = tmp_path / "o" / "a2a.schedule.json"
    doc = read_document(path)
    assert isinstance(doc, ExceptedSchedule) and len(doc.masked_element) > 0
    verify_excepted(doc)
    whole = expand_excepted(doc)
    verify(whole)
    assert simulate(whole).time == pytest.approx(r.symmetric.time, rel=1e-12)
    assert r.symmetric.pct_of_bound is not None and r.symmetric.pct_of_bound <= 100.0 + 1e-9
    assert main(["verify", str(path)]) == 0
    assert "journeys that cross a failed link" in capsys.readouterr().out
    # the tail's first op dropped: the document fails verification
    bad = tmp_path / "bad.schedule.json"
    keep = np.arange(len(doc.tail)) != int(np.flatnonzero(doc.tail.dst_buf == 1)[0])
    bad.write_bytes(b"".join(symmetric_document_pieces(doc.replace(tail=doc.tail.take(keep)))))
    assert main(["verify", str(bad)]) == 1
    assert "verification failed" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["allreduce", "allgather", "reducescatter"])
def test_a_refused_ring_collective_with_failed_links_is_compiled_with_lines(
        tmp_path, refuse_everything, capsys, kind):
    from backends.msccl.executor import execute
    from cclc.cli import main

    fault = "\n    fault link (1,1) -- (1,2)\n    fault link (3,0) -- (0,0)"
    (r,) = compile_source(SOURCE.format(fault=fault, kind=kind), tmp_path / "o",
                          Request(emit=("json", "msccl")))
    assert r.symmetric is not None and not r.failed and not r.missing
    doc = read_document(tmp_path / "o" / "a2a.schedule.json")
    assert isinstance(doc, ExceptedSchedule) and doc.interleaved
    verify_lined(doc)
    whole = expand_excepted(doc)
    verify(whole)
    assert simulate(whole).time == pytest.approx(r.symmetric.time, rel=1e-12)
    assert r.symmetric.pct_of_bound is not None and r.symmetric.pct_of_bound <= 100.0 + 1e-9
    # the XML output is the expansion (it fits), and it runs what was verified: the runtime's
    # semantics (cclc's executor of them) give every rank the right numbers
    execute((tmp_path / "o" / "a2a.msccl.xml").read_text())
    assert main(["verify", str(tmp_path / "o" / "a2a.schedule.json")]) == 0
    assert "ring phases on the" in capsys.readouterr().out


def test_a_named_algorithm_is_not_replaced():
    topo = torus("t", (4, 4))
    coll = make_collective("a2a", CollectiveKind.ALLTOALL, topo, tuple(range(16)), size=64 << 10)
    assert symmetric_reason(resolve(coll)) is None
    named = replace(coll, algorithm=replace(coll.algorithm, name="direct"))
    assert "an algorithm is named" in (symmetric_reason(resolve(named)) or "")


def test_plan_symmetric_charges_a_lockstep_models_step_cost():
    coll = make_collective("a2a", CollectiveKind.ALLTOALL, torus("t", (4, 4)), tuple(range(16)),
                           size=64 << 10)
    free = plan_symmetric(coll, IR_MODEL)
    costly = replace(IR_MODEL, name="test", step_overhead=1e-6)
    paid = plan_symmetric(coll, costly)
    steps = int(np.max(free.schedule.ops.step)) + 1
    assert paid.time == pytest.approx(free.time + steps * 1e-6, rel=1e-12)
    assert json.dumps(free.name) and free.bound == free.bounds.best


def test_cclc_verify_checks_a_document_stored_by_symmetry(tmp_path, refuse_everything, capsys):
    from cclc.cli import main
    from cclc.serialize import symmetric_document_pieces

    compile_source(SOURCE.format(fault="", kind="alltoall"), tmp_path / "o")
    path = tmp_path / "o" / "a2a.schedule.json"
    assert main(["verify", str(path)]) == 0
    assert "representative ops for" in capsys.readouterr().out
    assert main(["verify", "--numeric", str(path)]) == 2
    assert "stored by symmetry" in capsys.readouterr().err
    # one representative moved to another output chunk: every translate of it is wrong too
    sym = read_document(path)
    assert isinstance(sym, SymmetricSchedule)
    cols = sym.ops.columns()
    last = int(np.flatnonzero(cols["dst_buf"] == 1)[-1])
    cols["dst_off"] = cols["dst_off"].copy()
    cols["dst_off"][last] = (cols["dst_off"][last] + 1) % len(sym.layouts[1])
    bad = tmp_path / "bad.schedule.json"
    bad.write_bytes(b"".join(symmetric_document_pieces(sym.replace(ops=type(sym.ops)(**cols)))))
    assert main(["verify", str(bad)]) == 1
    assert "verification failed" in capsys.readouterr().err


@pytest.mark.parametrize("fault, kind", [("", "alltoall"),
                                         ("\n    fault link (1,1) -- (2,1)", "alltoall"),
                                         ("\n    fault link (1,1) -- (2,1)", "allreduce")])
def test_cclc_sim_times_a_document_stored_by_symmetry_as_its_expansion(
        tmp_path, refuse_everything, capsys, fault, kind):
    """``cclc sim`` on the three forms (symmetric, with a tail, with lines) prints the time,
    the busiest links and every step's start, time, bytes and busiest link the simulator
    gives the expanded schedule, and refuses what needs the whole schedule."""
    from cclc.cli import main

    compile_source(SOURCE.format(fault=fault, kind=kind), tmp_path / "o")
    path = tmp_path / "o" / "a2a.schedule.json"
    doc = read_document(path)
    assert isinstance(doc, SymmetricSchedule | ExceptedSchedule)
    whole = expand_form(doc)
    ref = simulate(whole)
    assert main(["sim", "--steps", "--links", "3", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"representative ops for {len(whole.ops):,} ops" in out
    assert f"time        {ref.time * 1e6:.3f} us" in out
    topo = whole.topology
    listed = out[out.index("busiest links:"):].splitlines()[1:4]
    assert [line.split()[0] for line in listed] == [topo.link_name(k)
                                                    for k in ref.busiest_links(3)]
    assert [float(line.split()[1]) for line in listed] == [
        ref.link_bytes[k] for k in ref.busiest_links(3)]
    rows = [line.split() for line in out[out.index("  step "):].splitlines()[1:]
            if line.split() and line.split()[0].isdigit()]
    assert len(rows) == ref.n_steps
    assert [float(r[1]) for r in rows] == pytest.approx(ref.step_start * 1e6, abs=1e-3)
    assert [float(r[2]) for r in rows] == pytest.approx(ref.step_time * 1e6, abs=1e-3)
    assert [float(r[3]) for r in rows] == ref.step_bytes.tolist()
    assert [r[4] for r in rows] == ["-" if k is None else topo.link_name(k)
                                    for k in ref.step_busiest_link]
    for asked in (["--mode", "event"], ["--backend", "nccl"]):
        assert main(["sim", *asked, str(path)]) == 2
        assert "stored by symmetry" in capsys.readouterr().err


@pytest.mark.parametrize("fault, kind", [("", "alltoall"),
                                         ("\n    fault link (1,1) -- (2,1)", "alltoall"),
                                         ("\n    fault link (1,1) -- (2,1)", "allreduce")])
def test_cclc_viz_draws_a_document_stored_by_symmetry_expanded(
        tmp_path, refuse_everything, capsys, monkeypatch, fault, kind):
    """``cclc viz`` on the three forms draws the page of the expanded schedule, verified in
    its form first; over the size limit it refuses (nothing written) and names ``cclc sim``;
    a form that fails its verifier is not drawn."""
    from backends.html import render
    from cclc.cli import main
    from cclc.pipeline import measure

    compile_source(SOURCE.format(fault=fault, kind=kind), tmp_path / "o")
    path = tmp_path / "o" / "a2a.schedule.json"
    doc = read_document(path)
    assert isinstance(doc, SymmetricSchedule | ExceptedSchedule)
    page = tmp_path / "page.html"
    assert main(["viz", str(path), "-o", str(page)]) == 0
    assert "verified in that form, drawn expanded" in capsys.readouterr().err
    whole = expand_form(doc)
    assert page.read_text(encoding="utf-8") == render([(whole, measure(whole))])

    limit = cclc.budget.MAX_OPS
    monkeypatch.setattr(cclc.budget, "MAX_OPS", doc.expanded_ops() - 1)
    big = tmp_path / "big.html"
    assert main(["viz", str(path), "-o", str(big)]) == 2
    err = capsys.readouterr().err
    assert f"{doc.expanded_ops():,}, over cclc's limit" in err and "cclc sim --steps" in err
    assert not big.exists()
    monkeypatch.setattr(cclc.budget, "MAX_OPS", limit)

    if isinstance(doc, SymmetricSchedule):
        cols = doc.ops.columns()
        cols["dst_off"] = (cols["dst_off"] + 1) % len(doc.layouts[1])
        bad = tmp_path / "bad.schedule.json"
        bad.write_bytes(b"".join(symmetric_document_pieces(
            doc.replace(ops=type(doc.ops)(**cols)))))
        assert main(["viz", str(bad), "-o", str(tmp_path / "bad.html")]) == 1
        assert "fails verification" in capsys.readouterr().err
        assert not (tmp_path / "bad.html").exists()


def _whole_and_symmetric_times(text: str) -> tuple[float, float]:
    """The best whole candidate's time under auto and the form stored by symmetry's, each
    planned on its own (the IR model, what ``--emit json`` prices with)."""
    (coll,) = dsl.loads(text, "<test>").collectives
    whole = plan(coll, model=IR_MODEL)
    assert whole.time is not None
    return whole.time, plan_symmetric(coll, IR_MODEL).time


@pytest.mark.parametrize("fault, kind", [("", "alltoall"),
                                         ("\n    fault link (1,1) -- (2,1)", "alltoall"),
                                         ("", "allgather"), ("", "reducescatter")])
def test_auto_keeps_the_faster_of_the_whole_and_the_symmetric_form(tmp_path, fault, kind):
    """Below the size check's threshold, auto under --emit json plans the form stored by
    symmetry as well and keeps whichever is faster (ties: the whole schedule)."""
    text = SOURCE.format(fault=fault, kind=kind)
    whole, sym = _whole_and_symmetric_times(text)
    (r,) = compile_source(text, tmp_path / "o", Request(emit=("json",)))
    assert (r.symmetric is not None) == (sym < whole)
    chosen = r.symmetric or r.plan
    assert chosen.time == pytest.approx(min(whole, sym), rel=1e-12)
    doc = read_document(tmp_path / "o" / "a2a.schedule.json")
    if isinstance(doc, ExceptedSchedule):
        verify_excepted(doc)
    elif isinstance(doc, SymmetricSchedule):
        verify_symmetric(doc)
    assert isinstance(doc, (ExceptedSchedule, SymmetricSchedule)) == (r.symmetric is not None)


def test_auto_does_not_compare_where_an_output_needs_every_rank(tmp_path):
    """With an output that renders whole schedules (MSCCL XML) the candidates are priced
    under another model and the form would be expanded: the whole plan is kept, unasked."""
    text = SOURCE.format(fault="\n    fault link (1,1) -- (2,1)", kind="alltoall")
    (r,) = compile_source(text, tmp_path / "o", Request(emit=("json", "msccl")))
    assert r.plan is not None and r.symmetric is None


@pytest.mark.slow
def test_a_faulty_torus_alltoall_below_the_threshold_is_stored_by_symmetry_when_faster(
        tmp_path):
    """6x6x6 with a failed cable: the whole planner's best (MATE) takes about twice the form
    stored by symmetry with exceptions, which auto keeps (measured: 1.598 ms against 723 us)."""
    text = ("topology t = torus(6, 6, 6) {\n    link 32 GB/s, 100 ns\n"
            "    fault link (1,1,1) -- (2,1,1)\n}\n"
            "collective a2a = alltoall on t { size 27 MiB }\n")
    (r,) = compile_source(text, tmp_path / "o", Request(emit=("json",)))
    assert r.symmetric is not None and isinstance(r.symmetric.schedule, ExceptedSchedule)
    whole, sym = _whole_and_symmetric_times(text)
    assert r.symmetric.time == pytest.approx(sym, rel=1e-12) and sym < 0.6 * whole
    verify_excepted(read_document(tmp_path / "o" / "a2a.schedule.json"))


def test_explain_shows_the_whole_candidates_beside_a_faster_symmetric_form(
        tmp_path, monkeypatch, capsys):
    """--explain where the form stored by symmetry is kept: the whole candidates' table, its
    fastest one marked as beaten, and the form's line (the form made faster here)."""
    real = cclc.symmetric_plan.plan_symmetric

    def faster(*args, **kwargs):
        return replace(real(*args, **kwargs), time=1e-9)

    monkeypatch.setattr(cclc.symmetric_plan, "plan_symmetric", faster)
    source = tmp_path / "t.ccl"
    source.write_text(SOURCE.format(fault="", kind="alltoall"))
    assert cli_main(["compile", str(source), "--emit", "json", "--explain",
                     "-o", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert "a2a: alltoall on 16 ranks; whole candidates:" in out
    assert "the fastest whole candidate; halfring+dimrotation-symmetric (stored by symmetry) " \
        "is faster" in out
    assert "and stored by symmetry: halfring+dimrotation-symmetric 1 ns" in out
