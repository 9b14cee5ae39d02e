"""Property tests: random tori, meshes, faults and fabrics written as .ccl text.

Each test writes a random machine in the language, elaborates it, and compares the result with
a count or graph computed here from the language's definitions (docs/language.md): which
directed links exist, which fail, and whether a collective over the live ranks can run.
"""

import itertools
import math

import networkx as nx
import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from cclc.errors import CollectiveError
from dsl import loads

SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


def _coord(c) -> str:
    return "(" + ",".join(map(str, c)) + ")"


def _rank(c, dims) -> int:
    return int(np.ravel_multi_index(tuple(c), dims))


def _torus_links(dims, wrap) -> set[tuple[int, int]]:
    """Directed links of a torus, from the definition: one link each way to each neighbour,
    the wrap-around hop only where the dimension wraps, no duplicate hop for size 2."""
    links = set()
    for c in itertools.product(*(range(n) for n in dims)):
        for d, n in enumerate(dims):
            if c[d] + 1 < n or (wrap[d] and n > 2):
                nxt = list(c)
                nxt[d] = (c[d] + 1) % n
                a, b = _rank(c, dims), _rank(nxt, dims)
                links |= {(a, b), (b, a)}
    return links


def _torus_text(dims, wrap, mesh: bool, extra: str = "") -> str:
    ctor = "mesh" if mesh else "torus"
    lines = [f"topology t = {ctor}({', '.join(map(str, dims))}) {{"]
    if not mesh:
        lines.append("    wrap " + ", ".join("on" if w else "off" for w in wrap))
    lines.append("    link 50 GB/s, 100 ns")
    return "\n".join(lines) + "\n" + extra + "}\n"


shapes = st.lists(st.integers(1, 6), min_size=1, max_size=4).filter(
    lambda dims: math.prod(dims) <= 600)


@SETTINGS
@given(dims=shapes, data=st.data())
def test_torus_and_mesh_links(dims, data):
    mesh = data.draw(st.booleans(), label="mesh")
    wrap = [False] * len(dims) if mesh else data.draw(
        st.lists(st.booleans(), min_size=len(dims), max_size=len(dims)), label="wrap")
    topo = loads(_torus_text(dims, wrap, mesh), "t.ccl").topologies["t"]
    expected = _torus_links(dims, wrap)
    # per ring or line of n: 2n links when it wraps (n > 2), else 2(n - 1)
    per_ring = sum(math.prod(dims) // n * (2 * n if w and n > 2 else 2 * (n - 1))
                   for n, w in zip(dims, wrap, strict=True))
    assert topo.n_links == len(expected) == per_ring
    assert set(zip(topo.link_src.tolist(), topo.link_dst.tolist(), strict=True)) == expected
    assert nx.is_strongly_connected(topo.healthy_graph())


@SETTINGS
@given(dims=st.lists(st.integers(1, 5), min_size=1, max_size=3), data=st.data())
def test_torus_faults_and_connectivity(dims, data):
    wrap = data.draw(st.lists(st.booleans(), min_size=len(dims), max_size=len(dims)))
    pairs = sorted({(min(a, b), max(a, b)) for a, b in _torus_links(dims, wrap)})
    coords = list(itertools.product(*(range(n) for n in dims)))
    cut = data.draw(st.lists(st.sampled_from(pairs), max_size=6, unique=True)) if pairs else []
    one_way = data.draw(st.lists(st.booleans(), min_size=len(cut), max_size=len(cut)))
    dead = data.draw(st.lists(st.sampled_from(range(len(coords))), max_size=2, unique=True))

    faults, failed = "", set()
    for (a, b), single in zip(cut, one_way, strict=True):
        arrow = "->" if single else "--"
        faults += f"    fault link {_coord(coords[a])} {arrow} {_coord(coords[b])}\n"
        failed |= {(a, b)} if single else {(a, b), (b, a)}
    for r in dead:
        faults += f"    fault rank {_coord(coords[r])}\n"
    all_links = _torus_links(dims, wrap)
    failed |= {(a, b) for a, b in all_links if a in dead or b in dead}
    text = _torus_text(dims, wrap, False, faults) + "collective c = allreduce on t { size 4 B }\n"

    live = [r for r in range(len(coords)) if r not in dead]
    graph = nx.DiGraph()
    graph.add_nodes_from(live)
    graph.add_edges_from(all_links - failed)
    connected = bool(live) and nx.is_strongly_connected(graph)
    event("connected" if connected else "disconnected")
    if connected:
        program = loads(text, "t.ccl")
        topo = program.topologies["t"]
        got = {(int(u), int(v))
               for u, v, f in zip(topo.link_src, topo.link_dst, topo.link_failed, strict=True)
               if f}
        assert got == failed
        assert program.collectives[0].group == tuple(live)
    else:
        with pytest.raises(CollectiveError) as info:
            loads(text, "t.ccl")
        assert info.value.span.line == text.count("\n")      # the collective's line


