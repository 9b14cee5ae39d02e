"""Routes between servers through each GPU's own NIC (:mod:`cclc.own_nics`), what MSCCL++'s
port channels run: every op between servers whose GPUs have a healthy NIC leaves through the
source's and arrives through the destination's, crosses no GPU on the way, in as few hops as
a breadth-first search of the fabric without GPUs finds (networkx); the schedule stays
verified and MSCCL++ takes it. A GPU without its NIC keeps its routes, and the builds told
``own_nics`` (:class:`cclc.algorithms.BuildContext`) have its traffic relayed by a server
mate in two ops (``lower_relays(across_ranks=False)``), which MSCCL++ takes too and its
executor's semantics run. ``cclc compile`` routes so only when ``--emit`` names an output
whose runtime sends that way."""

from __future__ import annotations

import json
from typing import Literal

import networkx as nx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backends.common import EmitOptions
from backends.mscclpp import BACKEND, render_plan
from backends.mscclpp.executor import run
from backends.mscclpp.nics import nic_refusal
from cclc import own_nics
from cclc.algorithms import BuildContext, get
from cclc.collective import CollectiveKind as K
from cclc.collective import make_collective
from cclc.own_nics import own_nic_routes
from cclc.pipeline import Request, compile_program
from cclc.relay import lower_relays
from cclc.topology import NodeType, leaf_spine, torus, with_faults
from cclc.verify import verify
from dsl import loads


def _fabric(gpus: int = 3, servers: int = 2,
            interconnect: Literal["nvswitch", "pcie"] = "nvswitch"):
    node = NodeType("box", interconnect, gpus, 450e9, 1e-6, nics=gpus, nic_bandwidth=50e9)
    return leaf_spine("f", servers, node, rails=gpus, leaves=None, spines=2,
                      oversubscription=1.0, bandwidth=50e9, latency=2e-6)


def _schedule(topo, kind: K, algorithm: str):
    coll = make_collective(kind.value, kind, topo, topo.all_ranks(),
                           size=4 * topo.n_ranks * 16 * 3)
    algo = get(algorithm)
    assert algo is not None and algo.applicable(coll) is None
    return algo.build(coll)


def _own_nic_walks(s, skip=()) -> None:
    """Every op between servers (but those of ranks ``skip``) leaves through its source's
    NIC, arrives through its destination's, crosses no GPU, in the fewest hops networkx finds
    between the two NICs on the healthy fabric without GPUs."""
    topo, names = s.topology, s.topology.vertex_names
    fabric = nx.DiGraph()
    fabric.add_edges_from((int(a), int(b)) for a, b, bad in
                          zip(topo.link_src, topo.link_dst, topo.link_failed, strict=True)
                          if not bad and a >= topo.n_ranks and b >= topo.n_ranks)
    group = list(s.collective.group)
    for i in range(len(s.ops)):
        a, b = group[int(s.ops.src[i])], group[int(s.ops.dst[i])]
        if topo.node_of_rank[a] == topo.node_of_rank[b] or a in skip or b in skip:
            continue
        path = s.routes.path(int(s.ops.route[i]))
        verts = [int(topo.link_src[path[0]])] + [int(topo.link_dst[ln]) for ln in path]
        assert verts[0] == a and verts[-1] == b
        assert all(v >= topo.n_ranks for v in verts[1:-1])
        # GPU g of a server (ranks server-major, as the builder numbers them) has NIC g
        na = f"node{topo.node_of_rank[a]}.nic{names[a].rsplit('gpu', 1)[1]}"
        nb = f"node{topo.node_of_rank[b]}.nic{names[b].rsplit('gpu', 1)[1]}"
        assert (names[verts[1]], names[verts[-2]]) == (na, nb)
        assert len(path) == 2 + nx.shortest_path_length(fabric, verts[1], verts[-2])


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(gpus=st.integers(2, 4), servers=st.integers(2, 3),
       case=st.sampled_from([(K.ALLTOALL, "direct"), (K.ALLGATHER, "direct"),
                             (K.ALLREDUCE, "ring"), (K.REDUCESCATTER, "ring")]))
def test_every_op_between_servers_goes_through_its_own_nics(gpus, servers, case):
    s = _schedule(_fabric(gpus, servers), *case)
    assert nic_refusal(s) is not None                 # the searches took PXN routes
    t = own_nic_routes(s)
    verify(t)
    _own_nic_walks(t)
    assert nic_refusal(t) is None
    assert len(t.ops) == len(s.ops)
    assert (t.ops.step == s.ops.step).all() and (t.ops.count == s.ops.count).all()


def test_the_plan_runs_in_the_executor_of_mscclpps_semantics():
    t = own_nic_routes(_schedule(_fabric(3, 2), K.ALLTOALL, "direct"))
    assert BACKEND.refusal(t, EmitOptions()) is None
    for inplace in (False, True):
        run(render_plan(t, inplace=inplace), seeds=2)


def test_a_gpu_without_its_nic_keeps_its_routes():
    topo = _fabric(3, 2)
    topo = with_faults(topo, devices=[topo.vertex("node0.nic1")])
    s = _schedule(topo, K.ALLTOALL, "direct")
    t = own_nic_routes(s)
    verify(t)
    _own_nic_walks(t, skip={1})
    for i in range(len(s.ops)):
        if 1 in (int(s.ops.src[i]), int(s.ops.dst[i])):
            assert s.routes.path(int(s.ops.route[i])) == t.routes.path(int(t.ops.route[i]))
    assert "(node0.nic1 failed)" in (nic_refusal(t) or "")


