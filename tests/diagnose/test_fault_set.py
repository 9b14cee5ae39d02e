"""``cclc diagnose --fault-set``: the suspects as the fault set a catalog library takes."""

from __future__ import annotations

import json

import numpy as np

import dsl
from cclc import cli
from cclc.diagnose.faults import fault_set
from cclc.diagnose.inject import Fault, probe_timings
from cclc.diagnose.localize import Suspect
from cclc.diagnose.timings import to_pairs_csv
from cclc.topology import torus, with_faults

SRC = "examples/torus5x5.ccl"


def _slow_link(topo):
    a, b = topo.rank_at((1, 1)), topo.rank_at((1, 2))
    return topo.link_id(a, b)


def _line(out: str) -> str:
    return next(line for line in out.splitlines() if line.startswith("CCLC_FAULTS="))


def test_slow_link_from_a_csv_probe(tmp_path, capsys):
    topo = next(iter(dsl.load(SRC).topologies.values()))
    bad = _slow_link(topo)
    probe = tmp_path / "probe.csv"
    probe.write_text(to_pairs_csv(probe_timings(topo, (Fault("link", "x", (bad,)),),
                                                noise=0.02, seed=4)))
    assert cli.main(["diagnose", str(probe), "--topology", SRC, "--fault-set"]) == 1
    out = capsys.readouterr().out
    assert _line(out) == f"CCLC_FAULTS={bad}"
    assert f"({topo.link_name(bad)})" in out


def test_from_the_plugins_per_rank_json_files(tmp_path, capsys):
    # CCLC_PEER_TIMINGS: one file per rank, each with its sends and receives
    topo = next(iter(dsl.load(SRC).topologies.values()))
    bad = _slow_link(topo)
    t = probe_timings(topo, (Fault("link", "x", (bad,)),), noise=0.02, seed=5)
    files = []
    for r in range(topo.n_ranks):
        records = [{"rank": int(s), "peer": int(d), "dir": "send", "bytes": float(b),
                    "seconds": float(x)}
                   for s, d, b, x in zip(t.src, t.dst, t.nbytes, t.seconds, strict=True)
                   if s == r]
        path = tmp_path / f"peers.rank{r}.json"
        path.write_text(json.dumps({"format": "cclc-peer-timings", "version": 1,
                                    "records": records}))
        files.append(str(path))
    assert cli.main(["diagnose", *files, "--topology", SRC, "--fault-set"]) == 1
    assert _line(capsys.readouterr().out) == f"CCLC_FAULTS={bad}"


def test_healthy_timings_give_the_empty_set(tmp_path, capsys):
    topo = next(iter(dsl.load(SRC).topologies.values()))
    probe = tmp_path / "probe.csv"
    probe.write_text(to_pairs_csv(probe_timings(topo, (), noise=0.02, seed=6)))
    assert cli.main(["diagnose", str(probe), "--topology", SRC, "--fault-set"]) == 0
    out = capsys.readouterr().out
    assert _line(out) == "CCLC_FAULTS=" and "none (the machine as compiled)" in out


def _suspect(links=(), rank=None):
    return Suspect(kind="link", name="x", same_pairs=(), links=tuple(links), rank=rank,
                   score=9.0, confidence=0.99, posterior=1.0, p_value=0.01, pairs=3, slow=3,
                   hung=0, slowdown=2.0, explained=3, slow_total=3,
                   pair_index=np.zeros(0, dtype=np.int64))


def test_fault_set_keeps_healthy_links_and_sets_ranks_apart():
    topo = with_faults(torus("t", (4, 4)), links=[(0, 4)])
    down = topo.link_id(0, 4)
    links, ranks = fault_set(topo, (_suspect((7, down, 3)), _suspect((3,)), _suspect(rank=5)))
    assert links == (3, 7) and ranks == (5,)
