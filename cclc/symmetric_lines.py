"""Verify and time a symmetric AllReduce (AllGather, ReduceScatter) whose cut rings run as
lines, without expanding it.

The schedule (:mod:`cclc.algorithms.torus_cut_allreduce`) is an
:class:`~cclc.symmetric.ExceptedSchedule` with an ``interleaved`` tail: the symmetric
AllReduce of the healthy torus less its ring phases on the rings that a failed link cuts, and
the lines that take their place in the same steps (an AllGather's and a ReduceScatter's:
the phases of one half; a ReduceScatter sums in scratch where the others sum in the output,
its *summing buffer*, :func:`cclc.symmetric.summing_buffer`). Why that is sound, and what is
checked:

* *Ring phases* (:func:`ring_phase_classes`): every op of the base but the local copies of
  step 0 (and a ReduceScatter's copy of its block into its output in the last step) sends one
  chunk of the summing buffer from rank 0 (as a representative) to a neighbour along one
  dimension, reading and writing the same chunk index; the base holds every phase to
  ``span`` steps (its ``params``), so phase ``w`` of unit ``u`` (the chunk index modulo the
  units per block) is the class of the ops in steps ``1 + w span .. (w + 1) span`` of that
  unit, and all of a class's ops move along one dimension (checked).
* Hence a *block*, the members of a class moved onto the ranks of one ring along its
  dimension, touches only that ring's chunks of that unit, and nothing else does while the
  class's steps last: other rings are other ranks, other units other chunks, other phases
  other steps. Replacing a block by other ops with the same property (the *line*: every op of
  the tail is checked to fall in a masked block's steps, ring, unit and dimension, over a
  healthy link) changes nothing outside it.
* The masked (element, class) pairs must be exactly every rank of every ring a failed link
  cuts, with every class along that ring's dimension (:func:`required_lines_mask`): every op
  kept uses healthy links.
* Each block and its line are run side by side on symbolic values (:func:`_run_block`): a
  chunk's value is the set of ring members whose start value of that chunk it sums, so the
  two agree on a chunk for every start state exactly when the sets agree; a line reads only
  start values its block reads too (so they are the base's). Where they differ
  the base's value must be dead: the next access to that chunk after the block's steps, in the
  base (interpreted in rank 0's frame, so once for every translation), is a copy that
  overwrites it without anything reading it in that step, or there is none and the chunk is
  not in the output (a ReduceScatter's scratch). By induction over the blocks in
  time, every value a kept op or an output reads is then the base's, and the base is verified
  (:func:`cclc.symmetric_check.verify_symmetric`).

The lockstep time (:func:`simulate_lined`) is that of :func:`cclc.sim.simulate` on the
expanded schedule: per step, an orbit of links none of whose links the masked ops or the
lines touch carries its orbit's bytes, a touched link its orbit's bytes less the masked ops'
and plus the lines'.
"""

from __future__ import annotations

import numpy as np

from cclc.collective import CollectiveKind
from cclc.errors import ScheduleError
from cclc.ir import Buf, OpKind
from cclc.sim import OverheadSteps, step_charges
from cclc.symmetric import ExceptedSchedule, SymmetricSchedule, TranslationGroup, summing_buffer
from cclc.symmetric_check import busiest_per_step, link_loads, link_orbits, verify_symmetric
from cclc.symmetric_faults import (
    ExceptedLockstep,
    base_step_bytes,
    check_healthy_base,
    masked_instances,
    masked_links,
    op_bytes,
    route_pairs,
    whole_cell_links,
)

__all__ = ["LINED", "cut_rings", "required_lines_mask", "ring_phase_classes", "simulate_lined",
           "verify_lined"]

#: the kinds whose cut rings may run as lines (their base's phases are ring phases)
LINED = (CollectiveKind.ALLREDUCE, CollectiveKind.ALLGATHER, CollectiveKind.REDUCESCATTER)


