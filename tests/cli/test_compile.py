"""``cclc compile``: verified files only, never over a file cclc did not write."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cclc import cli, serialize
from cclc.algorithms import REGISTRY, Algorithm, NoBound, every_rank_ops, get
from cclc.collective import CollectiveKind
from cclc.ir import Buf, ScheduleBuilder
from cclc.outdir import MANIFEST

SOURCE = """\
topology pod = torus(4, 4) {
    link 50 GB/s, 100 ns
    fault link (0,0) -- (0,1)
}
collective a2a = alltoall on pod { size 64 KiB }
collective ag = allgather on pod {
    size 64 KiB
    algorithm ALGO
}
collective bc = broadcast on pod { size 1 MiB; root 5 }
"""


@pytest.fixture
def run_cli(monkeypatch, capsys):
    monkeypatch.setattr(cli, "COMMANDS", ["check", "compile"])

    def run(*argv):
        code = cli.main([str(a) for a in argv])
        out, err = capsys.readouterr()
        return code, out, err
    return run


def _source(tmp_path, algo="ring"):
    path = tmp_path / "pod.ccl"
    path.write_text(SOURCE.replace("ALGO", algo))
    return path


@pytest.mark.slow
def test_writes_verified_files(tmp_path, run_cli):
    from cclc.verify import verify

    out = tmp_path / "out"
    code, stdout, err = run_cli("compile", _source(tmp_path), "-o", out)
    assert code == 0, err
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted([MANIFEST, "topology-pod.json", "a2a.schedule.json",
                            "ag.schedule.json", "bc.schedule.json"])
    for name in ("a2a", "ag", "bc"):
        s = serialize.load(out / f"{name}.schedule.json")
        verify(s)
        assert s.collective.name == name
    assert serialize.load(out / "ag.schedule.json").algorithm == "ring"
    topo = json.loads((out / "topology-pod.json").read_text())
    assert topo["format"] == "cclc-topology" and topo["topology"]["n_ranks"] == 16
    assert sum(topo["topology"]["links"]["failed"]) == 2
    assert "compiling a2a" in err  # progress goes to stderr
    assert stdout.count("% of bound") in (0, 3) and "a2a: " in stdout
    # a second run replaces cclc's own files without --force
    code, _, err = run_cli("compile", _source(tmp_path), "-o", out)
    assert code == 0, err


def test_refuses_a_foreign_file_without_force(tmp_path, run_cli):
    out = tmp_path / "out"
    out.mkdir()
    (out / "ag.schedule.json").write_text("precious")
    code, _, err = run_cli("compile", _source(tmp_path), "-o", out)
    assert code == 2
    assert "refusing to overwrite" in err and "--force" in err
    assert (out / "ag.schedule.json").read_text() == "precious"
    # refused before any work: nothing else was written
    assert sorted(p.name for p in out.iterdir()) == ["ag.schedule.json"]
    code, _, err = run_cli("compile", _source(tmp_path), "-o", out, "--force")
    assert code == 0, err
    assert serialize.load(out / "ag.schedule.json").collective.name == "ag"


def _broken_allgather(coll, **params):
    # every rank keeps its own block and nobody sends: outputs stay incomplete
    n = coll.n
    b = ScheduleBuilder(coll, input=[coll.count // n], output=[coll.count // n] * n)
    b.add(step=0, src=np.arange(n), dst=np.arange(n), src_buf=Buf.INPUT, src_off=0,
          dst_buf=Buf.OUTPUT, dst_off=np.arange(n))
    return b.build("broken")


@pytest.fixture
def broken(monkeypatch):
    get("ring")
    monkeypatch.setitem(REGISTRY, "broken", Algorithm(
        "broken", frozenset({CollectiveKind.ALLGATHER}), lambda c, **p: None, _broken_allgather,
        every_rank_ops, NoBound("a test's broken entry")))


def test_never_writes_an_unverified_schedule(tmp_path, run_cli, broken):
    out = tmp_path / "out"
    code, _, err = run_cli("compile", _source(tmp_path, "broken"), "-o", out)
    assert code == 1
    assert "'ag'" in err and "failed verification" in err
    assert not (out / "ag.schedule.json").exists()
    # the other collectives are still compiled
    assert (out / "a2a.schedule.json").exists() and (out / "bc.schedule.json").exists()
    # the same through --algorithm, restricted with --only
    out2 = tmp_path / "out2"
    code, _, err = run_cli("compile", _source(tmp_path), "-o", out2, "--only", "ag",
                           "--algorithm", "broken")
    assert code == 1 and not (out2 / "ag.schedule.json").exists()


def test_auto_skips_the_broken_candidate(tmp_path, run_cli, broken):
    out = tmp_path / "out"
    code, stdout, err = run_cli("compile", _source(tmp_path, "auto"), "-o", out, "--explain",
                                "--only", "ag")
    assert code == 0, err
    assert serialize.load(out / "ag.schedule.json").algorithm != "broken"
    assert "broken" in stdout and "not applicable: failed verification" in stdout


def test_unknown_algorithm_is_reported_at_its_place(tmp_path, run_cli):
    path = _source(tmp_path, "rign")
    out = tmp_path / "out"
    code, _, err = run_cli("compile", path, "-o", out)
    assert code == 2
    assert err.startswith(f"{path}:8:15: error: unknown algorithm 'rign'")
    assert "did you mean 'ring'" in err
    assert "^~~~" in err
    assert not out.exists() or not any(p.suffix == ".json" for p in out.iterdir())


def test_explain_prints_the_candidates(tmp_path, run_cli):
    code, stdout, err = run_cli("compile", _source(tmp_path, "auto"), "-o", tmp_path / "o",
                                "--explain")
    assert code == 0, err
    assert "candidate" in stdout and "chosen" in stdout
    block = stdout.split("bc: broadcast on")[1]
    assert "ring" in block and "tree" in block


def test_only_and_algorithm_override(tmp_path, run_cli):
    out = tmp_path / "out"
    code, _, err = run_cli("compile", _source(tmp_path), "-o", out, "--only", "bc",
                           "--algorithm", "tree")
    assert code == 0, err
    assert sorted(p.name for p in out.iterdir()) == [MANIFEST, "bc.schedule.json",
                                                     "topology-pod.json"]
    assert serialize.load(out / "bc.schedule.json").algorithm == "tree"
    code, _, err = run_cli("compile", _source(tmp_path), "-o", out, "--only", "nope")
    assert code == 2 and "has no collective 'nope'" in err and "a2a" in err


def test_unknown_emitter_lists_the_known_ones(tmp_path, run_cli):
    code, _, err = run_cli("compile", _source(tmp_path), "-o", tmp_path / "o",
                           "--emit", "json,xml")
    assert code == 2
    assert "unknown emitter 'xml'" in err and "msccl" in err and "json" in err


_FAKE_BACKEND = """
class Fake:
    name = NAME
    wants_simulation = False
    execution_model = None
    seconds_per_op = 0.0
    renders_symmetric = False
    own_nics = False

    def files(self, key, options):
        return (key.name + ".txt",)

    def render(self, subject, options, facts):
        if REFUSE:
            raise CclError("this runtime cannot express the schedule")
        return {subject.collective.name + ".txt": f"{len(subject.ops)} {options.build}"}

    def refusal(self, subject, options):
        return None

    def build(self, folder, key, options):
        return []

