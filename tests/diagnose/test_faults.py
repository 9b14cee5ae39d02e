"""Suspects become fault statements that the language accepts and that fail the right links."""

from __future__ import annotations

import numpy as np

import dsl
from cclc.diagnose.faults import fault_statements, patch_source
from cclc.diagnose.inject import Fault, probe_timings
from cclc.diagnose.localize import diagnose


def _failed_after(text: str, name: str, statements: list[str]) -> np.ndarray:
    patched = patch_source(text, "x.ccl", name, statements)
    return dsl.loads(patched, "x.ccl").topologies[name].link_failed


def test_a_slow_spine_becomes_a_fault_group():
    text = open("examples/hgx16_leafspine.ccl").read().replace("leaves 8 ", "leaves 16")
    topo = dsl.loads(text, "x.ccl").topologies["cluster"]
    spine = topo.vertex("spine3")
    links = np.flatnonzero((topo.link_src == spine) | (topo.link_dst == spine))
    d = diagnose(topo, probe_timings(topo, (Fault("switch", "", tuple(links.tolist()),
                                                   factor=4.0),), noise=0.05))
    assert [(s.kind, s.name) for s in d.suspects] == [("switch", "spine3")]
    statements = fault_statements(topo, d.suspects)
    assert statements[1].startswith("fault group suspect_spine3 {")
    failed = _failed_after(text, "cluster", statements)
    assert failed[links].all()
    assert (failed & ~topo.link_failed).sum() == len(links)


def test_one_line_topology_and_a_slow_gpu():
    text = "topology t = torus(4, 4) { link 50 GB/s, 1 us }\n" \
           "collective a = alltoall on t { size 15 MiB }\n"
    topo = dsl.loads(text, "x.ccl").topologies["t"]
    r = topo.rank_at((2, 1))
    links = tuple(np.flatnonzero((topo.link_src == r) | (topo.link_dst == r)).tolist())
    d = diagnose(topo, probe_timings(topo, (Fault("rank", "", links),), noise=0.02))
    statements = fault_statements(topo, d.suspects)
    assert statements[-1] == "fault rank (2,1)"
    patched = patch_source(text, "x.ccl", "t", statements)
    program = dsl.loads(patched, "x.ccl")
    assert program.topologies["t"].failed_ranks == frozenset({r})
    # the collective over the whole torus now runs on the 15 others
    assert r not in program.collectives[0].group
