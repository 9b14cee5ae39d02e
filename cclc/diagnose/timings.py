"""Per-pair timings: what was measured, read from the formats people have.

Formats (``read_timings`` picks one from the content):

* **pairs CSV** — a header ``src,dst,bytes,seconds`` then one row per measured transfer; ranks
  are rank ids. A pair may appear many times (several calls): its bytes and seconds are summed.
  ``seconds`` written as ``inf`` (or left empty) means the transfer never finished (a hang).
* **matrix CSV** — ``n`` rows of ``n`` numbers: row ``i``, column ``j`` is the time of ``i -> j``
  in seconds (the diagonal is ignored; ``inf`` or empty is a hang). Every pair is taken to move
  the same number of bytes, which only the ratios between pairs need.
* **JSON** — ``{"format": "cclc-peer-timings", "version": 1, "records": [...]}`` with records
  ``{"rank": R, "peer": P, "dir": "send" | "recv", "bytes": B, "seconds": S}``: rank ``R``'s
  send to (or receive from) ``P`` (extra fields, e.g. ``coll`` and ``ops``, are ignored). A
  send of ``R`` to ``P`` and a receive of ``P`` from ``R`` time the same pair ``R -> P``; per
  pair the slower side is kept (the transfer lasts until both ends are done). cclc's NCCL
  plugin writes one such file per rank (``CCLC_PEER_TIMINGS``); pass them all at once.
* **nccl-tests output** — ``sendrecv_perf`` runs, one file per run: read by
  :mod:`cclc.diagnose.nccl_tests`, which needs the topology to place each rank's host and
  device (:func:`read_timings_files` with ``topo``).
"""

from __future__ import annotations

import csv
import io
import json
import math

import numpy as np

from cclc.diagnose import nccl_tests
from cclc.diagnose.pair_timings import Timings, TimingsError, make_timings
from cclc.errors import Span

__all__ = ["parse_timings", "read_text", "read_timings", "read_timings_files", "to_pairs_csv"]


#: what a timings file may hold, for the error on a file that is not text
_EXPECTED = ("timings as text: a src,dst,bytes,seconds CSV, an n x n matrix CSV, cclc-peer-timings "
             "JSON or nccl-tests output")


def read_text(path: str, expected: str = _EXPECTED) -> str:
    """The text of ``path``; a file that is not UTF-8 text (a binary file, a file in another
    encoding) is a :class:`TimingsError` naming the file, the first bad byte and ``expected``."""
    with open(path, "rb") as f:
        data = f.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        col = err.start - (data.rfind(b"\n", 0, err.start) + 1) + 1
        raise TimingsError(f"not a text file (byte {err.start} is 0x{data[err.start]:02x}, not "
                           f"UTF-8): expected {expected}", Span(path, line, col)) from None


def read_timings(path: str) -> Timings:
    """Read a timings file in any of the module's formats; :class:`TimingsError` says where a
    file goes wrong."""
    return parse_timings(read_text(path), path)


def parse_timings(text: str, source: str = "<timings>") -> Timings:
    """Parse timings ``text`` (pairs CSV, matrix CSV or JSON, told apart by their content)."""
    stripped = text.lstrip()
    if not stripped:
        raise TimingsError("the timings file is empty", Span(source, 1, 1))
    if stripped.startswith("{"):
        return _parse_json(text, source)
    if nccl_tests.is_nccl_tests(text):
        raise TimingsError("this is nccl-tests output: reading it needs the topology "
                           "(read_timings_files with topo)", Span(source, 1, 1))
    first = next(line for line in text.splitlines() if line.strip() and
                 not line.lstrip().startswith("#"))
    if first.replace(" ", "").lower().startswith("src,dst"):
        return _parse_pairs(text, source)
    return _parse_matrix(text, source)


def _number(cell: str, what: str, span: Span, hang_ok: bool = False) -> float:
    cell = cell.strip()
    if hang_ok and cell.lower() in ("", "inf", "hang", "timeout"):
        return math.inf
    try:
        x = float(cell)
    except ValueError:
        raise TimingsError(f"expected a number for {what}, got '{cell}'", span) from None
    if math.isnan(x) or x < 0 or (math.isinf(x) and not hang_ok):
        raise TimingsError(f"{what} must be a number >= 0, got '{cell}'", span)
    if hang_ok and x == 0:
        # every transfer takes time: a zero is a clock that did not run or a pair not measured
        raise TimingsError(f"{what} must be > 0, got '{cell}' (a transfer that never "
                           "finished is 'inf'; leave out a pair that was not measured)", span)
    return x


