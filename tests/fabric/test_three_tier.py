"""Three-tier fabrics (leaf, spine, core): the builder's wiring and capacities, routes through
the core (every route a healthy path from its source to its destination; planned routing
balances the core links at least as well as ECMP, within one flow of the even share), and a
small compile end to end through the verifier."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pytest

from cclc.algorithms import get
from cclc.collective import CollectiveKind as K
from cclc.collective import make_collective
from cclc.fabric_routing import ecmp_routes, spine_link_loads
from cclc.pipeline import compile_source
from cclc.topology import NodeType, fat_tree, with_faults
from cclc.verify import verify

GPU1 = NodeType("g1", "pcie", 1, 48e9, 1e-6, nics=1, nic_bandwidth=50e9)
HGX = NodeType("hgx", "nvswitch", 8, 450e9, 1e-6, nics=8, nic_bandwidth=50e9)


def _tree(nodes=8, pods=2, leaves=2, spines=2, cores=4, ratio=(1.0, 2.0), node=GPU1, rails=1):
    return fat_tree("f", nodes, node, pods=pods, rails=rails, leaves=leaves, spines=spines,
                    cores=cores, oversubscription=ratio, bandwidth=50e9, latency=1e-6)


def _links(topo, a: str, b: str) -> np.ndarray:
    names = topo.vertex_names
    return np.flatnonzero([names[u].startswith(a) and names[v].startswith(b)
                           for u, v in zip(topo.link_src.tolist(), topo.link_dst.tolist(),
                                           strict=True)])


def test_wiring_and_capacities():
    topo = _tree(nodes=8, pods=2, leaves=2, spines=2, cores=4, ratio=(1.0, 2.0))
    # 2 pods x (2 leaves + 2 spines), 4 cores in 2 groups of 2
    assert [n for n in topo.vertex_names if n.startswith(("leaf", "spine", "core"))] == \
        [f"leaf{i}" for i in range(4)] + [f"spine{i}" for i in range(4)] + \
        [f"core{i}" for i in range(4)]
    assert topo.pod_of_node.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    up = _links(topo, "leaf", "spine")
    assert len(up) == 2 * 2 * 2                       # every leaf to every spine of its pod
    # a leaf serves 2 NICs of 50 GB/s: 100 GB/s over 2 spines at 1:1, one cable each
    assert set(topo.link_bandwidth[up].tolist()) == {50e9}
    sc = _links(topo, "spine", "core")
    assert len(sc) == 4 * 2                           # every spine to the 2 cores of its group
    # a spine's leaf side is 2 x 50 GB/s, 2:1 over 2 cores: 25 GB/s each, rounded up to a cable
    assert set(topo.link_bandwidth[sc].tolist()) == {50e9}
    names = topo.vertex_names
    for k in sc.tolist():
        spine = int(names[topo.link_src[k]][5:])
        core = int(names[topo.link_dst[k]][4:])
        assert core // 2 == spine % 2                 # spine j of each pod -> core group j


def test_core_oversubscription_sets_the_core_links():
    wide = _tree(nodes=16, pods=2, leaves=1, spines=1, cores=1, ratio=(1.0, 1.0))
    narrow = _tree(nodes=16, pods=2, leaves=1, spines=1, cores=1, ratio=(1.0, 4.0))
    cap = [float(t.link_bandwidth[_links(t, "spine", "core")].sum()) for t in (wide, narrow)]
    assert cap == [2 * 8 * 50e9, 2 * 2 * 50e9]


def _check_routes(s):
    """Every op's route is a chain of healthy links from its source rank to its destination."""
    topo = s.topology
    group = s.collective.group
    for i in range(len(s.ops)):
        path = s.routes.path(int(s.ops.route[i]))
        if not path:
            continue
        assert not topo.link_failed[list(path)].any()
        assert int(topo.link_src[path[0]]) == group[int(s.ops.src[i])]
        assert int(topo.link_dst[path[-1]]) == group[int(s.ops.dst[i])]
        for a, b in pairwise(path):
            assert topo.link_dst[a] == topo.link_src[b]


