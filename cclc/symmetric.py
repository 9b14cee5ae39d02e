"""Schedules stored by symmetry: one representative per orbit of ops, and the group.

On a healthy torus most schedules are the same from every rank: the ops of rank ``q`` are
those of rank 0 translated by ``q``. A :class:`SymmetricSchedule` keeps only a set of
*representative* ops (one per orbit) and the :class:`TranslationGroup` of the torus; the
ordinary :class:`~cclc.ir.Schedule` is the union of the representatives' images
(:func:`expand`). At 4,096 ranks that is ~50 thousand ops instead of ~200 million.

The group acts on everything an op names:

* a rank ``r`` goes to ``r + t`` (coordinates added modulo the torus's sides; an element is
  named by the rank it sends rank 0 to, so element ``t`` maps 0 to ``t``);
* a link goes to the link between the images of its ends;
* a chunk of a buffer whose blocks belong to ranks (AllToAll's input and output, AllGather's
  output, AllReduce's vector cut into ``n`` blocks: block ``b`` is rank ``b``'s) moves with its
  block: chunk ``j`` of block ``b`` goes to chunk ``j`` of block ``b + t``. Chunks of the other
  buffers (scratch, AllGather's input) stay where they are; an op must not cross a block.

For that to be a symmetry of the collective every translation must map usable links onto
usable links of the same bandwidth and latency (:meth:`TranslationGroup.of` checks it: a failed
link breaks it), the group must be every rank in rank order, and every rank's blocks must be cut
alike (one 1-D layout per buffer, the rank-indexed ones a pattern repeated per block).
Translations act freely (only the identity fixes a rank), so every orbit of ops has exactly
one member per element, and a rank's loads, reads and writes are those of rank 0 moved:
:mod:`cclc.symmetric_check` verifies and times the form without expanding it.

>>> import numpy as np
>>> from cclc.topology import torus
>>> from cclc.collective import CollectiveKind, make_collective
>>> ring = torus("ring", (4,))
>>> coll = make_collective("ag", CollectiveKind.ALLGATHER, ring, (0, 1, 2, 3), size=64)
>>> g = TranslationGroup.of(coll)
>>> g.order, g.act(np.array([0, 1, 3]), 1).tolist()
(4, [1, 2, 0])
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from cclc.collective import Collective, CollectiveKind
from cclc.errors import ScheduleError
from cclc.ir import Buf, Ops, Routes, Schedule

__all__ = ["RANK_INDEXED", "ExceptedSchedule", "SymmetricSchedule", "TranslationGroup", "expand",
           "healthy_collective", "summing_buffer", "symmetric_form"]

#: the buffers whose blocks belong to ranks (move with the group), per collective kind the
#: symmetric form serves. AllReduce's vector is cut into ``n`` blocks, block ``b`` the one rank
#: ``b`` reduces: the collective's contract is the same after moving ranks, blocks, data and
#: contributor sets alike, so a schedule may be symmetric under that action
RANK_INDEXED: dict[CollectiveKind, tuple[Buf, ...]] = {
    CollectiveKind.ALLTOALL: (Buf.INPUT, Buf.OUTPUT),
    CollectiveKind.ALLGATHER: (Buf.OUTPUT,),
    CollectiveKind.ALLREDUCE: (Buf.INPUT, Buf.OUTPUT),
    # a ReduceScatter's result is rank r's block alone; the blocks it sums on the way are in
    # scratch, cut as the input is
    CollectiveKind.REDUCESCATTER: (Buf.INPUT, Buf.SCRATCH),
}


def summing_buffer(kind: CollectiveKind) -> Buf:
    """The rank-indexed buffer in which a schedule of ``kind`` moves and sums blocks: the
    output, or a ReduceScatter's scratch (its output is one block)."""
    return RANK_INDEXED[kind][-1]


