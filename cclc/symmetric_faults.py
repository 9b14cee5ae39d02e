"""Verify, time and expand a symmetric AllToAll with exceptions for failed links.

An :class:`~cclc.symmetric.ExceptedSchedule` is the symmetric schedule of the healthy torus
less the journeys that cross a failed link (*masked*), then an ordinary *tail* that delivers
what they would have. Why that is sound, and how each part is checked without expanding:

* :func:`cclc.symmetric_check.journeys` verifies the base on the healthy torus and checks
  that every op reads only what the previous ops of its own journey wrote (or an input no op
  writes). Leaving whole journeys out then changes no value another op reads: the last write
  before a read is its journey's, and it stays.
* The masked journeys must be exactly those some op of which, moved, crosses a failed link
  (:func:`required_mask`, recomputed and compared): every op kept uses healthy links only.
* After the base less the masked journeys, every output chunk whose last writer was kept
  holds what the verified base put there; the others (:func:`masked_outputs`) must be written
  by the tail. The tail reads only inputs (which no op of the base writes) and its own scratch
  chunks (from ``tail_scratch_from`` on, which the base never touches), so
  :func:`verify_tail` runs it on its own, from the inputs, on explicit state: routes on healthy
  links that the machine's routing carries, no empty reads, no two writes to a chunk in a
  step, and every masked output chunk (and any other it writes) ends with the right data.

The lockstep time (:func:`simulate_excepted`) is that of :func:`cclc.sim.simulate` on the
expanded schedule (:func:`expand_excepted`): per step of the base, the busiest link less what
the masked ops would have put on it, then the tail's steps, simulated as an ordinary schedule.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cclc.collective import CollectiveKind
from cclc.errors import ScheduleError
from cclc.ir import Buf, OpKind, Ops, Routes, Schedule
from cclc.routing import carried_routes
from cclc.sim import OverheadSteps, simulate, step_charges
from cclc.symmetric import ExceptedSchedule, SymmetricSchedule, expand, healthy_collective
from cclc.symmetric_check import (
    Journeys,
    busiest_per_step,
    journeys,
    link_loads,
    link_orbits,
    orbit_links,
    step_bytes,
)

__all__ = ["ExceptedLockstep", "base_step_bytes", "check_healthy_base", "expand_excepted",
           "masked_instances", "masked_links", "masked_outputs", "op_bytes", "required_mask",
           "route_pairs", "simulate_excepted", "verify_excepted", "verify_tail",
           "whole_cell_links"]


def route_pairs(s: SymmetricSchedule) -> tuple[np.ndarray, np.ndarray]:
    """(representative op, link) for every link of every representative's route."""
    o, routes = s.ops, s.routes
    lengths = routes.lengths()[o.route]
    pair_op = np.repeat(np.arange(len(o)), lengths)
    within = np.arange(int(lengths.sum())) - (np.cumsum(lengths) - lengths)[pair_op]
    pair_link = routes.links[routes.offsets[:-1][o.route][pair_op] + within].astype(np.int64)
    return pair_op, pair_link


def required_mask(base: SymmetricSchedule, journey: np.ndarray, topo) -> np.ndarray:
    """``(k, 2)`` sorted unique (element, journey) pairs whose ops cross a failed link of
    ``topo`` (the base's machine with its faults): a representative link ``l`` moved by ``t``
    is failed link ``f`` exactly when ``l`` is in ``f``'s orbit and ``t = src(f) - src(l)``."""
    g = base.group
    pair_op, pair_link = route_pairs(base)
    orbit = link_orbits(base)
    pair_orbit = orbit[pair_link]
    found = []
    for f in np.flatnonzero(topo.link_failed).tolist():
        hit = pair_orbit == orbit[f]
        t = g.act(np.full(int(hit.sum()), topo.link_src[f], dtype=np.int64),
                  g.inverse(topo.link_src[pair_link[hit]].astype(np.int64)))
        found.append(np.stack([t, journey[pair_op[hit]]], axis=1))
    if not found:
        return np.zeros((0, 2), dtype=np.int64)
    return np.unique(np.concatenate(found), axis=0)


