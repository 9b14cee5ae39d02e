"""The issue's target on cases that were short of it: synthesized trees at >= 95% of the
bound at 128 MiB (IR model) on the 3x3x3 torus with one failed link (AllGather,
ReduceScatter: 94.5% with one to three trees per root) and the 4x4 torus with a failed rank
(examples/torus4x4_failed_rank.ccl, AllReduce: 93.9%). A budget the packing never reaches
keeps the result independent of the machine's load (each packing ends by itself in
seconds)."""

from __future__ import annotations

import os

import pytest
from synth_tori import torus_with_cuts

import dsl
from cclc.algorithms import get
from cclc.bounds import bounds
from cclc.collective import CollectiveKind as K
from cclc.collective import Hint, make_collective
from cclc.sim import simulate
from cclc.verify import verify

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples")


def _at_128_mib(kind, topo):
    group = topo.live_ranks()
    unit = 4 * len(group)
    # named as a user names it (under `auto` the candidate pipelines fewer chunks)
    return make_collective(kind.value, kind, topo, group, size=(128 << 20) // unit * unit,
                           algorithm=Hint("synth"))


def _fraction(coll) -> float:
    s = get("synth").build(coll, race=0, budget=300)
    verify(s)
    return bounds(coll).best / float(simulate(s).time)


@pytest.mark.parametrize("kind", [K.ALLGATHER, K.REDUCESCATTER])
def test_3x3x3_with_a_failed_link(kind):
    topo = torus_with_cuts((3, 3, 3), [((0, 0, 0), (1, 0, 0))], bandwidth=32e9)
    assert _fraction(_at_128_mib(kind, topo)) >= 0.95


def test_the_failed_rank_example_allreduce():
    (topo,) = dsl.load(os.path.join(EXAMPLES, "torus4x4_failed_rank.ccl")).topologies.values()
    assert _fraction(_at_128_mib(K.ALLREDUCE, topo)) >= 0.95
