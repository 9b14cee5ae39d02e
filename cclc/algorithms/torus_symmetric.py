"""A torus AllToAll built in symmetric form: the journeys of rank 0's blocks, and the group.

Every rank sends the same pattern, translated, so the schedule is built for rank 0's data only
(a :class:`~cclc.symmetric.SymmetricSchedule`) and never expanded: ~300 thousand
representative ops stand for the 1.2 billion of a 16x16x16 torus.

The schedule is DimRotation over HalfRing, store and forward, one hop per step:

* each block is cut into ``2 D`` *units* (``D`` dimensions of size > 1): piece ``c`` of two
  halves visits the dimensions in the order ``c, c + 1, ...`` (one dimension per *phase*), so
  in every phase every dimension carries one piece of every block;
* in a phase a unit travels its block's offset in that dimension the shorter way round, one
  link per step; at an even ring's antipode the two halves go opposite ways, so both
  directions of every ring carry the same bytes;
* a unit waits between hops in the scratch chunk of its block at the rank it has reached (one
  chunk per block and unit: the same relative journey never meets itself, so no two blocks
  share a chunk at one time).

On a ring of ``N`` ranks a phase lasts ``floor(N/2)`` steps and its ``+`` link carries, at hop
``h``, the units of every block whose offset exceeds ``h``: summed over the phase that is the
hop-bytes of the ring spread over its two directions, and DimRotation keeps every dimension busy
in every phase, so the bandwidth term meets the hop-bytes bound of a torus whose sides are
alike; each step adds a link latency.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from cclc.collective import Collective, CollectiveKind
from cclc.errors import CollectiveError, ScheduleError
from cclc.ir import Buf, OpKind, Ops, Routes, even_split
from cclc.symmetric import SymmetricSchedule, TranslationGroup, healthy_collective, summing_buffer

__all__ = ["BUILT", "FormSize", "allreduce_phases", "faulty_reason", "form_size", "link_lookup",
           "ring_chains", "ring_phases", "symmetric_allgather", "symmetric_allreduce",
           "symmetric_alltoall", "symmetric_reducescatter", "symmetric_reason", "wave_shares"]


#: the kinds the builders here serve
BUILT = (CollectiveKind.ALLTOALL, CollectiveKind.ALLREDUCE, CollectiveKind.ALLGATHER,
         CollectiveKind.REDUCESCATTER)


def symmetric_reason(coll: Collective) -> str | None:
    """Why the builders here cannot serve ``coll`` (``None`` when one can): an AllToAll,
    AllReduce, AllGather or ReduceScatter on a torus whose translations are a symmetry of it,
    with at least ``2 D`` elements in every rank's block (one per unit) and, for AllReduce,
    equal blocks."""
    if coll.kind not in BUILT:
        return (f"it is built for {', '.join(k.value for k in BUILT[:-1])} and "
                f"{BUILT[-1].value} only, not {coll.kind.value}")
    try:
        group = TranslationGroup.of(coll)
    except ScheduleError as err:
        return err.message
    per = coll.count // coll.n          # elements of a rank's block (for every rank)
    units = 2 * max(sum(m > 1 for m in group.shape), 1)
    if coll.kind is CollectiveKind.ALLREDUCE and coll.count % coll.n:
        return f"its {coll.count} elements do not cut into {coll.n} equal blocks"
    if per < units:
        return (f"its blocks of {per} elements are too small to cut into {units} units (one "
                "per dimension and direction)")
    return None


def faulty_reason(coll: Collective) -> str | None:
    """Why the healthy torus's schedule, with exceptions, cannot serve ``coll`` whatever its
    kind (``None`` when it can): failed ranks, no failed link, or a healthy torus the builders
    here do not serve."""
    topo = coll.topology
    if topo.failed_ranks:
        return "it has failed ranks (exceptions serve failed links only)"
    if not topo.n_failed_links:
        return "it has no failed link"
    why = symmetric_reason(healthy_collective(coll))
    return None if why is None else f"on its healthy torus {why}"


@dataclass(frozen=True, slots=True)
class FormSize:
    """What a builder here makes of a collective, counted from its torus's sides alone:
    representative ``ops``, ``steps`` and rank 0's chunk ``slots`` (input, output and scratch
    together)."""

    ops: int
    steps: int
    slots: int


def form_size(coll: Collective) -> FormSize:
    """The :class:`FormSize` of the schedule the builder of ``coll``'s kind makes for it (of
    its healthy torus where it has failed links: the base the exceptions are made beside, in
    the healthy rotation of dimensions, the lines' own orders and weights not counted),
    without building it: the size check's estimate (:mod:`cclc.symmetric_plan`). Exact for
    the healthy builders (``tests/symmetric/test_symmetric.py`` holds them to it).

    An AllToAll's unit travels each block's ring distance in every dimension, one op a hop;
    a ring phase on a ring of ``m`` makes ``m - 1`` ops per block of a target's set, whose
    size shrinks by the side of every dimension summed or spread before it."""
    shape = tuple(int(m) for m in coll.topology.grid_dims)
    n = math.prod(shape)
    active = [m for m in shape if m > 1]
    D = max(len(active), 1)
    U = 2 * D
    if n < 2:
        return FormSize(1, 1, 3 * U)
    if coll.kind is CollectiveKind.ALLTOALL:
        # sum over offsets o of min(o, m - o): the hops of a ring's blocks in one dimension
        hops = sum(n // m * sum(min(o, m - o) for o in range(m)) for m in active)
        return FormSize(1 + U * hops, D * max(m // 2 for m in active), 3 * n * U)
    phases = ring_phases(coll.kind, D)
    ops = 1 if coll.kind is CollectiveKind.ALLGATHER else n
    for order in _rotations(active):
        for p, _ in phases:
            # the set of a phase on order[p]: the blocks that agree on order[:p + 1]
            ops += 2 * (order[p] - 1) * (n // math.prod(order[:p + 1]))
    span = _halving_span(active)
    slots = {CollectiveKind.ALLREDUCE: 2 * n * U, CollectiveKind.ALLGATHER: U + n * U,
             CollectiveKind.REDUCESCATTER: 2 * n * U + U}[coll.kind]
    last = 1 if coll.kind is CollectiveKind.REDUCESCATTER else 0
    return FormSize(ops + last, 1 + len(phases) * span + last, slots)


def link_lookup(topo, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """Link ids ``src[i] -> dst[i]`` (every pair must be joined by a link)."""
    V = topo.n_vertices
    keys = topo.link_src.astype(np.int64) * V + topo.link_dst
    order = np.argsort(keys, kind="stable")
    want = src * V + dst
    at = np.searchsorted(keys[order], want)
    return order[at]


def _group_for(coll: Collective, kind: CollectiveKind) -> TranslationGroup:
    """The translations of ``coll``'s torus, for a builder of ``kind``;
    :class:`~cclc.errors.CollectiveError` for another kind or where :func:`symmetric_reason`
    says translations are no symmetry of it."""
    if coll.kind is not kind:
        raise CollectiveError(f"symmetric_{kind.value} builds {kind.value}, not "
                              f"{coll.kind.value}")
    why = symmetric_reason(coll)
    if why is not None:
        raise CollectiveError(f"no symmetric {kind.value} of '{coll.name}': {why}")
    return TranslationGroup.of(coll)


def symmetric_alltoall(coll: Collective) -> SymmetricSchedule:
    """The DimRotation-over-HalfRing AllToAll of ``coll`` (see the module docstring) as a
    symmetric schedule; :class:`~cclc.errors.CollectiveError` when translations are no
    symmetry of ``coll``'s machine or its blocks are too small (:func:`symmetric_reason` says
    why)."""
    group = _group_for(coll, CollectiveKind.ALLTOALL)
    topo, n = coll.topology, coll.n
    shape = group.shape
    active = [d for d, m in enumerate(shape) if m > 1]
    D = max(len(active), 1)
    units = 2 * D
    pattern = even_split(coll.count // n, units)
    layout = np.tile(pattern, n)
    coords = group.coords(np.arange(n))                  # (dims, n): block p's offsets
    phase_len = max((shape[d] // 2 for d in active), default=0)
    cols: dict[str, list[np.ndarray]] = {k: [] for k in ("step", "src", "dst", "route",
                                                         "src_buf", "src_off", "dst_buf",
                                                         "dst_off", "count")}

    def add(**kw) -> None:
        for k, v in kw.items():
            cols[k].append(np.broadcast_to(np.asarray(v, dtype=np.int64),
                                           np.shape(kw["src"])).copy())

    # block 0 is rank 0's own: one local copy
    add(step=0, src=np.zeros(1), dst=np.zeros(1), route=0, src_buf=Buf.INPUT, src_off=0,
        dst_buf=Buf.OUTPUT, dst_off=0, count=units)
    blocks = np.arange(1, n)
    for u in range(units if n > 1 else 0):
        piece, half = divmod(u, 2)
        # per block (but block 0): the moves of unit u, in order, from phase to phase
        moves = []
        for phase in range(D):
            d = active[(piece + phase) % D] if active else 0
            m = shape[d]
            off = coords[d, blocks]
            plus = (2 * off < m) | ((2 * off == m) & (half == 0))
            hops = np.where(plus, off, m - off)
            moves.append((phase, d, np.where(plus, 1, -1), hops))
        total = sum(h for *_, h in moves)
        done = np.zeros(len(blocks), dtype=np.int64)
        at = np.zeros((len(shape), len(blocks)), dtype=np.int64)     # where the unit is
        for phase, d, sign, hops in moves:
            for h in range(int(hops.max(initial=0))):
                go = hops > h
                frm = np.ravel_multi_index(tuple(at[:, go]), shape)
                at[d, go] = (at[d, go] + sign[go]) % shape[d]
                to = np.ravel_multi_index(tuple(at[:, go]), shape)
                first, last = done[go] == 0, done[go] + 1 == total[go]
                chunk = blocks[go] * units + u
                add(step=phase * phase_len + h, src=frm, dst=to, route=0,
                    src_buf=np.where(first, Buf.INPUT, Buf.SCRATCH), src_off=chunk,
                    dst_buf=np.where(last, Buf.OUTPUT, Buf.SCRATCH),
                    dst_off=np.where(last, u, chunk), count=1)
                done[go] += 1
    cat = {k: np.concatenate(v) for k, v in cols.items()}
    remote = cat["src"] != cat["dst"]
    links = link_lookup(topo, cat["src"][remote], cat["dst"][remote])
    used, inverse = np.unique(links, return_inverse=True)
    cat["route"][remote] = inverse + 1
    # steps without ops (a phase shorter than another's) are dropped
    steps, cat["step"] = np.unique(cat["step"], return_inverse=True)
    order = np.argsort(cat["step"], kind="stable")
    ops = Ops(kind=np.full(len(order), OpKind.COPY), **{k: v[order] for k, v in cat.items()})
    routes = Routes(np.arange(-1, len(used) + 1).clip(0), used)
    return SymmetricSchedule(collective=coll, group=group,
                             layouts=(layout, layout, layout), ops=ops, routes=routes,
                             algorithm="halfring", schedule="dimrotation-symmetric")


def _ring_sets(shape: tuple[int, ...], fixed: list[int], dim: int, j: int) -> np.ndarray:
    """The blocks whose coordinates are 0 on the dimensions ``fixed`` and ``j`` on ``dim`` (rank
    0's set ``j`` of a ring phase on ``dim`` after the phases on ``fixed``)."""
    # the coordinates each dimension may take, the blocks in ascending order: O(set), where a
    # scan of every block made a phase on a long ring O(n) per step
    ranges = [np.zeros(1, dtype=np.int64) if d in fixed else np.full(1, j) if d == dim
              else np.arange(m) for d, m in enumerate(shape)]
    grid = np.meshgrid(*ranges, indexing="ij")
    return np.ravel_multi_index(tuple(g.ravel() for g in grid), shape).astype(np.int64)


def _chains(m: int, half: int) -> tuple[int, int]:
    """The lengths ``(P, M)`` of the plus and minus chains of a ring of ``m`` for unit ``half``:
    ``P + M = m - 1`` (every other rank of the ring once), as even as can be with ``P != M``
    (so that the two chains' last hops, into the target, fall in different steps), and the
    other half swapped so that both directions carry ``m - 1`` sets in all."""
    if m % 2 == 0:
        plus, minus = m // 2, m // 2 - 1
    else:
        plus, minus = (m + 1) // 2, (m - 3) // 2
    return (plus, minus) if half == 0 else (minus, plus)


def symmetric_allreduce(coll: Collective) -> SymmetricSchedule:
    """A torus AllReduce in symmetric form: DimRotation over rings, a reduce-scatter dimension
    by dimension then an allgather in the reverse order, each ring phase done by two chains.

    The vector is cut into ``n`` blocks (block ``b`` ends reduced on rank ``b``) of ``2 D``
    units: piece ``c`` of two halves runs its phases on the dimensions ``c, c + 1, ...``. In a
    reduce-scatter phase on a ring of ``N`` the ranks sum the *set* of blocks of every target
    ``x`` of the ring (the blocks that agree with ``x`` on the dimensions reduced so far) along
    two chains that end at ``x``: the plus chain from ``x - P`` (each rank adds its own part
    and passes the sum on), the minus chain from ``x + M``, ``P + M = N - 1``
    (:func:`_chains`; the two halves swap ``P`` and ``M``). After the phases of every dimension
    rank ``b`` holds block ``b`` summed over every rank, and the allgather phases copy the sets
    back out along the same chains. A phase lasts ``ceil(N/2)`` steps, half a ring's ``N - 1``,
    and every link of its dimension carries ``N - 1`` sets of one unit, as a ring would; the
    data of phase ``i`` is ``N`` times that of phase ``i + 1``, so the bandwidth term is
    ``2 (n - 1) S / (n 2D bw)``: the injection bound of a torus whose sides are alike and even.
    On unequal sides every phase lasts as long as the longest ring's, and a shorter ring's
    runs in waves to fill it (:func:`allreduce_phases`).
    :class:`~cclc.errors.CollectiveError` where :func:`symmetric_reason` says it cannot."""
    return _dimrotation_rings(coll, CollectiveKind.ALLREDUCE)


def symmetric_allgather(coll: Collective) -> SymmetricSchedule:
    """A torus AllGather in symmetric form: the allgather half of :func:`symmetric_allreduce`
    (rank 0 starts with its own block, and the phases spread the sets out dimension by
    dimension, the last phase the largest). :class:`~cclc.errors.CollectiveError` where
    :func:`symmetric_reason` says it cannot."""
    return _dimrotation_rings(coll, CollectiveKind.ALLGATHER)


def symmetric_reducescatter(coll: Collective) -> SymmetricSchedule:
    """A torus ReduceScatter in symmetric form: the reduce-scatter half of
    :func:`symmetric_allreduce`, summed in scratch (``n`` blocks, which the group moves as it
    moves the input's), then rank 0's block copied into its output in a step of its own.
    :class:`~cclc.errors.CollectiveError` where :func:`symmetric_reason` says it cannot."""
    return _dimrotation_rings(coll, CollectiveKind.REDUCESCATTER)


def _dimrotation_rings(coll: Collective, kind: CollectiveKind) -> SymmetricSchedule:
    group = _group_for(coll, kind)
    shape = group.shape
    active = [d for d, m in enumerate(shape) if m > 1]
    # (a torus of one rank: one empty order, as its two units have always had)
    units = [(order, half) for order in _rotations(active) or [[]] for half in (0, 1)]
    # a shorter ring's phase runs in waves to fill the longest one's
    span = _halving_span([shape[d] for d in active])
    return allreduce_phases(coll, group, units, _chains, span, compact=True, waves=True)


def _rotations(dims: Sequence[int]) -> list[list[int]]:
    """DimRotation's orders of ``dims`` (indices or sides alike): piece ``c`` visits
    ``dims[c], dims[c + 1], ...``."""
    return [[dims[(piece + i) % len(dims)] for i in range(len(dims))]
            for piece in range(len(dims))]


def _halving_span(sides: Sequence[int]) -> int:
    """The steps of a phase of :func:`_dimrotation_rings`: a phase on a ring of ``N`` lasts
    ``ceil(N/2)`` steps (the longer chain of :func:`_chains`), every phase the longest's."""
    return max(((m + 1) // 2 for m in sides), default=0)


def wave_shares(items: int, chain_steps: int, span: int) -> list[np.ndarray]:
    """The positions ``0..items-1`` of a set cut into the waves of a phase whose chains take
    ``chain_steps`` steps in a phase of ``span``: as many waves as fit, no more than there
    are items (a side of 2 beside a long ring would otherwise cut a set of a few blocks into
    thousands of empty shares), wave ``w`` starting ``w chain_steps`` steps in."""
    return np.array_split(np.arange(items), max(1, min(span // chain_steps, items)))


def ring_chains(m: int, half: int) -> tuple[int, int]:
    """The chain lengths ``(P, M)`` of a plain ring of ``m``: unit ``half`` 0 is summed along
    one plus chain of ``m - 1`` hops, unit 1 along a minus chain (a phase of ``m - 1`` steps,
    each link carrying one set a step, in its one direction)."""
    return (m - 1, 0) if half == 0 else (0, m - 1)


def ring_phases(kind: CollectiveKind, D: int) -> list[tuple[int, OpKind]]:
    """The ring phases of :func:`allreduce_phases` for ``kind`` over ``D`` dimensions, in
    order: each one's place in the units' dimension orders and its op (a reduce-scatter phase
    per dimension, then an allgather phase per dimension in the reverse order; an AllGather
    the second half alone, a ReduceScatter the first)."""
    scatter = [(p, OpKind.REDUCE) for p in range(D)]
    gather = [(p, OpKind.COPY) for p in range(D - 1, -1, -1)]
    return {CollectiveKind.ALLREDUCE: scatter + gather, CollectiveKind.ALLGATHER: gather,
            CollectiveKind.REDUCESCATTER: scatter}[kind]


def allreduce_phases(coll: Collective, group: TranslationGroup,
                     units: Sequence[tuple[Sequence[int], int]],
                     chains: Callable[[int, int], tuple[int, int]], span: int,
                     compact: bool, scratch_sets: int = 0,
                     waves: bool = False) -> SymmetricSchedule:
    """The DimRotation ring phases of :func:`symmetric_allreduce` with its units given: unit
    ``u`` of ``units`` is (its dimension order, its half for ``chains``); every phase lasts
    ``span`` steps (phase ``i`` starts at step ``1 + i span``; step 0 copies the input),
    a reduce-scatter phase per dimension of the order, then an allgather phase per dimension
    in the reverse order: both for an AllReduce, the first half for a ReduceScatter (which
    sums in scratch and copies rank 0's block into its output in a last step), the second for
    an AllGather (rank 0's input copied into its block of the output first). ``compact`` drops
    the steps without ops; without it a phase keeps its ``span`` steps, so the phases of
    :func:`ring_phase_classes` stay where they are. ``scratch_sets`` sets of a block's units
    are laid out in scratch (chunk ``j U + u`` the size of unit ``u``; after a
    ReduceScatter's ``n`` blocks), for ops added beside these; none of these touches them.
    ``waves``: a phase whose chains fit ``w > 1`` times into ``span`` runs as ``w`` waves, one
    after another, each over a share of every set's blocks (a block's wave is fixed by its
    coordinates on the dimensions not yet summed, which its chain does not change), so that a
    short ring's link carries per step what a long ring's does instead of ``w`` times as much
    in the first ``1/w`` of the phase."""
    n, shape, kind = coll.n, group.shape, coll.kind
    U = len(units)
    D = len(units[0][0]) if units else 0
    pattern = even_split(coll.count // n, U)
    blocks_of = np.tile(pattern, n)
    # where the phases sum and spread the blocks: the output, or scratch for a ReduceScatter
    work = summing_buffer(kind)
    layouts = {CollectiveKind.ALLREDUCE: (blocks_of, blocks_of),
               CollectiveKind.ALLGATHER: (pattern, blocks_of),
               CollectiveKind.REDUCESCATTER: (blocks_of, pattern)}[kind]
    scratch = np.tile(pattern, scratch_sets + (n if work is Buf.SCRATCH else 0))
    cols: dict[str, list[np.ndarray]] = {k: [] for k in ("step", "src", "dst", "kind",
                                                         "src_buf", "src_off", "dst_buf",
                                                         "dst_off", "count")}

    def add(step, dst, kind, src_buf, chunks, count=1, dst_buf=work) -> None:
        m = len(chunks)
        for k, v in (("step", step), ("src", 0), ("dst", dst), ("kind", kind),
                     ("src_buf", src_buf), ("src_off", chunks), ("dst_buf", dst_buf),
                     ("dst_off", chunks), ("count", count)):
            cols[k].append(np.broadcast_to(np.asarray(v, dtype=np.int64), (m,)).copy())

    # rank 0's input into its work buffer: every block (one op per block: ops do not cross
    # blocks), or an AllGather's one block into its own place
    own = np.zeros(1, dtype=np.int64) if kind is CollectiveKind.ALLGATHER else np.arange(n)
    add(0, 0, OpKind.COPY, Buf.INPUT, own * U, count=U)
    step = 1
    for phase, op in ring_phases(kind, D):
        for u, (order, half) in enumerate(units if n > 1 else ()):
            d, m = order[phase], shape[order[phase]]
            lengths = chains(m, half)
            steps = max(lengths)
            for sign, length in zip((1, -1), lengths, strict=True):
                unit = np.zeros(len(shape), dtype=np.int64)
                unit[d] = sign
                neighbour = group.element(unit)
                for k in range(length):
                    # rank 0 is hop k of the chain of target x: x - P + k = 0 on the plus
                    # chain of a reduce-scatter (x + M - k = 0 on the minus one), x + k = 0
                    # (x - k) when the allgather spreads x's set
                    x = (sign * (length - k) if op is OpKind.REDUCE else -sign * k) % m
                    blocks = _ring_sets(shape, list(order[:phase]), d, x)
                    shares = (wave_shares(len(blocks), steps, span) if waves
                              else [np.arange(len(blocks))])
                    for w, share in enumerate(shares):
                        add(step + w * steps + k, neighbour, op, work, blocks[share] * U + u)
        step += span
    if work is Buf.SCRATCH:
        # block 0, summed over every rank, into the output
        add(step, 0, OpKind.COPY, Buf.SCRATCH, np.zeros(1, dtype=np.int64), count=U,
            dst_buf=Buf.OUTPUT)
    cat = {k: np.concatenate(v) for k, v in cols.items()}
    remote = cat["src"] != cat["dst"]
    route = np.zeros(len(cat["src"]), dtype=np.int64)
    links = link_lookup(coll.topology, cat["src"][remote], cat["dst"][remote])
    used, inverse = np.unique(links, return_inverse=True)
    route[remote] = inverse + 1
    if compact:
        _, cat["step"] = np.unique(cat["step"], return_inverse=True)
    order_ = np.argsort(cat["step"], kind="stable")
    ops = Ops(route=route[order_], **{k: v[order_] for k, v in cat.items()})
    routes = Routes(np.arange(-1, len(used) + 1).clip(0), used)
    return SymmetricSchedule(collective=coll, group=group,
                             layouts=(*layouts, scratch), ops=ops, routes=routes,
                             algorithm="ring", schedule="dimrotation-symmetric",
                             params=() if compact else (("span", span),))
