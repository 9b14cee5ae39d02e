"""The pipeline as one function: what it writes, what it hands the backends, and the passes
the algorithm table applies to every build."""

from __future__ import annotations

import json

import numpy as np
import pytest

import backends
from backends.contract import EmitOptions, Facts
from cclc import serialize
from cclc.algorithms import get
from cclc.collective import CollectiveKind, make_collective
from cclc.errors import CclError, ScheduleError
from cclc.fabric_routing import has_spines, planned_routes, route_spines
from cclc.outdir import MANIFEST, OutputDir
from cclc.pipeline import Events, Request, compile_source, write_outputs
from cclc.relay import lower_relays
from cclc.sim import simulate
from cclc.topology import NodeType, leaf_spine
from cclc.verify import verify

SOURCE = """\
topology ring = torus(6) { link 10 GB/s, 1 us }
collective ag = allgather on ring { size 6 MiB; algorithm ring }
collective a2a = alltoall on ring { size 6 MiB; algorithm direct }
"""


class _Recorder(Events):
    def __init__(self):
        self.seen: list[tuple] = []

    def planned(self, coll, plan, nccl):
        self.seen.append(("planned", coll.name, plan.name))

    def wrote(self, name):
        self.seen.append(("wrote", name))


def test_compile_source_writes_the_verified_schedules(tmp_path):
    events = _Recorder()
    results = compile_source(SOURCE, tmp_path / "out", Request(emit=("json",)), events)
    assert [r.collective.name for r in results] == ["ag", "a2a"]
    for r in results:
        assert r.plan is not None and r.error is None and not r.missing
        assert r.files == (f"{r.collective.name}.schedule.json",)
        written = serialize.load(tmp_path / "out" / r.files[0])
        assert written.n_steps == r.plan.schedule.n_steps
        np.testing.assert_array_equal(written.ops.src, r.plan.schedule.ops.src)
        verify(written)
    assert results[1].plan.name == "direct"
    # every write is reported, the topology first, and each collective is planned before
    # anything of it is written
    assert events.seen[0] == ("wrote", "topology-ring.json")
    assert events.seen.index(("planned", "ag", results[0].plan.name)) < \
        events.seen.index(("wrote", "ag.schedule.json"))
    manifest = json.loads((tmp_path / "out" / MANIFEST).read_text())["files"]
    assert set(manifest) == {"topology-ring.json", "ag.schedule.json", "a2a.schedule.json"}


def test_html_gets_the_facts_the_pipeline_has(tmp_path, monkeypatch):
    seen: list[Facts] = []
    html = backends.load("html")
    render = type(html).render

    def spy(self, subject, options, facts):
        seen.append(facts)
        return render(self, subject, options, facts)

    monkeypatch.setattr(type(html), "render", spy)
    (r,) = compile_source(SOURCE, tmp_path / "out", Request(emit=("html",), only=("ag",)))
    (facts,) = seen
    # the plan's bounds object itself, not a recomputation, and the simulations of the schedule
    assert facts.bounds is r.plan.bounds and facts.bounds.best == pytest.approx(r.plan.bound)
    assert facts.lockstep.time == pytest.approx(simulate(r.plan.schedule).time)
    assert facts.event.time == pytest.approx(simulate(r.plan.schedule, mode="event").time)
    # the comparison with NCCL the compile printed, of the plan's time, not a recomputation
    assert facts.nccl is not None and facts.nccl.time == r.plan.time
    assert facts.nccl.line == r.nccl
    assert (tmp_path / "out" / "ag.html").read_text().lower().startswith("<!doctype html>")


def test_a_backend_may_write_only_what_it_declared(tmp_path):
    class Sloppy:
        name = "sloppy"
        wants_simulation = False

        def files(self, key, options):
            return ("a.txt",)

        def render(self, subject, options, facts):
            return {"a.txt": "ok", "b.txt": "not declared"}

        def build(self, folder, key, options):
            return []

    out = OutputDir(tmp_path)
    with pytest.raises(ScheduleError, match="did not declare: b.txt"):
        write_outputs(Sloppy(), None, None, out, EmitOptions(), Facts())
    assert out.files() == ()


def test_text_rendered_in_pieces_is_written_as_it_is_produced(tmp_path):
    produced: list[str] = []

    def pieces():
        for piece in ("<a>\n", "  <b/>\n", "</a>\n"):
            produced.append(piece)
            yield piece

    class Streaming:
        name = "streaming"
        wants_simulation = False

        def files(self, key, options):
            return ("a.xml", "b.txt")

        def render(self, subject, options, facts):
            return {"a.xml": pieces(), "b.txt": b"raw"}

        def build(self, folder, key, options):
            return []

    out = OutputDir(tmp_path)
    assert write_outputs(Streaming(), None, None, out, EmitOptions(), Facts()) == [
        "a.xml", "b.txt"]
    assert (tmp_path / "a.xml").read_text() == "<a>\n  <b/>\n</a>\n" and len(produced) == 3
    assert (tmp_path / "b.txt").read_bytes() == b"raw"
    assert out.files() == ("a.xml", "b.txt")


def test_every_backend_declares_what_it_renders(tmp_path):
    (r,) = compile_source(SOURCE, tmp_path / "o", Request(emit=("json",), only=("ag",)))
    coll, schedule = r.collective, r.plan.schedule
    for name in backends.SCHEDULE_BACKENDS:
        b = backends.load(name)
        options = EmitOptions()
        facts = Facts(bounds=r.plan.bounds, lockstep=simulate(schedule),
                      event=simulate(schedule, mode="event"))
        assert set(b.render(schedule, options, facts)) <= set(b.files(coll, options)), name
    assert set(backends.SCHEDULE_BACKENDS) <= set(backends.BACKENDS)


