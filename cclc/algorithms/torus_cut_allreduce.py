"""A torus AllReduce, AllGather or ReduceScatter with failed links, stored by symmetry with
exceptions: cut rings as lines.

The schedule is ring+dimrotation with the pieces and weights that
:func:`cclc.algorithms.torus_collectives.dimrot_plan` gives the faulty torus, each unit's
dimensions after its first ordered so that the later phases are least busy
(:func:`balanced_orders`), built in
symmetric form on the healthy torus (:func:`~cclc.algorithms.torus_symmetric.allreduce_phases`
with one plain ring chain per unit: a unit of direction +1 is summed along the plus chain, one
of -1 along the minus chain, a phase of ``m - 1`` steps on a ring of ``m``), every phase held
to the longest side's ``m`` steps (a shorter ring's phase in waves,
:func:`~cclc.algorithms.torus_symmetric.allreduce_phases`). A ring that a failed link cuts runs
each of its phases as a *line* instead:
its ops in that phase (every member of the phase's class moved onto the ring's ranks,
:func:`cclc.symmetric_lines.ring_phase_classes`) are masked, and the line's ops take their
place in the same steps (an :class:`~cclc.symmetric.ExceptedSchedule` whose tail runs
beside the base, ``interleaved``). On a line of ``m`` (position 0 just past the cut, ``m - 1``
just before it) a reduce-scatter sums target ``x``'s set along a chain from position 0 (``x``
hops) and one from ``m - 1`` (``m - 1 - x`` hops), both reaching ``x`` in step ``m - 2``, so a
link carries at most one set of the unit each way a step; where both reach ``x``, the far
chain's sum lands in scratch and is added in step ``m - 1``, a step of local ops (a
ReduceScatter, which sums in scratch, lands it in ``x``'s chunks of the set two places on,
which ``x`` passed on a step before); the allgather copies ``x``'s set out both ways from
step 0, one hop a step (``m - 1`` steps: a line's end links carry a set every step). A line
that fits ``w`` times into the phase runs in ``w`` waves of ``m`` steps, each over a share of
every set at the same positions. An AllGather is the allgather phases alone, a ReduceScatter
the reduce-scatter phases.
A line sends both ways where a ring's unit sends one way, so its links carry twice a ring's
bytes: the plan's weights (half the units on the pieces that start on a cut dimension) keep
them as busy as the whole rings of the first phase. :mod:`cclc.symmetric_lines` verifies and
times it without expanding it.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from cclc.algorithms.torus_collectives import dimrot_plan
from cclc.algorithms.torus_symmetric import (
    allreduce_phases,
    faulty_reason,
    link_lookup,
    ring_chains,
    ring_phases,
    wave_shares,
)
from cclc.collective import Collective, CollectiveKind
from cclc.errors import CollectiveError
from cclc.ir import Buf, OpKind, Ops, Routes
from cclc.symmetric import ExceptedSchedule, TranslationGroup, healthy_collective, summing_buffer
from cclc.symmetric_lines import LINED, required_lines_mask, ring_phase_classes

__all__ = ["balanced_orders", "lined_allgather", "lined_allreduce", "lined_reason",
           "lined_reducescatter", "phase_costs"]


def lined_reason(coll: Collective) -> str | None:
    """Why :func:`lined_allreduce` (:func:`lined_allgather`, :func:`lined_reducescatter`)
    cannot serve ``coll`` (``None`` when it can): an AllReduce, AllGather or ReduceScatter on
    a torus with failed links (no failed ranks), sides of 3 or more (4 or more on a cut
    dimension of a ReduceScatter), no ring cut twice, whose healthy machine the symmetric
    builder serves."""
    if coll.kind not in LINED:
        return (f"cut rings run as lines in an allreduce, an allgather or a reducescatter "
                f"only, not {coll.kind.value}")
    why = faulty_reason(coll)
    if why is not None:
        return why
    if min(coll.topology.grid_dims) < 3:
        return "a side is shorter than 3 (a ring of two has no line)"
    pieces, cuts, why = dimrot_plan(coll)
    if why is not None:
        return why
    if coll.kind is CollectiveKind.REDUCESCATTER and min(coll.topology.grid_dims[d]
                                                        for d in cuts) < 4:
        # its line lands a partial sum in a chunk of another set that the rank is done with;
        # on a ring of 3 none is done with before that step
        return "a cut dimension's side is 3 (a reducescatter's line needs 4 or more)"
    per = coll.count // coll.n
    units = len(pieces)
    if per < units:
        return (f"its blocks of {per} elements are too small to cut into the {units} units of "
                "its pieces")
    return None


def lined_allreduce(coll: Collective) -> ExceptedSchedule:
    """The ring+dimrotation AllReduce of ``coll`` in symmetric form with its cut rings run as
    lines (see the module docstring); :class:`~cclc.errors.CollectiveError` where
    :func:`lined_reason` says it cannot."""
    return _lined(coll, CollectiveKind.ALLREDUCE)


def lined_reducescatter(coll: Collective) -> ExceptedSchedule:
    """The reduce-scatter half of :func:`lined_allreduce`, summed in scratch: where both
    chains reach a target the far chain's sum lands in the target's chunk of another set, one
    it passed on a step before; :class:`~cclc.errors.CollectiveError` where
    :func:`lined_reason` says it cannot."""
    return _lined(coll, CollectiveKind.REDUCESCATTER)


def lined_allgather(coll: Collective) -> ExceptedSchedule:
    """The allgather half of :func:`lined_allreduce`: its phases alone, each cut ring's run as
    a line; :class:`~cclc.errors.CollectiveError` where :func:`lined_reason` says it
    cannot."""
    return _lined(coll, CollectiveKind.ALLGATHER)


def _lined(coll: Collective, kind: CollectiveKind) -> ExceptedSchedule:
    why = lined_reason(coll) if coll.kind is kind else f"it is {coll.kind.value}, not {kind.value}"
    if why is not None:
        raise CollectiveError(f"no {kind.value} with lines for '{coll.name}': {why}")
    pieces, cuts, _ = dimrot_plan(coll)
    healed = healthy_collective(coll)
    group = TranslationGroup.of(healed)
    units = balanced_orders([(piece.order, 0 if piece.direction == 1 else 1)
                             for piece in pieces], group.shape, set(cuts))
    span = max(group.shape)
    # a line's target takes one chain's sum in scratch: a set of units per target of the
    # largest sets (the first phase's, on the shortest cut side)
    sets = (coll.n // min(group.shape[d] for d in cuts)
            if kind is CollectiveKind.ALLREDUCE else 0)
    base = allreduce_phases(healed, group, units, ring_chains, span, compact=False,
                            scratch_sets=sets, waves=True)
    classes = ring_phase_classes(base)
    mask = required_lines_mask(base, classes, coll.topology)
    tail = _lines(coll, group, units, span, mask, cuts)
    return ExceptedSchedule(collective=coll, base=base, journey=classes,
                            masked_element=mask[:, 0], masked_journey=mask[:, 1],
                            tail=tail[0], tail_routes=tail[1], tail_scratch_from=0,
                            interleaved=True)


#: the most combinations of dimension orders :func:`balanced_orders` tries
MAX_ORDERINGS = 4096


def phase_costs(units, shape, cut: set[int]) -> list[float]:
    """Per reduce-scatter phase: its busiest link's data a step, in blocks' units (a unit
    carries ``1 / m`` of its data in a phase after one on a side of ``m``): a ring's link
    carries the units of its direction on that dimension, a line's both directions'."""
    D = len(units[0][0])
    costs = []
    for p in range(D):
        load: dict[int, list[float]] = {}
        for order, half in units:
            share = 1.0 / math.prod(shape[d] for d in order[:p])
            load.setdefault(order[p], [0.0, 0.0])[half] += share
        costs.append(max(sum(v) if d in cut else max(v) for d, v in load.items()))
    return costs


def balanced_orders(units, shape, cut: set[int]):
    """``units`` (order, half) with each unit's dimensions after its first reordered so that
    the phases after the first are as little busy as can be (:func:`phase_costs`, summed;
    ties to the orders given), trying every combination where there are at most
    :data:`MAX_ORDERINGS`; the first dimensions, which set the weights, stay."""
    options = [[(order[0], *rest) for rest in itertools.permutations(order[1:])]
               for order, _ in units]
    if math.prod(len(o) for o in options) > MAX_ORDERINGS:
        return units
    best, best_cost = units, sum(phase_costs(units, shape, cut))
    for pick in itertools.product(*options):
        trial = [(order, half) for order, (_, half) in zip(pick, units, strict=True)]
        cost = sum(phase_costs(trial, shape, cut))
        if cost < best_cost - 1e-12:
            best, best_cost = trial, cost
    return best


def _lines(coll: Collective, group: TranslationGroup, units, span: int, mask: np.ndarray,
           cuts: dict[int, np.ndarray]) -> tuple[Ops, Routes]:
    """The ops of every cut ring's lines, one line per masked (ring, phase class); ``cuts``
    per dimension and rank the coordinate ``c`` of its ring's cut ``c -- c+1``
    (:func:`~cclc.algorithms.torus_collectives.line_cuts`)."""
    shape = group.shape
    U = len(units)
    D = len(units[0][0])
    work = summing_buffer(coll.kind)
    cols: dict[str, list[np.ndarray]] = {k: [] for k in ("step", "src", "dst", "kind",
                                                         "src_buf", "src_off", "dst_buf",
                                                         "dst_off")}

    def add(step, a, b, kind, src, dst) -> None:
        k = len(src[1])
        for key, v in (("step", step), ("src", a), ("dst", b), ("kind", int(kind)),
                       ("src_buf", int(src[0])), ("src_off", src[1]),
                       ("dst_buf", int(dst[0])), ("dst_off", dst[1])):
            cols[key].append(np.broadcast_to(np.asarray(v, dtype=np.int64), (k,)).copy())

    for ring, cls in {(int(r), int(c))
                      for r, c in _ring_of_mask(coll.kind, group, units, span, mask)}:
        u = (cls - 1) % U
        window = (cls - 1) // U                              # the base's phase
        order = units[u][0]
        p, op = ring_phases(coll.kind, D)[window]            # the order's phase of the sets
        d = order[p]
        m = shape[d]
        where = group.coords(np.array([ring]))[:, 0]
        at = np.repeat(where[:, None], m, axis=1)
        at[d] = (cuts[d][ring] + 1 + np.arange(m)) % m       # line position -> coordinates
        rank = np.ravel_multi_index(tuple(at), shape)
        for x in range(m):
            chunks = _set_chunks(shape, at, order[:p + 1], x, U, u)
            # a ReduceScatter's far sum lands in the set two places on (see below)
            aside = (_set_chunks(shape, at, order[:p + 1], x + 2 if x + 2 < m else x - 2,
                                 U, u) if work is Buf.SCRATCH and 0 < x < m - 1 else None)
            # where the line fits w times into the phase it runs in w waves of m steps, as the
            # base's rings do, each over a share of the set (the same positions in every set)
            for w, share in enumerate(wave_shares(len(chunks), m, span)):
                P0 = 1 + window * span + w * m
                out = (work, chunks[share])
                if op is OpKind.COPY:
                    # the allgather copies x's set out both ways, one hop a step from step 0
                    for i in range(m - 1 - x):
                        add(P0 + i, rank[x + i], rank[x + i + 1], OpKind.COPY, out, out)
                    for i in range(x):
                        add(P0 + i, rank[x - i], rank[x - i - 1], OpKind.COPY, out, out)
                    continue
                for k in range(x):
                    add(P0 + m - 1 - x + k, rank[k], rank[k + 1], OpKind.REDUCE, out, out)
                # the chain from the far end: its last hop falls in the left chain's last
                # step, so where both reach x it lands in scratch and is added in a step of
                # its own
                both = 0 < x < m - 1
                for k in range(m - 1 - x):
                    last = k == m - 2 - x
                    a, b = rank[m - 1 - k], rank[m - 2 - k]
                    if last and both:
                        # a ReduceScatter's scratch is its summing buffer: the sum lands in
                        # b's chunks of the set two places on (of this wave's share), which b
                        # passed on by step m - 3 of the wave
                        held = ((Buf.SCRATCH, share * U + u) if aside is None
                                else (work, aside[share]))
                        add(P0 + x + k, a, b, OpKind.COPY, out, held)
                        add(P0 + m - 1, b, b, OpKind.REDUCE, held, out)
                    else:
                        add(P0 + x + k, a, b, OpKind.REDUCE, out, out)
    cat = {k: np.concatenate(v).astype(np.int64) if v else np.zeros(0, dtype=np.int64)
           for k, v in cols.items()}
    remote = cat["src"] != cat["dst"]
    links = link_lookup(coll.topology, cat["src"][remote], cat["dst"][remote])
    used, inverse = np.unique(links, return_inverse=True)
    route = np.zeros(len(remote), dtype=np.int64)
    route[remote] = inverse.reshape(-1) + 1
    order_ = np.argsort(cat["step"], kind="stable")
    ops = Ops(route=route[order_], count=np.ones(len(order_), dtype=np.int64),
              **{k: v[order_] for k, v in cat.items()})
    return ops, Routes(np.arange(-1, len(used) + 1).clip(0), used)


def _set_chunks(shape, at: np.ndarray, dims, x: int, U: int, u: int) -> np.ndarray:
    """The chunks of unit ``u`` of line position ``x``'s set, in block order: the blocks of
    the torus of ``shape`` that agree with the position (coordinates ``at[:, x]``) on
    ``dims``, and take every value on the others (built from those, not found among all
    blocks: a line asks for two sets per position, and a torus has many blocks)."""
    axes = [np.array([at[d, x]]) if d in dims else np.arange(side)
            for d, side in enumerate(shape)]
    grid = np.meshgrid(*axes, indexing="ij")
    blocks = np.ravel_multi_index(tuple(c.ravel() for c in grid), tuple(shape))
    return blocks.astype(np.int64) * U + u


def _ring_of_mask(kind: CollectiveKind, group: TranslationGroup, units, span: int,
                  mask: np.ndarray):
    """(ring id, class) of every masked (element, class): the ring's id is its rank with the
    coordinate along the class's dimension set to 0."""
    U, D = len(units), len(units[0][0])
    for t, cls in mask.tolist():
        u, window = (cls - 1) % U, (cls - 1) // U
        p, _ = ring_phases(kind, D)[window]
        d = units[u][0][p]
        c = group.coords(np.array([t]))[:, 0]
        c[d] = 0
        yield int(np.ravel_multi_index(tuple(c), group.shape)), cls
