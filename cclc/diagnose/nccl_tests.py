"""Per-pair timings from nccl-tests output: ``sendrecv_perf`` runs, one output file per run.

nccl-tests (NVIDIA's NCCL benchmarks) prints, on its first process, a header with one line per
rank, ``#  Rank  R Group  G Pid  P on HOST device  D [BUS] GPU NAME`` (``Group`` only in newer
versions; ``HOST`` cut at its first ``.``; ``D`` the CUDA device index as that process sees
it), then one result row per size: ``size count type redop root`` and, out-of-place then
in-place, ``time algbw busbw #wrong`` (time in microseconds; newer versions add ``#iters``;
with ``-O 0`` the out-of-place columns are blank). ``#`` lines are comments, as is the
``# Avg bus bandwidth`` footer. ``sendrecv_perf`` has every rank ``r`` of ``n`` send ``size``
bytes to ``r + 1 mod n`` and receive from ``r - 1 mod n`` at once: a *shift*. A 2-rank run
times both directions of one pair together.

Reading (:func:`parse_nccl_tests`): the rank lines, and the time of the largest size (the
first row of that size; the out-of-place time, or the in-place one when out-of-place is not
run). A run that printed ``Test timeout`` or ``Test NCCL failure`` never finished: its pairs
are hangs. Other lines without ``#`` (MPI or NCCL log lines mixed into the output) are skipped.

Mapping (:func:`nccl_tests_timings`): each rank's ``(host, device)`` becomes a topology rank:
node ``i`` is the ``i``-th host of the hosts list (``--hosts FILE``) or, without one, the
``i``-th host to appear across the files in the order given; the device is the GPU's index
within its node. A topology without nodes (a torus) is one host per rank, device 0. Every pair
``r -> r + 1 mod n`` of a run is given the run's time: for ``n > 2`` that is the slowest pair's
time (nccl-tests reports one time per run), so a shift is weaker evidence than 2-rank runs.
The pairs are timed one run at a time (:attr:`Timings.concurrent` is ``False``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from cclc.diagnose.pair_timings import Timings, TimingsError, make_timings
from cclc.errors import Span
from cclc.topology import Topology

__all__ = ["NcclTestsRank", "NcclTestsRun", "is_nccl_tests", "nccl_tests_timings",
           "parse_hosts", "parse_nccl_tests"]

_RANK = re.compile(r"#\s*Rank\s+(?P<rank>\d+)\s+(?:Group\s+(?P<group>\d+)\s+)?Pid\s+\d+\s+on\s+"
                   r"(?P<host>\S+)\s+device\s+(?P<device>\d+)\b")
_TEST = re.compile(r"#\s*Collective test starting:\s*(?P<name>\S+)")
_COLUMNS = re.compile(r"#\s*size\s+count\s+type\s+redop\s+root\b")
_VERSION = re.compile(r"#\s*nccl-tests version\b")
_MAX_BYTES = re.compile(r"#\s*nThread\s.*\bmaxBytes\s+(?P<max>\d+)")
_FAILED = re.compile(r"Test (timeout|NCCL failure)")
_TOKEN = re.compile(r"\S+")

#: the nccl-tests programs whose rows time point-to-point pairs
_PAIR_TESTS = ("sendrecv_perf", "sendrecv_perf_mpi")


@dataclass(frozen=True, slots=True)
class NcclTestsRank:
    """One ``#  Rank`` line: nccl-tests rank ``rank`` ran on ``host``, CUDA device ``device``;
    the spans point at the host and the device in the file."""

    rank: int
    host: str
    device: int
    host_span: Span
    device_span: Span


@dataclass(frozen=True, slots=True)
class NcclTestsRun:
    """One nccl-tests output file: its ranks (in rank order), and each rank sent ``nbytes`` to
    the next in ``seconds`` (``inf``: the run never finished)."""

    source: str
    test: str | None
    ranks: tuple[NcclTestsRank, ...]
    nbytes: float
    seconds: float


def is_nccl_tests(text: str) -> bool:
    """Whether ``text`` looks like nccl-tests output (a rank line, its column header, or its
    version/test-name lines)."""
    for line in text.splitlines():
        s = line.lstrip()
        if s.startswith("#") and (_RANK.match(s) or _TEST.match(s) or _COLUMNS.match(s)
                                  or _VERSION.match(s)):
            return True
    return False


def _tokens(line: str):
    """Whitespace-separated tokens with their 1-based columns."""
    return [(m.group(), m.start() + 1) for m in _TOKEN.finditer(line)]


@dataclass
class _Reading:
    """What :func:`parse_nccl_tests` has read so far (one file, line by line)."""

    source: str
    test: str | None = None
    ranks: dict[int, NcclTestsRank] = field(default_factory=dict)
    best: tuple[int, float] | None = None      # (size, microseconds) of the largest size
    max_bytes: int | None = None
    failed: bool = False


def parse_nccl_tests(text: str, source: str = "<nccl-tests>") -> NcclTestsRun:
    """Read one nccl-tests output file (see the module docstring)."""
    r = _Reading(source)
    for lineno, line in enumerate(text.splitlines(), 1):
        stripped = line.lstrip()
        if stripped.startswith("#"):
            _comment_line(r, stripped, len(line) - len(stripped), lineno)
        elif _FAILED.search(line):
            r.failed = True
        else:
            row = _result_row(line, lineno, source)
            if row is not None and (r.best is None or row[0] > r.best[0]):
                r.best = row
    order = _rank_order(r)
    ranks = tuple(r.ranks[k] for k in order)
    if r.failed:
        nbytes = r.max_bytes or (r.best[0] if r.best else None)
        if not nbytes:
            raise TimingsError("the run failed before any result row and its '# nThread ... "
                               "maxBytes N' line is missing: its size is unknown",
                               Span(source, 1, 1))
        return NcclTestsRun(source, r.test, ranks, float(nbytes), math.inf)
    if r.best is None or r.best[0] <= 0:
        raise TimingsError("no result rows with a size > 0 (did the run stop early? a "
                           "'Test timeout' or 'Test NCCL failure' line would make it a hang)",
                           Span(source, 1, 1))
    return NcclTestsRun(source, r.test, ranks, float(r.best[0]), r.best[1] * 1e-6)


def _comment_line(r: _Reading, stripped: str, indent: int, lineno: int) -> None:
    """A ``#`` line: the test's name, a rank line, or the ``maxBytes`` line (others are
    skipped)."""
    source = r.source
    if m := _TEST.match(stripped):
        r.test = m["name"]
        if r.test not in _PAIR_TESTS:
            col = indent + m.start("name") + 1
            raise TimingsError(
                f"this is {r.test} output: only sendrecv_perf times pairs (run it on 2 "
                "ranks per pair, or on n ranks as a shift r -> r+1)",
                Span(source, lineno, col, lineno, col + len(r.test)))
    elif m := _RANK.match(stripped):
        ranks_line = _rank_line(m, indent, lineno, source)
        if m["group"] not in (None, "0"):
            col = indent + m.start("group") + 1
            raise TimingsError("split communicators (Group > 0) are not supported: "
                               "run sendrecv_perf without NCCL_TESTS_SPLIT_MASK",
                               Span(source, lineno, col))
        if ranks_line.rank in r.ranks:
            col = indent + m.start("rank") + 1
            raise TimingsError(
                f"rank {ranks_line.rank} is listed twice: give one nccl-tests run per "
                "file (and build nccl-tests with MPI=1 when launching with mpirun, or "
                "every process is its own rank 0)", Span(source, lineno, col))
        r.ranks[ranks_line.rank] = ranks_line
    elif m := _MAX_BYTES.match(stripped):
        r.max_bytes = int(m["max"])


def _result_row(line: str, lineno: int, source: str) -> tuple[int, float] | None:
    """``(size, microseconds)`` of a result row; ``None`` for a log line mixed into the
    output."""
    toks = _tokens(line)
    if not toks or not toks[0][0].isdigit():
        return None
    if len(toks) < 6:
        raise TimingsError(f"a result row needs at least 6 columns (size count type redop "
                           f"root time ...), this one has {len(toks)}",
                           Span(source, lineno, toks[0][1], lineno, len(line) + 1))
    time_tok, time_col = toks[5]
    try:
        usec = float(time_tok)
    except ValueError:
        usec = math.nan
    if not (usec > 0 and math.isfinite(usec)):
        raise TimingsError(f"expected the time in microseconds (a number > 0) in column 6, "
                           f"got '{time_tok}'",
                           Span(source, lineno, time_col, lineno, time_col + len(time_tok)))
    return int(toks[0][0]), usec


def _rank_order(r: _Reading) -> list[int]:
    """The ranks read, 0..n-1 with n >= 2."""
    source = r.source
    if not r.ranks:
        raise TimingsError("no '#  Rank R ... on HOST device D' lines: nccl-tests prints them "
                           "before its results (keep the whole output of the run)",
                           Span(source, 1, 1))
    order = sorted(r.ranks)
    if order != list(range(len(order))):
        missing = next(k for k in range(len(order) + 1) if k not in r.ranks)
        raise TimingsError(f"the rank lines name ranks {order[0]}..{order[-1]} but rank "
                           f"{missing} is missing: a run's ranks are 0..n-1", Span(source, 1, 1))
    if len(order) < 2:
        raise TimingsError("a run of 1 rank times no pair: run sendrecv_perf on 2 ranks (or "
                           "more, as a shift)", r.ranks[0].host_span)
    return order


def _rank_line(m: re.Match, indent: int, lineno: int, source: str) -> NcclTestsRank:
    hc = indent + m.start("host") + 1
    dc = indent + m.start("device") + 1
    return NcclTestsRank(rank=int(m["rank"]), host=m["host"], device=int(m["device"]),
                         host_span=Span(source, lineno, hc, lineno, hc + len(m["host"])),
                         device_span=Span(source, lineno, dc, lineno, dc + len(m["device"])))


def parse_hosts(text: str, source: str = "<hosts>") -> dict[str, Span]:
    """A hosts list: one host per line (the first word, so MPI hostfiles with ``slots=N``
    work; ``#`` comments and blank lines skipped), the ``i``-th host being node ``i``. Names
    are cut at the first ``.`` as nccl-tests prints them. Returns host -> where it is listed,
    in node order."""
    nodes: dict[str, Span] = {}
    first: dict[str, tuple[str, int]] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        body = line.split("#", 1)[0]
        toks = _tokens(body)
        if not toks:
            continue
        name, col = toks[0]
        short = name.split(".", 1)[0]
        if short in nodes:
            was, at = first[short]
            raise TimingsError(f"host '{name}' is listed twice (line {at}: '{was}'; nccl-tests "
                               "cuts host names at the first '.')",
                               Span(source, lineno, col, lineno, col + len(name)))
        nodes[short] = Span(source, lineno, col, lineno, col + len(name))
        first[short] = (name, lineno)
    if not nodes:
        raise TimingsError("the hosts file lists no host", Span(source, 1, 1))
    return nodes


def _rank_table(topo: Topology) -> tuple[int, dict[tuple[int, int], int], str]:
    """Nodes of ``topo``, (node, device) -> rank, and how its nodes look (for messages)."""
    if topo.node_of_rank is None or topo.gpu_of_rank is None:
        return (topo.n_ranks, {(r, 0): r for r in range(topo.n_ranks)},
                f"'{topo.name}' has no nodes: each of its {topo.n_ranks} ranks is a host with "
                "device 0")
    table = {(int(n), int(g)): r for r, (n, g) in
             enumerate(zip(topo.node_of_rank.tolist(), topo.gpu_of_rank.tolist(), strict=True))}
    gpus = int(topo.gpu_of_rank.max()) + 1
    return (topo.n_nodes, table, f"'{topo.name}' has {topo.n_nodes} nodes of {gpus} GPUs "
            f"(devices 0..{gpus - 1})")


def nccl_tests_timings(runs: list[NcclTestsRun], topo: Topology,
                       hosts: dict[str, Span] | None = None) -> Timings:
    """The pairs of ``runs`` (see the module docstring) as :class:`Timings` of ``topo``'s
    ranks, nodes in the order of ``hosts`` (:func:`parse_hosts`) or of first appearance;
    :class:`TimingsError` at the rank line (or hosts line) that does not fit the topology."""
    n_nodes, table, shape = _rank_table(topo)
    hosts_source = "the hosts file"
    if hosts is not None:
        spans = list(hosts.values())
        hosts_source = spans[0].file
        if len(spans) > n_nodes:
            raise TimingsError(f"the hosts file lists {len(spans)} hosts but {shape}: this "
                               f"one would be node {n_nodes}", spans[n_nodes])
    node_of = {h: i for i, h in enumerate(hosts)} if hosts is not None else {}
    src, dst, nbytes, seconds = [], [], [], []
    for run in runs:
        topo_ranks = []
        seen: dict[int, NcclTestsRank] = {}
        for rl in run.ranks:
            node = node_of.get(rl.host)
            if node is None:
                if hosts is not None:
                    raise TimingsError(f"host '{rl.host}' is not in {hosts_source} "
                                       f"({len(hosts)} hosts)", rl.host_span)
                if len(node_of) >= n_nodes:
                    raise TimingsError(f"host '{rl.host}' is the {len(node_of) + 1}th host "
                                       f"seen in the files, but {shape} (give the node order "
                                       "with --hosts FILE)", rl.host_span)
                node = node_of[rl.host] = len(node_of)
            rank = table.get((node, rl.device))
            if rank is None:
                raise TimingsError(f"host '{rl.host}' is node {node}, which has no device "
                                   f"{rl.device}: {shape}", rl.device_span)
            if rank in seen:
                raise TimingsError(
                    f"ranks {seen[rank].rank} and {rl.rank} both ran on host '{rl.host}' "
                    f"device {rl.device}: nccl-tests prints the device index as each process "
                    "sees it (with CUDA_VISIBLE_DEVICES set per process every GPU is device 0)",
                    rl.device_span)
            seen[rank] = rl
            topo_ranks.append(rank)
        n = len(topo_ranks)
        for r in range(n):
            # the shift of sendrecv_perf: rank r sends to r + 1 mod n
            src.append(topo_ranks[r])
            dst.append(topo_ranks[(r + 1) % n])
            nbytes.append(run.nbytes)
            seconds.append(run.seconds)
    if not runs:
        raise TimingsError("no nccl-tests runs to read")
    source = runs[0].source + (f" (+{len(runs) - 1} more)" if len(runs) > 1 else "")
    return make_timings(src, dst, nbytes, seconds, source, concurrent=False)
