"""``cclc catalog``: the report, the catalog file, and refusals with clear messages."""

from __future__ import annotations

import json

import pytest

from cclc.cli import main

SMALL = """topology pod = torus(3, 3) {
    link 50 GB/s, 1 us
}
collective ag = allgather on pod { size 9 KiB }
"""


@pytest.fixture
def ccl(tmp_path):
    path = tmp_path / "pod.ccl"
    path.write_text(SMALL)
    return path


def test_catalog_writes_file_and_report(ccl, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["catalog", str(ccl), "--faults", "link", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "class link: 18 fault sets in 1 orbits" in text
    assert "2 schedules for 18 fault sets" in text and "worst" in text
    doc = json.loads((out / "ag.catalog.json").read_text())
    assert doc["format"] == "cclc-catalog" and doc["summary"]["members"] == 18
    assert len(doc["schedules"]) == 2 and len(doc["members"]) == 18
    for m in doc["members"]:
        assert sorted(m["perm"]) == list(range(9)) and m["schedule"] == 1
        assert len(m["faults"]["links"]) == 2       # a cable: both directions
    for s in doc["schedules"]:
        assert (out / s["file"]).is_file()
    # the stored schedules read back and verify
    assert main(["verify", str(out / doc["schedules"][1]["file"])]) == 0


@pytest.mark.parametrize("args, message", [
    (["--faults", "cosmic"], "unknown fault class 'cosmic'"),
    (["--faults", "nic"], "has no NICs"),
    (["--faults", "cable"], "is for fabrics"),
    (["--faults", "rank", "--emit", "nccl"], "ncclCommShrink"),
    (["--faults", "link", "--only", "nope"], "no collective 'nope'"),
])
def test_refusals(ccl, tmp_path, capsys, args, message):
    assert main(["catalog", str(ccl), "-o", str(tmp_path / "o"), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_help_has_examples(capsys):
    with pytest.raises(SystemExit):
        main(["catalog", "--help"])
    assert "cclc catalog examples/torus5x5.ccl --faults link -o out/" in capsys.readouterr().out


FABRIC = """node gpu1 = pcie(gpus = 1) {
    link 48 GB/s, 1 us
    nic  1 x 400 Gb/s
}
topology sw = fabric(switch) {
    nodes 4 x gpu1
    link  400 Gb/s, 2 us
}
collective ag = allgather on sw { size 4 MiB }
"""


def test_fabric_classes_and_unserved_fault_sets(tmp_path, capsys):
    # one NIC per server: losing it (or its cable) cuts the server off, which no schedule
    # serves; the four servers are alike, so each class is one orbit
    path = tmp_path / "fab.ccl"
    path.write_text(FABRIC)
    assert main(["catalog", str(path), "--faults", "nic,cable", "-o", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert "class nic: 4 fault sets in 1 orbits" in out
    assert "class cable: 4 fault sets in 1 orbits" in out
    assert "the faults disconnect the group" in out and "8 fault sets unserved" in out
    doc = json.loads((tmp_path / "o" / "ag.catalog.json").read_text())
    assert doc["summary"]["unserved"] == 8 and "perm" not in doc["members"][0]
