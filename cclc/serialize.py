"""The public schedule document: ``{"format": "cclc-schedule", "version": 1, ...}``.

One JSON object holds everything needed to verify, simulate or emit a schedule without the
``.ccl`` source: the resolved topology, the collective, the chunk layouts, the route table and
the ops as columns (an object of equal-length integer arrays). docs/schedule-format.md
documents every key. Floats are written with Python's shortest round-trip ``repr``, so
``from_json(to_json(s))`` reproduces every array bit for bit.

Reading checks the document's shape and raises :class:`ScheduleError` that says which key is
wrong; whether the schedule is *correct* is :func:`cclc.verify.verify`'s job.

A schedule stored by symmetry (:class:`~cclc.symmetric.SymmetricSchedule`) is the same document
of its representative ops with one more key, ``"symmetry"`` (the group); :func:`from_json`
refuses it (its ops are not the whole schedule) and :func:`symmetric_from_json` reads it.
"""

from __future__ import annotations

import collections
import functools
import json
import os
import uuid
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from enum import Enum
from typing import Any, Literal, TypeVar

import numpy as np

from cclc.collective import CollectiveKind, DType, Hint, ReduceOp, make_collective
from cclc.errors import CclError, ScheduleError, Span
from cclc.ir import OP_COLUMNS, Buf, OpKind, Ops, Routes, Schedule
from cclc.outdir import write_file
from cclc.routing import FABRIC_ROUTINGS, TORUS_ROUTINGS
from cclc.symmetric import ExceptedSchedule, SymmetricSchedule, TranslationGroup, healthy_collective
from cclc.topology import LinkKind, Topology
from cclc.units import MAX_BANDWIDTH, MAX_LATENCY, MIN_BANDWIDTH

__all__ = ["EXCEPTIONS_KEY", "FORMAT", "SYMMETRY_KEY", "VERSION", "document_pieces", "dumps",
           "from_json", "int_array_json", "load", "read_document", "save",
           "symmetric_document_pieces", "symmetric_from_json", "to_json", "topology_document",
           "topology_to_json"]

FORMAT = "cclc-schedule"
VERSION = 1
#: the key of a document stored by symmetry: ``{"group": "translations", "shape": [...]}``
SYMMETRY_KEY = "symmetry"
#: the key, inside :data:`SYMMETRY_KEY`, of the exceptions for failed links
EXCEPTIONS_KEY = "exceptions"
_STORED_BY_SYMMETRY = (f"a schedule stored by symmetry ('{SYMMETRY_KEY}'): its ops are one "
                       "representative per orbit, not the whole schedule; read it with "
                       "read_document (cclc.symmetric_plan.expand_form expands it)")

_E = TypeVar("_E", bound=Enum)
#: the kinds of topology a document may name, as the :class:`Topology` field spells them
_TOPOLOGY_KINDS: dict[str, Literal["torus", "fabric", "node"]] = {
    "torus": "torus", "fabric": "fabric", "node": "node"}

_BUF_KEYS = {Buf.INPUT: "input", Buf.OUTPUT: "output", Buf.SCRATCH: "scratch"}
_LINK_KIND_NAMES = {k: k.name.lower() for k in LinkKind}
_LINK_KIND_BY_NAME = {v: k for k, v in _LINK_KIND_NAMES.items()}
#: legal values of the enum-coded op columns
_OP_ENUMS = {"kind": (OpKind, "0 (copy) or 1 (reduce)"),
             "src_buf": (Buf, "0 (input), 1 (output) or 2 (scratch)"),
             "dst_buf": (Buf, "0 (input), 1 (output) or 2 (scratch)")}


# -- writing ---------------------------------------------------------------------------------

def _opt(a: np.ndarray | None) -> list | None:
    return None if a is None else a.tolist()


def topology_to_json(t: Topology) -> dict[str, Any]:
    """The ``topology`` object of a schedule document (also the body of a topology file)."""
    return {
        "name": t.name,
        "kind": t.kind,
        "n_ranks": t.n_ranks,
        "vertex_names": list(t.vertex_names),
        "links": {
            "src": t.link_src.tolist(),
            "dst": t.link_dst.tolist(),
            "bandwidth": t.link_bandwidth.tolist(),
            "latency": t.link_latency.tolist(),
            "kind": [_LINK_KIND_NAMES[LinkKind(k)] for k in t.link_kind.tolist()],
            "failed": t.link_failed.tolist(),
        },
        "failed_ranks": sorted(t.failed_ranks),
        "dims": None if t.dims is None else list(t.dims),
        "wrap": None if t.wrap is None else list(t.wrap),
        "routing": t.routing,
        "n_nodes": t.n_nodes,
        "node_of_rank": _opt(t.node_of_rank),
        "gpu_of_rank": _opt(t.gpu_of_rank),
        "rail_of_rank": _opt(t.rail_of_rank),
        "fault_groups": [{"name": name, "links": list(links)} for name, links in t.fault_groups],
        # written only when set, so documents of machines without it stay as they were
        **({"multicast": True} if t.multicast else {}),
    }