def _fabric_loads(s) -> np.ndarray:
    """Bytes per step on the busiest leaf/spine/core link."""
    loads = spine_link_loads(s)
    return np.max(list(loads.values()), axis=0) if loads else np.zeros(s.n_steps)


def _least_busiest(s, step: int) -> int:
    """An independent reference: the least possible busiest-link load of ``step``, every flow
    on one of its fewest-hop healthy paths (networkx), by exact CP-SAT."""
    import networkx as nx
    from ortools.sat.python import cp_model

    topo, group = s.topology, s.collective.group
    g = topo.healthy_graph()
    nb = s.op_bytes()
    ops = np.flatnonzero(s.ops.step == step)
    m = cp_model.CpModel()
    on_link: dict[int, list] = {}
    for i in ops.tolist():
        paths = list(nx.all_shortest_paths(g, group[int(s.ops.src[i])],
                                           group[int(s.ops.dst[i])]))
        xs = [m.NewBoolVar(f"x{i}_{k}") for k in range(len(paths))]
        m.AddExactlyOne(xs)
        for x, path in zip(xs, paths, strict=True):
            for a, b in pairwise(path):
                link = g[a][b]["link"]
                if topo.vertex_names[a].startswith(("spine", "core")) or \
                        topo.vertex_names[b].startswith(("spine", "core")):
                    on_link.setdefault(link, []).append((int(nb[i]), x))
    busiest = m.NewIntVar(0, int(nb[ops].sum()), "busiest")
    for terms in on_link.values():
        m.Add(sum(w * x for w, x in terms) <= busiest)
    m.Minimize(busiest)
    solver = cp_model.CpSolver()
    solver.parameters.num_search_workers = 1
    assert solver.Solve(m) == cp_model.OPTIMAL
    return int(solver.Value(busiest))


@pytest.mark.parametrize("fail", [(), ("core1",), ("spine2",)])
def test_every_route_is_a_healthy_path_and_planning_balances_the_fabric(fail):
    topo = _tree(nodes=8, pods=2, leaves=2, spines=2, cores=4)
    pairs = []
    for name in fail:
        v = topo.vertex(name)
        touching = (topo.link_src == v) | (topo.link_dst == v)
        pairs += list(zip(topo.link_src[touching].tolist(), topo.link_dst[touching].tolist(),
                          strict=True))
    topo = with_faults(topo, pairs) if pairs else topo
    coll = make_collective("c", K.ALLTOALL, topo, topo.all_ranks(), size=8 * 8 * 4096)
    s = get("direct").build(coll)                     # planned by the routing pass
    verify(s)
    _check_routes(s)
    ecmp = ecmp_routes(s)
    verify(ecmp)
    _check_routes(ecmp)
    planned, hashed = _fabric_loads(s), _fabric_loads(ecmp)
    assert planned.max() <= hashed.max()
    # greedy largest-first: within one flow of the exact optimum
    flow = int(s.op_bytes().max())
    for step in range(s.n_steps):
        assert planned[step] <= _least_busiest(s, step) + flow


def test_a_small_three_tier_compile_end_to_end(tmp_path):
    text = """
node hgx = nvswitch(gpus = 2) {
    link 450 GB/s, 1 us
    nic  2 x 400 Gb/s
}
topology c = fabric(fat_tree) {
    nodes  4 x hgx
    pods   2
    spines 2
    cores  4
    oversubscription 1, 2
    link   400 Gb/s, 2 us
    fault switch core(1)
}
collective ar = allreduce on c { size 1 MiB; algorithm hierarchical }
collective a2a = alltoall on c { size 1 MiB; algorithm direct }
"""
    done = compile_source(text, tmp_path / "out")
    assert [c.collective.name for c in done] == ["ar", "a2a"]
    for c in done:
        assert c.plan is not None, c.error
        verify(c.plan.schedule)
        _check_routes(c.plan.schedule)
        assert c.plan.time >= c.plan.bound * (1 - 1e-9)
        assert c.nccl is None or "NCCL today" in c.nccl
