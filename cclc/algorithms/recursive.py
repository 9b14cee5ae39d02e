"""Recursive doubling and halving: ``log2`` rounds of pairwise exchanges at distances 1, 2, 4, ...

For a group of ``n`` ranks, ``p = 2^floor(log2 n)`` ranks take part in the rounds; each of the
``n - p`` *extra* ranks ``p + i`` is folded onto rank ``i`` before the rounds (its data is sent
to, or reduced into, rank ``i``) and served by it afterwards. Every round pairs rank ``v`` with
``v xor mask``.

``recursive_doubling``
    AllGather: round ``k`` exchanges everything gathered so far (``2^k`` blocks) with the rank at
    distance ``2^k``. AllReduce: every round exchanges and reduces the *whole* vector, so
    ``log2 p`` rounds of ``S`` bytes each: the latency-optimal allreduce for small sizes.
``recursive_halving``
    ReduceScatter: round ``k`` sends the half of the still-shared block range that belongs to the
    partner's side (``S/2, S/4, ...``) and reduces what comes back.
``halving_doubling``
    AllReduce as recursive-halving ReduceScatter then recursive-doubling AllGather over ``p``
    blocks (Rabenseifner): ``2 log2 p`` rounds and ``2 (p-1)/p`` of the buffer per rank, the
    bandwidth-optimal amount.

Partners are a power of two apart in group order, so on a switch every round costs one hop; on
a ring or torus the far rounds travel far (use ``biring``/``ring+dimrotation`` there).
"""

from __future__ import annotations

import numpy as np

from cclc.algorithms import Algorithm, NoBound, every_rank_ops, register
from cclc.algorithms.common import add_pair_routes, even_split
from cclc.collective import Collective, CollectiveKind
from cclc.ir import Buf, OpKind, Schedule, ScheduleBuilder
from cclc.sends import Sends, sends

__all__ = ["fold_size"]


def fold_size(n: int) -> int:
    """The largest power of two ``<= n``: the ranks that take part in the rounds."""
    return 1 << (n.bit_length() - 1)


class _Ops:
    """Row lists for one step, flushed into the builder with one ``add`` per step."""

    def __init__(self, b: ScheduleBuilder):
        self.b = b
        self.rows: list[tuple] = []

    def add(self, src, dst, src_buf, src_off, dst_buf, dst_off, count, kind=OpKind.COPY):
        if count > 0:
            self.rows.append((src, dst, int(src_buf), src_off, int(dst_buf), dst_off, count,
                              int(kind)))

    def flush(self, step: int) -> None:
        if not self.rows:
            return
        a = np.array(self.rows, dtype=np.int64)
        self.b.add(step=step, src=a[:, 0], dst=a[:, 1],
                   route=add_pair_routes(self.b, self.b.collective, a[:, 0], a[:, 1]),
                   src_buf=a[:, 2], src_off=a[:, 3], dst_buf=a[:, 4], dst_off=a[:, 5],
                   count=a[:, 6], kind=a[:, 7])
        self.rows = []


def _ranges(lo: int, hi: int, p: int, n_blocks: int) -> list[tuple[int, int]]:
    """Chunk ranges ``(offset, count)`` of virtual blocks ``lo..hi-1`` and of their extras."""
    out = [(lo, hi - lo)]
    if lo + p < n_blocks:
        out.append((lo + p, min(hi + p, n_blocks) - (lo + p)))
    return out


def _doubling_gather(ops: _Ops, step: int, p: int, n_blocks: int, own_buf: Buf | None) -> int:
    """Recursive-doubling exchange of OUTPUT blocks among ranks ``0..p-1``; returns next step.

    Before round ``k`` rank ``v`` holds the blocks of virtual ranks ``v & ~(2^k - 1)`` ..
    ``+2^k`` (and their extras). ``own_buf`` names where round 0 reads rank ``v``'s own block
    when it is not yet in the output (else ``None``).
    """
    mask = 1
    while mask < p:
        for v in range(p):
            w = v ^ mask
            lo = v & ~(mask - 1)
            for off, cnt in _ranges(lo, lo + mask, p, n_blocks):
                if own_buf is not None and mask == 1 and off == v:
                    # the input holds only the own block; scratch is indexed like the output
                    ops.add(v, w, own_buf, 0 if own_buf is Buf.INPUT else off, Buf.OUTPUT, off,
                            cnt)
                else:
                    ops.add(v, w, Buf.OUTPUT, off, Buf.OUTPUT, off, cnt)
        ops.flush(step)
        step += 1
        mask <<= 1
    return step


