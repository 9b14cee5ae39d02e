"""Rings in both directions, FoldedRing, and multi-dimensional tori for AllGather, ReduceScatter, \
AllReduce.

All of them are one engine: the group laid out on a grid whose every dimension is a logical
ring (a torus: its dimensions; a single ring: one dimension; NVLink nodes on a fabric: nodes x
GPUs, see :mod:`cclc.algorithms.hierarchical`). The data of every block is cut into *pieces*;
each piece has a direction (+1 or -1 around every ring) and an order of dimensions.

* ReduceScatter, one piece: dimension by dimension in the piece's order, a ring reduce-scatter
  along that dimension over the blocks still in play. After dimension ``e`` a rank holds partial
  sums only for blocks whose coordinate ``e`` is its own, summed over its ``e``-ring.
* AllGather, one piece: the mirror, dimensions in the reverse order; after dimension ``e`` a rank
  holds every block of the sub-grid spanned by the dimensions done so far.
* AllReduce: ReduceScatter then AllGather of the same pieces: it moves ``2 (n-1)/n`` of the
  buffer per rank, the bandwidth-optimal amount without in-network reduction.

Entries:

``biring``
    One dimension (the group in ring order), two pieces, one per direction: every link is busy
    in both directions, so on a physical ring it needs half the time of the one-direction ring.
``foldedring``
    A ring with one failed link becomes the line ``i+1 .. i``; the logical ring visits the even
    positions of the line going up and the odd ones coming down, so every logical hop is at most
    two physical hops and every surviving directed link carries exactly one logical hop
    (the folded-torus embedding). One direction.
``ring+dimrotation``
    A whole torus: ``2 D`` pieces (D dimensions of size > 1, two directions); piece ``c`` visits
    dimensions ``c, c+1, ...`` (rotated), so at every stage every dimension carries some piece
    and no dimension waits for another (DimRotation, section 2). A ring that a failed link (or
    a mesh's missing wrap) cuts runs as a line, its blocks reduced and gathered by two chains
    that never cross the cut; the rotations are weighted so that the cut dimensions' lines
    are no busier than the whole rings in the first phase (:func:`dimrot_plan`).

Reductions follow the IR rules: a local step first copies every input block into a scratch
accumulator; every later hop *reduces* the sender's partial into the receiver's accumulator
(at most one write per slot per step); a final local step copies each rank's reduced block out.
Local steps cost nothing in the default cost model.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from cclc.algorithms import Algorithm, NoBound, every_rank_ops, register
from cclc.algorithms.common import (
    add_pair_routes,
    even_split,
    group_index,
    snake_order,
)
from cclc.collective import Collective, CollectiveKind
from cclc.errors import CollectiveError
from cclc.ir import Buf, OpKind, Schedule, ScheduleBuilder
from cclc.sends import Sends, sends

__all__ = ["KINDS", "Grid", "Piece", "dimrot_plan", "folded_order", "grid_ops", "grid_pieces",
           "grid_schedule", "grid_slots", "line_cuts"]

KINDS = frozenset({CollectiveKind.ALLGATHER, CollectiveKind.REDUCESCATTER,
                   CollectiveKind.ALLREDUCE})


@dataclass(frozen=True)
class Piece:
    """One share of every block: ``direction`` (+1/-1) around each ring, reduce-scatter
    dimension ``order`` (the all-gather uses it reversed), and a ``delay`` in steps before it
    starts (pipelining: a delayed piece uses one dimension while another piece uses the next)."""

    direction: int
    order: tuple[int, ...]
    delay: int = 0


class Grid:
    """The group on a grid: ``members[c]`` is the group index at grid coordinates ``c``.

    ``hop_path(u, v)`` (optional) gives the global link ids of the hop from group index ``u``
    to its ring neighbour ``v``; by default hops take shortest healthy paths.
    """

    def __init__(self, members: np.ndarray,
                 hop_path: Callable[[int, int], Sequence[int]] | None = None):
        self.members = np.asarray(members, dtype=np.int64)
        self.dims = self.members.shape
        self.n = self.members.size
        self.coords = np.empty((self.n, len(self.dims)), dtype=np.int64)
        self.coords[self.members.ravel()] = np.stack(np.unravel_index(
            np.arange(self.n), self.dims), axis=1)
        self.hop_path = hop_path

    def neighbour(self, dim: int, direction: int) -> np.ndarray:
        """Group index of the next member along ``dim`` in ``direction``, per group index."""
        c = self.coords.copy()
        c[:, dim] = (c[:, dim] + direction) % self.dims[dim]
        return self.members[tuple(c.T)]

    def hop_routes(self, b: ScheduleBuilder, dim: int, direction: int,
                   skip: np.ndarray | None = None) -> np.ndarray:
        """Route ids of every member's hop along ``dim`` in ``direction``; 0 (no route)
        where ``skip``, hops no op takes."""
        src = np.arange(self.n)
        dst = self.neighbour(dim, direction)
        if skip is not None:
            dst = np.where(skip, src, dst)
        if self.hop_path is None:
            return add_pair_routes(b, b.collective, src, dst)
        return np.array([b.route(self.hop_path(u, v)) if u != v else 0
                         for u, v in zip(src.tolist(), dst.tolist(), strict=True)], dtype=np.int32)


class _Engine:
    """Emits the ops of the grid reduce-scatter / all-gather for every piece."""

    def __init__(self, b: ScheduleBuilder, grid: Grid, pieces: Sequence[Piece],
                 cuts: dict[int, np.ndarray] | None = None):
        self.b, self.grid, self.pieces = b, grid, list(pieces)
        self.P = len(self.pieces)
        self.cuts = cuts or {}
        self._routes: dict[tuple[int, int], np.ndarray] = {}

    def route(self, dim: int, direction: int) -> np.ndarray:
        key = (dim, direction)
        if key not in self._routes:
            skip = None
            if dim in self.cuts:       # the hop across a cut (a failed or missing link)
                cut = self.cuts[dim]
                at = self.grid.coords[:, dim]
                skip = (cut >= 0) & (at == (cut if direction > 0 else
                                            (cut + 1) % self.grid.dims[dim]))
            self._routes[key] = self.grid.hop_routes(self.b, dim, direction, skip)
        return self._routes[key]

    def phase_steps(self, dim: int) -> int:
        """Steps of a reduce-scatter phase along ``dim``: a ring's ``m - 1``, and one more
        (local) step where a line is cut (see :meth:`_line_ops`)."""
        return self.grid.dims[dim] - 1 + (dim in self.cuts)

    def _whole(self, dim: int, rows: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
        """``rows`` of :meth:`_block_ops` less those of members on cut lines of ``dim``."""
        if dim not in self.cuts:
            return rows
        keep = self.cuts[dim][rows[0]] < 0
        return tuple(r[keep] for r in rows)

    def _line_ops(self, dim: int, free: Sequence[int], t: int, gather: bool
                  ) -> tuple[np.ndarray, ...]:
        """Rows (sender, receiver, route, block, last) of step ``t`` along ``dim`` on its cut
        lines: a line cut between coordinates ``a`` and ``a + 1`` runs from position 0 (at
        ``a + 1``) to ``m - 1`` (at ``a``), and every block of a line is reduced (gathered)
        by two chains that never cross the cut.

        Reduce-scatter: the partial sums of the positions before ``j`` move up to ``j``, the
        chain of block ``j`` leaving position 0 at step ``m - 1 - j``; those after ``j`` move
        down, leaving position ``m - 1`` at step ``j``: each link carries one block a step
        each way and both chains reach ``j`` in step ``m - 2`` (``last`` marks the downward
        one's arrival, which cannot add into the slot the upward one adds into in the same
        step). All-gather: block ``j`` leaves position ``j`` both ways at step 0."""
        g, m = self.grid, self.grid.dims[dim]
        cut = self.cuts[dim]
        on = np.flatnonzero(cut >= 0)
        pos = (g.coords[on, dim] - cut[on] - 1) % m
        rows = []
        for up in (True, False):
            if gather:
                j = pos - t if up else pos + t
                sends = (j >= 0) & (pos <= m - 2) if up else (j <= m - 1) & (pos >= 1)
            else:
                j = m - 1 + pos - t if up else t + pos - m + 1
                sends = pos <= t if up else pos >= m - 1 - t
            x, j = on[sends], j[sends]
            last = np.zeros(len(x), dtype=bool) if gather or up else j == pos[sends] - 1
            rows.append(self._line_rows(dim, free, x, (j + cut[x] + 1) % m, 1 if up else -1,
                                        last))
        return tuple(np.concatenate(col) for col in zip(*rows, strict=True))

    def _line_rows(self, dim: int, free: Sequence[int], x: np.ndarray, target: np.ndarray,
                   direction: int, last: np.ndarray) -> tuple[np.ndarray, ...]:
        """Rows of members ``x`` sending, to their neighbour in ``direction``, the blocks
        whose coordinate along ``dim`` is ``target``, any on ``free``, ``x``'s elsewhere."""
        g = self.grid
        combos = self._combos(free)
        k = len(combos)
        xs = np.repeat(x, k)
        y = g.coords[xs].copy()
        y[:, dim] = np.repeat(target, k)
        if len(free):
            y[:, list(free)] = np.tile(combos, (len(x), 1))
        block = g.members[tuple(y.T)]
        return (xs, g.neighbour(dim, direction)[xs], self.route(dim, direction)[xs], block,
                np.repeat(last, k))

    def _combos(self, dims: Sequence[int]) -> np.ndarray:
        """Every coordinate combination over ``dims``: ``(count, len(dims))``."""
        sizes = [self.grid.dims[d] for d in dims]
        if not sizes:
            return np.zeros((1, 0), dtype=np.int64)
        return np.stack(np.unravel_index(np.arange(int(np.prod(sizes))), sizes), axis=1)

    def _block_ops(self, dim: int, direction: int, free: Sequence[int],
                   shift: int) -> tuple[np.ndarray, ...]:
        """Rows (sender, receiver, route, block) of one ring step along ``dim``.

        Every member ``x`` sends to its neighbour the blocks ``y`` with ``y[dim] = x[dim] +
        shift``, any value on the ``free`` dimensions and ``y = x`` on the others.
        """
        g = self.grid
        combos = self._combos(free)
        x = np.repeat(np.arange(g.n), len(combos))
        y = g.coords[x].copy()
        y[:, dim] = (y[:, dim] + shift) % g.dims[dim]
        if len(free):
            y[:, list(free)] = np.tile(combos, (g.n, 1))
        block = g.members[tuple(y.T)]
        dst = g.neighbour(dim, direction)[x]
        return x, dst, self.route(dim, direction)[x], block

    def reduce_scatter(self, first_step: int) -> list[int]:
        """Reduce ``SCRATCH`` chunk ``y*P + p`` of every rank into rank ``y``; returns, per
        piece, the step after its last op. The accumulator must hold the inputs already."""
        g, P, ends = self.grid, self.P, []
        side = g.n * P                  # where a cut line's downward chain lands (see below)
        for p, piece in enumerate(self.pieces):
            t0 = first_step + piece.delay
            for j, dim in enumerate(piece.order):
                m = g.dims[dim]
                done = piece.order[:j]
                free = [d for d in range(len(g.dims)) if d != dim and d not in done]
                for t in range(m - 1):
                    x, dst, route, block = self._whole(dim, self._block_ops(
                        dim, piece.direction, free, -(t + 1) * piece.direction))
                    self.b.add(step=t0 + t, src=x, dst=dst, route=route, kind=OpKind.REDUCE,
                               src_buf=Buf.SCRATCH, src_off=block * P + p,
                               dst_buf=Buf.SCRATCH, dst_off=block * P + p)
                    if dim not in self.cuts:
                        continue
                    x, dst, route, block, last = self._line_ops(dim, free, t, gather=False)
                    # the downward chain's arrival is copied aside, then added in a local step
                    self.b.add(step=t0 + t, src=x, dst=dst, route=route,
                               kind=np.where(last, OpKind.COPY, OpKind.REDUCE),
                               src_buf=Buf.SCRATCH, src_off=block * P + p, dst_buf=Buf.SCRATCH,
                               dst_off=block * P + p + np.where(last, side, 0))
                if dim in self.cuts:
                    _, x, _, block, last = self._line_ops(dim, free, m - 2, gather=False)
                    x, block = x[last], block[last]
                    self.b.add(step=t0 + m - 1, src=x, dst=x, kind=OpKind.REDUCE,
                               src_buf=Buf.SCRATCH, src_off=side + block * P + p,
                               dst_buf=Buf.SCRATCH, dst_off=block * P + p)
                t0 += self.phase_steps(dim)
            ends.append(t0)
        return ends

    def all_gather(self, first_steps: Sequence[int], own_buf: Buf,
                   own_off: Callable[[np.ndarray, int], np.ndarray]) -> list[int]:
        """Spread every rank's piece ``p`` (in ``own_buf`` at ``own_off(rank, p)``) into
        ``OUTPUT`` chunk ``rank*P + p`` of every rank, including its own (a local copy)."""
        g, P, ends = self.grid, self.P, []
        ranks = np.arange(g.n)
        for p, piece in enumerate(self.pieces):
            t0 = first_steps[p]
            self.b.add(step=t0, src=ranks, dst=ranks, src_buf=own_buf, src_off=own_off(ranks, p),
                       dst_buf=Buf.OUTPUT, dst_off=ranks * P + p)
            order = piece.order[::-1]
            for j, dim in enumerate(order):
                m = g.dims[dim]
                done = order[:j]
                for t in range(m - 1):
                    rows = [self._whole(dim, self._block_ops(dim, piece.direction, done,
                                                             -t * piece.direction))]
                    if dim in self.cuts:
                        rows.append(self._line_ops(dim, done, t, gather=True)[:4])
                    x, dst, route, block = (np.concatenate(c) for c in zip(*rows, strict=True))
                    own = block == x
                    self.b.add(step=t0 + t, src=x, dst=dst, route=route,
                               src_buf=np.where(own, own_buf, Buf.OUTPUT),
                               src_off=np.where(own, own_off(x, p), block * P + p),
                               dst_buf=Buf.OUTPUT, dst_off=block * P + p)
                t0 += m - 1
            ends.append(t0)
        return ends


