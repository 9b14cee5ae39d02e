"""Random schedules (gossip allgathers, random reduction trees) through both lowerings: the
MSCCL XML must pass the independent executor in every runtime dialect, and one of each runs
for real over MPI."""

from __future__ import annotations

import pytest
from backend_helpers import MPIRUN, random_allgather, random_reducescatter, run_mpi
from hypothesis import given, settings
from hypothesis import strategies as st

from backends.common import EmitOptions
from backends.msccl import render_xml
from backends.msccl.executor import execute
from cclc.collective import ReduceOp
from cclc.verify import verify

RUNTIMES = ("msccl", "msccl-executor", "rccl")


def _check_xml(s, op="sum"):
    verify(s)          # the random generator itself must be right, or the test means nothing
    for runtime in RUNTIMES:
        for fuse in (True, False):
            xml = render_xml(s, EmitOptions(msccl_runtime=runtime, fuse=fuse))
            execute(xml, op=op, order="random", seed=len(xml))


@settings(max_examples=25, deadline=None)
@given(st.integers(2, 6), st.integers(0, 10**6))
def test_random_allgather_xml(n, seed):
    _check_xml(random_allgather(n, seed))


@settings(max_examples=25, deadline=None)
@given(st.integers(2, 6), st.integers(0, 10**6))
def test_random_reducescatter_xml(n, seed):
    _check_xml(random_reducescatter(n, seed))


@pytest.mark.slow
@pytest.mark.skipif(MPIRUN is None, reason="mpirun is not installed")
def test_random_schedules_over_mpi(tmp_path):
    run_mpi(random_allgather(5, 7), tmp_path / "ag", scale=2)
    run_mpi(random_reducescatter(5, 11, op=ReduceOp.MIN), tmp_path / "rs")