def _halving_reduce(ops: _Ops, step: int, p: int, n_blocks: int) -> int:
    """Recursive-halving reduction of SCRATCH blocks among ranks ``0..p-1``; returns next step.

    Afterwards rank ``v`` holds the sum of virtual block ``v`` (and of its extra) in scratch.
    """
    mask = p >> 1
    while mask:
        for v in range(p):
            w = v ^ mask
            lo = w & ~(mask - 1)
            for off, cnt in _ranges(lo, lo + mask, p, n_blocks):
                ops.add(v, w, Buf.SCRATCH, off, Buf.SCRATCH, off, cnt, OpKind.REDUCE)
        ops.flush(step)
        step += 1
        mask >>= 1
    return step


def _allgather(coll: Collective) -> Schedule:
    n, p = coll.n, fold_size(coll.n)
    per = coll.count // n
    b = ScheduleBuilder(coll, input=[per], output=[per] * n)
    ops = _Ops(b)
    for r in range(n):
        ops.add(r, r, Buf.INPUT, 0, Buf.OUTPUT, r, 1)
    for x in range(p, n):
        ops.add(x, x - p, Buf.INPUT, 0, Buf.OUTPUT, x, 1)
    ops.flush(0)
    # without extras round 0 can run in step 0, reading the own block from the input
    step = _doubling_gather(ops, 1 if n > p else 0, p, n, Buf.INPUT if n == p else None)
    for x in range(p, n):
        ops.add(x - p, x, Buf.OUTPUT, 0, Buf.OUTPUT, 0, x)
        ops.add(x - p, x, Buf.OUTPUT, x + 1, Buf.OUTPUT, x + 1, n - x - 1)
    ops.flush(step)
    return b.build("recursive_doubling")


def _reducescatter(coll: Collective) -> Schedule:
    n, p = coll.n, fold_size(coll.n)
    per = coll.count // n
    b = ScheduleBuilder(coll, input=[per] * n, output=[per], scratch=[per] * n)
    ops = _Ops(b)
    for r in range(n):
        ops.add(r, r, Buf.INPUT, 0, Buf.SCRATCH, 0, n)
    ops.flush(0)
    step = 1
    if n > p:
        for x in range(p, n):
            ops.add(x, x - p, Buf.SCRATCH, 0, Buf.SCRATCH, 0, n, OpKind.REDUCE)
        ops.flush(step)
        step += 1
    step = _halving_reduce(ops, step, p, n)
    for v in range(p):
        ops.add(v, v, Buf.SCRATCH, v, Buf.OUTPUT, 0, 1)
        if v + p < n:
            ops.add(v, v + p, Buf.SCRATCH, v + p, Buf.OUTPUT, 0, 1)
    ops.flush(step)
    return b.build("recursive_halving")


def _fold_in(ops: _Ops, step: int, n: int, p: int, buf: Buf, count: int) -> int:
    """Extras reduce their whole ``buf`` into their partner's; returns the next step."""
    if n > p:
        for x in range(p, n):
            ops.add(x, x - p, buf, 0, buf, 0, count, OpKind.REDUCE)
        ops.flush(step)
        step += 1
    return step


def _allreduce_doubling(coll: Collective) -> Schedule:
    n, p = coll.n, fold_size(coll.n)
    count = coll.count
    b = ScheduleBuilder(coll, input=[count], output=[count])
    ops = _Ops(b)
    for r in range(n):
        ops.add(r, r, Buf.INPUT, 0, Buf.OUTPUT, 0, 1)
    ops.flush(0)
    step = _fold_in(ops, 1, n, p, Buf.OUTPUT, 1)
    mask = 1
    while mask < p:
        for v in range(p):
            ops.add(v, v ^ mask, Buf.OUTPUT, 0, Buf.OUTPUT, 0, 1, OpKind.REDUCE)
        ops.flush(step)
        step += 1
        mask <<= 1
    for x in range(p, n):
        ops.add(x - p, x, Buf.OUTPUT, 0, Buf.OUTPUT, 0, 1)
    ops.flush(step)
    return b.build("recursive_doubling")


