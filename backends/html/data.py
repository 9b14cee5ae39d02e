"""Plain values for the page: geometry, per-step link loads, the timeline, the buffer view.

Everything is computed from the schedule (ops, routes, layouts) and the simulator's results;
big schedules are aggregated here, so the page's size stays bounded whatever the rank count.
"""

from __future__ import annotations

import numpy as np

from backends.contract import Facts
from backends.html.layout import layout_topology
from cclc.ir import Buf, OpKind, Schedule
from cclc.nccl_model import bus_factor
from cclc.units import format_time

__all__ = ["prepare", "MAX_GANTT_LINKS", "MAX_INTERVALS", "BUFFER_VIEW_LIMIT"]

MAX_GANTT_LINKS = 48      # timeline rows: the busiest links when there are more
MAX_INTERVALS = 400       # per timeline row, merged beyond this
BUFFER_VIEW_LIMIT = 4096  # slots (ranks x chunks) up to which the buffer view is drawn
MAX_STEP_CELLS = 400_000  # (step, link) load cells kept before steps are grouped


def _r(a, nd=1):
    return np.round(np.asarray(a, dtype=float), nd).tolist()


def _step_loads(s: Schedule, op_of: np.ndarray, links: np.ndarray) -> dict:
    """Bytes per (step, link), sparse; steps are grouped when there are too many cells."""
    n_links = s.topology.n_links
    nbytes = s.op_bytes()[op_of].astype(float)
    steps = s.ops.step[op_of].astype(np.int64)
    n_steps = max(s.n_steps, 1)
    group = 1
    while True:
        key = (steps // group) * n_links + links
        uniq, inv = np.unique(key, return_inverse=True)
        if len(uniq) <= MAX_STEP_CELLS or group >= n_steps:
            break
        group *= 2
    load = np.bincount(inv, weights=nbytes, minlength=len(uniq))
    frames = -(-n_steps // group)
    frame_of, link_of = uniq // n_links, uniq % n_links
    per_frame = []
    for f in range(frames):
        m = frame_of == f
        per_frame.append([link_of[m].tolist(), _r(load[m] / 1e6, 4)])  # MB
    return dict(group=group, frames=per_frame,
                total=_r(np.bincount(links, weights=nbytes, minlength=n_links) / 1e6, 4))


def _timeline(s: Schedule, event, op_of: np.ndarray, links: np.ndarray) -> dict:
    """Gantt rows: the busiest links' busy intervals (merged when too many), critical path."""
    start, finish = np.asarray(event.op_start), np.asarray(event.op_finish)
    busy = np.bincount(links, weights=(finish - start)[op_of], minlength=s.topology.n_links)
    used = np.flatnonzero(busy > 0)
    rows = used[np.argsort(-busy[used], kind="stable")][:MAX_GANTT_LINKS]
    crit = set(np.asarray(event.critical_path, dtype=np.int64).tolist())
    out = []
    for link in rows.tolist():
        ops = op_of[links == link]
        order = np.argsort(start[ops], kind="stable")
        ops = ops[order]
        iv = np.stack([start[ops], finish[ops]], axis=1)
        is_crit = np.array([o in crit for o in ops.tolist()], dtype=bool)
        if len(iv) > MAX_INTERVALS:
            # merge into MAX_INTERVALS buckets of consecutive intervals
            b = np.array_split(np.arange(len(iv)), MAX_INTERVALS)
            iv = np.array([[iv[x, 0].min(), iv[x, 1].max()] for x in b])
            is_crit = np.array([is_crit[x].any() for x in b])
        out.append(dict(link=link, iv=(iv * 1e6).round(4).tolist(),
                        crit=np.flatnonzero(is_crit).tolist()))
    return dict(rows=out, shown=len(rows), used=int(len(used)), time_us=float(event.time * 1e6))


def _buffer_view(s: Schedule) -> dict | None:
    """Which chunks each rank holds after each step (origin rank and contribution count)."""
    n = s.n
    n_out = s.n_chunks(Buf.OUTPUT)
    if n * (s.n_chunks(Buf.INPUT) + n_out + s.n_chunks(Buf.SCRATCH)) > BUFFER_VIEW_LIMIT:
        return None
    # state per buffer: origin rank of the first contribution (-1 empty), contribution count
    origin = [np.full((n, s.n_chunks(b)), -1, dtype=np.int64) for b in Buf]
    contrib = [np.zeros((n, s.n_chunks(b)), dtype=np.int64) for b in Buf]
    origin[Buf.INPUT][:] = np.arange(n)[:, None]
    contrib[Buf.INPUT][:] = 1
    frames = []
    o = s.ops
    bounds = np.searchsorted(o.step, np.arange(s.n_steps + 1))
    for step in range(s.n_steps):
        lo, hi = bounds[step], bounds[step + 1]
        reads = []
        for i in range(lo, hi):
            sb, db = int(o.src_buf[i]), int(o.dst_buf[i])
            so, do, c = int(o.src_off[i]), int(o.dst_off[i]), int(o.count[i])
            sr, dr = int(o.src[i]), int(o.dst[i])
            reads.append((i, origin[sb][sr, so:so + c].copy(), contrib[sb][sr, so:so + c].copy()))
        for i, org, cnt in reads:
            db, do, c, dr = int(o.dst_buf[i]), int(o.dst_off[i]), int(o.count[i]), int(o.dst[i])
            if int(o.kind[i]) == OpKind.REDUCE:
                contrib[db][dr, do:do + c] += cnt
            else:
                origin[db][dr, do:do + c] = org
                contrib[db][dr, do:do + c] = cnt
        frames.append([[origin[b].tolist(), contrib[b].tolist()] for b in (Buf.OUTPUT,
                                                                             Buf.SCRATCH)])
    return dict(n=n, out_chunks=n_out, scratch_chunks=s.n_chunks(Buf.SCRATCH), frames=frames)


def _headline(s: Schedule, facts: Facts) -> dict:
    """The time, bandwidths and % of bound the page leads with.

    With a plan's facts (``cclc compile --emit html``) these are the plan's own time under the
    execution model that priced the choice, spelled exactly as the compile prints them; a
    schedule drawn without a plan (``cclc viz``) shows its lockstep simulation.
    """
    lockstep, bound, coll = facts.lockstep, facts.bounds, s.collective
    assert lockstep is not None and bound is not None
    if facts.time is not None and facts.model is not None:
        time, model = facts.time, facts.model.label
    else:
        time, model = lockstep.time, "lockstep simulation, no software cost"
    pct = 100.0 * bound.best / time if time > 0 else 100.0
    algbw = coll.size / time if time > 0 else float("inf")
    return dict(time_us=time * 1e6, time_text=format_time(time), model=model,
                algbw=algbw / 1e9, busbw=algbw * bus_factor(coll.kind, coll.n) / 1e9,
                bound_us=bound.best * 1e6, bound_text=format_time(bound.best),
                bound_name=bound.name, pct_bound=pct, pct_text=f"{pct:.1f}%",
                lockstep_time_text=format_time(lockstep.time))


def prepare(s: Schedule, facts: Facts) -> dict:
    """Everything the page needs for one schedule, as JSON-ready values; ``facts`` must carry
    the bounds and both simulations."""
    lockstep, event = facts.lockstep, facts.event
    assert lockstep is not None and event is not None
    topo = s.topology
    lay = layout_topology(topo)
    op_of, links = s.op_links()
    loads = _step_loads(s, op_of, links)
    busy = np.asarray(lockstep.link_busy, dtype=float)
    top = np.argsort(-busy, kind="stable")[:8]
    coll = s.collective
    head = _headline(s, facts)
    live = np.ones(topo.n_vertices, dtype=bool)
    live[list(topo.failed_ranks)] = False
    return dict(
        name=coll.name, kind=coll.kind.value, algorithm=s.algorithm, schedule=s.schedule,
        n_ranks=coll.n, size=coll.size, dtype=coll.dtype.value, steps=s.n_steps, ops=len(s.ops),
        **head, event_time_text=format_time(event.time),
        busiest=[dict(link=topo.link_name(int(k)), busy_us=float(busy[k] * 1e6),
                      util=float(busy[k] / lockstep.time) if lockstep.time else 0.0)
                 for k in top.tolist() if busy[k] > 0],
        topo=dict(name=topo.name, kind=topo.kind, n_ranks=topo.n_ranks,
                  names=list(topo.vertex_names), width=lay.width, height=lay.height,
                  vx=_r(lay.vx), vy=_r(lay.vy), seg=np.round(lay.seg, 1).tolist(),
                  boxes=lay.boxes, labels=lay.labels,
                  live=live.tolist(), src=topo.link_src.tolist(), dst=topo.link_dst.tolist(),
                  bw=_r(topo.link_bandwidth / 1e9, 3), failed=topo.link_failed.tolist(),
                  group=list(coll.group)),
        nccl=_nccl(facts),
        loads=loads, timeline=_timeline(s, event, op_of, links), buffers=_buffer_view(s))


def _nccl(facts: Facts) -> dict | None:
    """NCCL's predicted choice and time on the same machine (cclc's model of NCCL), and how
    the schedule compares: the pipeline's comparison (:attr:`Facts.nccl`), made with the time
    the page leads with; ``None`` where NCCL's tables have nothing to say."""
    c = facts.nccl
    if c is None:
        return None
    return dict(name=c.nccl.name, time_us=c.nccl.time_us, busbw=c.nccl.busbw, vs=c.speedup)
