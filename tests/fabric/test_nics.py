"""Topology.nic_nodes and Topology.gpu_nics: which vertices are NICs and which NIC hangs off
each GPU, from the builders' names and PCIe links, and whether it can still be used."""

from __future__ import annotations

import numpy as np
import pytest

from cclc.errors import TopologyError
from cclc.topology import NodeType, leaf_spine, with_faults


def _fabric(gpus: int, nics: int, interconnect: str = "nvswitch"):
    node = NodeType("n", interconnect, gpus, 450e9, 1e-6, nics=nics, nic_bandwidth=50e9)
    return leaf_spine("f", 2, node, rails=nics, leaves=None, spines=2, oversubscription=1.0,
                      bandwidth=50e9, latency=2e-6)


def test_nic_nodes_are_the_named_nics():
    topo = _fabric(4, 4)
    node = topo.nic_nodes()
    names = topo.vertex_names
    assert [names[v] for v in np.flatnonzero(node >= 0)] == [
        f"node{h}.nic{i}" for h in range(2) for i in range(4)]
    assert node[topo.vertex("node1.nic2")] == 1
    assert (node[:topo.n_ranks] == -1).all()


def test_each_gpu_has_the_nic_on_its_pcie_switch():
    topo = _fabric(8, 4)             # NIC i on GPU 2i
    rank, nic, usable = topo.gpu_nics()
    names = topo.vertex_names
    assert sorted((names[r], names[v]) for r, v in zip(rank, nic, strict=True)) == sorted(
        (f"node{h}.gpu{2 * i}", f"node{h}.nic{i}") for h in range(2) for i in range(4))
    assert usable.all()
    # a NIC whose uplink failed, and a GPU whose link to its NIC failed
    up = [(topo.vertex("node0.nic1"), int(d)) for s, d in
          zip(topo.link_src, topo.link_dst, strict=True) if s == topo.vertex("node0.nic1")
          and d >= topo.n_ranks]
    own = [(topo.vertex("node1.gpu4"), topo.vertex("node1.nic2"))]
    rank, nic, usable = with_faults(topo, links=up + own).gpu_nics()
    assert sorted(names[v] for v in nic[~usable]) == ["node0.nic1", "node1.nic2"]


def test_pcie_servers_have_no_gpu_nics():
    assert len(_fabric(4, 2, "pcie").gpu_nics()[0]) == 0


def test_a_failed_device_takes_every_link_of_its_own():
    """``with_faults(devices=...)``, what ``fault nic`` and ``fault switch`` do: exactly the
    links into and out of each device fail; a rank is not a device."""
    topo = _fabric(4, 4)
    nic, leaf = topo.vertex("node1.nic2"), topo.vertex("leaf0")
    out = with_faults(topo, devices=[nic, leaf])
    touching = np.isin(topo.link_src, [nic, leaf]) | np.isin(topo.link_dst, [nic, leaf])
    assert np.array_equal(out.link_failed, touching)
    assert not out.failed_ranks
    with pytest.raises(TopologyError, match="not a switch or NIC"):
        with_faults(topo, devices=[0])