def _allreduce_halving_doubling(coll: Collective) -> Schedule:
    n, p = coll.n, fold_size(coll.n)
    blocks = even_split(coll.count, p)
    b = ScheduleBuilder(coll, input=blocks, output=blocks, scratch=blocks)
    ops = _Ops(b)
    for r in range(n):
        ops.add(r, r, Buf.INPUT, 0, Buf.SCRATCH, 0, p)
    ops.flush(0)
    step = _fold_in(ops, 1, n, p, Buf.SCRATCH, p)
    step = _halving_reduce(ops, step, p, p)
    step = _doubling_gather_from_scratch(ops, step, p)
    for x in range(p, n):
        ops.add(x - p, x, Buf.OUTPUT, 0, Buf.OUTPUT, 0, p)
    ops.flush(step)
    return b.build("halving_doubling")


def _doubling_gather_from_scratch(ops: _Ops, step: int, p: int) -> int:
    """After the halving, rank ``v`` has block ``v`` in scratch: gather every block into the
    outputs of ranks ``0..p-1`` (round 0 reads the own block from scratch)."""
    for v in range(p):
        ops.add(v, v, Buf.SCRATCH, v, Buf.OUTPUT, v, 1)
    if p == 1:
        ops.flush(step)
        return step + 1
    return _doubling_gather(ops, step, p, p, Buf.SCRATCH)


# ----------------------------------------------------------------------------------------------
# entries

_AG_AR = frozenset({CollectiveKind.ALLGATHER, CollectiveKind.ALLREDUCE})


def _reason(coll: Collective, name: str, kinds: frozenset, params: dict) -> str | None:
    if coll.kind not in kinds:
        return f"{name} does not serve {coll.kind.value}"
    if params:
        return f"{name} takes no parameters (got {', '.join(sorted(params))})"
    if coll.n < 2:
        return f"{name} needs at least 2 ranks"
    if coll.topology.dims is not None and coll.n > 8:
        # a power-of-two partner on a torus is many hops away and shares links with every
        # other pair: biring / ring+dimrotation are strictly better there
        return (f"{name} pairs ranks 2^k apart, which on a {coll.topology.kind_name} of "
                f"{coll.n} ranks routes over many shared links; use biring or ring+dimrotation")
    return None


def _rd_build(coll: Collective, **params) -> Schedule:
    if coll.kind is CollectiveKind.ALLGATHER:
        return _allgather(coll)
    return _allreduce_doubling(coll)


# -- what the rounds send, without building (the entries' ``sends`` rules) --------------------

def _round_blocks(v: np.ndarray, mask: int, p: int, n_blocks: int, toward_partner: bool
                  ) -> np.ndarray:
    """Blocks rank ``v`` sends in the round of ``mask``: the ``mask`` virtual blocks of its
    own half (gathering) or of its partner's (halving), and their extras (:func:`_ranges`)."""
    side = (v ^ mask) if toward_partner else v
    lo = side & ~(mask - 1)
    extra = np.where(lo + p < n_blocks, np.minimum(lo + mask + p, n_blocks) - (lo + p), 0)
    return mask + extra


def _fold_sends(n: int, p: int, nbytes: float, inward: bool) -> list[Sends]:
    """The step in which each extra rank ``p + i`` sends ``nbytes`` to rank ``i`` (inward) or
    receives them from it; none without extras."""
    if n == p:
        return []
    extras = np.arange(p, n)
    return [sends(extras, extras - p, nbytes) if inward else sends(extras - p, extras, nbytes)]


def _rounds(p: int, nbytes_of, masks) -> list[Sends]:
    v = np.arange(p)
    return [sends(v, v ^ mask, nbytes_of(v, mask)) for mask in masks]


def _doubling_masks(p: int) -> list[int]:
    return [1 << k for k in range(p.bit_length() - 1)]


