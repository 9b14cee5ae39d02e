"""The schedule IR: per-rank buffers cut into chunks, and ops stored column-wise.

A :class:`Schedule` is plain immutable data:

* ``layouts[buf]`` gives the elements of every chunk of buffer ``buf`` (``Buf.INPUT``,
  ``Buf.OUTPUT``, ``Buf.SCRATCH``): a 1-D int64 array when every rank cuts the buffer the same
  way, or a 2-D ``(n_ranks, n_chunks)`` array when ranks differ (non-uniform alltoall). Chunks of
  one buffer need not be equal: a pass that needs a half block or a fractional share cuts
  finer where it needs to.
* ``ops``: one row per transfer, as equal-length read-only numpy arrays. ``src``/``dst`` are
  *group* indices (0..n-1, see ``collective.group`` for the global rank). An op moves the
  ``count`` contiguous chunks starting at ``src_off`` of ``src``'s ``src_buf`` into the chunks
  starting at ``dst_off`` of ``dst``'s ``dst_buf`` (the element totals must match), as a copy
  (overwrite) or a reduce (``dst = dst (+) src``). ``src == dst`` is a local op.
* ``routes``: a table of link paths (CSR). Route 0 is the empty path, used by local ops; any
  other op names the route its bytes travel, as global link ids of the topology.
* Ops of one step run concurrently and read the state left by the previous step.

Builders live in :class:`ScheduleBuilder`; passes return new schedules, never mutate one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from enum import IntEnum

import numpy as np

from cclc.collective import Collective
from cclc.errors import ScheduleError
from cclc.sorting import equal_runs_order, numbered_by_first

__all__ = ["Buf", "OpKind", "Ops", "Routes", "Schedule", "ScheduleBuilder", "OP_COLUMNS",
           "csr_concat", "csr_take", "csr_take_pieces", "even_split", "format_schedule",
           "intern_paths", "path_hashes"]


class Buf(IntEnum):
    INPUT = 0
    OUTPUT = 1
    SCRATCH = 2


class OpKind(IntEnum):
    COPY = 0
    REDUCE = 1


#: column name -> numpy dtype, in canonical order
OP_COLUMNS: dict[str, type] = {
    "step": np.int32, "src": np.int32, "dst": np.int32, "route": np.int32, "kind": np.int8,
    "src_buf": np.int8, "src_off": np.int32, "dst_buf": np.int8, "dst_off": np.int32,
    "count": np.int32,
}


def _ro(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    if a.flags.writeable:
        a = a.copy() if a.base is not None else a
        a.setflags(write=False)
    return a


@dataclass(frozen=True, eq=False)
class Ops:
    """The op table: one read-only array per column of :data:`OP_COLUMNS`, all one length."""

    step: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    route: np.ndarray
    kind: np.ndarray
    src_buf: np.ndarray
    src_off: np.ndarray
    dst_buf: np.ndarray
    dst_off: np.ndarray
    count: np.ndarray

    def __post_init__(self) -> None:
        n = None
        for name, dtype in OP_COLUMNS.items():
            col = _ro(np.asarray(getattr(self, name), dtype=dtype))
            if col.ndim != 1:
                raise ScheduleError(f"op column '{name}' must be 1-D")
            if n is None:
                n = len(col)
            elif len(col) != n:
                raise ScheduleError(f"op column '{name}' has {len(col)} rows, expected {n}")
            object.__setattr__(self, name, col)

    def __len__(self) -> int:
        return len(self.step)

    @classmethod
    def empty(cls) -> Ops:
        return cls(**{k: np.zeros(0, dtype=t) for k, t in OP_COLUMNS.items()})

    def columns(self) -> dict[str, np.ndarray]:
        return {k: getattr(self, k) for k in OP_COLUMNS}

    def take(self, index: np.ndarray) -> Ops:
        """The rows at ``index`` (a boolean mask or integer indices), in that order."""
        return Ops(**{k: v[index] for k, v in self.columns().items()})

    @property
    def n_steps(self) -> int:
        return int(self.step.max()) + 1 if len(self) else 0


@dataclass(frozen=True, eq=False)
class Routes:
    """Link paths in CSR form: route ``i`` is ``links[offsets[i]:offsets[i+1]]``; route 0 is \
