"""Relay lowering: moves the declared routing cannot carry become store-and-forward relays.

An algorithm may route an op over any healthy path (a detour around a failed link, a
neighbour two hops away on a folded ring, every pair at once in ``direct``). Whether the
machine can make that move by itself depends on its routing (:mod:`cclc.routing`): a GPU
torus (``routing none``) only reaches its neighbours; dimension-order routers cannot leave
the dimension-order path. :func:`lower_relays` cuts each such route at the ranks where the
routing stops carrying it and turns the op into a chain of ops through those ranks, each
hop into scratch chunks of the relaying rank, so that every op of the result is a move the
machine makes itself and the backends emit exactly that.

Timing. Each original step becomes as many steps as its longest chain needs; every chain
ends in the step's last sub-step, so ops keep reading the state the previous original step
left (the IR's rule) and every final write still happens once per slot. An op of several
chunks is relayed chunk by chunk, chunk ``j`` taking hop ``k`` in sub-step ``j + k``, so the
hops pipeline; when a step writes a slot that one of its own ops reads (in-place patterns),
chunks could overtake that read, so that step relays each op whole.

Scratch. A relay lands in scratch chunks of the relaying rank with the same element counts
as the chunks it carries; a region is reused once its content has been forwarded (two
sub-steps later), and every rank gets the same scratch layout.
"""

from __future__ import annotations

import numpy as np

from cclc.errors import ScheduleError
from cclc.ir import OP_COLUMNS, Buf, OpKind, Ops, Routes, Schedule
from cclc.routing import carried_routes, through_ranks
from cclc.sorting import first_occurrence_ids

__all__ = ["RelayError", "lower_relays", "relay_count"]


class RelayError(ScheduleError):
    """A move the declared routing cannot carry and no rank of the group can relay."""


def relay_count(schedule: Schedule) -> int:
    """How many ops of ``schedule`` use a route its topology's routing does not carry."""
    carried = carried_routes(schedule.topology, schedule.routes)
    return int((~carried[schedule.ops.route]).sum())