def _rd_sends(coll: Collective, **params) -> tuple[Sends, ...]:
    """Recursive doubling: the extras' fold step, a round per power of two, the step that
    serves the extras (allgather: blocks; allreduce: the whole vector every step)."""
    n, p = coll.n, fold_size(coll.n)
    item = coll.dtype.itemsize
    if coll.kind is CollectiveKind.ALLREDUCE:
        whole = coll.count * item
        return tuple(_fold_sends(n, p, whole, True)
                     + _rounds(p, lambda v, mask: whole, _doubling_masks(p))
                     + _fold_sends(n, p, whole, False))
    block = (coll.count // n) * item
    return tuple(_fold_sends(n, p, block, True)
                 + _rounds(p, lambda v, mask: _round_blocks(v, mask, p, n, False) * block,
                           _doubling_masks(p))
                 + _fold_sends(n, p, (n - 1) * block, False))


def _rh_sends(coll: Collective, **params) -> tuple[Sends, ...]:
    """Recursive halving: the extras fold their ``n`` blocks in, a round per power of two
    (far first) with the partner's half, then each extra gets its block."""
    n, p = coll.n, fold_size(coll.n)
    block = (coll.count // n) * coll.dtype.itemsize
    return tuple(_fold_sends(n, p, n * block, True)
                 + _rounds(p, lambda v, mask: _round_blocks(v, mask, p, n, True) * block,
                           reversed(_doubling_masks(p)))
                 + _fold_sends(n, p, block, False))


def _hd_sends(coll: Collective, **params) -> tuple[Sends, ...]:
    """Halving then doubling over ``p`` near-equal blocks, between the extras' fold steps."""
    n, p = coll.n, fold_size(coll.n)
    item = coll.dtype.itemsize
    starts = np.concatenate([[0], np.cumsum(even_split(coll.count, p))])

    def span(lo: np.ndarray, mask: int) -> np.ndarray:
        return (starts[lo + mask] - starts[lo]) * item

    masks = _doubling_masks(p)
    return tuple(_fold_sends(n, p, coll.count * item, True)
                 + _rounds(p, lambda v, mask: span((v ^ mask) & ~(mask - 1), mask),
                           reversed(masks))
                 + _rounds(p, lambda v, mask: span(v & ~(mask - 1), mask), masks)
                 + _fold_sends(n, p, coll.count * item, False))


#: these entries' load bound: none (no traffic rule)
_NO_RULE = NoBound("no traffic rule: "
                   "the rounds' link loads are not derived before building, so "
                   "they are always built")

register(Algorithm(
    name="recursive_doubling", collectives=_AG_AR,
    applicable=lambda coll, **p: _reason(coll, "recursive_doubling", _AG_AR, p),
    build=_rd_build,
    ops=every_rank_ops, load=_NO_RULE, sends=_rd_sends,
    # allgather: a block per rank in the output; allreduce: the whole vector, one chunk
    slots=lambda coll, **p: coll.n + 1 if coll.kind is CollectiveKind.ALLGATHER else 2,
    description="log2 rounds with partners 1, 2, 4, ... apart (allreduce: whole vector per "
                "round, latency-optimal)"))
register(Algorithm(
    name="recursive_halving", collectives=frozenset({CollectiveKind.REDUCESCATTER}),
    applicable=lambda coll, **p: _reason(coll, "recursive_halving",
                                         frozenset({CollectiveKind.REDUCESCATTER}), p),
    build=lambda coll, **p: _reducescatter(coll),
    ops=every_rank_ops, load=_NO_RULE, sends=_rh_sends,
    # a block per rank in the input and the partial sums
    slots=lambda coll, **p: 2 * coll.n + 1,
    description="log2 rounds exchanging half of the remaining blocks"))
register(Algorithm(
    name="halving_doubling", collectives=frozenset({CollectiveKind.ALLREDUCE}),
    applicable=lambda coll, **p: _reason(coll, "halving_doubling",
                                         frozenset({CollectiveKind.ALLREDUCE}), p),
    build=lambda coll, **p: _allreduce_halving_doubling(coll),
    ops=every_rank_ops, load=_NO_RULE, sends=_hd_sends,
    # a block per rank of the largest power of two in the group, in each buffer
    slots=lambda coll, **p: 3 * (1 << (coll.n.bit_length() - 1)),
    description="allreduce as recursive-halving reduce-scatter + recursive-doubling "
                "all-gather (Rabenseifner)"))
