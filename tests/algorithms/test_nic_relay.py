"""synth with a lost NIC (cclc.algorithms.nic_relay): trees packed on the machine with the NIC
working, the ops of the GPU without it relayed whole through the live NICs of its server.
The schedule verifies, computes numpy's numbers, crosses no failed link, needs no relay
lowering, spreads the lost NIC's ops over every live NIC, and each relayed op takes the path
a brute-force search over every relay finds least busy in its step."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from cclc.algorithms import BuildContext
from cclc.algorithms.nic_relay import healed_nics, nic_slowdown, relay_lost_nics
from cclc.algorithms.nic_spread import NicSpread, spread_nics
from cclc.algorithms.synth_trees import synthesize_tree_schedule
from cclc.collective import CollectiveKind as K
from cclc.collective import make_collective
from cclc.numeric import check_numeric
from cclc.relay import relay_count
from cclc.sim import simulate
from cclc.synth.report import synth_report
from cclc.topology import NodeType, Topology, leaf_spine, with_faults
from cclc.verify import verify

REPO = Path(__file__).resolve().parents[2]
KINDS = (K.ALLGATHER, K.REDUCESCATTER, K.ALLREDUCE)


def _fabric(nodes: int, gpus: int) -> Topology:
    hgx = NodeType("hgx", "nvswitch", gpus, 450e9, 1e-6, nics=gpus, nic_bandwidth=50e9)
    return leaf_spine("f", nodes, hgx, rails=gpus, leaves=None, spines=2,
                      oversubscription=1.0, bandwidth=50e9, latency=2e-6)


def _without_nic(topo: Topology, h: int, i: int, **faults) -> Topology:
    """``topo`` with NIC ``i`` of node ``h`` failed (``fault nic node(h).nic(i)``)."""
    return with_faults(topo, devices=[topo.vertex(f"node{h}.nic{i}")], **faults)


def _coll(topo: Topology, kind: K, blocks: int = 4):
    n = topo.n_ranks
    return make_collective("c", kind, topo, topo.all_ranks(), size=4 * n * blocks * 8)


def test_healed_nics_heals_the_lost_nics_alone():
    topo = _fabric(4, 4)
    assert healed_nics(_coll(topo, K.ALLREDUCE)) is None
    uplink = (topo.vertex("leaf1"), topo.vertex("spine0"))
    faulty = _without_nic(topo, 1, 2, links=[uplink])
    healed = healed_nics(_coll(faulty, K.ALLREDUCE))
    assert healed is not None
    again = healed.topology
    v = topo.vertex("node1.nic2")
    of_nic = (topo.link_src == v) | (topo.link_dst == v)
    assert of_nic.sum() == 4 and faulty.link_failed[of_nic].all()
    assert np.array_equal(again.link_failed, faulty.link_failed & ~of_nic)
    assert again.link_failed[topo.link_id(*uplink)]
    assert nic_slowdown(_coll(faulty, K.ALLREDUCE)) == pytest.approx(4 / 3)
    # a server with one live NIC left has nothing to share the lost one's bytes with
    two = _fabric(4, 2)
    assert healed_nics(_coll(_without_nic(two, 0, 0), K.ALLREDUCE)) \
        is None


def _brute_force_choice(s, coll) -> None:
    """Replays the rule over every relay path of every relayed op, in (step, -bytes, op)
    order, with the other ops' busy seconds summed from scratch per step."""
    spread = NicSpread(coll, 0)
    topo = coll.topology
    ops = s.ops
    src, dst = ops.src.astype(np.int64), ops.dst.astype(np.int64)
    moved = np.flatnonzero((spread.node[src] != spread.node[dst])
                           & (spread.dead[src] | spread.dead[dst]))
    size = s.op_bytes().astype(float)
    op_of, link = s.op_links()
    bw = topo.link_bandwidth
    mine = np.isin(op_of, moved)
    for step in np.unique(ops.step[moved]).tolist():
        load = np.zeros(topo.n_links)
        other = ~mine & (ops.step[op_of] == step)
        np.add.at(load, link[other], size[op_of[other]] / bw[link[other]])
        here = [k for k in moved.tolist() if ops.step[k] == step]
        for k in sorted(here, key=lambda k: (-size[k], k)):
            paths = spread.parts(int(src[k]), int(dst[k]))
            scores = [(max(load[p] + size[k] / bw[p]), sum(load[p] + size[k] / bw[p]), j)
                      for j, p in enumerate(paths)]
            chosen = paths[min(scores)[2]]
            assert list(s.routes.path(int(ops.route[k]))) == chosen.tolist()
            load[chosen] += size[k] / bw[chosen]


@settings(max_examples=10, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(KINDS),
       lost=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3)), min_size=1, max_size=2,
                     unique_by=lambda x: x[0]),
       seed=st.integers(0, 2**16))