def _span(base: SymmetricSchedule) -> int:
    span = dict(base.params).get("span")
    if not isinstance(span, int) or span < 1:
        raise ScheduleError("the base names no phase length ('span' in its params): its ring "
                            "phases cannot be told apart")
    return span


def ring_phase_classes(base: SymmetricSchedule) -> np.ndarray:
    """The ring phase of every representative op of ``base``: 0 for a local op, else ``1 + w
    U + u`` for the op of unit ``u`` (its chunk index modulo the ``U`` units of a block) in
    phase ``w`` (steps ``1 + w span .. (w + 1) span``)."""
    o = base.ops
    U = base.per_block(summing_buffer(base.collective.kind)) or 1
    span = _span(base)
    step = o.step.astype(np.int64)
    return np.where(o.src == o.dst, 0, 1 + ((step - 1) // span) * U + o.dst_off % U)


def _link_dims(topo, group: TranslationGroup, links: np.ndarray) -> np.ndarray:
    """The dimension each link moves along (-1 for one between ranks that differ in more than
    one coordinate)."""
    diff = group.coords(topo.link_src[links]) != group.coords(topo.link_dst[links])
    return np.where(diff.sum(axis=0) == 1, np.argmax(diff, axis=0), -1)


def _class_dims(base: SymmetricSchedule, classes: np.ndarray) -> np.ndarray:
    """Per class: the dimension its ops move along (-1 for the local class and for ids no op
    has); :class:`ScheduleError` where the base is not made of ring phases."""
    o, topo, g = base.ops, base.topology, base.group
    work = summing_buffer(base.collective.kind)
    local = classes == 0
    lengths = base.routes.lengths()[o.route]
    remote = ~local
    # a ReduceScatter's last step copies its block from scratch into its output
    last = (o.step == o.n_steps - 1) & (o.src_buf == work) & (o.dst_buf == Buf.OUTPUT) \
        & (o.kind == OpKind.COPY) if work is not Buf.OUTPUT else np.zeros(len(o), dtype=bool)
    bad = (local & (o.step != 0) & ~last) | (remote & (
        (o.step < 1) | (o.src != 0) | (lengths != 1) | (o.count != 1)
        | (o.src_buf != work) | (o.dst_buf != work) | (o.src_off != o.dst_off)))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ScheduleError(f"representative op #{i} is not in a ring phase: a local op after "
                            "step 0, or not one chunk sent from rank 0 over one link into the "
                            "same chunk of a neighbour")
    links = base.routes.links[base.routes.offsets[:-1][o.route[remote]]].astype(np.int64)
    d = _link_dims(topo, g, links)
    dims = np.full(int(classes.max(initial=0)) + 1, -1, dtype=np.int64)
    dims[classes[remote]] = d
    if (dims[classes[remote]] != d).any() or (d < 0).any():
        raise ScheduleError("a ring phase of the base moves along more than one dimension")
    return dims


def cut_rings(topo, group: TranslationGroup) -> dict[int, np.ndarray]:
    """Per dimension with a failed link: per ring (named by its rank whose coordinate along
    that dimension is 0, an index over all ranks) the coordinate ``c`` of its cut ``c -- c+1``
    (the link failed either way), -1 where the ring is whole; :class:`ScheduleError` for a
    ring cut twice."""
    shape = group.shape
    cuts: dict[int, np.ndarray] = {}
    failed = np.flatnonzero(topo.link_failed)
    for f in failed.tolist():
        cs = group.coords(np.array([topo.link_src[f]]))[:, 0]
        cd = group.coords(np.array([topo.link_dst[f]]))[:, 0]
        (d,) = np.flatnonzero(cs != cd)
        m = shape[d]
        c = int(cs[d]) if (cs[d] + 1) % m == cd[d] else int(cd[d])
        ring = cs.copy()
        ring[d] = 0
        r = int(np.ravel_multi_index(tuple(ring), shape))
        at = cuts.setdefault(int(d), np.full(group.order, -1, dtype=np.int64))
        if at[r] not in (-1, c):
            raise ScheduleError(f"the ring along dimension {d} through rank {r} is cut twice: a "
                                "line serves a ring cut once")
        at[r] = c
    return cuts


def _members(group: TranslationGroup, ring: int, d: int) -> np.ndarray:
    """The ranks of the ring along ``d`` named ``ring``, by coordinate along ``d``."""
    c = group.coords(np.array([ring]))
    at = np.repeat(c, group.shape[d], axis=1)
    at[d] = np.arange(group.shape[d])
    return np.asarray(np.ravel_multi_index(tuple(at), group.shape), dtype=np.int64)


def required_lines_mask(base: SymmetricSchedule, classes: np.ndarray, topo,
                        dims: np.ndarray | None = None) -> np.ndarray:
    """``(k, 2)`` sorted unique (element, class) pairs to mask: every rank of every ring of
    ``topo`` (the base's machine with its faults) that a failed link cuts, with every class
    that moves along that ring's dimension (the base's ops go from rank 0, so element ``t``
    moves a class onto the ops from rank ``t``); ``dims``: :func:`_class_dims` of them, where
    the caller has it."""
    dims = _class_dims(base, classes) if dims is None else dims
    found = []
    for d, cut in cut_rings(topo, base.group).items():
        ranks = np.concatenate([_members(base.group, int(r), d)
                                for r in np.flatnonzero(cut >= 0).tolist()])
        for c in np.flatnonzero(dims == d).tolist():
            found.append(np.stack([ranks, np.full(len(ranks), c)], axis=1))
    if not found:
        return np.zeros((0, 2), dtype=np.int64)
    return np.unique(np.concatenate(found).astype(np.int64), axis=0)


def _tail_checks(x: ExceptedSchedule, dims: np.ndarray, span: int) -> np.ndarray:
    """The static checks of the lines' ops; returns each op's class."""
    o, topo, g = x.tail, x.topology, x.group
    work = summing_buffer(x.collective.kind)
    U = x.base.per_block(work) or 1
    routes = x.tail_routes
    n = x.n
    lays = x.layouts
    local = o.src == o.dst
    bufs_ok = np.ones(len(o), dtype=bool)
    for side in ("src", "dst"):
        buf, off = getattr(o, f"{side}_buf"), getattr(o, f"{side}_off")
        bufs_ok &= ((buf == work) & (off >= 0) & (off < len(lays[work]))) | (
            (buf == Buf.SCRATCH) & (off >= 0) & (off < len(lays[Buf.SCRATCH])))
    bad = ~bufs_ok | (o.src < 0) | (o.src >= n) | (o.dst < 0) | (o.dst >= n) \
        | ((o.kind != OpKind.COPY) & (o.kind != OpKind.REDUCE)) | (o.count != 1) | (o.step < 1) \
        | (o.route < 0) | (o.route >= len(routes))
    if bad.any():
        raise ScheduleError(f"line op #{int(np.flatnonzero(bad)[0])} is not one chunk of the "
                            "summing buffer or scratch into another, in range")
    def size(buf: np.ndarray, off: np.ndarray) -> np.ndarray:
        out = np.zeros(len(buf), dtype=np.int64)
        for b in (Buf.OUTPUT, Buf.SCRATCH):
            out[buf == b] = lays[b][off[buf == b]]
        return out

    # (a ReduceScatter's line lands a sum in a chunk of another set, dead by then: the
    # symbolic run checks what it holds)
    bad = (o.src_off % U != o.dst_off % U) \
        | (size(o.src_buf, o.src_off) != size(o.dst_buf, o.dst_off)) \
        | ((o.src_buf == Buf.OUTPUT) & (o.dst_buf == Buf.OUTPUT) & (o.src_off != o.dst_off)) \
        | (local != (o.route == 0)) | (local & (o.src_buf != Buf.SCRATCH))
    if bad.any():
        raise ScheduleError(f"line op #{int(np.flatnonzero(bad)[0])} moves a chunk into one of "
                            "another unit, size or output place, or is local without reading "
                            "scratch, or remote without a route")
    cls = 1 + ((o.step.astype(np.int64) - 1) // span) * U + o.dst_off % U
    if (cls >= len(dims)).any():
        raise ScheduleError(f"line op #{int(np.flatnonzero(cls >= len(dims))[0])} runs after "
                            "the base's last ring phase")
    remote = np.flatnonzero(~local)
    lengths = routes.lengths()[o.route[remote]]
    link = routes.links[routes.offsets[:-1][o.route[remote]]].astype(np.int64)
    bad = (lengths != 1) | topo.link_failed[link] | (topo.link_src[link] != o.src[remote]) \
        | (topo.link_dst[link] != o.dst[remote])
    bad[~bad] |= dims[cls[remote][~bad]] != _link_dims(topo, g, link[~bad])
    if bad.any():
        raise ScheduleError(f"line op #{int(remote[np.flatnonzero(bad)[0]])} goes over a "
                            "failed link, a link that does not join its ranks, more than one "
                            "link, or a link along another dimension than its ring phase's")
    return cls


def _run_block(step, src, dst, kind, src_buf, src_off, dst_buf, dst_off, work: Buf
               ) -> tuple[dict, set, set]:
    """Run ops on one ring's chunks with symbolic values: a chunk's value is (the chunk of
    ``work`` it is a sum of, a bit set of the ring positions whose start value of that chunk
    it sums); at the start a chunk of ``work`` (the output, or a ReduceScatter's scratch)
    holds its own position's bit, another scratch chunk nothing. Returns the final value per
    (position, buffer, chunk) touched, the chunks written, and the chunks whose start value
    is read;
    :class:`ScheduleError` for a read of an empty chunk, two writes to a chunk in one step, or
    a reduction of different chunks or that adds a member twice."""
    val: dict = {}
    written: set = set()
    fresh: set = set()

    def start(key):
        return (key[2], 1 << key[0]) if key[1] == work else (None, 0)

    order = np.argsort(step, kind="stable")
    cols = [np.asarray(a)[order].tolist()
            for a in (step, src, dst, kind, src_buf, src_off, dst_buf, dst_off)]
    new: dict = {}
    at = None
    for st, a, b, k, sb, so, db, do in zip(*cols, strict=True):
        if st != at:
            val.update(new)
            written.update(new)
            new, at = {}, st
        s_key = (a, sb, so)
        t_key = (b, db, do)
        if t_key in new:
            raise ScheduleError(f"two ops write chunk {do} of one rank in step {st}")
        if s_key not in val:
            fresh.add(s_key)
        v = val.get(s_key) or start(s_key)
        if not v[1]:
            raise ScheduleError(f"step {st} reads scratch chunk {so} before anything is in it")
        if k == OpKind.REDUCE:
            if t_key not in val:
                fresh.add(t_key)
            w = val.get(t_key) or start(t_key)
            if not w[1] or w[0] != v[0] or v[1] & w[1]:
                raise ScheduleError(f"step {st} adds different chunks, to an empty one, or a "
                                    "rank's contribution twice")
            v = (v[0], v[1] | w[1])
        new[t_key] = v
    val.update(new)
    written.update(new)
    return val, written, fresh


def _blocks(keys: np.ndarray) -> dict[int, np.ndarray]:
    """The indices of every distinct value of ``keys``, in increasing index, by increasing
    value."""
    order = np.argsort(keys, kind="stable")
    runs = np.split(order, np.flatnonzero(np.diff(keys[order])) + 1) if len(order) else []
    return {int(keys[run[0]]): run for run in runs}


class _Events:
    """Every access to rank 0's chunks of the summing buffer in the base (in rank 0's frame),
    to ask what comes next after a step."""

    def __init__(self, base: SymmetricSchedule) -> None:
        o, g = base.ops, base.group
        self.work = work = summing_buffer(base.collective.kind)
        U = base.per_block(work) or 1
        rows = np.repeat(np.arange(len(o)), o.count)
        q = np.arange(len(rows)) - (np.cumsum(o.count) - o.count)[rows]
        step = o.step[rows].astype(np.int64)
        out = o.dst_buf[rows] == work
        w_chunk = g.chunk_image(o.dst_off[rows] + q, U, g.inverse(o.dst[rows].astype(np.int64)))
        r_in = o.src_buf[rows] == work
        r_chunk = g.chunk_image(o.src_off[rows] + q, U, g.inverse(o.src[rows].astype(np.int64)))
        reduce_ = o.kind[rows] == OpKind.REDUCE
        chunk = np.concatenate([w_chunk[out], r_chunk[r_in], w_chunk[out & reduce_]])
        at = np.concatenate([step[out], step[r_in], step[out & reduce_]])
        read = np.concatenate([np.zeros(int(out.sum()), dtype=bool),
                               np.ones(int(r_in.sum() + (out & reduce_).sum()), dtype=bool)])
        self.stride = int(at.max(initial=0)) + 2
        key = chunk * self.stride + at
        self.keys, inv = np.unique(key, return_inverse=True)
        self.read = np.zeros(len(self.keys), dtype=bool)
        np.logical_or.at(self.read, inv.reshape(-1), read)

    def dead_after(self, chunk0: np.ndarray, step: np.ndarray) -> np.ndarray:
        """Whether each rank-0 chunk's value after ``step`` is overwritten, unread, by the
        next access to it, or never accessed again in a buffer that is not the output."""
        want = chunk0 * self.stride + step + 1
        at = np.searchsorted(self.keys, want)
        found = at < len(self.keys)
        found[found] &= self.keys[at[found]] // self.stride == chunk0[found]
        overwritten = found & ~self.read[np.minimum(at, len(self.keys) - 1)]
        return overwritten | (~found if self.work is not Buf.OUTPUT else False)


def verify_lined(x: ExceptedSchedule) -> None:
    """Raise :class:`ScheduleError` unless the expanded schedule of ``x`` computes its
    AllReduce, AllGather or ReduceScatter on the faulty machine (see the module docstring)."""
    coll, base, g = x.collective, x.base, x.group
    if coll.kind not in LINED or not x.interleaved:
        raise ScheduleError(f"lines replace the ring phases of an allreduce, an allgather or "
                            f"a reducescatter, not of {coll.kind.value}, in the base's own "
                            "steps")
    if coll.topology.failed_ranks:
        raise ScheduleError("exceptions serve failed links; this machine has failed ranks")
    check_healthy_base(x)
    verify_symmetric(base)
    classes = ring_phase_classes(base)
    if not np.array_equal(classes, x.journey):
        i = int(np.flatnonzero(classes != x.journey)[0])
        raise ScheduleError(f"representative op #{i} is given ring phase {int(x.journey[i])}; "
                            f"it belongs to ring phase {int(classes[i])}")
    dims = _class_dims(base, classes)
    want = required_lines_mask(base, classes, coll.topology, dims)
    given = np.unique(np.stack([x.masked_element, x.masked_journey], axis=1), axis=0)
    if len(given) != len(x.masked_element) or not np.array_equal(want, given):
        raise ScheduleError("the masked ring phases are not every phase of every ring a "
                            "failed link cuts, each once")
    span = _span(base)
    work = summing_buffer(coll.kind)
    U = base.per_block(work) or 1
    t_cls = _tail_checks(x, dims, span)
    # every line op in a masked block: (its source, its class) is masked
    t_key = x.tail.src.astype(np.int64) * len(dims) + t_cls
    m_key = x.masked_element * len(dims) + x.masked_journey
    if not np.isin(t_key, m_key).all():
        i = int(np.flatnonzero(~np.isin(t_key, m_key))[0])
        raise ScheduleError(f"line op #{i} runs on a ring phase that is not masked")
    events = _Events(base)
    m_t, m_rep = masked_instances(x)
    o, t = base.ops, x.tail
    m_src = g.act(o.src[m_rep].astype(np.int64), m_t)
    m_dst = g.act(o.dst[m_rep].astype(np.int64), m_t)
    m_chunk = g.chunk_image(o.dst_off[m_rep].astype(np.int64), U, m_t)
    m_cls = classes[m_rep]
    # per dimension and rank: the ring along that dimension through it (its rank at 0 there)
    coords = g.coords(np.arange(x.n))
    ring_of = np.zeros((len(g.shape), x.n), dtype=np.int64)
    for d in range(len(g.shape)):
        c = coords.copy()
        c[d] = 0
        ring_of[d] = np.ravel_multi_index(tuple(c), g.shape)
    m_ring = ring_of[dims[m_cls], m_src]
    t_ring = ring_of[dims[t_cls], t.src.astype(np.int64)]
    # the masked ops and the line ops of each (ring, class) block, in op order: one sort each,
    # not a mask over all of them per block (a 4,096-rank torus cut twice has 32 blocks of
    # half a million ops)
    stride = int(max(m_cls.max(initial=0), t_cls.max(initial=0))) + 1
    m_blocks = _blocks(m_ring * stride + m_cls)
    t_blocks = _blocks(t_ring * stride + t_cls)
    empty = np.zeros(0, dtype=np.int64)
    for key, mb in m_blocks.items():
        ring, cls = divmod(key, stride)
        d = int(dims[cls])
        pos = np.zeros(x.n, dtype=np.int64)
        pos[_members(g, ring, d)] = np.arange(g.shape[d])
        tb = t_blocks.get(key, empty)
        mr = m_rep[mb]
        b_val, b_w, b_fresh = _run_block(o.step[mr], pos[m_src[mb]], pos[m_dst[mb]],
                                         o.kind[mr], np.full(len(mr), int(work)), m_chunk[mb],
                                         np.full(len(mr), int(work)), m_chunk[mb], work)
        l_val, l_w, l_fresh = _run_block(t.step[tb], pos[t.src[tb]], pos[t.dst[tb]],
                                         t.kind[tb], t.src_buf[tb], t.src_off[tb],
                                         t.dst_buf[tb], t.dst_off[tb], work)
        # the line may read only start values the base's phase reads too: those hold the
        # base's values (an earlier difference there is not dead, so it was refused), where
        # a chunk the base overwrites first may still hold an earlier line's
        if not l_fresh <= b_fresh:
            k = min(l_fresh - b_fresh)
            raise ScheduleError(f"the line of ring phase {cls} on the ring through rank {ring} "
                                f"reads chunk {k[2]} of position {k[0]} before writing it, which "
                                "the base's phase does not")
        differ = [k for k in b_w | l_w if k[1] == work
                  and b_val.get(k, (k[2], 1 << k[0])) != l_val.get(k, (k[2], 1 << k[0]))]
        if not differ:
            continue
        members = _members(g, ring, d)
        rank = members[np.array([k[0] for k in differ])]
        chunk0 = g.chunk_image(np.array([k[2] for k in differ]), U, g.inverse(rank))
        end = (cls - 1) // U * span + span
        dead = events.dead_after(chunk0, np.full(len(differ), end))
        if not dead.all():
            k = differ[int(np.flatnonzero(~dead)[0])]
            raise ScheduleError(f"the line of ring phase {cls} on the ring through rank "
                                f"{ring} leaves chunk {k[2]} of rank {int(members[k[0]])} "
                                "other than the base does, and the base reads it later")


def simulate_lined(x: ExceptedSchedule, step_overhead: float = 0.0,
                   overhead_steps: OverheadSteps = "every") -> ExceptedLockstep:
    """The lockstep time of the expanded schedule (:mod:`cclc.sim`'s model) without expanding:
    a step lasts as long as its busiest link (bytes over bandwidth, plus its latency), every
    op going over one link. A link no masked op and no line touches in a step carries its
    orbit's bytes; a touched one its orbit's less the masked ops' plus the lines'."""
    base, topo = x.base, x.topology
    o = base.ops
    L = topo.n_links
    pair_op, pair_link = route_pairs(base)
    orbit = link_orbits(base)
    elems = op_bytes(base)
    step = o.step.astype(np.int64)
    cell = step[pair_op] * L + orbit[pair_link]
    keys, inv = np.unique(cell, return_inverse=True)
    inv = inv.reshape(-1)
    busy = np.bincount(inv, weights=elems[pair_op], minlength=len(keys))
    pairs_in = np.bincount(inv, minlength=len(keys))
    # the masked ops' links, moved, and the lines' links
    at, moved = masked_links(x, pair_op, pair_link)
    t = x.tail.take(np.flatnonzero(x.tail.route != 0))      # local ops take no time
    t_link = x.tail_routes.links[x.tail_routes.offsets[:-1][t.route]].astype(np.int64)
    itemsize = x.collective.dtype.itemsize
    sizes = np.zeros(len(t), dtype=np.int64)
    for b in (Buf.OUTPUT, Buf.SCRATCH):
        sizes[t.src_buf == b] = x.layouts[b][t.src_off[t.src_buf == b]]
    t_bytes = sizes.astype(np.float64) * itemsize
    cells = np.concatenate([step[pair_op[at]] * L + moved, t.step.astype(np.int64) * L + t_link])
    delta = np.concatenate([-elems[pair_op[at]], t_bytes])
    count = np.concatenate([-np.ones(len(at), dtype=np.int64), np.ones(len(t), dtype=np.int64)])
    tkeys, tinv = np.unique(cells, return_inverse=True)
    tinv = tinv.reshape(-1)
    t_busy = np.bincount(tinv, weights=delta, minlength=len(tkeys))
    t_pairs = np.bincount(tinv, weights=count, minlength=len(tkeys)).astype(np.int64)
    c_step, c_link = np.divmod(tkeys, L)
    ck = np.searchsorted(keys, c_step * L + orbit[c_link])
    in_base = ck < len(keys)
    in_base[in_base] &= keys[ck[in_base]] == (c_step * L + orbit[c_link])[in_base]
    ck = np.minimum(ck, max(len(keys) - 1, 0))
    t_busy += np.where(in_base, busy[ck] if len(keys) else 0.0, 0.0)
    t_pairs += np.where(in_base, pairs_in[ck] if len(keys) else 0, 0)
    n_steps = int(max(o.n_steps, int(x.tail.step.max(initial=-1)) + 1))
    bw, lat = topo.link_bandwidth, topo.link_latency
    step_time = np.zeros(n_steps)
    live = t_pairs > 0
    np.maximum.at(step_time, c_step[live], (t_busy / bw[c_link] + lat[c_link])[live])
    # orbit cells with a link nothing touched keep their whole time
    touched = np.bincount(ck[in_base], minlength=len(keys))
    orbit_size = np.bincount(orbit[orbit >= 0], minlength=L)
    k_step, k_orbit = np.divmod(keys, L)
    whole = touched < orbit_size[k_orbit]
    np.maximum.at(step_time, k_step[whole], (busy / bw[k_orbit] + lat[k_orbit])[whole])
    charges = step_charges(np.concatenate([c_step[live], k_step[whole]]),
                           np.ones(int(live.sum() + whole.sum()), dtype=bool), n_steps,
                           step_overhead, overhead_steps)
    link_bytes = link_loads(base)
    np.subtract.at(link_bytes, moved, elems[pair_op[at]])
    np.add.at(link_bytes, t_link, t_bytes)
    busiest = busiest_per_step(
        n_steps, np.concatenate([c_step[live], k_step[whole]]),
        np.concatenate([(t_busy / bw[c_link])[live], (busy / bw[k_orbit])[whole]]),
        np.concatenate([c_link[live], whole_cell_links(base, k_step[whole], k_orbit[whole],
                                                       tkeys)]))
    moved_bytes = base_step_bytes(x, elems, n_steps) + np.bincount(
        t.step.astype(np.int64), weights=t_bytes, minlength=n_steps)
    return ExceptedLockstep(time=float(step_time.sum() + charges.sum()),
                            step_time=step_time + charges, link_bytes=link_bytes,
                            step_bytes=moved_bytes, step_busiest_link=busiest)
