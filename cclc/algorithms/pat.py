"""PAT (Parallel Aggregated Trees, NCCL >= 2.23): AllGather and ReduceScatter for any ``n``.

Sources: the PAT paper (arXiv 2506.20252) and NCCL's PAT implementation (NCCL 2.23+).

AllGather is ``n`` simultaneous broadcasts, each along a binomial tree rooted at its source and
shifted by the source's rank, so all trees are translates of each other. It is Bruck's
allgather with the dimension order reversed: with ``L = ceil(log2 n)``, dimension ``d = L-1``
(distance ``2^(L-1)``, little data) goes first and ``d = 0`` (distance 1, the most data) last,
which keeps long-distance traffic small. In dimension ``d`` rank ``r`` sends to ``r - 2^d`` the
blocks at offsets ``s`` (relative to ``r``) that are multiples of ``2^(d+1)``; the receiver
then holds them at offsets ``s + 2^d``. Offsets ``>= n`` are skipped, as NCCL does for a
non-power-of-two ``n`` (``PatSkipped``); peers are taken mod ``n``; no extra steps.

ReduceScatter is the mirror: dimensions ``0 .. L-1``, rank ``r`` sends to ``r + 2^d`` its
partial sums of the blocks at offsets whose lowest set bit is ``d``, and the receiver adds them
to its partial of the same block. Partials live in a scratch accumulator (filled by a local
copy of the input first); the own block accumulates in the output.

Buffer-bounded aggregation (``pat(buffer = 4 MiB)``): NCCL aggregates only as many blocks per
transfer as its fixed internal buffer holds (``aggFactor``). Here one transfer of a dimension
carries at most ``max(1, buffer // block_bytes)`` blocks; a dimension with more blocks to send
takes several steps. With an unbounded buffer (the default) PAT takes ``ceil(log2 n)`` steps;
as the buffer shrinks the step count grows towards ``n - 1`` (one block per step). A block
larger than the buffer still moves whole in one step (NCCL would slice the operation into
several passes; the byte count per link is the same).
"""

from __future__ import annotations

import math

import numpy as np

from cclc.algorithms import Algorithm, NoBound, register
from cclc.algorithms.common import add_pair_routes, bad_int_param, hint_int
from cclc.algorithms.member_sends import block_bytes, shift
from cclc.collective import Collective, CollectiveKind
from cclc.ir import Buf, OpKind, Schedule, ScheduleBuilder
from cclc.sends import Sends

__all__ = ["aggregation", "pat_dims", "pat_offsets", "pat_steps"]

_KINDS = frozenset({CollectiveKind.ALLGATHER, CollectiveKind.REDUCESCATTER})


def pat_dims(n: int) -> int:
    """``L = ceil(log2 n)``: the dimensions (distances ``1, 2, ..., 2^(L-1)``)."""
    return (n - 1).bit_length()


def pat_offsets(n: int, d: int, kind: CollectiveKind) -> np.ndarray:
    """Offsets (relative to the sender) of the blocks a rank sends in dimension ``d``.

    AllGather: multiples of ``2^(d+1)`` whose receiver offset ``s + 2^d`` is ``< n``.
    ReduceScatter: offsets ``< n`` whose lowest set bit is ``d``.
    """
    step = 1 << (d + 1)
    if kind is CollectiveKind.ALLGATHER:
        s = np.arange(0, n, step)
        return s[s + (1 << d) < n]
    return np.arange(1 << d, n, step)


