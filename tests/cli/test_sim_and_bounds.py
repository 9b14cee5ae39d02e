"""``cclc sim`` and ``cclc bounds`` end to end through the command line."""

from __future__ import annotations

import os

import pytest
from sim_builders import ring_allgather

from cclc import serialize
from cclc.cli import main
from cclc.topology import torus


@pytest.fixture
def ring_schedule(tmp_path):
    t = torus("ring", (6,), bandwidth=10e9, latency=1e-6)
    path = tmp_path / "ag.schedule.json"
    serialize.save(ring_allgather(t, 6 * 100_000), path)
    return path


def test_sim_prints_time_bandwidths_and_percent_of_bound(ring_schedule, capsys):
    assert main(["sim", str(ring_schedule)]) == 0
    out = capsys.readouterr().out
    # (N-1) (latency + S/N/B) = 5 x (1 + 10) us
    assert "time        55.000 us" in out
    assert "algbw       10.909 GB/s" in out            # 600 kB / 55 us
    assert "busbw       9.091 GB/s" in out             # x 5/6
    # bidirectional-ring bound (n-1) S / (2 n B) = 25 us: a one-direction ring reaches 45.5%
    assert "bound       25.000 us" in out
    assert "% of bound  45.5%" in out
    assert "busiest links:" in out and "(0)->(1)" in out


def test_sim_steps_and_event_mode(ring_schedule, capsys):
    assert main(["sim", "--mode", "event", "--steps", "--links", "2", "--no-lp",
                 str(ring_schedule)]) == 0
    out = capsys.readouterr().out
    assert "mode event" in out
    lines = [ln for ln in out.splitlines() if ln.strip().startswith(("0 ", "4 "))]
    assert len(lines) == 2
    assert out.count("->") >= 2 + 5                  # 2 busiest links + a link per step


def test_sim_of_a_missing_file_exits_2(tmp_path, capsys):
    assert main(["sim", str(tmp_path / "nope.json")]) == 2
    assert "error" in capsys.readouterr().err


def test_bounds_prints_every_bound_of_every_collective(tmp_path, capsys):
    src = tmp_path / "ring.ccl"
    src.write_text("topology ring = torus(8) { link 10 GB/s, 1 us }\n"
                   "collective a2a = alltoall on ring { size 8 MiB }\n"
                   "collective ag = allgather on ring { size 8 MiB }\n")
    assert main(["bounds", str(src)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("a2a: alltoall of 8388608 B on 8 ranks of 'ring'")
    names = [ln[3:].split()[0] for ln in out.splitlines() if ln[:3] in ("   ", " * ")
             and not ln.strip().startswith(("best:", "note:"))]
    assert names == ["hop_bytes", "injection", "cut", "latency", "lp"] * 2
    # alltoall on a ring of 8: N S / (8 B) = 838.861 us, met by hop-bytes, the cut and the LP
    assert "best: hop_bytes, 838.861 us" in out
    assert "ag: allgather" in out


def test_bounds_of_a_bad_file_exits_2(tmp_path, capsys):
    src = tmp_path / "bad.ccl"
    src.write_text("topology ring = torus(8) { link 10 GB/s 1 us }\n")
    assert main(["bounds", str(src)]) == 2
    assert "bad.ccl:1:" in capsys.readouterr().err


def test_bounds_prints_the_lockstep_bound_on_machines_of_nodes(capsys):
    examples = os.path.join(os.path.dirname(__file__), "..", "..", "examples")
    assert main(["bounds", "--no-lp", os.path.join(examples, "hgx16_leafspine.ccl")]) == 0
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if ln.startswith("   in the lockstep model:")]
    # `grads`, `acts` and `shards`
    assert len(lines) == 3
    # acts: one GPU per node, so one step: the 4 us route and 60 MiB into NIC 0 at 50 GB/s
    assert lines[1].startswith("   in the lockstep model: 1262.29")


def test_sim_as_mscclpp_says_when_that_output_refuses_the_schedule(tmp_path, capsys):
    # a direct alltoall between two servers of three GPUs: its cross-rail pairs go over
    # NVLink to the destination's rail (NCCL's PXN), which MSCCL++'s port channels cannot do
    from cclc.algorithms import get
    from cclc.collective import CollectiveKind, make_collective
    from cclc.own_nics import own_nic_routes
    from cclc.topology import NodeType, leaf_spine

    node = NodeType("box", "nvswitch", 3, 450e9, 1e-6, nics=3, nic_bandwidth=50e9)
    topo = leaf_spine("f", 2, node, rails=3, leaves=None, spines=2, oversubscription=1.0,
                      bandwidth=50e9, latency=2e-6)
    coll = make_collective("a2a", CollectiveKind.ALLTOALL, topo, topo.all_ranks(),
                           size=6 * 6 * 16)
    direct = get("direct")
    assert direct is not None
    pxn = direct.build(coll)
    for name, schedule, refused in (("pxn", pxn, True), ("own", own_nic_routes(pxn), False)):
        path = tmp_path / f"{name}.schedule.json"
        serialize.save(schedule, path)
        assert main(["sim", "--no-lp", "--backend", "mscclpp", "--backend", "nccl",
                     str(path)]) == 0
        out = capsys.readouterr().out
        assert "as mscclpp" in out and "(mscclpp model" in out and "as nccl" in out
        assert ("but --emit mscclpp refuses this schedule: MSCCL++ sends each rank's port "
                "channels through one IB device" in out) == refused
        assert "but --emit nccl refuses" not in out