def _cells(line: str, lineno: int, source: str):
    """The comma-separated cells of a line with the span of each."""
    col = 1
    for cell in line.split(","):
        yield cell, Span(source, lineno, col, lineno, col + max(1, len(cell)))
        col += len(cell) + 1


def _parse_pairs(text: str, source: str) -> Timings:
    rows = []
    header_seen = False
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if not header_seen:
            names = [c.strip().lower() for c in line.split(",")]
            if names[:4] != ["src", "dst", "bytes", "seconds"]:
                raise TimingsError("expected the header 'src,dst,bytes,seconds'",
                                   Span(source, lineno, 1, lineno, len(line) + 1))
            header_seen = True
            continue
        cells = list(_cells(line, lineno, source))
        if len(cells) != 4:
            raise TimingsError(f"expected 4 cells (src,dst,bytes,seconds), got {len(cells)}",
                               Span(source, lineno, 1, lineno, len(line) + 1))
        (s, ss), (d, ds), (b, bs), (t, ts) = cells
        src = _rank(s, ss)
        dst = _rank(d, ds)
        nbytes = _number(b, "bytes", bs)
        if nbytes <= 0:
            raise TimingsError(f"bytes must be > 0, got '{b.strip()}'", bs)
        rows.append((src, dst, nbytes, _number(t, "seconds", ts, hang_ok=True)))
    if not rows:
        raise TimingsError("the timings file has a header but no rows", Span(source, 1, 1))
    src_col, dst_col, bytes_col, seconds_col = zip(*rows, strict=True)
    return make_timings(src_col, dst_col, bytes_col, seconds_col, source)


def _rank(cell: str, span: Span) -> int:
    cell = cell.strip()
    if not cell.isdigit():
        raise TimingsError(f"expected a rank id (an integer >= 0), got '{cell}'", span)
    return int(cell)


def _parse_matrix(text: str, source: str) -> Timings:
    rows: list[tuple[int, list[tuple[str, Span]]]] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if line.strip() and not line.lstrip().startswith("#"):
            rows.append((lineno, list(_cells(line, lineno, source))))
    n = len(rows)
    src, dst, secs = [], [], []
    for i, (lineno, cells) in enumerate(rows):
        if len(cells) != n:
            raise TimingsError(f"a matrix of {n} rows needs {n} numbers per row, this row has "
                               f"{len(cells)} (or use the header 'src,dst,bytes,seconds')",
                               Span(source, lineno, 1, lineno, len(text.splitlines()[lineno - 1])
                                    + 1))
        for j, (cell, span) in enumerate(cells):
            if i != j:
                src.append(i)
                dst.append(j)
                secs.append(_number(cell, f"the time of {i} -> {j}", span, hang_ok=True))
    if n < 2:
        raise TimingsError("a timings matrix needs at least 2 ranks", Span(source, 1, 1))
    return make_timings(src, dst, np.ones(len(src)), secs, source)


def _json_records(text: str, source: str) -> list:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        raise TimingsError(f"not valid JSON: {err.msg}",
                           Span(source, err.lineno, err.colno)) from None
    except ValueError:
        # the one other ValueError of json.loads: Python's limit on the digits of an integer
        raise TimingsError("a number too large to be read (an integer of more than 4300 "
                           "digits)", Span(source, 1, 1)) from None
    except RecursionError:
        raise TimingsError("lists or objects nested too deeply", Span(source, 1, 1)) from None
    if not isinstance(doc, dict) or doc.get("format") != "cclc-peer-timings":
        raise TimingsError("expected a JSON object with \"format\": \"cclc-peer-timings\"",
                           Span(source, 1, 1))
    if doc.get("version") != 1:
        raise TimingsError(f"unsupported cclc-peer-timings version {doc.get('version')!r} "
                           "(this cclc reads version 1)", Span(source, 1, 1))
    records = doc.get("records")
    if not isinstance(records, list):
        raise TimingsError("\"records\" must be a list", Span(source, 1, 1))
    return [(source, k, r) for k, r in enumerate(records)]


def _parse_json(text: str, source: str) -> Timings:
    return _aggregate(_json_records(text, source), source)


