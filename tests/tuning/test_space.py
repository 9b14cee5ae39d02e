"""The parameter space: which implementations and resources exist per collective/version."""

from __future__ import annotations

import pytest

from cclc.collective import CollectiveKind
from cclc.errors import SemanticError
from cclc.nccl_model import Algo, Func, Proto
from cclc.topology import torus
from cclc.tuning.space import (
    NcclVersion,
    func_of,
    machine_of,
    max_chunk,
    space_for,
)

V230 = NcclVersion.parse("2.30")


def _impls(space):
    return {(s.algo, s.proto) for s in space.subspaces}


def test_machine_summaries(hgx_node, hgx_cluster, single_gpu_fabric, pcie_cluster):
    assert (hgx_node.n_ranks, hgx_node.n_nodes, hgx_node.interconnect) == (8, 1, "nvswitch")
    assert hgx_node.intra_bw == 450e9 and hgx_node.inter_bw == 0.0
    assert (hgx_cluster.n_ranks, hgx_cluster.n_nodes, hgx_cluster.ppn) == (32, 4, 8)
    assert hgx_cluster.inter_bw == pytest.approx(50e9)       # 8 NICs of 50 GB/s over 8 GPUs
    assert hgx_cluster.inter_lat > 0
    assert single_gpu_fabric.ppn == 1 and single_gpu_fabric.intra_bw == 50e9
    # 2:1 oversubscribed spine halves what a GPU gets across the fabric
    assert pcie_cluster.interconnect == "pcie"
    assert pcie_cluster.inter_bw == pytest.approx(2 * 25e9 / 4 / 2)


def test_torus_is_not_an_nccl_machine():
    with pytest.raises(SemanticError, match="GPU nodes"):
        machine_of(torus("t", (4, 4), bandwidth=50e9, latency=1e-7))


def test_a_mesh_is_called_a_mesh():
    with pytest.raises(SemanticError, match="'m' is a mesh: NCCL tuning needs GPU nodes"):
        machine_of(torus("m", (4, 4), wrap=(False, False), bandwidth=50e9, latency=1e-7))


def test_alltoall_has_no_table():
    with pytest.raises(SemanticError, match="alltoall"):
        func_of(CollectiveKind.ALLTOALL)
    assert func_of(CollectiveKind.ALLREDUCE) is Func.ALLREDUCE


def test_algorithms_per_function(hgx_node, hgx_cluster):
    assert {a for a, _ in _impls(space_for(Func.BROADCAST, hgx_node, V230))} == {Algo.RING}
    ar_node = _impls(space_for(Func.ALLREDUCE, hgx_node, V230))
    assert (Algo.TREE, Proto.LL128) in ar_node and (Algo.NVLS, Proto.SIMPLE) in ar_node
    assert (Algo.NVLS_TREE, Proto.SIMPLE) not in ar_node          # needs several nodes
    ar_cluster = _impls(space_for(Func.ALLREDUCE, hgx_cluster, V230))
    assert (Algo.NVLS_TREE, Proto.SIMPLE) in ar_cluster
    assert (Algo.NVLS, Proto.SIMPLE) not in ar_cluster            # NVLS across nodes needs CollNet
    # NVLS kernels are Simple only; Tree serves AllReduce only
    assert (Algo.NVLS, Proto.LL) not in ar_node
    assert all(a is not Algo.TREE for a, _ in _impls(space_for(Func.ALLGATHER, hgx_node, V230)))


def test_pat_needs_one_gpu_per_node_and_2_23(single_gpu_fabric, hgx_cluster):
    ag = _impls(space_for(Func.ALLGATHER, single_gpu_fabric, V230))
    assert (Algo.PAT, Proto.SIMPLE) in ag and (Algo.PAT, Proto.LL) not in ag
    assert Algo.PAT not in {a for a, _ in _impls(space_for(Func.ALLGATHER, hgx_cluster, V230))}
    old = _impls(space_for(Func.ALLGATHER, single_gpu_fabric, NcclVersion.parse("2.22.3")))
    assert Algo.PAT not in {a for a, _ in old}
    assert Algo.PAT not in {a for a, _ in _impls(space_for(Func.ALLREDUCE, single_gpu_fabric,
                                                           V230))}


