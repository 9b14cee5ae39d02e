"""Simulated measurements: per-pair timings of a probe on a topology with injected faults.

The probe is what a burn-in or a profiled job gives the diagnosis: every pair of ranks moving
``bytes_per_pair`` at once (a direct alltoall), routed as the healthy topology routes it
(:func:`cclc.diagnose.routes.pair_routes`: the network does not know about the fault yet). Its
per-pair times come from cclc's simulator (lockstep: a pair takes its route's latency plus the
busy time of its busiest link) on the topology with the fault applied: a *slow* part has its
links' bandwidth divided by ``factor``; a *failed* part black-holes the pairs routed over it,
which never finish (``inf``). Timing noise is multiplicative, log-normal with ``noise`` as the
standard deviation of the log.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from cclc.collective import CollectiveKind, make_collective
from cclc.diagnose.pair_timings import Timings, make_timings
from cclc.diagnose.routes import pair_routes
from cclc.ir import Buf, ScheduleBuilder
from cclc.sim import simulate
from cclc.topology import Topology

__all__ = ["Fault", "probe_timings"]


@dataclass(frozen=True, slots=True)
class Fault:
    """An injected fault: ``links`` (directed link ids) run ``factor`` times slower, or never
    deliver when ``failed``. ``kind`` and ``name`` are for reports."""

    kind: str
    name: str
    links: tuple[int, ...]
    factor: float = 2.0
    failed: bool = False


def probe_timings(topo: Topology, faults: tuple[Fault, ...] = (), noise: float = 0.0,
                  bytes_per_pair: int = 1 << 20, seed: int = 0,
                  ranks: tuple[int, ...] | None = None) -> Timings:
    """Per-pair times of an all-pairs probe among ``ranks`` (default: every live rank)."""
    group = tuple(ranks) if ranks is not None else topo.live_ranks()
    n = len(group)
    g = np.asarray(group, dtype=np.int64)
    gs, gd = np.divmod(np.arange(n * n, dtype=np.int64), n)
    keep = gs != gd
    gs, gd = gs[keep], gd[keep]
    routes = pair_routes(topo, g[gs], g[gd])
    bw = topo.link_bandwidth.copy()
    dead = np.zeros(topo.n_links, dtype=bool)
    for f in faults:
        if f.failed:
            dead[list(f.links)] = True
        else:
            bw[list(f.links)] /= f.factor
    bw.setflags(write=False)
    slow_topo = replace(topo, link_bandwidth=bw, _cache={})
    elems = bytes_per_pair // 4
    key = ("diagnose.probe", group, elems)
    if key not in topo._cache:
        # the probe is built once per machine: only the bandwidths change between faults
        coll = make_collective("probe", CollectiveKind.ALLTOALL, topo, group,
                               size=elems * 4 * n)
        b = ScheduleBuilder(coll, input=[elems] * n, output=[elems] * n)
        rid = np.array([b.route(tuple(routes.links[routes.offsets[k]:routes.offsets[k + 1]]
                                      .tolist())) for k in range(len(gs))], dtype=np.int32)
        b.add(step=0, src=gs, dst=gd, route=rid, src_buf=Buf.INPUT, src_off=gd,
              dst_buf=Buf.OUTPUT, dst_off=gs)
        topo._cache[key] = b.build("probe")
    probe = topo._cache[key]
    s = replace(probe, collective=replace(probe.collective, topology=slow_topo), _cache={})
    r = simulate(s, mode="lockstep")
    seconds = (r.op_finish - r.op_start).astype(np.float64)
    if noise > 0:
        rng = np.random.default_rng(seed)
        seconds = seconds * np.exp(rng.normal(0.0, noise, size=len(seconds)))
    hit = np.bincount(routes.pair_of_entry(), weights=dead[routes.links],
                      minlength=len(gs)) > 0
    seconds[hit] = np.inf
    nbytes = np.full(len(gs), float(elems * 4))
    return make_timings(g[s.ops.src], g[s.ops.dst], nbytes, seconds, source="<probe>")
