"""The ``routes`` bound of a group smaller than the machine (cclc.route_bound).

References: closed forms (a rail AllGather whose GPU lost its NIC: the rail's NICs and the
server's other NICs, counted by hand), and the same LP written over paths instead of links,
every route enumerated by networkx (all fewest-hop paths, or every simple path under
``source``), over small fabrics and tori with hypothesis-drawn groups, kinds and faults. That no
schedule beats it is checked with the other bounds, over every algorithm's schedules
(tests/bounds/test_group_bounds.py::test_no_schedule_of_any_algorithm_beats_the_bound).
"""

from __future__ import annotations

import itertools

import networkx as nx
import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.optimize import linprog

import cclc.route_bound as route_bound
from cclc.bounds import bounds
from cclc.collective import CollectiveKind, DType, make_collective
from cclc.route_bound import routes_bound
from cclc.topology import NodeType, leaf_spine, torus, with_faults

K = CollectiveKind
NIC = 50e9
NVLINK = 450e9


def fabric(nodes: int, gpus: int = 4, spines: int = 2):
    node = NodeType("hgx", "nvswitch", gpus, NVLINK, 1e-6, nics=gpus, nic_bandwidth=NIC)
    return leaf_spine("f", nodes, node, rails=gpus, leaves=None, spines=spines,
                      oversubscription=1.0, bandwidth=NIC, latency=2e-6)


def without(t, vertex: str):
    """``t`` with every link of ``vertex`` failed (`fault nic` / `fault switch`)."""
    return with_faults(t, devices=[t.vertex(vertex)])


def coll(t, kind, size, group):
    root = 0 if kind in (K.BROADCAST, K.REDUCE) else None
    return make_collective("c", kind, t, tuple(group), size=size, dtype=DType.UINT8, root=root)


# ---- closed forms ------------------------------------------------------------------------------

@pytest.mark.parametrize("nodes,gpus", [(2, 4), (3, 4), (4, 4), (8, 4), (4, 2)])
def test_a_gpu_without_its_nic_feeds_its_rail_through_its_server(nodes, gpus):
    # rail 0 with node0.gpu0's NIC failed: node0.gpu0 reaches the others only through its
    # server's other NICs, landing on theirs (fewest hops); those routes all start or end at
    # node0.gpu0, so the other members receive over their own NIC (from the rest) and from
    # node0.gpu0 over its gpus - 1 NICs in all; node0.gpu0 receives over those NICs
    t = without(fabric(nodes, gpus), "node0.nic0")
    n, S = nodes, nodes * 3_000_000
    c = coll(t, K.ALLGATHER, S, t.rail(0))
    block = S / n
    others = (n - 1) * (n - 1) * block / (((n - 1) if n > 2 else 0) * NIC + (gpus - 1) * NIC)
    itself = (n - 1) * block / ((gpus - 1) * NIC)
    b, note = routes_bound(c)
    assert note is None
    assert b.seconds == pytest.approx(max(others, itself), rel=1e-5)
    assert b.seconds <= max(others, itself)           # taken a little low, never high
    # the link-counting bounds let every member in over every NIC of its server: where
    # node0.gpu0's own receipts decide, node 0's cut (its other NICs) is as strong
    got = bounds(c)
    links = max(x.seconds for x in got.items if x.name != "routes")
    if itself >= others:
        assert links == pytest.approx(b.seconds, rel=1e-5)
    else:
        assert got.name == "routes" and links < 0.9 * b.seconds


def test_the_128_gpu_fabric_example_with_a_failed_nic():
    # examples/hgx16_leafspine.ccl's `acts` (rail 0, 64 MiB) with `fault nic node(0).nic(0)`:
    # 15 x 15/16 x 64 MiB over 15 + 7 NICs of 50 GB/s = 857.9 us (the max-flow LP: 179.8 us)
    import dsl

    text = open("examples/hgx16_leafspine.ccl", encoding="utf-8").read()
    text = text.replace("    fault link leaf(2) -- spine(5)",
                        "    fault nic node(0).nic(0)\n    fault link leaf(2) -- spine(5)")
    acts = next(c for c in dsl.loads(text, "hgx16.ccl").collectives if c.name == "acts")
    b = bounds(acts)
    want = 15 * 15 / 16 * (64 << 20) / (22 * 400e9 / 8)
    assert b.name == "routes" and b.best == pytest.approx(want, rel=1e-5)
    assert b["lp"].seconds == pytest.approx(15 / 16 * (64 << 20) / (7 * 400e9 / 8), rel=1e-6)


def test_on_a_healthy_rail_it_is_the_injection_bound_and_not_the_best_by_noise():
    t = fabric(4)
    c = coll(t, K.ALLGATHER, 4_000_000, t.rail(1))
    b = bounds(c)
    want = 3 / 4 * 4_000_000 / NIC
    assert b["routes"].seconds == pytest.approx(want, rel=1e-5)
    assert b.name == "injection" and b.best == pytest.approx(want, rel=1e-12)


# ---- where it applies --------------------------------------------------------------------------

def test_a_group_of_every_rank_gets_none_and_no_note():
    t = without(fabric(2), "node0.nic0")
    c = coll(t, K.ALLGATHER, 8_000_000, t.all_ranks())
    assert routes_bound(c) == (None, None)
    assert bounds(c).get("routes") is None and not bounds(c).notes


