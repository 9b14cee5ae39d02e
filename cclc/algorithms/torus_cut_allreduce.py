"""A torus AllReduce with failed links, stored by symmetry with exceptions: cut rings as lines.

The schedule is ring+dimrotation as :func:`cclc.algorithms.torus_collectives.dimrot_plan`
plans it for the faulty torus (its pieces, their weights and dimension orders), built in
symmetric form on the healthy torus (:func:`~cclc.algorithms.torus_symmetric.allreduce_phases`
with one plain ring chain per unit: a unit of direction +1 is summed along the plus chain, one
of -1 along the minus chain, a phase of ``m - 1`` steps on a ring of ``m``), every phase held
to ``m`` steps. A ring that a failed link cuts runs each of its phases as a *line* instead:
its ops in that phase (every member of the phase's class moved onto the ring's ranks,
:func:`cclc.symmetric_lines.ring_phase_classes`) are masked, and the line's ops take their
place in the same steps (an :class:`~cclc.symmetric.ExceptedSchedule` whose tail runs
beside the base, ``interleaved``). On a line of ``m`` (position 0 just past the cut, ``m - 1``
just before it) a reduce-scatter sums target ``x``'s set along a chain from position 0 (``x``
hops, the last one in step ``m - 2``) and one from ``m - 1`` (``m - 1 - x`` hops, the last in
step ``m - 1``), so a link carries at most one set of the unit each way a step, and the two
chains reach ``x`` in different steps; the allgather copies ``x``'s set out both ways from
step 0, one hop a step (``m - 1`` steps: a line's end links carry a set every step).
A line sends both ways where a ring's unit sends one way, so its links carry twice a ring's
bytes: the plan's weights (half the units on the pieces that start on a cut dimension) keep
them as busy as the whole rings of the first phase. :mod:`cclc.symmetric_lines` verifies,
times and expands it without expanding the base.
"""

from __future__ import annotations

import numpy as np

from cclc.algorithms.torus_collectives import dimrot_plan
from cclc.algorithms.torus_symmetric import (
    allreduce_phases,
    link_lookup,
    ring_chains,
    symmetric_reason,
)
from cclc.collective import Collective, CollectiveKind
from cclc.errors import CollectiveError
from cclc.ir import Buf, OpKind, Ops, Routes
from cclc.symmetric import ExceptedSchedule, TranslationGroup, healthy_collective
from cclc.symmetric_lines import cut_rings, required_lines_mask, ring_phase_classes

__all__ = ["lined_allreduce", "lined_reason"]


def lined_reason(coll: Collective) -> str | None:
    """Why :func:`lined_allreduce` cannot serve ``coll`` (``None`` when it can): an AllReduce
    on a torus with failed links (no failed ranks), sides of 3 or more, no ring cut twice,
    whose healthy machine the symmetric builder serves."""
    if coll.kind is not CollectiveKind.ALLREDUCE:
        return f"cut rings run as lines in an allreduce only, not {coll.kind.value}"
    topo = coll.topology
    if topo.failed_ranks:
        return "it has failed ranks (exceptions serve failed links only)"
    if not topo.n_failed_links:
        return "it has no failed link"
    why = symmetric_reason(healthy_collective(coll))
    if why is not None:
        return f"on its healthy torus {why}"
    if min(topo.grid_dims) < 3:
        return "a side is shorter than 3 (a ring of two has no line)"
    _, _, why = dimrot_plan(coll)
    if why is not None:
        return why
    per = coll.count // coll.n
    units = len(dimrot_plan(coll)[0])
    if per < units:
        return (f"its blocks of {per} elements are too small to cut into the {units} units of "
                "its pieces")
    return None


def lined_allreduce(coll: Collective) -> ExceptedSchedule:
    """The ring+dimrotation AllReduce of ``coll`` in symmetric form with its cut rings run as
    lines (see the module docstring); :class:`~cclc.errors.CollectiveError` where
    :func:`lined_reason` says it cannot."""
    why = lined_reason(coll)
    if why is not None:
        raise CollectiveError(f"no allreduce with lines for '{coll.name}': {why}")
    pieces, _, _ = dimrot_plan(coll)
    healed = healthy_collective(coll)
    group = TranslationGroup.of(healed)
    units = [(piece.order, 0 if piece.direction == 1 else 1) for piece in pieces]
    span = max(group.shape)
    base = allreduce_phases(healed, group, units, ring_chains, span, compact=False)
    classes = ring_phase_classes(base)
    mask = required_lines_mask(base, classes, coll.topology)
    tail = _lines(coll, group, units, span, mask)
    return ExceptedSchedule(collective=coll, base=base, journey=classes,
                            masked_element=mask[:, 0], masked_journey=mask[:, 1],
                            tail=tail[0], tail_routes=tail[1], tail_scratch_from=0,
                            interleaved=True)


