"""Elaboration: every example builds, and names, units, groups and faults mean what they say."""

from dataclasses import FrozenInstanceError
from pathlib import Path

import numpy as np
import pytest

from cclc.collective import CollectiveKind, DType, ReduceOp
from cclc.errors import CclError, CollectiveError
from dsl import Program, load, loads

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
#: machine descriptions the benchmarks use that cclc cannot compile whole yet (the 4,096-GPU
#: fabric, which the size check refuses): they elaborate like the examples
MACHINES = Path(__file__).resolve().parents[2] / "benchmarks" / "machines"


def _file(name: str) -> Path:
    return EXAMPLES / name if (EXAMPLES / name).exists() else MACHINES / name

# example -> {topology: (ranks, directed links, failed links, failed ranks)}
EXPECTED_TOPOLOGIES = {
    "torus5x5.ccl": {"torus": (25, 100, 0, 0)},
    "torus5x5_fault.ccl": {"torus": (25, 100, 2, 0)},
    "torus5x5x5.ccl": {"cube": (125, 750, 0, 0)},
    "tpuv4_4x4x4_ocs.ccl": {"pod": (64, 384, 4, 0)},
    "tpuv4_8x4x4.ccl": {"slice": (128, 768, 0, 0)},
    "mesh4x4.ccl": {"m": (16, 48, 0, 0)},
    "torus4x4_failed_rank.ccl": {"pod": (16, 64, 8, 1)},
    # 8 GPU<->NVSwitch link pairs
    "hgx_node.ccl": {"box": (8, 16, 0, 0)},
    # per node: 8 GPU<->NVSwitch + 8 GPU<->NIC + 8 NIC<->leaf pairs; 8 leaves x 8 spines pairs
    "hgx16_leafspine.ccl": {"cluster": (128, 16 * 48 + 2 * 8 * 8, 2, 0)},
    # per node: GPU<->PCIe switch, switch<->NIC, NIC<->fabric switch
    "fabric6_single_gpu.ccl": {"sw": (6, 6 * 6, 0, 0)},
    # per node: 4 GPU<->switch + 2 switch<->NIC + 2 NIC<->leaf pairs; 2 leaves x 2 spines
    "pcie_oversubscribed.ccl": {"cluster": (32, 8 * 16 + 2 * 2 * 2, 2, 1)},
    "alltoall_nonuniform.ccl": {"ring": (8, 16, 0, 0)},
    # per node: 8 GPU<->NVSwitch + 8 GPU<->NIC + 8 NIC<->leaf pairs; per pod 16 leaves x 16
    # spines; 8 pods x 16 spines x 2 cores of their group
    "pods512_fattree.ccl": {"cluster": (4096, 512 * 48 + 2 * 8 * 16 * 16 + 2 * 8 * 16 * 2,
                                        0, 0)},
    # the NCCL model's machines at scale: per node 48 link pairs as above; leaves x spines
    "h100_128node_leafspine.ccl": {"cluster": (1024, 128 * 48 + 2 * 32 * 32, 0, 0)},
    "h200_248node_leafspine.ccl": {"cluster": (1984, 248 * 48 + 2 * 64 * 32, 0, 0)},
    "h100_10node_leafspine.ccl": {"cluster": (80, 10 * 48 + 2 * 8 * 8, 0, 0)},
}

# example -> [(collective, kind, group size, size in bytes)]
EXPECTED_COLLECTIVES = {
    "torus5x5.ccl": [("a2a", "alltoall", 25, 25 << 20)],
    "torus5x5_fault.ccl": [("a2a", "alltoall", 25, 25 << 20)],
    "torus5x5x5.ccl": [("a2a", "alltoall", 125, 125 << 20),
                       ("ag", "allgather", 125, 125 << 20)],
    "tpuv4_4x4x4_ocs.ccl": [("a2a", "alltoall", 64, 16 << 20),
                            ("grads", "allreduce", 64, 256 << 20)],
    "tpuv4_8x4x4.ccl": [("a2a", "alltoall", 128, 32 << 20),
                        ("grads", "allreduce", 128, 1 << 30),
                        ("xring", "allgather", 8, 64 << 20)],
    "mesh4x4.ccl": [("a2a", "alltoall", 16, 16 << 20), ("ag", "allgather", 16, 64 << 20)],
    "torus4x4_failed_rank.ccl": [("ag", "allgather", 15, 15 << 20),
                                 ("corner", "allreduce", 4, 8 << 20)],
    "hgx_node.ccl": [("grads", "allreduce", 8, 1 << 30), ("ag", "allgather", 8, 256 << 20),
                     ("a2a", "alltoall", 8, 128 << 20)],
    "hgx16_leafspine.ccl": [("grads", "allreduce", 128, 1 << 30),
                            ("acts", "allgather", 16, 64 << 20),
                            ("shards", "reducescatter", 128, 512 << 20)],
    "fabric6_single_gpu.ccl": [("ag", "allgather", 6, 6 << 20),
                               ("rs", "reducescatter", 6, 48 << 20),
                               ("ar", "allreduce", 6, 96 << 20)],
    "pcie_oversubscribed.ccl": [("bcast", "broadcast", 4, 64 << 20),
                                ("sum", "reduce", 8, 16 << 20)],
    # the largest row sum of the matrix: 4 MiB + 6 x 1 MiB + 512 KiB
    "alltoall_nonuniform.ccl": [("moe", "alltoall", 8, (10 << 20) + (512 << 10))],
    "pods512_fattree.ccl": [("grads", "allreduce", 4096, 1 << 30),
                            ("params", "allgather", 4096, 1 << 30),
                            ("shards", "reducescatter", 4096, 1 << 30),
                            ("tokens", "alltoall", 4096, 1 << 30)],
}