def test_a_nic_reached_only_through_a_gpu_keeps_its_routes():
    # node1.nic0's cable down from its leaf failed, its cable up healthy: the NIC still sends
    # (a healthy NIC of its own for node1.gpu0), but the fewest hops into it from another
    # server's NIC come through a GPU of node1, which would forward them: those ops keep
    # their routes, and every other op between servers takes its own NICs
    topo = _fabric(3, 2)
    nic = topo.vertex("node1.nic0")
    leaf = next(int(u) for u, w in zip(topo.link_src, topo.link_dst, strict=True)
                if w == nic and topo.vertex_names[u].startswith("leaf"))
    topo = with_faults(topo, [(leaf, nic)])
    into = topo.vertex("node1.gpu0")
    s = _schedule(topo, K.ALLTOALL, "direct")
    t = own_nic_routes(s)
    verify(t)
    _own_nic_walks(t, skip={into})
    kept = 0
    for i in range(len(s.ops)):
        if int(s.ops.dst[i]) == into and int(s.ops.src[i]) < 3:
            assert s.routes.path(int(s.ops.route[i])) == t.routes.path(int(t.ops.route[i]))
            kept += 1
    assert kept == 3


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(server=st.integers(0, 1), nic=st.integers(0, 2),
       case=st.sampled_from([(K.ALLREDUCE, "rail_halving"), (K.ALLREDUCE, "synth"),
                             (K.REDUCESCATTER, "hierarchical"), (K.ALLTOALL, "direct"),
                             (K.ALLGATHER, "ring")]))
def test_own_nic_builds_relay_a_gpu_without_its_nic_through_a_mate(server, nic, case):
    topo = _fabric(3, 2)
    lost = topo.vertex(f"node{server}.gpu{nic}")
    topo = with_faults(topo, devices=[topo.vertex(f"node{server}.nic{nic}")])
    kind, algorithm = case
    coll = make_collective(kind.value, kind, topo, topo.all_ranks(),
                           size=4 * topo.n_ranks * 16 * 3)
    algo = get(algorithm)
    assert algo is not None and algo.applicable(coll) is None
    s = algo.build(coll, context=BuildContext(own_nics=True))
    verify(s)
    assert nic_refusal(s) is None
    _own_nic_walks(s)                               # the lost GPU's ops stay in its server
    assert topo.node_of_rank is not None
    for i in range(len(s.ops)):
        if lost in (int(s.ops.src[i]), int(s.ops.dst[i])):
            assert topo.node_of_rank[int(s.ops.src[i])] == topo.node_of_rank[int(s.ops.dst[i])]
    run(render_plan(s), seeds=1)


def test_relays_across_ranks_only_where_asked():
    topo = _fabric(3, 2)
    s = _schedule(topo, K.ALLTOALL, "direct")        # PXN routes: carried by ECMP
    assert lower_relays(s) is s
    cut = lower_relays(s, across_ranks=False)
    verify(cut)
    assert len(cut.ops) > len(s.ops) and cut.n_steps > s.n_steps
    inner = [v for i in range(len(cut.ops))
             for v in [int(topo.link_dst[ln]) for ln in cut.routes.path(int(cut.ops.route[i]))][:-1]
             if v < topo.n_ranks]
    assert not inner


@pytest.mark.parametrize("block", [1, 1 << 18])
def test_nothing_to_route_is_the_schedule_itself(block, monkeypatch):
    # (block 1: the routes compared with the new paths one at a time)
    monkeypatch.setattr(own_nics, "_SAME_BLOCK", block)
    on_torus = _schedule(torus("t", (3, 3)), K.ALLREDUCE, "ring")
    assert own_nic_routes(on_torus) is on_torus
    one_gpu = _schedule(_fabric(1, 3), K.ALLTOALL, "direct")   # own NICs already
    assert own_nic_routes(one_gpu) is one_gpu
    # its first pair between servers, on one rail, keeps its path; the next does not
    pxn = _schedule(_fabric(3, 2), K.ALLTOALL, "direct")
    assert own_nic_routes(pxn) is not pxn


TEXT = """node box = nvswitch(gpus = 3) {
    link 450 GB/s, 1 us
    nic  3 x 400 Gb/s
}
topology f = fabric(leaf_spine) {
    nodes  2 x box
    rails  3
    spines 2
    link   400 Gb/s, 2 us
}
collective a2a = alltoall on f { size 576 KiB; algorithm direct }
"""


@pytest.mark.parametrize("emit, own", [(("json", "mscclpp"), True), (("json",), False)])
def test_compile_routes_so_only_for_an_output_that_sends_so(tmp_path, emit, own):
    source = tmp_path / "f.ccl"
    source.write_text(TEXT)
    (done,) = compile_program(loads(TEXT, str(source)), tmp_path / "out", Request(emit=emit))
    assert done.error is None and not done.missing and done.plan is not None
    assert ("mscclpp" in emit) == (tmp_path / "out" / "a2a.mscclpp.json").exists()
    assert (nic_refusal(done.plan.schedule) is None) == own
    doc = json.loads((tmp_path / "out" / "a2a.schedule.json").read_text())
    assert doc["algorithm"] == "direct"