def test_ll128_only_over_nvlink(pcie_cluster, hgx_node):
    assert Proto.LL128 not in {p for _, p in _impls(space_for(Func.ALLREDUCE, pcie_cluster, V230))}
    assert Proto.LL128 in {p for _, p in _impls(space_for(Func.ALLREDUCE, hgx_node, V230))}


def test_transport_axis_only_between_gpus_on_pcie(pcie_cluster, hgx_node):
    assert {s.transport for s in space_for(Func.ALLREDUCE, pcie_cluster, V230).subspaces} == \
        {"p2p", "shm"}
    assert {s.transport for s in space_for(Func.ALLREDUCE, hgx_node, V230).subspaces} == {"p2p"}


def test_resource_axes(hgx_node):
    space = space_for(Func.ALLREDUCE, hgx_node, V230)
    ring = space.subspace(Algo.RING, Proto.SIMPLE, "p2p")
    tree = space.subspace(Algo.TREE, Proto.SIMPLE, "p2p")
    ll128 = space.subspace(Algo.RING, Proto.LL128, "p2p")
    assert ring.channels == tuple(range(1, 65))
    assert ring.threads[0] == 64 and ring.threads[-1] == 512
    assert all(t % 32 == 0 for t in ring.threads)
    assert ll128.threads[0] == 160 and ll128.threads[-1] == 640
    assert tree.threads == (640,)                   # Tree always runs NCCL_MAX_NTHREADS
    assert max(ring.chunks) == max_chunk(Algo.RING, Proto.SIMPLE) == 2 * 2**20
    assert len(ring.chunks) > 1
    assert space.size == sum(s.size for s in space.subspaces) == len(list(space.configs()))
    # before the v6 tuner (2.30) the chunk size cannot be set per collective
    old = space_for(Func.ALLREDUCE, hgx_node, NcclVersion.parse("2.28"))
    assert all(len(s.chunks) == 1 for s in old.subspaces)
    with pytest.raises(SemanticError):
        space_for(Func.ALLREDUCE, hgx_node, V230, max_channels=65)


@pytest.mark.parametrize("text,abi", [("2.21", 2), ("2.22.3", 3), ("2.24", 4), ("2.27.7", 4),
                                      ("2.28", 5), ("2.30.7", 6), ("2.32", 6)])
def test_versions(text, abi):
    assert NcclVersion.parse(text).tuner_abi == abi


@pytest.mark.parametrize("text", ["2.19", "two", "2"])
def test_bad_versions(text):
    with pytest.raises(SemanticError):
        NcclVersion.parse(text)


def test_a_failed_nic_lowers_what_every_gpu_gets():
    """The node with the fewest live NICs decides the per-GPU NIC bandwidth, whichever node
    the group starts on (NCCL takes the minimum over ranks), and a failed NIC counts
    nothing: 7 of 8 NICs of 50 GB/s over 8 GPUs."""
    from cclc.topology import leaf_spine, with_faults

    from .conftest import HGX

    topo = leaf_spine("cluster", 4, HGX, rails=8, leaves=None, spines=4,
                      oversubscription=1.0, bandwidth=50e9, latency=1e-6)
    v = topo.vertex("node2.nic5")
    links = [(int(a), int(b)) for a, b in zip(topo.link_src, topo.link_dst, strict=True)
             if v in (a, b)]
    assert machine_of(with_faults(topo, links=links)).inter_bw == pytest.approx(50e9 * 7 / 8)
    assert machine_of(topo).inter_bw == pytest.approx(50e9)
