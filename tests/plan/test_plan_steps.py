"""The planner's progress steps say what each long wait is: the lower bounds' current step,
the candidates' load bounds, then building (and on a fabric planning the spines), verifying and
simulating each candidate."""

from __future__ import annotations

import dataclasses

from cclc.collective import CollectiveKind as K
from cclc.collective import Hint, make_collective
from cclc.plan import plan
from cclc.topology import NodeType, leaf_spine, torus


def _steps(coll) -> list[str]:
    seen: list[str] = []
    plan(coll, on_step=lambda i, total, what: seen.append(what))
    return seen


def test_auto_steps_name_every_wait():
    topo = torus("t", (4, 4), bandwidth=50e9, latency=1e-7, routing="none")
    coll = make_collective("a", K.ALLTOALL, topo, tuple(range(16)), size=16 * 4 * 16)
    seen = _steps(coll)
    assert seen[0] == "lower bounds"
    assert "lower bounds: closed forms (hop bytes, injection, cuts, latency)" in seen
    assert any(s.startswith("lower bounds: solving the flow LP (") for s in seen)
    assert any(s.startswith("load bounds of the ") for s in seen)
    assert any(s.endswith(" ops") and ": verifying " in s for s in seen)
    assert any(s.endswith(" ops") and ": simulating " in s for s in seen)


def test_an_explicit_entry_says_building_verifying_simulating():
    topo = torus("t", (6,), bandwidth=50e9, latency=1e-7, routing="none")
    coll = dataclasses.replace(
        make_collective("g", K.ALLGATHER, topo, tuple(range(6)), size=6 * 4 * 8),
        algorithm=Hint("ring"))
    seen = _steps(coll)
    # 30 sends and each rank's copy of its own block
    assert seen[-3:] == ["ring: building", "ring: verifying 36 ops", "ring: simulating 36 ops"]


def test_a_fabric_build_says_it_plans_the_spines():
    """Between building and verifying, a candidate on a fabric with spines says it plans
    them (at 4,096 GPUs most of its build); on a torus it has none to plan."""
    gpu = NodeType("g1", "pcie", 1, 48e9, 1e-6, nics=1, nic_bandwidth=50e9)
    topo = leaf_spine("l", 6, gpu, rails=1, leaves=3, spines=3, oversubscription=1.0,
                      bandwidth=50e9, latency=1e-6)
    coll = dataclasses.replace(
        make_collective("a", K.ALLTOALL, topo, tuple(range(6)), size=6 * 4 * 8),
        algorithm=Hint("direct"))
    seen = _steps(coll)
    at = seen.index("direct: building")
    assert seen[at + 1] == "direct: planning the spines of 36 ops"
    assert seen[at + 2].startswith("direct: verifying ")
    auto = _steps(dataclasses.replace(coll, algorithm=Hint("auto")))
    assert any(s.endswith(": planning the spines of 36 ops") for s in auto)
    ring = _steps(make_collective("a", K.ALLTOALL, torus("t", (4,), bandwidth=50e9,
                                                        latency=1e-7, routing="none"),
                                  tuple(range(4)), size=4 * 4 * 4))
    assert not any("spines" in s for s in ring)