def grid_schedule(coll: Collective, grid: Grid, pieces: Sequence[Piece], algorithm: str,
                  schedule: str = "-", params: tuple = (),
                  cuts: dict[int, np.ndarray] | None = None) -> Schedule:
    """The AllGather / ReduceScatter / AllReduce of ``coll`` over ``grid`` with ``pieces``.

    Chunk ``y*P + p`` of a block-structured buffer is piece ``p`` of block ``y``. Pieces that
    would be empty are dropped (tiny sizes), so there may be fewer than asked for. ``cuts``
    (see :func:`line_cuts`) runs the lines it names instead of their rings; a reduction then
    has a second accumulator's worth of scratch after the first, where a line's downward
    chains land.
    """
    n, count = coll.n, coll.count
    per_block = count // n if coll.kind is not CollectiveKind.ALLREDUCE else max(count // n, 1)
    P = max(1, min(len(pieces), per_block))
    pieces = list(pieces)[:P]
    scratch_copies = 2 if cuts else 1
    if coll.kind is CollectiveKind.ALLREDUCE:
        blocks = even_split(count, n * P)
        b = ScheduleBuilder(coll, input=blocks, output=blocks,
                            scratch=np.tile(blocks, scratch_copies))
    else:
        piece_sizes = even_split(count // n, P)
        blocks = np.tile(piece_sizes, n)
        if coll.kind is CollectiveKind.ALLGATHER:
            b = ScheduleBuilder(coll, input=piece_sizes, output=blocks)
        else:
            b = ScheduleBuilder(coll, input=blocks, output=piece_sizes,
                                scratch=np.tile(blocks, scratch_copies))
    eng = _Engine(b, grid, pieces, cuts)
    ranks = np.arange(n)
    if coll.kind is CollectiveKind.ALLGATHER:
        eng.all_gather([piece.delay for piece in pieces], Buf.INPUT,
                       lambda r, p: np.full(len(r), p))
        return b.build(algorithm, schedule, params)
    # the accumulator starts as a copy of every rank's input
    b.add(step=0, src=ranks, dst=ranks, src_buf=Buf.INPUT, src_off=0, dst_buf=Buf.SCRATCH,
          dst_off=0, count=n * P)
    ends = eng.reduce_scatter(1)
    if coll.kind is CollectiveKind.REDUCESCATTER:
        for p in range(P):
            b.add(step=ends[p], src=ranks, dst=ranks, src_buf=Buf.SCRATCH, src_off=ranks * P + p,
                  dst_buf=Buf.OUTPUT, dst_off=p)
        return b.build(algorithm, schedule, params)
    eng.all_gather(ends, Buf.SCRATCH, lambda r, p: r * P + p)
    return b.build(algorithm, schedule, params)


def grid_pieces(coll: Collective, asked: int) -> int:
    """The pieces :func:`grid_schedule` keeps of ``asked``: at most one per element of a
    rank's block."""
    n, count = coll.n, coll.count
    per_block = count // n if coll.kind is not CollectiveKind.ALLREDUCE else max(count // n, 1)
    return max(1, min(asked, per_block))


def grid_ops(coll: Collective, asked: int) -> int:
    """The ops of :func:`grid_schedule` with ``asked`` pieces, before relay lowering: per
    piece, every rank's block reaches every rank (a local copy and ``n (n - 1)`` forwards, or
    ``n (n - 1)`` partial sums); a reduction adds every rank's copy of its input into the
    accumulator and, for reducescatter, one copy per piece into the output."""
    n, P = coll.n, grid_pieces(coll, asked)
    if coll.kind is CollectiveKind.ALLGATHER:
        return P * n * n
    reduce_scatter = P * n * (n - 1) + n
    if coll.kind is CollectiveKind.REDUCESCATTER:
        return reduce_scatter + P * n
    return reduce_scatter + P * n * n


def grid_slots(coll: Collective, asked: int) -> int:
    """One rank's chunk slots in :func:`grid_schedule` with ``asked`` pieces: a piece of every
    rank's block in each buffer that holds blocks, one per piece in the others."""
    n, P = coll.n, grid_pieces(coll, asked)
    if coll.kind is CollectiveKind.ALLGATHER:
        return P + P * n
    if coll.kind is CollectiveKind.REDUCESCATTER:
        return 2 * P * n + P
    return 3 * P * n


# ----------------------------------------------------------------------------------------------
# entries


def _common_reason(coll: Collective, name: str, params: dict) -> str | None:
    if coll.kind not in KINDS:
        return f"{name} does not serve {coll.kind.value}"
    if params:
        return f"{name} takes no parameters (got {', '.join(sorted(params))})"
    if coll.n < 2:
        return f"{name} needs at least 2 ranks"
    return None


def _ring_members(coll: Collective) -> np.ndarray:
    """Group indices in ring order: a snake through a whole torus, group order elsewhere.

    When faults break the snake (a hop that is not a healthy link each way), a ring through
    the healthy links is searched for instead (:func:`_hamiltonian_order`); the snake stays
    when none is found within the search budget.
    """
    topo = coll.topology
    if topo.dims is not None and set(coll.group) == set(topo.live_ranks()):
        gi = group_index(coll)
        order = gi[snake_order(topo.dims)]
        order = order[order >= 0]
        ranks = [coll.group[i] for i in order.tolist()]
        if not all(_duplex(topo, u, v) for u, v in zip(ranks, ranks[1:] + ranks[:1], strict=True)):
            found = _hamiltonian_order(topo, ranks)
            if found is not None:
                return gi[np.asarray(found)]
        return order
    return np.arange(coll.n, dtype=np.int64)


def _duplex(topo, u: int, v: int) -> bool:
    """A healthy link each way between ``u`` and ``v``."""
    a, b = topo.link_id(u, v), topo.link_id(v, u)
    return a is not None and b is not None and not topo.link_failed[a] \
        and not topo.link_failed[b]


#: DFS expansions spent looking for a ring through the healthy links
_HAMILTON_BUDGET = 50_000


def _hamiltonian_order(topo, ranks: list[int]) -> list[int] | None:
    """A ring order of ``ranks`` whose hops are healthy links both ways, or failing that a path
    whose only long hop is the closing one; ``None`` if the budget runs out first.

    Depth-first search, fewest onward neighbours first (Warnsdorff's rule). A torus minus one
    rank has an odd number of ranks on a bipartite graph, so no ring exists there and the best
    is a path (its closing hop takes a short detour).
    """
    members = set(ranks)
    adj = {u: [v for v in topo.healthy_graph().successors(u)
               if v in members and _duplex(topo, u, v)]
           for u in ranks}
    start = ranks[0]
    path, seen = [start], {start}
    stack = [iter(sorted(adj[start]))]
    best_path = None
    budget = _HAMILTON_BUDGET
    while stack and budget:
        budget -= 1
        nxt = next(stack[-1], None)
        if nxt is None:
            stack.pop()
            seen.discard(path.pop())
            continue
        if nxt in seen:
            continue
        path.append(nxt)
        seen.add(nxt)
        if len(path) == len(ranks):
            if start in adj[nxt]:
                return list(path)
            if best_path is None:
                best_path = list(path)
            seen.discard(path.pop())
            continue
        onward = [w for w in adj[nxt] if w not in seen]
        stack.append(iter(sorted(onward, key=lambda w: sum(x not in seen for x in adj[w]))))
    return best_path


def _biring_applicable(coll: Collective, **params) -> str | None:
    return _common_reason(coll, "biring", params)


def _biring(coll: Collective, **params) -> Schedule:
    grid = Grid(_ring_members(coll))
    return grid_schedule(coll, grid, [Piece(1, (0,)), Piece(-1, (0,))], "biring")


def _biring_sends(coll: Collective, **params) -> tuple[Sends, ...]:
    """Each of the ring's ``n - 1`` steps (``2 (n - 1)`` for allreduce) sends one piece of a
    block to each neighbour: at least the smallest piece (:func:`grid_schedule`)."""
    n = coll.n
    if n < 2:
        return ()
    ring = _ring_members(coll)
    pieces = grid_pieces(coll, 2)
    if coll.kind is CollectiveKind.ALLREDUCE:
        smallest, steps = even_split(coll.count, n * pieces).min(), 2 * (n - 1)
    else:
        smallest, steps = even_split(coll.count // n, pieces).min(), n - 1
    nbytes = int(smallest) * coll.dtype.itemsize
    out = [sends(ring, np.roll(ring, -1), nbytes, steps)]
    if pieces > 1:
        out.append(sends(ring, np.roll(ring, 1), nbytes, steps, joins_previous=True))
    return tuple(out)


def _not_a_ring(coll: Collective) -> str | None:
    """Why consecutive group members (and the last and first) are not linked, if they are not."""
    topo = coll.topology
    g = coll.group
    for i in range(coll.n):
        u, v = g[i], g[(i + 1) % coll.n]
        if topo.link_id(u, v) is None or topo.link_id(v, u) is None:
            return (f"the group is not a physical ring: {topo.vertex_names[u]} and "
                    f"{topo.vertex_names[v]} (consecutive in the group) are not linked")
    return None


def folded_order(n: int, broken: int) -> np.ndarray:
    """Group indices of the folded logical ring of a ring whose link ``broken -- broken+1`` failed.

    The line runs ``broken+1, ..., broken``; the logical ring takes its even positions up and its
    odd positions down: ``L0, L2, L4, ..., L5, L3, L1``.
    """
    line = (np.arange(n) + broken + 1) % n
    up = line[0::2]
    down = line[1::2][::-1]
    return np.concatenate([up, down])


def _failed_ring_hop(coll: Collective) -> tuple[int | None, str | None]:
    """Position ``i`` of the one failed ring link ``i -- i+1`` (either direction), or why not."""
    if coll.n < 3:
        return None, "foldedring needs a ring of at least 3 ranks"
    why = _not_a_ring(coll)
    if why:
        return None, why
    topo = coll.topology
    g = coll.group
    bad = [i for i in range(coll.n)
           if topo.link_failed[topo.link_id(g[i], g[(i + 1) % coll.n])]
           or topo.link_failed[topo.link_id(g[(i + 1) % coll.n], g[i])]]
    if len(bad) != 1:
        return None, (f"foldedring serves a ring with exactly one failed link; this ring has "
                      f"{len(bad)}" + ("" if bad else " (use biring)"))
    return bad[0], None


def _foldedring_applicable(coll: Collective, **params) -> str | None:
    why = _common_reason(coll, "foldedring", params)
    if why:
        return why
    return _failed_ring_hop(coll)[1]


def _foldedring(coll: Collective, **params) -> Schedule:
    broken, why = _failed_ring_hop(coll)
    if why or broken is None:
        raise CollectiveError(f"foldedring cannot serve collective '{coll.name}': {why}")
    n = coll.n
    topo = coll.topology
    g = coll.group
    pos = (np.arange(n) - broken - 1) % n  # line position of each group index

    def hop_path(u: int, v: int) -> list[int]:
        # walk the line from u to v (never across the failed link)
        a, c = int(pos[u]), int(pos[v])
        step = 1 if c > a else -1
        line = (np.arange(n) + broken + 1) % n
        return [topo.link_between(g[line[k]], g[line[k + step]]) for k in range(a, c, step)]

    grid = Grid(folded_order(n, broken), hop_path)
    return grid_schedule(coll, grid, [Piece(1, (0,))], "foldedring")


def _torus_dims(coll: Collective) -> tuple[list[int], str | None]:
    topo = coll.topology
    if topo.dims is None:
        return [], f"ring+dimrotation needs a torus; '{topo.name}' is a {topo.kind_name}"
    if topo.failed_ranks:
        return [], f"ring+dimrotation needs every rank of the {topo.kind_name} alive"
    if tuple(coll.group) != topo.all_ranks():
        return [], (f"ring+dimrotation needs the group to be the whole {topo.kind_name} in rank "
                    "order")
    big = [d for d, m in enumerate(topo.dims) if m > 1]
    if len(big) < 2:
        return [], ("ring+dimrotation needs at least two dimensions of size > 1 "
                    "(use biring on a single ring)")
    return big, None


def line_cuts(coll: Collective, dims: Sequence[int]) -> tuple[dict[int, np.ndarray], str | None]:
    """The rings of a torus (the whole torus in rank order) that a failed or missing link
    cuts: for every dimension of ``dims`` with such a ring, per rank the coordinate ``a`` of
    its ring's cut ``a -- a+1`` (the link failed either way, or a mesh's missing wrap), -1
    where its ring is whole; or why they cannot run as lines (a ring cut twice)."""
    topo = coll.topology
    shape = topo.grid_dims
    coords = np.stack(np.unravel_index(np.arange(coll.n), shape), axis=1)
    cuts: dict[int, np.ndarray] = {}
    for d in dims:
        m = shape[d]
        ahead = coords.copy()
        ahead[:, d] = (ahead[:, d] + 1) % m
        nxt: list[int] = np.ravel_multi_index(tuple(ahead.T), shape).tolist()
        broken = np.array([not _duplex(topo, u, v) for u, v in enumerate(nxt)], dtype=bool)
        if not broken.any():
            continue
        line = coords.copy()
        line[:, d] = 0
        line_id = np.asarray(np.ravel_multi_index(tuple(line.T), shape), dtype=np.int64)
        cuts_on = np.bincount(line_id[broken], minlength=coll.n)
        if cuts_on.max() > 1:
            r = int(np.flatnonzero(broken & (cuts_on[line_id] > 1))[0])
            where = f"the ring along dimension {d} through {topo.vertex_names[r]}"
            if m == 2:              # both hops of a ring of two are its one cable
                return {}, (f"{where} is two ranks whose one cable failed; ring+dimrotation "
                            "runs a ring cut once as a line, and this one falls apart")
            return {}, (f"{where} is cut {int(cuts_on[line_id[r]])} times (failed or missing "
                        "links); ring+dimrotation runs a ring cut once as a line, not one cut "
                        "twice")
        cut_of_line = np.full(coll.n, -1, dtype=np.int64)
        cut_of_line[line_id[broken]] = coords[broken, d]
        cuts[d] = cut_of_line[line_id]
    return cuts, None


def dimrot_plan(coll: Collective) -> tuple[list[Piece], dict[int, np.ndarray], str | None]:
    """The pieces of ring+dimrotation and its cut lines (:func:`line_cuts`), or why none.

    Piece ``c`` visits the dimensions from ``c`` on (rotated), one per direction. On a line
    each piece sends both ways (a ring's piece one way), so a link of a cut dimension
    carries twice a ring's bytes per piece: where some dimensions are cut and others are
    not, the rotations that start on a whole dimension get two pieces per direction, those
    that start on a cut one, one, and their first (longest) phases take alike long; after
    its first, a rotation visits the whole dimensions before the cut ones, where its data
    is smallest, and its two directions take the cut ones in opposite orders, so that no
    cut dimension takes both at once."""
    big, why = _torus_dims(coll)
    if why:
        return [], {}, why
    cuts, why = line_cuts(coll, big)
    if why:
        return [], {}, why
    D = len(big)
    pieces = []
    for c in range(D):
        rest = [big[(c + k) % D] for k in range(1, D)]
        whole = tuple(d for d in rest if d not in cuts)
        cut = tuple(d for d in rest if d in cuts)
        weight = 2 if cuts and big[c] not in cuts else 1
        pieces += [Piece(direction, (big[c], *whole, *cut[::direction]))
                   for _ in range(weight) for direction in (1, -1)]
    return pieces, cuts, None


def _dimrot_applicable(coll: Collective, **params) -> str | None:
    why = _common_reason(coll, "ring+dimrotation", params)
    return why or dimrot_plan(coll)[2]


def _dimrot(coll: Collective, **params) -> Schedule:
    pieces, cuts, _ = dimrot_plan(coll)
    grid = Grid(np.arange(coll.n).reshape(coll.topology.grid_dims))
    return grid_schedule(coll, grid, pieces, "ring", "dimrotation", cuts=cuts)


def _dimrot_ops(coll: Collective, **params) -> int:
    """:func:`grid_ops` of its pieces, and, in each reduce-scatter phase along a cut line,
    one local addition per block at every rank of the line but its first (where the
    downward chain arrives)."""
    pieces, cuts, _ = dimrot_plan(coll)
    pieces = pieces[:grid_pieces(coll, len(pieces))]
    ops = grid_ops(coll, len(pieces))
    if coll.kind is CollectiveKind.ALLGATHER:
        return ops
    dims = coll.topology.grid_dims
    for piece in pieces:
        for j, dim in enumerate(piece.order):
            if dim in cuts:
                lines = int((cuts[dim] >= 0).sum()) // dims[dim]
                blocks = math.prod(dims[d] for d in piece.order[j + 1:])
                ops += lines * (dims[dim] - 1) * blocks
    return ops


def _dimrot_slots(coll: Collective, **params) -> int:
    """:func:`grid_slots` of its pieces, and a second accumulator in a reduction with cuts."""
    pieces, cuts, _ = dimrot_plan(coll)
    P = grid_pieces(coll, len(pieces))
    extra = P * coll.n if cuts and coll.kind is not CollectiveKind.ALLGATHER else 0
    return grid_slots(coll, len(pieces)) + extra


#: these entries' load bound: none (no traffic rule)
_NO_RULE = NoBound("no traffic rule: "
                   "the torus rings' link loads are not derived before building, so "
                   "they are always built")

register(Algorithm(
    name="biring", collectives=KINDS, applicable=_biring_applicable, build=_biring,
    ops=lambda coll, **params: grid_ops(coll, 2), load=_NO_RULE, sends=_biring_sends,
    slots=lambda coll, **params: grid_slots(coll, 2), exact_ops=True,
    description="ring in both directions, half the data each way (allreduce = "
                "reduce-scatter + all-gather)"))
register(Algorithm(
    name="foldedring", collectives=KINDS, applicable=_foldedring_applicable, build=_foldedring,
    ops=lambda coll, **params: grid_ops(coll, 1), load=_NO_RULE,
    slots=lambda coll, **params: grid_slots(coll, 1), exact_ops=True,
    description="logical ring folded over a ring with one failed link (evens up, odds down)"))
register(Algorithm(
    name="ring+dimrotation", collectives=KINDS, applicable=_dimrot_applicable, build=_dimrot,
    ops=_dimrot_ops, load=_NO_RULE, slots=_dimrot_slots, exact_ops=True,
    description="two-direction rings dimension by dimension; 2D pieces with rotated "
                "dimension orders keep every dimension busy; a ring cut by a failed link "
                "runs as a line"))


# ----------------------------------------------------------------------------------------------
# Swing (latency-optimal AllReduce on tori)


def swing_distance(step: int) -> int:
    """Swing's signed peer offset ``rho(s) = sum_{i<=s} (-2)^i``: 1, -1, 3, -5, 11, ..."""
    return sum((-2) ** i for i in range(step + 1))


def _swing_dims(coll: Collective) -> tuple[list[int], str | None]:
    topo = coll.topology
    if topo.dims is not None and tuple(coll.group) == topo.all_ranks() and not topo.failed_ranks:
        dims = [d for d, m in enumerate(topo.dims) if m > 1]
        bad = [topo.dims[d] for d in dims if topo.dims[d] & (topo.dims[d] - 1)]
        if bad:
            return [], (f"swing needs every dimension to be a power of two; this "
                        f"{topo.kind_name} is {'x'.join(map(str, topo.dims))}")
        return dims, None
    if coll.n & (coll.n - 1):
        return [], (f"swing needs a power-of-two group (or a whole torus or mesh of such); this "
                    f"has {coll.n}")
    return [], None


def _swing_applicable(coll: Collective, **params) -> str | None:
    if coll.kind is not CollectiveKind.ALLREDUCE:
        return f"swing serves allreduce, not {coll.kind.value}"
    if params:
        return f"swing takes no parameters (got {', '.join(sorted(params))})"
    if coll.n < 2:
        return "swing needs at least 2 ranks"
    return _swing_dims(coll)[1]


def _swing_peers(coll: Collective) -> list[np.ndarray]:
    """Every member's peer in each of Swing's steps, in order: per dimension, ``log2 d``
    steps in which rank ``r`` exchanges with ``r + rho(s)`` (even ``r``) or ``r - rho(s)``
    (odd ``r``) along the dimension's ring."""
    dims, _ = _swing_dims(coll)
    if dims:
        grid = Grid(np.arange(coll.n).reshape(coll.topology.grid_dims))
    else:
        grid = Grid(_ring_members(coll))
        dims = [0]
    peers = []
    for dim in dims:
        m = grid.dims[dim]
        pos = grid.coords[:, dim]
        for s in range(m.bit_length() - 1):
            rho = swing_distance(s)
            c = grid.coords.copy()
            c[:, dim] = (pos + np.where(pos % 2 == 0, rho, -rho)) % m
            peers.append(grid.members[tuple(c.T)])
    return peers


def _swing(coll: Collective, **params) -> Schedule:
    """Latency-optimal Swing: in each step (:func:`_swing_peers`) every rank sends its whole
    partial vector to its peer and adds what it receives. The peers' sets of contributions are
    disjoint at every step, so after all steps every rank holds the full sum. A whole torus
    runs the dimensions one after another (an allreduce along each dimension in turn is an
    allreduce)."""
    b = ScheduleBuilder(coll, input=[coll.count], output=[coll.count])
    ranks = np.arange(coll.n)
    b.add(step=0, src=ranks, dst=ranks, src_buf=Buf.INPUT, src_off=0, dst_buf=Buf.OUTPUT,
          dst_off=0)
    for step, peer in enumerate(_swing_peers(coll), start=1):
        b.add(step=step, src=ranks, dst=peer, route=add_pair_routes(b, coll, ranks, peer),
              kind=OpKind.REDUCE, src_buf=Buf.OUTPUT, src_off=0, dst_buf=Buf.OUTPUT,
              dst_off=0)
    return b.build("swing")


def _swing_sends(coll: Collective, **params) -> tuple[Sends, ...]:
    """The whole vector from every rank to its peer, one step per peer."""
    ranks = np.arange(coll.n)
    whole = coll.count * coll.dtype.itemsize
    return tuple(sends(ranks, peer, whole) for peer in _swing_peers(coll))


register(Algorithm(
    name="swing", collectives=frozenset({CollectiveKind.ALLREDUCE}),
    applicable=_swing_applicable, build=_swing, ops=every_rank_ops, load=_NO_RULE,
    sends=_swing_sends,
    description="Swing: log2 steps per dimension with peers 1, 1, 3, 5, 11, ... away "
                "(whole vector per step; latency-optimal on tori)"))