def _hint_json(h: Hint) -> dict[str, Any]:
    return {"name": h.name, "params": {k: v for k, v in h.params}}


def _span_json(span: Span | None) -> dict[str, Any] | None:
    if span is None:
        return None
    return {"file": span.file, "line": span.line, "col": span.col, "end_line": span.end_line,
            "end_col": span.end_col}


def topology_document(t: Topology) -> dict[str, Any]:
    """The document of a ``topology-<name>.json`` file: the schedule document's topology
    encoder, so both files describe a machine alike."""
    return {"format": "cclc-topology", "version": 1, "topology": topology_to_json(t)}


def to_json(s: Schedule) -> dict[str, Any]:
    """The schedule as a JSON-ready dict (plain lists, ints, floats, strings)."""
    return _document(s, lambda a: a.tolist())


def _document(s: Schedule, array: Callable[[np.ndarray], Any]) -> dict[str, Any]:
    """The document, with the large integer arrays (layouts, routes, op columns) given by
    ``array``."""
    c = s.collective
    return {
        "format": FORMAT,
        "version": VERSION,
        "algorithm": s.algorithm,
        "schedule": s.schedule,
        "params": {k: v for k, v in s.params},
        "topology": topology_to_json(c.topology),
        "collective": {
            "name": c.name,
            "kind": c.kind.value,
            "group": list(c.group),
            "size": c.size,
            "dtype": c.dtype.value,
            "op": c.op.value,
            "root": c.root,
            "algorithm": _hint_json(c.algorithm),
            "schedule": _hint_json(c.schedule),
            "pair_sizes": _opt(c.pair_sizes),
            "span": _span_json(c.span),
        },
        "layouts": {_BUF_KEYS[b]: array(s.layouts[b]) for b in Buf},
        "routes": {"offsets": array(s.routes.offsets), "links": array(s.routes.links)},
        "ops": {k: array(v) for k, v in s.ops.columns().items()},
    }


#: integers formatted per batch (bounds the temporaries of a 16M-op column)
_INT_BATCH = 1 << 20
_DIGIT, _MINUS, _COMMA = ord("0"), ord("-"), ord(",")
#: the four ASCII digits of 0..9999 with leading zeros, each as one 32-bit word (bytes in
#: memory order, so a row of words viewed as bytes reads left to right)
_QUADS = np.frombuffer(b"".join(b"%04d" % i for i in range(10_000)), dtype=np.uint32)


def int_array_json(a: np.ndarray) -> bytes:
    """``json.dumps(a.tolist(), separators=(",", ":"))`` of an integer array of one or two
    dimensions, as ASCII bytes, formatted by numpy: every digit position of every number at
    once, instead of one Python int at a time (20-30x faster on million-entry columns)."""
    a = np.asarray(a)
    if a.ndim == 2:
        return b"[" + b",".join(int_array_json(row) for row in a) + b"]"
    if a.ndim != 1 or a.dtype.kind not in "iub":
        raise ValueError(f"int_array_json takes 1-D or 2-D integer arrays, not {a.dtype} "
                         f"with {a.ndim} dimensions")
    if a.dtype.kind == "b":
        return json.dumps(a.tolist(), separators=(",", ":")).encode()
    if not len(a):
        return b"[]"
    return b"".join(_batch_json(a, lo) for lo in range(0, len(a), _INT_BATCH))


