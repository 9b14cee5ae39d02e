"""benchmarks/fattree_scale.py: the fault it measures is the one the compiled file declares, on
the shipped 4,096-GPU fabric and on another fabric file (``--machine``)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

import dsl

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("fattree_scale",
                                               ROOT / "benchmarks" / "fattree_scale.py")
assert _spec is not None and _spec.loader is not None
fattree_scale = importlib.util.module_from_spec(_spec)
sys.modules["fattree_scale"] = fattree_scale
_spec.loader.exec_module(fattree_scale)


@pytest.mark.parametrize("machine", [fattree_scale.MACHINE,
                                     ROOT / "examples" / "hgx16_leafspine.ccl"])
def test_the_fault_lands_in_the_fabric(tmp_path, machine):
    shipped = fattree_scale._machine(machine, None, tmp_path)
    assert shipped == str(machine.relative_to(ROOT))
    copy = Path(fattree_scale._machine(machine, "nic node(0).nic(0)", tmp_path))
    (before,) = dsl.load(machine).topologies.values()
    (after,) = dsl.load(copy).topologies.values()
    nic = after.vertex("node0.nic0")
    touching = (after.link_src == nic) | (after.link_dst == nic)
    assert after.link_failed[touching].all() and not before.link_failed[touching].any()
    assert after.n_failed_links == before.n_failed_links + int(touching.sum())


def test_an_unknown_collective_is_refused(capsys):
    with pytest.raises(SystemExit):
        fattree_scale.main(["--machine", str(ROOT / "examples" / "hgx16_leafspine.ccl"),
                            "--only", "tokens"])
    assert "has no collective tokens (it has grads, acts, shards)" in capsys.readouterr().err


def test_a_machine_outside_the_repository_is_named_as_given(tmp_path):
    outside = tmp_path / "f.ccl"
    outside.write_text((ROOT / "examples" / "hgx16_leafspine.ccl").read_text())
    assert fattree_scale._machine(outside, None, tmp_path) == str(outside)