def masked_instances(x: ExceptedSchedule) -> tuple[np.ndarray, np.ndarray]:
    """(element, representative) of every op the masked journeys leave out."""
    members = np.argsort(x.journey, kind="stable")
    start = np.searchsorted(x.journey[members], x.masked_journey)
    size = np.bincount(x.journey, minlength=len(x.journey))[x.masked_journey]
    owner = np.repeat(np.arange(len(size)), size)
    within = np.arange(int(size.sum())) - (np.cumsum(size) - size)[owner]
    return x.masked_element[owner], members[start[owner] + within]


def masked_links(x: ExceptedSchedule, pair_op: np.ndarray, pair_link: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]:
    """For every link of every masked op's route: its (representative op, link) pair's index
    into ``pair_op``/``pair_link`` (:func:`route_pairs`, sorted by op), and the link moved."""
    m_t, m_rep = masked_instances(x)
    starts = np.searchsorted(pair_op, m_rep, side="left")
    ends = np.searchsorted(pair_op, m_rep, side="right")
    size = ends - starts
    owner = np.repeat(np.arange(len(m_rep)), size)
    at = starts[owner] + np.arange(int(size.sum())) - (np.cumsum(size) - size)[owner]
    return at, x.group.link_image(x.topology, pair_link[at], m_t[owner])


def masked_outputs(x: ExceptedSchedule, found: Journeys) -> tuple[np.ndarray, np.ndarray]:
    """(rank, output chunk) of every output chunk whose last writer in the base is masked:
    rank 0's chunk ``c`` last written by representative ``j`` moved by ``-dst[j]`` is, moved
    by ``t``, last written by ``j`` moved by ``t - dst[j]``."""
    g, base = x.group, x.base
    chunk0 = np.flatnonzero(found.output_writer >= 0)
    writer = found.output_writer[chunk0]
    root = x.journey[writer]
    order = np.argsort(root, kind="stable")
    root, writer, chunk0 = root[order], writer[order], chunk0[order]
    lo = np.searchsorted(root, x.masked_journey, side="left")
    hi = np.searchsorted(root, x.masked_journey, side="right")
    size = hi - lo
    owner = np.repeat(np.arange(len(size)), size)
    at = lo[owner] + np.arange(int(size.sum())) - (np.cumsum(size) - size)[owner]
    rank = g.act(base.ops.dst[writer[at]].astype(np.int64), x.masked_element[owner])
    k = base.per_block(Buf.OUTPUT) or 1
    return rank, g.chunk_image(chunk0[at], k, rank)


def check_healthy_base(x: ExceptedSchedule) -> None:
    """Raise :class:`ScheduleError` unless ``x``'s base is its collective on the healthy
    machine: the same collective, links and speeds, no failed link."""
    coll, base = x.collective, x.base
    healed = healthy_collective(coll)
    b = base.collective
    bt, ht = b.topology, healed.topology
    if (b.name, b.kind, b.group, b.size, b.dtype) != (healed.name, healed.kind, healed.group,
                                                       healed.size, healed.dtype) or \
            bt.n_links != ht.n_links or not all(
                np.array_equal(getattr(bt, a), getattr(ht, a)) for a in
                ("link_src", "link_dst", "link_bandwidth", "link_latency", "link_failed")):
        raise ScheduleError("the base is not the same collective on the healthy machine")


