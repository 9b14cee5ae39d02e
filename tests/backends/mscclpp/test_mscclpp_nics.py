"""MSCCL++ sends rank ``r``'s port channels through IB device ``r % nranksPerNode`` of its
server and no GPU relays them (:mod:`backends.mscclpp.nics`): a schedule whose routes between
servers do otherwise (NCCL's PXN, a GPU without its NIC, a rail other than the member's
index) is refused, with the op and both NICs named; one whose routes do the same is emitted.
The refusal is checked against a plain walk over every cross-server op's route."""

from __future__ import annotations

import re
from typing import Literal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backends.common import EmitOptions
from backends.mscclpp import BACKEND, render_plan
from backends.mscclpp.nics import nic_refusal
from cclc.algorithms import get
from cclc.collective import CollectiveKind as K
from cclc.collective import make_collective
from cclc.errors import ScheduleError
from cclc.topology import NodeType, leaf_spine, torus, with_faults


def _fabric(gpus: int = 3, nics: int = 3, servers: int = 2,
            interconnect: Literal["nvswitch", "pcie"] = "nvswitch"):
    node = NodeType("box", interconnect, gpus, 450e9, 1e-6, nics=nics, nic_bandwidth=50e9)
    return leaf_spine("f", servers, node, rails=nics, leaves=None, spines=2,
                      oversubscription=1.0, bandwidth=50e9, latency=2e-6)


def _schedule(topo, kind: K, algorithm: str, group=None, size: int | None = None):
    group = topo.all_ranks() if group is None else group
    coll = make_collective(kind.value, kind, topo, group, size=size or 4 * len(group) * 16 * 3)
    algo = get(algorithm)
    assert algo is not None and algo.applicable(coll) is None
    return algo.build(coll)


def _walked(s) -> bool:
    """Whether every op between servers leaves through NIC ``a % k`` of its server, arrives
    through NIC ``b % k`` of its own, and passes through no GPU (members per server ``k``):
    one op and one vertex at a time, from the vertex names."""
    topo, names = s.topology, s.topology.vertex_names
    group = list(s.collective.group)
    server = [int(topo.node_of_rank[r]) for r in group]
    k = server.count(server[0])
    for i in range(len(s.ops)):
        a, b = int(s.ops.src[i]), int(s.ops.dst[i])
        if server[a] == server[b]:
            continue
        heads = [int(topo.link_dst[ln]) for ln in s.routes.path(int(s.ops.route[i]))]
        nics = [names[v] for v in heads if re.fullmatch(r"node\d+\.nic\d+", names[v])]
        if any(v < topo.n_ranks for v in heads[:-1]):
            return False
        if nics[0] != f"node{server[a]}.nic{a % k}" or nics[-1] != f"node{server[b]}.nic{b % k}":
            return False
    return True


def test_routes_through_the_members_own_nics_are_emitted():
    s = _schedule(_fabric(), K.ALLREDUCE, "rail_halving")
    assert _walked(s)
    assert nic_refusal(s) is None and BACKEND.refusal(s, EmitOptions()) is None
    render_plan(s)


def test_pxn_routes_are_refused_with_both_nics_named():
    s = _schedule(_fabric(), K.ALLTOALL, "direct")
    assert not _walked(s)                       # cross-rail pairs go over NVLink to the rail
    why = nic_refusal(s)
    assert why is not None
    assert "relayed by another GPU on the way (as NCCL's PXN does)" in why
    assert re.search(r"rank \d+'s op to rank \d+ would leave through node\d\.nic\d and arrive "
                     r"through node\d\.nic\d, where the schedule routes it through", why)
    assert "failed" not in why
    with pytest.raises(ScheduleError, match="IB device"):
        render_plan(s)


def test_a_rail_group_off_rail_zero_is_refused():
    # one member per server: MSCCL++ sends every member through IB device 0
    topo = _fabric()
    rail = [r for r in topo.all_ranks() if r % 3 == 2]
    s = _schedule(topo, K.ALLGATHER, "ring", group=rail, size=2 * 16)
    assert not _walked(s)
    why = nic_refusal(s)
    assert why is not None and "would leave through node0.nic0" in why
    # rail 0's members leave through nic0: emitted
    assert nic_refusal(_schedule(topo, K.ALLGATHER, "ring", group=[0, 3], size=2 * 16)) is None


def test_a_group_with_servers_of_unequal_size_is_refused():
    topo = _fabric()
    s = _schedule(topo, K.ALLGATHER, "ring", group=[0, 1, 3], size=3 * 16)
    why = nic_refusal(s)
    assert why is not None and "this group has servers of 1, 2 members" in why


def test_a_member_index_past_the_servers_nics_is_refused():
    # 4 GPUs and 2 NICs a server: members 2 and 3 would use IB devices 2 and 3
    topo = _fabric(gpus=4, nics=2, interconnect="pcie")
    s = _schedule(topo, K.ALLGATHER, "ring", size=8 * 16)
    why = nic_refusal(s)
    assert why is not None and re.search(r"IB device [23] of its server .* has no nic[23]", why)


def test_no_server_no_refusal():
    s = _schedule(torus("t", (3, 3)), K.ALLREDUCE, "ring", size=9 * 16)
    assert nic_refusal(s) is None
    topo = _fabric()
    one = _schedule(topo, K.ALLREDUCE, "ring", group=[0, 1, 2], size=3 * 16)
    assert nic_refusal(one) is None             # every op inside one server


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(server=st.integers(0, 3), nic=st.integers(0, 2),
       kind=st.sampled_from([K.ALLREDUCE, K.REDUCESCATTER, K.ALLGATHER]))
def test_a_failed_nic_is_named_wherever_it_is(server, nic, kind):
    topo = _fabric(servers=4)          # (rail_halving: a power of two of servers)
    topo = with_faults(topo, devices=[topo.vertex(f"node{server}.nic{nic}")])
    s = _schedule(topo, kind, "rail_halving")
    assert not _walked(s)
    why = nic_refusal(s)
    assert why is not None and f"(node{server}.nic{nic} failed)" in why


@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(gpus=st.integers(1, 3), servers=st.integers(2, 3),
       case=st.sampled_from([(K.ALLREDUCE, "ring"), (K.ALLGATHER, "ring"),
                             (K.ALLGATHER, "direct"), (K.ALLTOALL, "direct")]))
def test_the_refusal_is_the_walks(gpus, servers, case):
    kind, algorithm = case
    topo = _fabric(gpus=gpus, nics=gpus, servers=servers)
    n = gpus * servers
    s = _schedule(topo, kind, algorithm, size=n * 16 * 2)
    assert (nic_refusal(s) is None) == _walked(s)