def _lines(coll: Collective, group: TranslationGroup, units, span: int,
           mask: np.ndarray) -> tuple[Ops, Routes]:
    """The ops of every cut ring's lines, one line per masked (ring, phase class)."""
    shape = group.shape
    n, U = coll.n, len(units)
    D = len(units[0][0])
    blocks = group.coords(np.arange(n))                      # (dims, n)
    cols: dict[str, list[np.ndarray]] = {k: [] for k in ("step", "src", "dst", "kind", "off")}
    cuts = cut_rings(coll.topology, group)
    for ring, cls in {(int(r), int(c)) for r, c in _ring_of_mask(group, units, span, mask)}:
        u = (cls - 1) % U
        window = (cls - 1) // U                              # the phase, 0..2D-1
        order = units[u][0]
        p = window if window < D else 2 * D - 1 - window      # the order's phase of the sets
        d = order[p]
        m = shape[d]
        kind = OpKind.REDUCE if window < D else OpKind.COPY
        where = group.coords(np.array([ring]))[:, 0]
        cut = cuts[d][ring]
        at = np.repeat(where[:, None], m, axis=1)
        at[d] = (cut + 1 + np.arange(m)) % m                 # line position -> coordinates
        rank = np.ravel_multi_index(tuple(at), shape)
        P0 = 1 + window * span
        for x in range(m):
            keep = np.ones(n, dtype=bool)
            for dd in order[:p + 1]:
                keep &= blocks[dd] == at[dd, x]
            chunk = np.flatnonzero(keep) * U + u
            hops = []                                         # (step, from, to) in positions
            if kind is OpKind.REDUCE:
                hops += [(m - 1 - x + k, k, k + 1) for k in range(x)]
                hops += [(x + 1 + k, m - 1 - k, m - 2 - k) for k in range(m - 1 - x)]
            else:
                hops += [(i, x + i, x + i + 1) for i in range(m - 1 - x)]
                hops += [(i, x - i, x - i - 1) for i in range(x)]
            for step, a, b in hops:
                k = len(chunk)
                cols["step"].append(np.full(k, P0 + step))
                cols["src"].append(np.full(k, rank[a]))
                cols["dst"].append(np.full(k, rank[b]))
                cols["kind"].append(np.full(k, int(kind)))
                cols["off"].append(chunk)
    cat = {k: np.concatenate(v).astype(np.int64) if v else np.zeros(0, dtype=np.int64)
           for k, v in cols.items()}
    links = link_lookup(coll.topology, cat["src"], cat["dst"])
    used, inverse = np.unique(links, return_inverse=True)
    order_ = np.argsort(cat["step"], kind="stable")
    k = len(order_)
    ops = Ops(step=cat["step"][order_], src=cat["src"][order_], dst=cat["dst"][order_],
              kind=cat["kind"][order_], src_buf=np.full(k, int(Buf.OUTPUT)),
              src_off=cat["off"][order_], dst_buf=np.full(k, int(Buf.OUTPUT)),
              dst_off=cat["off"][order_], count=np.ones(k, dtype=np.int64),
              route=(inverse.reshape(-1) + 1)[order_])
    return ops, Routes(np.arange(-1, len(used) + 1).clip(0), used)


def _ring_of_mask(group: TranslationGroup, units, span: int, mask: np.ndarray):
    """(ring id, class) of every masked (element, class): the ring's id is its rank with the
    coordinate along the class's dimension set to 0."""
    U, D = len(units), len(units[0][0])
    for t, cls in mask.tolist():
        u, window = (cls - 1) % U, (cls - 1) // U
        p = window if window < D else 2 * D - 1 - window
        d = units[u][0][p]
        c = group.coords(np.array([t]))[:, 0]
        c[d] = 0
        yield int(np.ravel_multi_index(tuple(c), group.shape)), cls