@st.composite
def fabrics(draw):
    nics = draw(st.integers(1, 8))
    ports = draw(st.integers(1, 2))
    rails = draw(st.integers(1, nics))
    return {
        "n_nodes": draw(st.integers(1, 6)),
        "gpus": draw(st.integers(1, 8)),
        "nics": nics,
        "ports": ports,
        "interconnect": draw(st.sampled_from(["nvswitch", "pcie"])),
        "style": draw(st.sampled_from(["switch", "leaf_spine"])),
        "rails": rails,
        "leaves": rails * ports * draw(st.integers(1, 2)),
        "spines": draw(st.integers(1, 4)),
        "ratio": draw(st.sampled_from(["1", "2", "1.5"])),
    }


def _fabric_text(f, faults: str = "") -> str:
    text = (f"node n = {f['interconnect']}(gpus = {f['gpus']}) {{ link 100 GB/s, 1 us; "
            f"nic {f['nics']} x 400 Gb/s; ports {f['ports']} }}\n"
            f"topology c = fabric({f['style']}) {{\n    nodes {f['n_nodes']} x n\n"
            "    link 400 Gb/s, 2 us\n")
    if f["style"] == "leaf_spine":
        text += (f"    rails {f['rails']}\n    leaves {f['leaves']}\n    spines {f['spines']}\n"
                 f"    oversubscription {f['ratio']}\n")
    return text + faults + "}\n"


def _fabric_link_count(f) -> int:
    """Directed links, from the fabric model: GPU<->node switch (absent for one NVSwitch GPU),
    each NIC to its node's PCIe switch or affine GPU, each NIC port (aggregated per NIC on a
    single switch) to the fabric, and every leaf to every spine."""
    has_switch = f["gpus"] > 1 or f["interconnect"] == "pcie"
    per_node = 2 * f["gpus"] * has_switch + 2 * f["nics"]
    if f["style"] == "switch":
        return f["n_nodes"] * (per_node + 2 * f["nics"])
    return (f["n_nodes"] * (per_node + 2 * f["nics"] * f["ports"])
            + 2 * f["leaves"] * f["spines"])


@SETTINGS
@given(f=fabrics())
def test_fabric_links(f):
    topo = loads(_fabric_text(f), "c.ccl").topologies["c"]
    assert topo.n_ranks == f["n_nodes"] * f["gpus"]
    assert topo.n_links == _fabric_link_count(f)
    assert nx.is_strongly_connected(topo.healthy_graph())
    if f["style"] == "leaf_spine":
        names = set(topo.vertex_names)
        assert {f"leaf{i}" for i in range(f["leaves"])} <= names
        assert {f"spine{i}" for i in range(f["spines"])} <= names


@SETTINGS
@given(f=fabrics().filter(lambda f: f["style"] == "leaf_spine"), data=st.data())
def test_fabric_faults_and_connectivity(f, data):
    uplinks = list(itertools.product(range(f["leaves"]), range(f["spines"])))
    cut = data.draw(st.lists(st.sampled_from(uplinks), max_size=4, unique=True))
    ranks = list(itertools.product(range(f["n_nodes"]), range(f["gpus"])))
    dead = data.draw(st.lists(st.sampled_from(ranks), max_size=2, unique=True))
    faults = "".join(f"    fault link leaf({a}) -- spine({b})\n" for a, b in cut)
    faults += "".join(f"    fault rank node({n}).gpu({g})\n" for n, g in dead)
    text = _fabric_text(f, faults) + "collective g = allreduce on c { size 4 B }\n"

    healthy = loads(_fabric_text(f), "c.ccl").topologies["c"]
    index = {name: i for i, name in enumerate(healthy.vertex_names)}
    links = set(zip(healthy.link_src.tolist(), healthy.link_dst.tolist(), strict=True))
    dead_ranks = {index[f"node{n}.gpu{g}"] for n, g in dead}
    failed = {(index[f"leaf{a}"], index[f"spine{b}"]) for a, b in cut}
    failed |= {(v, u) for u, v in failed}
    failed |= {(u, v) for u, v in links if u in dead_ranks or v in dead_ranks}
    graph = nx.DiGraph()
    graph.add_nodes_from(v for v in range(healthy.n_vertices) if v not in dead_ranks)
    graph.add_edges_from(links - failed)
    live = [r for r in range(healthy.n_ranks) if r not in dead_ranks]
    reach = nx.descendants(graph, live[0]) | {live[0]} if live else set()
    back = nx.ancestors(graph, live[0]) | {live[0]} if live else set()
    connected = bool(live) and set(live) <= reach & back
    event("connected" if connected else "disconnected")
    if connected:
        topo = loads(text, "c.ccl").topologies["c"]
        got = {(int(u), int(v))
               for u, v, x in zip(topo.link_src, topo.link_dst, topo.link_failed, strict=True)
               if x}
        assert got == failed
    else:
        with pytest.raises(CollectiveError):
            loads(text, "c.ccl")
