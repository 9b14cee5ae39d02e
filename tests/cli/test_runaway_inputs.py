"""Inputs whose planning would run for minutes and take gigabytes are refused, or made cheap,
within seconds: the size check estimates every stage that grows (the bounds' symmetry search
and LP, every algorithm's schedule with its parameters, relay lowering) before it runs.

Each runs in a subprocess under an address-space limit (so a regression fails, it does not
take the machine down) and a generous timeout (a guard, not a timing assertion)."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: what a regression may take before it fails
MEMORY_CAP = 8 << 30
GUARD_SECONDS = 60

TORUS = """topology t = torus({dims}) {{
    link 50 GB/s, 100 ns
}}
collective a2a = alltoall on t {{ size 16 MiB }}
"""

BROADCAST = """topology t = torus(8) {{
    link 50 GB/s, 100 ns
}}
collective b = broadcast on t {{
    size 16 MiB
    algorithm ring(chunks = {chunks})
}}
"""

HIERARCHICAL = """node hgx = nvswitch(gpus = 8) {{
    link  450 GB/s, 1 us
    nic   8 x 400 Gb/s
}}
topology cluster = fabric(leaf_spine) {{
    nodes  4 x hgx
    rails  8
    spines 8
    link   400 Gb/s, 2 us
}}
collective ar = allreduce on cluster {{
    size 64 MiB
    algorithm hierarchical(chunks = {chunks})
}}
"""


def _cap_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def _cclc(tmp_path: Path, text: str, *args: str) -> subprocess.CompletedProcess:
    src = tmp_path / "x.ccl"
    src.write_text(text)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "cclc.cli", *args[:1], str(src), *args[1:]],
                          cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=GUARD_SECONDS, preexec_fn=_cap_memory)


def _verify(path: Path) -> subprocess.CompletedProcess:
    """``cclc verify`` of a written schedule, under the same guards."""
    return subprocess.run([sys.executable, "-m", "cclc.cli", "verify", str(path)], cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True,
                          text=True, timeout=GUARD_SECONDS, preexec_fn=_cap_memory)


FAULTY_TORUS = """topology t = torus({dims}) {{
    link 50 GB/s, 100 ns
    fault link ({zero}) -- ({one})
}}
collective a2a = alltoall on t {{ size 16 MiB }}
"""


@pytest.mark.slow
def test_alltoall_on_a_faulty_4096_rank_torus_is_compiled_with_exceptions(tmp_path):
    # whole, its smallest schedule (bruck) has 3.35e+07 ops, over the limit; stored by the
    # healthy torus's symmetry less the journeys over the failed link, and a tail for them
    out = tmp_path / "out"
    text = FAULTY_TORUS.format(dims="16,16,16", zero="0,0,0", one="1,0,0")
    run = _cclc(tmp_path, text, "compile", "-o", str(out), "--emit", "json")
    assert run.returncode == 0, run.stderr
    assert "with exceptions for the journeys that cross its failed links" in run.stderr
    assert "294,913 representative ops for" in run.stdout
    assert "journeys that cross a failed link, delivered after it by a tail" in run.stdout
    assert "% of bound" in run.stdout and "Traceback" not in run.stderr
    check = _verify(out / "a2a.schedule.json")
    assert check.returncode == 0, check.stderr
    assert "journeys that cross a failed link" in check.stdout


@pytest.mark.slow
@pytest.mark.parametrize("dims, reps", [("2,2,2,2,2,2,2,2,2,2,2,2", "589,825"),
                                        ("16,16,16", "294,913")])
def test_alltoall_on_a_healthy_4096_rank_torus_is_compiled_stored_by_symmetry(
        tmp_path, dims, reps):
    out = tmp_path / "out"
    run = _cclc(tmp_path, TORUS.format(dims=dims), "compile", "-o", str(out))
    assert run.returncode == 0, run.stderr
    assert "planned stored by symmetry instead" in run.stderr
    assert f"{reps} representative ops for" in run.stdout and "% of bound" in run.stdout
    check = _verify(out / "a2a.schedule.json")
    assert check.returncode == 0, check.stderr
    assert f"ok: a2a: {reps.replace(',', '')} representative ops" in check.stdout


@pytest.mark.parametrize("dims", ["2,2,2,2,2,2,2,2,2,2,2,2", "16,16,16"])
def test_bounds_of_a_4096_rank_torus_skip_what_is_too_large_and_say_so(tmp_path, dims):
    run = _cclc(tmp_path, TORUS.format(dims=dims), "bounds")
    assert run.returncode == 0, run.stderr
    assert "best: hop_bytes" in run.stdout
    assert "lp: skipped" in run.stdout and "not reduced by symmetry" in run.stdout


@pytest.mark.parametrize("chunks", [1000000000, 5000000])
def test_more_broadcast_chunks_than_elements_is_refused_at_the_parameter(tmp_path, chunks):
    run = _cclc(tmp_path, BROADCAST.format(chunks=chunks), "compile", "-o",
                str(tmp_path / "out"))
    assert run.returncode == 2, run.stderr
    assert f"chunks = {chunks} is more chunks than the buffer has elements (4194304" \
        in run.stderr
    assert "use at most chunks = 4194304" in run.stderr
    # the caret is under the parameter: `chunks = ...` starts at column 20
    assert "x.ccl:6:20: error" in run.stderr and "Traceback" not in run.stderr


def test_as_many_broadcast_chunks_as_elements_is_refused_by_its_size(tmp_path):
    # every element its own piece: 4M pieces over 7 hops, after the root's copy
    run = _cclc(tmp_path, BROADCAST.format(chunks=4194304), "compile", "-o",
                str(tmp_path / "out"))
    assert run.returncode == 2, run.stderr
    assert "its ring schedule alone has at least 3.36e+07 ops" in run.stderr
    assert "chunks" in run.stderr and "Traceback" not in run.stderr


@pytest.mark.parametrize("chunks, message", [
    (1000000000, "more chunks than each rank's block has elements (524288"),
    (100000, "its hierarchical schedule alone has at least"),
])
def test_a_deep_hierarchical_pipeline_is_refused(tmp_path, chunks, message):
    run = _cclc(tmp_path, HIERARCHICAL.format(chunks=chunks), "compile", "-o",
                str(tmp_path / "out"))
    assert run.returncode == 2, run.stderr
    assert message in run.stderr and "Traceback" not in run.stderr


@pytest.mark.slow
def test_allreduce_on_a_healthy_4096_rank_torus_is_compiled_stored_by_symmetry(tmp_path):
    # whole, auto's ring candidate alone was 50M ops and 14 GB when it was stopped
    text = TORUS.format(dims="16,16,16").replace("alltoall", "allreduce")
    run = _cclc(tmp_path, text, "compile", "-o", str(tmp_path / "out"))
    assert run.returncode == 0, run.stderr
    assert "planned stored by symmetry instead" in run.stderr
    assert "53,236 representative ops for 218,054,656 ops" in run.stdout


FAULTY_ALLREDUCE = """topology t = torus(16, 16, 16) {
    link 50 GB/s, 100 ns
    fault link (0,0,0) -- (1,0,0)
}
collective ar = allreduce on t { size 16 MiB }
"""


def test_ring_allreduce_on_a_faulty_4096_rank_torus_is_refused_with_its_estimate(tmp_path):
    # its ring schedule was estimated at 16.8M ops (one per pair) and admitted; built, it had
    # 50.3M, and the verifier's 16 GiB of contributor bits ran out of memory after 20 s
    out = tmp_path / "out"
    run = _cclc(tmp_path, FAULTY_ALLREDUCE, "compile", "-o", str(out), "--only", "ar",
                "--emit", "json", "--algorithm", "ring")
    assert run.returncode == 2, run.stderr
    err = run.stderr
    assert "its ring schedule alone has at least 5.03e+07 ops" in err
    # its 50.3M ops alone are over the cap; the verifier numbers the contributor sets of the
    # ring's 2n chunk slots per rank (4,096 bits each whole: 16 GiB), so the memory is the
    # ops' and an int64 set number per slot
    assert "needing at least 5.12 GiB of memory" in err
    assert "algorithm swing" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert not out.exists()


@pytest.mark.slow
def test_allreduce_on_a_faulty_4096_rank_torus_is_compiled_with_lines(tmp_path):
    # whole, its ring+dimrotation schedule has 3.36e+08 ops; stored by the healthy torus's
    # symmetry less the phases of the ring the failed link cuts, run as lines in their steps
    out = tmp_path / "out"
    run = _cclc(tmp_path, FAULTY_ALLREDUCE, "compile", "-o", str(out), "--only", "ar",
                "--emit", "json")
    assert run.returncode == 0, run.stderr
    assert "85,996 representative ops for 352,247,316 ops" in run.stdout
    assert "less 20 ring phases on the 16 ranks of the rings a failed link cuts" in run.stdout
    assert "% of bound" in run.stdout and "Traceback" not in run.stderr
    check = _verify(out / "ar.schedule.json")
    assert check.returncode == 0, check.stderr
    assert "ring phases on the 16 ranks of the rings a failed link cuts" in check.stdout


@pytest.mark.slow
@pytest.mark.parametrize("kind, stored", [
    ("allgather", "40,951 representative ops for 167,735,296 ops"),
    ("reducescatter", "45,047 representative ops for 184,520,212 ops")])
def test_allgather_and_reducescatter_on_a_faulty_4096_rank_torus_are_compiled_with_lines(
        tmp_path, kind, stored):
    # refused whole (about 2e8 ops each); stored as the halves of the allreduce above
    out = tmp_path / "out"
    text = FAULTY_ALLREDUCE.replace("allreduce", kind)
    run = _cclc(tmp_path, text, "compile", "-o", str(out), "--only", "ar", "--emit", "json")
    assert run.returncode == 0, run.stderr
    assert stored in run.stdout, run.stdout
    assert "less 10 ring phases on the 16 ranks of the rings a failed link cuts" in run.stdout
    check = _verify(out / "ar.schedule.json")
    assert check.returncode == 0, check.stderr


def test_allreduce_on_a_4096_rank_torus_with_a_ring_cut_twice_is_refused_within_seconds(
        tmp_path):
    # auto builds every candidate: its largest, ring+dimrotation, decides; a ring cut twice
    # has no line, so the failed links keep it from being stored by symmetry
    out = tmp_path / "out"
    text = FAULTY_ALLREDUCE.replace("    fault link (0,0,0) -- (1,0,0)\n",
                                    "    fault link (0,0,0) -- (1,0,0)\n"
                                    "    fault link (8,0,0) -- (9,0,0)\n")
    run = _cclc(tmp_path, text, "compile", "-o", str(out), "--only", "ar", "--emit", "json")
    assert run.returncode == 2, run.stderr
    err = run.stderr
    assert "too large to plan here" in err and "nor can it be stored by symmetry" in err
    assert "nor with exceptions for them" in err and "cut 2 times" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


@pytest.mark.parametrize("dims, kind, why", [
    # a ring of 4,096: 8.4e7 representative ops (its units travel 1,024 hops on average)
    ("5, 4096", "alltoall", "more than the 2e+07 ops cclc plans"),
    # 262,144 ranks: a contributor row of n booleans per chunk slot, 768 GiB
    ("64, 64, 64", "allreduce", "of memory available"),
])
def test_a_form_stored_by_symmetry_too_large_is_refused_within_seconds(tmp_path, dims, kind,
                                                                        why):
    # the form has a size check of its own (cclc.symmetric_plan.form_refusal): before it, the
    # first ran for minutes, the second failed allocating 768 GiB after half a minute
    out = tmp_path / "out"
    text = TORUS.format(dims=dims).replace("alltoall", kind).replace("16 MiB", "20 MiB")
    run = _cclc(tmp_path, text, "compile", "-o", str(out), "--emit", "json")
    assert run.returncode == 2, run.stderr
    err = run.stderr
    assert "nor can it be stored by symmetry: its form would have at least" in err
    assert why in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not out.exists()