empty."""

    offsets: np.ndarray
    links: np.ndarray
    #: what passes derive from the table alone and ask again (the routes a topology's routing
    #: carries: the relay pass and the verifier each asked, 0.7 and 2.3 s for the 16.7M routes
    #: of a 4,096-GPU alltoall); not an init field, so ``replace`` never shares it
    _cache: dict = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_cache", {})
        off = _ro(np.asarray(self.offsets, dtype=np.int64))
        links = _ro(np.asarray(self.links, dtype=np.int32))
        if off.ndim != 1 or len(off) < 2 or off[0] != 0 or off[1] != 0:
            raise ScheduleError("route table must start with the empty route 0")
        if off[-1] != len(links) or (np.diff(off) < 0).any():
            raise ScheduleError("route offsets do not match the link array")
        object.__setattr__(self, "offsets", off)
        object.__setattr__(self, "links", links)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def path(self, route: int) -> tuple[int, ...]:
        return tuple(self.links[self.offsets[route]:self.offsets[route + 1]].tolist())

    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)


@dataclass(frozen=True, eq=False)
class Schedule:
    """A complete schedule of one collective. See the module docstring for the meaning."""

    collective: Collective
    layouts: tuple[np.ndarray, np.ndarray, np.ndarray]
    ops: Ops
    routes: Routes
    algorithm: str
    schedule: str = "-"
    params: tuple[tuple[str, int | float | str], ...] = ()
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        layouts = []
        for buf, lay in zip(Buf, self.layouts, strict=True):
            a = _ro(np.asarray(lay, dtype=np.int64))
            if a.ndim == 2 and a.shape[0] != self.n:
                raise ScheduleError(f"{buf.name.lower()} layout has {a.shape[0]} rows for "
                                    f"{self.n} ranks")
            if a.ndim not in (1, 2) or (a < 0).any():
                raise ScheduleError(f"{buf.name.lower()} layout must be 1-D or 2-D, >= 0")
            layouts.append(a)
        object.__setattr__(self, "layouts", tuple(layouts))

    @property
    def topology(self):
        return self.collective.topology

    @property
    def n(self) -> int:
        return self.collective.n

    @property
    def n_steps(self) -> int:
        return self.ops.n_steps

    def n_chunks(self, buf: Buf) -> int:
        return int(self.layouts[buf].shape[-1])

    def chunk_elems(self, buf: Buf) -> np.ndarray:
        """``(n, n_chunks)`` elements per chunk (a broadcast view when ranks agree)."""
        lay = self.layouts[buf]
        return np.broadcast_to(lay, (self.n, lay.shape[-1])) if lay.ndim == 1 else lay

    def chunk_starts(self, buf: Buf) -> np.ndarray:
        """``(n, n_chunks + 1)`` element offset of every chunk boundary, per rank."""
        key = ("starts", int(buf))
        if key not in self._cache:
            lay = self.chunk_elems(buf)
            starts = np.zeros((self.n, lay.shape[1] + 1), dtype=np.int64)
            np.cumsum(lay, axis=1, out=starts[:, 1:])
            starts.setflags(write=False)
            self._cache[key] = starts
        return self._cache[key]

    def range_elems(self, buf: Buf, rank: np.ndarray, off: np.ndarray, count: np.ndarray
                    ) -> np.ndarray:
        """Elements in chunks ``off .. off + count - 1`` of ``buf`` on each ``rank`` (arrays
        of one length, in range). A layout all ranks share is summed once, not per rank: at
        512 ranks a scratch of 60k chunks would otherwise cost a 250 MB table of offsets."""
        lay = self.layouts[buf]
        off = np.asarray(off, dtype=np.int64)
        if lay.ndim == 2:
            st = self.chunk_starts(buf)
            return st[rank, off + count] - st[rank, off]
        key = ("starts1", int(buf))
        if key not in self._cache:
            st = np.zeros(len(lay) + 1, dtype=np.int64)
            np.cumsum(lay, out=st[1:])
            st.setflags(write=False)
            self._cache[key] = st
        st = self._cache[key]
        return st[off + count] - st[off]

    def op_elems(self) -> np.ndarray:
        """Elements each op moves (from its source range)."""
        if "elems" not in self._cache:
            ops = self.ops
            out = np.zeros(len(ops), dtype=np.int64)
            for buf in Buf:
                m = ops.src_buf == buf
                if m.any():
                    out[m] = self.range_elems(buf, ops.src[m], ops.src_off[m], ops.count[m])
            out.setflags(write=False)
            self._cache["elems"] = out
        return self._cache["elems"]

    def op_links(self) -> tuple[np.ndarray, np.ndarray]:
        """``(op, link)`` for every link of every op's route, grouped by op in op order.

        The one expansion of the CSR routes over the ops that cost, drawing and analysis share;
        op and route ids must already be in range.
        """
        if "op_links" not in self._cache:
            route = self.ops.route
            lengths = self.routes.lengths()[route]
            pair_op = _pair_ops(len(self.ops), lengths)
            pair_link = np.empty(len(pair_op), dtype=self.routes.links.dtype)
            starts = self.routes.offsets[:-1][route]
            # the pairs' positions in the route table a block of ops at a time (those of
            # every pair at once are a gigabyte of temporaries)
            at = 0
            for lo in range(0, len(route), _GATHER_OPS):
                where = run_positions(starts[lo:lo + _GATHER_OPS], lengths[lo:lo + _GATHER_OPS])
                pair_link[at:at + len(where)] = self.routes.links[where]
                at += len(where)
            pair_op.setflags(write=False)
            pair_link.setflags(write=False)
            self._cache["op_links"] = (pair_op, pair_link)
        return self._cache["op_links"]

    def pair_ops(self) -> np.ndarray:
        """The op of every (op, link) pair of :meth:`op_links`, without the links (not kept:
        read-only where ``op_links`` keeps it)."""
        if "op_links" in self._cache:
            return self._cache["op_links"][0]
        return _pair_ops(len(self.ops), self.routes.lengths()[self.ops.route])

    def release_op_links(self) -> None:
        """Let :meth:`op_links`'s kept pairs go (they are made again if asked): for a caller
        that holds other links for the same pairs (ECMP's, at 4,096 GPUs 0.5 GB each)."""
        self._cache.pop("op_links", None)

    def op_bytes(self) -> np.ndarray:
        return self.op_elems() * self.collective.dtype.itemsize

    def replace(self, **changes) -> Schedule:
        return replace(self, _cache={}, **changes)


class ScheduleBuilder:
    """Collects ops (scalars or whole numpy columns at once) and routes for one schedule.

    An allgather on a ring of two ranks: each keeps its block, then sends it to the other
    (chunk sizes are in elements: 32 B of fp32 is 8 elements, 4 per rank).

    >>> from cclc.collective import CollectiveKind, make_collective
    >>> from cclc.topology import torus
    >>> from cclc.verify import verify
    >>> ring = torus("ring", (2,))
    >>> coll = make_collective("ag", CollectiveKind.ALLGATHER, ring, (0, 1), size=32)
    >>> b = ScheduleBuilder(coll, input=[4], output=[4, 4])
    >>> ranks = np.arange(2)
    >>> b.add(step=0, src=ranks, dst=ranks, src_buf=Buf.INPUT, src_off=0,
    ...       dst_buf=Buf.OUTPUT, dst_off=ranks)
    >>> routes = [b.route((ring.link_id(0, 1),)), b.route((ring.link_id(1, 0),))]
    >>> b.add(step=1, src=ranks, dst=1 - ranks, route=routes, src_buf=Buf.INPUT, src_off=0,
    ...       dst_buf=Buf.OUTPUT, dst_off=ranks)
    >>> s = b.build("example")
    >>> len(s.ops), s.n_steps
    (4, 2)
    >>> verify(s)
    """

    def __init__(self, collective: Collective, input: Sequence[int] | np.ndarray,
                 output: Sequence[int] | np.ndarray,
                 scratch: Sequence[int] | np.ndarray = ()):
        self.collective = collective
        self.layouts = (np.asarray(input, dtype=np.int64), np.asarray(output, dtype=np.int64),
                        np.asarray(scratch, dtype=np.int64))
        self._cols: dict[str, list[np.ndarray]] = {k: [] for k in OP_COLUMNS}
        self._route_ids: dict[tuple[int, ...], int] = {(): 0}
        self._route_offsets: list[np.ndarray] = [np.array([0, 0], dtype=np.int64)]
        self._route_links: list[np.ndarray] = []
        self._n_routes = 1
        self._n_route_links = 0

    def route(self, links: Sequence[int]) -> int:
        """The id of the route over ``links`` (deduplicated)."""
        key = tuple(int(x) for x in links)
        rid = self._route_ids.get(key)
        if rid is None:
            rid = self.add_routes(np.array([0, len(key)]), np.array(key, dtype=np.int32))[0]
            self._route_ids[key] = int(rid)
        return int(rid)

    def routes(self, offsets: np.ndarray, links: np.ndarray) -> np.ndarray:
        """The ids of many routes (CSR, ``offsets[0] == 0``), deduplicated: the ids
        :meth:`route` gives them one after another, with the new ones added in one piece."""
        offsets = np.asarray(offsets, dtype=np.int64)
        links = np.asarray(links, dtype=np.int32)
        local, firsts = intern_paths([(np.zeros(2, dtype=np.int64), links[:0]),
                                      (offsets, links)])
        flat = links.tolist()
        ids = np.zeros(len(firsts), dtype=np.int64)
        fresh = []
        for k, row in enumerate(firsts[1:].tolist(), start=1):
            start, end = int(offsets[row - 1]), int(offsets[row])
            key = tuple(flat[start:end])
            rid = self._route_ids.get(key)
            if rid is None:
                fresh.append(k)
            else:
                ids[k] = rid
        if fresh:
            rows = firsts[fresh] - 1
            new_offs, new_links = csr_take(offsets, links, rows)
            ids[fresh] = self.add_routes(new_offs, new_links)
            keys = [tuple(flat[int(offsets[r]):int(offsets[r + 1])]) for r in rows.tolist()]
            self._route_ids.update(zip(keys, ids[fresh].tolist(), strict=True))
        return ids[local[1:]].astype(np.int32)

    def add_routes(self, offsets: np.ndarray, links: np.ndarray) -> np.ndarray:
        """Append many routes at once (CSR, ``offsets[0] == 0``); returns their ids.

        Not deduplicated: for bulk generation where the caller already knows routes are new.
        """
        offsets = np.asarray(offsets, dtype=np.int64)
        links = np.asarray(links, dtype=np.int32)
        k = len(offsets) - 1
        self._route_offsets.append(offsets[1:] + self._n_route_links)
        self._route_links.append(links)
        ids = np.arange(self._n_routes, self._n_routes + k, dtype=np.int32)
        self._n_routes += k
        self._n_route_links += len(links)
        return ids

    def add(self, *, step, src, dst, route=0, kind=OpKind.COPY, src_buf, src_off, dst_buf,
            dst_off, count=1) -> None:
        """Append ops; every argument is a scalar or a 1-D array (broadcast together)."""
        vals = dict(step=step, src=src, dst=dst, route=route, kind=kind, src_buf=src_buf,
                    src_off=src_off, dst_buf=dst_buf, dst_off=dst_off, count=count)
        arrays = np.broadcast_arrays(*[np.asarray(v) for v in vals.values()])
        n = arrays[0].size
        for (k, dtype), a in zip(OP_COLUMNS.items(), arrays, strict=True):
            # a fresh array that owns its data (no view), so build() may keep it as it is
            self._cols[k].append(np.array(a.reshape(n), dtype=dtype))

    def build(self, algorithm: str, schedule: str = "-",
              params: tuple[tuple[str, int | float | str], ...] = ()) -> Schedule:
        """The finished schedule, ops sorted by step (stable)."""
        # one piece is already the builder's own copy (add copies): no second copy of it
        cols = {k: (v[0] if len(v) == 1 else np.concatenate(v) if v
                    else np.zeros(0, dtype=OP_COLUMNS[k])) for k, v in self._cols.items()}
        step = cols["step"]
        if (step[1:] < step[:-1]).any():    # ops added out of step order: sort them (stable)
            order = np.argsort(step, kind="stable")
            cols = {k: v[order] for k, v in cols.items()}
        ops = Ops(**cols)
        offsets = np.concatenate([np.array([0], dtype=np.int64)] + [o[1:] if i == 0 else o
                                  for i, o in enumerate(self._route_offsets)])
        # one piece (a whole alltoall's routes, 0.5 GB at 4,096 GPUs) kept as it is, not
        # copied: the table makes it read-only (a view of another array is copied there)
        links = (self._route_links[0] if len(self._route_links) == 1
                 else np.concatenate(self._route_links) if self._route_links
                 else np.zeros(0, dtype=np.int32))
        return Schedule(collective=self.collective, layouts=self.layouts, ops=ops,
                        routes=Routes(offsets, links), algorithm=algorithm, schedule=schedule,
                        params=params)


def _pair_ops(n_ops: int, lengths: np.ndarray) -> np.ndarray:
    """Every op's id once per link of its route (``lengths``): 32 bits, as the route table's
    links are, where they fit (at 4,096 ranks 130M pairs, 1.5 GB where 64 bits took 2)."""
    op_id = np.int32 if n_ops < 2 ** 31 else np.int64
    return np.repeat(np.arange(n_ops, dtype=op_id), lengths)


#: ops whose (op, link) pairs :meth:`Schedule.op_links` gathers at once
_GATHER_OPS = 1 << 20


def run_positions(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``starts[i], starts[i] + 1, ..., starts[i] + lengths[i] - 1`` for every ``i``, one
    after another (int64): the positions of CSR rows' entries. Each is one up from the one
    before, except at a row's first, which jumps to its start: summed in place, one array of
    the result's length where a repeat and a range took three (at 4,096 GPUs each is 1 GB,
    and on a virtual machine fresh memory costs more than the sum)."""
    has = lengths > 0
    start, length = starts[has].astype(np.int64), lengths[has].astype(np.int64)
    at = np.ones(int(length.sum()), dtype=np.int64)
    if len(at):
        jump = start.copy()
        jump[1:] -= start[:-1] + length[:-1] - 1
        at[np.cumsum(length) - length] = jump
        np.cumsum(at, out=at)
    return at


def csr_offsets(offsets: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The offsets of the CSR table that :func:`csr_take` makes of the paths ``rows``."""
    new_offs = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(offsets[1:][rows] - offsets[:-1][rows], out=new_offs[1:])
    return new_offs


def csr_take(offsets: np.ndarray, links: np.ndarray, rows: np.ndarray,
             out: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The paths ``rows`` of a CSR table as a new (writable) CSR table. ``out``: an int32
    array as long as the links taken, which they are written into and which is returned (a
    caller lays several tables one after another in one array, not joined afterwards)."""
    new_offs = csr_offsets(offsets, rows)
    if out is None:
        out = np.empty(int(new_offs[-1]), dtype=np.int32)
    if (len(rows) > 1 and offsets[0] == 0 and offsets[-1] == len(links)
            and bool((rows[1:] > rows[:-1]).all())):
        # increasing rows (most of a table, kept in order): one mask over the links, where
        # the index arithmetic below takes 14x longer (7.3 s at 16.6M of 16.7M paths)
        chosen = np.zeros(len(offsets) - 1, dtype=bool)
        chosen[rows] = True
        where = np.repeat(chosen, np.diff(offsets))
        del chosen
        # a block of links at a time (numpy's compress would list the positions of all)
        at = 0
        for lo in range(0, len(links), _MASK_BLOCK):
            part = links[lo:lo + _MASK_BLOCK][where[lo:lo + _MASK_BLOCK]]
            out[at:at + len(part)] = part
            at += len(part)
        return new_offs, out
    # the links' positions a block of rows at a time (at 4,096 ranks those of 16M paths at
    # once are 1.6 GB of temporaries)
    for lo in range(0, len(rows), _TAKE_BLOCK):
        some = rows[lo:lo + _TAKE_BLOCK]
        where = run_positions(offsets[:-1][some], offsets[1:][some] - offsets[:-1][some])
        part = out[new_offs[lo]:new_offs[lo + len(some)]]
        if links.dtype == out.dtype:
            np.take(links, where, out=part)
        else:
            part[:] = links[where]
    return new_offs, out


#: rows whose links :func:`csr_take` gathers at once, when not through a mask
_TAKE_BLOCK = 1 << 20

#: links :func:`csr_take` passes through its mask at once
_MASK_BLOCK = 1 << 23


def csr_join_offsets(offsets: list[np.ndarray]) -> np.ndarray:
    """The offsets of CSR tables (given by theirs) one after another."""
    out = [offsets[0]]
    base = int(offsets[0][-1])
    for o in offsets[1:]:
        out.append(o[1:] + base)
        base += int(o[-1])
    return np.concatenate(out)


def csr_concat(pieces: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """CSR tables one after another."""
    return (csr_join_offsets([o for o, _ in pieces]),
            np.concatenate([x for _, x in pieces], dtype=np.int32, casting="same_kind"))


def csr_take_pieces(pieces: list[tuple[np.ndarray, np.ndarray]], rows: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray]:
    """The paths ``rows`` (increasing, counted over ``pieces`` read one after another) as one
    CSR table, without joining the pieces first (at 4,096 ranks each is a gigabyte)."""
    bounds = np.cumsum([0] + [len(o) - 1 for o, _ in pieces])
    if len(rows) == bounds[-1]:
        # every path (increasing rows, as many as there are): the pieces joined, no copy
        # path by path (a 4,096-rank alltoall's new paths are all distinct)
        return csr_concat(pieces)
    parts = []
    for (offs, links), lo, hi in zip(pieces, bounds[:-1], bounds[1:], strict=True):
        mine = rows[(rows >= lo) & (rows < hi)] - lo
        parts.append(csr_take(offs, links, mine))
    return csr_concat(parts)


#: odd multiplier of :func:`path_hashes` (the 64-bit golden ratio)
_HASH_BASE = np.uint64(0x9E3779B97F4A7C15)

#: paths hashed per block in :func:`path_hashes` (bounds its temporaries)
_HASH_BLOCK = 1 << 22


def path_hashes(offsets: np.ndarray, links: np.ndarray) -> np.ndarray:
    """A 64-bit hash of every path of a CSR table: the sum of ``(link + 1) * B**position``
    modulo ``2**64``; 0 for the empty path. Equal paths hash equal; unequal ones almost never
    do, and :func:`intern_paths` checks."""
    n = len(offsets) - 1
    out = np.zeros(n, dtype=np.uint64)
    width = int(np.diff(offsets).max(initial=0))
    powers = np.ones(width + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(1, width + 1):
            powers[j] = powers[j - 1] * _HASH_BASE
        for lo in range(0, n, _HASH_BLOCK):
            hi = min(n, lo + _HASH_BLOCK)
            start, end = int(offsets[lo]), int(offsets[hi])
            lengths = np.diff(offsets[lo:hi + 1])
            within = np.arange(end - start, dtype=np.int64) - np.repeat(offsets[lo:hi] - start,
                                                                         lengths)
            terms = (links[start:end].astype(np.uint64) + np.uint64(1)) * powers[within]
            total = np.zeros(end - start + 1, dtype=np.uint64)
            np.cumsum(terms, out=total[1:])
            out[lo:hi] = total[offsets[lo + 1:hi + 1] - start] - total[offsets[lo:hi] - start]
    return out


def intern_paths(pieces: list[tuple[np.ndarray, np.ndarray]],
                 hashes: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Number the distinct paths of the CSR tables ``pieces`` (read one after another) in the
    order they first occur, the empty path 0: ``(id of every path, the path first holding
    each id)``.

    Paths are grouped by ``hashes`` (default :func:`path_hashes`; any function under which
    equal paths are equal) and every path is checked against the first of its group; when
    two unequal paths share a hash, the paths are packed into integer words and sorted."""
    if hashes is None:
        if _distinct_ends(pieces):
            every = np.arange(sum(len(o) - 1 for o, _ in pieces), dtype=np.int64)
            return every, every
        hashes = np.concatenate([path_hashes(o, x) for o, x in pieces])
    # equal hashes together, each group in path order, so its first row is its least
    # (equal_runs_order: a plain sort; an argsort of 33M hashes takes 17 s)
    order = equal_runs_order(hashes)
    h = hashes[order]
    new = np.ones(len(h), dtype=bool)
    new[1:] = h[1:] != h[:-1]
    del h
    ids, firsts = numbered_by_first(order, new)
    dup = np.flatnonzero(firsts[ids] != np.arange(len(ids)))
    if len(dup) and not _same_paths(pieces, dup, firsts[ids[dup]]):
        return _intern_packed(pieces)
    return ids, firsts


#: paths whose end links :func:`_distinct_ends` reads at once
_ENDS_BLOCK = 1 << 20

#: (first link, last link) pairs :func:`_distinct_ends` marks in a table of flags, where the
#: links that begin and end paths are few enough (a 4,096-GPU alltoall's: 67M, 64 MB)
_ENDS_TABLE = 1 << 27


def _distinct_ends(pieces: list[tuple[np.ndarray, np.ndarray]]) -> bool:
    """Whether no two paths of ``pieces`` share both their first and last link (the empty
    path counting as one pair): then no two are equal, and each is its own first. A 4,096-rank
    alltoall's paths, one per pair of GPUs, pass.

    The pairs are marked in a table of flags indexed by the pair (each link numbered among
    the links that begin, or end, a path): a pair marked twice leaves fewer flags than
    paths. Where that table would be too large, the pairs are sorted (at 4,096 GPUs the sort
    took 1.3-1.4 s, the table 0.4)."""
    first, last = _end_links(pieces)
    if sum(len(o) - 1 for o, _ in pieces) - len(first) > 1:     # two empty paths
        return False
    width = 1 + max((int(x.max()) for _, x in pieces if len(x)), default=0)
    begins = np.zeros(width, dtype=bool)
    begins[first] = True
    ends = np.zeros(width, dtype=bool)
    ends[last] = True
    n_begins, n_ends = int(begins.sum()), int(ends.sum())
    if n_begins * n_ends > _ENDS_TABLE:
        pairs = first.astype(np.int64) * width + last
        pairs.sort()
        return not bool((pairs[1:] == pairs[:-1]).any())
    begin_rank, end_rank = np.cumsum(begins) - 1, np.cumsum(ends) - 1
    seen = np.zeros(n_begins * n_ends, dtype=bool)
    for lo in range(0, len(first), _ENDS_BLOCK):      # (bounded temporaries, as above)
        seen[begin_rank[first[lo:lo + _ENDS_BLOCK]] * n_ends
             + end_rank[last[lo:lo + _ENDS_BLOCK]]] = True
    return int(np.count_nonzero(seen)) == len(first)


def _end_links(pieces: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """The first and last link of every non-empty path of ``pieces``, read a block of paths
    at a time (at 4,096 ranks the temporaries of all 16.6M at once were the routing pass's
    peak, a gigabyte)."""
    firsts, lasts = [], []
    for offs, links in pieces:
        for lo in range(0, len(offs) - 1, _ENDS_BLOCK):
            first, last = offs[lo:lo + _ENDS_BLOCK], offs[lo + 1:lo + 1 + _ENDS_BLOCK] - 1
            first = first[:len(last)]
            full = last >= first
            firsts.append(links[first[full]])
            lasts.append(links[last[full]])
    if not firsts:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    return np.concatenate(firsts), np.concatenate(lasts)


def _same_paths(pieces: list[tuple[np.ndarray, np.ndarray]], a: np.ndarray, b: np.ndarray
                ) -> bool:
    """Whether paths ``a[i]`` and ``b[i]`` (counted over ``pieces``) are equal, for all i:
    lengths first, then link by link, each read where its piece holds it (no sort: at
    4,096 ranks ``a`` holds millions of rows)."""
    piece_a, start_a, len_a = _locate_paths(pieces, a)
    piece_b, start_b, len_b = _locate_paths(pieces, b)
    if (len_a != len_b).any():
        return False
    for j in range(int(len_a.max(initial=0))):
        on = np.flatnonzero(len_a > j)
        if not (_link_at(pieces, piece_a[on], start_a[on] + j)
                == _link_at(pieces, piece_b[on], start_b[on] + j)).all():
            return False
    return True


def _locate_paths(pieces: list[tuple[np.ndarray, np.ndarray]], rows: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(piece, first link's index in that piece, length)`` of every path of ``rows``
    (counted over ``pieces`` read one after another)."""
    bounds = np.cumsum([0] + [len(o) - 1 for o, _ in pieces])
    # (narrow types: at 4,096 ranks there are 16M rows, and a path is a few links long)
    piece = (np.searchsorted(bounds, rows, side="right") - 1).astype(np.int8 if len(pieces) < 128
                                                                    else np.int64)
    start = np.empty(len(rows), dtype=np.int64)
    length = np.empty(len(rows), dtype=np.int32)
    for p, (offs, _) in enumerate(pieces):
        mine = np.flatnonzero(piece == p)
        local = rows[mine] - bounds[p]
        start[mine] = offs[local]
        length[mine] = offs[local + 1] - offs[local]
    return piece, start, length


def _link_at(pieces: list[tuple[np.ndarray, np.ndarray]], piece: np.ndarray, at: np.ndarray
             ) -> np.ndarray:
    """Link ``at[i]`` of piece ``piece[i]``'s link array, for every i."""
    out = np.empty(len(at), dtype=np.int64)
    for p, (_, links) in enumerate(pieces):
        mine = np.flatnonzero(piece == p)
        out[mine] = links[at[mine]]
    return out


def _intern_packed(pieces: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """:func:`intern_paths` exactly: every path packed into a few integer words (its length
    and its links) and the words sorted."""
    offsets, links = csr_concat(pieces)
    n = len(offsets) - 1
    lengths = np.diff(offsets)
    width = int(lengths.max()) if n else 0
    bits = max(1, int(links.max(initial=0) + 2).bit_length())
    per_word = max(1, 63 // bits)
    n_words = max(1, -(-width // per_word))
    words = np.zeros((n_words + 1, n), dtype=np.uint64)
    words[n_words] = lengths.astype(np.uint64)
    for j in range(width):
        # link j of every path that long, shifted into its place in word j // per_word
        rows = np.flatnonzero(lengths > j)
        hop = links[offsets[rows] + j].astype(np.uint64) + np.uint64(1)
        words[j // per_word, rows] |= hop << np.uint64((j % per_word) * bits)
    # the empty path sorts first and is path 0's: it keeps id 0 wherever it occurs
    order = np.lexsort(words[::-1])
    w = words[:, order]
    new = np.ones(n, dtype=bool)
    new[1:] = (w[:, 1:] != w[:, :-1]).any(axis=0)
    return numbered_by_first(order, new)


_BUF_LETTER = {Buf.INPUT: "i", Buf.OUTPUT: "o", Buf.SCRATCH: "s"}
_KIND_WORD = {OpKind.COPY: "copy", OpKind.REDUCE: "reduce"}


def even_split(total: int, parts: int) -> np.ndarray:
    """``parts`` near-equal non-negative integers summing to ``total`` (larger ones first)."""
    base, extra = divmod(int(total), int(parts))
    out = np.full(parts, base, dtype=np.int64)
    out[:extra] += 1
    return out


def format_op(s: Schedule, i: int) -> str:
    """One op as canonical text: ``step 3: copy 0.i[1+2] -> 4.o[0] via 12,13``."""
    o = s.ops
    path = s.routes.path(int(o.route[i]))
    via = (" via " + ",".join(map(str, path))) if path else ""
    cnt = int(o.count[i])

    def rng(buf, off):
        return f"{_BUF_LETTER[Buf(int(buf))]}[{int(off)}" + (f"+{cnt}]" if cnt != 1 else "]")

    return (f"step {int(o.step[i])}: {_KIND_WORD[OpKind(int(o.kind[i]))]} "
            f"{int(o.src[i])}.{rng(o.src_buf[i], o.src_off[i])} -> "
            f"{int(o.dst[i])}.{rng(o.dst_buf[i], o.dst_off[i])}{via}")


def format_schedule(s: Schedule, around: int | None = None, context: int = 3) -> str:
    """Canonical text of a schedule (or of the ops ``context`` either side of op ``around``)."""
    c = s.collective
    lines = []
    if around is None:
        lines.append(f"schedule {c.name}: {c.kind.value} on {c.n} ranks, {c.size} B "
                     f"{c.dtype.value}, algorithm {s.algorithm}, schedule {s.schedule}")
        for buf in Buf:
            lay = s.layouts[buf]
            desc = ("per-rank " if lay.ndim == 2 else "") + f"{lay.shape[-1]} chunks"
            if lay.ndim == 1 and len(lay) and (lay == lay[0]).all():
                desc += f" of {int(lay[0])} elements"
            lines.append(f"  {buf.name.lower()}: {desc}")
        rows = range(len(s.ops))
    else:
        rows = range(max(0, around - context), min(len(s.ops), around + context + 1))
    for i in rows:
        mark = ">> " if i == around else "   "
        lines.append(f"{mark}#{i} {format_op(s, i)}")
    return "\n".join(lines)
