"""Why an algorithm does not apply names a mesh a mesh, never a torus."""

from __future__ import annotations

import re

import pytest

from cclc.algorithms import algorithms_for
from cclc.collective import CollectiveKind, make_collective
from cclc.topology import torus, with_faults


def _mesh(failed_rank: bool):
    mesh = torus("m", (4, 4), wrap=(False, False), bandwidth=50e9, latency=1e-7)
    return with_faults(mesh, ranks=[5]) if failed_rank else mesh


@pytest.mark.parametrize("failed_rank", [False, True])
@pytest.mark.parametrize("kind", [CollectiveKind.ALLTOALL, CollectiveKind.ALLGATHER,
                                  CollectiveKind.ALLREDUCE])
def test_reasons_on_a_mesh_never_say_torus(kind, failed_rank):
    topo = _mesh(failed_rank)
    group = topo.live_ranks()
    coll = make_collective("c", kind, topo, group, 64 * len(group) * 16)
    reasons = [algo.applicable(coll) for algo in algorithms_for(coll)]
    said = [r for r in reasons if r]
    assert said
    for reason in said:
        # "a torus or mesh" names what an algorithm needs, not what this machine is
        assert "torus" not in re.sub(r"torus(/| or )mesh", "", reason), reason
