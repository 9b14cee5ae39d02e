"""Bounds of sub-groups of fabrics: only the links a schedule of the group can use.

References: closed forms (a rail AllGather over one NIC per GPU), brute force (every fewest-hop
path between members enumerated by networkx; every vertex subset of a small fabric as a cut),
and every algorithm's built schedule under every execution model (the bound never exceeds it).
"""

from __future__ import annotations

import itertools

import networkx as nx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cclc.algorithms import algorithms_for
from cclc.bounds import bounds, cut_bound, injection_bound, lp_bound
from cclc.collective import CollectiveKind, DType, make_collective
from cclc.errors import CclError
from cclc.execution import IR_MODEL, MSCCL_MODEL, NCCL_MODEL, predict
from cclc.group_links import group_links
from cclc.topology import NodeType, leaf_spine, single_switch, torus, with_faults

K = CollectiveKind
NIC = 50e9          # 400 Gb/s
NVLINK = 450e9
MODELS = [IR_MODEL, NCCL_MODEL, MSCCL_MODEL]


def hgx(gpus: int = 4, nics: int = 4, interconnect: str = "nvswitch") -> NodeType:
    return NodeType("hgx", interconnect, gpus, NVLINK, 1e-6, nics=nics, nic_bandwidth=NIC)


def fabric(nodes: int = 4, gpus: int = 4, nics: int = 4, rails: int | None = None,
           spines: int = 2, interconnect: str = "nvswitch", oversubscription: float = 1.0):
    return leaf_spine("f", nodes, hgx(gpus, nics, interconnect), rails=rails or nics,
                      leaves=None, spines=spines, oversubscription=oversubscription,
                      bandwidth=NIC, latency=2e-6)


def coll(topo, kind, size, group):
    root = 0 if kind in (K.BROADCAST, K.REDUCE) else None
    return make_collective("c", kind, topo, tuple(group), size=size, dtype=DType.UINT8,
                           root=root)


# ---- closed forms ------------------------------------------------------------------------------

@pytest.mark.parametrize("nodes", [2, 4, 8])
def test_rail_allgather_is_bound_by_one_nic_per_gpu(nodes):
    # the hgx16_leafspine 'acts' case in small: GPU 0 of every node, one NIC each; the other
    # GPUs of a node do not run the collective, so their NICs carry nothing of it
    t = fabric(nodes)
    n, S = nodes, nodes * 1_000_000
    c = coll(t, K.ALLGATHER, S, t.rail(0))
    want = (n - 1) / n * S / NIC
    b = bounds(c)
    assert b.best == pytest.approx(want, rel=1e-9)
    assert b["lp"].seconds == pytest.approx(want, rel=1e-9)
    assert injection_bound(c).seconds == pytest.approx(want, rel=1e-9)
    # the reduce-scatter is the same by duality; the allreduce sends 2(n-1)/n S through it
    c = coll(t, K.REDUCESCATTER, S, t.rail(0))
    assert bounds(c).best == pytest.approx(want, rel=1e-9)
    c = coll(t, K.ALLREDUCE, S, t.rail(0))
    assert bounds(c).best == pytest.approx(2 * want, rel=1e-9)


def test_the_whole_fabric_keeps_every_healthy_link():
    t = with_faults(fabric(), links=[(fabric().vertex("leaf1"), fabric().vertex("spine0"))])
    mask = group_links(t, np.array(t.all_ranks()))
    assert (mask == ~t.link_failed).all()


def test_rail_alltoall_uses_only_its_leaf():
    t = fabric(4)
    mask = group_links(t, np.array(t.rail(1)))
    used = {(t.vertex_names[u], t.vertex_names[v])
            for u, v in zip(t.link_src[mask].tolist(), t.link_dst[mask].tolist(), strict=True)}
    assert {a for a, _ in used} | {b for _, b in used} == (
        {f"node{i}.gpu1" for i in range(4)} | {f"node{i}.nic1" for i in range(4)} | {"leaf1"})


def test_a_pcie_node_reaches_every_nic_through_its_switch():
    # on a PCIe server the NICs hang off the switch, not a GPU: a lone member per node still
    # reaches all of them, and an allgather of one GPU per node gets every NIC
    t = fabric(4, gpus=4, nics=2, interconnect="pcie")
    c = coll(t, K.ALLGATHER, 4_000_000, t.leaders())
    assert bounds(c).best == pytest.approx(3 / 4 * 4_000_000 / (2 * NIC), rel=1e-9)


def test_routing_none_keeps_the_links_between_members():
    t = torus("t", (6,), bandwidth=10e9, latency=1e-7, routing="none")
    mask = group_links(t, np.array([0, 1, 2, 4]))
    pairs = {(int(u), int(v)) for u, v in zip(t.link_src[mask], t.link_dst[mask], strict=True)}
    assert pairs == {(0, 1), (1, 0), (1, 2), (2, 1)}


# ---- brute force -------------------------------------------------------------------------------

def _brute_force_links(t, group) -> np.ndarray:
    """Links on some fewest-hop path between two members, every such path enumerated."""
    g = t.healthy_graph()
    used = np.zeros(t.n_links, dtype=bool)
    for a, b in itertools.permutations(group, 2):
        if not nx.has_path(g, a, b):
            continue
        for path in nx.all_shortest_paths(g, a, b):
            for u, v in itertools.pairwise(path):
                used[g[u][v]["link"]] = True
    return used