def test_every_example_is_listed():
    files = [*EXAMPLES.glob("*.ccl"), *MACHINES.glob("*.ccl")]
    assert sorted(p.name for p in files) == sorted(EXPECTED_TOPOLOGIES)


@pytest.mark.parametrize("name", sorted(EXPECTED_TOPOLOGIES))
def test_example_topologies(name):
    program = load(_file(name))
    got = {t: (topo.n_ranks, topo.n_links, topo.n_failed_links, len(topo.failed_ranks))
           for t, topo in program.topologies.items()}
    assert got == EXPECTED_TOPOLOGIES[name]


@pytest.mark.parametrize("name", sorted(EXPECTED_COLLECTIVES))
def test_example_collectives(name):
    program = load(_file(name))
    got = [(c.name, c.kind.value, len(c.group), c.size) for c in program.collectives]
    assert got == EXPECTED_COLLECTIVES[name]
    for c in program.collectives:
        assert c.topology is program.topologies[c.topology.name]
        assert c.span is not None and c.span.file.endswith(name)
        assert c.topology.is_connected(c.group)


def _program(text: str) -> Program:
    return loads(text, "t.ccl")


def test_torus_links_per_dimension():
    program = _program("topology t = torus(4, 3) {\n wrap on, off\n link 50 GB/s, 100 ns\n"
                       " link dim 1: 25 GB/s, 1 us\n}")
    t = program.topologies["t"]
    assert t.dims == (4, 3) and t.wrap == (True, False)
    # dimension 0: 3 rings of 4 with wrap (8 links each); dimension 1: 4 lines of 3 (4 each)
    assert t.n_links == 3 * 8 + 4 * 4
    assert sorted(set(t.link_bandwidth.tolist())) == [25e9, 50e9]
    assert sorted(set(t.link_latency.tolist())) == pytest.approx([100e-9, 1e-6])


def test_mesh_is_a_torus_without_wrap():
    t = _program("topology m = mesh(4, 4) { link 32 GB/s, 100 ns }").topologies["m"]
    assert t.wrap == (False, False) and t.n_links == 48


def test_size_two_and_size_one_dimensions():
    # a wrapped dimension of 2 has one link pair per ring; a dimension of 1 has none
    t = _program("topology t = torus(2, 1, 3) { link 1 GB/s, 1 ns }").topologies["t"]
    assert t.n_links == 3 * 2 + 0 + 2 * 6


def test_units_are_converted_to_si():
    program = _program("node n = pcie(gpus = 2) { link 24 GB/s, 2 us; nic 2 x 200 Gb/s; ports 2 }")
    n = program.node_types["n"]
    assert (n.interconnect, n.gpus, n.nics, n.nic_ports) == ("pcie", 2, 2, 2)
    assert n.bandwidth == 24e9 and n.latency == pytest.approx(2e-6)
    assert n.nic_bandwidth == 25e9


def test_faults_directed_group_and_rank():
    program = _program("""
topology t = torus(4, 4) {
    link 50 GB/s, 100 ns
    fault link (0,0) -> (0,1)
    fault group ocs { (1,0) -- (1,3); (2,0) -- (2,3) }
    fault rank 15
}""")
    t = program.topologies["t"]
    a, b = t.rank_at((0, 0)), t.rank_at((0, 1))
    assert t.link_failed[t.link_id(a, b)] and not t.link_failed[t.link_id(b, a)]
    (group,) = t.fault_groups
    assert group[0] == "ocs" and len(group[1]) == 4
    assert t.failed_ranks == {15}
    assert t.n_failed_links == 1 + 4 + 8


def test_group_selectors_on_a_fabric():
    program = _program("""
node hgx = nvswitch(gpus = 4) { link 450 GB/s, 1 us; nic 2 x 400 Gb/s }
topology c = fabric(leaf_spine) {
    nodes 3 x hgx; link 400 Gb/s, 2 us
    fault rank node(1).gpu(0)
}
collective all = allreduce on c { size 4 MiB }
collective r1 = allgather on c.rail(1) { size 24 B }
collective n2 = allgather on c.node(2) { size 64 B }
collective lead = reduce on c.leaders { size 1 MiB; root 1 }
collective some = allgather on c.ranks[node(0).gpu(3), 5] { size 8 B }
""")
    got = {c.name: c.group for c in program.collectives}
    assert got["all"] == tuple(r for r in range(12) if r != 4)
    # 2 NICs on 4 GPUs: NIC 1 (rail 1) is affine to GPUs 2 and 3 of each node
    assert got["r1"] == (2, 3, 6, 7, 10, 11)
    assert got["n2"] == (8, 9, 10, 11)
    assert got["lead"] == (0, 5, 8)     # GPU 0 of node 1 has failed: its GPU 1 leads
    assert got["some"] == (3, 5)
    assert program.collectives[3].root == 1