@example(kind=K.ALLREDUCE, lost=[(0, 1), (2, 1)], seed=0)     # both ends of some ops
@example(kind=K.REDUCESCATTER, lost=[(0, 1), (3, 2)], seed=1)
def test_relayed_synth_is_correct_and_spread(monkeypatch, kind, lost, seed):
    import cclc.algorithms.synth_trees as synth_trees

    # the relayed schedule whatever its time (the faulty machine's own packing is tested
    # below); the same setting for every input
    monkeypatch.setattr(synth_trees, "RELAY_SLACK", float("inf"))
    topo = _fabric(4, 4)
    faulty = with_faults(topo, devices=[topo.vertex(f"node{h}.nic{i}") for h, i in lost])
    coll = _coll(faulty, kind)
    s = synthesize_tree_schedule(coll, BuildContext()).schedule
    assert s is not None and s.collective is coll
    verify(s)
    check_numeric(s, seed=seed)
    _, links = s.op_links()
    assert not faulty.link_failed[links].any()
    assert relay_count(s) == 0
    dead = [topo.vertex(f"node{h}.gpu{i}") for h, i in lost]
    assert spread_nics(s) == dict.fromkeys(sorted(dead), 3)
    relayed = dict(s.params)["nic_relayed"]
    src, dst = s.ops.src.astype(int), s.ops.dst.astype(int)
    node_of = faulty.node_of_rank
    crossing = (node_of[src] != node_of[dst]) & (np.isin(src, dead) | np.isin(dst, dead))
    assert relayed == int(crossing.sum()) > 0
    assert "ops relayed through live NICs" in synth_report(s)
    assert 0 < dict(s.params)["lp_fraction"] <= 1
    _brute_force_choice(s, coll)


def test_relaying_needs_every_other_route_alive():
    topo = _fabric(4, 4)
    faulty = _without_nic(topo, 1, 2)
    coll = _coll(faulty, K.ALLGATHER)
    healed = healed_nics(coll)
    assert healed is not None
    s = synthesize_tree_schedule(healed, BuildContext()).schedule
    assert relay_lost_nics(s, coll) is not None
    # a link some kept op crosses fails too: the healed plan does not carry over
    op_of, links = s.op_links()
    ends = s.ops.src[op_of], s.ops.dst[op_of]
    node_of = faulty.node_of_rank
    kept = links[(node_of[ends[0]] == node_of[ends[1]]) & (ends[0] != topo.vertex("node1.gpu2"))
                 & (ends[1] != topo.vertex("node1.gpu2"))]
    a, b = int(faulty.link_src[kept[0]]), int(faulty.link_dst[kept[0]])
    broken = _coll(with_faults(faulty, links=[(a, b)]), K.ALLGATHER)
    assert relay_lost_nics(s, broken) is None


def test_a_bandwidth_bound_relay_costs_about_a_share_of_the_live_nics():
    """Where the lost NIC's GPU moves many ops a step (hgx16's 1 GiB AllReduce: 960 relayed
    ops) the relays share its bytes: the relayed schedule within 3% of (L + 1) / L times the
    healed one (7 live NICs: 8/7)."""
    import dsl

    text = (REPO / "examples" / "hgx16_leafspine.ccl").read_text().replace(
        "    fault link leaf(2) -- spine(5)",
        "    fault link leaf(2) -- spine(5)\n    fault nic node(0).nic(0)")
    prog = dsl.loads(text, "hgx16_nic.ccl")
    coll = next(c for c in prog.collectives if c.name == "grads")
    healed = healed_nics(coll)
    assert healed is not None
    twin = synthesize_tree_schedule(healed, BuildContext()).schedule
    s = relay_lost_nics(twin, coll)
    assert s is not None
    ratio = float(simulate(s).time) / float(simulate(twin).time)
    assert 1 < ratio <= nic_slowdown(coll) * 1.03


@pytest.mark.parametrize("slack", [0.0, float("inf")])
def test_the_faulty_machine_is_packed_too_where_relaying_is_far_off(monkeypatch, slack):
    """Above RELAY_SLACK times the live NICs' share the faulty machine's own packing is tried
    in what is left of the budget, and the faster of the two kept; below, it is not tried."""
    import cclc.algorithms.synth_trees as synth_trees

    topo = _fabric(4, 4)
    coll = _coll(_without_nic(topo, 1, 2), K.ALLGATHER)
    seen: dict[str, list] = {"packed": [], "relayed": []}
    pack, relay = synth_trees._synthesize, synth_trees.relay_lost_nics

    def packed(c, context, params, slowdown=1.0):
        found, seconds = pack(c, context, params, slowdown)
        seen["packed"].append((c, params, found.schedule))
        return found, seconds

    def relayed(s, c):
        out = relay(s, c)
        seen["relayed"].append(out)
        return out

    monkeypatch.setattr(synth_trees, "RELAY_SLACK", slack)
    monkeypatch.setattr(synth_trees, "_synthesize", packed)
    monkeypatch.setattr(synth_trees, "relay_lost_nics", relayed)
    s = synthesize_tree_schedule(coll, BuildContext()).schedule
    (on_relays,) = seen["relayed"]
    if slack == float("inf"):
        assert len(seen["packed"]) == 1 and s is not None
        assert s.ops is on_relays.ops
        return
    (_, healed_params, _), (again, params, own) = seen["packed"]
    assert again is coll and healed_params == {}
    assert 0 < params["budget"] < synth_trees.DEFAULT_BUDGET
    fastest = min((on_relays, own), key=lambda x: float(simulate(x).time))
    assert float(simulate(s).time) == float(simulate(fastest).time)