def test_no_lp_computes_neither():
    t = without(fabric(4), "node0.nic0")
    b = bounds(coll(t, K.ALLGATHER, 4_000_000, t.rail(0)), lp=False)
    assert b.get("routes") is None and b.get("lp") is None


def test_over_its_limits_it_is_skipped_with_a_note(monkeypatch):
    t = without(fabric(4), "node0.nic0")
    c = coll(t, K.ALLGATHER, 4_000_000, t.rail(0))
    monkeypatch.setattr(route_bound, "ROUTES_MAX_VARIABLES", 10)
    b, note = routes_bound(c)
    assert b is None and note.startswith("routes: skipped, ") and "flow variables > 10" in note
    monkeypatch.setattr(route_bound, "_MAX_TESTS", 10)
    t = without(fabric(4, spines=3), "node0.nic0")           # another topology: no cache
    b, note = routes_bound(coll(t, K.ALLGATHER, 4_000_000, t.rail(0)))
    assert b is None and "member pairs x" in note and "too many to search" in note
    assert note in bounds(coll(t, K.ALLGATHER, 4_000_000, t.rail(0))).notes


# ---- the LP over enumerated paths --------------------------------------------------------------

def _paths(t, a: int, b: int) -> list[list[int]]:
    """Every route the routing carries from ``a`` to ``b``, as link ids."""
    g = t.healthy_graph()
    if t.routing == "none":
        return [[g[a][b]["link"]]] if g.has_edge(a, b) else []
    if not nx.has_path(g, a, b):
        return []
    found = (nx.all_simple_paths(g, a, b) if t.routing == "source"
             else nx.all_shortest_paths(g, a, b))
    return [[g[u][v]["link"] for u, v in itertools.pairwise(p)] for p in found]


def _path_lp(c) -> float | None:
    """The routes bound as an LP over paths: one variable per (pair, route); ``None`` where no
    flow meets the demands."""
    t, group, n = c.topology, list(c.group), c.n
    send, recv, total = route_bound._demands(route_bound.Facts(c))
    cols, rows_link, pair_of, sender, receiver = [], [], [], [], []
    k = 0
    for i, j in itertools.permutations(range(n), 2):
        for path in _paths(t, group[i], group[j]):
            for link in path:
                cols.append(k)
                rows_link.append(link)
            pair_of.append((i, j))
            k += 1
    sender = np.array([i for i, _ in pair_of])
    receiver = np.array([j for _, j in pair_of])
    cap = t.link_bandwidth / t.link_bandwidth.max()
    load = sp.csr_matrix((np.ones(len(cols)), (rows_link, cols)), shape=(t.n_links, k))
    a_ub = sp.vstack([
        sp.hstack([load, sp.csr_matrix(-cap[:, None])]),
        sp.hstack([-sp.csr_matrix((np.ones(k), (receiver, np.arange(k))), shape=(n, k)),
                   sp.csr_matrix((n, 1))]),
        sp.hstack([-sp.csr_matrix((np.ones(k), (sender, np.arange(k))), shape=(n, k)),
                   sp.csr_matrix((n, 1))]),
        sp.hstack([-sp.csr_matrix(np.ones((1, k))), sp.csr_matrix((1, 1))])]).tocsr()
    b_ub = np.concatenate([np.zeros(t.n_links), -recv, -send, [-total]])
    obj = np.zeros(k + 1)
    obj[-1] = 1.0
    res = linprog(obj, A_ub=a_ub, b_ub=b_ub, bounds=(0, None), method="highs")
    if res.status == 2:
        return None
    assert res.status == 0
    return float(res.fun) * c.size / t.link_bandwidth.max()


def _machines():
    f = fabric(3, gpus=2, spines=2)
    return [
        f, without(f, "node0.nic0"), without(f, "node1.nic1"),
        without(fabric(2, gpus=3, spines=1), "node1.nic2"),
        torus("t", (3, 3), bandwidth=NIC, latency=1e-7, routing="none"),
        with_faults(torus("t", (4, 2), bandwidth=NIC, latency=1e-7, routing="shortest"),
                    links=[(0, 2), (2, 0)]),
        with_faults(torus("t", (3, 2), bandwidth=NIC, latency=1e-7, routing="source"),
                    links=[(0, 1)]),
    ]


MACHINES = _machines()


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.sampled_from(range(len(MACHINES))),
       st.sampled_from([K.ALLGATHER, K.REDUCESCATTER, K.ALLREDUCE, K.ALLTOALL, K.BROADCAST,
                        K.REDUCE]), st.data())
def test_the_link_lp_equals_the_path_lp(which, kind, data):
    t = MACHINES[which]
    ranks = list(t.all_ranks())
    group = sorted(data.draw(st.sets(st.sampled_from(ranks), min_size=2,
                                     max_size=len(ranks) - 1)))
    c = coll(t, kind, len(group) * 1_000_000, group)
    b, note = routes_bound(c)
    assert note is None
    want = _path_lp(c)
    if want is None:
        # members no routes and relays join: the other bounds say so
        assert b is None
        return
    assert b.seconds == pytest.approx(want, rel=1e-5)
    assert b.seconds <= want * (1 + 1e-9)
