"""The catalog's library: every member's relabeled tables against the Python relabeling, the
MPI build switching schedules (numpy-correct), and the whole loop from timings to a switch."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import numpy as np
import pytest
from backend_helpers import (
    MPIRUN,
    NP_TYPES,
    NVCC_BUILD_UNAVAILABLE,
    check_outputs,
    write_exact_inputs,
)

import dsl
from backends.common import EmitOptions, entry_count
from backends.nccl.catalog import BACKEND, catalog_sources, write_catalog_library
from cclc import cli
from cclc.catalog.build import build_catalog, member_schedule
from cclc.collective import CollectiveKind, make_collective
from cclc.diagnose.inject import Fault, probe_timings
from cclc.outdir import OutputDir
from cclc.topology import torus

needs_make = pytest.mark.skipif(shutil.which("make") is None or shutil.which("g++") is None,
                                reason="make and g++ are needed to build the check tool")
needs_mpi = pytest.mark.skipif(MPIRUN is None, reason="mpirun is not installed")


def _catalog(kind=CollectiveKind.ALLGATHER, dims=(3, 3)):
    t = torus("t", dims)
    coll = make_collective("cat", kind, t, tuple(range(t.n_ranks)), size=t.n_ranks * 32 * 4)
    return build_catalog(coll, ("link",))


def _library(catalog, folder, mpi=False):
    with OutputDir(folder) as out:
        write_catalog_library(catalog, out, EmitOptions(mpi=mpi))
    lib = folder / "nccl-cat"
    subprocess.run(["make", "-C", str(lib), "catalogcheck"], check=True, capture_output=True)
    return lib


def _check(lib, links):
    """(select microseconds, sends as (rank, peer)) of the check tool, or its message."""
    proc = subprocess.run([str(lib / "cclc_cat_catalog_check"), *map(str, links)],
                          capture_output=True, text=True, timeout=60, check=False)
    if proc.returncode:
        return None, proc.stderr
    lines = proc.stdout.splitlines()
    sends = {tuple(map(int, line.split()[1:3])) for line in lines[1:]}
    return float(lines[0].split()[1]), sends


def test_declared_files_are_the_rendered_ones():
    catalog = _catalog()
    rendered = {f"nccl-cat/{name}" for name in catalog_sources(catalog)}
    assert rendered == set(BACKEND.files(catalog, EmitOptions()))


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A 3x3 allgather's link catalog and its library's check tool, made once."""
    catalog = _catalog()
    return catalog, _library(catalog, tmp_path_factory.mktemp("catalog"))


@pytest.mark.slow
@needs_make
def test_every_member_runs_its_relabeled_schedule(built):
    catalog, lib = built
    topo = catalog.collective.topology
    for k, m in enumerate(catalog.classes[0].members):
        # either direction names the connection
        for links in (m.faults.links, m.faults.links[:1]):
            seconds, sends = _check(lib, links)
            assert seconds is not None, sends
            s = member_schedule(catalog, 0, k)
            net = s.ops.src != s.ops.dst
            want = set(zip(s.ops.src[net].tolist(), s.ops.dst[net].tolist(), strict=True))
            assert sends == want                # the C relabeling is the verified Python one
            for u, v in sends:
                link = topo.link_id(u, v)
                assert link is not None and link not in m.faults.links
    healthy = _check(lib, [])[1]
    s0 = catalog.schedules[0].plan.schedule
    net = s0.ops.src != s0.ops.dst
    assert healthy == set(zip(s0.ops.src[net].tolist(), s0.ops.dst[net].tolist(), strict=True))


