"""Per-ring AllToAll algorithms on one torus dimension: Ring, HalfRing, FoldedRing, Line.

A ring algorithm is a :class:`RingPlan`: the *journeys* of the blocks of one ring of ``n``
positions. Position ``x`` holds one block for every position ``c`` (the data ring member ``x``
sends to ``c``); the journey of block ``(x, c)`` is a list of *segments*, each of which moves the
whole block from one ring member to another at a given *stage* (relative step) over a *path*.
Between segments the block waits in the intermediate member's scratch (store and forward); the
last segment delivers it to ``c``. The plan knows nothing about buffers or which torus dimension
it runs on: :mod:`cclc.algorithms.torus_alltoall.lowering` instantiates it on every ring of a
dimension, with aggregated blocks (all the data a member holds for one coordinate of the dimension).

A path is a tuple of moves ``(axis, direction)``: axis ``RING`` (-1) is the ring's own
dimension, any other axis a torus dimension (MATE's detours leave the ring); direction 0 is +,
1 is -. Ring algorithms only move one hop of the ring per segment; FoldedRing's logical edges
are two hops and MATE's detours three, each one op over a route of that many links (cut-through,
as the simulator charges routes).

Plans per ring of ``n`` (block = ``S/n`` bytes of a rank's ``S``):

* :func:`ring_plan` -- unidirectional store-and-forward ring; ``n - 1`` stages, stage ``k``
  forwards ``n - 1 - k`` blocks over every link. The two-direction baseline runs one plan per
  direction on half the data each: ``(n-1) S/4`` per link direction.
* :func:`halfring_plan` -- every block the short way; for even ``n`` the antipodal block goes
  the way ``antipode`` says (the caller runs two lanes of half the data, one each way):
  ``(n^2-1) S/(8n)`` per link direction for odd ``n``, ``n S/8`` for even ``n``.
* :func:`line_plan` -- shortest paths on a line (a mesh dimension, or a ring broken at a failed
  link); journeys are delayed greedily so that no link carries more than one block per stage,
  which keeps the middle link (the bottleneck, ``floor(n/2) ceil(n/2)`` blocks) busy.
* :func:`folded_plan` -- FoldedRing on a ring with one failed link: the logical ring visits
  the even positions of the line going up and the odd ones coming down (reference section 1.3,
  the "classic folded embedding"); every logical edge is one or two physical hops and every
  surviving directed link carries exactly one logical edge, so a unidirectional ring on it puts
  ``n (n-1)/2`` blocks = ``(n-1) S/2`` on every surviving link.
* :func:`detour_plan` -- HalfRing over a *virtual* copy of the ring whose every hop ``u -> v``
  is the 3-link detour ``u -> u+s e_j -> v+s e_j -> v`` through the parallel ring one step
  away in torus dimension ``j`` (MATE's acceleration stage).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = [
    "MINUS",
    "PLUS",
    "RING",
    "RingPlan",
    "detour_plan",
    "folded_order",
    "folded_plan",
    "halfring_plan",
    "line_plan",
    "per_link_blocks",
    "ring_plan",
]

#: axis of a move along the ring's own dimension
RING = -1

PLUS, MINUS = 0, 1

Move = tuple[int, int]


@dataclass(frozen=True, eq=False)
class RingPlan:
    """Segments of every journey on one ring (arrays of equal length, one row per segment).

    ``origin``/``dest``: the block's ring positions; ``stage``: relative step of the segment;
    ``hop``: index of the segment within its journey; ``src``/``dst``: positions the segment
    moves between; ``path``: index into ``paths`` (moves from ``src``); ``final``: the segment
    delivers to ``dest``. ``name`` says what the plan is, for messages and docs.
    """

    name: str
    n: int
    origin: np.ndarray
    dest: np.ndarray
    stage: np.ndarray
    hop: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    path: np.ndarray
    final: np.ndarray
    paths: tuple[tuple[Move, ...], ...]

    @property
    def n_stages(self) -> int:
        return int(self.stage.max()) + 1 if len(self.stage) else 0

    @property
    def max_hops(self) -> int:
        """Segments of the longest journey."""
        return int(self.hop.max()) + 1 if len(self.hop) else 0


class _Journeys:
    """Collects segments while a plan is built (plans are tiny: O(n^2) segments)."""

    def __init__(self, name: str, n: int):
        self.name = name
        self.n = n
        self.rows: list[tuple[int, int, int, int, int, int, int, bool]] = []
        self.path_ids: dict[tuple[Move, ...], int] = {}

    def segment(self, origin: int, dest: int, stage: int, hop: int, src: int, dst: int,
                path: tuple[Move, ...], final: bool) -> None:
        pid = self.path_ids.setdefault(path, len(self.path_ids))
        self.rows.append((origin, dest, stage, hop, src, dst, pid, final))

    def walk(self, origin: int, dest: int, start: int,
             moves: list[tuple[int, int, tuple[Move, ...]]]) -> None:
        """One journey: ``moves`` = [(src, dst, path), ...], one stage after another."""
        for k, (a, b, path) in enumerate(moves):
            self.segment(origin, dest, start + k, k, a, b, path, k == len(moves) - 1)

    def plan(self) -> RingPlan:
        a = np.array(self.rows, dtype=np.int64).reshape(-1, 8)
        paths = tuple(p for p, _ in sorted(self.path_ids.items(), key=lambda kv: kv[1]))
        return RingPlan(name=self.name, n=self.n, origin=a[:, 0], dest=a[:, 1], stage=a[:, 2],
                        hop=a[:, 3], src=a[:, 4], dst=a[:, 5], path=a[:, 6],
                        final=a[:, 7].astype(bool), paths=paths)


def _hops(n: int, x: int, dist: int, direction: int) -> list[tuple[int, int, tuple[Move, ...]]]:
    """``dist`` single-link hops around the ring from ``x`` in ``direction``."""
    step = 1 if direction == PLUS else -1
    return [((x + k * step) % n, (x + (k + 1) * step) % n, ((RING, direction),))
            for k in range(dist)]


def ring_plan(n: int, direction: int = PLUS) -> RingPlan:
    """Unidirectional store-and-forward ring all-to-all (every block goes ``direction``)."""
    j = _Journeys(f"ring({'+' if direction == PLUS else '-'})", n)
    for x in range(n):
        for c in range(n):
            if c != x:
                dist = (c - x) % n if direction == PLUS else (x - c) % n
                j.walk(x, c, 0, _hops(n, x, dist, direction))
    return j.plan()


def halfring_plan(n: int, antipode: int = PLUS) -> RingPlan:
    """Shortest direction per block; the antipode of an even ring goes ``antipode``."""
    j = _Journeys("halfring", n)
    for x in range(n):
        for c in range(n):
            if c == x:
                continue
            fwd = (c - x) % n
            if 2 * fwd < n or (2 * fwd == n and antipode == PLUS):
                j.walk(x, c, 0, _hops(n, x, fwd, PLUS))
            else:
                j.walk(x, c, 0, _hops(n, x, n - fwd, MINUS))
    return j.plan()


def _line_positions(n: int, cut: int | None) -> list[int]:
    """Ring positions in line order; the line starts right after the cut edge ``cut -> cut+1``.

    ``cut=None``: a mesh dimension, the line is ``0 .. n-1``.
    """
    first = 0 if cut is None else (cut + 1) % n
    return [(first + q) % n for q in range(n)]


def line_plan(n: int, cut: int | None = None) -> RingPlan:
    """Shortest paths on the line that remains when edge ``cut -- cut+1`` is missing.

    Journeys start at the earliest stage at which none of their hops meets another block on the
    same link in the same stage (longest journeys first), so every link carries at most one block
    per stage and the middle links stay busy.
    """
    pos = _line_positions(n, cut)
    j = _Journeys("line", n)
    busy: set[tuple[int, int, int]] = set()   # (stage, line position, direction)
    blocks = [(a, b) for a in range(n) for b in range(n) if a != b]
    blocks.sort(key=lambda ab: (-abs(ab[1] - ab[0]), ab[0], ab[1]))
    for a, b in blocks:
        direction = PLUS if b > a else MINUS
        step = 1 if direction == PLUS else -1
        line_hops = [a + k * step for k in range(abs(b - a))]
        start = 0
        while any((start + k, q, direction) in busy for k, q in enumerate(line_hops)):
            start += 1
        for k, q in enumerate(line_hops):
            busy.add((start + k, q, direction))
        moves: list[tuple[int, int, tuple[Move, ...]]] = [
            (pos[q], pos[q + step], ((RING, direction),)) for q in line_hops]
        j.walk(pos[a], pos[b], start, moves)
    return j.plan()


def folded_order(n: int) -> list[int]:
    """Line indices in FoldedRing's logical-ring order: evens going up, then odds coming down.

    >>> folded_order(5), folded_order(6)
    ([0, 2, 4, 3, 1], [0, 2, 4, 5, 3, 1])
    """
    return list(range(0, n, 2)) + list(range(n - 1 if n % 2 == 0 else n - 2, 0, -2))


def folded_plan(n: int, cut: int) -> RingPlan:
    """FoldedRing on a ring whose edge ``cut -- cut+1`` failed (see the module docstring)."""
    pos = _line_positions(n, cut)
    order = folded_order(n)
    # logical edge i: order[i] -> order[i+1] as physical moves along the line
    edges = []
    for i in range(n):
        a, b = order[i], order[(i + 1) % n]
        direction = PLUS if b > a else MINUS
        edges.append((pos[a], pos[b], tuple((RING, direction) for _ in range(abs(b - a)))))
    j = _Journeys("foldedring", n)
    for la in range(n):
        for dist in range(1, n):
            lb = (la + dist) % n
            j.walk(pos[order[la]], pos[order[lb]], 0,
                   [edges[(la + k) % n] for k in range(dist)])
    return j.plan()


def detour_plan(n: int, axis: int, sign: int, antipode: int = PLUS, start: int = 0) -> RingPlan:
    """HalfRing over the virtual ring of 3-link detours through the ring ``sign`` (0: +, 1: -)
    one step away in torus dimension ``axis`` (MATE's acceleration stage)."""
    base = halfring_plan(n, antipode)
    back = 1 - sign
    paths = tuple(((axis, sign),) + p + ((axis, back),) for p in base.paths)
    return RingPlan(name=f"detour(dim {axis}{'+' if sign == PLUS else '-'})", n=n,
                    origin=base.origin, dest=base.dest, stage=base.stage + start, hop=base.hop,
                    src=base.src, dst=base.dst, path=base.path, final=base.final, paths=paths)


def per_link_blocks(plan: RingPlan) -> dict[tuple[int, int], float]:
    """Blocks each ring link ``(position, direction)`` carries over the whole plan (moves on
    other axes are left out): the closed forms of the module docstring, checked by the tests."""
    out: dict[tuple[int, int], float] = {}
    for src, pid in zip(plan.src.tolist(), plan.path.tolist(), strict=True):
        p = src
        for axis, direction in plan.paths[pid]:
            if axis != RING:
                continue
            key = (p, direction)
            out[key] = out.get(key, 0.0) + 1.0
            p = (p + (1 if direction == PLUS else -1)) % plan.n
    return out