def test_every_backend_has_every_member_of_the_contract():
    from cclc.execution import MSCCL_MODEL, MSCCLPP_MODEL, NCCL_MODEL, ExecutionModel

    for name in backends.BACKENDS:
        b = backends.load(name)
        assert [m for m in backends.MEMBERS if not hasattr(b, m)] == [], name
        assert b.name == name
        assert b.execution_model is None or isinstance(b.execution_model, ExecutionModel)
    # the runtimes' models hang on the backends that emit for them
    assert {n: backends.load(n).execution_model for n in ("nccl", "msccl", "mscclpp")} == {
        "nccl": NCCL_MODEL, "msccl": MSCCL_MODEL, "mscclpp": MSCCLPP_MODEL}
    assert [n for n in backends.BACKENDS if backends.load(n).execution_model is None] == [
        "json", "html", "tuner"]


def test_a_backend_without_a_member_of_the_contract_is_refused_by_name(monkeypatch):
    import sys
    import types

    class Partial:                      # no execution_model, seconds_per_op, refusal
        name = "partial"
        wants_simulation = False

        def files(self, key, options):
            return ()

        def render(self, subject, options, facts):
            return {}

        def build(self, folder, key, options):
            return []

    module = types.ModuleType("partial_backend_for_test")
    module.BACKEND = Partial()
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setitem(backends.BACKENDS, "partial", module.__name__)
    with pytest.raises(CclError, match="lacks execution_model, seconds_per_op, refusal of the "
                       "backend contract"):
        backends.load("partial")


def test_the_outputs_choose_the_model_through_their_backends():
    from cclc.execution import ExecutionModel, model_for

    class Priced:
        name = "priced"
        wants_simulation = False
        execution_model = ExecutionModel("slow", "lockstep", step_overhead=1.0,
                                          description="one second per step")

    # any output that declares a model, the first one of --emit that does
    assert model_for([backends.load("json"), Priced()]) is Priced.execution_model


def test_unknown_collective_in_only_stops_before_anything_is_written(tmp_path):
    with pytest.raises(CclError, match="has no collective 'nope'"):
        compile_source(SOURCE, tmp_path / "out", Request(only=("nope",)))
    assert not (tmp_path / "out").exists()


def test_node_types_alone_are_refused_before_the_folder_is_made(tmp_path):
    source = "node g = pcie(gpus = 1) { link 48 GB/s, 1 us }\n"
    with pytest.raises(CclError, match="declares no topology, so there is nothing to compile"):
        compile_source(source, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_compile_holds_the_folder_lock_while_it_writes(tmp_path):
    with OutputDir(tmp_path / "out") as held:
        with pytest.raises(CclError, match="being written by another cclc run"):
            compile_source(SOURCE, OutputDir(tmp_path / "out"), Request(only=("ag",)))
        # the same object, entered again by the pipeline, nests
        compile_source(SOURCE, held, Request(only=("ag",)))
        assert held.locked
    assert "ag.schedule.json" in held.files()


GPU1 = NodeType("g1", "pcie", 1, 48e9, 1e-6, nics=1, nic_bandwidth=50e9)
HGX = NodeType("hgx", "nvswitch", 2, 100e9, 1e-6, nics=2, nic_bandwidth=50e9)


def _fabric_coll(kind=CollectiveKind.ALLGATHER, node=GPU1, nodes=8):
    topo = leaf_spine("f", nodes, node, rails=1, leaves=2, spines=4, oversubscription=1.0,
                      bandwidth=50e9, latency=1e-6)
    return make_collective("c", kind, topo, tuple(range(topo.n_ranks)), size=1 << 20)


def test_the_table_routes_every_build_once():
    coll = _fabric_coll()
    assert has_spines(coll.topology)
    s = get("direct").build(coll)
    # the registered build is the routing pass and the relays over the algorithm's own build:
    # planning an already planned schedule changes nothing
    again = lower_relays(route_spines(s))
    np.testing.assert_array_equal(again.routes.links, s.routes.links)
    np.testing.assert_array_equal(planned_routes(s).ops.route, s.ops.route)
    verify(s)


def test_hierarchical_tunes_with_the_cost_it_is_given():
    coll = _fabric_coll(CollectiveKind.REDUCESCATTER, HGX, nodes=4)
    chosen = []
    for prefer in (1, 8):
        # a cost that ranks the pipeline depth: the build must keep the depth it prefers
        s = get("hierarchical").build(
            coll, cost=lambda s, p=prefer: abs(dict(s.params)["chunks"] - p))
        chosen.append(dict(s.params)["chunks"])
        verify(s)
    assert chosen == [1, 8]


def test_an_output_that_cannot_express_a_collective_is_skipped_not_failed(tmp_path, capsys):
    # MSCCL has no alltoallv: no schedule of a non-uniform alltoall could be written as its XML,
    # so the compile writes the rest, says why, and does not fail for it
    from pathlib import Path

    from cclc.cli import main

    example = Path(__file__).resolve().parents[1] / "examples" / "alltoall_nonuniform.ccl"
    out = tmp_path / "out"
    assert main(["compile", str(example), "-o", str(out), "--emit", "json,msccl"]) == 0
    err = capsys.readouterr().err
    assert "no msccl output, its format cannot express this collective" in err
    assert "no alltoallv" in err
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == \
        ["moe.schedule.json", "topology-ring.json"]