def aggregation(coll: Collective, buffer: int | None) -> int:
    """Blocks one transfer may carry: ``max(1, buffer // block_bytes)``, or ``n`` if unbounded."""
    if buffer is None:
        return coll.n
    block_bytes = coll.size // coll.n
    return max(1, buffer // block_bytes)


def pat_steps(n: int, agg: int, kind: CollectiveKind = CollectiveKind.ALLGATHER) -> int:
    """Communication steps of PAT on ``n`` ranks carrying at most ``agg`` blocks per transfer."""
    return sum(math.ceil(len(pat_offsets(n, d, kind)) / agg) for d in range(pat_dims(n)))


def _sub_steps(offsets: np.ndarray, agg: int) -> list[np.ndarray]:
    return [offsets[i:i + agg] for i in range(0, len(offsets), agg)]


def _allgather(coll: Collective, agg: int, params: tuple) -> Schedule:
    n = coll.n
    per = coll.count // n
    b = ScheduleBuilder(coll, input=[per], output=[per] * n)
    ranks = np.arange(n)
    b.add(step=0, src=ranks, dst=ranks, src_buf=Buf.INPUT, src_off=0, dst_buf=Buf.OUTPUT,
          dst_off=ranks)
    kind = CollectiveKind.ALLGATHER
    step = 0
    for d in reversed(range(pat_dims(n))):
        for offs in _sub_steps(pat_offsets(n, d, kind), agg):
            r = np.repeat(ranks, len(offs))
            s = np.tile(offs, n)
            block = (r + s) % n
            dst = (r - (1 << d)) % n
            own = s == 0
            b.add(step=step, src=r, dst=dst, route=add_pair_routes(b, coll, r, dst),
                  src_buf=np.where(own, Buf.INPUT, Buf.OUTPUT), src_off=np.where(own, 0, block),
                  dst_buf=Buf.OUTPUT, dst_off=block)
            step += 1
    return b.build("pat", params=params)


def _reducescatter(coll: Collective, agg: int, params: tuple) -> Schedule:
    n = coll.n
    per = coll.count // n
    b = ScheduleBuilder(coll, input=[per] * n, output=[per], scratch=[per] * n)
    ranks = np.arange(n)
    b.add(step=0, src=ranks, dst=ranks, src_buf=Buf.INPUT, src_off=0, dst_buf=Buf.SCRATCH,
          dst_off=0, count=n)
    b.add(step=0, src=ranks, dst=ranks, src_buf=Buf.INPUT, src_off=ranks, dst_buf=Buf.OUTPUT,
          dst_off=0)
    kind = CollectiveKind.REDUCESCATTER
    step = 1
    for d in range(pat_dims(n)):
        for offs in _sub_steps(pat_offsets(n, d, kind), agg):
            r = np.repeat(ranks, len(offs))
            s = np.tile(offs, n)
            block = (r + s) % n
            dst = (r + (1 << d)) % n
            own = s == (1 << d)  # the receiver's own block: it accumulates in its output
            b.add(step=step, src=r, dst=dst, route=add_pair_routes(b, coll, r, dst),
                  kind=OpKind.REDUCE, src_buf=Buf.SCRATCH, src_off=block,
                  dst_buf=np.where(own, Buf.OUTPUT, Buf.SCRATCH),
                  dst_off=np.where(own, 0, block))
            step += 1
    return b.build("pat", params=params)


def _applicable(coll: Collective, **params) -> str | None:
    if coll.kind not in _KINDS:
        return f"pat serves allgather and reducescatter, not {coll.kind.value}"
    extra = set(params) - {"buffer"}
    if extra:
        return f"pat takes only the parameter buffer (got {', '.join(sorted(extra))})"
    if coll.n < 2:
        return "pat needs at least 2 ranks"
    return bad_int_param(params, "buffer")


def _build(coll: Collective, **params) -> Schedule:
    buffer = hint_int(params, "buffer", None)
    agg = aggregation(coll, buffer)
    out_params = (("buffer", buffer),) if buffer is not None else ()
    if coll.kind is CollectiveKind.ALLGATHER:
        return _allgather(coll, agg, out_params)
    return _reducescatter(coll, agg, out_params)


def _sends(coll: Collective, **params) -> tuple[Sends, ...]:
    """One step per transfer of a dimension: every rank sends its blocks (at most ``agg``) to
    the rank ``2^d`` below (allgather, far dimensions first) or above (reducescatter)."""
    n, kind = coll.n, coll.kind
    agg = aggregation(coll, hint_int(params, "buffer", None))
    block = block_bytes(coll)
    dims = range(pat_dims(n))
    out = []
    for d in reversed(dims) if kind is CollectiveKind.ALLGATHER else dims:
        by = -(1 << d) if kind is CollectiveKind.ALLGATHER else 1 << d
        out += [shift(n, by, len(offs) * block)
                for offs in _sub_steps(pat_offsets(n, d, kind), agg)]
    return tuple(out)


def _ops(coll: Collective, **params) -> int:
    """Every rank's block reaches every rank, one op per block and hop of the trees, before
    relay lowering: ``n^2`` (allgather: a local copy and ``n - 1`` arrivals per rank), and a
    copy of each rank's input into the partial sums for reducescatter (``n^2 + n``)."""
    n = coll.n
    return n * n + (n if coll.kind is CollectiveKind.REDUCESCATTER else 0)


def _slots(coll: Collective, **params) -> int:
    """One rank's chunk slots: a block per rank in the output (allgather), in the input and
    the partial sums (reducescatter), one chunk in the other buffer."""
    return coll.n + 1 if coll.kind is CollectiveKind.ALLGATHER else 2 * coll.n + 1


register(Algorithm(
    name="pat", collectives=_KINDS, applicable=_applicable, build=_build,
    ops=_ops, slots=_slots, exact_ops=True, sends=_sends,
    load=NoBound("no traffic rule: the aggregated transfers' link loads are not derived "
                 "before building, so it is always built"),
    description="Parallel Aggregated Trees: reversed Bruck, far hops first with little data; "
                "buffer=B bounds the bytes aggregated per transfer"))
