"""Lowering a :class:`~cclc.algorithms.torus_alltoall.strategies.Layout` into a schedule.

**Slots.** A rank holds, for one piece of the data, ``n`` *slots* indexed by torus coordinates
``j`` (row-major). Before any phase slot ``j`` holds the block for destination ``j``; a phase on
``d`` sends the slots with ``j_d = c`` to the ring member at coordinate ``c``, which stores them
at ``j_d := x``, the sender's coordinate. After the last phase slot ``j`` holds the block *from*
origin ``j``, which is exactly the output order.

**Buffers.** Input chunk ``(t, p, l)`` = ``t P L + p L + l`` (block ``t``, by group index, cut
into pieces and lanes); output the same with the origin. Scratch holds, per piece, one region
of ``n`` slots per intermediate phase result and one transit region per phase (blocks waiting
at an intermediate ring member, indexed by segment, destination coordinate and slot), both
lane-major so that an aggregated block is contiguous. Regions are never reused by another
phase, so a non-uniform alltoall (per-rank 2-D layouts) gets a consistent size for every chunk.

Ops are generated as whole numpy columns per phase (every ring of a group, every segment of a
plan and every slot of an aggregated block at once) and coalesced into runs of consecutive
chunks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from cclc.algorithms.common import torus_link_table
from cclc.algorithms.torus_alltoall.faults import torus_dims
from cclc.algorithms.torus_alltoall.ring_plans import RING, RingPlan
from cclc.algorithms.torus_alltoall.strategies import Group, Layout
from cclc.collective import Collective
from cclc.errors import CollectiveError, ScheduleError
from cclc.ir import Buf, Schedule, ScheduleBuilder

__all__ = ["lower_layout", "resized", "single_rank", "split_chunks"]

_ROW_KEYS = ("step", "src", "dst", "route", "src_buf", "src_off", "dst_buf", "dst_off")


def split_chunks(elems: np.ndarray, pieces: int, weights: np.ndarray) -> np.ndarray:
    """Cut every block of ``elems`` elements into ``pieces`` x lanes integer chunks
    (shape ``elems.shape + (pieces, L)``; largest remainder first)."""
    e = np.asarray(elems, dtype=np.int64)[..., None]
    p = np.arange(pieces)
    per_piece = e // pieces + (p < e % pieces)                    # (..., P)
    cw = np.concatenate([[0.0], np.cumsum(weights)])
    cw[-1] = 1.0
    edges = np.floor(per_piece[..., None] * cw + 0.5).astype(np.int64)
    return np.diff(edges, axis=-1)


@dataclass(frozen=True)
class _Geometry:
    """Chunk numbering of one build (see the module docstring)."""

    n: int
    lanes: int
    pieces: int
    n_phases: int
    transit: int               # chunks of one phase's transit region
    gidx: np.ndarray           # global rank -> group index

    @property
    def region(self) -> int:
        return self.n * self.lanes

    @property
    def per_piece(self) -> int:
        return (self.n_phases - 1) * self.region + self.n_phases * self.transit

    def io_chunk(self, piece: int, s, lane: int):
        """Input or output chunk of block ``s`` (a global rank), piece and lane."""
        return self.gidx[s] * (self.pieces * self.lanes) + piece * self.lanes + lane


@dataclass(frozen=True)
class _Side:
    """Where a phase reads or writes slots: the input or output, or a scratch region."""

    buf: Buf
    piece: int
    base: int | None = None    # first chunk of the scratch region

    def chunk(self, geo: _Geometry, s, lane: int):
        if self.base is None:
            return geo.io_chunk(self.piece, s, lane)
        return self.base + lane * geo.n + s


@dataclass(frozen=True)
class _Phase:
    """One phase of one piece: dimension ``d`` from step ``start``."""

    d: int
    start: int
    N: int
    stride: int                # of dimension d in the slot index
    block: np.ndarray          # the m slots with j_d = 0
    read: _Side
    write: _Side
    transit_base: int

    def transit_chunk(self, geo: _Geometry, h, c, w, lane: int):
        """Transit chunk of slot ``w`` of the block for coordinate ``c`` after segment ``h``."""
        m = len(self.block)
        return self.transit_base + lane * (geo.transit // geo.lanes) + (h * self.N + c) * m + w


def _phase(geo: _Geometry, dims: tuple[int, ...], p: int, i: int, last: bool, d: int,
           start: int) -> _Phase:
    """Phase ``i`` of piece ``p``: it reads the input (first) or the previous phase's region
    and writes the output (``last``) or its own region."""
    base = p * geo.per_piece
    read = (_Side(Buf.INPUT, p) if i == 0
            else _Side(Buf.SCRATCH, p, base + (i - 1) * geo.region))
    write = (_Side(Buf.OUTPUT, p) if last
             else _Side(Buf.SCRATCH, p, base + i * geo.region))
    slots = np.arange(geo.n).reshape(dims)
    return _Phase(d=d, start=start, N=dims[d], stride=math.prod(dims[d + 1:]),
                  block=np.take(slots, 0, axis=d).ravel(), read=read, write=write,
                  transit_base=base + (geo.n_phases - 1) * geo.region + i * geo.transit)


class _Rows:
    """Op rows of one batch (count 1 each), coalesced into runs at the end.

    Every :meth:`add` is a block of rows given as arrays that broadcast to one shape; the
    blocks are written once, straight into preallocated int32 columns (every value is an op
    field, which the IR keeps in 32 bits), instead of being expanded and then concatenated.
    """

    def __init__(self, keys: tuple[str, ...]) -> None:
        self.keys = keys
        self.blocks: list[tuple[tuple[int, ...], dict[str, np.ndarray]]] = []

    def add(self, **kw) -> None:
        shape = np.broadcast_shapes(*[np.shape(kw[k]) for k in self.keys])
        self.blocks.append((shape, {k: np.asarray(kw[k]) for k in self.keys}))

    def arrays(self) -> dict[str, np.ndarray]:
        total = sum(math.prod(shape) for shape, _ in self.blocks)
        out = {k: np.empty(total, dtype=np.int32) for k in self.keys}
        pos = 0
        for shape, cols in self.blocks:
            size = math.prod(shape)
            for k, v in cols.items():
                out[k][pos:pos + size].reshape(shape)[...] = v
            pos += size
        return out


#: the columns that must agree for two rows to merge, in the order runs are sorted by
_RUN_KEYS = ("step", "src", "dst", "route", "src_buf", "dst_buf")


def _packed_key(cols: list[np.ndarray]) -> np.ndarray | None:
    """One int64 per row that sorts like the rows of ``cols`` compared column by column (a
    mixed-radix number over each column's range), or None when it would not fit in 62 bits.

    The last column gets one spare digit value, so that ``key + 1`` is the same row with that
    column plus one and never carries into the others.
    """
    lows = [int(c.min()) for c in cols]
    ranges = [int(c.max()) - lo + 1 for c, lo in zip(cols, lows, strict=True)]
    ranges[-1] += 1
    if math.prod(ranges) >= 1 << 62:
        return None
    key = np.zeros(len(cols[0]), dtype=np.int64)
    for c, lo, r in zip(cols, lows, ranges, strict=True):
        key *= r
        key += c
        key -= lo
    return key


def _coalesce(a: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Merge rows that continue each other (next chunk on both sides, same everything else).

    Rows are sorted by :data:`_RUN_KEYS` then ``src_off`` (stable), and a run is a stretch of
    consecutive rows whose ``src_off`` and ``dst_off`` both grow by one; every run becomes its
    first row with ``count`` = its length.
    """
    n = len(a["step"])
    if not n:
        return {**a, "count": np.zeros(0, dtype=np.int64)}
    key = _packed_key([a[k] for k in _RUN_KEYS] + [a["src_off"]])
    if key is None:
        # ranges too wide to pack: the same order by sorting on every column
        order = np.lexsort((a["src_off"],) + tuple(a[k] for k in reversed(_RUN_KEYS)))
        key = _packed_rank(a, order)
    else:
        order = np.argsort(key, kind="stable")
        key = key[order]
    dst_off = a["dst_off"][order]
    same = np.zeros(n, dtype=bool)
    same[1:] = (key[1:] == key[:-1] + 1) & (dst_off[1:] == dst_off[:-1] + 1)
    starts = np.flatnonzero(~same)
    rows = order[starts]
    out = {k: v[rows] for k, v in a.items()}
    out["count"] = np.diff(np.append(starts, n))
    return out


def _packed_rank(a: dict[str, np.ndarray], order: np.ndarray) -> np.ndarray:
    """For rows in ``order``: a number that grows by exactly one from a row to the next when
    the next has the same :data:`_RUN_KEYS` and the next ``src_off`` (as :func:`_packed_key`),
    built from the sorted rows when the columns cannot be packed."""
    s = {k: a[k][order] for k in (*_RUN_KEYS, "src_off")}
    new_group = np.ones(len(order), dtype=bool)
    new_group[1:] = False
    for k in _RUN_KEYS:
        new_group[1:] |= s[k][1:] != s[k][:-1]
    # groups far apart (a gap of 2 beyond any offset step) so that only same-group rows chain
    gap = int(s["src_off"].max()) - int(s["src_off"].min()) + 2
    return np.cumsum(new_group).astype(np.int64) * gap + s["src_off"]


class _RouteTable:
    """Route ids of the builder: one single-link route per healthy link (a failed link gets
    none, so no op can name it) and, per ring group and plan, the routes of every segment."""

    def __init__(self, b: ScheduleBuilder, topo) -> None:
        self.b = b
        self.topo = topo
        self.table = torus_link_table(topo)
        self.link_dst = topo.link_dst.astype(np.int64)
        healthy = np.flatnonzero(~topo.link_failed)
        self.single = np.full(topo.n_links, -1, dtype=np.int64)
        self.single[healthy] = b.add_routes(np.arange(len(healthy) + 1), healthy)
        self._cache: dict[tuple[int, int, int], np.ndarray] = {}

    def for_plan(self, d: int, gi: int, grp: Group, plan: RingPlan) -> np.ndarray:
        """``route[g_local, segment]`` for ``plan`` on every ring of group ``gi`` of ``d``."""
        key = (d, gi, id(plan))
        if key not in self._cache:
            self._cache[key] = self._routes(d, grp, plan)
        return self._cache[key]

    def _links(self, d: int, plan: RingPlan, start: np.ndarray, pid: int) -> list[np.ndarray]:
        """The links of path ``pid`` from every rank of ``start``."""
        r = start
        links = []
        for axis, direction in plan.paths[pid]:
            ax = d if axis == RING else axis
            link = self.table[r, ax, direction].astype(np.int64)
            if (link < 0).any() or self.topo.link_failed[np.maximum(link, 0)].any():
                raise ScheduleError(f"internal: plan '{plan.name}' on dimension {d} uses a "
                                    "missing or failed link")
            links.append(link)
            r = self.link_dst[link]
        return links

    def _routes(self, d: int, grp: Group, plan: RingPlan) -> np.ndarray:
        out = np.zeros((len(grp.rings), len(plan.src)), dtype=np.int64)
        keys = np.unique(np.stack([plan.src, plan.path], axis=1), axis=0)
        for src, pid in keys.tolist():
            links = self._links(d, plan, grp.rings[:, src].astype(np.int64), pid)
            if len(links) == 1:
                ids = self.single[links[0]]
            else:
                path = np.stack(links, axis=1)
                off = np.arange(len(links[0]) + 1) * len(links)
                ids = self.b.add_routes(off, path.ravel())
            sel = (plan.src == src) & (plan.path == pid)
            out[:, sel] = np.asarray(ids)[:, None]
        return out


def _self_rows(rows: _Rows, geo: _Geometry, ph: _Phase, grp: Group) -> None:
    """A rank's own blocks stay in their slot: a local copy into the next region."""
    G = len(grp.rings)
    m = len(ph.block)
    x = np.arange(ph.N)
    s_self = ph.block[None, :] + (x * ph.stride)[:, None]       # (N, m)
    rk = grp.rings[:, :, None]                                   # (G, N, 1)
    ss = np.broadcast_to(s_self[None], (G, ph.N, m))
    for lane in range(geo.lanes):
        rows.add(step=ph.start, src=rk, dst=rk, route=0, src_buf=ph.read.buf,
                 src_off=ph.read.chunk(geo, ss, lane), dst_buf=ph.write.buf,
                 dst_off=ph.write.chunk(geo, ss, lane), hop=0)


def _plan_rows(rows: _Rows, geo: _Geometry, ph: _Phase, grp: Group, routes: np.ndarray,
               lane: int, plan: RingPlan, offset: int, w_lo: int, w_hi: int) -> None:
    """Every segment of ``plan`` on every ring of the group, for slots ``[w_lo, w_hi)`` of
    every aggregated block: axes (segment, ring, slot)."""
    S, G = len(plan.src), len(grp.rings)
    sh = (S, G, w_hi - w_lo)
    seg = np.arange(S)[:, None, None]
    c = plan.dest[seg]
    xo = plan.origin[seg]
    w = np.arange(w_lo, w_hi)[None, None, :]
    s = ph.block[w] + c * ph.stride
    hop = plan.hop[seg]
    first = hop == 0
    final = plan.final[seg]
    read_buf = np.where(first, int(ph.read.buf), int(Buf.SCRATCH))
    read_off = np.where(first, ph.read.chunk(geo, s, lane),
                        ph.transit_chunk(geo, hop - 1, c, w, lane))
    write_buf = np.where(final, int(ph.write.buf), int(Buf.SCRATCH))
    write_off = np.where(final, ph.write.chunk(geo, s + (xo - c) * ph.stride, lane),
                         ph.transit_chunk(geo, hop, c, w, lane))
    rows.add(step=np.broadcast_to(ph.start + offset + plan.stage[seg], sh),
             src=np.broadcast_to(grp.rings[:, plan.src].T[:, :, None], sh),
             dst=np.broadcast_to(grp.rings[:, plan.dst].T[:, :, None], sh),
             route=np.broadcast_to(routes.T[:, :, None], sh),
             src_buf=np.broadcast_to(read_buf, sh), src_off=np.broadcast_to(read_off, sh),
             dst_buf=np.broadcast_to(write_buf, sh), dst_off=np.broadcast_to(write_off, sh),
             hop=np.broadcast_to(hop, sh))


def _phase_rows(geo: _Geometry, ph: _Phase, groups: list[Group], routes: _RouteTable,
                with_hop: bool) -> dict[str, np.ndarray]:
    """The uncoalesced rows of one phase: every group, lane and plan use (``with_hop``: also
    the segment's index in its journey, which non-uniform sizes follow)."""
    rows = _Rows(_ROW_KEYS + (("hop",) if with_hop else ()))
    m = len(ph.block)
    for gi, grp in enumerate(groups):
        _self_rows(rows, geo, ph, grp)
        for lane, uses in enumerate(grp.uses):
            for use in uses:
                w_lo, w_hi = round(use.lo * m), round(use.hi * m)
                if w_hi > w_lo:
                    _plan_rows(rows, geo, ph, grp, routes.for_plan(ph.d, gi, grp, use.plan),
                               lane, use.plan, use.offset, w_lo, w_hi)
    return rows.arrays()


def _merge_by_step(batches: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The rows of all batches (each sorted by step) in the order of a stable sort by step of
    their concatenation: per step, batch after batch. Each batch's rows of one step are
    contiguous, so each such stretch is one slice copy, to the step's start in the result plus
    the rows of that step in earlier batches."""
    keys = [k for k in batches[0] if k != "hop"]
    # _coalesce sorts by step first, so a batch's last row has its last step
    n_steps = max((int(b["step"][-1]) + 1 for b in batches if len(b["step"])), default=0)
    if not n_steps:
        return {k: np.zeros(0, dtype=np.int32) for k in keys}
    counts = np.array([np.bincount(b["step"], minlength=n_steps) for b in batches])   # (B, T)
    # start of (batch, step) in the result: step-major, then batch
    place = (np.cumsum(counts.T.ravel()) - counts.T.ravel()).reshape(n_steps, -1).T
    first = np.cumsum(counts, axis=1) - counts       # start of (batch, step) in its batch
    out = {k: np.empty(int(counts.sum()), dtype=np.int32) for k in keys}
    for bi, t in zip(*np.nonzero(counts), strict=True):
        n, dst, src = counts[bi, t], place[bi, t], first[bi, t]
        for k in keys:
            out[k][dst:dst + n] = batches[bi][k][src:src + n]
    return out


def _carry_sizes(rows: dict[str, np.ndarray], sz: dict[Buf, np.ndarray]) -> None:
    """Non-uniform sizes flow with the data: every write takes the size of what it reads
    (hop by hop, so a transit chunk is sized before it is read)."""
    for h in range(int(rows["hop"].max()) + 1 if len(rows["hop"]) else 0):
        sel = rows["hop"] == h
        val = np.zeros(int(sel.sum()), dtype=np.int64)
        for buf in Buf:
            mk = rows["src_buf"][sel] == buf
            val[mk] = sz[buf][rows["src"][sel][mk], rows["src_off"][sel][mk]]
        for buf in (Buf.SCRATCH, Buf.OUTPUT):
            mk = rows["dst_buf"][sel] == buf
            tgt = (rows["dst"][sel][mk], rows["dst_off"][sel][mk])
            if buf is Buf.OUTPUT:
                if (sz[buf][tgt] != val[mk]).any():
                    raise ScheduleError("internal: a block reaches the wrong output slot")
            else:
                sz[buf][tgt] = val[mk]


def _geometry(coll: Collective, lay: Layout) -> _Geometry:
    n = math.prod(torus_dims(coll.topology))
    L = len(lay.lane_weights)
    max_hops = max([u.plan.max_hops for gs in lay.groups.values() for g in gs
                    for lane in g.uses for u in lane] + [1])
    group = np.asarray(coll.group, dtype=np.int64)
    gidx = np.empty(n, dtype=np.int64)
    gidx[group] = np.arange(n)
    return _Geometry(n=n, lanes=L, pieces=lay.pieces,
                     n_phases=max(len(ph) for ph in lay.phases),
                     transit=max(max_hops - 1, 0) * n * L, gidx=gidx)


def _nonuniform_sizes(pair_sizes: np.ndarray, itemsize: int, lay: Layout, geo: _Geometry
                      ) -> dict[Buf, np.ndarray]:
    """Chunk sizes by global rank (the ops name global ranks until the end); scratch is sized
    as the data flows into it."""
    n, PL = geo.n, geo.pieces * geo.lanes
    elems = np.asarray(pair_sizes) // itemsize
    chunks_in = split_chunks(elems, geo.pieces, lay.lane_weights).reshape(n, n * PL)[geo.gidx]
    chunks_out = split_chunks(elems.T, geo.pieces, lay.lane_weights).reshape(n, n * PL)[geo.gidx]
    scratch = np.zeros((n, geo.pieces * geo.per_piece), dtype=np.int64)
    return {Buf.INPUT: chunks_in, Buf.OUTPUT: chunks_out, Buf.SCRATCH: scratch}


def lower_layout(coll: Collective, lay: Layout, algorithm: str, schedule: str,
                 sizes: list[int] | None = None) -> list[Schedule]:
    """Lower a layout into schedules (one per entry of ``sizes``, sharing the ops)."""
    dims = torus_dims(coll.topology)
    geo = _geometry(coll, lay)
    b = ScheduleBuilder(coll, input=[0], output=[0])
    routes = _RouteTable(b, coll.topology)
    sz = (None if coll.pair_sizes is None
          else _nonuniform_sizes(coll.pair_sizes, coll.dtype.itemsize, lay, geo))
    batches: list[dict[str, np.ndarray]] = []
    for p in range(geo.pieces):
        phases = lay.phases[p]
        for i, (d, start) in enumerate(phases):
            ph = _phase(geo, dims, p, i, i == len(phases) - 1, d, start)
            rows = _phase_rows(geo, ph, lay.groups[d], routes, with_hop=sz is not None)
            if sz is not None:
                _carry_sizes(rows, sz)
            batches.append(_coalesce(rows))
            del rows
    cols = _merge_by_step(batches)
    del batches
    b.add(step=cols["step"], src=geo.gidx[cols["src"]], dst=geo.gidx[cols["dst"]],
          route=cols["route"], src_buf=cols["src_buf"], src_off=cols["src_off"],
          dst_buf=cols["dst_buf"], dst_off=cols["dst_off"], count=cols["count"])
    return _schedules(b, coll, lay, geo, sizes or [coll.size], sz, algorithm, schedule)


def _schedules(b: ScheduleBuilder, coll: Collective, lay: Layout, geo: _Geometry,
               sizes: list[int], sz: dict[Buf, np.ndarray] | None, algorithm: str,
               schedule: str) -> list[Schedule]:
    """One schedule per size: the same ops, the chunk layouts of that size."""
    group = np.asarray(coll.group, dtype=np.int64)
    out: list[Schedule] = []
    for size in sizes:
        if sz is not None:
            parts = (sz[Buf.INPUT][group], sz[Buf.OUTPUT][group], sz[Buf.SCRATCH][group])
            c = coll
        else:
            c = coll if size == coll.size else resized(coll, size)
            e = split_chunks(np.array([c.count // geo.n]), geo.pieces,
                             lay.lane_weights).reshape(geo.pieces, geo.lanes)
            parts = (np.tile(e.ravel(), geo.n), np.tile(e.ravel(), geo.n),
                     _scratch_layout(e, geo))
        inp, outp, scratch = (np.asarray(x, dtype=np.int64) for x in parts)
        layouts = (inp, outp, scratch)
        if not out:
            b.collective, b.layouts = c, layouts
            out.append(b.build(algorithm, schedule, lay.params))
        else:
            out.append(out[0].replace(collective=c, layouts=layouts))
    return out


def _scratch_layout(e: np.ndarray, geo: _Geometry) -> np.ndarray:
    """Uniform scratch: per piece, each region and transit area is lane-major."""
    parts = []
    for p in range(e.shape[0]):
        parts += [np.repeat(e[p], geo.n)] * (geo.n_phases - 1)
        parts += [np.repeat(e[p], geo.transit // geo.lanes)] * geo.n_phases
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def resized(coll: Collective, size: int) -> Collective:
    """``coll`` with another size (uniform alltoall)."""
    unit = coll.n * coll.dtype.itemsize
    if size <= 0 or size % unit:
        raise CollectiveError(f"size {size} B cannot be split evenly over {coll.n} ranks x "
                              f"{coll.dtype.itemsize} B: it must be a multiple of {unit} B")
    return replace(coll, size=int(size))


def single_rank(coll: Collective, sizes: list[int], algorithm: str, schedule: str
                ) -> list[Schedule]:
    """A torus of one rank: its block stays put."""
    out = []
    for size in sizes:
        c = coll if size == coll.size else resized(coll, size)
        e = c.pair_sizes // c.dtype.itemsize if c.pair_sizes is not None else [c.count]
        b = ScheduleBuilder(c, input=np.ravel(e), output=np.ravel(e))
        b.add(step=0, src=0, dst=0, src_buf=Buf.INPUT, src_off=0, dst_buf=Buf.OUTPUT, dst_off=0)
        out.append(b.build(algorithm, schedule))
    return out