@dataclass(frozen=True, slots=True)
class TranslationGroup:
    """The translations of a torus of sides ``shape`` (ranks numbered row-major, last
    coordinate fastest, as :func:`cclc.topology.torus` numbers them); its generators are the
    unit steps along each dimension. Element ``t`` (an int in ``0..order-1``) is the
    translation that maps rank 0 to rank ``t``."""

    shape: tuple[int, ...]

    @property
    def order(self) -> int:
        return math.prod(self.shape)

    @classmethod
    def of(cls, coll: Collective) -> TranslationGroup:
        """The translation group of ``coll``'s torus; :class:`ScheduleError` saying why when
        translations are no symmetry of it (not a torus, a group other than every rank in
        order, a failed rank, a failed link or links of different speeds out of place)."""
        topo = coll.topology
        if topo.dims is None or topo.grid_dims is None:
            raise ScheduleError(f"topology '{topo.name}' is not a torus: no translations")
        shape = tuple(int(d) for d in topo.grid_dims)
        if not all(topo.grid_wrap):
            raise ScheduleError(f"topology '{topo.name}' has unwrapped dimensions (a mesh): "
                                "translations do not map it onto itself")
        n = math.prod(shape)
        if topo.n_vertices != n or topo.failed_ranks:
            raise ScheduleError(f"topology '{topo.name}' has vertices other than its "
                                "healthy ranks: no translations")
        if tuple(coll.group) != tuple(range(n)):
            raise ScheduleError(f"collective '{coll.name}' does not span every rank of "
                                f"'{topo.name}' in order: translations move its group")
        if coll.pair_sizes is not None:
            raise ScheduleError(f"collective '{coll.name}' has per-pair sizes: translations "
                                "do not keep them")
        group = cls(shape)
        usable = ~topo.link_failed
        cls_key = np.stack([topo.link_bandwidth, topo.link_latency]).T
        for axis in range(len(shape)):
            unit = np.zeros(len(shape), dtype=np.int64)
            unit[axis] = 1
            image = group.link_image(topo, np.arange(topo.n_links), group.element(unit))
            ok = image >= 0
            ok[ok] &= usable[image[ok]] == usable[ok]
            ok[ok] &= (cls_key[image[ok]] == cls_key[ok]).all(axis=1) | ~usable[ok]
            if not (ok | ~usable).all():
                bad = int(np.flatnonzero(~(ok | ~usable))[0])
                raise ScheduleError(
                    f"a step along dimension {axis} of '{topo.name}' does not map link "
                    f"{topo.vertex_names[topo.link_src[bad]]} -> "
                    f"{topo.vertex_names[topo.link_dst[bad]]} onto a usable link alike (a "
                    "failed link breaks the translations)")
        return group

    def coords(self, ranks: np.ndarray) -> np.ndarray:
        """``(dims, len(ranks))`` torus coordinates of ``ranks``."""
        return np.array(np.unravel_index(np.asarray(ranks, dtype=np.int64), self.shape),
                        dtype=np.int64).reshape(len(self.shape), -1)

    def element(self, coords: np.ndarray) -> int:
        """The element that translates by ``coords`` (one vector, any integers)."""
        return int(np.ravel_multi_index(tuple(np.mod(coords, self.shape)), self.shape))

    def act(self, ranks: np.ndarray, t: int | np.ndarray) -> np.ndarray:
        """The images of ``ranks`` under element ``t`` (a scalar, or one element per rank)."""
        ranks = np.asarray(ranks, dtype=np.int64)
        a = self.coords(ranks.ravel())
        b = self.coords(np.broadcast_to(np.asarray(t, dtype=np.int64), ranks.shape).ravel())
        out = np.ravel_multi_index(tuple((a + b) % np.array(self.shape)[:, None]), self.shape)
        return np.asarray(out, dtype=np.int64).reshape(ranks.shape)

    def inverse(self, t: int | np.ndarray) -> np.ndarray:
        """The inverse of every element of ``t``."""
        t = np.asarray(t, dtype=np.int64)
        c = self.coords(t.ravel())
        out = np.ravel_multi_index(tuple((-c) % np.array(self.shape)[:, None]), self.shape)
        return np.asarray(out, dtype=np.int64).reshape(t.shape)

    def link_image(self, topo, links: np.ndarray, t: int | np.ndarray) -> np.ndarray:
        """The images of ``links`` under ``t`` (per link, or one for all); -1 where the
        image of a link's ends are joined by no link."""
        links = np.asarray(links, dtype=np.int64)
        V = topo.n_vertices
        keys = topo.link_src.astype(np.int64) * V + topo.link_dst
        order = np.argsort(keys, kind="stable")
        want = (self.act(topo.link_src[links], t) * V + self.act(topo.link_dst[links], t))
        at = np.minimum(np.searchsorted(keys[order], want), max(len(keys) - 1, 0))
        found = keys[order][at] == want if len(keys) else np.zeros(want.shape, dtype=bool)
        return np.where(found, order[at], -1)

    def chunk_image(self, chunks: np.ndarray, per_block: int, t: int | np.ndarray
                    ) -> np.ndarray:
        """Chunk indices of a rank-indexed buffer (``per_block`` chunks per block) moved with
        their blocks by ``t``."""
        chunks = np.asarray(chunks, dtype=np.int64)
        block, within = np.divmod(chunks, per_block)
        return self.act(block, t) * per_block + within


