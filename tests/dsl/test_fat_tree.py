"""``fabric(fat_tree)``: pods, cores and the two oversubscription ratios mean what they say;
``fault switch`` / ``fault nic`` fail every link of the device; bad values are refused at the
token that is wrong."""

from __future__ import annotations

import numpy as np
import pytest

from cclc.errors import CclError
from dsl import loads

NODE = """node hgx = nvswitch(gpus = 8) {
    link 450 GB/s, 1 us
    nic  8 x 400 Gb/s
}
"""


def _fabric(*settings: str, style: str = "fat_tree") -> str:
    body = "\n".join(f"    {s}" for s in settings)
    return NODE + f"topology c = fabric({style}) {{\n{body}\n}}\n"


BASE = ("nodes 8 x hgx", "pods 2", "spines 4", "cores 8", "link 400 Gb/s, 2 us")


def test_a_three_tier_fabric_elaborates():
    topo = loads(_fabric(*BASE, "oversubscription 1, 2")).topologies["c"]
    names = topo.vertex_names
    assert topo.n_ranks == 64 and topo.n_nodes == 8
    assert topo.pod_of_node.tolist() == [0] * 4 + [1] * 4
    # leaves default to rails x ports = 8 per pod; 4 spines per pod; 8 cores
    assert sum(n.startswith("leaf") for n in names) == 16
    assert sum(n.startswith("spine") for n in names) == 8
    assert sum(n.startswith("core") for n in names) == 8
    core_up = [k for k in range(topo.n_links) if names[topo.link_src[k]].startswith("spine")
               and names[topo.link_dst[k]].startswith("core")]
    # a spine faces 8 leaves x 50 GB/s; at 2:1 over its 2 cores: 100 GB/s each
    assert len(core_up) == 8 * 2
    assert set(topo.link_bandwidth[core_up].tolist()) == {100e9}
    assert topo.routing == "ecmp"


def test_fault_switch_and_fault_nic_fail_every_link_of_the_device():
    topo = loads(_fabric(*BASE, "fault switch core(3)", "fault nic node(5).nic(2)",
                         "fault link leaf(9) -- spine(5)")).topologies["c"]
    core, nic = topo.vertex("core3"), topo.vertex("node5.nic2")
    for v in (core, nic):
        touching = (topo.link_src == v) | (topo.link_dst == v)
        assert touching.any() and topo.link_failed[touching].all()
    leaf, spine = topo.vertex("leaf9"), topo.vertex("spine5")
    assert topo.link_failed[topo.link_id(leaf, spine)]
    assert topo.n_failed_links == 2 * 2 + 2 * 2 + 2   # core: 2 spines; NIC: GPU and leaf


@pytest.mark.parametrize("settings, where, message", [
    (("nodes 9 x hgx", "pods 2", "link 400 Gb/s, 2 us"), (7, 10),
     "9 nodes cannot be split evenly over 2 pods"),
    ((*BASE[:3], "cores 6", BASE[4]), (9, 11),
     "6 cores cannot be split evenly over the 4 spines of a pod"),
    ((*BASE, "oversubscription 1, 0"), (11, 25), "oversubscription must be > 0"),
    (("nodes 8 x hgx", "link 400 Gb/s, 2 us"), (5, 10), "needs a `pods` setting"),
    ((*BASE, "fault switch node(1).nic(0)"), (11, 18), "node(1).nic(0) is not a switch"),
    ((*BASE, "fault nic leaf(1)"), (11, 15), "leaf(1) is not a NIC"),
    ((*BASE, "fault switch core(8)"), (11, 18), "has no core(8)"),
    ((*BASE, "fault nic node(1).nic"), (11, 15), "'nic' needs an index: node(1) has "
                                                 "nic(0)..nic(7)"),
    ((*BASE, "fault switch core"), (11, 18), "'core' needs an index: 'c' has core(0)..core(7)"),
    ((*BASE, "fault switch core(1)", "fault switch core(1)"), (12, 18), "duplicate fault"),
    ((*BASE, "pods 3"), (11, 5), "duplicate setting 'pods'"),
])
def test_bad_values_are_refused_at_the_token(settings, where, message):
    with pytest.raises(CclError) as info:
        loads(_fabric(*settings), "f.ccl")
    err = info.value
    assert message in str(err)
    assert (err.span.line, err.span.col) == where


def test_a_second_ratio_needs_three_tiers():
    text = _fabric("nodes 8 x hgx", "link 400 Gb/s, 2 us", "oversubscription 1, 2",
                   style="leaf_spine")
    with pytest.raises(CclError, match="needs fabric\\(fat_tree\\)") as info:
        loads(text, "f.ccl")
    assert (info.value.span.line, info.value.span.col) == (8, 25)


def test_pods_are_not_a_leaf_spine_setting():
    text = _fabric("nodes 8 x hgx", "pods 2", "link 400 Gb/s, 2 us", style="leaf_spine")
    with pytest.raises(CclError, match="'pods' is not a setting of a leaf/spine fabric"):
        loads(text, "f.ccl")


def test_unknown_style_suggests_fat_tree():
    with pytest.raises(CclError, match="did you mean 'fat_tree'"):
        loads(_fabric(*BASE, style="fat_tre"), "f.ccl")


def test_group_selectors_work_across_pods():
    program = loads(_fabric(*BASE) + "collective a = allgather on c.rail(3) { size 1 MiB }\n")
    group = program.collectives[0].group
    topo = program.topologies["c"]
    assert len(group) == 8 and set(np.asarray(topo.rail_of_rank)[list(group)].tolist()) == {3}
