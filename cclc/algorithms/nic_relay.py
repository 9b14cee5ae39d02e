"""A schedule planned with a lost NIC working, moved onto the machine without it.

Synthesis packs trees by the fabric's symmetry; a GPU whose NIC failed breaks it (no
automorphism moves every rank), and the trees it packs without the symmetry are several
times slower (`synth` on a 16-server HGX fabric with one NIC gone: trees of 18.6 ms where
the healthy fabric's take 5.1 ms, IR model). :func:`healed_nics` gives the collective on its
machine with those NICs working again, where the symmetry holds; :func:`relay_lost_nics`
takes a schedule planned there back to the real machine: every op that crossed servers from
or to a GPU without its NIC is routed whole through the NIC of one of its server's GPUs that
still has one (the relays of :class:`~cclc.algorithms.nic_spread.NicSpread`, over the same
fewest-hop paths ECMP carries), the least busy in the op's step, so the server's live NICs
share the dead one's bytes: about ``1 + 1/L`` of the healthy time with ``L`` live NICs. Ops
are not cut (as :class:`~cclc.algorithms.nic_spread.SpreadBuilder` cuts them): a tree
schedule's chunks are linked through its receive slots, so cutting one cuts them all
(sevenfold chunks made its verification 13 times slower for 1.3% of time).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from cclc.algorithms.nic_spread import NicSpread
from cclc.collective import Collective
from cclc.ir import Schedule, ScheduleBuilder

__all__ = ["healed_nics", "nic_slowdown", "relay_lost_nics"]


def _spread(coll: Collective) -> NicSpread:
    # the block size only decides whether chunks may be cut, which nothing here does
    return NicSpread(coll, 0)


def healed_nics(coll: Collective) -> Collective | None:
    """``coll`` with every NIC its members lost working again (each failed link touching such
    a NIC healed; every other fault kept), where a member lost its NIC and its server has two
    or more live ones to relay through; ``None`` elsewhere."""
    spread = _spread(coll)
    if not spread.relays:
        return None
    topo = coll.topology
    rank, nic, usable = topo.gpu_nics()
    lost = nic[np.isin(rank, spread.group[list(spread.relays)]) & ~usable]
    touches = np.isin(topo.link_src, lost) | np.isin(topo.link_dst, lost)
    failed = topo.link_failed & ~touches
    failed.setflags(write=False)
    return replace(coll, topology=replace(topo, link_failed=failed, _cache={}))


def nic_slowdown(coll: Collective) -> float:
    """How much slower a schedule of the healed machine is expected to run once relayed:
    ``(L + 1) / L`` for the server with the fewest live NICs ``L`` among those relaying."""
    relays = _spread(coll).relays
    return max(((len(r) + 1) / len(r) for r in relays.values()), default=1.0)


def relay_lost_nics(s: Schedule, coll: Collective) -> Schedule | None:
    """``s`` (planned on :func:`healed_nics` of ``coll``) on ``coll``'s machine: each op
    between servers with an end whose NIC is lost takes the path through one relay's NIC (a
    GPU of that end's server with a live one), chosen op by op in each step, largest first,
    as the path whose busiest link (seconds, counting every other op of the step) stays least
    busy, then the least total, then the first relay; its ``params`` gain ``nic_relayed``
    (how many ops were relayed). ``None`` where such an op has fewer than
    two fewest-hop relay paths or another op's route crosses a failed link (then the healed
    plan does not carry over)."""
    spread = _spread(coll)
    topo = coll.topology
    ops = s.ops
    src, dst = ops.src.astype(np.int64), ops.dst.astype(np.int64)
    moved = np.flatnonzero((spread.node[src] != spread.node[dst])
                           & (spread.dead[src] | spread.dead[dst]))
    paths = {k: spread.parts(int(src[k]), int(dst[k])) for k in moved.tolist()}
    if any(len(p) < 2 for p in paths.values()):
        return None
    kept = np.ones(len(ops), dtype=bool)
    kept[moved] = False
    op_of, link = s.op_links()
    if topo.link_failed[link[kept[op_of]]].any():
        return None
    size = s.op_bytes().astype(np.float64)
    seconds = 1.0 / topo.link_bandwidth
    # every other op's busy seconds on the links the relay paths cross, per (step, link)
    watched = np.unique(np.concatenate([p for ps in paths.values() for p in ps]
                                       or [np.zeros(0, dtype=np.int64)]))
    on = kept[op_of] & np.isin(link, watched)
    key = ops.step[op_of[on]].astype(np.int64) * topo.n_links + link[on]
    cells, inverse = np.unique(key, return_inverse=True)
    busy = dict(zip(cells.tolist(), np.bincount(
        inverse, weights=size[op_of[on]] * seconds[link[on]]).tolist(), strict=True))
    b = ScheduleBuilder(coll, *s.layouts)
    route = b.routes(s.routes.offsets, s.routes.links)[ops.route]
    for k in sorted(paths, key=lambda k: (int(ops.step[k]), -size[k], k)):
        base = int(ops.step[k]) * topo.n_links
        best = None
        for j, path in enumerate(paths[k]):
            after = [busy.get(base + ln, 0.0) + size[k] * seconds[ln] for ln in path.tolist()]
            score = (max(after), sum(after), j)
            if best is None or score < best[0]:
                best = (score, path)
        assert best is not None
        path = best[1]
        for ln in path.tolist():
            busy[base + ln] = busy.get(base + ln, 0.0) + size[k] * seconds[ln]
        route[k] = b.route(path.tolist())
    b.add(step=ops.step, src=ops.src, dst=ops.dst, route=route, kind=ops.kind,
          src_buf=ops.src_buf, src_off=ops.src_off, dst_buf=ops.dst_buf, dst_off=ops.dst_off,
          count=ops.count)
    return b.build(s.algorithm, s.schedule, s.params + (("nic_relayed", len(paths)),))