@dataclass(frozen=True, eq=False)
class SymmetricSchedule:
    """A schedule stored as representative ops and the translation group of its torus.

    ``ops`` and ``routes`` are the representatives (any one member of each orbit; the
    builders keep the ops rank 0 sends), ``layouts`` the 1-D layouts every rank shares (a
    rank-indexed buffer's is one block's pattern repeated ``n`` times). The ordinary schedule
    is :func:`expand` of it.
    """

    collective: Collective
    group: TranslationGroup
    layouts: tuple[np.ndarray, np.ndarray, np.ndarray]
    ops: Ops
    routes: Routes
    algorithm: str
    schedule: str = "-"
    params: tuple[tuple[str, int | float | str], ...] = ()

    def __post_init__(self) -> None:
        coll = self.collective
        if coll.kind not in RANK_INDEXED:
            raise ScheduleError(f"the symmetric form serves "
                                f"{', '.join(k.value for k in RANK_INDEXED)}, not "
                                f"{coll.kind.value}")
        if self.group.order != coll.n:
            raise ScheduleError(f"a group of {self.group.order} translations for {coll.n} ranks")
        lays = tuple(np.asarray(lay, dtype=np.int64) for lay in self.layouts)
        for buf, lay in zip(Buf, lays, strict=True):
            if lay.ndim != 1 or (lay < 0).any():
                raise ScheduleError(f"the symmetric form needs one 1-D layout per buffer: "
                                    f"{buf.name.lower()} has {lay.ndim} dimensions")
            lay.setflags(write=False)
        for buf in RANK_INDEXED[coll.kind]:
            lay = lays[buf]
            k, rest = divmod(len(lay), coll.n)
            if rest or (coll.n > 1 and not (lay.reshape(coll.n, k) == lay[:k]).all()):
                raise ScheduleError(f"the {buf.name.lower()} layout is not one block's cut "
                                    f"repeated for each of the {coll.n} blocks")
            if (lay == 0).any():
                # an empty chunk's data coordinate is its block's end, which no translation
                # moves as it moves the block's elements
                raise ScheduleError(f"the {buf.name.lower()} layout has empty chunks: the "
                                    "symmetric form moves blocks, and an empty chunk names no "
                                    "block")
        object.__setattr__(self, "layouts", lays)

    @property
    def n(self) -> int:
        return self.collective.n

    @property
    def topology(self):
        return self.collective.topology

    def per_block(self, buf: Buf) -> int | None:
        """Chunks per block of rank-indexed ``buf``; ``None`` where the group leaves it."""
        if buf in RANK_INDEXED[self.collective.kind]:
            return len(self.layouts[buf]) // self.n
        return None

    def expanded_ops(self) -> int:
        """Ops of the expanded schedule (one per element per representative)."""
        return len(self.ops) * self.group.order

    def replace(self, **changes) -> SymmetricSchedule:
        return replace(self, **changes)


def _moved_ops(s: SymmetricSchedule, t: np.ndarray, rows: np.ndarray) -> dict[str, np.ndarray]:
    """The columns of representative ops ``rows`` moved by elements ``t`` (one per row)."""
    ops, g = s.ops, s.group
    cols = {k: v[rows] for k, v in ops.columns().items()}
    cols["src"] = g.act(cols["src"], t)
    cols["dst"] = g.act(cols["dst"], t)
    for side in ("src", "dst"):
        off = cols[f"{side}_off"].astype(np.int64)
        for buf in RANK_INDEXED[s.collective.kind]:
            m = cols[f"{side}_buf"] == buf
            k = s.per_block(buf) or 1
            if m.any() and ((off[m] % k) + cols["count"][m] > k).any():
                raise ScheduleError("a representative op crosses a block of a buffer whose "
                                    "blocks the group moves apart: split it at the block")
            if m.any():
                off[m] = g.chunk_image(off[m], k, t[m])
        cols[f"{side}_off"] = off
    return cols


