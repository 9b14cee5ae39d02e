"""nccl-tests output as timings: rank lines placed on the topology, the largest size's time,
bad input at its place, and measure -> nccl-tests files -> diagnose -> recompile.

The files here are written by :func:`nccl_tests_output`, our own writer of the format that
nccl-tests documents by printing it (header, ``#  Rank`` lines, column header, result rows,
footer), with made-up hosts, PIDs and times.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dsl
from cclc import cli
from cclc.diagnose.inject import Fault, probe_timings
from cclc.diagnose.nccl_tests import (
    is_nccl_tests,
    nccl_tests_timings,
    parse_hosts,
    parse_nccl_tests,
)
from cclc.diagnose.pair_timings import TimingsError
from cclc.diagnose.timings import parse_timings, read_timings_files
from cclc.serialize import load


def _time(usec: float) -> str:
    # nccl-tests' precision: fewer decimals for longer times
    return f"{usec:7.0f}" if usec >= 1e4 else f"{usec:7.1f}" if usec >= 100 else f"{usec:7.2f}"


def nccl_tests_output(ranks, sizes_usec, test="sendrecv_perf", failed=False,
                      group_column=True, in_place_only=False) -> str:
    """A sendrecv_perf log: ``ranks`` as (host, device), rows as (size, microseconds)."""
    max_bytes = max(s for s, _ in sizes_usec) if sizes_usec else 1 << 24
    out = ["# nccl-tests version 2.17.6 nccl-headers=22807 nccl-library=22807",
           f"# Collective test starting: {test}",
           f"# nThread 1 nGpus 1 minBytes 1048576 maxBytes {max_bytes} step: 2(factor) "
           "warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0",
           "#", "# Using devices"]
    for r, (host, dev) in enumerate(ranks):
        group = f"Group {0:2d} " if group_column else ""
        out.append(f"#  Rank {r:2d} {group}Pid {7100 + r:6d} on {host:>10s} device {dev:2d} "
                   f"[0000:{0x18 + dev:02x}:00] NVIDIA H100 80GB HBM3")
    out += ["#",
            f"# {'':>10s}  {'':>12s}  {'':>8s}  {'':>6s}  {'':>6s}           out-of-place"
            "                       in-place          ",
            f"# {'size':>10s}  {'count':>12s}  {'type':>8s}  {'redop':>6s}  {'root':>6s}  "
            f"{'time':>7s}  {'algbw':>6s}  {'busbw':>6s} {'#wrong':>6s}  {'time':>7s}  "
            f"{'algbw':>6s}  {'busbw':>6s} {'#wrong':>6s}",
            f"# {'(B)':>10s}  {'(elements)':>12s}  {'':>8s}  {'':>6s}  {'':>6s}  {'(us)':>7s}  "
            f"{'(GB/s)':>6s}  {'(GB/s)':>6s}  {'':>5s}  {'(us)':>7s}  {'(GB/s)':>6s}  "
            f"{'(GB/s)':>6s}  {'':>5s}"]
    for size, usec in sizes_usec:
        bw = size / usec / 1e3
        row = f"{size:12d}  {size // 4:12d}  {'float':>8s}  {'none':>6s}  {-1:6d}"
        result = f"  {_time(usec)}  {bw:6.2f}  {bw:6.2f}  {0:5g}"
        row += (" " * 32 if in_place_only else result) + result
        out.append(row)
    if failed:
        out.append(f"{ranks[0][0]}: Test timeout (60s) common.cu:412")
    else:
        out += ["# Out of bounds values : 0 OK", "# Avg bus bandwidth    : 12.34 ", "#"]
    return "\n".join(out) + "\n"


def _torus():
    return next(iter(dsl.load("examples/torus5x5.ccl").topologies.values()))


def _hgx():
    return next(iter(dsl.load("examples/hgx16_leafspine.ccl").topologies.values()))


def test_reads_largest_size_out_of_place_and_is_detected():
    text = nccl_tests_output([("nodeA", 0), ("nodeB", 0)],
                             [(1 << 20, 80.0), (1 << 24, 420.5), (1 << 22, 150.0)])
    assert is_nccl_tests(text)
    run = parse_nccl_tests(text, "a.log")
    assert run.nbytes == 1 << 24 and run.seconds == pytest.approx(420.5e-6)
    assert [(r.rank, r.host, r.device) for r in run.ranks] == [(0, "nodeA", 0), (1, "nodeB", 0)]
    # -O 0 leaves the out-of-place columns blank: the in-place time is read; older
    # versions print no Group column
    run = parse_nccl_tests(nccl_tests_output([("a", 0), ("b", 0)], [(4096, 12.5)],
                                             group_column=False, in_place_only=True))
    assert run.seconds == pytest.approx(12.5e-6)
    # the other readers leave it alone, and say why
    with pytest.raises(TimingsError, match="needs the topology"):
        parse_timings(text, "a.log")
    assert not is_nccl_tests("src,dst,bytes,seconds\n0,1,1,1\n")


def test_two_rank_runs_map_host_and_device_onto_nodes():
    topo = _hgx()
    runs = [parse_nccl_tests(nccl_tests_output([("h3", 5), ("h1", 5)], [(1 << 20, 50.0)]), "x"),
            parse_nccl_tests(nccl_tests_output([("h1", 2), ("h7", 6)], [(1 << 20, 70.0)]), "y")]
    # first appearance: h3 is node 0, h1 node 1, h7 node 2
    t = nccl_tests_timings(runs, topo)
    got = {(s, d): x
           for s, d, x in zip(t.src.tolist(), t.dst.tolist(), t.seconds.tolist(), strict=True)}
    assert got == pytest.approx({(0 * 8 + 5, 1 * 8 + 5): 50e-6, (13, 5): 50e-6,
                                 (1 * 8 + 2, 2 * 8 + 6): 70e-6, (22, 10): 70e-6})
    assert t.concurrent is False
    # with a hosts list (FQDNs: nccl-tests prints the part before the first '.')
    hosts = parse_hosts("# rack 1\nh1.cluster.local slots=8\nh7.cluster.local\nh3\n", "hosts")
    t = nccl_tests_timings(runs, topo, hosts)
    assert sorted(zip(t.src.tolist(), t.dst.tolist(), strict=True)) == [(2, 14), (5, 21), (14, 2),
                                                                         (21, 5)]


def test_shift_gives_every_pair_the_run_time_and_runs_add_up():
    topo = _torus()
    ranks = [(f"chip{i}", 0) for i in (4, 9, 2, 7)]
    run = parse_nccl_tests(nccl_tests_output(ranks, [(1 << 20, 300.0)]))
    again = parse_nccl_tests(nccl_tests_output(ranks[:2], [(1 << 20, 100.0)]))
    hosts = parse_hosts("".join(f"chip{i}\n" for i in range(25)))
    t = nccl_tests_timings([run, again], topo, hosts)
    got = {(s, d): (b, round(x * 1e6, 6)) for s, d, b, x in
           zip(t.src.tolist(), t.dst.tolist(), t.nbytes.tolist(), t.seconds.tolist(), strict=True)}
    mib = float(1 << 20)
    # 4 -> 9 -> 2 -> 7 -> 4 at the run's time; 4 <-> 9 timed again by the 2-rank run
    assert got == {(4, 9): (2 * mib, 400.0), (9, 2): (mib, 300.0), (2, 7): (mib, 300.0),
                   (7, 4): (mib, 300.0), (9, 4): (mib, 100.0)}


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.lists(st.tuples(st.integers(0, 15), st.integers(0, 7)), min_size=2,
                                   max_size=5, unique=True),
                          st.integers(1, 1 << 30), st.floats(1.0, 1e6)),
                min_size=1, max_size=6))
def test_runs_sum_like_a_brute_force_reference(runs):
    """Random runs written and read back: every pair r -> r+1 of a run, summed over runs,
    with node = order of first appearance of the host."""
    topo = _hgx()
    parsed = [parse_nccl_tests(nccl_tests_output([(f"host{h}", d) for h, d in ranks],
                                                 [(size, usec)]), f"run{k}")
              for k, (ranks, size, usec) in enumerate(runs)]
    t = nccl_tests_timings(parsed, topo)
    node: dict[int, int] = {}
    expect: dict[tuple[int, int], list[float]] = {}
    for ranks, size, usec in runs:
        for h, _ in ranks:
            node.setdefault(h, len(node))
        printed = float(_time(usec))          # what the file holds, rounded as nccl-tests does
        gr = [node[h] * 8 + d for h, d in ranks]
        for r in range(len(gr)):
            acc = expect.setdefault((gr[r], gr[(r + 1) % len(gr)]), [0.0, 0.0])
            acc[0] += size
            acc[1] += printed * 1e-6
    got = {(s, d): [b, x] for s, d, b, x in zip(t.src.tolist(), t.dst.tolist(),
                                                 t.nbytes.tolist(), t.seconds.tolist(),
                                                 strict=True)}
    assert got.keys() == expect.keys()
    for k, (b, x) in expect.items():
        assert got[k][0] == b and got[k][1] == pytest.approx(x, rel=1e-12)


def test_timeout_is_a_hang():
    run = parse_nccl_tests(nccl_tests_output([("a", 0), ("b", 0)], [], failed=True), "t.log")
    assert math.isinf(run.seconds) and run.nbytes == 1 << 24


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def _at(text: str, line_has: str, token: str, nth: int = 0) -> tuple[int, int]:
    """(line, column) of ``token`` on the ``nth`` line containing ``line_has``."""
    hits = [(i, line) for i, line in enumerate(text.splitlines(), 1) if line_has in line]
    lineno, line = hits[nth]
    return lineno, line.index(token) + 1


@pytest.mark.parametrize("case", ["unknown host", "too many hosts", "device", "same gpu",
                                  "not sendrecv", "bad time", "duplicate rank", "no ranks"])
def test_bad_nccl_tests_input_says_where(tmp_path, capsys, case):
    topo_file = "examples/hgx16_leafspine.ccl"
    extra, before = [], []
    text = nccl_tests_output([("h0", 0), ("h1", 0)], [(1 << 20, 50.0)])
    if case == "unknown host":
        extra = ["--hosts", _write(tmp_path, "hosts", "h0\nh2\n")]
        what, at = "host 'h1' is not in", _at(text, "Rank  1", "h1")
    elif case == "too many hosts":
        # 25 hosts fill the torus; a 26th does not fit
        topo_file = "examples/torus5x5.ccl"
        before = [_write(tmp_path, f"r{i}.log", nccl_tests_output(
            [(f"c{i}", 0), (f"c{(i + 1) % 25}", 0)], [(1 << 20, 50.0)])) for i in range(25)]
        text = nccl_tests_output([("c0", 0), ("c25", 0)], [(1 << 20, 50.0)])
        what, at = "host 'c25' is the 26th host seen", _at(text, "Rank  1", "c25")
    elif case == "device":
        text = nccl_tests_output([("h0", 0), ("h1", 8)], [(1 << 20, 50.0)])
        what, at = "node 1, which has no device 8", _at(text, "Rank  1", " 8 [")
        at = (at[0], at[1] + 1)
    elif case == "same gpu":
        text = nccl_tests_output([("h0", 3), ("h0", 3)], [(1 << 20, 50.0)])
        what, at = "both ran on host 'h0' device 3", _at(text, "Rank  1", " 3 [")
        at = (at[0], at[1] + 1)
    elif case == "not sendrecv":
        text = text.replace("sendrecv_perf", "all_reduce_perf")
        what, at = "this is all_reduce_perf output", _at(text, "starting", "all_reduce_perf")
    elif case == "bad time":
        text = text.replace("  50.00  ", "   fast  ", 1)
        what, at = "expected the time in microseconds", _at(text, "fast", "fast")
    elif case == "duplicate rank":
        text = text.replace("Rank  1", "Rank  0")
        what, at = "rank 0 is listed twice", _at(text, "Rank  0", "0 Group", nth=1)
    else:
        text = "\n".join(line for line in text.splitlines() if "Rank" not in line) + "\n"
        what, at = "no '#  Rank R", (1, 1)
    bad = _write(tmp_path, "bad.log", text)
    assert cli.main(["diagnose", *before, bad, "--topology", topo_file, *extra]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:{at[0]}:{at[1]}: error: " in err and what in err, err
    assert "^" in err and "Traceback" not in err


def test_hosts_file_errors(tmp_path, capsys):
    hosts = _write(tmp_path, "hosts", "a.x\nb\na.y\n")
    log = _write(tmp_path, "r.log", nccl_tests_output([("a", 0), ("b", 0)], [(4096, 9.0)]))
    assert cli.main(["diagnose", log, "--topology", "examples/hgx16_leafspine.ccl",
                     "--hosts", hosts]) == 2
    err = capsys.readouterr().err
    assert f"{hosts}:3:1: error: host 'a.y' is listed twice" in err
    # more hosts than the machine has nodes: the first one too many
    hosts = _write(tmp_path, "hosts", "".join(f"  n{i} slots=8\n" for i in range(17)))
    assert cli.main(["diagnose", log, "--topology", "examples/hgx16_leafspine.ccl",
                     "--hosts", hosts]) == 2
    err = capsys.readouterr().err
    assert f"{hosts}:17:3: error: the hosts file lists 17 hosts but 'cluster' has 16 nodes" \
        in err
    # nccl-tests output cannot be mixed with a CSV
    csv = _write(tmp_path, "p.csv", "src,dst,bytes,seconds\n0,1,1,1\n")
    with pytest.raises(TimingsError, match="cannot be combined"):
        read_timings_files([log, csv], _hgx())


def _pair_runs(topo, faults, hosts, noise, seed):
    """Every pair of ranks timed alone by cclc's simulator as a 2-rank sendrecv (both
    directions at once: the run takes as long as the slower one), as nccl-tests logs."""
    size = 1 << 24
    logs = []
    rng = np.random.default_rng(seed)
    for a in range(topo.n_ranks):
        for b in range(a + 1, topo.n_ranks):
            t = probe_timings(topo, faults, noise=noise, bytes_per_pair=size,
                              seed=int(rng.integers(1 << 31)), ranks=(a, b))
            usec = float(t.seconds.max()) * 1e6
            # smaller sizes too, as a real sweep prints them: the reader must take the largest
            rows = [(size // 16, usec / 12), (size // 4, usec / 3.7), (size, usec)]
            if math.isinf(usec):
                rows = []           # a black-holed pair hangs at the first size
            order = [(hosts[a], 0), (hosts[b], 0)] if rng.random() < 0.5 else \
                [(hosts[b], 0), (hosts[a], 0)]
            logs.append(nccl_tests_output(order, rows,
                                          failed=math.isinf(usec)))
    return logs


@pytest.mark.slow
@pytest.mark.parametrize("failed", [False, True])
def test_nccl_tests_measure_diagnose_recompile(tmp_path, capsys, failed):
    src = "examples/torus5x5.ccl"
    topo = _torus()
    a, b = topo.rank_at((3, 1)), topo.rank_at((3, 2))
    slow = topo.link_id(a, b)
    hosts = [f"tpu-{topo.coords(r)[0]}-{topo.coords(r)[1]}" for r in range(topo.n_ranks)]
    logs = _pair_runs(topo, (Fault("link", "(3,1)->(3,2)", (slow,), failed=failed),), hosts,
                      noise=0.05, seed=7)
    paths = [_write(tmp_path, f"sendrecv.{k:03d}.log", text) for k, text in enumerate(logs)]
    # hosts as a scheduler lists them (fully qualified), in rank order
    hostfile = _write(tmp_path, "hosts", "".join(f"{h}.pod1.example\n" for h in hosts))
    fixed = tmp_path / "fixed.ccl"
    rc = cli.main(["diagnose", *paths, "--topology", src, "--hosts", hostfile,
                   "--patch", str(fixed)])
    out = capsys.readouterr().out
    assert rc == 1, out
    assert "600 pairs on 'torus'" in out and "diagnosing as with --pairwise" in out
    # a 2-rank run times both directions at once: the link or its cable, nothing else
    first = out.split("suspect 1: ", 1)[1].split("  confidence")[0]
    assert first in ("link (3,1)->(3,2)", "cable (3,1)--(3,2)"), out
    assert "suspect 2" not in out
    patched = fixed.read_text()
    assert "fault link (3,1) -> (3,2)" in patched or "fault link (3,1) -- (3,2)" in patched

    outdir = tmp_path / "out"
    assert cli.main(["compile", str(fixed), "-o", str(outdir)]) == 0
    schedule = load(outdir / "a2a.schedule.json")
    assert schedule.topology.link_failed[slow]
    assert not np.isin(np.unique(schedule.routes.links), [slow]).any()


def test_nccl_tests_healthy_reports_nothing(tmp_path, capsys):
    topo = _torus()
    hosts = [f"chip{r}" for r in range(topo.n_ranks)]
    logs = _pair_runs(topo, (), hosts, noise=0.05, seed=11)
    paths = [_write(tmp_path, f"r{k}.log", text) for k, text in enumerate(logs)]
    hostfile = _write(tmp_path, "hosts", "\n".join(hosts) + "\n")
    assert cli.main(["diagnose", *paths, "--topology", "examples/torus5x5.ccl",
                     "--hosts", hostfile]) == 0
    assert "no fault found" in capsys.readouterr().out


def test_nccl_tests_on_a_fabric_finds_a_slow_nic(tmp_path, capsys):
    """hgx16: 2-rank runs between the same GPU of two servers (rails 1 and 3), servers named
    in an order unrelated to the topology's, given by --hosts: the half-speed NIC 3 of node 5
    is found, so host and device were placed right."""
    topo = _hgx()
    nic = topo.vertex("node5.nic3")
    links = tuple(np.flatnonzero((topo.link_src == nic) | (topo.link_dst == nic)).tolist())
    rng = np.random.default_rng(3)
    name = [f"gpu-node{k:02d}" for k in rng.permutation(16)]
    paths = []
    for g in (1, 3):
        for i in range(16):
            for j in range(i + 1, 16):
                t = probe_timings(topo, (Fault("nic", "node5.nic3", links),), noise=0.05,
                                  bytes_per_pair=1 << 24, seed=int(rng.integers(1 << 31)),
                                  ranks=(i * 8 + g, j * 8 + g))
                text = nccl_tests_output([(name[i], g), (name[j], g)],
                                         [(1 << 24, float(t.seconds.max()) * 1e6)])
                paths.append(_write(tmp_path, f"r{len(paths):03d}.log", text))
    hostfile = _write(tmp_path, "hosts", "".join(f"{h}\n" for h in name))
    assert cli.main(["diagnose", *paths, "--topology", "examples/hgx16_leafspine.ccl",
                     "--hosts", hostfile]) == 1
    out = capsys.readouterr().out
    report = out.split("suspect 1: ", 1)[1].split("fault statements")[0]
    assert "suspect 2" not in out
    # the NIC, or a part the timings cannot tell from it (its cables, its GPU)
    assert "nic node5.nic3" in report or report.startswith("nic node5.nic3"), out
    assert "30 of the 30 pairs it would slow are slow" in report
