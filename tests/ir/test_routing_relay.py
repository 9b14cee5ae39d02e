"""Declared routing (cclc.routing) and the relay lowering (cclc.relay), against independent
references: a coordinate walker for dimension-order paths, networkx for fewest hops, the
verifier and numpy (numeric interpreter) for what a lowered schedule computes."""

from __future__ import annotations

from dataclasses import replace
from itertools import pairwise

import networkx as nx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cclc.algorithms import get
from cclc.collective import CollectiveKind, DType, make_collective
from cclc.errors import CclError, ScheduleError
from cclc.ir import Routes
from cclc.numeric import check_numeric
from cclc.relay import lower_relays, relay_count
from cclc.routing import carried_routes, carried_segments
from cclc.sim import simulate
from cclc.topology import torus, with_faults
from cclc.verify import verify


def _dor_reference(topo, u, v):
    cur, goal = list(topo.coords(u)), topo.coords(v)
    links = []
    for d, n in enumerate(topo.dims):
        while cur[d] != goal[d]:
            up = (goal[d] - cur[d]) % n
            if topo.wrap[d] and n > 2:
                step = 1 if up <= n - up else -1
            else:
                step = 1 if goal[d] > cur[d] else -1
            nxt = list(cur)
            nxt[d] = (cur[d] + step) % n
            links.append(topo.link_id(topo.rank_at(cur), topo.rank_at(nxt)))
            cur = nxt
    return tuple(links)


def _routes(paths):
    offsets = np.concatenate([[0, 0], np.cumsum([len(p) for p in paths])])
    links = np.concatenate([np.array(p, dtype=np.int32) for p in paths]) if paths else []
    return Routes(offsets, links)


tori = st.tuples(st.lists(st.integers(1, 5), min_size=1, max_size=3),
                 st.lists(st.booleans(), min_size=3, max_size=3))


@settings(max_examples=40, deadline=None)
@given(tori, st.data())
def test_dimension_order_carries_exactly_the_dimension_order_path(shape, data):
    dims, wraps = shape
    t = replace(torus("t", dims, wrap=wraps[:len(dims)]), routing="dimension_order", _cache={})
    if t.n_ranks < 2:
        return
    u = data.draw(st.integers(0, t.n_ranks - 1))
    v = data.draw(st.integers(0, t.n_ranks - 1).filter(lambda x: x != u))
    dor = _dor_reference(t, u, v)
    # every simple path of the same length (brute force on the graph) other than dor is not
    g = t.healthy_graph()
    others = [tuple(g[a][b]["link"] for a, b in pairwise(p))
              for p in nx.all_shortest_paths(g, u, v)]
    paths = [dor] + [p for p in others if p != dor]
    ok = carried_routes(t, _routes(paths))[1:]
    assert ok[0] and not ok[1:].any()
    # fewest hops: 'shortest' carries every one of them, 'none' only single links
    assert carried_routes(replace(t, routing="shortest", _cache={}), _routes(others))[1:].all()
    assert (carried_routes(replace(t, routing="none", _cache={}), _routes(others))[1:]
            == (len(dor) == 1)).all()


def test_dimension_order_path_over_a_failed_link_is_cut_where_a_rank_relays():
    t = with_faults(replace(torus("t", (5, 5)), routing="dimension_order", _cache={}),
                    links=[((0 * 5 + 0), (1 * 5 + 0)), ((1 * 5 + 0), 0)])
    # the dimension-order path 0 -> 5 is the failed link; the healthy 3-hop detour is not a
    # dimension-order path as a whole, so it is cut into pieces that are, at relaying ranks
    path = tuple(t.shortest_path_links(0, 5))
    assert len(path) == 3
    pieces = carried_segments(t, path)
    assert sum(len(p) for p in pieces) == 3 and len(pieces) >= 2
    assert all(carried_routes(t, _routes([p]))[1] for p in pieces)


@pytest.mark.parametrize("routing", ["none", "dimension_order", "shortest"])
@pytest.mark.parametrize("name", ["direct", "foldedring+pipeline", "mate", "matee", "bruck"])
def test_lowered_schedules_verify_and_compute_the_collective(routing, name):
    t = with_faults(torus("t", (5, 5), bandwidth=32e9, latency=1e-7, routing=routing),
                    links=[(12, 17), (17, 12)])
    c = make_collective("a", CollectiveKind.ALLTOALL, t, t.all_ranks(), 25 * 4 * 12)
    s = get(name).build(c)
    assert relay_count(s) == 0
    verify(s)
    check_numeric(s, dtypes=[DType.FP32])
    src = get(name).build(make_collective("a", CollectiveKind.ALLTOALL,
                                          replace(t, routing="source", _cache={}),
                                          t.all_ranks(), 25 * 4 * 12))
    if routing == "none" and name == "direct":
        assert len(s.ops) > len(src.ops)          # the multi-hop pairs became relays
    # store and forward is never faster than cut-through along the same routes
    assert simulate(s).time >= simulate(src).time * (1 - 1e-9)


