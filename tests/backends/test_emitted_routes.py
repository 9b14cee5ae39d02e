"""What the backends emit is what the machine can move: every send in the MSCCL XML and in
the NCCL/MPI step tables goes between two ranks that the topology's declared routing joins
by itself (``none``: a healthy link; ``dimension_order``: a dimension-order path that avoids
every failed link; otherwise some healthy path). Checked on the emitted text, parsed back,
over every example, algorithm, routing and an extra failed link."""

from __future__ import annotations

import pathlib
import re
import xml.etree.ElementTree as ET
from dataclasses import replace

import networkx as nx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backends.common import EmitOptions
from backends.msccl import render_xml
from backends.msccl.lower import LimitError
from backends.nccl import render_sources
from cclc.algorithms import algorithms_for
from cclc.errors import ScheduleError
from cclc.topology import Topology, with_faults
from cclc.verify import verify

EXAMPLES = sorted((pathlib.Path(__file__).parents[2] / "examples").glob("*.ccl"))
#: the property test samples examples up to this many ranks (MSCCL lowering of 100k-op
#: schedules takes minutes); the auto choice of every example is checked below regardless
MAX_RANKS = 64


def _load(path):
    import dsl

    return dsl.load(str(path)).collectives


# -- an independent reference for what a routing carries --------------------------------------

def _dor_path(topo: Topology, u: int, v: int) -> list[int]:
    """Links of the dimension-order path u -> v, walked coordinate by coordinate."""
    cur, goal = list(topo.coords(u)), topo.coords(v)
    links = []
    for d, n in enumerate(topo.dims):
        wraps = topo.wrap[d] and n > 2
        while cur[d] != goal[d]:
            up = (goal[d] - cur[d]) % n
            step = (1 if up <= n - up else -1) if wraps else (1 if goal[d] > cur[d] else -1)
            nxt = list(cur)
            nxt[d] = (cur[d] + step) % n
            links.append(topo.link_id(topo.rank_at(cur), topo.rank_at(nxt)))
            cur = nxt
    return links


def _movable(topo: Topology, u: int, v: int) -> bool:
    if topo.routing == "none":
        link = topo.link_id(u, v)
        return link is not None and not topo.link_failed[link]
    if topo.routing == "dimension_order":
        return all(x is not None and not topo.link_failed[x] for x in _dor_path(topo, u, v))
    g = topo.healthy_graph()
    return u in g and v in g and nx.has_path(g, u, v)


# -- parsing the emitted text back -------------------------------------------------------------

def _xml_sends(xml: str) -> set[tuple[int, int]]:
    pairs = set()
    for gpu in ET.fromstring(xml).iter("gpu"):
        for tb in gpu.iter("tb"):
            peer = int(tb.get("send"))
            if peer >= 0 and any(s.get("type") not in ("nop", "cpy", "re") for s in tb):
                pairs.add((int(gpu.get("id")), peer))
    return pairs


def _table_sends(header: str) -> set[tuple[int, int]]:
    rows = [tuple(int(x) for x in m.groups()) for m in
            re.finditer(r"^  \{ (-?\d+), (-?\d+), (-?\d+),", header, re.MULTILINE)]
    first = [int(x) for x in re.search(r"_first\[\] = \{ ([^}]*) \}", header).group(1)
             .split(",")]
    pairs = set()
    for rank in range(len(first) - 1):
        for _step, role, peer in rows[first[rank]:first[rank + 1]]:
            if role == 0:
                pairs.add((rank, peer))
    return pairs


def _check_emitted(coll, schedule) -> int:
    """Assert that every emitted send is a move the machine makes; returns how many pairs."""
    topo = coll.topology
    group = coll.group
    checked = set()
    header = next(text for name, text in render_sources(schedule).items()
                  if name.endswith("_schedule.h"))
    checked |= _table_sends(header)
    try:
        checked |= _xml_sends(render_xml(schedule, EmitOptions()))
    except LimitError:
        pass                                     # too large for the runtime: tables only
    except ScheduleError as err:
        assert "non-uniform alltoall" in err.message, err.message
    ir_pairs = {(int(a), int(b)) for a, b in zip(schedule.ops.src, schedule.ops.dst, strict=True)
                if a != b}
    assert checked <= ir_pairs, "an emitted send the schedule does not have"
    for a, b in checked:
        assert _movable(topo, group[a], group[b]), (
            f"{schedule.algorithm}: emitted send {topo.vertex_names[group[a]]} -> "
            f"{topo.vertex_names[group[b]]} cannot be made under routing '{topo.routing}'")
    return len(checked)


@pytest.mark.slow
@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_every_example_emits_only_moves_its_routing_makes(path):
    from cclc.plan import plan

    for coll in _load(path):
        schedule = plan(coll).schedule
        if len(schedule.ops) > 60_000:
            continue                                 # tpuv4_8x4x4's alltoall: checked on IR
        assert _check_emitted(coll, schedule) > 0


_TORI = [p for p in EXAMPLES if any(c.topology.kind == "torus" for c in _load(p))]


@pytest.mark.slow
@pytest.mark.parametrize("routing", ["none", "dimension_order"])
@pytest.mark.parametrize("path", _TORI, ids=lambda p: p.stem)
def test_torus_examples_compile_under_each_gpu_and_router_routing(path, routing):
    from cclc.plan import plan

    for coll in _load(path):
        if coll.n > MAX_RANKS:
            continue
        coll = _variant(coll, routing, None)
        schedule = plan(coll).schedule
        assert _check_emitted(coll, schedule) > 0


_CASES = [(p, i) for p in EXAMPLES for i, c in enumerate(_load(p)) if c.n <= MAX_RANKS]


def _variant(coll, routing: str | None, fault_seed: int | None):
    """``coll`` on its topology with another routing and maybe one more failed link pair."""
    topo = coll.topology
    if routing is not None and topo.kind == "torus":
        topo = replace(topo, routing=routing, _cache={})
    if fault_seed is not None and topo.kind == "torus":
        ok = np.flatnonzero(~topo.link_failed)
        link = int(ok[fault_seed % len(ok)])
        u, v = int(topo.link_src[link]), int(topo.link_dst[link])
        topo = with_faults(topo, links=[(u, v), (v, u)])
    return replace(coll, topology=topo)


@pytest.mark.slow
@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=st.sampled_from(_CASES),
       routing=st.sampled_from([None, "none", "dimension_order", "shortest"]),
       fault=st.one_of(st.none(), st.integers(0, 10_000)), data=st.data())
def test_no_emitted_send_crosses_a_failed_link_or_an_unrouted_pair(case, routing, fault, data):
    path, index = case
    coll = _variant(_load(path)[index], routing, fault)
    if not coll.topology.is_connected(coll.group):
        return                                           # the extra fault cut the group
    algos = [a for a in algorithms_for(coll) if a.applicable(coll) is None]
    if not algos:
        return
    algo = data.draw(st.sampled_from(algos), label="algorithm")
    try:
        schedule = algo.build(coll)
    except ScheduleError as err:
        # the only refusal allowed: a relay would need a rank outside the group
        assert "not a rank of collective" in err.message, err.message
        return
    verify(schedule)
    _check_emitted(coll, schedule)
