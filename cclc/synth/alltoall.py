"""A synthesized AllToAll: the path LP (:mod:`cclc.synth.flows`), its pieces packed into steps
(:mod:`cclc.synth.pack`), written as ops.

Buffers. Pair ``(s, j)``'s block is cut into one chunk per piece (``P`` chunks per block, the
most pieces any pair has; unused ones have 0 elements), so input chunk ``j P + k`` of rank
``s`` and output chunk ``s P + k`` of rank ``j`` hold piece ``k``; layouts are per rank (the
shares differ by pair). A piece waiting at a relaying rank sits in a scratch chunk of that rank
of its size; a chunk is reused by a later piece of the same size once it has been forwarded
(written in step ``t``, read in ``t + 1``, free from ``t + 2``).
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from cclc.collective import Collective
from cclc.execution import ExecutionModel, predict
from cclc.ir import Buf, Schedule, ScheduleBuilder
from cclc.synth.flows import FlowSolution
from cclc.synth.pack import Packing, Piece, pack_pieces, pieces_of
from cclc.synth.pricing import pricing_model, step_cost
from cclc.synth.stagger import MAX_LP_CELLS, stagger_lp
from cclc.synth.vertex import basic_paths

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


def synthesize_alltoall(coll: Collective, flows: FlowSolution, split: int | None = None,
                        steps: int | None = None, deadline: float | None = None,
                        model: ExecutionModel | None = None,
                        lp_time_limit: float | None = LP_TIME_LIMIT) -> SynthAllToAll:
    """Pieces of ``flows`` packed into the step count with the smallest predicted time (or
    into ``steps`` steps when given): by the staggering LP (:mod:`cclc.synth.stagger`) where it
    is small enough, and by greedy list scheduling of ``split`` pieces per path; the better
    one is kept. ``flows`` is first re-weighted to a basic optimum
    (:func:`cclc.synth.vertex.basic_paths`), and ``split`` defaults to
    :func:`default_split`.

    ``model`` (default: the planner's, :func:`cclc.synth.pricing.pricing_model`) is the
    execution model the schedule will be priced with: the packing charges every step its
    software cost (:func:`cclc.synth.pricing.step_cost`), and where the model charges any,
    the :data:`PREDICTED` best packings are written and compared by the model's own
    prediction. Each staggering LP may take ``lp_time_limit`` seconds (``None``: no
    staggering LP, the greedy packing only); once one has not finished in that time, the
    larger ones (more steps) are not tried."""
    model = pricing_model() if model is None else model
    step_overhead = step_cost(model)
    left = BASIC_TIME_LIMIT if deadline is None else min(
        BASIC_TIME_LIMIT, max(deadline - time.monotonic(), 1.0))
    flows = basic_paths(coll, flows, time_limit=left)
    if split is None:
        split = default_split(len(flows.path))
    whole, _ = pieces_of(coll, flows.src, flows.dst, flows.weight, flows.path,
                         MAX_PATHS, MIN_WEIGHT, 1)
    cut, cut_width = pieces_of(coll, flows.src, flows.dst, flows.weight, flows.path,
                               MAX_PATHS, MIN_WEIGHT, split)
    longest = max((len(p.hops) for p in whole), default=1)
    options: list[SynthAllToAll] = []
    stagger = lp_time_limit is not None
    for t in ([max(steps, longest)] if steps is not None else step_candidates(longest, coll.n)):
        if stagger and len(whole) * t <= MAX_LP_CELLS and (steps is not None or t <= longest + 2):
            # the LP grows with the steps and gains little past the shortest: try the
            # shortest few (HiGHS stops at the time limit; the greedy one stands then, and
            # a larger LP would not finish either: tpuv4_4x4x4_ocs, 5 and 7 steps, 22 and
            # 27 s of CPU time, the second without an optimum)
            left = lp_time_limit if deadline is None else min(
                lp_time_limit, max(deadline - time.monotonic(), 1.0))
            found = stagger_lp(coll, whole, t, step_overhead, time_limit=left)
            stagger = found is not None
            if found is not None:
                pieces, packing = found
                options.append(SynthAllToAll(pieces, 1 + max(p.slot for p in pieces), packing))
        # local search pays where the group is small enough to afford it
        passes = 2 if coll.n <= 64 else 0
        options.append(SynthAllToAll(cut, cut_width,
                                     pack_pieces(coll, cut, t, step_overhead, passes)))
    options.sort(key=lambda o: o.packing.time)
    if not model.charges_software:
        return options[0]       # the packing's time is the lockstep simulator's, exactly
    # dataflow models overlap steps, which the packing's step sums do not see
    timed = [(predict(write_schedule(coll, o, ()), model).time, i, o)
             for i, o in enumerate(options[:PREDICTED])]
    return min(timed, key=lambda x: x[:2])[2]


def write_schedule(coll: Collective, synth: SynthAllToAll,
                   params: tuple[tuple[str, int | float | str], ...]) -> Schedule:
    """The ops of ``synth`` as a :class:`~cclc.ir.Schedule` (see the module docstring)."""
    n, P = coll.n, synth.width
    lay_in = np.zeros((n, n * P), dtype=np.int64)
    lay_out = np.zeros((n, n * P), dtype=np.int64)
    for p in synth.pieces:
        lay_in[p.src, p.dst * P + p.slot] = p.elems
        lay_out[p.dst, p.src * P + p.slot] = p.elems
    # the block a rank keeps for itself: one local copy of all its chunks (the diagonal pairs
    # have no pieces, so give their first chunk the whole block)
    item = coll.dtype.itemsize
    own = (np.diag(np.asarray(coll.pair_sizes, dtype=np.int64)) // item
           if coll.pair_sizes is not None else np.full(n, coll.count // n, dtype=np.int64))
    ranks = np.arange(n)
    lay_in[ranks, ranks * P] = own
    lay_out[ranks, ranks * P] = own

    cols: dict[str, list[int]] = {k: [] for k in ("step", "src", "dst", "route", "src_buf",
                                                  "src_off", "dst_buf", "dst_off")}
    scratch_sizes: list[list[int]] = [[] for _ in range(n)]
    free: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)  # (rank, elems)
    # the builder needs the scratch layout, known only at the end: collect routes meanwhile
    b_routes: dict[tuple[int, ...], int] = {}
    route_list: list[tuple[int, ...]] = []

    def route_id(links: tuple[int, ...]) -> int:
        rid = b_routes.get(links)
        if rid is None:
            rid = b_routes[links] = len(route_list)
            route_list.append(links)
        return rid

    def take(rank: int, elems: int, written: int) -> int:
        slots = free[(rank, elems)]
        for i, (chunk, free_at) in enumerate(slots):
            if free_at <= written:
                slots[i] = (chunk, written + 2)
                return chunk
        chunk = len(scratch_sizes[rank])
        scratch_sizes[rank].append(elems)
        slots.append((chunk, written + 2))
        return chunk

    order = np.argsort(synth.packing.start, kind="stable")
    for i in order.tolist():
        p = synth.pieces[i]
        sigma = int(synth.packing.start[i])
        at, buf, off = p.src, Buf.INPUT, p.dst * P + p.slot
        for k, (hop, lands) in enumerate(zip(p.hops, p.via, strict=True)):
            t = sigma + k
            if k == len(p.hops) - 1:
                dbuf, doff = Buf.OUTPUT, p.src * P + p.slot
            else:
                dbuf, doff = Buf.SCRATCH, take(lands, p.elems, t)
            row = (t, at, lands, route_id(hop), buf, off, dbuf, doff)
            for key, v in zip(cols, row, strict=True):
                cols[key].append(int(v))
            at, buf, off = lands, dbuf, doff
    width = max((len(x) for x in scratch_sizes), default=0)
    lay_scr = np.zeros((n, width), dtype=np.int64)
    for r, sizes in enumerate(scratch_sizes):
        lay_scr[r, :len(sizes)] = sizes
    b = ScheduleBuilder(coll, input=lay_in, output=lay_out, scratch=lay_scr)
    ids = np.array([b.route(path) for path in route_list], dtype=np.int32)
    c = {k: np.array(v, dtype=np.int64) for k, v in cols.items()}
    if len(c["step"]):
        b.add(step=c["step"], src=c["src"], dst=c["dst"], route=ids[c["route"]],
              src_buf=c["src_buf"], src_off=c["src_off"], dst_buf=c["dst_buf"],
              dst_off=c["dst_off"])
    b.add(step=0, src=ranks, dst=ranks, src_buf=Buf.INPUT, src_off=ranks * P,
          dst_buf=Buf.OUTPUT, dst_off=ranks * P)
    return b.build("synth", "-", params)
