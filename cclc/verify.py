"""The verifier: a symbolic interpreter of a schedule, one vectorized step at a time.

Every chunk slot (rank, buffer, chunk) holds a symbolic value: the global data coordinate of
its first element (see :mod:`cclc.semantics`), or :data:`~cclc.semantics.EMPTY`. A slot of
``k`` elements starting at coordinate ``g`` holds coordinates ``g .. g+k-1``. In a reducing
collective a slot also holds the set of ranks whose contributions it sums, as a bitset of
``ceil(n/64)`` uint64 words; where those would take more than :data:`SLICE_BYTES` (a
4,096-rank ReduceScatter's: 16 GiB), as the number of its set instead, the sets being made
a slice of contributor ranks at a time (:func:`_verify_sliced`: the same verdict and
message). Copy collectives need no set: the coordinate names its origin.

Ops are first checked on their own (ranges, element totals, routes against the topology), then
interpreted step by step: all ops of a step read the state the previous step left, then write.
The first violation in step order (lowest op index within a step) is raised as a
:class:`~cclc.errors.ScheduleError` that names the op and prints the schedule around it.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from cclc.contributor_sets import (
    SLICE_BYTES,
    SetLog,
    all_of,
    gather_sets,
    initial_sets,
    make_unions,
    slice_reach,
)
from cclc.errors import ScheduleError
from cclc.ir import Buf, OpKind, Schedule, format_op, format_schedule
from cclc.routing import carried_routes, describe
from cclc.semantics import EMPTY, ChunkMap, chunk_map, format_ranks

__all__ = ["SLICE_BYTES", "holds_whole_sets", "verify"]


_BUF_WORD = {Buf.INPUT: "input", Buf.OUTPUT: "output", Buf.SCRATCH: "scratch"}


def verify(schedule: Schedule, slice_ranks_per_pass: int | None = None) -> None:
    """Raise :class:`ScheduleError` unless ``schedule`` computes its collective.

    Rejects: reading an empty slot; two writes to one slot in a step; a reduction into an
    empty slot, of different data, or adding a contribution twice; ranges out of bounds or
    element totals that differ; a route with a missing or failed link, that does not lead
    from the source rank to the destination rank, or that the topology's declared routing does
    not carry (see :mod:`cclc.routing`); a final output that differs from the
    collective's postcondition.

    A reduction's contributor sets (``n`` bits per chunk slot, ``n^3 / 4`` bytes for a ring
    AllReduce) are held whole where they fit in :data:`SLICE_BYTES`
    (:func:`holds_whole_sets`), else numbered and made a slice of contributor ranks at a time
    (``slice_ranks_per_pass`` ranks; given here, it forces the slicing, as the tests do):
    the same verdict and the same message, in a fraction of the memory (see
    :func:`_verify_sliced`).

    >>> verify(direct_alltoall_schedule)     # doctest: +SKIP
    """
    cmap = chunk_map(schedule)
    n = schedule.n
    whole = holds_whole_sets(n, n * sum(schedule.n_chunks(b) for b in Buf))
    if not cmap.contract.reducing or (slice_ranks_per_pass is None and whole) \
            or (slice_ranks_per_pass is not None and slice_ranks_per_pass >= n):
        _Interpreter(schedule, range(n), cmap).run()
    else:
        _verify_sliced(schedule, None if slice_ranks_per_pass is None
                       else max(1, slice_ranks_per_pass), cmap)


def holds_whole_sets(n: int, slots: int) -> bool:
    """Whether the verifier holds the whole contributor sets of ``slots`` chunk slots of a
    reduction on ``n`` ranks (``ceil(n / 64)`` words each, within :data:`SLICE_BYTES`), or
    numbers them and makes them slice by slice."""
    return 8 * slots * ((n + 63) // 64) <= SLICE_BYTES


def _chunks(k: int) -> str:
    return f"{k} chunk" if k == 1 else f"{k} chunks"


class _Rows:
    """The contributor sets of a few slots, read like the whole table (any other slot reads
    as the empty set): what the message of a failing step needs, after a sliced run."""

    def __init__(self, slots: np.ndarray, rows: np.ndarray):
        self.slots, self.rows = slots, rows

    def __getitem__(self, slots) -> np.ndarray:
        slots = np.asarray(slots)
        pos = np.clip(np.searchsorted(self.slots, slots), 0, len(self.slots) - 1)
        hit = self.slots[pos] == slots
        return np.where(hit[..., None], self.rows[pos], np.uint64(0))


class _Interpreter:
    """The interpreter. ``contrib``: the contributor ranks whose bits it holds (``range(n)``:
    all; ``None``: none, the values only, for a sliced run, which then numbers the sets
    and records their unions in :attr:`sets`)."""

    def __init__(self, s: Schedule, contrib: range | None, cmap: ChunkMap | None = None):
        self.s = s
        self.map: ChunkMap = chunk_map(s) if cmap is None else cmap
        self.contract = self.map.contract
        self.reducing = self.contract.reducing
        n = s.n
        self.nc = np.array([s.n_chunks(b) for b in Buf], dtype=np.int64)
        sizes = n * self.nc
        self.base = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        self.n_slots = int(sizes.sum())
        # elements per slot are looked up through the layouts (slot_elems), never stored per
        # slot: a shared layout would be repeated for every rank (250 MB at 512 ranks)
        self.uniform = all(lay.ndim == 1 for lay in s.layouts)
        self.flat_layout = np.concatenate(s.layouts).astype(np.int64) if self.uniform else None
        self.chunk_base = np.concatenate([[0], np.cumsum(self.nc)[:-1]]).astype(np.int64)
        # slot values are stored minus EMPTY, so that an empty slot is 0 and the table can
        # start as untouched zero pages: a slot no op touches costs no memory (most scratch)
        self.val = np.zeros(self.n_slots, dtype=np.int64)
        ni = int(sizes[Buf.INPUT])
        self.val[:ni] = self.map.input_value.ravel() - EMPTY
        self.words = (n + 63) // 64
        self.bits: np.ndarray | _Rows | None = None
        if self.reducing and contrib is not None:
            self.bits = self.initial_bits(contrib)
        #: a reduction's run without bits numbers the contributor sets (see SetLog): the set
        #: of each slot, and the unions made
        self.sets: SetLog | None = None
        self.sid = np.zeros(0, dtype=np.int64)
        if self.reducing and self.bits is None:
            self.sets = SetLog(n)
            self.sid = np.full(self.n_slots, n, dtype=np.int64)
            held = self.map.input_value.ravel() != EMPTY
            self.sid[:ni][held] = np.repeat(np.arange(n), int(self.nc[Buf.INPUT]))[held]
        # per-slot stamp for finding two writes to one slot in a step without sorting (a step
        # reads only the stamps it wrote itself, so the initial content does not matter)
        self.stamp = np.empty(self.n_slots, dtype=np.int32)

    def initial_bits(self, contrib: range) -> np.ndarray:
        """The contributor bits of ranks ``contrib`` (bit ``r - contrib.start``) before the
        first step: each input slot holds its own rank's contribution."""
        nci = int(self.nc[Buf.INPUT])
        bits = np.zeros((self.n_slots, (len(contrib) + 63) // 64), dtype=np.uint64)
        ranks = np.arange(contrib.start, contrib.stop)
        slots = (ranks[:, None] * nci + np.arange(nci)[None, :]).ravel()
        local = np.repeat(ranks - contrib.start, nci)
        bits[slots, local // 64] = np.left_shift(np.uint64(1), (local % 64).astype(np.uint64))
        bits[slots[self.map.input_value.ravel()[slots] == EMPTY]] = 0
        return bits

    # -- words ---------------------------------------------------------------------------
    def op_text(self, i: int) -> str:
        try:
            return f"op #{i} ({format_op(self.s, i)})"
        except (ValueError, KeyError, IndexError):
            # a buffer, kind or route the printer cannot name: show the raw columns
            cols = ", ".join(f"{k}={int(v[i])}" for k, v in self.s.ops.columns().items())
            return f"op #{i} ({cols})"

    def fail(self, i: int, what: str) -> None:
        try:
            around = "\n" + format_schedule(self.s, around=i)
        except (ValueError, KeyError, IndexError):
            around = ""
        raise ScheduleError(f"{self.op_text(i)}: {what}{around}")

    def slot_elems(self, slots: np.ndarray) -> np.ndarray:
        """Elements of every slot of ``slots`` (from the layouts)."""
        b = np.searchsorted(self.base, slots, side="right") - 1
        rank, chunk = np.divmod(slots - self.base[b], self.nc[b])
        if self.flat_layout is not None:
            return self.flat_layout[self.chunk_base[b] + chunk]
        out = np.zeros(len(slots), dtype=np.int64)
        for buf in Buf:
            m = b == buf
            if m.any():
                out[m] = self.s.chunk_elems(buf)[rank[m], chunk[m]]
        return out

    def last_writer(self, slot: int) -> int | None:
        """The op that wrote ``slot`` last (in step order, then op order), or None."""
        o = self.s.ops
        b = int(np.searchsorted(self.base, slot, side="right") - 1)
        r, c = divmod(slot - int(self.base[b]), int(self.nc[b]))
        off = o.dst_off.astype(np.int64)
        hit = np.flatnonzero((o.dst == r) & (o.dst_buf == b) & (off <= c) & (c < off + o.count))
        if not len(hit):
            return None
        return int(hit[np.lexsort((hit, o.step[hit]))[-1]])

    def slot_words(self, slot: int) -> str:
        b = int(np.searchsorted(self.base, slot, side="right") - 1)
        r, c = divmod(slot - int(self.base[b]), int(self.nc[b]))
        return f"rank {r}'s {_BUF_WORD[Buf(b)]} chunk {c}"

    def contributors(self, slot_bits: np.ndarray) -> frozenset[int]:
        out = set()
        for w, word in enumerate(slot_bits.tolist()):
            for b in range(64):
                if (int(word) >> b) & 1:
                    out.add(w * 64 + b)
        return frozenset(out)

    def value_words(self, g: int, length: int, bits: np.ndarray | None) -> str:
        contrib = self.contributors(bits) if (self.reducing and bits is not None) else None
        return self.contract.describe(int(g), int(length), contrib)

    # -- the run ---------------------------------------------------------------------------
    def steps(self) -> list[np.ndarray]:
        """The op indices of every step, in step order (ops of a step in op order)."""
        ops = self.s.ops
        order = np.argsort(ops.step, kind="stable")
        return np.split(order, np.flatnonzero(np.diff(ops.step[order])) + 1)

    def first_static(self) -> int | None:
        """The first op in step order that fails :meth:`static_checks`, or None."""
        static_bad = self.static_checks()
        if not static_bad.any():
            return None
        order = np.argsort(self.s.ops.step, kind="stable")
        return int(order[np.flatnonzero(static_bad[order])[0]])

    def scan(self) -> tuple[int, int] | None:
        """Interpret every step; the first error's place, (step ordinal, op position in the
        step; -1: op :meth:`first_static`, before the step runs), or None. Unless the run
        numbers the sets for the slices (whose errors may come earlier), the error is raised
        instead."""
        if len(self.s.ops) == 0:
            return None
        static = self.first_static()
        for t, idx in enumerate(self.steps()):
            if static is not None and int(self.s.ops.step[idx[0]]) >= int(self.s.ops.step[static]):
                if self.sets is None:
                    self.explain_static(static)
                return t, -1
            errors = self.run_step(idx)
            if errors:
                j, _, what = min(errors)
                if self.sets is None:
                    self.fail(int(idx[j]), what)
                return t, j
        return None

    def run(self) -> None:
        """Raise the first error, if any (the interpreter holds every contributor bit)."""
        self.scan()
        self.check_outputs()

    # -- checks of each op on its own ------------------------------------------------------
    def static_checks(self) -> np.ndarray:
        """Boolean mask of ops with a fault visible without running the schedule. A block of
        ops at a time (:data:`_STATIC_OPS`): the checks' temporaries of every op at once
        were 1.1 GB over the schedule at 4,096 ranks, and slower to walk."""
        o = self.s.ops
        bad = np.empty(len(o), dtype=bool)
        table = self.route_table()
        group = np.asarray(self.s.collective.group, dtype=np.int64)
        for lo in range(0, len(o), _STATIC_OPS):
            bad[lo:lo + _STATIC_OPS] = self._static_block(slice(lo, lo + _STATIC_OPS), table,
                                                          group)
        return bad

    def _static_block(self, ops: slice, table: tuple[np.ndarray, np.ndarray, np.ndarray],
                      group: np.ndarray) -> np.ndarray:
        """:meth:`static_checks` of the ops in ``ops``, given :meth:`route_table` and the
        group's ranks."""
        s = self.s
        n = s.n
        step, src, dst, kind, count, route = (getattr(s.ops, c)[ops] for c in (
            "step", "src", "dst", "kind", "count", "route"))
        src_buf, dst_buf = s.ops.src_buf[ops], s.ops.dst_buf[ops]
        src_off, dst_off = s.ops.src_off[ops], s.ops.dst_off[ops]
        bad = (step < 0) | (src < 0) | (src >= n) | (dst < 0) | (dst >= n)
        bad |= (src_buf < 0) | (src_buf > 2) | (dst_buf < 0) | (dst_buf > 2)
        bad |= (kind < 0) | (kind > 1) | (count < 1) | (src_off < 0) | (dst_off < 0)
        bad |= (route < 0) | (route >= len(s.routes))
        ok = ~bad
        sb, db = np.where(ok, src_buf, 0), np.where(ok, dst_buf, 0)
        bad |= ok & (src_off.astype(np.int64) + count > self.nc[sb])
        bad |= ok & (dst_off.astype(np.int64) + count > self.nc[db])
        ok = ~bad
        src_el = self.range_elems(np.where(ok, src, 0), sb, np.where(ok, src_off, 0),
                                  np.where(ok, count, 0))
        dst_el = self.range_elems(np.where(ok, dst, 0), db, np.where(ok, dst_off, 0),
                                  np.where(ok, count, 0))
        bad |= ok & (src_el != dst_el)
        ok = ~bad
        local = src == dst
        bad |= ok & local & (route != 0)
        bad |= ok & ~local & (route == 0)
        ok = ~bad
        route_ok, first_v, last_v = table
        rt = np.where(ok, route, 0)
        remote = ok & ~local
        g_src = group[np.where(ok, src, 0)]
        g_dst = group[np.where(ok, dst, 0)]
        bad |= remote & (~route_ok[rt] | (first_v[rt] != g_src) | (last_v[rt] != g_dst))
        ok = ~bad
        # a route must also be one the topology's declared routing carries by itself
        if ok.any():
            bad |= ok & remote & ~carried_routes(s.topology, s.routes)[np.where(ok, route, 0)]
        return bad

    def range_elems(self, rank, buf, off, count) -> np.ndarray:
        out = np.zeros(len(rank), dtype=np.int64)
        for b in Buf:
            m = buf == b
            if m.any() and self.nc[b] > 0:
                out[m] = self.s.range_elems(b, rank[m], off[m], count[m])
        return out

    def route_table(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per route: whether its links exist, are healthy and chain; first and last vertex."""
        topo = self.s.topology
        routes = self.s.routes
        links, offsets = routes.links, routes.offsets
        top = max(topo.n_links - 1, 0)
        nonempty = routes.lengths() > 0
        if topo.n_links == 0:
            # no links at all: every non-empty route names a link that does not exist
            none = np.full(len(routes), -1, dtype=np.int64)
            return np.zeros(len(routes), dtype=bool), none, none
        route_start = np.zeros(len(links), dtype=bool)
        route_start[offsets[:-1][nonempty]] = True
        # a link must exist, be healthy, and start where the previous link of its route ends;
        # done in blocks so a 4096-rank table (~200M links) needs no full-size temporaries
        bad = []
        block = 1 << 22
        # (every link id in range, as in any table cclc built: no masks or clips per block)
        in_range = not len(links) or (int(links.min()) >= 0 and int(links.max()) <= top)
        for a in range(0, len(links), block):
            b = min(a + block, len(links))
            seg = links[a:b]
            if in_range:
                safe, good = seg, ~topo.link_failed[seg]
            else:
                exists = (seg >= 0) & (seg < topo.n_links)
                safe = np.where(exists, seg, 0)
                good = exists & ~topo.link_failed[safe]
            lo = max(a, 1)                              # links that have a predecessor
            if lo < b:
                prev = links[lo - 1:b - 1] if in_range else np.clip(links[lo - 1:b - 1], 0, top)
                follows = topo.link_src[safe[lo - a:]] == topo.link_dst[prev]
                good[lo - a:] &= follows | route_start[lo:b]
            bad.append(np.flatnonzero(~good) + a)
        bad_links = np.concatenate(bad) if bad else np.zeros(0, dtype=np.int64)
        route_ok = nonempty.copy()
        route_ok[np.searchsorted(offsets, bad_links, side="right") - 1] = False
        first_v = np.full(len(routes), -1, dtype=np.int64)
        last_v = np.full(len(routes), -1, dtype=np.int64)
        if len(links):
            first_v[nonempty] = topo.link_src[np.clip(links[offsets[:-1][nonempty]], 0, top)]
            last_v[nonempty] = topo.link_dst[np.clip(links[offsets[1:][nonempty] - 1], 0, top)]
        return route_ok, first_v, last_v

    def explain_static(self, i: int) -> None:
        """Raise the error for op ``i``, which failed :meth:`static_checks`: its fields
        first, then its route (the order of the checks is the order of the messages)."""
        self._explain_fields(i)
        self._explain_route(i)

    def _explain_fields(self, i: int) -> None:
        """Raise the error of op ``i`` if one of its own fields is out of range."""
        s, o = self.s, self.s.ops
        n = s.n
        step, src, dst = int(o.step[i]), int(o.src[i]), int(o.dst[i])
        if step < 0:
            self.fail(i, f"step {step} is negative")
        for who, r in (("source", src), ("destination", dst)):
            if not 0 <= r < n:
                self.fail(i, f"{who} rank {r} is outside the group of {n} ranks (0..{n - 1})")
        for who, b in (("source", int(o.src_buf[i])), ("destination", int(o.dst_buf[i]))):
            if b not in (0, 1, 2):
                self.fail(i, f"{who} buffer {b} is not input (0), output (1) or scratch (2)")
        if int(o.kind[i]) not in (0, 1):
            self.fail(i, f"op kind {int(o.kind[i])} is not copy (0) or reduce (1)")
        count = int(o.count[i])
        if count < 1:
            self.fail(i, f"count {count} moves no chunk; it must be >= 1")
        for who, r, b, off in (("source", src, int(o.src_buf[i]), int(o.src_off[i])),
                               ("destination", dst, int(o.dst_buf[i]), int(o.dst_off[i]))):
            if off < 0 or off + count > self.nc[b]:
                self.fail(i, f"{who} chunks {off}..{off + count - 1} are out of bounds: rank "
                             f"{r}'s {_BUF_WORD[Buf(b)]} has {_chunks(int(self.nc[b]))}")
        se = self.range_elems(np.array([src]), np.array([o.src_buf[i]]),
                              np.array([o.src_off[i]]), np.array([count]))[0]
        de = self.range_elems(np.array([dst]), np.array([o.dst_buf[i]]),
                              np.array([o.dst_off[i]]), np.array([count]))[0]
        if se != de:
            self.fail(i, f"the source chunks hold {int(se)} elements but the destination chunks "
                         f"hold {int(de)}")

    def _explain_route(self, i: int) -> None:
        """Raise the error of op ``i`` whose fields are fine but whose route is not."""
        s, o = self.s, self.s.ops
        src, dst = int(o.src[i]), int(o.dst[i])
        route = int(o.route[i])
        if not 0 <= route < len(s.routes):
            self.fail(i, f"route {route} does not exist (the schedule has routes "
                         f"0..{len(s.routes) - 1})")
        if src == dst:
            self.fail(i, f"a local op (source rank == destination rank) must use the empty "
                         f"route 0, not route {route}")
        if route == 0:
            self.fail(i, f"ranks {src} and {dst} differ but the op uses the empty route 0")
        topo = s.topology
        path = s.routes.path(route)
        names = topo.vertex_names
        self._explain_links(i, route, path)
        g_src, g_dst = s.collective.group[src], s.collective.group[dst]
        if topo.link_src[path[0]] != g_src:
            self.fail(i, f"route {route} starts at {names[topo.link_src[path[0]]]}, but the "
                         f"source rank {src} is {names[g_src]}")
        if topo.link_dst[path[-1]] != g_dst:
            self.fail(i, f"route {route} ends at {names[topo.link_dst[path[-1]]]}, but the "
                         f"destination rank {dst} is {names[g_dst]}")
        hops = " -> ".join([names[topo.link_src[path[0]]]]
                           + [names[topo.link_dst[k]] for k in path])
        self.fail(i, f"route {route} ({hops}) is not a path the topology's routing "
                     f"'{topo.routing}' ({describe(topo.routing)}) carries; relay it through "
                     "the ranks on the way (cclc.relay.lower_relays)")

    def _explain_links(self, i: int, route: int, path) -> None:
        """Raise the error of op ``i`` if a link of its route is missing, failed or does not
        continue the link before it."""
        topo = self.s.topology
        for k, link in enumerate(path):
            if not 0 <= link < topo.n_links:
                self.fail(i, f"route {route} uses link {link}, which does not exist (the "
                             f"topology has links 0..{topo.n_links - 1})")
            if topo.link_failed[link]:
                self.fail(i, f"route {route} uses link {link} ({topo.link_name(link)}), "
                             "which has failed")
            if k and topo.link_src[link] != topo.link_dst[path[k - 1]]:
                self.fail(i, f"route {route} is not a path: link {path[k - 1]} "
                             f"({topo.link_name(path[k - 1])}) is followed by link {link} "
                             f"({topo.link_name(link)})")

    # -- one step ------------------------------------------------------------------------
    def run_step(self, idx: np.ndarray) -> list[tuple[int, int, str]]:
        """Interpret the ops ``idx`` of one step (in op order, as :meth:`steps` gives them):
        their errors as (op position in the step, rank of the check, message), the lowest
        being the one to report; with none, the step's writes are done."""
        o = self.s.ops
        # the step's ops as a slice where they lie together (ops built in step order): the
        # columns read in place, not gathered (at 16.7M ops 0.1-0.6 s each)
        at = slice(int(idx[0]), int(idx[-1]) + 1) \
            if len(idx) and int(idx[-1]) - int(idx[0]) == len(idx) - 1 else idx
        op_of, slots = _pairs(o.count[at])
        n_pairs = len(op_of)
        sb, db = o.src_buf[at].astype(np.int64), o.dst_buf[at].astype(np.int64)
        ss = slots(self.base[sb] + o.src[at] * self.nc[sb] + o.src_off[at])
        ds = slots(self.base[db] + o.dst[at] * self.nc[db] + o.dst_off[at])
        vals = self.val[ss] + EMPTY
        bits = self.bits[ss] if self.bits is not None else None
        # a run without bits follows each pair's contributor set by number
        moved = self.sid[ss] if self.sets is not None else None
        same: list[tuple[int, int, int]] = []
        # ops whose source and destination chunks differ in size pairwise (a split or merge)
        # are interpreted op by op; everything else chunk by chunk
        if self.flat_layout is not None:
            # shared layouts: the chunk's element count without decoding the slot
            # (one side at a time: the chunk numbers of both at once were the compile's
            # peak at 16.7M pairs)
            odd = self.flat_layout[slots(self.chunk_base[sb] + o.src_off[at])]
            odd = odd != self.flat_layout[slots(self.chunk_base[db] + o.dst_off[at])]
        else:
            odd = self.slot_elems(ss) != self.slot_elems(ds)
        # (a pair's slots are all the rest needs: a one-step alltoall of 16.7M ops holds
        # 0.1 GB per array, and the verifier's step is the compile's peak)
        del sb, db
        # (op position in the step, rank of the check, message): the lowest op wins, and for
        # one op the first check that applies
        errors: list[tuple[int, int, str]] = []
        if odd.any():
            for j in np.unique(op_of[odd]).tolist():
                m = op_of == j
                taken: list[list[int]] | None = None if moved is None else []
                v, b, why = self.regroup(ss[m], ds[m], vals[m],
                                         None if bits is None else bits[m], taken)
                if moved is not None and taken is not None:
                    self.regrouped_sets(moved, same, j, ss[m], np.flatnonzero(m), taken)
                if why is not None:
                    errors.append((j, 0, why))
                    v[:] = 0        # a placeholder, so no second error is reported for it
                vals[m] = v
                if bits is not None:
                    bits[m] = b
        empty = vals == EMPTY
        if empty.any():
            p = int(np.flatnonzero(empty)[0])
            errors.append((int(op_of[p]), 1, (f"reads {self.slot_words(int(ss[p]))}, which is "
                                              "empty (no earlier step wrote it)")))
        # two writes to one slot: the stamp of a slot is overwritten by each writer
        pairs = np.arange(n_pairs, dtype=np.int32)
        self.stamp[ds] = pairs
        lost = self.stamp[ds] != pairs
        if lost.any():
            sub = np.flatnonzero(np.isin(ds, np.unique(ds[lost])))
            sub = sub[np.lexsort((op_of[sub], ds[sub]))]
            # within each doubly written slot (sorted by writer), the second writer violates
            second = np.flatnonzero(ds[sub][1:] == ds[sub][:-1]) + 1
            q = second[np.argmin(op_of[sub][second])]
            later, earlier, slot = int(op_of[sub[q]]), int(op_of[sub[q - 1]]), int(ds[sub[q]])
            errors.append((later, 2, (f"writes {self.slot_words(slot)}, "
                                      f"which op #{int(idx[earlier])}"
                                      " also writes in the same step")))
        red = (o.kind[at] == OpKind.REDUCE)[op_of] & ~empty
        if red.any():
            errors.extend((j, 3, what) for j, what in
                          self.reduce_errors(idx, op_of, ds, vals, bits, red))
        if moved is not None and self.sets is not None:
            reducing = np.flatnonzero(red)
            moved[reducing] = self.sets.add_step(moved[reducing], self.sid[ds[reducing]],
                                                 op_of[reducing], same)
        if errors:
            return errors
        if moved is not None:
            self.sid[ds] = moved
        if bits is not None:                        # bits: kept only when reducing
            assert isinstance(self.bits, np.ndarray), "only a whole run writes its bits"
            if red.any():
                bits[red] |= self.bits[ds[red]]
            self.bits[ds] = bits
        self.val[ds] = vals - EMPTY
        return []

    def regrouped_sets(self, moved: np.ndarray, same: list[tuple[int, int, int]], j: int,
                       ss: np.ndarray, pairs: np.ndarray, taken: list[list[int]]) -> None:
        """Op ``j`` (its ``pairs``, reading slots ``ss``) split or merged chunks: destination
        chunk ``m`` takes the set of its first source chunk of ``taken[m]``, and every other
        one must hold the same set."""
        for m, ks in enumerate(taken):
            if ks:
                first = int(self.sid[ss[ks[0]]])
                moved[pairs[m]] = first
                same.extend((first, int(self.sid[ss[k]]), j) for k in ks[1:])

    def reduce_errors(self, idx, op_of, ds, vals, bits, red) -> list[tuple[int, str]]:
        out = []
        p_red = np.flatnonzero(red)
        old = self.val[ds[p_red]] + EMPTY
        into_empty = old == EMPTY
        if into_empty.any():
            p = int(p_red[np.flatnonzero(into_empty)[0]])
            out.append((int(op_of[p]), (f"reduces into {self.slot_words(int(ds[p]))}, which is "
                                       "empty (a reduction needs data to add to; copy first)")))
        if not self.reducing:
            p = int(p_red[0])
            out.append((int(op_of[p]), (f"is a reduction, but a {self.s.collective.kind.value} "
                                       "only moves data: it has nothing to reduce")))
            return out
        length = self.slot_elems(ds[p_red])
        differ = ~into_empty & (old != vals[p_red])
        if differ.any():
            q = int(np.flatnonzero(differ)[0])
            p = int(p_red[q])
            held = None if self.bits is None else self.bits[ds[p]]
            brought = None if bits is None else bits[p]
            out.append((int(op_of[p]), (f"reduces {self.value_words(vals[p], length[q], brought)}"
                                       f" into {self.slot_words(int(ds[p]))}, which holds "
                                       f"{self.value_words(old[q], length[q], held)}"
                                       ": they are different data")))
        if bits is None or self.bits is None:
            return out      # the contributor sets are checked slice by slice (_verify_sliced)
        twice = ~into_empty & (bits[p_red] & self.bits[ds[p_red]]).any(axis=1)
        if twice.any():
            q = int(np.flatnonzero(twice)[0])
            p = int(p_red[q])
            both = self.contributors(bits[p] & self.bits[ds[p]])
            out.append((int(op_of[p]), (f"adds the contribution of rank(s) {format_ranks(both)} "
                                       f"twice: {self.slot_words(int(ds[p]))} already holds "
                                       f"{self.value_words(old[q], length[q], self.bits[ds[p]])}"
                                       f" and the op brings "
                                       f"{self.value_words(vals[p], length[q], bits[p])}")))
        return out

    def regroup(self, ss: np.ndarray, ds: np.ndarray, vals: np.ndarray,
                bits: np.ndarray | None, taken: list[list[int]] | None = None
                ) -> tuple[np.ndarray, np.ndarray | None, str | None]:
        """Values one op delivers to each destination chunk when chunk sizes differ.

        The op's source chunks form one stream of elements; a destination chunk receives a
        contiguous part of it, which must be one contiguous run of coordinates (and, when
        reducing, of one contributor set) to be a value a slot can hold. Returns the values,
        their contributor sets, and the reason the op is wrong (or None). ``taken`` receives,
        per destination chunk, the source chunks it is made of (a run without bits records
        them, so that the slices can check and move the contributor sets).
        """
        se, de = self.slot_elems(ss), self.slot_elems(ds)
        s_start = np.concatenate([[0], np.cumsum(se)])
        d_start = np.concatenate([[0], np.cumsum(de)])
        out_v = np.full(len(ds), EMPTY, dtype=np.int64)
        out_b = None if bits is None else np.zeros_like(bits)
        for m in range(len(ds)):
            lo, hi = int(d_start[m]), int(d_start[m + 1])
            # source chunks overlapping [lo, hi); for an empty chunk, the one at lo
            ks = [k for k in range(len(ss)) if se[k] and s_start[k] < max(hi, lo + 1)
                  and s_start[k + 1] > lo]
            if taken is not None:
                taken.append(ks)
            if not ks:
                continue
            firsts = set()
            for k in ks:
                if vals[k] == EMPTY:
                    return out_v, out_b, (f"reads {self.slot_words(int(ss[k]))}, which is "
                                          "empty (no earlier step wrote it)")
                firsts.add(int(vals[k]) + lo - int(s_start[k]))
                if bits is not None and not np.array_equal(bits[k], bits[ks[0]]):
                    return out_v, out_b, (
                        f"{self.slot_words(int(ds[m]))} would receive elements with different "
                        f"sets of contributions ({format_ranks(self.contributors(bits[ks[0]]))}"
                        f" and {format_ranks(self.contributors(bits[k]))})")
            if len(firsts) != 1:
                return out_v, out_b, (
                    f"{self.slot_words(int(ds[m]))} would receive pieces of different data "
                    "(the source chunks are not one contiguous run of the collective's data)")
            out_v[m] = firsts.pop()
            if out_b is not None and bits is not None:      # both or neither
                out_b[m] = bits[ks[0]]
        return out_v, out_b, None

    # -- the postcondition ---------------------------------------------------------------
    def output_wanted(self) -> np.ndarray:
        """(rank, output chunk) mask of the chunks the postcondition specifies."""
        elems = self.s.chunk_elems(Buf.OUTPUT)
        return self.map.contract.output_checked[:, None] & (elems > 0)

    def output_bad(self) -> np.ndarray:
        """(rank, output chunk) mask of the chunks that break the postcondition: by value
        and, with the contributor bits, by contributor set."""
        n, nco = self.s.n, int(self.nc[Buf.OUTPUT])
        lo = int(self.base[Buf.OUTPUT])
        got = self.val[lo:lo + n * nco].reshape(n, nco) + EMPTY
        bad = self.output_wanted() & (got != self.map.output_expected)
        if isinstance(self.bits, np.ndarray):
            have = self.bits[lo:lo + n * nco].reshape(n, nco, self.words)
            bad |= self.output_wanted() & (have != all_of(range(n))).any(axis=2)
        return bad

    def check_outputs(self) -> None:
        """Raise unless every output chunk holds what the postcondition says."""
        bad = self.output_bad()
        if bad.any():
            r, c = (int(x) for x in np.argwhere(bad)[0])
            slot = int(self.base[Buf.OUTPUT]) + r * int(self.nc[Buf.OUTPUT]) + c
            self.explain_output(r, c, None if self.bits is None else self.bits[slot])

    def explain_output(self, r: int, c: int, slot_bits: np.ndarray | None) -> None:
        """Raise the error of rank ``r``'s output chunk ``c``, whose contributor set (in a
        reduction) is ``slot_bits``."""
        s, cm = self.s, self.map
        n, nco = s.n, int(self.nc[Buf.OUTPUT])
        slot = int(self.base[Buf.OUTPUT]) + r * nco + c
        got = int(self.val[slot]) + EMPTY
        length = int(s.chunk_elems(Buf.OUTPUT)[r, c])
        pos = int(s.chunk_starts(Buf.OUTPUT)[r, c])
        contract = cm.contract
        name = s.topology.vertex_names[s.collective.group[r]]
        want_bits = all_of(range(n)) if self.reducing else None
        should = self.value_words(cm.output_expected[r, c], length, want_bits)
        held = self.value_words(got, length, slot_bits if self.reducing else None)
        where = f"rank {r} at {name}: output chunk {c} ({contract.output_words(r, pos, length)})"
        if got == EMPTY:
            msg = (f"{where} is empty at the end: no op writes it; it should hold {should}")
        else:
            msg = f"{where} holds {held}; it should hold {should}"
            if self.reducing and slot_bits is not None and got == cm.output_expected[r, c]:
                missing = set(range(n)) - self.contributors(slot_bits)
                msg += f" (missing the contribution of rank(s) {format_ranks(missing)})"
        writer = self.last_writer(slot)
        if writer is not None:
            msg = (f"{msg}\nlast written by {self.op_text(writer)}\n"
                   f"{format_schedule(s, around=writer)}")
        raise ScheduleError(msg)


def _pairs(count: np.ndarray) -> tuple[np.ndarray, Callable[[np.ndarray], np.ndarray]]:
    """The op (position) of every (op, chunk) pair of ops moving ``count`` chunks each, and
    what gives every pair its slot from its op's first: pair ``k`` of an op is its chunk
    ``k``. Where every op moves one chunk (a direct alltoall's 16.7M) the pairs are the ops
    and nothing is repeated."""
    ops = np.arange(len(count))
    if (count == 1).all():
        return ops, lambda first: first
    cnt = count.astype(np.int64)
    k = np.arange(int(cnt.sum())) - np.repeat(np.cumsum(cnt) - cnt, cnt)
    return np.repeat(ops, cnt), lambda first: np.repeat(first, cnt) + k


#: ops :meth:`_Interpreter.static_checks` checks at once
_STATIC_OPS = 1 << 20


# -- a reduction's contributor sets, a slice of contributor ranks at a time --------------------
def _verify_sliced(s: Schedule, width: int | None, cmap: ChunkMap) -> None:
    """:func:`verify`, holding the contributor sets of ``width`` contributor ranks at a time
    (``None``: as many as fit in :data:`SLICE_BYTES`).

    One run of the values alone finds the first error that does not depend on the sets and
    numbers the sets (:mod:`cclc.contributor_sets`). Each slice then makes the unions on its
    own bits, up to
    the first error found so far, and reports its first failing (step, op); the earliest over
    all is the error of the whole run. Its message (which names whole sets) is made by
    gathering, slice by slice, the sets of the failing op's slots, and interpreting that step
    once more with them.
    """
    values = _Interpreter(s, None, cmap)
    first = values.scan()
    log = values.sets
    assert log is not None, "a reduction's run without bits numbers its sets"
    if width is None:
        width = 64 * max(1, SLICE_BYTES // (8 * log.size))
    slices = [range(lo, min(lo + width, s.n)) for lo in range(0, s.n, width)]
    out_bad = None if first is not None else values.output_bad()
    lo, nco = int(values.base[Buf.OUTPUT]), int(values.nc[Buf.OUTPUT])
    out_sets = values.sid[lo:lo + s.n * nco].reshape(s.n, nco)
    # the outputs hold few distinct sets (an AllReduce's n chunks, copied to every rank)
    held = np.zeros(log.size, dtype=bool)
    held[out_sets] = True
    held_sets = np.flatnonzero(held)
    lacking = np.zeros(log.size, dtype=bool)        # a set missing a contributor
    reach = slice_reach(log, slices)
    for i, contrib in enumerate(slices):
        table = initial_sets(log, contrib)
        found = make_unions(log, table, first, reach, i)
        if found is not None and (first is None or found < first):
            first, out_bad = found, None
        if first is None:
            lacking[held_sets] |= (table[held_sets] != all_of(contrib)).any(axis=1)
    if first is None:
        assert out_bad is not None, "a run without errors checks its outputs"
        out_bad |= values.output_wanted() & lacking[out_sets]
        if not out_bad.any():
            return
        r, c = (int(x) for x in np.argwhere(out_bad)[0])
        whole = gather_sets(log, slices, len(log.start), np.array([out_sets[r, c]]))
        values.explain_output(r, c, whole[0])
        return
    t, j = first
    if j < 0:
        static = values.first_static()
        assert static is not None, "a static fault was found"
        values.explain_static(static)
    # the failing step once more, with the whole sets of the failing op's slots
    steps = values.steps()
    rerun = _Interpreter(s, None, values.map)
    for before in steps[:t]:
        assert not rerun.run_step(before), "the steps before the first error have none"
    i = int(steps[t][j])
    slots = np.unique(np.concatenate([_op_slots(values, i, "src"), _op_slots(values, i, "dst")]))
    rerun.bits = _Rows(slots, gather_sets(log, slices, t, rerun.sid[slots]))
    rerun.sets = None
    errors = rerun.run_step(steps[t][:j + 1])
    assert errors and min(errors)[0] == j, "the slices found an error in this op"
    rerun.fail(i, min(errors)[2])


def _op_slots(interp: _Interpreter, i: int, end: str) -> np.ndarray:
    """The slots op ``i`` reads (``end`` "src") or writes ("dst")."""
    o = interp.s.ops
    rank, buf, off = (getattr(o, end)[i], int(getattr(o, f"{end}_buf")[i]),
                      int(getattr(o, f"{end}_off")[i]))
    start = int(interp.base[buf]) + int(rank) * int(interp.nc[buf]) + off
    return np.arange(start, start + int(o.count[i]), dtype=np.int64)