def expand(s: SymmetricSchedule, keep: np.ndarray | None = None) -> Schedule:
    """The ordinary schedule: every representative op moved by every element (element-major,
    then sorted by step, stable); route ``r`` of element ``t`` becomes route
    ``1 + t (R - 1) + (r - 1)`` of the expanded table (route 0 stays the empty route).
    ``keep`` (booleans, element-major: entry ``t n_rep + i`` for representative ``i`` moved
    by ``t``) leaves out the ops it marks false; the route table stays whole."""
    n_rep, order = len(s.ops), s.group.order
    rows = np.tile(np.arange(n_rep), order)
    t = np.repeat(np.arange(order, dtype=np.int64), n_rep)
    if keep is not None:
        rows, t = rows[keep], t[keep]
    cols = _moved_ops(s, t, rows)
    R = len(s.routes)
    route = cols["route"].astype(np.int64)
    cols["route"] = np.where(route == 0, 0, 1 + t * (R - 1) + route - 1)
    # the route table: routes 1..R-1 of every element in turn, their links moved
    lengths = s.routes.lengths()[1:]
    rep_links = s.routes.links.astype(np.int64)
    links = np.concatenate([s.group.link_image(s.topology, rep_links, e)
                            for e in range(order)]) if len(rep_links) else rep_links
    offsets = np.concatenate([[0, 0], np.cumsum(np.tile(lengths, order))])
    step = cols["step"]
    if len(step) and (np.diff(step) < 0).any():
        srt = np.argsort(step, kind="stable")
        cols = {k: v[srt] for k, v in cols.items()}
    return Schedule(collective=s.collective, layouts=s.layouts, ops=Ops(**cols),
                    routes=Routes(offsets, links), algorithm=s.algorithm, schedule=s.schedule,
                    params=s.params)


def symmetric_form(schedule: Schedule) -> SymmetricSchedule:
    """``schedule`` as representatives (the ops rank 0 sends) and its torus's translations;
    :class:`ScheduleError` saying why when it is not translation-symmetric (its expansion
    would not give back the same ops and routes)."""
    coll = schedule.collective
    group = TranslationGroup.of(coll)
    if any(lay.ndim != 1 for lay in schedule.layouts):
        raise ScheduleError("per-rank layouts: the ranks' buffers are not cut alike")
    ops = schedule.ops
    rep = np.flatnonzero(ops.src == 0)
    used = np.unique(ops.route[rep])
    used = used[used != 0]
    new_id = np.zeros(len(schedule.routes), dtype=np.int64)
    new_id[used] = np.arange(1, len(used) + 1)
    lengths = schedule.routes.lengths()[used]
    starts = schedule.routes.offsets[:-1][used]
    links = (np.concatenate([schedule.routes.links[a:a + k] for a, k in
                             zip(starts.tolist(), lengths.tolist(), strict=True)])
             if len(used) else np.zeros(0, dtype=np.int32))
    cols = {k: v[rep] for k, v in ops.columns().items()}
    cols["route"] = new_id[cols["route"]]
    sym = SymmetricSchedule(collective=coll, group=group, layouts=schedule.layouts,
                            ops=Ops(**cols),
                            routes=Routes(np.concatenate([[0, 0], np.cumsum(lengths)]), links),
                            algorithm=schedule.algorithm, schedule=schedule.schedule,
                            params=schedule.params)
    if len(ops) != sym.expanded_ops() or _op_keys(expand(sym)) != _op_keys(schedule):
        raise ScheduleError(f"schedule '{coll.name}' ({schedule.algorithm}) is not the same "
                            "from every rank up to a translation of the torus")
    return sym


def _op_keys(s: Schedule) -> list[tuple[int, ...]]:
    """Every op as a sortable tuple of its columns and its route's links (ids drop out)."""
    cols = s.ops.columns()
    paths = [s.routes.path(r) for r in range(len(s.routes))]
    rows = zip(*(cols[k].tolist() for k in cols if k != "route"), s.ops.route.tolist(),
               strict=True)
    return sorted((*row[:-1], *paths[row[-1]], -1) for row in rows)


