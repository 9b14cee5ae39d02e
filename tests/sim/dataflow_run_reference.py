"""The dataflow run (:func:`cclc.dataflow._run`) as it was before it became columnar: one
loop over the plan's items in issue order. The columnar run must give exactly the same times,
lanes and groups."""

from __future__ import annotations

import numpy as np

from cclc.dataflow import MAX_LOCAL_LANES, DataflowPlan
from cclc.ir import Schedule


def reference_run(  # noqa: C901 (the loop it replaced, kept as is)
        s: Schedule, plan: DataflowPlan, op_overhead: float, place: bool = False
) -> tuple[float, np.ndarray, np.ndarray]:
    from cclc.sim import prepare

    p = prepare(s)
    o = s.ops
    src, dst = o.src.tolist(), o.dst.tolist()
    lane = plan.lane.tolist()
    group = list(range(len(src))) if place else plan.group.tolist()
    n_lanes = plan.n_lanes
    width = n_lanes + (MAX_LOCAL_LANES if place else plan.n_local)
    offsets, route, links = s.routes.offsets.tolist(), o.route.tolist(), s.routes.links.tolist()
    nbytes, lat = p.op_bytes.tolist(), p.route_latency.tolist()
    bw = s.topology.link_bandwidth.tolist()
    link_free = [0.0] * s.topology.n_links
    lane_free = [0.0] * (s.n * width)
    lane_last = [-1] * (s.n * width)          # the item that used the lane last
    local_last: list[list[float]] = [[] for _ in range(s.n)]   # per rank: last ready per lane
    g_first: dict[int, int] = {}               # group (its first op) -> first item
    g_start: dict[int, float] = {}             # group -> when its members start
    finish = [0.0] * len(plan.items)
    for k, it in enumerate(plan.items):
        op = it.op
        ready = max((finish[d] for d, _ in it.deps), default=0.0)
        net = not it.snap and src[op] != dst[op]
        ends = (src[op], dst[op]) if net else (src[op],)
        if place and src[op] == dst[op] and lane[op] < 0:
            pool = local_last[src[op]]
            fits = [i for i, t in enumerate(pool) if t <= ready]
            if fits:
                c = max(fits, key=lambda i: pool[i])
            elif len(pool) < MAX_LOCAL_LANES:
                c = len(pool)
                pool.append(0.0)
            else:
                c = min(range(len(pool)), key=lambda i: pool[i])
            lane[op] = n_lanes + c
        ln = lane[op]
        slots = [r * width + ln for r in ends]
        if place and net:
            prev = lane_last[slots[0]]
            if prev >= 0 and all(lane_last[x] == prev for x in slots) and \
                    not plan.items[prev].snap:
                g = group[plan.items[prev].op]
                if g_start.get(g, -1.0) >= ready and \
                        all(d < g_first[g] for d, _ in it.deps):
                    group[op] = g
        member = net and group[op] != op
        if member:
            ready = g_start[group[op]]
        else:
            for x in slots:
                ready = max(ready, lane_free[x])
        if place and src[op] == dst[op] and not it.snap:
            local_last[src[op]][ln - n_lanes] = ready
        if not net or offsets[route[op]] == offsets[route[op] + 1]:
            end = ready
        else:
            if not member:
                g_start[op] = ready = ready + op_overhead
                g_first[op] = k
            last = ready
            for q in range(offsets[route[op]], offsets[route[op] + 1]):
                li = links[q]
                begin = max(ready, link_free[li])
                link_free[li] = begin + nbytes[op] / bw[li]
                last = max(last, link_free[li])
            end = last + lat[op]
        finish[k] = end
        for x in slots:
            lane_free[x] = max(lane_free[x], end) if member else end
            lane_last[x] = k
    return (max(finish, default=0.0), np.array(lane, dtype=np.int64),
            np.array(group, dtype=np.int64))
