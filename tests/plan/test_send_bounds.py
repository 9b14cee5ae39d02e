"""Send bounds (cclc.send_bounds, from the entries' ``sends`` rules) against the simulator.

Each rule is checked two ways: the bound is never above the simulated time of the built
schedule under every execution model, on fabrics (two and three tiers, ECMP or adaptive),
switches and tori, healthy or not; and the rule is coarser than the built schedule, never
finer (no more communication steps, no more bytes sent between members: the built ops are
the independent reference). Pruning with the bounds never changes what ``auto`` picks.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from faulty_tori import faulty_torus
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cclc.algorithms import NoBound, algorithms_for, get
from cclc.collective import CollectiveKind as K
from cclc.collective import make_collective
from cclc.errors import CclError
from cclc.execution import MODELS, predict
from cclc.load_bounds import LoadBound, lower_bound
from cclc.plan import plan
from cclc.send_bounds import send_bound
from cclc.topology import NodeType, fat_tree, leaf_spine, single_switch

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
KINDS = [K.ALLGATHER, K.REDUCESCATTER, K.ALLREDUCE, K.ALLTOALL]
#: every entry with a sends rule, by the collectives it has one for
RULED = {"direct", "ring", "biring", "pat", "bruck", "recursive_doubling", "recursive_halving",
         "halving_doubling", "swing"}


def _node(gpus: int) -> NodeType:
    return NodeType("n", "nvswitch", gpus, 450e9, 1e-6, nics=gpus, nic_bandwidth=50e9)


def _fabric(shape: str, gpus: int, nodes: int, routing: str):
    node = _node(gpus)
    if shape == "leaf_spine":
        t = leaf_spine("f", nodes, node, rails=gpus, leaves=gpus, spines=2,
                       oversubscription=1.0, bandwidth=50e9, latency=2e-6)
    elif shape == "fat_tree":
        t = fat_tree("f", 2 * nodes, node, pods=2, rails=gpus, leaves=gpus, spines=2,
                     cores=2, oversubscription=(1.0, 2.0), bandwidth=50e9, latency=2e-6)
    else:
        return single_switch("f", nodes, node, bandwidth=50e9, latency=1e-6)
    return t if routing == "ecmp" else replace(t, routing=routing, _cache={})


def _ruled(coll):
    """The applicable entries of ``coll`` with a sends rule for it."""
    return [a for a in algorithms_for(coll) if a.applicable(coll) is None
            and not isinstance(a.step_sends(coll), NoBound)]


def _check(coll) -> set[str]:
    """Every ruled entry's bound against its simulated time under every model; returns the
    entries checked."""
    seen = set()
    for algo in _ruled(coll):
        try:
            s = algo.build(coll)
        except CclError:
            continue
        steps = algo.step_sends(coll)
        assert not isinstance(steps, NoBound)
        _check_coarser(s, steps, algo.name)
        for model in MODELS.values():
            bound = send_bound(coll, steps, model).seconds
            time = predict(s, model).time
            assert bound <= time * (1 + 1e-9), (algo.name, model.name, bound, time)
        seen.add(algo.name)
    return seen


def _check_coarser(s, steps, name: str) -> None:
    """The rule states no more steps and no more member-to-member bytes than were built."""
    ops = s.ops
    remote = (ops.src != ops.dst) & (s.op_elems() > 0)
    built_steps = len(np.unique(ops.step[remote]))
    built_bytes = float((s.op_elems()[remote] * s.collective.dtype.itemsize).sum())
    ruled_steps = sum(e.steps for e in steps if not e.joins_previous
                      and ((e.src != e.dst) & (e.nbytes > 0)).any())
    ruled_bytes = sum(float(e.nbytes[e.src != e.dst].sum()) * e.steps for e in steps)
    assert ruled_steps <= built_steps, (name, ruled_steps, built_steps)
    assert ruled_bytes <= built_bytes * (1 + 1e-12), (name, ruled_bytes, built_bytes)


@pytest.mark.parametrize("kind", KINDS)
def test_every_rule_is_a_lower_bound_on_a_small_fabric(kind):
    t = _fabric("fat_tree", 2, 3, "ecmp")
    n = t.n_ranks
    coll = make_collective("c", kind, t, t.all_ranks(), size=n * 4 * 1024)
    seen = _check(coll)
    assert seen and seen <= RULED


@pytest.mark.slow
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.sampled_from(["leaf_spine", "fat_tree", "switch"]), st.sampled_from([1, 2, 4]),
       st.integers(2, 5), st.sampled_from(["ecmp", "adaptive"]), st.sampled_from(KINDS),
       st.sampled_from([1, 3, 256, 65536]))
def test_the_rules_are_lower_bounds_on_fabrics(shape, gpus, nodes, routing, kind, elems):
    t = _fabric(shape, gpus, nodes, routing)
    n = t.n_ranks
    coll = make_collective("c", kind, t, t.all_ranks(), size=n * 4 * elems)
    _check(coll)


@pytest.mark.slow
@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.integers(2, 4), min_size=1, max_size=3).filter(lambda d: np.prod(d) <= 32),
       st.one_of(st.none(), st.integers(0, 10_000)), st.sampled_from(["none", "source"]),
       st.sampled_from(KINDS), st.sampled_from([1, 5, 4096]))
def test_the_rules_are_lower_bounds_on_tori(dims, fault, routing, kind, elems):
    t = faulty_torus(dims, fault, routing)      # one failed cable where the torus stays whole
    n = t.n_ranks
    coll = make_collective("c", kind, t, t.all_ranks(), size=n * 4 * elems)
    _check(coll)


def test_pat_with_a_buffer_is_bounded_step_by_step():
    t = _fabric("leaf_spine", 2, 4, "ecmp")
    coll = make_collective("c", K.ALLGATHER, t, t.all_ranks(), size=8 * 4 * 4096)
    pat = get("pat")
    assert pat is not None
    steps = pat.step_sends(coll, buffer=4096)
    assert not isinstance(steps, NoBound) and len(steps) > 3    # buffer-bounded: more steps
    s = pat.build(coll, buffer=4096)
    for model in MODELS.values():
        assert send_bound(coll, steps, model).seconds <= predict(s, model).time * (1 + 1e-9)


def test_on_spines_the_send_bound_replaces_the_traffic_bound():
    t = _fabric("fat_tree", 2, 2, "ecmp")
    coll = make_collective("c", K.ALLGATHER, t, t.all_ranks(), size=8 * 4 * 1024)
    direct = get("direct")
    assert direct is not None
    est = lower_bound(coll, direct, {}, MODELS["ir"])
    assert isinstance(est, LoadBound) and est.link is None and "send bound" in est.what
    # an entry without a rule says so beside the fabric's reason
    hierarchical = get("hierarchical")
    assert hierarchical is not None
    why = lower_bound(coll, hierarchical, {}, MODELS["ir"])
    assert isinstance(why, NoBound) and "ECMP" in why.reason and "no rule" in why.reason


@pytest.mark.parametrize("kind", [K.ALLGATHER, K.REDUCESCATTER, K.ALLREDUCE, K.ALLTOALL])
def test_pruned_auto_picks_what_unpruned_auto_picks_on_a_fabric(kind):
    t = _fabric("fat_tree", 2, 2, "ecmp")
    n = t.n_ranks
    coll = make_collective("c", kind, t, t.all_ranks(), size=n * 4 * 4096)
    fast = plan(coll)
    full = plan(coll, prune=False)
    assert (fast.name, fast.time) == (full.name, full.time)
    by_name = {r.name: r for r in full.candidates}
    for r in fast.candidates:
        if r.pruned is not None:
            assert r.estimate is not None and r.estimate > fast.time
            other = by_name[r.name].time
            assert other is None or other >= r.estimate * (1 - 1e-9)


@pytest.mark.slow
@pytest.mark.parametrize("name, prunes", [("grads", True), ("shards", True), ("acts", False)])
def test_auto_on_the_example_fabric_picks_what_it_picked_unpruned(name, prunes):
    # examples/hgx16_leafspine.ccl: 16 HGX servers (128 GPUs) on a leaf/spine fabric. Before
    # the send bounds no candidate had a bound on a fabric with spines, so auto built them
    # all: unpruned auto is that choice, and pruned auto must make it at the same time
    import dsl

    program = dsl.load(str(EXAMPLES / "hgx16_leafspine.ccl"))
    (coll,) = [c for c in program.collectives if c.name == name]
    fast = plan(coll)
    full = plan(coll, prune=False)
    assert (fast.name, fast.time) == (full.name, full.time)
    # the whole fabric's collectives skip candidates; one rail's (16 ranks) builds them all
    assert any(r.pruned is not None for r in fast.candidates) == prunes