@pytest.mark.slow
@pytest.mark.skipif(NVCC_BUILD_UNAVAILABLE is not None, reason=str(NVCC_BUILD_UNAVAILABLE))
def test_nccl_build_with_the_catalog_compiles_warning_free(built):
    # nvcc with warnings as errors; select_faults and the catalog entry point included
    catalog, lib = built
    proc = subprocess.run(["make", "-C", str(lib), "all"], capture_output=True, text=True,
                          timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    header = (lib / "cclc_cat.h").read_text()
    assert "int cclc_cat_select_faults(ncclComm_t comm, const int* links, int n);" in header
    symbols = subprocess.run(["nm", "-D", str(lib / "libcclc_cat.so")], capture_output=True,
                             text=True, check=True).stdout
    assert "cclc_cat_select_faults" in symbols and "cclc_cat_fault_error" in symbols


@pytest.mark.slow
@needs_make
def test_unknown_fault_sets_are_refused_with_a_message(built):
    catalog, lib = built
    a, b = catalog.classes[0].members[:2]
    assert "not in the catalog" in _check(lib, [a.faults.links[0], b.faults.links[0]])[1]
    assert "no such link" in _check(lib, [10_000])[1]


def _mpi_run(lib, coll, count, faults, workdir):
    data = workdir / "data"
    shutil.rmtree(data, ignore_errors=True)
    in_elems = count * (coll.n if coll.kind is not CollectiveKind.ALLGATHER else 1)
    inputs = write_exact_inputs(coll, coll.dtype, in_elems, 7, data)
    env = dict(os.environ, CCLC_FAULTS=faults)
    proc = subprocess.run([MPIRUN, "--allow-run-as-root", "--oversubscribe", "-x", "CCLC_FAULTS",
                           "-np", str(coll.n), str(lib / "cclc_cat_mpitest"), str(data),
                           str(count), str(NP_TYPES[coll.dtype][1])],
                          capture_output=True, text=True, env=env, timeout=120, check=False)
    if proc.returncode == 0:
        check_outputs(coll, coll.dtype, inputs, data)
    return proc


@pytest.mark.slow
@needs_make
@needs_mpi
@pytest.mark.parametrize("kind", [CollectiveKind.ALLGATHER, CollectiveKind.REDUCESCATTER])
def test_mpi_build_switches_by_environment(tmp_path, kind):
    catalog = _catalog(kind)
    lib = _library(catalog, tmp_path, mpi=True)
    coll = catalog.collective
    count = entry_count(catalog.schedules[0].plan.schedule)
    members = catalog.classes[0].members
    for faults in ("", ",".join(map(str, members[0].faults.links)),
                   str(members[-1].faults.links[-1])):
        proc = _mpi_run(lib, coll, count, faults, tmp_path)
        assert proc.returncode == 0, proc.stderr
    proc = _mpi_run(lib, coll, count, f"{members[0].faults.links[0]},"
                                      f"{members[1].faults.links[0]}", tmp_path)
    assert proc.returncode != 0 and "fault set not in the catalog" in proc.stderr


LOOP = """topology pod = torus({dims}) {{
    link 50 GB/s, 1 us
}}
collective cat = alltoall on pod {{ size {size} B }}
"""


@pytest.mark.slow
@needs_make
@needs_mpi
@pytest.mark.parametrize("dims", [(4, 4), (3, 3, 3)])
def test_the_loop_from_timings_to_a_switch(tmp_path, capsys, dims):
    """Healthy run; a slow link in simulated timings; diagnose names its fault set; the library
    switches; the next call is numpy-correct and none of its messages crosses the link."""
    n = int(np.prod(dims))
    src = tmp_path / "pod.ccl"
    src.write_text(LOOP.format(dims=", ".join(map(str, dims)), size=n * n * 16))
    out = tmp_path / "out"
    assert cli.main(["catalog", str(src), "--faults", "link", "-o", str(out),
                     "--emit", "nccl"]) == 0
    lib = out / "nccl-cat"
    subprocess.run(["make", "-C", str(lib), "mpi", "catalogcheck"], check=True,
                   capture_output=True)
    coll = next(iter(dsl.load(str(src)).collectives))
    count = coll.count // coll.n            # elements per pair, as compiled

    assert _mpi_run(lib, coll, count, "", tmp_path).returncode == 0        # healthy

    topo = coll.topology
    a, b = topo.rank_at((1,) * len(dims)), topo.rank_at((1,) * (len(dims) - 1) + (2,))
    slow = topo.link_id(a, b)
    timings = probe_timings(topo, (Fault("link", "slow", (slow,), factor=3.0),), noise=0.02,
                            seed=11)
    files = []
    for r in range(n):      # as the plugin writes them: one file per rank (CCLC_PEER_TIMINGS)
        rec = [{"rank": int(s), "peer": int(d), "dir": "send", "bytes": float(x),
                "seconds": float(t)}
               for s, d, x, t in zip(timings.src, timings.dst, timings.nbytes,
                                     timings.seconds, strict=True) if s == r]
        path = tmp_path / f"peers.rank{r}.json"
        path.write_text(json.dumps({"format": "cclc-peer-timings", "version": 1,
                                    "records": rec}))
        files.append(str(path))
    capsys.readouterr()
    assert cli.main(["diagnose", *files, "--topology", str(src), "--fault-set"]) == 1
    line = next(x for x in capsys.readouterr().out.splitlines()
                if x.startswith("CCLC_FAULTS="))
    faults = line.split("=", 1)[1]
    assert faults == str(slow)

    proc = _mpi_run(lib, coll, count, faults, tmp_path)                    # switched
    assert proc.returncode == 0, proc.stderr
    seconds, sends = _check(lib, [slow])
    assert seconds is not None and seconds < 1000.0
    assert (a, b) not in sends and (b, a) not in sends
    assert _check(lib, [])[1] & {(a, b), (b, a)}     # the healthy schedule did use it
