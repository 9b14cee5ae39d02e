"""Synthesized alltoalls run for real: the MSCCL executor on the emitted XML, and the generated
library built against MPI (every output equal to the numpy reference)."""

from __future__ import annotations

import pytest
from backend_helpers import MPIRUN, run_mpi, torus333_faulty

from backends.common import EmitOptions
from backends.msccl import render_xml
from backends.msccl.executor import execute
from cclc.algorithms import get
from cclc.collective import CollectiveKind, Hint, make_collective
from cclc.topology import torus, with_faults
from cclc.verify import verify


def _synth(topo, per_pair: int):
    group = topo.live_ranks()
    coll = make_collective("a2a", CollectiveKind.ALLTOALL, topo, tuple(group),
                           len(group) * per_pair * 4, algorithm=Hint("synth"))
    s = get("synth").build(coll)
    verify(s)
    assert s.algorithm == "synth"
    return s


def _faulty_5x5():
    t = torus("t", (5, 5), bandwidth=32e9, latency=1e-7, routing="none")
    a, b, c, d = t.rank_at((0, 2)), t.rank_at((1, 2)), t.rank_at((3, 2)), t.rank_at((4, 2))
    return with_faults(t, links=[(a, b), (b, a), (c, d), (d, c)], ranks=[t.rank_at((2, 4))])


@pytest.mark.slow
@pytest.mark.parametrize("runtime", ["msccl", "msccl-executor", "rccl"])
def test_msccl_executor_runs_the_synthesized_xml(runtime):
    s = _synth(_faulty_5x5(), per_pair=64)
    # large enough for the LP's paths, not a template (status optimal)
    assert dict(s.params)["status"] == "optimal"
    execute(render_xml(s, EmitOptions(msccl_runtime=runtime)))


@pytest.mark.slow
@pytest.mark.skipif(MPIRUN is None, reason="mpirun is not installed")
def test_mpi_run_of_a_synthesized_alltoall(tmp_path):
    s = _synth(torus333_faulty(), per_pair=32)
    assert dict(s.params)["status"] == "optimal"
    run_mpi(s, tmp_path)