def test_group_ranks_by_coordinates_and_numbers():
    program = _program("topology t = torus(3, 3) { link 1 GB/s, 1 ns }\n"
                       "collective g = allgather on t.ranks[(2,1), 0, (1,1)] { size 12 B }")
    assert program.collectives[0].group == (7, 0, 4)


def test_collective_settings_and_defaults():
    program = _program("""
topology t = torus(4) { link 1 GB/s, 1 ns }
collective a = alltoall on t { size 1 MiB }
collective b = allreduce on t { size 1 MiB; dtype bf16; op max
    algorithm ring; schedule pipeline(chunks = 6, buffer = 4 MiB, gap = 2 us, mode = fast) }
collective c = broadcast on t { size 1 MiB }
""")
    a, b, c = program.collectives
    assert (a.dtype, a.op, a.root, a.algorithm.name, a.schedule.name) == (
        DType.FP32, ReduceOp.SUM, None, "auto", "auto")
    assert (b.kind, b.dtype, b.op, b.algorithm.name) == (
        CollectiveKind.ALLREDUCE, DType.BF16, ReduceOp.MAX, "ring")
    assert b.schedule.name == "pipeline"
    assert b.schedule.params == (("chunks", 6), ("buffer", 4 << 20), ("gap", pytest.approx(2e-6)),
                                 ("mode", "fast"))
    assert b.schedule.span.line == 5
    assert c.root == 0


def test_sizes_matrix_is_read_relative_to_the_file(tmp_path):
    (tmp_path / "m.csv").write_text("# bytes\n0, 8, 16\n8, 0, 8\n\n4, 4, 0\n")
    (tmp_path / "a.ccl").write_text(
        'topology t = torus(3) { link 1 GB/s, 1 ns }\n'
        'collective x = alltoall on t { sizes "m.csv" }\n')
    (c,) = load(tmp_path / "a.ccl").collectives
    np.testing.assert_array_equal(c.pair_sizes, [[0, 8, 16], [8, 0, 8], [4, 4, 0]])
    assert c.size == 24


def test_names_are_kept_verbatim():
    program = _program("topology My_Pod2 = torus(2) { link 1 GB/s, 1 ns }\n"
                       "collective Grad_AR = allreduce on My_Pod2 { size 4 B }")
    assert list(program.topologies) == ["My_Pod2"]
    assert program.topologies["My_Pod2"].name == "My_Pod2"
    assert program.collectives[0].name == "Grad_AR"


def test_program_is_frozen():
    program = _program("topology t = torus(2) { link 1 GB/s, 1 ns }")
    with pytest.raises(FrozenInstanceError):
        program.collectives = ()


def test_unreadable_file_is_an_error_without_span(tmp_path):
    with pytest.raises(CclError) as info:
        load(tmp_path / "missing.ccl")
    assert info.value.span is None and "cannot read" in info.value.message


def test_model_errors_get_a_span():
    # make_collective raises without a span; the elaborator places it on the size
    with pytest.raises(CollectiveError) as info:
        _program("topology t = torus(4) { link 1 GB/s, 1 ns }\n"
                 "collective c = allgather on t { size 6 B }")
    span = info.value.span
    assert (span.line, span.col, span.end_col) == (2, 38, 41)      # "6 B"


@pytest.mark.parametrize("text", ["", "# a comment\n\n"])
def test_a_file_that_declares_nothing_is_an_error(text):
    with pytest.raises(CclError, match="the file declares nothing") as info:
        loads(text, "empty.ccl")
    assert (info.value.span.file, info.value.span.line, info.value.span.col) == ("empty.ccl", 1, 1)


def test_multicast_marks_an_nvswitch_node_and_its_topology():
    program = _program("node n = nvswitch(gpus = 4) { link 450 GB/s, 1 us; multicast }\n"
                       "topology one = node(n)")
    assert program.node_types["n"].multicast and program.topologies["one"].multicast
    plain = _program("node n = nvswitch(gpus = 4) { link 450 GB/s, 1 us }\ntopology one = node(n)")
    assert not plain.node_types["n"].multicast and not plain.topologies["one"].multicast


def test_multicast_on_a_pcie_node_is_an_error():
    with pytest.raises(CclError, match="a pcie node has no NVSwitch") as err:
        _program("node n = pcie(gpus = 4) { link 24 GB/s, 2 us; multicast }")
    assert err.value.span is not None and err.value.span.line == 1
