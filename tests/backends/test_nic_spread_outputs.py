"""Schedules that spread a GPU without its NIC over its server's live NICs (rail_halving over
cclc.algorithms.nic_spread: chunks cut for it, a ReduceScatter's output and an AllGather's
input padded with empty chunks on the ranks not cut) through every output: the MSCCL XML
passes the independent executor and the NCCL library's MPI build computes numpy's result
(NCCL's runtimes pick a message's NIC themselves, PXN included); MSCCL++, which sends a
rank's port channels through its own NIC only, refuses them, naming the failed NIC."""

from __future__ import annotations

import pytest
from backend_helpers import MPIRUN, run_mpi

from backends.common import EmitOptions
from backends.msccl import render_xml
from backends.msccl.executor import execute
from backends.mscclpp import BACKEND, render_plan
from cclc.algorithms import get
from cclc.collective import CollectiveKind as K
from cclc.collective import make_collective
from cclc.errors import ScheduleError
from cclc.topology import NodeType, leaf_spine, with_faults
from cclc.verify import verify


def _spread(kind: K):
    node = NodeType("hgx3", "nvswitch", 3, 450e9, 1e-6, nics=3, nic_bandwidth=50e9)
    topo = leaf_spine("f", 2, node, rails=3, leaves=None, spines=2, oversubscription=1.0,
                      bandwidth=50e9, latency=2e-6)
    nic = topo.vertex("node0.nic1")
    topo = with_faults(topo, links=[(int(a), int(b)) for a, b in
                                    zip(topo.link_src, topo.link_dst, strict=True)
                                    if nic in (a, b)])
    coll = make_collective(kind.value, kind, topo, topo.all_ranks(), size=4 * 6 * 16 * 3)
    s = get("rail_halving").build(coll)
    verify(s)
    # cut: more ops than the healthy build (two parts per rail op of node0.gpu1)
    assert len(s.ops) > 6 * 3
    return s


KINDS = (K.ALLREDUCE, K.REDUCESCATTER, K.ALLGATHER)


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.value)
def test_msccl_xml_runs_in_the_executor(kind):
    s = _spread(kind)
    for fuse in (True, False):
        execute(render_xml(s, EmitOptions(fuse=fuse)), order="random", seed=3)


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.value)
def test_mscclpp_refuses_a_gpu_without_its_nic(kind):
    s = _spread(kind)
    why = BACKEND.refusal(s, EmitOptions())
    assert why is not None and "(node0.nic1 failed)" in why
    assert "relayed by another GPU" in why
    with pytest.raises(ScheduleError, match=r"node0\.nic1 failed"):
        render_plan(s)


@pytest.mark.skipif(MPIRUN is None, reason="mpirun (OpenMPI) is not installed")
@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.value)
def test_nccl_library_over_mpi(kind, tmp_path):
    run_mpi(_spread(kind), tmp_path)