def test_relays_pipeline_chunk_by_chunk():
    # one op of 6 chunks over 3 hops: 6 + 3 - 1 sub-steps of one chunk, not 3 of six
    from cclc.ir import Buf, ScheduleBuilder

    t = torus("r", (8,), bandwidth=1e9, routing="none")
    c = make_collective("x", CollectiveKind.ALLTOALL, t, t.all_ranks(), 8 * 6 * 4)
    b = ScheduleBuilder(c, input=[6] * 8, output=[6] * 8)
    for r in range(8):
        for q in range(8):
            kw = dict(src_buf=Buf.INPUT, src_off=q, dst_buf=Buf.OUTPUT, dst_off=r)
            if r == q:
                b.add(step=0, src=r, dst=r, **kw)
            else:
                b.add(step=0, src=r, dst=q, route=b.route(t.shortest_path_links(r, q)), **kw)
    s = b.build("hand")
    low = lower_relays(s)
    verify(low)
    assert low.n_steps == max(len(t.shortest_path_links(0, q)) for q in range(8))
    # with 6 chunks per op it pipelines: on a line of 4, the 3-hop ops of 6 chunks take
    # 6 + 3 - 1 sub-steps of one chunk each
    line = torus("l", (4,), wrap=[False], bandwidth=1e9, routing="none")
    c6 = make_collective("y", CollectiveKind.ALLTOALL, line, line.all_ranks(), 4 * 6 * 4)
    b = ScheduleBuilder(c6, input=[1] * 24, output=[1] * 24)
    for r in range(4):
        for q in range(4):
            kw = dict(src_buf=Buf.INPUT, src_off=6 * q, dst_buf=Buf.OUTPUT, dst_off=6 * r,
                      count=6)
            if r == q:
                b.add(step=0, src=r, dst=r, **kw)
            else:
                b.add(step=0, src=r, dst=q, route=b.route(line.shortest_path_links(r, q)),
                      **kw)
    low = lower_relays(b.build("hand"))
    verify(low)
    check_numeric(low, dtypes=[DType.FP32])
    assert low.n_steps == 6 + 3 - 1
    into_scratch = low.ops.dst_buf == Buf.SCRATCH
    assert into_scratch.any() and (low.ops.count[into_scratch] == 1).all()


def test_a_relay_outside_the_group_is_refused():
    t = torus("r", (6,), routing="none")
    c = make_collective("x", CollectiveKind.ALLTOALL, t, (0, 3), 2 * 4 * 2)
    with pytest.raises(ScheduleError, match="not a rank of collective"):
        get("direct").build(c)
    # auto reports it per candidate, and fails with every reason when nothing else serves
    from cclc.plan import plan

    with pytest.raises(CclError, match="direct: a route of schedule 'direct' must be relayed"):
        plan(c)
    assert plan(replace(c, topology=replace(t, routing="shortest", _cache={}))).name == "direct"


def test_the_language_declares_routing(tmp_path):
    import dsl

    src = ("topology t = torus(4, 4) { link 1 GB/s, 1 us; routing ROUTING }\n"
           "collective a = alltoall on t { size 1 MiB }\n")
    assert dsl.loads(src.replace("; routing ROUTING", "")).collectives[0].topology.routing \
        == "none"
    for r in ("none", "dimension_order", "shortest", "source"):
        assert dsl.loads(src.replace("ROUTING", r)).collectives[0].topology.routing == r
    with pytest.raises(CclError, match="unknown routing 'ecmp'.*expected one of none"):
        dsl.loads(src.replace("ROUTING", "ecmp"))
    fab = ("node g = pcie(gpus = 1) { link 1 GB/s, 1 us; nic 1 x 100 Gb/s }\n"
           "topology f = fabric(switch) { nodes 4 x g; link 100 Gb/s, 1 us ROUTING }\n")
    assert dsl.loads(fab.replace(" ROUTING", "")).topologies["f"].routing == "ecmp"
    assert dsl.loads(fab.replace(" ROUTING", "; routing adaptive")).topologies["f"].routing \
        == "adaptive"
    with pytest.raises(CclError, match="did you mean 'dimension_order'"):
        dsl.loads(src.replace("ROUTING", "dimension_ordr"))


@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.integers(2, 5), min_size=1, max_size=3), st.integers(0, 1000),
       st.sampled_from(["none", "dimension_order"]))
def test_direct_on_random_faulty_tori_lowers_to_carried_moves(dims, seed, routing):
    t = torus("t", dims, routing=routing)
    if t.n_links:
        k = seed % t.n_links
        u, v = int(t.link_src[k]), int(t.link_dst[k])
        t2 = with_faults(t, links=[(u, v), (v, u)])
        t = t2 if t2.is_connected(t2.all_ranks()) else t
    c = make_collective("a", CollectiveKind.ALLTOALL, t, t.all_ranks(), t.n_ranks ** 2 * 4)
    s = get("direct").build(c)
    verify(s)
    lengths = s.routes.lengths()[s.ops.route]
    if routing == "none":
        assert (lengths <= 1).all()
    assert carried_routes(t, s.routes)[s.ops.route].all()


def test_the_carried_routes_are_kept_on_the_table_for_each_topology():
    t = replace(torus("t", (4, 4)), routing="none", _cache={})
    one_hop = (t.link_id(0, 1),)
    two_hops = (t.link_id(0, 1), t.link_id(1, 2))
    routes = _routes([one_hop, two_hops])
    first = carried_routes(t, routes)
    assert first[1:].tolist() == [True, False]
    # asked again (the relay pass, then the verifier): the same answer, which nobody may change
    assert carried_routes(t, routes) is first and not first.flags.writeable
    # another topology, or another routing, has its own
    shortest = replace(t, routing="shortest", _cache={})
    assert carried_routes(shortest, routes)[1:].tolist() == [True, True]
    assert carried_routes(t, routes, "shortest")[1:].tolist() == [True, True]
    assert carried_routes(t, routes) is first
    # a table made from this one keeps nothing of it
    assert replace(routes)._cache == {}
