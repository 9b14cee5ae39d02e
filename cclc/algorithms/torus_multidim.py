"""Multi-dimensional torus AllToAll: per-ring algorithms composed by Pipeline, DimRotation, MATE.

Data for destination ``t`` travels dimension by dimension. A *phase* on dimension ``d`` is a
per-ring all-to-all among the ranks of every ring of ``d`` (see
:mod:`cclc.algorithms.torus_ring`) in which a rank's blocks are aggregated by the destination's
coordinate in ``d``. Every rank keeps the same amount of data in every phase.

**Slots.** A rank holds, for one piece of the data, ``n`` *slots* indexed by torus coordinates
``j`` (row-major). Before any phase slot ``j`` holds the block for destination ``j``; a phase on
``d`` sends the slots with ``j_d = c`` to the ring member at coordinate ``c``, which stores them
at ``j_d := x``, the sender's coordinate. After the last phase slot ``j`` holds the block *from*
origin ``j``, which is exactly the output order. Each slot is cut into *pieces* (the chunks of
Pipeline, DimRotation's ``D`` pieces) and *lanes* (fractions of a piece that take different
paths: the two directions of the Ring baseline and of an even ring's antipode, MATE's exact
shares).

**Buffers.** Input chunk ``(t, p, l)`` = ``t P L + p L + l`` (block ``t``, by group index, cut
into pieces and lanes); output the same with the origin. Scratch holds, per piece, one region
of ``n`` slots per intermediate phase result and one transit region per phase (blocks waiting
at an intermediate ring member, indexed by segment, destination coordinate and slot), both
lane-major so that an aggregated block is contiguous. Regions are never reused by another
phase, so a non-uniform alltoall (per-rank 2-D layouts) gets a consistent size for every chunk.
Ops are generated per chunk and coalesced into runs of consecutive chunks.

**Schedules** (``K`` pieces, ``D`` dimensions of size > 1; ``T(x)`` = one phase of ``x`` data):

* ``pipeline`` -- ``K`` pieces (``chunks=``, default 6), all in one dimension ``order=``
  (default ascending, e.g. ``order="210"``); at pipeline stage ``t`` piece ``k`` runs phase
  ``t - k``: ``(K + D - 1) T(S/K)``.
* ``dimrotation`` -- ``D`` pieces, piece ``c`` visits dimensions ``c, c+1, ...``: at every stage
  every dimension carries one piece: ``D T(S/D) = T(S)``.
* ``mate`` / ``matee`` -- DimRotation on a torus with one failed link. Each stage has a normal
  part (healthy rings: HalfRing; the faulty ring idles in its dimension, or for ``matee`` moves
  a share ``f = T_HR / T_FR`` by FoldedRing) and an acceleration part, in which the faulty
  ring's remaining data moves over 3-link detours through the parallel rings one step away in
  every other dimension (one lane per neighbour ring, a HalfRing over the virtual ring of
  detours) plus a share by FoldedRing on its own surviving links. The shares make every lane
  finish together: a lane's share is proportional to ``1 / (time per unit)`` of its plan,
  measured on the actual links (``rho="derived"``: gives ``rho = T_HR/T_FR = (N+1)/(4N)`` for
  odd ``N``, ``N/(4(N-1))`` for even ``N``). ``rho="artifact"`` reproduces the paper artifact's
  accelerating divisor (``HalfRing.cc``), which swaps the two formulas; ``rho="lockstep"``
  solves a small LP for the shares that minimize the lockstep time; a number sets ``rho``.
  ``shares="lanes"`` cuts every chunk into one lane per share (exact); ``shares="slots"`` gives
  each share a range of whole slots of every aggregated block (``1/m`` precision, but the op
  count of plain DimRotation); ``auto`` picks lanes while the torus is small.

Stage lengths are the longest ring plan of the stage, so the lockstep simulation charges a
stage for its slowest ring; in a schedule every op is a single-link hop of a ring, except
FoldedRing's logical edges (routes of 1-2 links) and MATE's detours (routes of 3 links).

Sizes: blocks are cut into pieces and lanes with integer elements (largest remainder first), so
any size works; pieces of one block differ by at most one element, lanes by rounding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from cclc.algorithms import Algorithm, register
from cclc.algorithms.common import hint_int, torus_link_table
from cclc.algorithms.torus_ring import (
    MINUS,
    PLUS,
    RING,
    RingPlan,
    detour_plan,
    folded_plan,
    halfring_plan,
    line_plan,
    ring_plan,
)
from cclc.collective import Collective, CollectiveKind
from cclc.errors import CollectiveError, ScheduleError
from cclc.ir import Buf, Schedule, ScheduleBuilder

__all__ = [
    "ALGORITHMS",
    "SCHEDULES",
    "TorusFaults",
    "build_for_sizes",
    "build_torus_alltoall",
    "torus_faults",
]

ALGORITHMS = ("ring", "halfring", "foldedring", "line")
SCHEDULES = ("pipeline", "dimrotation")
_KINDS = frozenset({CollectiveKind.ALLTOALL})


# --------------------------------------------------------------------------------------------
# faults: which rings are broken where


@dataclass(frozen=True)
class TorusFaults:
    """Failed links of a torus, per ring: ``broken[d]`` maps ring index -> failed edges.

    An edge ``q`` of a ring is the link pair between positions ``q`` and ``q+1``; it counts as
    failed when either direction failed. ``rings[d]`` is the ``(R, N)`` array of global ranks of
    every ring of dimension ``d`` (ring index = row).
    """

    dims: tuple[int, ...]
    wrap: tuple[bool, ...]
    rings: tuple[np.ndarray, ...]
    broken: tuple[dict[int, tuple[int, ...]], ...]

    @property
    def n_broken(self) -> int:
        return sum(len(b) for b in self.broken)

    def describe_ring(self, topo, d: int, g: int) -> str:
        r = self.rings[d][g]
        return f"the dimension-{d} ring {topo.vertex_names[r[0]]}..{topo.vertex_names[r[-1]]}"


#: most pieces a pipeline(chunks=K) schedule takes
MAX_PIPELINE_CHUNKS = 64


def _rings(dims: tuple[int, ...], d: int) -> np.ndarray:
    idx = np.arange(math.prod(dims)).reshape(dims)
    return np.moveaxis(idx, d, -1).reshape(-1, dims[d])


def torus_faults(topo) -> TorusFaults:
    """Collect the failed links of a torus ring by ring."""
    dims = tuple(topo.dims)
    table = torus_link_table(topo)
    failed = topo.link_failed
    rings, broken = [], []
    for d, size in enumerate(dims):
        r = _rings(dims, d)
        rings.append(r)
        out: dict[int, tuple[int, ...]] = {}
        if size > 1 and failed.any():
            plus = table[r, d, PLUS]            # (R, N): link pos -> pos+1 (-1 if none)
            minus = np.roll(table[r, d, MINUS], -1, axis=1)   # link pos+1 -> pos
            bad = np.zeros(r.shape, dtype=bool)
            for links in (plus, minus):
                ok = links >= 0
                bad[ok] |= failed[links[ok]]
            if size == 2:
                bad[:, 1] = False               # one link pair only: edge 0 is the whole ring
                two = table[r[:, 1], d, PLUS]
                bad[:, 0] |= (two >= 0) & failed[np.maximum(two, 0)]
            for g in np.flatnonzero(bad.any(axis=1)).tolist():
                out[g] = tuple(np.flatnonzero(bad[g]).tolist())
        broken.append(out)
    return TorusFaults(dims=dims, wrap=tuple(topo.wrap), rings=tuple(rings),
                       broken=tuple(broken))


def _torus_reason(coll: Collective, what: str) -> str | None:
    """Why no dimension-by-dimension torus schedule serves ``coll`` at all, or None."""
    topo = coll.topology
    if coll.kind is not CollectiveKind.ALLTOALL:
        return f"{what} serves alltoall only, not {coll.kind.value}"
    if topo.kind != "torus" or topo.dims is None:
        return f"{what} needs a torus or mesh; '{topo.name}' is a {topo.kind}"
    if topo.failed_ranks:
        dead = ", ".join(topo.vertex_names[r] for r in sorted(topo.failed_ranks))
        return (f"rank {dead} has failed: the collective runs on the {coll.n} surviving ranks, "
                f"which are not a full torus, and {what} needs every ring whole; 'direct' "
                f"serves the surviving group")
    # any order of the whole torus is fine: blocks are placed by group index
    if sorted(coll.group) != list(range(topo.n_ranks)):
        return (f"{what} needs the group to be the whole torus ({topo.n_ranks} ranks), not "
                f"{coll.n} of them; 'direct' serves any group")
    f = torus_faults(topo)
    for d in range(len(f.dims)):
        for g, edges in f.broken[d].items():
            if len(edges) > 1 or (not f.wrap[d] and edges):
                what_failed = (f"{len(edges)} failed links" if f.wrap[d]
                               else "a failed link on a mesh dimension")
                return (f"{f.describe_ring(topo, d, g)} has {what_failed}: it falls apart into "
                        f"pieces that no ring schedule can join; 'direct' routes around the "
                        f"failures")
            if f.dims[d] == 2 and edges:
                return (f"{f.describe_ring(topo, d, g)} (2 ranks) has lost its only link; "
                        f"'direct' routes around it")
    return None


# --------------------------------------------------------------------------------------------
# the engine


@dataclass
class _Group:
    """Rings of one dimension that run the same plans.

    ``uses[l]`` lists what lane ``l`` does: ``(plan, stage offset, lo, hi)``, the plan moving
    the slots ``[lo m, hi m)`` of every aggregated block (``m`` slots; MATE's slot shares cut a
    block into parts that take different plans, everything else uses ``0, 1``).
    """

    rings: np.ndarray
    uses: list[list[tuple[RingPlan, int, float, float]]]


@dataclass
class _Layout:
    """What a strategy decides: lanes, pieces, per-piece phases and per-dimension groups."""

    lane_weights: np.ndarray
    pieces: int
    phases: list[list[tuple[int, int]]]           # per piece: (dim, start step)
    groups: dict[int, list[_Group]]               # per dim
    params: list[tuple[str, int | float | str]] = field(default_factory=list)


def _split(elems: np.ndarray, pieces: int, weights: np.ndarray) -> np.ndarray:
    """Cut every block of ``elems`` elements into ``pieces`` x lanes integer chunks
    (shape ``elems.shape + (pieces, L)``)."""
    e = np.asarray(elems, dtype=np.int64)[..., None]
    p = np.arange(pieces)
    per_piece = e // pieces + (p < e % pieces)                    # (..., P)
    cw = np.concatenate([[0.0], np.cumsum(weights)])
    cw[-1] = 1.0
    edges = np.floor(per_piece[..., None] * cw + 0.5).astype(np.int64)
    return np.diff(edges, axis=-1)


class _Ops:
    """Op rows of one batch (count 1 each), coalesced into runs at the end."""

    def __init__(self) -> None:
        self.cols: dict[str, list[np.ndarray]] = {k: [] for k in
                                                  ("step", "src", "dst", "route", "src_buf",
                                                   "src_off", "dst_buf", "dst_off", "hop")}

    def add(self, **kw) -> None:
        arrays = np.broadcast_arrays(*[np.asarray(v, dtype=np.int64) for v in kw.values()])
        for k, a in zip(kw, arrays):
            self.cols[k].append(a.ravel())

    def arrays(self) -> dict[str, np.ndarray]:
        return {k: (np.concatenate(v) if v else np.zeros(0, dtype=np.int64))
                for k, v in self.cols.items()}


def _coalesce(a: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Merge rows that continue each other (next chunk on both sides, same everything else)."""
    if not len(a["step"]):
        return {**a, "count": np.zeros(0, dtype=np.int64)}
    keys = ("step", "src", "dst", "route", "src_buf", "dst_buf")
    order = np.lexsort((a["src_off"],) + tuple(a[k] for k in reversed(keys)))
    s = {k: v[order] for k, v in a.items()}
    same = np.ones(len(order), dtype=bool)
    same[0] = False
    for k in keys:
        same[1:] &= s[k][1:] == s[k][:-1]
    same[1:] &= (s["src_off"][1:] == s["src_off"][:-1] + 1) & \
                (s["dst_off"][1:] == s["dst_off"][:-1] + 1)
    starts = np.flatnonzero(~same)
    count = np.diff(np.append(starts, len(order)))
    out = {k: v[starts] for k, v in s.items()}
    out["count"] = count
    return out