def _int_digits(a: np.ndarray) -> bytes:
    """The numbers of ``a`` (non-empty) in decimal, separated by commas.

    A matrix with one row per number, ``[digits in groups of four, comma]``: each group of
    four is a 32-bit word looked up in :data:`_QUADS` (one division per four digits, where a
    digit at a time took one per digit, written a byte column at a time), with a minus sign
    over the leading zero before a negative number's first digit; then read out through the
    mask of the characters that exist, row by row."""
    low, top = int(a.min()), int(a.max())
    if 0 <= low and top < 10:
        # one digit each (op kinds, buffers): digits and commas interleaved
        out = np.full(2 * len(a) - 1, _COMMA, dtype=np.uint8)
        out[::2] = a.astype(np.uint8) + _DIGIT
        return out.tobytes()
    # the numbers being cut into digits, in an unsigned or narrow type (see below)
    work: np.ndarray[Any, np.dtype[Any]]
    if low >= 0:
        neg = None
        # division is cheapest in the narrowest type that holds the numbers
        work = a.astype(np.int32 if top < 2 ** 31 else np.uint64)
    else:
        wide = a.astype(np.int64)
        neg = wide < 0
        # the magnitude of the most negative int64 only fits unsigned: negate there
        work = np.where(neg, (-(wide + 1)).astype(np.uint64) + np.uint64(1),
                        wide.astype(np.uint64))
        top = max(top, -low)
    width = len(str(top))
    n_dig = np.ones(len(a), dtype=np.int8)     # (int8: a quarter of the bytes to compare)
    power = 10
    while power <= top:
        n_dig += work >= power
        power *= 10
    # groups of four digits, most significant first, with room for a minus sign
    quads = -(-(width + (neg is not None)) // 4)
    words = np.empty((len(a), quads + 1), dtype=np.uint32)
    words[:, quads] = _COMMA
    ten_k: Any = work.dtype.type(10_000)
    for col in range(quads - 1, 0, -1):
        q = work // ten_k                       # (% is several times slower than //)
        words[:, col] = _QUADS[work - q * ten_k]
        work = q
    words[:, 0] = _QUADS[work]
    chars = words.view(np.uint8).reshape(len(a), 4 * quads + 4)
    first = np.int8(4 * quads) - n_dig         # the column of every number's first character
    if neg is not None:
        first -= neg
        chars[np.flatnonzero(neg), first[neg]] = _MINUS
    # each row's mask looked up whole (a broadcast comparison built it 2.5x slower)
    keep = _row_masks(quads)[first].view(np.bool_).reshape(chars.shape)
    return chars[keep][:-1].tobytes()           # no separator after the last number


@functools.cache
def _row_masks(quads: int) -> np.ndarray:
    """Per column of a number's first character (``0..4 quads``), the mask of the characters
    :func:`_int_digits` keeps of a row of ``quads`` digit words and a comma word (from that
    column to the comma, not the comma word's padding), each row one opaque item."""
    cols = np.arange(4 * quads + 4)
    masks = (cols >= np.arange(4 * quads + 1)[:, None]) & (cols <= 4 * quads)
    rows = np.ascontiguousarray(masks).view(np.dtype((np.void, len(cols)))).reshape(-1)
    rows.setflags(write=False)                  # (kept: nobody may change it)
    return rows


def document_pieces(s: Schedule) -> Iterator[bytes]:
    """The compact JSON document of ``s`` in pieces, byte for byte what
    ``json.dumps(to_json(s), separators=(",", ":"), allow_nan=False)`` gives: the large
    integer arrays by :func:`int_array_json`, the rest by :mod:`json`."""
    return _pieces(s, None)


def _representatives(s: SymmetricSchedule) -> Schedule:
    """The representative ops of ``s`` held as a :class:`Schedule` (for writing only: they
    are not the whole schedule)."""
    return Schedule(collective=s.collective, layouts=s.layouts, ops=s.ops, routes=s.routes,
                    algorithm=s.algorithm, schedule=s.schedule, params=s.params)


def symmetric_document_pieces(s: SymmetricSchedule | ExceptedSchedule) -> Iterator[bytes]:
    """The compact JSON document of a schedule stored by symmetry, in pieces: the document of
    its representative ops (:func:`document_pieces`) with the key :data:`SYMMETRY_KEY`; a
    schedule with exceptions for failed links names the faulty machine, and its key holds
    ``"exceptions"`` (:data:`EXCEPTIONS_KEY`: journeys, masked journeys, the tail)."""
    if isinstance(s, ExceptedSchedule):
        x = s
        reps = replace(_representatives(x.base), collective=x.collective)

        def exceptions(array: Callable[[np.ndarray], Any]) -> dict[str, Any]:
            return {"group": "translations", "shape": list(x.group.shape),
                    EXCEPTIONS_KEY: {
                        "journey": array(x.journey),
                        "masked_element": array(x.masked_element),
                        "masked_journey": array(x.masked_journey),
                        "tail_scratch_from": x.tail_scratch_from,
                        "interleaved": x.interleaved,
                        "tail": {"routes": {"offsets": array(x.tail_routes.offsets),
                                            "links": array(x.tail_routes.links)},
                                 "ops": {k: array(v) for k, v in x.tail.columns().items()}}}}
        return _pieces(reps, exceptions)
    return _pieces(_representatives(s), lambda array: {"group": "translations",
                                                       "shape": list(s.group.shape)})


def _pieces(s: Schedule, symmetry: Callable[[Callable[[np.ndarray], Any]], dict] | None
            ) -> Iterator[bytes]:
    marker = f"cclc-array-{uuid.uuid4().hex}-"
    arrays: list[np.ndarray] = []

    def later(a: np.ndarray) -> str:
        arrays.append(a)
        return f"{marker}{len(arrays) - 1}"

    doc = _document(s, later)
    if symmetry is not None:
        doc[SYMMETRY_KEY] = symmetry(later)
    text = json.dumps(doc, separators=(",", ":"), allow_nan=False)
    head, *pieces = text.split(f'"{marker}')

    def jobs() -> Iterator[Callable[[], bytes]]:
        yield head.encode
        for piece in pieces:
            index, rest = piece.split('"', 1)
            yield from _array_jobs(arrays[int(index)])
            yield rest.encode
    if sum(a.size for a in arrays) < 2 * _INT_BATCH:
        return (job() for job in jobs())      # (small: threads would cost more than they save)
    return _formatted_in_order(jobs())


#: threads that format a document's large integer arrays, and the batches they may run
#: ahead of the writer: numpy lets go of the interpreter while it formats, so two format
#: a 16M-entry column in 0.6x the time of one, and the file is written meanwhile
_FORMAT_THREADS, _FORMAT_AHEAD = 2, 4


def _array_jobs(a: np.ndarray) -> Iterator[Callable[[], bytes]]:
    """:func:`int_array_json` of ``a`` as jobs whose results, joined, are its text: one per
    batch of a long 1-D integer array, else one."""
    a = np.asarray(a)
    if a.ndim != 1 or a.dtype.kind not in "iu" or not len(a):
        yield functools.partial(int_array_json, a)
        return
    for lo in range(0, len(a), _INT_BATCH):
        yield functools.partial(_batch_json, a, lo)


def _batch_json(a: np.ndarray, lo: int) -> bytes:
    """The batch of ``a`` from ``lo`` in :func:`int_array_json`'s text, with the bracket or
    comma before it and the bracket after the last."""
    hi = lo + _INT_BATCH
    return ((b"," if lo else b"[") + _int_digits(a[lo:hi])
            + (b"]" if hi >= len(a) else b""))


def _formatted_in_order(jobs: Iterable[Callable[[], bytes]]) -> Iterator[bytes]:
    """The results of ``jobs`` in order, run by :data:`_FORMAT_THREADS` threads at most
    :data:`_FORMAT_AHEAD` ahead of the reader (memory stays a few batches)."""
    with ThreadPoolExecutor(_FORMAT_THREADS, thread_name_prefix="cclc-json") as pool:
        pending: collections.deque = collections.deque()
        for job in jobs:
            pending.append(pool.submit(job))
            if len(pending) >= _FORMAT_AHEAD:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def dumps(s: Schedule) -> bytes:
    """The compact JSON document of ``s`` (see :func:`document_pieces`)."""
    return b"".join(document_pieces(s))


def save(s: Schedule, path: str | os.PathLike, force: bool = False) -> None:
    """Write ``s`` to ``path`` as a schedule document (compact JSON, one trailing newline)
    through cclc's one writer (:func:`cclc.outdir.write_file`): atomically, listed in the
    folder's manifest, and never over a file cclc did not write unless ``force``."""
    def pieces() -> Iterator[bytes]:
        yield from document_pieces(s)
        yield b"\n"

    write_file(path, pieces(), force=force)


# -- reading ---------------------------------------------------------------------------------

class _Doc:
    """Typed access to a JSON object, naming the key path in every error."""

    def __init__(self, d: Any, where: str):
        if not isinstance(d, dict):
            raise ScheduleError(f"'{where}' must be a JSON object, not {_what(d)}")
        self.d = d
        self.where = where

    def path(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def get(self, key: str, optional: bool = False) -> Any:
        if key not in self.d:
            if optional:
                return None
            raise ScheduleError(f"missing key '{self.path(key)}'")
        return self.d[key]

    def obj(self, key: str) -> _Doc:
        return _Doc(self.get(key), self.path(key))

    def string(self, key: str) -> str:
        v = self.get(key)
        if not isinstance(v, str):
            raise ScheduleError(f"'{self.path(key)}' must be a string, not {_what(v)}")
        return v

    def string_or_none(self, key: str) -> str | None:
        """:meth:`string`, or ``None`` when the key is missing (or null)."""
        return None if self.get(key, optional=True) is None else self.string(key)

    def integer(self, key: str) -> int:
        v = self.get(key)
        if not isinstance(v, int) or isinstance(v, bool):
            raise ScheduleError(f"'{self.path(key)}' must be an integer, not {_what(v)}")
        if not -2**63 <= v < 2**63:
            # numpy holds sizes and counts in 64 bits
            raise ScheduleError(f"'{self.path(key)}' is {_short(v)}, outside the 64-bit range")
        return v

    def integer_or_none(self, key: str) -> int | None:
        """:meth:`integer`, or ``None`` when the key is missing (or null)."""
        return None if self.get(key, optional=True) is None else self.integer(key)

    def array(self, key: str, kind: str, ndim: int | tuple[int, ...] = 1) -> np.ndarray:
        """A list (of lists) of ``kind`` ("int", "float", "bool", "str") as a numpy array."""
        return _array(self.get(key), kind, ndim, self.path(key))

    def array_or_none(self, key: str, kind: str, ndim: int | tuple[int, ...] = 1
                      ) -> np.ndarray | None:
        """:meth:`array`, or ``None`` when the key is missing (or null)."""
        return None if self.get(key, optional=True) is None else self.array(key, kind, ndim)

    def enum(self, key: str, enum: type[_E]) -> _E:
        v = self.string(key)
        try:
            return enum(v)
        except ValueError:
            legal = ", ".join(repr(e.value) for e in enum)
            raise ScheduleError(f"'{self.path(key)}' is {v!r}, which is not one of "
                                f"{legal}") from None


def _what(v: Any) -> str:
    if v is None:
        return "null"
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
            list: "a list", dict: "an object"}.get(type(v), type(v).__name__)


def _array(v: Any, kind: str, ndim: int | tuple[int, ...], where: str) -> np.ndarray:
    ndims = (ndim,) if isinstance(ndim, int) else ndim
    if not isinstance(v, list):
        raise ScheduleError(f"'{where}' must be a list, not {_what(v)}")
    if kind == "str":
        if not all(isinstance(x, str) for x in v):
            raise ScheduleError(f"'{where}' must be a list of strings")
        return np.array(v, dtype=object)
    try:
        a = np.array(v)
    except ValueError:
        raise ScheduleError(f"'{where}' has rows of different lengths") from None
    if kind == "int" and a.dtype.kind in "fuO":
        # numpy turns a whole list into floats (or unsigned, or objects) for one integer past
        # 64 bits: name that integer, not the fractions the list does not have
        big = _first_huge_int(v)
        if big is not None:
            i, value = big
            size = "too large" if value > 0 else "too far below zero"
            raise ScheduleError(f"'{where}' holds {_short(value)} at flat index {i}: {size} "
                                "for the 64-bit integers that hold counts, sizes and offsets")
    # an empty list carries no type; give it the expected one
    if a.size == 0 and (a.ndim in ndims or (a.ndim == 1 and 1 in ndims)):
        dtype = {"int": np.int64, "float": np.float64, "bool": np.bool_}[kind]
        return a.astype(dtype)
    if a.ndim not in ndims or a.dtype == object:
        shape = "a list" if ndims == (1,) else "a list of lists" if ndims == (2,) else \
            "a list (or a list of lists)"
        raise ScheduleError(f"'{where}' must be {shape} of {kind}s")
    ok = {"int": a.dtype.kind in "iu" and a.dtype != np.uint64,
          "float": a.dtype.kind in "fiu" and a.dtype != np.bool_,
          "bool": a.dtype == np.bool_}[kind]
    if not ok:
        raise ScheduleError(f"'{where}' must hold only {kind}s, found {_dtype_word(a)}")
    if kind == "float":
        a = a.astype(np.float64)
        if not np.isfinite(a).all():
            i = int(np.flatnonzero(~np.isfinite(a.ravel()))[0])
            raise ScheduleError(f"'{where}' holds {a.ravel()[i]} at flat index {i}: numbers "
                                "must be finite")
    return a


def _first_huge_int(v: list) -> tuple[int, int] | None:
    """(flat index, value) of the first integer of a list (of lists) outside 64 bits."""
    flat = (x for row in v for x in (row if isinstance(row, list) else [row]))
    for i, x in enumerate(flat):
        if isinstance(x, int) and not isinstance(x, bool) and not -2**63 <= x < 2**63:
            return i, x
    return None


def _short(v: int) -> str:
    # a 10**30 written out is harder to read than its size
    text = str(v)
    return text if len(text) <= 24 else f"an integer of {len(text.lstrip('-'))} digits"


def _dtype_word(a: np.ndarray) -> str:
    return {"f": "numbers with a fraction", "b": "booleans", "U": "strings",
            "i": "integers", "u": "integers"}.get(a.dtype.kind, str(a.dtype))


def _ro(a: np.ndarray, dtype) -> np.ndarray:
    a = np.ascontiguousarray(a, dtype=dtype)
    a.setflags(write=False)
    return a


def _topology(t: _Doc) -> Topology:
    n_ranks = t.integer("n_ranks")
    names = tuple(t.array("vertex_names", "str").tolist())
    if not 1 <= n_ranks <= len(names):
        raise ScheduleError(f"'{t.path('n_ranks')}' is {n_ranks}, but there are "
                            f"{len(names)} vertex names")
    cols, kind_codes = _link_columns(t.obj("links"), len(names))
    kind_name = t.string("kind")
    kind = _TOPOLOGY_KINDS.get(kind_name)
    if kind is None:
        raise ScheduleError(f"'{t.path('kind')}' is {kind_name!r}, which is not one of "
                            "'torus', 'fabric', 'node'")
    failed_ranks = t.array("failed_ranks", "int")
    if ((failed_ranks < 0) | (failed_ranks >= n_ranks)).any():
        raise ScheduleError(f"'{t.path('failed_ranks')}' names a rank outside 0..{n_ranks - 1}")
    dims, wrap = _dims(t, n_ranks)
    # documents written before routing was declared priced any healthy path a route named
    routing = t.string_or_none("routing") or ("source" if kind == "torus" else "ecmp")
    allowed = TORUS_ROUTINGS if kind == "torus" else FABRIC_ROUTINGS
    if routing not in allowed:
        raise ScheduleError(f"'{t.path('routing')}' is {routing!r}, which is not one of "
                            + ", ".join(repr(r) for r in allowed))
    per_rank = _per_rank(t, n_ranks)
    groups = _fault_groups(t, len(cols["src"]))
    multicast = t.get("multicast", optional=True)
    if multicast not in (None, True, False):
        raise ScheduleError(f"'{t.path('multicast')}' is {multicast!r}, not true or false")
    return Topology(
        name=t.string("name"), kind=kind, n_ranks=n_ranks, vertex_names=names,
        link_src=_ro(cols["src"], np.int32), link_dst=_ro(cols["dst"], np.int32),
        link_bandwidth=_ro(cols["bandwidth"], np.float64),
        link_latency=_ro(cols["latency"], np.float64), link_kind=_ro(kind_codes, np.int8),
        link_failed=_ro(cols["failed"], bool), failed_ranks=frozenset(failed_ranks.tolist()),
        dims=None if dims is None else tuple(dims.tolist()),
        wrap=None if wrap is None else tuple(wrap.tolist()),
        n_nodes=t.integer("n_nodes"), fault_groups=groups, routing=routing,
        node_of_rank=per_rank["node_of_rank"], gpu_of_rank=per_rank["gpu_of_rank"],
        rail_of_rank=per_rank["rail_of_rank"], multicast=bool(multicast))


def _link_columns(links: _Doc, n_vertices: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The link columns of a topology object, checked, and the link kinds as codes."""
    cols = {"src": links.array("src", "int"), "dst": links.array("dst", "int"),
            "bandwidth": links.array("bandwidth", "float"),
            "latency": links.array("latency", "float"),
            "failed": links.array("failed", "bool")}
    kinds = links.array("kind", "str").tolist()
    n_links = len(cols["src"])
    for k, v in list(cols.items()) + [("kind", kinds)]:
        if len(v) != n_links:
            raise ScheduleError(f"'{links.path(k)}' has {len(v)} entries, but "
                                f"'{links.path('src')}' has {n_links}: link columns must "
                                "have equal lengths")
    for k in ("src", "dst"):
        bad = (cols[k] < 0) | (cols[k] >= n_vertices)
        if bad.any():
            raise ScheduleError(f"'{links.path(k)}' names vertex {int(cols[k][bad][0])}, but "
                                f"vertices are 0..{n_vertices - 1}")
    # the language's ranges: beyond them times overflow to inf in the simulator and bounds
    bw, lat = cols["bandwidth"], cols["latency"]
    bad = ~((bw >= MIN_BANDWIDTH) & (bw <= MAX_BANDWIDTH))
    if n_links and bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ScheduleError(f"'{links.path('bandwidth')}[{i}]' is {bw[i]}; link bandwidth must "
                            f"be > 0 and in {MIN_BANDWIDTH:g}..{MAX_BANDWIDTH:g} bytes/s")
    bad = ~((lat >= 0) & (lat <= MAX_LATENCY))
    if n_links and bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ScheduleError(f"'{links.path('latency')}[{i}]' is {lat[i]}; link latency must be "
                            f">= 0 and at most {MAX_LATENCY:g} s")
    try:
        kind_codes = np.array([int(_LINK_KIND_BY_NAME[k]) for k in kinds], dtype=np.int8)
    except KeyError as e:
        raise ScheduleError(f"'{links.path('kind')}' has {e.args[0]!r}, which is not one of "
                            f"{', '.join(_LINK_KIND_BY_NAME)}") from None
    return cols, kind_codes


def _dims(t: _Doc, n_ranks: int) -> tuple[np.ndarray | None, np.ndarray | None]:
    """A torus's ``dims`` and ``wrap`` (both ``None`` for other topologies), checked."""
    dims = t.array_or_none("dims", "int")
    wrap = t.array_or_none("wrap", "bool")
    if dims is not None:
        if (dims < 1).any() or int(np.prod(dims)) != n_ranks:
            raise ScheduleError(f"'{t.path('dims')}' {dims.tolist()} do not multiply to "
                                f"{n_ranks} ranks")
        if wrap is None or len(wrap) != len(dims):
            raise ScheduleError(f"'{t.path('wrap')}' must give one boolean per dimension")
    return dims, wrap


def _per_rank(t: _Doc, n_ranks: int) -> dict[str, np.ndarray | None]:
    """The optional per-rank columns (node, GPU and rail of each rank)."""
    per_rank = {}
    for key in ("node_of_rank", "gpu_of_rank", "rail_of_rank"):
        a = t.array_or_none(key, "int")
        if a is not None and len(a) != n_ranks:
            raise ScheduleError(f"'{t.path(key)}' has {len(a)} entries for {n_ranks} ranks")
        per_rank[key] = None if a is None else _ro(a, np.int64 if key == "node_of_rank"
                                                   else np.int32)
    return per_rank


def _fault_groups(t: _Doc, n_links: int) -> tuple[tuple[str, tuple[int, ...]], ...]:
    groups = []
    g_list = t.get("fault_groups")
    if not isinstance(g_list, list):
        raise ScheduleError(f"'{t.path('fault_groups')}' must be a list, not {_what(g_list)}")
    for k, g in enumerate(g_list):
        gd = _Doc(g, f"{t.path('fault_groups')}[{k}]")
        ids = gd.array("links", "int")
        if ((ids < 0) | (ids >= n_links)).any():
            raise ScheduleError(f"'{gd.path('links')}' names a link outside 0..{n_links - 1}")
        groups.append((gd.string("name"), tuple(ids.tolist())))
    return tuple(groups)


def _params(v: Any, where: str) -> tuple[tuple[str, int | float | str], ...]:
    if not isinstance(v, dict):
        raise ScheduleError(f"'{where}' must be an object, not {_what(v)}")
    for k, x in v.items():
        if isinstance(x, bool) or not isinstance(x, (int, float, str)):
            raise ScheduleError(f"'{where}.{k}' must be a number or a string, not {_what(x)}")
    return tuple(v.items())


def _hint(h: _Doc) -> Hint:
    return Hint(name=h.string("name"), params=_params(h.get("params"), h.path("params")))


def _span(v: Any, where: str) -> Span | None:
    if v is None:
        return None
    d = _Doc(v, where)
    return Span(file=d.string("file"), line=d.integer("line"), col=d.integer("col"),
                end_line=d.integer_or_none("end_line"), end_col=d.integer_or_none("end_col"))


def from_json(doc: Any) -> Schedule:
    """The :class:`Schedule` a schedule document describes.

    Raises :class:`ScheduleError` naming the first problem: not a schedule document, another
    version, a missing key, a value of the wrong type, an unknown enum value, or op columns of
    different lengths.
    """
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ScheduleError(f"not a cclc schedule document: expected \"format\": \"{FORMAT}\"")
    if SYMMETRY_KEY in doc:
        raise ScheduleError(_STORED_BY_SYMMETRY)
    return _plain(doc)


def symmetric_from_json(doc: Any) -> SymmetricSchedule | ExceptedSchedule:
    """The :class:`~cclc.symmetric.SymmetricSchedule` a document stored by symmetry describes
    (:class:`ScheduleError` as :func:`from_json`, and for a group it does not know)."""
    if not isinstance(doc, dict) or SYMMETRY_KEY not in doc:
        raise ScheduleError(f"not a schedule stored by symmetry: no '{SYMMETRY_KEY}' key")
    g = _Doc(doc, "").obj(SYMMETRY_KEY)
    if g.string("group") != "translations":
        raise ScheduleError(f"'{SYMMETRY_KEY}.group' is {g.string('group')!r}; this cclc knows "
                            "\"translations\"")
    shape = tuple(int(x) for x in g.array("shape", "int").tolist())
    reps = _plain({k: v for k, v in doc.items() if k != SYMMETRY_KEY})
    if shape != (reps.topology.dims or ()):
        raise ScheduleError(f"'{SYMMETRY_KEY}.shape' {list(shape)} is not the torus's sides")
    exc = g.get(EXCEPTIONS_KEY, optional=True)
    coll = reps.collective if exc is None else healthy_collective(reps.collective)
    base = SymmetricSchedule(collective=coll, group=TranslationGroup(shape),
                             layouts=reps.layouts, ops=reps.ops, routes=reps.routes,
                             algorithm=reps.algorithm, schedule=reps.schedule,
                             params=reps.params)
    if exc is None:
        return base
    e = g.obj(EXCEPTIONS_KEY)
    t = e.obj("tail")
    r = t.obj("routes")
    return ExceptedSchedule(
        collective=reps.collective, base=base, journey=e.array("journey", "int"),
        masked_element=e.array("masked_element", "int"),
        masked_journey=e.array("masked_journey", "int"), tail=_ops(t.obj("ops")),
        tail_routes=Routes(r.array("offsets", "int"),
                           _int32(r.array("links", "int"), r.path("links"))),
        tail_scratch_from=e.integer("tail_scratch_from"),
        interleaved=_interleaved(e))


def _interleaved(e: _Doc) -> bool:
    """``exceptions.interleaved``: false where the key is missing (a tail after the base)."""
    v = e.get("interleaved", optional=True)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise ScheduleError(f"'{e.path('interleaved')}' must be true or false, not {_what(v)}")
    return v


def _plain(doc: dict) -> Schedule:
    d = _Doc(doc, "")
    version = d.get("version")
    if version != VERSION:
        raise ScheduleError(f"schedule document version {version!r} is not supported; this "
                            f"cclc reads version {VERSION}")
    topo = _topology(d.obj("topology"))
    c = d.obj("collective")
    kind = c.enum("kind", CollectiveKind)
    pair_sizes = c.array_or_none("pair_sizes", "int", ndim=2)
    size = c.integer("size")
    try:
        coll = make_collective(
            name=c.string("name"), kind=kind, topology=topo,
            group=tuple(c.array("group", "int").tolist()), size=size,
            dtype=c.enum("dtype", DType), op=c.enum("op", ReduceOp),
            root=c.integer_or_none("root"), algorithm=_hint(c.obj("algorithm")),
            schedule=_hint(c.obj("schedule")), pair_sizes=pair_sizes,
            span=_span(c.get("span", optional=True), c.path("span")))
    except ScheduleError:
        raise
    except CclError as e:
        raise ScheduleError(f"'collective' is not a valid collective: {e.message}") from None
    if coll.size != size:
        raise ScheduleError(f"'collective.size' is {size}, but 'collective.pair_sizes' gives "
                            f"{coll.size}")
    lay = d.obj("layouts")
    layouts = (lay.array(_BUF_KEYS[Buf.INPUT], "int", ndim=(1, 2)),
               lay.array(_BUF_KEYS[Buf.OUTPUT], "int", ndim=(1, 2)),
               lay.array(_BUF_KEYS[Buf.SCRATCH], "int", ndim=(1, 2)))
    r = d.obj("routes")
    routes = Routes(r.array("offsets", "int"), _int32(r.array("links", "int"), r.path("links")))
    return Schedule(collective=coll, layouts=layouts, ops=_ops(d.obj("ops")), routes=routes,
                    algorithm=d.string("algorithm"), schedule=d.string("schedule"),
                    params=_params(d.get("params"), "params"))


def _ops(o: _Doc) -> Ops:
    """The op columns of ``o`` (an ``"ops"`` object), checked."""
    cols: dict[str, np.ndarray] = {}
    for k in OP_COLUMNS:
        a = o.array(k, "int")
        if cols and len(a) != len(next(iter(cols.values()))):
            first = next(iter(cols))
            raise ScheduleError(f"'{o.path(k)}' has {len(a)} entries, but '{o.path(first)}' "
                                f"has {len(cols[first])}: op columns must have equal lengths")
        if k in _OP_ENUMS:
            enum, legal = _OP_ENUMS[k]
            bad = ~np.isin(a, [int(e) for e in enum])
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                raise ScheduleError(f"'{o.path(k)}[{i}]' is {int(a[i])}; it must be {legal}")
        elif len(a) and a.min() < 0:
            i = int(np.argmin(a))
            raise ScheduleError(f"'{o.path(k)}[{i}]' is {int(a[i])}; it must be >= 0")
        cols[k] = _int32(a, o.path(k))
    if len(cols["step"]) and int(cols["step"].max()) > len(cols["step"]):
        # every step holds at least one op, so there cannot be more steps than ops
        raise ScheduleError(f"'{o.path('step')}' goes up to {int(cols['step'].max())} with only "
                            f"{len(cols['step'])} ops: steps must be numbered without long gaps")
    extra = set(o.d) - set(OP_COLUMNS)
    if extra:
        raise ScheduleError(f"'{o.where}' has unknown column(s) {', '.join(sorted(extra))}")
    return Ops(**cols)


def _int32(a: np.ndarray, where: str) -> np.ndarray:
    if len(a) and (a.min() < -2**31 or a.max() >= 2**31):
        raise ScheduleError(f"'{where}' has a value outside the 32-bit range")
    return a


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object of a schedule document; a key given twice is an error (plain JSON readers
    keep the last silently, so the document would mean different things to different tools)."""
    doc: dict[str, Any] = {}
    for key, value in pairs:
        if key in doc:
            raise ScheduleError(f"the key '{key}' appears twice in one object; a schedule "
                                "document gives each key once")
        doc[key] = value
    return doc


def load(path: str | os.PathLike) -> Schedule:
    """Read a schedule document; :class:`CclError` if the file cannot be read,
    :class:`ScheduleError` if it is not a valid schedule document."""
    schedule = read_document(path)
    if isinstance(schedule, SymmetricSchedule | ExceptedSchedule):
        raise ScheduleError(f"{os.fspath(path)}: {_STORED_BY_SYMMETRY}")
    return schedule


def read_document(path: str | os.PathLike
                  ) -> Schedule | SymmetricSchedule | ExceptedSchedule:
    """Read a schedule document, whole or stored by symmetry (:func:`load`'s errors)."""
    p = os.fspath(path)
    try:
        with open(p, encoding="utf-8") as f:
            doc = json.load(f, object_pairs_hook=_unique_keys)
    except OSError as e:
        raise CclError(f"cannot read {p}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise ScheduleError(f"{p} is not a text (UTF-8) file") from None
    except json.JSONDecodeError as e:
        raise ScheduleError(f"{p} is not valid JSON: line {e.lineno}, column {e.colno}: "
                            f"{e.msg}") from None
    except ValueError:
        # the one other ValueError of json.load: Python's limit on the digits of an integer
        raise ScheduleError(f"{p} holds a number too large to be read (an integer of more "
                            "than 4300 digits)") from None
    except RecursionError:
        raise ScheduleError(f"{p} nests lists or objects too deeply to be a schedule "
                            "document") from None
    except ScheduleError as e:
        raise ScheduleError(f"{p}: {e.message}") from None
    try:
        if isinstance(doc, dict) and SYMMETRY_KEY in doc:
            return symmetric_from_json(doc)
        return from_json(doc)
    except ScheduleError as e:
        raise ScheduleError(f"{p}: {e.message}") from None