def lower_relays(schedule: Schedule, across_ranks: bool = True) -> Schedule:
    """``schedule`` with every op whose route the topology's routing does not carry replaced
    by a chain of carried hops through the ranks on its route (see the module docstring).
    ``across_ranks=False``: a route with a rank inside it counts as not carried either, so
    the op is relayed by that rank (a runtime that sends a GPU's messages through its own NIC
    only cannot carry one over NVLink to another GPU's NIC, as NCCL's PXN does).

    Returns ``schedule`` itself when every route is carried. Raises :class:`RelayError` when
    a route would have to be relayed by a rank outside the collective's group.

    Columnar: the routes are cut in batches, the hops of all chains are laid out with numpy,
    and only the scratch regions are assigned by a loop (over the requests of one rank, all
    ranks at once: see :func:`_assign_regions`).
    """
    s = schedule
    topo = s.topology
    carried = _carried(topo, s.routes, across_ranks)
    ops = s.ops
    relayed = ~carried[ops.route]
    if not relayed.any():
        return s
    group = np.asarray(s.collective.group, dtype=np.int64)
    index_of = np.full(topo.n_vertices, -1, dtype=np.int64)
    index_of[group] = np.arange(len(group))
    rel = np.flatnonzero(relayed)
    cols = {k: v[rel].astype(np.int64) for k, v in ops.columns().items()}

    # -- chains: every relayed route cut into carried segments, in first-use order ---------
    used = cols["route"][first_occurrence_ids(cols["route"])[1]]     # in first-use order
    seg_route, seg_start, seg_end = _cut_routes(topo, s.routes, used, across_ranks)
    n_seg = np.bincount(seg_route, minlength=len(used))
    seg_first = np.concatenate([[0], np.cumsum(n_seg)[:-1]])
    links = s.routes.links.astype(np.int64)
    base_off = s.routes.offsets[used].astype(np.int64)
    seg_lo = base_off[seg_route] + seg_start
    seg_hi = base_off[seg_route] + seg_end
    end_vertex = topo.link_dst[links[seg_hi - 1]].astype(np.int64)
    is_last = np.zeros(len(seg_route), dtype=bool)
    is_last[seg_first + n_seg - 1] = True
    lands = np.where(is_last, -1, index_of[end_vertex])
    outside = ~is_last & (lands < 0)
    if outside.any():
        end = int(end_vertex[np.flatnonzero(outside)[0]])
        raise RelayError(
            f"a route of schedule '{s.algorithm}' must be relayed at "
            f"{topo.vertex_names[end]}, which is not a rank of collective "
            f"'{s.collective.name}' (routing '{topo.routing}': add the ranks on "
            "the way to the group, or declare the routing the network has)")
    seg_rid, route_offsets, route_links = _segment_ids(s.routes, links, seg_lo, seg_hi)

    # -- per relayed op: its chain, and whether it is relayed chunk by chunk ----------------
    slot_of_route = np.empty(int(used.max()) + 1 if len(used) else 0, dtype=np.int64)
    slot_of_route[used] = np.arange(len(used))
    u = slot_of_route[cols["route"]]
    hops = n_seg[u]
    hop0 = seg_first[u]
    count = cols["count"]
    elems = [s.chunk_elems(b) for b in Buf]
    same = _same_chunks(elems, cols)
    step = cols["step"]
    # only the steps with relayed ops matter
    in_place = _steps_reading_own_writes(s, np.unique(step))
    pieces = np.where(same & ~in_place[step], count, 1)
    n_steps = s.n_steps
    length = np.ones(n_steps, dtype=np.int64)       # sub-steps each original step becomes
    np.maximum.at(length, step, pieces + hops - 1)
    base = np.concatenate([[0], np.cumsum(length)[:-1]])
    last = base + length - 1

    # -- every hop of every piece, in the order the chains are written ---------------------
    order = np.argsort(step, kind="stable")         # chains in step order, then op order
    per = np.where(pieces > 0, count // np.maximum(pieces, 1), 0)
    n_rows = pieces * hops
    o = np.repeat(order, n_rows[order])             # the relayed op of each new row
    within = np.arange(len(o)) - np.repeat(np.cumsum(n_rows[order]) - n_rows[order],
                                           n_rows[order])
    j, k = within // hops[o], within % hops[o]
    seg = hop0[o] + k
    t = last[step[o]] - (pieces[o] + hops[o] - 1) + 1 + j + k
    final = k == hops[o] - 1
    land = lands[seg]                                # group index a hop lands on, -1: dst
    at = np.where(k == 0, cols["src"][o], lands[np.maximum(seg - 1, 0)])
    src_buf = np.where(k == 0, cols["src_buf"][o], int(Buf.SCRATCH))
    src_off = cols["src_off"][o] + j * per[o]
    dst = np.where(final, cols["dst"][o], land)
    dst_buf = np.where(final, cols["dst_buf"][o], int(Buf.SCRATCH))
    dst_off = cols["dst_off"][o] + j * per[o]
    kind = np.where(final, cols["kind"][o], int(OpKind.COPY))

    # -- scratch regions: one per landing, reused two sub-steps later ----------------------
    scratch_layout = _place_landings(s, elems, cols, o, j, per, final, land, t, src_off, dst_off)

    # ops the routing carries keep their row, in the last sub-step of their step; new rows
    # follow them, so a stable sort by step puts every sub-step in the reference order
    new = {"step": t, "src": at, "dst": dst, "route": seg_rid[seg], "kind": kind,
           "src_buf": src_buf, "src_off": src_off, "dst_buf": dst_buf, "dst_off": dst_off,
           "count": per[o]}
    new_ops = _merge(ops.take(~relayed), new, last)
    return s.replace(layouts=(s.layouts[Buf.INPUT], s.layouts[Buf.OUTPUT], scratch_layout),
                     ops=new_ops, routes=Routes(route_offsets, route_links))


def _place_landings(s: Schedule, elems: list[np.ndarray], cols: dict[str, np.ndarray],
                    o: np.ndarray, j: np.ndarray, per: np.ndarray, final: np.ndarray,
                    land: np.ndarray, t: np.ndarray, src_off: np.ndarray, dst_off: np.ndarray
                    ) -> np.ndarray:
    """Give every hop that lands at a relaying rank a scratch region behind the schedule's
    own scratch (one per landing, reused two sub-steps later): sets the landing rows'
    ``dst_off`` and the next hop's ``src_off`` in place; returns the scratch layout."""
    hop_piece = np.flatnonzero(~final)                # rows that land in scratch
    shape_id, shapes = _shape_ids(elems, cols, o, j, per, hop_piece)
    region = _assign_regions(land[hop_piece], shape_id, t[hop_piece], s.n, len(shapes))
    n_regions = np.zeros(len(shapes), dtype=np.int64)
    np.maximum.at(n_regions, shape_id, region + 1)
    shape_len = np.array([len(x) for x in shapes], dtype=np.int64)
    first_chunk = np.concatenate([[0], np.cumsum(shape_len * n_regions)[:-1]])
    own = s.layouts[Buf.SCRATCH]
    n_own = own.shape[-1]
    where = n_own + first_chunk[shape_id] + region * shape_len[shape_id]
    dst_off[hop_piece] = where
    src_off[hop_piece + 1] = where                  # the next hop reads what landed
    extra = np.array([x for shape, r in zip(shapes, n_regions.tolist(), strict=True)
                      for x in list(shape) * r], dtype=np.int64)
    if own.ndim == 2:
        scratch_layout = np.concatenate([own, np.broadcast_to(extra, (s.n, len(extra)))], axis=1)
    else:
        scratch_layout = np.concatenate([own, extra])
    return scratch_layout


def _merge(keep: Ops, new: dict[str, np.ndarray], last: np.ndarray) -> Ops:
    """The kept ops (each in the last sub-step of its step) followed by the new rows, sorted
    stably by step."""
    out = {c: np.concatenate([v, new[c].astype(OP_COLUMNS[c])])
           for c, v in keep.columns().items()}
    out["step"][:len(keep)] = last[keep.step.astype(np.int64)]
    new_ops = Ops(**out)
    return new_ops.take(np.argsort(new_ops.step, kind="stable"))


def _carried(topo, routes: Routes, across_ranks: bool) -> np.ndarray:
    """:func:`cclc.routing.carried_routes`, less the routes with a rank inside them where
    ``across_ranks`` is False."""
    ok = carried_routes(topo, routes)
    return ok if across_ranks else ok & ~through_ranks(topo, routes.offsets, routes.links)


def _cut_routes(topo, routes: Routes, which: np.ndarray, across_ranks: bool = True
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each of the routes ``which`` cut into the fewest pieces, greedily from its start, that
    the topology's routing carries one by one (what :func:`cclc.routing.carried_segments`
    does for one path), all routes at once. Returns per segment, in route then position
    order: its route's index in ``which`` and its link range within the route."""
    links = routes.links.astype(np.int64)
    off = routes.offsets[which].astype(np.int64)
    n = routes.lengths()[which].astype(np.int64)
    # a cut must fall on a rank: switches forward but do not store and forward
    lands_on_rank = topo.link_dst[links] < topo.n_ranks
    pos = np.zeros(len(which), dtype=np.int64)
    out_r, out_a, out_b = [], [], []
    active = np.flatnonzero(n > 0)
    while len(active):
        i = pos[active]
        best = i + 1                                # a single link is always carried
        undecided = np.ones(len(active), dtype=bool)
        for back in range(int((n[active] - i).max())):
            jj = n[active] - back                   # candidate end, longest first
            try_ = undecided & (jj > i)
            # the end of the whole route is always a valid cut
            try_ &= (jj == n[active]) | lands_on_rank[off[active] + np.maximum(jj - 1, 0)]
            cand = np.flatnonzero(try_)
            if not len(cand):
                continue
            a = off[active[cand]] + i[cand]
            b = off[active[cand]] + jj[cand]
            lens = b - a
            sub_off = np.concatenate([[0, 0], np.cumsum(lens)])
            sub = links[np.repeat(a - sub_off[1:-1], lens) + np.arange(int(lens.sum()))]
            ok = _carried(topo, Routes(sub_off, sub.astype(np.int32)), across_ranks)[1:]
            hit = cand[ok]
            best[hit] = jj[hit]
            undecided[hit] = False
            if not undecided.any():
                break
        out_r.append(active)
        out_a.append(i)
        out_b.append(best)
        pos[active] = best
        active = active[pos[active] < n[active]]
    r = np.concatenate(out_r) if out_r else np.zeros(0, dtype=np.int64)
    a = np.concatenate(out_a) if out_a else np.zeros(0, dtype=np.int64)
    b = np.concatenate(out_b) if out_b else np.zeros(0, dtype=np.int64)
    order = np.lexsort((a, r))
    return r[order], a[order], b[order]


def _padded(links: np.ndarray, lo: np.ndarray, hi: np.ndarray, width: int) -> np.ndarray:
    """Link paths ``links[lo:hi]`` as rows padded with -1 to ``width``."""
    out = np.full((len(lo), width), -1, dtype=np.int64)
    lens = hi - lo
    row = np.repeat(np.arange(len(lo)), lens)
    col = np.arange(int(lens.sum())) - np.repeat(np.cumsum(lens) - lens, lens)
    out[row, col] = links[np.repeat(lo, lens) + col]
    return out


def _segment_ids(routes: Routes, links: np.ndarray, seg_lo: np.ndarray, seg_hi: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Route ids of the segments: the first existing route with the same path, else a new
    route appended in order of first use. Returns the ids and the new CSR routes."""
    r_off = routes.offsets.astype(np.int64)
    r_len = np.diff(r_off)
    seg_len = seg_hi - seg_lo
    width = int(max(seg_len.max(initial=0), 1))
    # only existing routes as long as some segment can be one of them
    old = np.flatnonzero((r_len > 0) & (r_len <= width))
    rows = np.concatenate([_padded(links, r_off[old], r_off[old + 1], width),
                           _padded(links, seg_lo, seg_hi, width)])
    first = _first_equal_row(rows)
    n_old = len(old)
    seg_first = first[n_old:]                        # first row with the segment's path
    new = seg_first >= n_old
    # new paths get ids after the old routes, in order of first use
    fresh = np.unique(seg_first[new])                 # rows, ascending = first-use order
    ids = np.where(new, len(r_len) + np.searchsorted(fresh, seg_first),
                   old[np.minimum(seg_first, max(n_old - 1, 0))] if n_old else 0)
    fresh_seg = fresh - n_old
    lens = seg_len[fresh_seg]
    add = _padded(links, seg_lo[fresh_seg], seg_hi[fresh_seg], width)
    add_links = add[add >= 0]
    offsets = np.concatenate([r_off, r_off[-1] + np.cumsum(lens)])
    all_links = np.concatenate([routes.links.astype(np.int64), add_links]).astype(np.int32)
    return ids, offsets, all_links


def _first_equal_row(rows: np.ndarray) -> np.ndarray:
    """Per row of a 2-D integer array: the index of the first row equal to it."""
    if not len(rows):
        return np.zeros(0, dtype=np.int64)
    # hash each row to one integer (wrapping arithmetic), group by hash, then confirm the
    # grouping row by row; a collision (never seen) falls back to an exact sort of the rows
    mult = np.random.default_rng(17).integers(1, 2 ** 62, size=rows.shape[1], dtype=np.int64)
    with np.errstate(over="ignore"):
        h = (rows.astype(np.int64) * (mult | 1)).sum(axis=1)
    order = np.argsort(h, kind="stable")
    hs = h[order]
    start = np.r_[True, hs[1:] != hs[:-1]]
    lead = order[np.flatnonzero(start)[np.cumsum(start) - 1]]   # first row of the hash group
    first = np.empty(len(rows), dtype=np.int64)
    first[order] = lead
    if (rows[first] != rows).any():
        _, idx, inv = np.unique(rows, axis=0, return_index=True, return_inverse=True)
        return idx[inv.reshape(-1)]
    return first


def _same_chunks(elems: list[np.ndarray], cols: dict[str, np.ndarray]) -> np.ndarray:
    """Per op: whether its source chunks have the element counts of its destination chunks
    (then it can be relayed chunk by chunk)."""
    count = cols["count"]
    ws = np.array([e.shape[1] for e in elems], dtype=np.int64)
    sb, db = cols["src_buf"], cols["dst_buf"]
    so, do = cols["src_off"], cols["dst_off"]
    ls = np.clip(ws[sb] - so, 0, count)
    ld = np.clip(ws[db] - do, 0, count)
    same = ls == ld                                   # slices of different lengths differ
    m = np.flatnonzero(same & (ls > 0))
    lens = ls[m]
    row = np.repeat(m, lens)
    col = np.arange(int(lens.sum())) - np.repeat(np.cumsum(lens) - lens, lens)
    a = np.zeros(len(row), dtype=np.int64)
    b = np.zeros(len(row), dtype=np.int64)
    for buf, e in enumerate(elems):
        hs = sb[row] == buf
        a[hs] = e[cols["src"][row[hs]], so[row[hs]] + col[hs]]
        hd = db[row] == buf
        b[hd] = e[cols["dst"][row[hd]], do[row[hd]] + col[hd]]
    bad = np.bincount(row[a != b], minlength=len(count)) > 0
    return same & ~bad


def _shape_ids(elems, cols, o, j, per, rows) -> tuple[np.ndarray, list[tuple[int, ...]]]:
    """Per landing row: the id of its piece's chunk shape (element counts), ids in order of
    first landing; and the shapes."""
    op, piece = o[rows], j[rows]
    sb = cols["src_buf"][op]
    src = cols["src"][op]
    lo = cols["src_off"][op] + piece * per[op]
    single = per[op] == 1
    key = np.zeros(len(rows), dtype=np.int64)
    for buf, e in enumerate(elems):
        m = single & (sb == buf)
        key[m] = e[src[m], lo[m]]
    # single-chunk shapes are keyed by their element count, longer ones by the tuple
    keys: list = [None] * len(rows)
    ids = np.empty(len(rows), dtype=np.int64)
    shapes: dict[tuple[int, ...], int] = {}
    if single.all():
        values, first, inverse = np.unique(key, return_index=True, return_inverse=True)
        rank = np.empty(len(values), dtype=np.int64)
        rank[np.argsort(first, kind="stable")] = np.arange(len(values))
        ids = rank[inverse.reshape(-1)]
        by_id = values[np.argsort(first, kind="stable")]
        return ids, [(int(v),) for v in by_id.tolist()]
    key_l = key.tolist()
    for i, (is_one, op_i, p_lo) in enumerate(zip(single.tolist(), op.tolist(), lo.tolist(),
                                                     strict=True)):
        if is_one:
            keys[i] = (key_l[i],)
        else:
            e = elems[int(cols["src_buf"][op_i])]
            keys[i] = tuple(int(x) for x in e[int(cols["src"][op_i]), p_lo:p_lo + int(per[op_i])])
        ids[i] = shapes.setdefault(keys[i], len(shapes))
    return ids, list(shapes)


def _assign_regions(rank: np.ndarray, shape: np.ndarray, written: np.ndarray, n: int,
                    n_shapes: int) -> np.ndarray:
    """Scratch region of every landing, in the order given: the lowest-numbered region of
    its (rank, shape) that is free when it is written (a region written in sub-step ``t`` is
    read in ``t + 1`` and free again from ``t + 2``), else a new one.

    One greedy pass per (rank, shape) in request order, vectorized over all of them: the
    ``q``-th request of every (rank, shape) is served in round ``q``. Unused regions are free
    at ``-inf``, so the lowest free one is a new region exactly when none is free.
    """
    group = rank * max(n_shapes, 1) + shape
    groups, g = np.unique(group, return_inverse=True)
    g = g.reshape(-1)
    order = np.argsort(g, kind="stable")
    sizes = np.bincount(g, minlength=len(groups))
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    region = np.zeros(len(g), dtype=np.int64)
    cap = 4
    free = np.full((len(groups), cap), -np.inf)
    by_size = np.argsort(-sizes, kind="stable")       # groups still served, largest first
    for q in range(int(sizes.max(initial=0))):
        live = by_size[:int(np.searchsorted(-sizes[by_size], -q, side="left"))]
        req = order[starts[live] + q]
        t = written[req].astype(np.float64)
        pick = np.argmax(free[live] <= t[:, None], axis=1)
        free[live, pick] = t + 2
        region[req] = pick
        if int(pick.max(initial=0)) >= cap - 1:       # keep one never-used region at the end
            free = np.concatenate([free, np.full((len(groups), cap), -np.inf)], axis=1)
            cap *= 2
    return region


def _steps_reading_own_writes(s: Schedule, only: np.ndarray | None = None) -> np.ndarray:
    """Per step: whether an op of it reads a chunk that an op of the same step writes (only
    the steps in ``only`` are examined when it is given; the others are False)."""
    ops = s.ops
    if only is not None:
        ops = ops.take(np.isin(ops.step, only))
    widths = np.array([s.n_chunks(b) for b in Buf], dtype=np.int64)
    base = np.concatenate([[0], np.cumsum(widths * s.n)[:-1]])
    n_slots = int((widths * s.n).sum()) + 1

    def keys(rank, buf, off):
        cnt = ops.count.astype(np.int64)
        within = np.arange(int(cnt.sum())) - np.repeat(np.cumsum(cnt) - cnt, cnt)
        slot = np.repeat(base[buf] + rank.astype(np.int64) * widths[buf] + off, cnt) + within
        return np.repeat(ops.step.astype(np.int64), cnt) * n_slots + slot

    writes = np.sort(keys(ops.dst, ops.dst_buf.astype(np.int64), ops.dst_off.astype(np.int64)))
    reads = keys(ops.src, ops.src_buf.astype(np.int64), ops.src_off.astype(np.int64))
    out = np.zeros(s.n_steps, dtype=bool)
    if len(writes) and len(reads):
        at = np.minimum(np.searchsorted(writes, reads), len(writes) - 1)
        out[np.unique(reads[writes[at] == reads] // n_slots)] = True
    return out
