"""The relay lowering as it was first written: one Python loop over the relayed ops, one
greedy prefix search per route. Kept as the reference the columnar :func:`cclc.relay.lower_relays`
must reproduce exactly (same ops in the same order, same scratch layout, same routes)."""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from cclc.ir import OP_COLUMNS, Buf, OpKind, Ops, Routes, Schedule
from cclc.relay import RelayError
from cclc.routing import carried_routes, carried_segments


class _Scratch:
    """Relay regions per chunk shape, reused per rank once forwarded."""

    def __init__(self) -> None:
        self.shapes: dict[tuple[int, ...], int] = {}             # shape -> shape id
        self.free_at: dict[tuple[int, int], list[int]] = defaultdict(list)  # (rank, shape)
        self.regions: dict[int, int] = defaultdict(int)           # shape id -> regions

    def take(self, rank: int, shape: tuple[int, ...], written: int) -> tuple[int, int]:
        """A region of ``rank`` for ``shape`` written in sub-step ``written`` and read in the
        next one: ``(shape id, region index)``."""
        sid = self.shapes.setdefault(shape, len(self.shapes))
        slots = self.free_at[(rank, sid)]
        for r, free in enumerate(slots):
            if free <= written:
                slots[r] = written + 2
                return sid, r
        slots.append(written + 2)
        self.regions[sid] = max(self.regions[sid], len(slots))
        return sid, len(slots) - 1

    def layout(self) -> tuple[np.ndarray, dict[int, int]]:
        """Element counts of the appended chunks, and the first chunk of every shape."""
        elems: list[int] = []
        first: dict[int, int] = {}
        for shape, sid in self.shapes.items():
            first[sid] = len(elems)
            elems += list(shape) * self.regions[sid]
        return np.array(elems, dtype=np.int64), first