def verify_excepted(x: ExceptedSchedule) -> Journeys:
    """Raise :class:`ScheduleError` unless the expanded schedule of ``x`` computes its
    AllToAll on the faulty machine (see the module docstring); returns the base's journeys."""
    coll, base = x.collective, x.base
    if coll.kind is not CollectiveKind.ALLTOALL or x.interleaved:
        raise ScheduleError(f"exceptions with a tail after the base are for an alltoall's "
                            f"independent journeys, not {coll.kind.value} (an allreduce's "
                            "lines: cclc.symmetric_lines)")
    if coll.topology.failed_ranks:
        raise ScheduleError("exceptions serve failed links; this machine has failed ranks")
    check_healthy_base(x)
    found = journeys(base)
    if not np.array_equal(found.root, x.journey):
        i = int(np.flatnonzero(found.root != x.journey)[0])
        raise ScheduleError(f"representative op #{i} is given journey {int(x.journey[i])}; "
                            f"it belongs to journey {int(found.root[i])}")
    o = base.ops
    scratch = (o.src_buf == Buf.SCRATCH) & (o.src_off + o.count > x.tail_scratch_from)
    scratch |= (o.dst_buf == Buf.SCRATCH) & (o.dst_off + o.count > x.tail_scratch_from)
    if (o.dst_buf == Buf.INPUT).any() or scratch.any():
        raise ScheduleError("the base writes an input, or touches the tail's scratch chunks: "
                            "the tail could not run on its own")
    want = required_mask(base, x.journey, coll.topology)
    given = np.unique(np.stack([x.masked_element, x.masked_journey], axis=1), axis=0)
    if len(given) != len(x.masked_element) or not np.array_equal(want, given):
        missing = {tuple(r) for r in want.tolist()} - {tuple(r) for r in given.tolist()}
        why = (f"journey {missing.pop()[1]} crosses a failed link but is not masked" if missing
               else "masks a journey twice, or one that crosses no failed link")
        raise ScheduleError(f"the masked journeys are not those crossing a failed link: {why}")
    verify_tail(x, *masked_outputs(x, found))
    return found


def _tail_text(x: ExceptedSchedule, i: int) -> str:
    o = x.tail
    word = {Buf.INPUT: "input", Buf.OUTPUT: "output", Buf.SCRATCH: "scratch"}
    path = ",".join(map(str, x.tail_routes.path(int(o.route[i])))) or "-"
    return (f"tail op #{i} (step {int(o.step[i])}: {int(o.src[i])}."
            f"{word[Buf(int(o.src_buf[i]))]}[{int(o.src_off[i])}+{int(o.count[i])}] -> "
            f"{int(o.dst[i])}.{word[Buf(int(o.dst_buf[i]))]}[{int(o.dst_off[i])}] via {path})")


def _tail_static(x: ExceptedSchedule) -> None:
    """Ranges, buffers, chunk sizes and routes of the tail's ops, each on its own."""
    o, n, lay = x.tail, x.n, x.layouts
    nc = np.array([len(a) for a in lay], dtype=np.int64)
    first = x.tail_scratch_from
    checks = [
        ((o.src < 0) | (o.src >= n) | (o.dst < 0) | (o.dst >= n) | (o.count < 1) | (o.step < 0)
         | (o.route < 0) | (o.route >= len(x.tail_routes)) | (o.kind != OpKind.COPY),
         "names a rank, step, count or route out of range, or reduces"),
        (~np.isin(o.src_buf, [Buf.INPUT, Buf.SCRATCH]) | ~np.isin(o.dst_buf, [Buf.OUTPUT,
                                                                             Buf.SCRATCH]),
         "reads other than an input or its scratch, or writes other than an output or its "
         "scratch"),
        (((o.src_buf == Buf.SCRATCH) & (o.src_off < first))
         | ((o.dst_buf == Buf.SCRATCH) & (o.dst_off < first)),
         f"uses a scratch chunk of the base (the tail's start at {first})"),
    ]
    for bad, why in checks:
        if bad.any():
            raise ScheduleError(f"{_tail_text(x, int(np.flatnonzero(bad)[0]))}: {why}")
    sb, db = np.clip(o.src_buf, 0, 2), np.clip(o.dst_buf, 0, 2)
    bad = (o.src_off + o.count > nc[sb]) | (o.dst_off + o.count > nc[db])
    if bad.any():
        raise ScheduleError(f"{_tail_text(x, int(np.flatnonzero(bad)[0]))}: reads or writes "
                            "past the end of a buffer")
    rows = np.repeat(np.arange(len(o)), o.count)
    j = np.arange(len(rows)) - (np.cumsum(o.count) - o.count)[rows]
    bad_chunk = (_sizes(lay, o.src_buf[rows], o.src_off[rows] + j)
                 != _sizes(lay, o.dst_buf[rows], o.dst_off[rows] + j))
    if bad_chunk.any():
        raise ScheduleError(f"{_tail_text(x, int(rows[np.flatnonzero(bad_chunk)[0]]))}: "
                            "copies a chunk onto a chunk of another size")
    _tail_routes(x)


