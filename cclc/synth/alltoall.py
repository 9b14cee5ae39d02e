"""A synthesized AllToAll: the path LP (:mod:`cclc.synth.flows`), its pieces packed into steps
(:mod:`cclc.synth.pack`), written as ops.

Buffers. Pair ``(s, j)``'s block is cut into one chunk per piece (``P`` chunks per block, the
most pieces any pair has; unused ones have 0 elements), so input chunk ``j P + k`` of rank
``s`` and output chunk ``s P + k`` of rank ``j`` hold piece ``k``; layouts are per rank (the
shares differ by pair). A piece waiting at a relaying rank sits in a scratch chunk of that rank
of its size; a chunk is reused by a later piece of the same size once it has been forwarded
(written in step ``t``, read in ``t + 1``, free from ``t + 2``; :func:`_scratch_chunks`).
The ops are written as columns (:mod:`cclc.synth.piece_table`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from cclc.collective import Collective
from cclc.execution import IR_MODEL, ExecutionModel, predict
from cclc.ir import Buf, Schedule, ScheduleBuilder
from cclc.synth.flow_solution import FlowSolution, usable_links
from cclc.synth.flows import choose_symmetry
from cclc.synth.orbit_pack import pack_orbits, piece_orbits
from cclc.synth.pack import Packing, pack_pieces, pieces_of
from cclc.synth.piece_table import Piece, hop_table
from cclc.synth.pricing import step_cost
from cclc.synth.stagger import MAX_LP_CELLS, stagger_lp
from cclc.synth.symmetry import Symmetry
from cclc.synth.vertex import basic_orbit_paths, basic_paths

__all__ = ["SynthAllToAll", "default_split", "step_candidates", "synthesize_alltoall",
           "write_schedule"]

#: paths per pair kept from the LP, and the smallest share kept (relative to the pair's
#: largest): tiny shares cost an op and a step slot each and move almost nothing. A basic
#: optimum (:mod:`cclc.synth.vertex`) rarely has more than two paths per pair.
MAX_PATHS = 4
MIN_WEIGHT = 0.01
#: pieces (paths x split) the greedy packing is given when no split is asked for: finer pieces
#: balance the steps better (4x4x4 torus with two failed links, 128 MiB: 91.3% of the LP rate
#: with 2 pieces per path, 95.3% with 4, 96.9% with 8; 5x5x5 with one failed link: 95.2% with
#: 2, 97.5% with 4; 5x5x5 with two failed links, 47 498 paths: 93.0% with 1, 96.2% with 2)
#: but every piece is an op per hop
MAX_PIECES = 100_000
#: the pieces per path tried, finest first
SPLITS = (8, 4, 2, 1)
#: seconds one staggering LP may take
LP_TIME_LIMIT = 20.0
#: seconds the basic optimum (:func:`cclc.synth.vertex.basic_paths`) may take; past it PDLP's
#: paths are packed as they are. It takes 7-8 s of CPU time at 125 ranks (5x5x5 with one or
#: two failed links); on the healthy 8x8x8 torus (912 896 paths) it did not finish in 300 s
BASIC_TIME_LIMIT = 60.0
#: above this many paths, without a group to pack by orbits, the basic optimum is not tried:
#: on the healthy 8x8x8 torus (912 896 paths) it did not finish within 300 s. With a group,
#: the basic optimum over path orbits is solved instead (:func:`cclc.synth.vertex.
#: basic_orbit_paths`: 10 s of CPU time on 8x8x8 with one failed link, and symmetric)
BASIC_MAX_PATHS = 200_000
#: above this many paths, a collective with a symmetry packs one piece per orbit
#: (:mod:`cclc.synth.orbit_pack`); below it the greedy packing of every piece takes seconds
#: and its finer choices are kept
ORBIT_PACK_ABOVE = 100_000
#: pieces under the orbit packing (8x8x8 torus with one failed link: 287 980 paths after the
#: basic optimum over orbits, 2 pieces each, 38 308 representatives)
ORBIT_MAX_PIECES = 1_000_000
#: local-search passes of the orbit packing (+0.2-0.5% of the LP there, 1.5 s each)
ORBIT_PASSES = 2
#: under a model with software costs, this many of the best packings are written and priced
PREDICTED = 3


@dataclass(frozen=True, eq=False)
class SynthAllToAll:
    """The pieces, their packing and the predicted lockstep time."""

    pieces: list[Piece]
    width: int
    packing: Packing


def step_candidates(longest: int, n: int) -> list[int]:
    """Step counts tried: no staggering, then room to stagger (a few times the longest path);
    fewer for large groups, where each try costs seconds."""
    if n > 64:
        # 5x5x5 with a failed link, 128 MiB: 8 steps 95.9%, 10 steps 97.5%, 16 steps 96.9%
        return [longest, longest + 2]
    if n > 32:
        return [longest, longest + 2, 2 * longest]
    return sorted({longest, longest + 1, longest + 2, 2 * longest, 3 * longest})


def default_split(n_paths: int) -> int:
    """Pieces per path: the finest of :data:`SPLITS` within :data:`MAX_PIECES` pieces."""
    return next((s for s in SPLITS if s * n_paths <= MAX_PIECES), 1)


def orbit_group(coll: Collective, n_paths: int) -> Symmetry | None:
    """The group the path LP was solved over, when the pieces are packed by orbits: more than
    :data:`ORBIT_PACK_ABOVE` paths and a group that is not trivial; else ``None``."""
    if n_paths <= ORBIT_PACK_ABOVE:
        return None
    sym = choose_symmetry(coll, usable_links(coll))
    return sym if sym.order > 1 else None


def orbit_split(n_paths: int) -> int:
    """Pieces per path under the orbit packing: the finest of :data:`SPLITS` within
    :data:`ORBIT_MAX_PIECES` pieces (the packing's cost is the representatives'; writing,
    verifying and simulating grow with every piece)."""
    return next((s for s in SPLITS if s * n_paths <= ORBIT_MAX_PIECES), 1)


def orbit_steps(longest: int) -> list[int]:
    """Step counts tried under the orbit packing: each costs a few seconds there, and room to
    stagger pays (8x8x8 torus, one failed link, 2 pieces per path: 94.0% of the LP in 14
    steps, 95.2% in 16, 95.1% in 18, 94.6% in 20)."""
    return [longest, longest + 2, longest + 4, longest + 6]


def synthesize_alltoall(coll: Collective, flows: FlowSolution, split: int | None = None,
                        steps: int | None = None, deadline: float | None = None,
                        model: ExecutionModel | None = None,
                        lp_time_limit: float | None = LP_TIME_LIMIT) -> SynthAllToAll:
    """Pieces of ``flows`` packed into the step count with the smallest predicted time (or
    into ``steps`` steps when given): by the staggering LP (:mod:`cclc.synth.stagger`) where it
    is small enough, and by greedy list scheduling of ``split`` pieces per path; the better
    one is kept. ``flows`` is first re-weighted to a basic optimum
    (:func:`cclc.synth.vertex.basic_paths`), and ``split`` defaults to
    :func:`default_split`. Past :data:`ORBIT_PACK_ABOVE` paths on a symmetric machine
    (:func:`orbit_group`), the basic optimum is taken over path orbits
    (:func:`cclc.synth.vertex.basic_orbit_paths`), the pieces are packed one per orbit
    (:mod:`cclc.synth.orbit_pack`) into :func:`orbit_steps` steps, and ``split`` defaults to
    :func:`orbit_split`.

    ``model`` (default: the IR's lockstep model; the planner gives its own) is the
    execution model the schedule will be priced with: the packing charges every step its
    software cost (:func:`cclc.synth.pricing.step_cost`), and where the model charges any,
    the :data:`PREDICTED` best packings are written and compared by the model's own
    prediction. Each staggering LP may take ``lp_time_limit`` seconds (``None``: no
    staggering LP, the greedy packing only); once one has not finished in that time, the
    larger ones (more steps) are not tried."""
    model = IR_MODEL if model is None else model
    step_overhead = step_cost(model)
    left = BASIC_TIME_LIMIT if deadline is None else min(
        BASIC_TIME_LIMIT, max(deadline - time.monotonic(), 1.0))
    sym = orbit_group(coll, len(flows.path))
    if sym is not None:
        flows = basic_orbit_paths(coll, flows, sym, time_limit=left)
    elif len(flows.path) <= BASIC_MAX_PATHS:
        flows = basic_paths(coll, flows, time_limit=left)
    if split is None:
        split = default_split(len(flows.path)) if sym is None else orbit_split(len(flows.path))
    cut, cut_width = pieces_of(coll, flows.src, flows.dst, flows.weight, flows.path,
                               MAX_PATHS, MIN_WEIGHT, split)
    # whole paths, for the staggering LP only (and only where it can be small enough)
    whole = cut if split == 1 else (
        pieces_of(coll, flows.src, flows.dst, flows.weight, flows.path, MAX_PATHS,
                  MIN_WEIGHT, 1)[0] if lp_time_limit is not None and
        len(flows.path) <= MAX_LP_CELLS else [])
    longest = max((len(p.hops) for p in cut), default=1)
    orbits = table = None
    if sym is not None:
        table = hop_table(coll.topology, cut)
        orbits = piece_orbits(coll, cut, sym, usable_links(coll), table)
    options: list[SynthAllToAll] = []
    stagger = lp_time_limit is not None
    if steps is not None:
        tries = [max(steps, longest)]
    else:
        tries = step_candidates(longest, coll.n) if orbits is None else orbit_steps(longest)
    for t in tries:
        small = bool(whole) and len(whole) * t <= MAX_LP_CELLS
        if stagger and lp_time_limit is not None and small and (steps is not None
                                                                or t <= longest + 2):
            # the LP grows with the steps and gains little past the shortest: try the
            # shortest few (HiGHS stops at the time limit; the greedy one stands then, and
            # a larger LP would not finish either: tpuv4_4x4x4_ocs, 5 and 7 steps, 22 and
            # 27 s of CPU time, the second without an optimum)
            limit = lp_time_limit
            if deadline is not None:
                remaining = max(deadline - time.monotonic(), 1.0)
                limit = remaining if limit is None else min(limit, remaining)
            found = stagger_lp(coll, whole, t, step_overhead, time_limit=limit)
            stagger = found is not None
            if found is not None:
                pieces, packing = found
                options.append(SynthAllToAll(pieces, 1 + max(p.slot for p in pieces), packing))
        # local search pays where the group is small enough to afford it
        passes = 2 if coll.n <= 64 else 0
        packing = (pack_pieces(coll, cut, t, step_overhead, passes) if orbits is None
                   else pack_orbits(coll, cut, orbits, t, step_overhead, table, ORBIT_PASSES))
        options.append(SynthAllToAll(cut, cut_width, packing))
    options.sort(key=lambda o: o.packing.time)
    if not model.charges_software:
        return options[0]       # the packing's time is the lockstep simulator's, exactly
    # dataflow models overlap steps, which the packing's step sums do not see
    timed = [(predict(write_schedule(coll, o, ()), model).time, i, o)
             for i, o in enumerate(options[:PREDICTED])]
    return min(timed, key=lambda x: x[:2])[2]


def _scratch_chunks(n: int, rank: np.ndarray, elems: np.ndarray, step: np.ndarray,
                    relay: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Scratch chunks for the hops that land at a relay (``relay``; other entries get 0) and
    the scratch layout (elements per chunk, one row per rank).

    A chunk written in step ``t`` is read in ``t + 1`` and free again from ``t + 2``: chunks
    of one size at one rank come in two sets, one written in even steps and one in odd, each
    as large as the most writes of that size any step of its parity has there. This is one
    sort, not a loop per op (six million at 512 ranks)."""
    out = np.zeros(len(rank), dtype=np.int64)
    idx = np.flatnonzero(relay)
    if not len(idx):
        return out, np.zeros((n, 0), dtype=np.int64)
    r, e, t = rank[idx], elems[idx], step[idx]
    order = np.lexsort((t, e, r))
    r, e, t, idx = r[order], e[order], t[order], idx[order]
    # the index of each write among the writes of its (rank, size, step)
    cell = np.r_[True, (r[1:] != r[:-1]) | (e[1:] != e[:-1]) | (t[1:] != t[:-1])]
    cell_start = np.flatnonzero(cell)
    cell_of = np.cumsum(cell) - 1
    within = np.arange(len(r)) - cell_start[cell_of]
    # per (rank, size, parity): the most writes in one step
    cls = np.r_[True, (r[1:] != r[:-1]) | (e[1:] != e[:-1])]
    cls_of = np.cumsum(cls) - 1
    parity = t % 2
    key = cls_of * 2 + parity
    most = np.zeros(2 * (int(cls_of[-1]) + 1), dtype=np.int64)
    np.maximum.at(most, key, within + 1)
    per_cls = most.reshape(-1, 2)
    # chunks of a rank: its classes in order, each its even set then its odd set
    cls_rank = r[cls]
    cls_elems = e[cls]
    size = per_cls.sum(axis=1)
    rank_first = np.r_[True, cls_rank[1:] != cls_rank[:-1]]
    ends = np.cumsum(size)
    base = ends - size
    base = base - np.repeat(base[rank_first], np.diff(np.r_[np.flatnonzero(rank_first),
                                                          len(size)]))
    out[idx] = base[cls_of] + parity * per_cls[cls_of, 0] + within
    width = np.zeros(n, dtype=np.int64)
    np.add.at(width, cls_rank, size)
    lay = np.zeros((n, int(width.max())), dtype=np.int64)
    chunk_rank = np.repeat(cls_rank, size)
    chunk_pos = np.repeat(base, size) + (np.arange(int(size.sum())) -
                                         np.repeat(ends - size, size))
    lay[chunk_rank, chunk_pos] = np.repeat(cls_elems, size)
    return out, lay


def write_schedule(coll: Collective, synth: SynthAllToAll,
                   params: tuple[tuple[str, int | float | str], ...]) -> Schedule:
    """The ops of ``synth`` as a :class:`~cclc.ir.Schedule` (see the module docstring)."""
    n, P = coll.n, synth.width
    h = hop_table(coll.topology, synth.pieces)
    lay_in = np.zeros((n, n * P), dtype=np.int64)
    lay_out = np.zeros((n, n * P), dtype=np.int64)
    lay_in[h.src, h.dst * P + h.slot] = h.elems
    lay_out[h.dst, h.src * P + h.slot] = h.elems
    # the block a rank keeps for itself: one local copy of all its chunks (the diagonal pairs
    # have no pieces, so give their first chunk the whole block)
    item = coll.dtype.itemsize
    own = (np.diag(np.asarray(coll.pair_sizes, dtype=np.int64)) // item
           if coll.pair_sizes is not None else np.full(n, coll.count // n, dtype=np.int64))
    ranks = np.arange(n)
    lay_in[ranks, ranks * P] = own
    lay_out[ranks, ranks * P] = own

    start = np.asarray(synth.packing.start, dtype=np.int64)
    step = start[h.piece] + h.k
    # every hop lands in scratch at its relay, the last in the output; every hop but the first
    # reads where the one before landed
    first = h.k == 0
    prev = np.maximum(np.arange(len(step)) - 1, 0)
    src = np.where(first, h.src[h.piece], h.lands[prev])
    dst_buf = np.where(h.last, int(Buf.OUTPUT), int(Buf.SCRATCH))
    chunk, scratch = _scratch_chunks(n, h.lands, h.elems[h.piece], step, ~h.last)
    dst_off = np.where(h.last, h.src[h.piece] * P + h.slot[h.piece], chunk)
    src_buf = np.where(first, int(Buf.INPUT), dst_buf[prev])
    src_off = np.where(first, h.dst[h.piece] * P + h.slot[h.piece], dst_off[prev])
    b = ScheduleBuilder(coll, input=lay_in, output=lay_out, scratch=scratch)
    lengths = np.array([len(r) for r in h.runs], dtype=np.int64)
    ids = b.add_routes(np.concatenate([[0], np.cumsum(lengths)]),
                       np.fromiter((e for r in h.runs for e in r), dtype=np.int32,
                                   count=int(lengths.sum())))
    # ops in the order of the pieces' starts (then piece, then hop), as the runtimes get them
    order = np.lexsort((np.arange(len(step)), start[h.piece], step))
    if len(step):
        b.add(step=step[order], src=src[order], dst=h.lands[order], route=ids[h.route[order]],
              src_buf=src_buf[order], src_off=src_off[order], dst_buf=dst_buf[order],
              dst_off=dst_off[order])
    b.add(step=0, src=ranks, dst=ranks, src_buf=Buf.INPUT, src_off=ranks * P,
          dst_buf=Buf.OUTPUT, dst_off=ranks * P)
    return b.build("synth", "-", params)