def reference_lower_relays(schedule: Schedule) -> Schedule:  # noqa: C901 (the loop it replaced, kept as is)
    """``schedule`` with every op whose route the topology's routing does not carry replaced
    by a chain of carried hops through the ranks on its route (see the module docstring).

    Returns ``schedule`` itself when every route is carried. Raises :class:`RelayError` when
    a route would have to be relayed by a rank outside the collective's group.
    """
    s = schedule
    topo = s.topology
    carried = carried_routes(topo, s.routes)
    ops = s.ops
    relayed = ~carried[ops.route]
    if not relayed.any():
        return s
    group = s.collective.group
    index_of = {int(g): i for i, g in enumerate(group)}
    route_ids: dict[tuple[int, ...], int] = {}
    route_paths: list[tuple[int, ...]] = [s.routes.path(r) for r in range(len(s.routes))]
    for r, p in enumerate(route_paths):
        route_ids.setdefault(p, r)

    def route_of(path: tuple[int, ...]) -> int:
        rid = route_ids.get(path)
        if rid is None:
            rid = route_ids[path] = len(route_paths)
            route_paths.append(path)
        return rid

    segments: dict[int, list[tuple[int, int | None]]] = {}   # route -> chain (see chain())

    def chain(route: int) -> list[tuple[int, int | None]]:
        """Per hop: its route id and the group index of the rank it lands on (None: the
        op's destination)."""
        if route not in segments:
            pieces = carried_segments(topo, route_paths[route])
            hops = []
            for k, seg in enumerate(pieces):
                end = int(topo.link_dst[seg[-1]])
                if k < len(pieces) - 1 and end not in index_of:
                    raise RelayError(
                        f"a route of schedule '{s.algorithm}' must be relayed at "
                        f"{topo.vertex_names[end]}, which is not a rank of collective "
                        f"'{s.collective.name}' (routing '{topo.routing}': add the ranks on "
                        "the way to the group, or declare the routing the network has)")
                hops.append((route_of(seg), None if k == len(pieces) - 1 else index_of[end]))
            segments[route] = hops
        return segments[route]

    elems = [s.chunk_elems(b) for b in Buf]
    step_of = ops.step.astype(np.int64)
    n_steps = s.n_steps
    # steps where an op reads a chunk another op of the step writes: relay those whole
    in_place = _steps_reading_own_writes(s)
    rel = np.flatnonzero(relayed)
    cols = {k: v[rel].tolist() for k, v in ops.columns().items()}
    plans = []                                      # per relayed op: (hops, pieces)
    length = np.ones(n_steps, dtype=np.int64)       # sub-steps each original step becomes
    for i in range(len(rel)):
        hops = chain(cols["route"][i])
        count = cols["count"][i]
        src, dst = cols["src"][i], cols["dst"][i]
        sb, db = cols["src_buf"][i], cols["dst_buf"][i]
        so, do = cols["src_off"][i], cols["dst_off"][i]
        same = np.array_equal(elems[sb][src, so:so + count], elems[db][dst, do:do + count])
        pieces = count if same and not in_place[cols["step"][i]] else 1
        plans.append((hops, pieces))
        st = cols["step"][i]
        length[st] = max(length[st], pieces + len(hops) - 1)
    base = np.concatenate([[0], np.cumsum(length)[:-1]])
    last = base + length - 1

    # ops the routing carries keep their row, in the last sub-step of their step
    keep = ops.take(~relayed)
    out: dict[str, list] = {k: [v] for k, v in keep.columns().items()}
    out["step"] = [last[step_of[~relayed]]]
    rows: dict[str, list[int]] = {k: [] for k in OP_COLUMNS}
    relay_slots: list[tuple[int, int, int]] = []   # per scratch-relay write: (row, sid, region)
    relay_reads: list[tuple[int, int, int]] = []
    scratch = _Scratch()

    def emit(step, src, dst, route, kind, sbuf, soff, dbuf, doff, count) -> int:
        for k, v in zip(rows, (step, src, dst, route, kind, sbuf, soff, dbuf, doff, count),
                        strict=True):
            rows[k].append(v)
        return len(rows["step"]) - 1

    # chains in step order, so scratch regions are reused in time order
    for i in np.argsort(np.array(cols["step"], dtype=np.int64), kind="stable").tolist():
        hops, pieces = plans[i]
        _, src, dst, _, kind, sb, so, db, do, count = (cols[k][i] for k in OP_COLUMNS)
        st = cols["step"][i]
        first = int(last[st]) - (pieces + len(hops) - 1) + 1
        per = count // pieces
        for j in range(pieces):
            shape = tuple(int(x) for x in elems[sb][src, so + j * per:so + (j + 1) * per])
            at, a_buf, a_off, a_read = src, sb, so + j * per, None
            for k, (rid, lands) in enumerate(hops):
                t = first + j + k
                if lands is None:
                    row = emit(t, at, dst, rid, kind, a_buf, a_off, db, do + j * per, per)
                else:
                    sid, region = scratch.take(lands, shape, t)
                    row = emit(t, at, lands, rid, int(OpKind.COPY), a_buf, a_off,
                               int(Buf.SCRATCH), 0, per)
                    relay_slots.append((row, sid, region))
                if a_read is not None:
                    relay_reads.append((row, *a_read))
                if lands is not None:
                    at, a_buf, a_off, a_read = lands, int(Buf.SCRATCH), 0, (sid, region)

    # place the relay regions after the schedule's own scratch chunks
    extra, first_chunk = scratch.layout()
    own = s.layouts[Buf.SCRATCH]
    n_own = own.shape[-1]
    if own.ndim == 2:
        scratch_layout = np.concatenate([own, np.broadcast_to(extra, (s.n, len(extra)))], axis=1)
    else:
        scratch_layout = np.concatenate([own, extra])
    dst_off, src_off = rows["dst_off"], rows["src_off"]
    shape_len = {sid: len(shape) for shape, sid in scratch.shapes.items()}
    for row, sid, region in relay_slots:
        dst_off[row] = n_own + first_chunk[sid] + region * shape_len[sid]
    for row, sid, region in relay_reads:
        src_off[row] = n_own + first_chunk[sid] + region * shape_len[sid]
    offsets = np.zeros(len(route_paths) + 1, dtype=np.int64)
    np.cumsum([len(p) for p in route_paths], out=offsets[1:])
    links = np.array([x for p in route_paths for x in p], dtype=np.int32)
    for k, dtype in OP_COLUMNS.items():
        out[k].append(np.array(rows[k], dtype=dtype))
    new_ops = Ops(**{k: np.concatenate(v) for k, v in out.items()})
    order = np.argsort(new_ops.step, kind="stable")
    return s.replace(layouts=(s.layouts[Buf.INPUT], s.layouts[Buf.OUTPUT], scratch_layout),
                     ops=new_ops.take(order), routes=Routes(offsets, links))


def _steps_reading_own_writes(s: Schedule) -> np.ndarray:
    """Per step: whether an op of it reads a chunk that an op of the same step writes."""
    ops = s.ops
    widths = np.array([s.n_chunks(b) for b in Buf], dtype=np.int64)
    base = np.concatenate([[0], np.cumsum(widths * s.n)[:-1]])
    n_slots = int((widths * s.n).sum()) + 1

    def keys(rank, buf, off):
        cnt = ops.count.astype(np.int64)
        within = np.arange(int(cnt.sum())) - np.repeat(np.cumsum(cnt) - cnt, cnt)
        slot = np.repeat(base[buf] + rank.astype(np.int64) * widths[buf] + off, cnt) + within
        return np.repeat(ops.step.astype(np.int64), cnt) * n_slots + slot

    writes = keys(ops.dst, ops.dst_buf.astype(np.int64), ops.dst_off.astype(np.int64))
    reads = keys(ops.src, ops.src_buf.astype(np.int64), ops.src_off.astype(np.int64))
    hit = np.isin(reads, writes)
    out = np.zeros(s.n_steps, dtype=bool)
    out[np.unique(reads[hit] // n_slots)] = True
    return out