def healthy_collective(coll: Collective) -> Collective:
    """``coll`` on its machine with every failed link working again (failed ranks stay
    failed): the machine whose translations an :class:`ExceptedSchedule`'s base uses."""
    topo = coll.topology
    healed = replace(topo, link_failed=_frozen_bools(np.zeros(topo.n_links, dtype=bool)),
                     fault_groups=(), _cache={})
    return replace(coll, topology=healed)


def _frozen_bools(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


@dataclass(frozen=True, eq=False)
class ExceptedSchedule:
    """A schedule stored by symmetry on a torus with failed links: the symmetric schedule of
    the healthy torus (``base``, on :func:`healthy_collective` of ``collective``) less the
    journeys that cross a failed link, and an ordinary *tail* run after it that delivers what
    those journeys would have.

    ``journey`` gives every representative op of ``base`` its journey (the smallest
    representative linked to it by "reads what the other wrote",
    :func:`cclc.symmetric_check.journeys`); ``masked_element[k]``, ``masked_journey[k]`` name
    the journeys left out (journey ``masked_journey[k]`` moved by element
    ``masked_element[k]``). ``tail`` and ``tail_routes`` are ordinary ops on the faulty
    machine, stepped from 0 after the base's last step; they stage data only in scratch chunks
    from ``tail_scratch_from`` on, which the base never touches.
    :mod:`cclc.symmetric_faults` verifies, times and expands it.

    An AllReduce's (AllGather's, ReduceScatter's) exceptions are ``interleaved``: the base's
    ring phases that run on a ring a failed link cuts are masked (``journey`` then gives each
    representative op its ring phase,
    :func:`cclc.symmetric_lines.ring_phase_classes`), and the tail is the lines that take
    their place, in the base's own steps; :mod:`cclc.symmetric_lines` verifies and times it.
    """

    collective: Collective
    base: SymmetricSchedule
    journey: np.ndarray
    masked_element: np.ndarray
    masked_journey: np.ndarray
    tail: Ops
    tail_routes: Routes
    tail_scratch_from: int
    interleaved: bool = False

    def __post_init__(self) -> None:
        if self.base.collective.topology.n_failed_links:
            raise ScheduleError("the base of a schedule with exceptions is on the healthy "
                                "torus")
        for name in ("journey", "masked_element", "masked_journey"):
            a = np.asarray(getattr(self, name), dtype=np.int64)
            a.setflags(write=False)
            object.__setattr__(self, name, a)
        if len(self.journey) != len(self.base.ops):
            raise ScheduleError(f"{len(self.journey)} journey ids for {len(self.base.ops)} "
                                "representative ops")
        if len(self.masked_element) != len(self.masked_journey):
            raise ScheduleError("masked elements and journeys differ in length")
        n_rep, order = len(self.base.ops), self.base.group.order
        for name, top in (("journey", n_rep), ("masked_journey", n_rep),
                          ("masked_element", order)):
            a = getattr(self, name)
            if len(a) and (a.min() < 0 or a.max() >= top):
                raise ScheduleError(f"a {name.replace('_', ' ')} id is outside 0..{top - 1}")
        if not 0 <= self.tail_scratch_from <= len(self.base.layouts[Buf.SCRATCH]):
            raise ScheduleError(f"the tail's scratch starts at chunk {self.tail_scratch_from}, "
                                "outside the scratch layout")

    @property
    def n(self) -> int:
        return self.collective.n

    @property
    def group(self) -> TranslationGroup:
        return self.base.group

    @property
    def topology(self):
        return self.collective.topology

    @property
    def layouts(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.base.layouts

    @property
    def algorithm(self) -> str:
        return self.base.algorithm

    @property
    def schedule(self) -> str:
        return self.base.schedule

    @property
    def ops(self) -> Ops:
        """The base's representative ops (what the form stores per orbit)."""
        return self.base.ops

    def masked_ops(self) -> int:
        """Ops of the expanded base that the masked journeys leave out."""
        size = np.bincount(self.journey, minlength=len(self.journey))
        return int(size[self.masked_journey].sum()) if len(self.masked_journey) else 0

    def expanded_ops(self) -> int:
        """Ops of the expanded schedule: the base's, less the masked, and the tail."""
        return self.base.expanded_ops() - self.masked_ops() + len(self.tail)

    def replace(self, **changes) -> ExceptedSchedule:
        return replace(self, **changes)