def _aggregate(records: list, source: str) -> Timings:
    """Per pair: both sides' records summed, and the slower side kept."""
    sides: dict[tuple[int, int, str], list[float]] = {}
    for where_file, k, r in records:
        where = f"record {k}"
        span = Span(where_file, 1, 1)
        if not isinstance(r, dict):
            raise TimingsError(f"{where} is not an object", span)
        try:
            rank, peer = int(r["rank"]), int(r["peer"])
            direction = r["dir"]
            nbytes = float(r["bytes"])
            seconds = float(r["seconds"]) if r["seconds"] is not None else math.inf
        except (KeyError, TypeError, ValueError) as err:
            raise TimingsError(f"{where} needs integer rank and peer, dir, bytes and seconds "
                               f"({err})", span) from None
        if direction not in ("send", "recv") or rank < 0 or peer < 0 or nbytes <= 0 \
                or not seconds > 0:
            raise TimingsError(f"{where} is out of range: {json.dumps(r)}", span)
        pair = (rank, peer) if direction == "send" else (peer, rank)
        acc = sides.setdefault((*pair, direction), [0.0, 0.0])
        acc[0] += nbytes
        acc[1] += seconds
    if not sides:
        raise TimingsError("the timings file has no records", Span(source, 1, 1))
    best: dict[tuple[int, int], tuple[float, float]] = {}
    for (s, d, _), (b, t) in sides.items():
        old = best.get((s, d))
        if old is None or t / b > old[1] / old[0]:
            best[(s, d)] = (b, t)
    keys = sorted(best)
    return make_timings([k[0] for k in keys], [k[1] for k in keys],
                        [best[k][0] for k in keys], [best[k][1] for k in keys], source)


def read_timings_files(paths: list[str], topo=None, hosts: str | None = None) -> Timings:
    """Read and combine several timings files: the per-rank JSON files the plugin writes are
    joined record by record (so a pair's send and receive sides meet); CSV files add up;
    nccl-tests output files (one run each) are placed on ``topo`` (a
    :class:`cclc.topology.Topology`), their hosts in the order of the ``hosts`` file if given
    (see :mod:`cclc.diagnose.nccl_tests`)."""
    texts = [read_text(path) for path in paths]
    is_nt = [nccl_tests.is_nccl_tests(t) for t in texts]
    if any(is_nt):
        if not all(is_nt):
            other = paths[is_nt.index(False)]
            raise TimingsError(f"nccl-tests output ({paths[is_nt.index(True)]}) cannot be "
                               "combined with timings in another format", Span(other, 1, 1))
        if topo is None:
            raise TimingsError("nccl-tests output needs the topology to place its hosts",
                               Span(paths[0], 1, 1))
        node_of = None
        if hosts is not None:
            node_of = nccl_tests.parse_hosts(
                read_text(hosts, "a hosts file: one host name per line"), hosts)
        runs = [nccl_tests.parse_nccl_tests(t, p) for p, t in zip(paths, texts, strict=True)]
        return nccl_tests.nccl_tests_timings(runs, topo, node_of)
    if hosts is not None:
        raise TimingsError("--hosts is for nccl-tests output; these timings name ranks",
                           Span(hosts, 1, 1))
    if len(paths) == 1:
        return parse_timings(texts[0], paths[0])
    source = f"{paths[0]} (+{len(paths) - 1} more)"
    if all(t.lstrip().startswith("{") for t in texts):
        records = [rec for path, text in zip(paths, texts, strict=True)
                   for rec in _json_records(text, path)]
        return _aggregate(records, source)
    parts = [parse_timings(text, path) for path, text in zip(paths, texts, strict=True)]
    return make_timings(np.concatenate([p.src for p in parts]),
                        np.concatenate([p.dst for p in parts]),
                        np.concatenate([p.nbytes for p in parts]),
                        np.concatenate([p.seconds for p in parts]), source)


def to_pairs_csv(t: Timings) -> str:
    """``t`` in the pairs CSV format (``inf`` for hangs)."""
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(["src", "dst", "bytes", "seconds"])
    for s, d, b, x in zip(t.src.tolist(), t.dst.tolist(), t.nbytes.tolist(), t.seconds.tolist(),
                          strict=True):
        w.writerow([s, d, int(b), "inf" if not math.isfinite(x) else repr(x)])
    return out.getvalue()