BACKEND = Fake()
"""


def _fake_backend(tmp_path, monkeypatch, module: str, output: str, refuse: bool) -> None:
    import backends

    (tmp_path / f"{module}.py").write_text(
        f"from cclc.errors import CclError\nREFUSE = {refuse}\nNAME = {output!r}\n"
        + _FAKE_BACKEND)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(backends.BACKENDS, output, module)
    if output not in backends.SCHEDULE_BACKENDS:
        monkeypatch.setattr(backends, "SCHEDULE_BACKENDS", (*backends.SCHEDULE_BACKENDS, output))


def test_emitters_are_dispatched_by_name(tmp_path, run_cli, monkeypatch):
    _fake_backend(tmp_path, monkeypatch, "fake_backend_for_test", "fake", refuse=False)
    out = tmp_path / "out"
    code, _, err = run_cli("compile", _source(tmp_path), "-o", out, "--emit", "fake",
                           "--only", "a2a")
    assert code == 0, err
    # direct on 16 ranks is 256 ops, plus the relays a GPU torus (routing none) needs
    assert int((out / "a2a.txt").read_text().split()[0]) > 256
    assert not (out / "a2a.schedule.json").exists()  # json was not asked for
    assert "a2a.txt" in json.loads((out / MANIFEST).read_text())["files"]
    # the pipeline refuses, before any work, a file a backend declares that cclc did not write
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "a2a.txt").write_text("mine")
    code, _, err = run_cli("compile", _source(tmp_path), "-o", mine, "--emit", "fake",
                           "--only", "a2a")
    assert code == 2 and "refusing to overwrite 'a2a.txt'" in err
    assert (mine / "a2a.txt").read_text() == "mine"
    assert not (mine / "topology-pod.json").exists()


def test_a_foreign_file_of_the_nccl_backend_is_refused_up_front(tmp_path, run_cli):
    out = tmp_path / "out"
    (out / "nccl-a2a").mkdir(parents=True)
    (out / "nccl-a2a" / "Makefile").write_text("all:\n")
    code, _, err = run_cli("compile", _source(tmp_path), "-o", out, "--emit", "json,nccl")
    assert code == 2 and "nccl-a2a/Makefile" in err
    assert not (out / "a2a.schedule.json").exists()     # refused before any work


@pytest.mark.slow
def test_an_output_the_schedule_cannot_take_does_not_cost_the_others(tmp_path, run_cli,
                                                                    monkeypatch):
    _fake_backend(tmp_path, monkeypatch, "refusing_backend_for_test", "msccl", refuse=True)
    out = tmp_path / "out"
    code, _, err = run_cli("compile", _source(tmp_path), "-o", out, "--emit", "json,msccl")
    assert code == 1
    assert "no msccl output: this runtime cannot express the schedule" in err
    assert "outputs not produced (the others were written): a2a: msccl" in err
    assert (out / "a2a.schedule.json").exists() and (out / "bc.schedule.json").exists()


@pytest.mark.parametrize("emit, model, without", [
    ("json,msccl", "msccl", "without msccl: the ir model (lockstep steps, no software cost)"),
    ("nccl,json,msccl", "nccl", "without nccl: the msccl model"),
])
def test_says_which_model_priced_the_choice_and_why(tmp_path, run_cli, emit, model, without):
    # with software costs charged, a small allgather on this torus chooses another algorithm
    # than under the IR's lockstep model: the output must say which model priced the choice
    src = tmp_path / "ag.ccl"
    src.write_text(SOURCE.split("collective")[0]
                   + "collective ag = allgather on pod { size 64 KiB }\n")
    code, plain, err = run_cli("compile", src, "-o", tmp_path / "plain")
    assert code == 0, err
    assert "priced under" not in plain + err
    code, out, err = run_cli("compile", src, "-o", tmp_path / "coded", "--emit", emit)
    assert code == 0, err
    note = next(line for line in out.splitlines() if line.startswith("note: priced under"))
    assert f"priced under the {model} execution model (" in note
    assert f"because --emit includes {model}" in note and without in note
    assert out.index(note) < out.index("ag: ")


A2A_FABRIC = """\
node hgx = nvswitch(gpus = 8) {
    link  450 GB/s, 1 us
    nic   8 x 400 Gb/s
}
topology cluster = fabric(leaf_spine) {
    nodes  2 x hgx
    rails  8
    leaves 8
    spines 8
    link   400 Gb/s, 2 us
}
collective bruck = alltoall on cluster { size 64 MiB; algorithm bruck }
"""


def test_an_alltoall_is_compared_with_nccls_grouped_send_recv(tmp_path, run_cli):
    """NCCL runs an AllToAll as grouped send/recv (cclc.nccl_p2p): the report names that
    model, and says "slower" where cclc's schedule is (Bruck: log2(n) steps of half the data)."""
    path = tmp_path / "a2a.ccl"
    path.write_text(A2A_FABRIC)
    code, out, err = run_cli("compile", path, "-o", tmp_path / "out")
    assert code == 0, err
    lines = [x.strip() for x in out.splitlines() if x.strip().startswith("NCCL today")]
    (line,) = lines
    assert line.startswith("NCCL today (predicted by cclc's model of NCCL): p2p/simple ")
    assert "busbw" in line and "slower" in line and "faster" not in line


def test_a_spread_over_nics_is_reported_as_a_plan(tmp_path, run_cli):
    """A GPU without its NIC served over its server's other NICs: the report says the time
    counts a spread the runtimes choose for themselves (a plan, as the planned spines are);
    the healthy fabric's report has no such line."""
    source = """\
node hgx = nvswitch(gpus = 4) {
    link 450 GB/s, 1 us
    nic 4 x 400 Gb/s
}
topology cluster = fabric(leaf_spine) {
    nodes 4 x hgx
    rails 4
    spines 2
    link 400 Gb/s, 2 us
FAULT}
collective grads = allreduce on cluster { size 1 MiB; dtype bf16; op sum; algorithm rail_halving }
"""
    for fault, said in (("", False), ("    fault nic node(1).nic(2)\n", True)):
        path = tmp_path / "f.ccl"
        path.write_text(source.replace("FAULT", fault))
        code, out, err = run_cli("compile", path, "--emit", "json", "-o", tmp_path / "o",
                                 "--force")
        assert code == 0, err
        assert ("without a NIC of its own: cross-server traffic planned over 3 NICs" in out) == said