def _sizes(lay, buf: np.ndarray, chunk: np.ndarray) -> np.ndarray:
    out = np.zeros(len(buf), dtype=np.int64)
    for b in Buf:
        m = buf == b
        out[m] = lay[b][chunk[m]]
    return out


def _tail_routes(x: ExceptedSchedule) -> None:
    """Every tail op's route: a chain of usable links from its source to its destination that
    the machine's routing carries (local ops: none)."""
    o, topo, routes = x.tail, x.topology, x.tail_routes
    links = routes.links.astype(np.int64)
    lengths = routes.lengths()
    exists = (links >= 0) & (links < topo.n_links)
    safe = np.where(exists, links, 0)
    good = exists & ~topo.link_failed[safe]
    chain = np.ones(len(links), dtype=bool)
    if len(links) > 1:
        chain[1:] = topo.link_src[safe[1:]] == topo.link_dst[safe[:-1]]
    starts = routes.offsets[:-1]
    chain[starts[lengths > 0]] = True
    ok = np.ones(len(routes), dtype=bool)
    ok[np.repeat(np.arange(len(routes)), lengths)[~(good & chain)]] = False
    first = np.full(len(routes), -1, dtype=np.int64)
    last = np.full(len(routes), -1, dtype=np.int64)
    nz = lengths > 0
    first[nz] = topo.link_src[safe[starts[nz]]]
    last[nz] = topo.link_dst[safe[routes.offsets[1:][nz] - 1]]
    local = o.src == o.dst
    r = o.route
    bad = np.where(local, r != 0, (r == 0) | ~ok[r] | (first[r] != o.src) | (last[r] != o.dst))
    if not bad.any() and ok.all():
        bad = ~local & ~carried_routes(topo, routes)[r]
    if bad.any():
        raise ScheduleError(f"{_tail_text(x, int(np.flatnonzero(bad)[0]))}: has a route that "
                            "is not a path of usable links from its source to its destination "
                            "that the machine's routing carries")