def _build(coll: Collective, lay: _Layout, algorithm: str, schedule: str,
           sizes: list[int] | None = None) -> list[Schedule]:
    """Lower a layout into schedules (one per entry of ``sizes``, sharing the ops)."""
    topo = coll.topology
    dims = tuple(topo.dims)
    n = math.prod(dims)
    L = len(lay.lane_weights)
    P = lay.pieces
    PL = P * L
    strides = [math.prod(dims[d + 1:]) for d in range(len(dims))]
    table = torus_link_table(topo)
    link_dst = topo.link_dst.astype(np.int64)
    slots = np.arange(n).reshape(dims)
    max_hops = max([u[0].max_hops for gs in lay.groups.values() for g in gs
                    for lane in g.uses for u in lane]
                   + [1])
    n_phases = max(len(ph) for ph in lay.phases)
    # scratch per piece: regions R_1..R_{D-1}, then one transit region per phase
    region = n * L
    transit = max(max_hops - 1, 0) * n * L
    per_piece = (n_phases - 1) * region + n_phases * transit
    nonuniform = coll.pair_sizes is not None

    group = np.asarray(coll.group, dtype=np.int64)
    gidx = np.empty(n, dtype=np.int64)          # global rank -> group index
    gidx[group] = np.arange(n)
    b = ScheduleBuilder(coll, input=[0], output=[0])
    # one single-link route per healthy link (a failed link gets none, so no op can name it)
    healthy = np.flatnonzero(~topo.link_failed)
    single = np.full(topo.n_links, -1, dtype=np.int64)
    single[healthy] = b.add_routes(np.arange(len(healthy) + 1), healthy)
    rows_all: list[dict[str, np.ndarray]] = []

    if nonuniform:
        elems = coll.pair_sizes // coll.dtype.itemsize
        # rows by global rank (the ops name global ranks until the end)
        chunks_in = _split(elems, P, lay.lane_weights).reshape(n, n * PL)[gidx]
        chunks_out = _split(elems.T, P, lay.lane_weights).reshape(n, n * PL)[gidx]
        scratch_sz = np.zeros((n, P * per_piece), dtype=np.int64)
        sz = {Buf.INPUT: chunks_in, Buf.OUTPUT: chunks_out, Buf.SCRATCH: scratch_sz}

    # routes of every (ring group, plan path, source position), cached per group
    def routes_for(d: int, grp: _Group, plan: RingPlan) -> np.ndarray:
        """``route[g_local, segment]`` for the plan on every ring of the group."""
        out = np.zeros((len(grp.rings), len(plan.src)), dtype=np.int64)
        keys = np.unique(np.stack([plan.src, plan.path], axis=1), axis=0)
        for src, pid in keys.tolist():
            moves = plan.paths[pid]
            r = grp.rings[:, src].astype(np.int64)
            links = []
            for axis, direction in moves:
                ax = d if axis == RING else axis
                link = table[r, ax, direction].astype(np.int64)
                if (link < 0).any() or topo.link_failed[np.maximum(link, 0)].any():
                    raise ScheduleError(f"internal: plan '{plan.name}' on dimension {d} uses a "
                                        "missing or failed link")
                links.append(link)
                r = link_dst[link]
            sel = (plan.src == src) & (plan.path == pid)
            if len(links) == 1:
                ids = single[links[0]]
            else:
                path = np.stack(links, axis=1)
                off = np.arange(len(r) + 1) * len(links)
                ids = b.add_routes(off, path.ravel())
            out[:, sel] = np.asarray(ids)[:, None]
        return out

    route_cache: dict[tuple[int, int, int], np.ndarray] = {}

    for p in range(P):
        phases = lay.phases[p]
        base = p * per_piece
        for i, (d, start) in enumerate(phases):
            N = dims[d]
            m = n // N
            block = np.take(slots, 0, axis=d).ravel()           # slots with j_d = 0
            if i == 0:
                in_buf, in_chunk = Buf.INPUT, (lambda s, lane_idx, p=p:
                                               gidx[s] * PL + p * L + lane_idx)
            else:
                rb = base + (i - 1) * region
                in_buf, in_chunk = Buf.SCRATCH, (lambda s, lane_idx, rb=rb: rb + lane_idx * n + s)
            if i == len(phases) - 1:
                out_buf, out_chunk = Buf.OUTPUT, (lambda s, lane_idx, p=p:
                                                  gidx[s] * PL + p * L + lane_idx)
            else:
                ob = base + i * region
                out_buf, out_chunk = Buf.SCRATCH, (lambda s, lane_idx, ob=ob: ob + lane_idx * n + s)
            tb = base + (n_phases - 1) * region + i * transit

            def transit_chunk(h, c, w, lane_idx, tb=tb, m=m, N=N):
                return tb + lane_idx * (transit // L) + (h * N + c) * m + w

            ops = _Ops()
            for gi, grp in enumerate(lay.groups[d]):
                G = len(grp.rings)
                # self blocks stay in their slot: a local copy into the next region
                x = np.arange(N)
                s_self = block[None, :] + (x * strides[d])[:, None]       # (N, m)
                for lane_idx in range(L):
                    rk = grp.rings[:, :, None]                           # (G, N, 1)
                    ss = np.broadcast_to(s_self[None], (G, N, m))
                    ops.add(step=start, src=rk, dst=rk, route=0, src_buf=in_buf,
                            src_off=in_chunk(ss, lane_idx), dst_buf=out_buf,
                            dst_off=out_chunk(ss, lane_idx),
                            hop=0)
                for lane_idx, plan, offset, lo, hi in ((lane_idx, *u)
                                                       for lane_idx, lane in enumerate(grp.uses)
                                                       for u in lane):
                    w_lo, w_hi = round(lo * m), round(hi * m)
                    if w_hi <= w_lo:
                        continue
                    key = (d, gi, id(plan))
                    if key not in route_cache:
                        route_cache[key] = routes_for(d, grp, plan)
                    routes = route_cache[key]                             # (G, S)
                    S = len(plan.src)
                    sh = (S, G, w_hi - w_lo)
                    seg = np.arange(S)[:, None, None]
                    c = plan.dest[seg]
                    xo = plan.origin[seg]
                    w = np.arange(w_lo, w_hi)[None, None, :]
                    s = block[w] + c * strides[d]
                    hop = plan.hop[seg]
                    first = hop == 0
                    final = plan.final[seg]
                    src_rank = grp.rings[:, plan.src].T[:, :, None]
                    dst_rank = grp.rings[:, plan.dst].T[:, :, None]
                    read_buf = np.where(first, int(in_buf), int(Buf.SCRATCH))
                    read_off = np.where(first, in_chunk(s, lane_idx),
                                        transit_chunk(hop - 1, c, w, lane_idx))
                    write_buf = np.where(final, int(out_buf), int(Buf.SCRATCH))
                    write_off = np.where(final, out_chunk(s + (xo - c) * strides[d], lane_idx),
                                         transit_chunk(hop, c, w, lane_idx))
                    ops.add(step=np.broadcast_to(start + offset + plan.stage[seg], sh),
                            src=np.broadcast_to(src_rank, sh), dst=np.broadcast_to(dst_rank, sh),
                            route=np.broadcast_to(routes.T[:, :, None], sh),
                            src_buf=np.broadcast_to(read_buf, sh),
                            src_off=np.broadcast_to(read_off, sh),
                            dst_buf=np.broadcast_to(write_buf, sh),
                            dst_off=np.broadcast_to(write_off, sh),
                            hop=np.broadcast_to(hop, sh))
            rows = ops.arrays()
            if nonuniform:
                # sizes flow with the data: every write takes the size of what it reads
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
                                raise ScheduleError("internal: a block reaches the wrong output "
                                                    "slot")
                        else:
                            sz[buf][tgt] = val[mk]
            merged = _coalesce(rows)
            merged.pop("hop")
            rows_all.append({k: v.astype(np.int32) for k, v in merged.items()})
            del rows, merged

    cols = {k: np.concatenate([r[k] for r in rows_all]) for k in rows_all[0]}
    del rows_all
    b.add(step=cols["step"], src=gidx[cols["src"]], dst=gidx[cols["dst"]],
          route=cols["route"], src_buf=cols["src_buf"], src_off=cols["src_off"],
          dst_buf=cols["dst_buf"], dst_off=cols["dst_off"], count=cols["count"])
    params = tuple(lay.params)
    out = []
    for size in (sizes or [coll.size]):
        if nonuniform:
            layouts = (sz[Buf.INPUT][group], sz[Buf.OUTPUT][group], sz[Buf.SCRATCH][group])
            c = coll
        else:
            c = coll if size == coll.size else _resized(coll, size)
            e = _split(np.array([c.count // n]), P, lay.lane_weights).reshape(P, L)
            layouts = (np.tile(e.ravel(), n), np.tile(e.ravel(), n),
                       _scratch_layout(e, n, n_phases, transit))
        layouts = tuple(np.asarray(x, dtype=np.int64) for x in layouts)
        if not out:
            b.collective, b.layouts = c, layouts
            out.append(b.build(algorithm, schedule, params))
        else:
            out.append(out[0].replace(collective=c, layouts=layouts))
    return out


def _scratch_layout(e: np.ndarray, n: int, n_phases: int, transit: int) -> np.ndarray:
    """Uniform scratch: per piece, each region and transit area is lane-major."""
    L = e.shape[1]
    parts = []
    for p in range(e.shape[0]):
        parts += [np.repeat(e[p], n)] * (n_phases - 1)
        parts += [np.repeat(e[p], transit // L)] * n_phases
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def _resized(coll: Collective, size: int) -> Collective:
    from dataclasses import replace
    unit = coll.n * coll.dtype.itemsize
    if size <= 0 or size % unit:
        raise CollectiveError(f"size {size} B cannot be split evenly over {coll.n} ranks x "
                              f"{coll.dtype.itemsize} B: it must be a multiple of {unit} B")
    return replace(coll, size=int(size))


# --------------------------------------------------------------------------------------------
# strategies: which plan runs on which ring, and when


def _active_dims(dims: tuple[int, ...]) -> list[int]:
    return [d for d, size in enumerate(dims) if size > 1]


def _needs_direction_lanes(algorithm: str, f: TorusFaults, active: list[int]) -> bool:
    if algorithm == "ring":
        return True
    return any(f.wrap[d] and f.dims[d] % 2 == 0 and f.dims[d] >= 4 for d in active)


def _healthy_plan(algorithm: str, N: int, wrap: bool, lane: int) -> RingPlan:
    """The plan of a ring without failures (lane parity picks a direction where it matters)."""
    if not wrap:
        return line_plan(N, None)
    if algorithm == "ring":
        return ring_plan(N, PLUS if lane % 2 == 0 else MINUS)
    return halfring_plan(N, PLUS if lane % 2 == 0 else MINUS)


def _dim_groups(algorithm: str, f: TorusFaults, d: int, L: int, cache: dict,
                skip: int | None = None) -> list[_Group]:
    """Healthy rings share one group; every broken ring gets its own (FoldedRing or Line).

    Ring ``skip`` is left out (MATE gives the faulty ring lanes of its own).
    """
    N, wrap = f.dims[d], f.wrap[d]

    def plan(kind, *args):
        key = (kind, algorithm, N, wrap) + args
        if key not in cache:
            cache[key] = {"healthy": lambda lane: _healthy_plan(algorithm, N, wrap, lane),
                          "folded": lambda cut: folded_plan(N, cut),
                          "line": lambda cut: line_plan(N, cut)}[kind](*args)
        return cache[key]

    R = f.rings[d].shape[0]
    broken = f.broken[d]
    healthy = np.array([g for g in range(R) if g not in broken and g != skip], dtype=np.int64)
    groups = []
    if len(healthy):
        groups.append(_Group(f.rings[d][healthy],
                             [[(plan("healthy", lane % 2), 0, 0.0, 1.0)] for lane in range(L)]))
    for g, (cut,) in broken.items():
        if g == skip:
            continue
        kind = "folded" if algorithm == "foldedring" else "line"
        groups.append(_Group(f.rings[d][[g]], [[(plan(kind, cut), 0, 0.0, 1.0)]
                                               for _ in range(L)]))
    return groups


def _phase_len(groups: list[_Group]) -> int:
    return max((u[0].n_stages + u[1] for g in groups for lane in g.uses for u in lane),
               default=0)


def _order_param(params: dict, active: list[int]) -> list[int]:
    order = params.get("order")
    if order is None:
        return list(active)
    text = str(order).replace(",", "").replace(" ", "")
    try:
        got = [int(ch) for ch in text]
    except ValueError:
        raise CollectiveError(f"order must list dimensions, like \"012\"; got {order!r}") from None
    if sorted(got) != sorted(active):
        raise CollectiveError(f"order {order!r} must list each dimension of size > 1 once: "
                              f"{''.join(map(str, active))} in some order")
    return got


def _layout(coll: Collective, algorithm: str, schedule: str, params: dict) -> _Layout:
    topo = coll.topology
    f = torus_faults(topo)
    active = _active_dims(f.dims)
    L = 2 if _needs_direction_lanes(algorithm, f, active) else 1
    cache: dict = {}
    groups = {d: _dim_groups(algorithm, f, d, L, cache) for d in active}
    lens = {d: _phase_len(groups[d]) for d in active}
    weights = np.full(L, 1.0 / L)
    if schedule == "pipeline":
        K = hint_int(params, "chunks", 6)
        order = _order_param(params, active)
        D = len(order)
        stage_len = [max([lens[order[t - k]] for k in range(K) if 0 <= t - k < D], default=0)
                     for t in range(K + D - 1)]
        starts = np.concatenate([[0], np.cumsum(stage_len)]).astype(int)
        phases = [[(order[i], int(starts[k + i])) for i in range(D)] for k in range(K)]
        return _Layout(weights, K, phases, groups,
                       [("chunks", K), ("order", "".join(map(str, order)))])
    # dimrotation
    D = len(active)
    stage = max(lens.values(), default=0)
    phases = [[(active[(c + i) % D], i * stage) for i in range(D)] for c in range(max(D, 1))]
    return _Layout(weights, max(D, 1), phases, groups)


def build_torus_alltoall(coll: Collective, algorithm: str, schedule: str, **params) -> Schedule:
    """``algorithm`` in :data:`ALGORITHMS` composed by ``schedule`` in :data:`SCHEDULES`, or
    ``("halfring", "mate"|"matee")``."""
    return build_for_sizes(coll, [coll.size], algorithm, schedule, **params)[0]


def build_for_sizes(coll: Collective, sizes: list[int], algorithm: str, schedule: str,
                    **params) -> list[Schedule]:
    """The same schedule for several sizes (uniform alltoall): the ops do not depend on the
    size, only the chunk layouts do, so a size sweep builds the ops once."""
    reason = _applicable(coll, algorithm, schedule, params)
    if reason:
        raise CollectiveError(reason, coll.span)
    if coll.pair_sizes is not None and sizes != [coll.size]:
        raise CollectiveError("a non-uniform alltoall has its sizes in the matrix; it cannot be "
                              "resized")
    if schedule in ("mate", "matee"):
        lay = _mate_layout(coll, schedule == "matee", params)
    else:
        lay = _layout(coll, algorithm, schedule, params)
    if not lay.groups:
        # a single rank: its block stays put
        return _single_rank(coll, sizes, algorithm, schedule)
    if schedule in ("mate", "matee"):
        return _build(coll, lay, schedule, "-", sizes)
    return _build(coll, lay, algorithm, schedule, sizes)


def _single_rank(coll: Collective, sizes: list[int], algorithm: str, schedule: str
                 ) -> list[Schedule]:
    out = []
    for size in sizes:
        c = coll if size == coll.size else _resized(coll, size)
        e = c.pair_sizes // c.dtype.itemsize if c.pair_sizes is not None else [c.count]
        b = ScheduleBuilder(c, input=np.ravel(e), output=np.ravel(e))
        b.add(step=0, src=0, dst=0, src_buf=Buf.INPUT, src_off=0, dst_buf=Buf.OUTPUT, dst_off=0)
        out.append(b.build(algorithm, schedule))
    return out


# --------------------------------------------------------------------------------------------
# MATE / MATEe


def _plan_time_per_unit(topo, plans: list[RingPlan], ring: np.ndarray, d: int) -> float:
    """Seconds the busiest link needs per byte of a rank's data when ``plans`` (equal shares:
    the two antipode directions of an even ring) move it on ``ring``; a block is 1/N of it."""
    table = torus_link_table(topo)
    load: dict[int, float] = {}
    for plan in plans:
        for src, pid in zip(plan.src.tolist(), plan.path.tolist()):
            r = int(ring[src])
            for axis, direction in plan.paths[pid]:
                link = int(table[r, d if axis == RING else axis, direction])
                load[link] = load.get(link, 0.0) + 1.0 / (plan.n * len(plans))
                r = int(topo.link_dst[link])
    return max(v / topo.link_bandwidth[k] for k, v in load.items())


def _stage_costs(topo, plans: list[RingPlan], ring: np.ndarray, d: int, length: int
                 ) -> np.ndarray:
    """Per stage: seconds the busiest link needs per byte of a rank's data (as above, but
    stage by stage: what a lockstep step costs)."""
    table = torus_link_table(topo)
    load: dict[tuple[int, int], float] = {}
    for plan in plans:
        for st, src, pid in zip(plan.stage.tolist(), plan.src.tolist(), plan.path.tolist()):
            r = int(ring[src])
            for axis, direction in plan.paths[pid]:
                link = int(table[r, d if axis == RING else axis, direction])
                key = (st, link)
                load[key] = load.get(key, 0.0) + 1.0 / (plan.n * len(plans))
                r = int(topo.link_dst[link])
    out = np.zeros(length)
    for (st, link), v in load.items():
        out[st] = max(out[st], v / topo.link_bandwidth[link])
    return out


def _lockstep_shares(normal: np.ndarray, normal_fr: np.ndarray | None,
                     accel: list[np.ndarray]) -> tuple[float, np.ndarray]:
    """Shares that minimize the lockstep time of one stage of the faulty dimension.

    ``normal[k]``: cost of normal step ``k`` without the faulty ring (fixed); ``normal_fr``:
    per-unit cost of the faulty ring's FoldedRing share in the normal part (MATEe) or None;
    ``accel[l]``: per-unit cost per accelerating step of lane ``l``. A small LP: minimize the
    sum over steps of the slowest lane, shares summing to one.
    """
    from ortools.linear_solver import pywraplp

    # costs are ~1e-11 s/B: scale them to ~1 so that they sit far above the LP's tolerances
    scale = max(float(np.max(a)) for a in accel)
    normal = normal / scale
    normal_fr = None if normal_fr is None else normal_fr / scale
    accel = [a / scale for a in accel]
    solver = pywraplp.Solver.CreateSolver("GLOP")
    w = [solver.NumVar(0.0, 1.0, f"w{i}") for i in range(len(accel))]
    f = solver.NumVar(0.0, 1.0 if normal_fr is not None else 0.0, "f")
    solver.Add(sum(w) + f == 1.0)
    cost = []
    length = max(len(normal), len(normal_fr) if normal_fr is not None else 0)
    for k in range(length):
        t = solver.NumVar(0.0, solver.infinity(), f"n{k}")
        if k < len(normal):
            solver.Add(t >= float(normal[k]))
        if normal_fr is not None and k < len(normal_fr):
            solver.Add(t >= float(normal_fr[k]) * f)
        cost.append(t)
    for k in range(max(len(a) for a in accel)):
        t = solver.NumVar(0.0, solver.infinity(), f"a{k}")
        for wi, a in zip(w, accel):
            if k < len(a):
                solver.Add(t >= float(a[k]) * wi)
        cost.append(t)
    solver.Minimize(sum(cost))
    if solver.Solve() != pywraplp.Solver.OPTIMAL:
        raise ScheduleError("internal: the lockstep share LP has no optimum")
    return float(f.solution_value()), np.array([x.solution_value() for x in w])


def _mate_families(f: TorusFaults, fd: int) -> list[tuple[int, int]]:
    """Detour families (dimension, sign) around the faulty ring of dimension ``fd``."""
    fam = []
    for j in _active_dims(f.dims):
        if j == fd:
            continue
        signs = [PLUS] if f.dims[j] == 2 else [PLUS, MINUS]
        fam += [(j, s) for s in signs]
    return fam


def _mate_applicable(coll: Collective, enhanced: bool, params: dict) -> str | None:
    what = "matee" if enhanced else "mate"
    reason = _torus_reason(coll, what)
    if reason:
        return reason
    f = torus_faults(coll.topology)
    faulty = [(d, g) for d in range(len(f.dims)) for g in f.broken[d]]
    if not faulty:
        return (f"{what} accelerates a ring with a failed link; this torus has none "
                f"(halfring+dimrotation is its healthy counterpart)")
    if len(faulty) > 1:
        where = ", ".join(f"dimension {d}" for d, _ in faulty)
        return (f"{what} accelerates one faulty ring; here {len(faulty)} rings have failed links "
                f"({where}) and their detours would share links: foldedring+dimrotation serves "
                f"any number of rings with one failed link each")
    d, g = faulty[0]
    if not f.wrap[d] or f.dims[d] < 3:
        return f"{what} needs the failed link on a wrapped ring of at least 3 ranks"
    topo = coll.topology
    table = torus_link_table(topo)
    ring = f.rings[d][g]
    usable = [(j, s) for j, s in _mate_families(f, d) if (table[ring, j, s] >= 0).all()]
    if not usable:
        return (f"{what} detours through the rings of other dimensions, and this torus has no "
                f"other dimension of size > 1 around the faulty ring: foldedring+pipeline "
                f"serves it")
    rho = params.get("rho", "derived")
    if not (rho in ("derived", "artifact", "lockstep") or isinstance(rho, (int, float))):
        return f"rho must be 'derived', 'artifact', 'lockstep' or a number, not {rho!r}"
    if isinstance(rho, (int, float)) and not rho >= 0:
        return f"rho must be >= 0, got {rho}"
    if params.get("shares", "auto") not in ("auto", "lanes", "slots"):
        return f"shares must be 'auto', 'lanes' or 'slots', not {params['shares']!r}"
    extra = set(params) - {"rho", "shares"}
    if extra:
        return f"{what} takes only the parameters rho and shares (got {', '.join(sorted(extra))})"
    return None


def _mate_layout(coll: Collective, enhanced: bool, params: dict) -> _Layout:
    topo = coll.topology
    f = torus_faults(topo)
    active = _active_dims(f.dims)
    (fd, fg), = [(d, g) for d in range(len(f.dims)) for g in f.broken[d]]
    (cut,) = f.broken[fd][fg]
    N = f.dims[fd]
    table = torus_link_table(topo)
    ring = f.rings[fd][fg]
    fams = [(j, s) for j, s in _mate_families(f, fd) if (table[ring, j, s] >= 0).all()]
    ldir = 2 if _needs_direction_lanes("halfring", f, active) else 1
    cache: dict = {}
    # the faulty ring's data is split into a *scheme*: detour families, own ring, (matee) normal
    # share. Exact shares cut every chunk into one lane per scheme entry (x direction lanes);
    # slot shares give each entry a range of the slots of every aggregated block instead, which
    # keeps the op count of a large torus at that of DimRotation (precision 1/m of a block).
    scheme = [("detour", j, s) for j, s in fams] + [("own",)] + ([("normal",)] if enhanced else [])
    mode = params.get("shares", "auto")
    m_f = math.prod(f.dims) // N
    if mode == "auto":
        # exact lanes while the input (n^2 x pieces x lanes chunks over all ranks) stays small
        mode = "lanes" if math.prod(f.dims) ** 2 * len(active) * len(scheme) * ldir <= 4_000_000 \
            else "slots"
    L = (len(scheme) if mode == "lanes" else 1) * ldir
    healthy_dims = {d: _dim_groups("halfring", f, d, L, cache) for d in active if d != fd}
    normal_len = max([_phase_len(g) for g in healthy_dims.values()]
                     + [halfring_plan(N).n_stages])
    folded = folded_plan(N, cut)
    if enhanced:
        normal_len = max(normal_len, folded.n_stages)
    # shares: every accelerating lane finishes together (time per unit measured on the links)
    ways = (PLUS, MINUS) if N % 2 == 0 else (PLUS,)
    healthy_ring = f.rings[fd][(fg + 1) % f.rings[fd].shape[0]]
    t_hr = _plan_time_per_unit(topo, [halfring_plan(N, a) for a in ways], healthy_ring, fd)
    t_fr = _plan_time_per_unit(topo, [folded], ring, fd)
    t_det = [_plan_time_per_unit(topo, [detour_plan(N, j, s, a) for a in ways], ring, fd)
             for j, s in fams]
    rho = params.get("rho", "derived")
    share_normal = t_hr / t_fr if enhanced else 0.0
    rest = 1.0 - share_normal
    if rho == "lockstep":
        hr_len = halfring_plan(N).n_stages
        normal = _stage_costs(topo, [halfring_plan(N, a) for a in ways], healthy_ring, fd, hr_len)
        fr_cost = _stage_costs(topo, [folded], ring, fd, folded.n_stages)
        det_cost = [_stage_costs(topo, [detour_plan(N, j, s, a) for a in ways], ring, fd, hr_len)
                    for j, s in fams]
        share_normal, accel = _lockstep_shares(normal, fr_cost if enhanced else None,
                                               det_cost + [fr_cost])
        if enhanced and share_normal < 1e-9:
            normal_len = max([_phase_len(g) for g in healthy_dims.values()] + [hr_len])
    elif rho == "derived":
        inv = np.array([1.0 / t for t in t_det] + [1.0 / t_fr])
        accel = rest * inv / inv.sum()
    else:
        if rho == "artifact":
            # the artifact's MATE accelerating divisor swaps the odd/even formulas
            r = N / (4 * (N - 1)) if N % 2 else (N + 1) / (4 * N)
        else:
            r = float(rho)
        per_dim: dict[int, int] = {}
        for j, _ in fams:
            per_dim[j] = per_dim.get(j, 0) + 1
        div = len(per_dim) + r
        accel = np.array([rest / div / per_dim[j] for j, _ in fams] + [rest * r / div])
    scheme_w = np.concatenate([accel, [share_normal] if enhanced else []])
    scheme_w = np.maximum(scheme_w, 0.0) / np.maximum(scheme_w, 0.0).sum()
    if mode == "lanes":
        weights = np.repeat(scheme_w / ldir, ldir)
    else:
        # whole slots per scheme entry (largest remainders), as fractions of the block
        counts = np.floor(scheme_w * m_f).astype(int)
        order = np.argsort(-(scheme_w * m_f - counts), kind="stable")
        counts[order[:m_f - counts.sum()]] += 1
        bounds_ = np.concatenate([[0], np.cumsum(counts)]) / m_f
        weights = np.full(ldir, 1.0 / ldir)
        share_normal = float(counts[-1] / m_f) if enhanced else 0.0
        accel = counts[:len(fams) + 1] / m_f

    accel_plans = [detour_plan(N, j, s, PLUS) for j, s in fams]
    accel_len = max([p.n_stages for p in accel_plans] + [folded.n_stages])
    # faulty dimension: healthy rings HalfRing in the normal part; the faulty ring's lanes
    groups = dict(healthy_dims)
    uses: list[list[tuple[RingPlan, int, float, float]]] = [[] for _ in range(L)]
    for k, sch in enumerate(scheme):
        for lane in range(ldir):
            antipode = PLUS if lane % 2 == 0 else MINUS
            if sch[0] == "detour":
                key = ("detour", N, sch[1], sch[2], antipode)
                if key not in cache:
                    cache[key] = detour_plan(N, sch[1], sch[2], antipode)
                use = (cache[key], normal_len)
            elif sch[0] == "own":
                use = (folded, normal_len)
            else:
                use = (folded, 0)
            if mode == "lanes":
                uses[k * ldir + lane].append(use + (0.0, 1.0))
            else:
                uses[lane].append(use + (float(bounds_[k]), float(bounds_[k + 1])))
    groups[fd] = _dim_groups("halfring", f, fd, L, cache, skip=fg) + \
        [_Group(f.rings[fd][[fg]], uses)]
    D = len(active)
    stage = normal_len + accel_len
    phases = [[(active[(c + i) % D], i * stage) for i in range(D)] for c in range(D)]
    if rho == "lockstep" or mode == "slots":
        # the realized rho as the paper defines it: own share / share of one other dimension
        per_dim_share = (accel[:-1].sum() / max(len({j for j, _ in fams}), 1))
        rho_used = accel[-1] / per_dim_share if per_dim_share > 0 else float("inf")
    elif rho == "derived":
        rho_used = t_hr / t_fr
    elif rho == "artifact":
        rho_used = N / (4 * (N - 1)) if N % 2 else (N + 1) / (4 * N)
    else:
        rho_used = float(rho)
    return _Layout(weights, D, phases, groups,
                   [("rho", round(float(rho_used), 6)), ("faulty_dim", fd), ("shares", mode)]
                   + ([("normal_share", round(float(share_normal), 6))] if enhanced else []))


# --------------------------------------------------------------------------------------------
# applicability and registration


def _applicable(coll: Collective, algorithm: str, schedule: str, params: dict) -> str | None:
    if schedule in ("mate", "matee"):
        return _mate_applicable(coll, schedule == "matee", params)
    what = f"{algorithm}+{schedule}"
    reason = _torus_reason(coll, what)
    if reason:
        return reason
    allowed = {"pipeline": {"chunks", "order"}, "dimrotation": set()}[schedule]
    extra = set(params) - allowed
    if extra:
        return (f"{what} takes " + (f"only {', '.join(sorted(allowed))}" if allowed
                                    else "no parameters") + f" (got {', '.join(sorted(extra))})")
    if schedule == "pipeline":
        try:
            k = hint_int(params, "chunks", 6)
            _order_param(params, _active_dims(tuple(coll.topology.dims)))
        except CollectiveError as e:
            return e.message
        if k > MAX_PIPELINE_CHUNKS:
            # ops grow with K while the pipeline's gain, (K+D-1)/K, is spent long before
            return (f"pipeline(chunks={k}) is over the limit of {MAX_PIPELINE_CHUNKS} chunks: "
                    "more pieces multiply the ops without shortening the pipeline")
    f = torus_faults(coll.topology)
    if algorithm in ("ring", "halfring") and f.n_broken:
        d = next(d for d in range(len(f.dims)) if f.broken[d])
        g = next(iter(f.broken[d]))
        return (f"{f.describe_ring(coll.topology, d, g)} has a failed link; {algorithm} needs "
                f"whole rings: foldedring+{schedule}, line+{schedule}, mate or matee serve it")
    if algorithm in ("foldedring", "line") and not f.n_broken:
        return (f"{algorithm} is the fault-tolerant form of halfring and this torus has no "
                f"failed link: halfring+{schedule} is the same schedule")
    return None


def _entry(algorithm: str, schedule: str, description: str) -> Algorithm:
    name = schedule if schedule in ("mate", "matee") else f"{algorithm}+{schedule}"
    return register(Algorithm(
        name=name, collectives=_KINDS,
        applicable=lambda coll, **p: _applicable(coll, algorithm, schedule, p),
        build=lambda coll, **p: build_torus_alltoall(coll, algorithm, schedule, **p),
        description=description))


_DESCRIPTIONS = {
    "ring": "two-direction store-and-forward ring per dimension",
    "halfring": "shortest direction per block (antipode split) per dimension",
    "foldedring": "halfring; a ring with a failed link runs FoldedRing over its surviving links",
    "line": "halfring; a ring with a failed link runs shortest paths on the remaining line",
}
for _alg in ALGORITHMS:
    _entry(_alg, "pipeline", _DESCRIPTIONS[_alg] + ", K chunks pipelined over the dimensions")
    _entry(_alg, "dimrotation", _DESCRIPTIONS[_alg] + ", D pieces with rotated dimension orders")
_entry("halfring", "mate", "one failed link: the faulty ring's data takes 3-hop detours "
       "through the neighbouring rings in an acceleration stage (MATE)")
_entry("halfring", "matee", "MATE, and the faulty ring also moves a share by FoldedRing in the "
       "normal stage (MATEe)")
