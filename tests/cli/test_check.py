"""``cclc check``: counts per topology and one line per collective."""

from __future__ import annotations

import pytest

from cclc import cli

SOURCE = """\
node hgx = nvswitch(gpus = 4) { link 450 GB/s, 1 us;  nic 2 x 400 Gb/s }

topology cluster = fabric(leaf_spine) {
    nodes 4 x hgx
    rails 2
    spines 2
    link 400 Gb/s, 2 us
    fault link leaf(1) -- spine(1)
}
topology pod = torus(3, 4) {
    link 50 GB/s, 100 ns
    fault rank (1,1)
    fault link (0,0) -> (0,1)
    fault group ocs1 { (2,0) -- (2,1); (2,2) -- (2,3) }
}
collective grads = allreduce on cluster { size 1 MiB; dtype bf16 }
collective acts = allgather on cluster.rail(0) { size 64 KiB; algorithm ring }
collective b = broadcast on pod { size 4 KiB; root 2; algorithm tree }
"""


@pytest.fixture
def run_cli(monkeypatch, capsys):
    # only this area's commands: the others are tested (and may be written) elsewhere
    monkeypatch.setattr(cli, "COMMANDS", ["check", "compile"])

    def run(*argv):
        code = cli.main([str(a) for a in argv])
        out, err = capsys.readouterr()
        return code, out, err
    return run


def test_check_prints_counts(tmp_path, run_cli):
    path = tmp_path / "two.ccl"
    path.write_text(SOURCE)
    code, out, err = run_cli("check", path)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == f"{path}: 2 topologies, 3 collectives"
    # 16 GPUs; per node 1 NVSwitch + 2 NICs, 2 leaves, 2 spines = 16 switches;
    # links both ways: 16 GPU-NVSwitch, 8 NIC-GPU (its PCIe affinity), 8 NIC-leaf, 4 leaf-spine
    assert ("topology cluster: fabric of 4 nodes, 16 ranks, 16 switches, 72 directed links, "
            "2 failed links") in out
    assert "failed links: leaf1->spine1, spine1->leaf1" in out
    # 3x4 torus: 2 x (12 + 12) links; rank (1,1) takes its 8, the group 4, one more alone
    assert "topology pod: torus 3x4, 12 ranks, 0 switches, 48 directed links, 13 failed links" \
        in out
    assert "fault group ocs1: 4 directed links" in out
    assert "failed ranks: (1,1)" in out
    assert "failed links: (0,0)->(0,1)" in out
    assert ("collective grads: allreduce on cluster, group all (16 ranks), size 1 MiB, bf16, "
            "op sum, algorithm auto, schedule auto") in out
    assert "collective acts: allgather on cluster, group rail(0) (8 ranks), size 64 KiB" in out
    assert "algorithm ring, schedule auto" in out
    assert ("collective b: broadcast on pod, group all (11 ranks), size 4 KiB, fp32, root (0,2),"
            " algorithm tree") in out


def test_check_reports_errors_at_their_place(tmp_path, run_cli):
    path = tmp_path / "bad.ccl"
    path.write_text("topology t = torus(4) { link 0 GB/s, 1 us }\n")
    code, _out, err = run_cli("check", path)
    assert code == 2
    assert err.startswith(f"{path}:1:")
    assert "Traceback" not in err


def test_help_text(monkeypatch, capsys):
    monkeypatch.setattr(cli, "COMMANDS", ["check", "compile"])
    for command in ("check", "compile"):
        with pytest.raises(SystemExit) as info:
            cli.main([command, "--help"])
        assert info.value.code == 0
        assert f"cclc {command} " in capsys.readouterr().out