def _brute_force_allgather(t, group, S) -> float:
    """The allgather's bound over every vertex subset (Gale: a flow with supplies exists iff
    every set can ship its surplus out), over the brute-force links."""
    used = _brute_force_links(t, group)
    src, dst, bw = t.link_src[used], t.link_dst[used], t.link_bandwidth[used]
    member = np.zeros(t.n_vertices, dtype=bool)
    member[list(group)] = True
    n, best = len(group), 0.0
    for bits in range(1, 2 ** t.n_vertices - 1):
        side = (bits >> np.arange(t.n_vertices)) & 1 == 1
        k = int((side & member).sum())
        if k in (0, n):
            continue
        out = float(bw[side[src] & ~side[dst]].sum())
        best = max(best, k * S / n / out if out > 0 else np.inf)
    return best


SMALL = [dict(nodes=2, gpus=2, nics=2, spines=1), dict(nodes=3, gpus=2, nics=1, spines=1),
         dict(nodes=2, gpus=2, nics=2, spines=1, interconnect="pcie")]


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.sampled_from(range(len(SMALL))), st.data())
def test_group_links_and_the_allgather_lp_match_brute_force(which, data):
    t = fabric(**SMALL[which])
    ranks = list(t.all_ranks())
    group = sorted(data.draw(st.sets(st.sampled_from(ranks), min_size=2)))
    mask = group_links(t, np.array(group))
    assert (mask == _brute_force_links(t, group)).all()
    if t.n_vertices <= 16:
        S = len(group) * 1_000_000
        want = _brute_force_allgather(t, group, S)
        c = coll(t, K.ALLGATHER, S, group)
        assert lp_bound(c).seconds == pytest.approx(want, rel=1e-6)
        assert cut_bound(c).seconds <= want * (1 + 1e-9)


# ---- the bound never beats a schedule ------------------------------------------------------------

def _topologies():
    t1 = fabric(3, gpus=4, nics=4, spines=2)
    t2 = with_faults(fabric(4, gpus=2, nics=2, spines=2, oversubscription=2.0),
                     links=[(fabric(4, gpus=2, nics=2, spines=2).vertex("leaf0"),
                             fabric(4, gpus=2, nics=2, spines=2).vertex("spine1"))])
    t3 = fabric(3, gpus=4, nics=2, spines=1, interconnect="pcie")
    t4 = single_switch("s", 3, hgx(4, 2), bandwidth=NIC, latency=2e-6)
    # sub-groups of GPU tori: no router (relays only by members) and dimension order
    t5 = torus("t", (3, 3), bandwidth=NIC, latency=1e-7, routing="none")
    t6 = with_faults(torus("t", (4, 2), bandwidth=NIC, latency=1e-7, routing="dimension_order"),
                     links=[(0, 2), (2, 0)])
    # a GPU without its NIC: the other NICs of its server are its rail's way out and in
    # (the `routes` bound counts them as its alone)
    t7 = fabric(3, gpus=4, nics=4, spines=2)
    nic = t7.vertex("node0.nic0")
    touching = (t7.link_src == nic) | (t7.link_dst == nic)
    t7 = with_faults(t7, links=list(zip(t7.link_src[touching].tolist(),
                                         t7.link_dst[touching].tolist(), strict=True)))
    return [t1, t2, t3, t4, t5, t6, t7]


TOPOLOGIES = _topologies()


@pytest.mark.slow
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.sampled_from(range(len(TOPOLOGIES))),
       st.sampled_from([K.ALLGATHER, K.REDUCESCATTER, K.ALLREDUCE, K.ALLTOALL, K.BROADCAST]),
       st.sampled_from([1, 64, 4096]), st.data())
def test_no_schedule_of_any_algorithm_beats_the_bound(which, kind, mult, data):
    t = TOPOLOGIES[which]
    ranks = list(t.all_ranks())
    group = sorted(data.draw(st.sets(st.sampled_from(ranks), min_size=2, max_size=8)))
    n = len(group)
    c = coll(t, kind, n * n * 64 * mult, group)
    try:
        best = bounds(c).best
    except CclError:
        # no link the group can use crosses some cut: then no algorithm may build a schedule
        best = None
    built = 0
    for algo in algorithms_for(c):
        if algo.applicable(c) is not None:
            continue
        try:
            s = algo.build(c)
        except CclError:
            continue
        built += 1
        assert best is not None, (algo.name, "built a schedule for a group the bounds call "
                                  "disconnected")
        for model in MODELS:
            time = predict(s, model).time
            assert best <= time * (1 + 1e-9), (algo.name, model.name, best, time)
    # on the fabrics some algorithm always serves the group (a torus sub-group may have none:
    # on a failed link no dimension-order route joins two neighbours, and none relays)
    assert built >= 1 or t.kind != "fabric"


# ---- a group no schedule can join --------------------------------------------------------------

def test_a_group_the_routing_cannot_join_is_a_located_error(tmp_path, capsys):
    from cclc import cli

    src = tmp_path / "diag.ccl"
    src.write_text("topology pod = torus(4, 4) {\n    link 50 GB/s, 100 ns\n}\n"
                   "collective diag = allgather on pod.ranks[0, 5] { size 1 MiB }\n")
    for argv in (["bounds", src], ["compile", src, "-o", tmp_path / "out"]):
        assert cli.main([str(a) for a in argv]) == 2
        err = capsys.readouterr().err
        # bounds: the group cannot be joined; compile: why each candidate cannot join it
        assert f"{src}:4:1: error: " in err and "'diag'" in err and "routing 'none'" in err
        assert "^~~" in err and "Traceback" not in err