def verify_tail(x: ExceptedSchedule, rank: np.ndarray, chunk: np.ndarray) -> None:
    """Run the tail alone from the inputs (explicit state: its scratch chunks of every rank,
    the output chunks it writes) and check that it writes every output chunk ``(rank,
    chunk)`` with the right data, and any other it writes too (see the module docstring)."""
    _tail_static(x)
    o, n, lay = x.tail, x.n, x.layouts
    E = int(lay[Buf.INPUT].sum())                       # elements of a rank's input
    in_start = np.concatenate([[0], np.cumsum(lay[Buf.INPUT])[:-1]])
    first = x.tail_scratch_from
    width = len(lay[Buf.SCRATCH]) - first
    EMPTY = -1
    scratch = np.full((n, max(width, 0)), EMPTY, dtype=np.int64)
    out_key, out_val, out_step = [], [], []
    rows = np.repeat(np.arange(len(o)), o.count)
    j = np.arange(len(rows)) - (np.cumsum(o.count) - o.count)[rows]
    order = np.argsort(o.step[rows], kind="stable")
    rows, j = rows[order], j[order]
    cuts = np.flatnonzero(np.diff(o.step[rows])) + 1
    n_out = len(lay[Buf.OUTPUT])
    for idx in np.split(np.arange(len(rows)), cuts) if len(rows) else ():
        op, jj = rows[idx], j[idx]
        src, dst = o.src[op].astype(np.int64), o.dst[op].astype(np.int64)
        s_off, d_off = o.src_off[op] + jj, o.dst_off[op] + jj
        from_input = o.src_buf[op] == Buf.INPUT
        got = np.where(from_input, src * E + in_start[np.where(from_input, s_off, 0)], EMPTY)
        sc = ~from_input
        got[sc] = scratch[src[sc], s_off[sc] - first]
        if (got == EMPTY).any():
            k = int(np.flatnonzero(got == EMPTY)[0])
            raise ScheduleError(f"{_tail_text(x, int(op[k]))}: reads a chunk that is empty then")
        to_out = o.dst_buf[op] == Buf.OUTPUT
        key = np.where(to_out, dst * n_out + d_off, -(dst * max(width, 1) + d_off - first) - 1)
        uniq, count = np.unique(key, return_counts=True)
        if (count > 1).any():
            k = int(np.flatnonzero(key == uniq[np.flatnonzero(count > 1)[0]])[0])
            raise ScheduleError(f"{_tail_text(x, int(op[k]))}: writes a chunk another tail op "
                                "writes in the same step")
        ts = ~to_out
        scratch[dst[ts], d_off[ts] - first] = got[ts]
        out_key.append(key[to_out])
        out_val.append(got[to_out])
        out_step.append(np.full(int(to_out.sum()), int(o.step[op[0]])))
    keys = np.concatenate(out_key) if out_key else np.zeros(0, dtype=np.int64)
    vals = np.concatenate(out_val) if out_val else np.zeros(0, dtype=np.int64)
    steps = np.concatenate(out_step) if out_step else np.zeros(0, dtype=np.int64)
    last = np.lexsort((steps, keys))
    keys, vals = keys[last], vals[last]
    final = np.r_[keys[1:] != keys[:-1], True] if len(keys) else np.zeros(0, dtype=bool)
    keys, vals = keys[final], vals[final]
    # output chunk c of rank r: block b = c // k from rank b, its input chunk r k + c % k
    k = x.base.per_block(Buf.OUTPUT) or 1
    r, c = np.divmod(keys, n_out)
    want = (c // k) * E + in_start[r * k + c % k]
    if (vals != want).any():
        bad = int(np.flatnonzero(vals != want)[0])
        raise ScheduleError(f"the tail leaves rank {int(r[bad])}'s output chunk {int(c[bad])} "
                            f"holding data coordinate {int(vals[bad])}; it should hold "
                            f"{int(want[bad])}")
    need = np.unique(rank.astype(np.int64) * n_out + chunk)
    lost = need[~np.isin(need, keys)]
    if len(lost):
        r0, c0 = divmod(int(lost[0]), n_out)
        raise ScheduleError(f"rank {r0}'s output chunk {c0} is last written by a masked journey "
                            "and the tail does not deliver it")


@dataclass(frozen=True, eq=False)
class ExceptedLockstep:
    """The lockstep time of an excepted schedule: total, per step (the base's, then the
    tail's: time, bytes, busiest link) and the bytes of every link, as
    :func:`cclc.sim.simulate` gives the expansion."""

    time: float
    step_time: np.ndarray
    link_bytes: np.ndarray
    step_bytes: np.ndarray
    step_busiest_link: tuple[int | None, ...]


def base_step_bytes(x: ExceptedSchedule, elems: np.ndarray, n_steps: int) -> np.ndarray:
    """Bytes the expanded base moves between ranks in every step, less its masked ops'."""
    base = x.base
    _, m_rep = masked_instances(x)
    m_rep = m_rep[base.routes.lengths()[base.ops.route[m_rep]] > 0]
    masked = np.bincount(base.ops.step[m_rep].astype(np.int64), weights=elems[m_rep],
                         minlength=n_steps)
    return step_bytes(base, elems, n_steps) - masked


def whole_cell_links(base: SymmetricSchedule, cell_step: np.ndarray, cell_orbit: np.ndarray,
                     touched: np.ndarray) -> np.ndarray:
    """For (step, orbit) cells that keep their whole bytes on some links: the lowest link of
    the orbit no exception touches in that step (``touched``: ``step * links + link`` keys of
    the links whose bytes changed)."""
    L = base.topology.n_links
    by_orbit, first = orbit_links(base)
    at = first[cell_orbit]
    out = by_orbit[at]
    hit = np.flatnonzero(np.isin(cell_step * L + out, touched))
    if len(hit):
        moved = set(touched.tolist())
        for i in hit.tolist():
            j = int(at[i])
            while int(cell_step[i]) * L + int(by_orbit[j]) in moved:
                j += 1
            out[i] = by_orbit[j]
    return out


def simulate_excepted(x: ExceptedSchedule, step_overhead: float = 0.0,
                      overhead_steps: OverheadSteps = "every") -> ExceptedLockstep:
    """The lockstep time of the expanded schedule (:mod:`cclc.sim`'s model) without expanding:
    a step's time is the largest, over links, of the link's bytes over its bandwidth plus the
    largest latency of the kept ops on it. A link none of whose ops is masked carries its
    orbit's bytes (:func:`cclc.symmetric_check.simulate_lockstep`); the others are computed
    from the masked ops on them. ``step_overhead`` is charged before every step, or
    (``overhead_steps="peer"``, :func:`cclc.sim.step_charges`) before the steps where a kept
    op runs between two ranks: those with a link that still carries an op."""
    if x.interleaved:
        raise ScheduleError("an interleaved tail is timed by cclc.symmetric_lines")
    base, topo = x.base, x.topology
    o = base.ops
    n_steps = o.n_steps
    pair_op, pair_link = route_pairs(base)
    orbit = link_orbits(base)
    pair_orbit = orbit[pair_link]
    elems = op_bytes(base)
    step = o.step.astype(np.int64)
    L = topo.n_links
    lat = np.bincount(pair_op, weights=topo.link_latency[pair_link], minlength=len(o))
    cell = step[pair_op] * L + pair_orbit
    keys, inv = np.unique(cell, return_inverse=True)
    inv = inv.reshape(-1)
    busy = np.bincount(inv, weights=elems[pair_op], minlength=len(keys))
    pairs_in = np.bincount(inv, minlength=len(keys))
    lat_hi = np.full(len(keys), -np.inf)
    np.maximum.at(lat_hi, inv, lat[pair_op])
    lat_lo = np.full(len(keys), np.inf)
    np.minimum.at(lat_lo, inv, lat[pair_op])
    at, moved = masked_links(x, pair_op, pair_link)
    mcell = step[pair_op[at]] * L + moved
    mkeys, minv = np.unique(mcell, return_inverse=True)
    minv = minv.reshape(-1)
    removed = np.bincount(minv, weights=elems[pair_op[at]], minlength=len(mkeys))
    removed_pairs = np.bincount(minv, minlength=len(mkeys))
    # per reduced (step, link): its orbit cell
    m_step, m_link = np.divmod(mkeys, L)
    ck = np.searchsorted(keys, m_step * L + orbit[m_link])
    if (lat_hi[ck] != lat_lo[ck]).any():
        raise ScheduleError("the ops on one orbit of links in one step have different "
                            "latencies: the exceptions' lockstep time is not computed for that")
    bw = topo.link_bandwidth
    step_time = np.zeros(n_steps)
    kept = pairs_in[ck] > removed_pairs
    red_time = np.where(kept, (busy[ck] - removed) / bw[m_link] + lat_hi[ck], 0.0)
    np.maximum.at(step_time, m_step[kept], red_time[kept])
    # cells with a link no masked op touches keep their whole time
    reduced_links = np.bincount(ck, minlength=len(keys))
    orbit_size = np.bincount(orbit[orbit >= 0], minlength=L)
    k_step, k_orbit = np.divmod(keys, L)
    whole = reduced_links < orbit_size[k_orbit]
    np.maximum.at(step_time, k_step[whole], (busy / bw[k_orbit] + lat_hi)[whole])
    # an op between two ranks has a route, so a step has one exactly when one of its links
    # still carries an op: a whole cell, or a reduced one that kept some
    charges = step_charges(np.concatenate([m_step[kept], k_step[whole]]),
                           np.ones(int(kept.sum() + whole.sum()), dtype=bool), n_steps,
                           step_overhead, overhead_steps)
    tail = simulate(_tail_schedule(x), step_overhead=step_overhead,
                    overhead_steps=overhead_steps)
    link_bytes = link_loads(base)
    np.subtract.at(link_bytes, moved, elems[pair_op[at]])
    link_bytes += np.asarray(tail.link_bytes, dtype=np.float64)
    total = float(step_time.sum() + charges.sum()) + float(tail.time)
    step_times = np.concatenate([step_time + charges, tail.step_time])
    busiest = busiest_per_step(
        n_steps, np.concatenate([m_step[kept], k_step[whole]]),
        np.concatenate([((busy[ck] - removed) / bw[m_link])[kept], (busy / bw[k_orbit])[whole]]),
        np.concatenate([m_link[kept], whole_cell_links(base, k_step[whole], k_orbit[whole],
                                                       mkeys)]))
    return ExceptedLockstep(
        time=total, step_time=step_times, link_bytes=link_bytes,
        step_bytes=np.concatenate([base_step_bytes(x, elems, n_steps), tail.step_bytes]),
        step_busiest_link=busiest + tail.step_busiest_link)


def op_bytes(s: SymmetricSchedule) -> np.ndarray:
    o = s.ops
    rows = np.repeat(np.arange(len(o)), o.count)
    j = np.arange(len(rows)) - (np.cumsum(o.count) - o.count)[rows]
    elems = np.bincount(rows, weights=_sizes(s.layouts, o.src_buf[rows], o.src_off[rows] + j),
                        minlength=len(o))
    return elems * s.collective.dtype.itemsize


def _tail_schedule(x: ExceptedSchedule) -> Schedule:
    return Schedule(collective=x.collective, layouts=x.layouts, ops=x.tail,
                    routes=x.tail_routes, algorithm=x.algorithm, schedule="tail")


def expand_excepted(x: ExceptedSchedule) -> Schedule:
    """The ordinary schedule on the faulty machine: the base expanded less the masked ops,
    then the tail with its steps after the base's last (in the base's own steps where it is
    ``interleaved``) and its routes after the base's."""
    base = x.base
    n_rep = len(base.ops)
    keep = np.ones(n_rep * base.group.order, dtype=bool)
    m_t, m_rep = masked_instances(x)
    keep[m_t * n_rep + m_rep] = False
    whole = expand(base, keep)
    n_steps = 0 if x.interleaved else base.ops.n_steps
    R = len(whole.routes)
    tail = x.tail.columns()
    tail = {**tail, "step": tail["step"] + n_steps,
            "route": np.where(tail["route"] == 0, 0, tail["route"] + R - 1)}
    cols = {k: np.concatenate([v, tail[k]]) for k, v in whole.ops.columns().items()}
    if x.interleaved:
        srt = np.argsort(cols["step"], kind="stable")
        cols = {k: v[srt] for k, v in cols.items()}
    ops = Ops(**cols)
    t_off = x.tail_routes.offsets
    offsets = np.concatenate([whole.routes.offsets, whole.routes.offsets[-1] + t_off[2:]])
    links = np.concatenate([whole.routes.links, x.tail_routes.links])
    return Schedule(collective=x.collective, layouts=x.layouts, ops=ops,
                    routes=Routes(offsets, links), algorithm=x.algorithm,
                    schedule=x.schedule, params=base.params)
