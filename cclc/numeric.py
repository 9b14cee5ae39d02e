"""The numeric interpreter: run a schedule on real numpy data and compare with numpy.

For every dtype the language accepts (bf16 emulated as float32 values rounded to bf16 after
every operation) and, for reducing collectives, every reduction op, the schedule is executed
step by step on per-rank buffers filled with data chosen so the result does not depend on the
order of the reduction (small integers for sums, ``{1, -1, 2}`` for products), and the outputs
are compared exactly with a reference computed by numpy over the stacked inputs (``np.sum`` /
``np.prod`` / ``np.min`` / ``np.max``, a block transpose for alltoall, a concatenation for
allgather). Buffers that start without data (outputs, scratch, broadcast inputs off the root)
are filled with garbage (NaN for floats), so reading them shows up in the result.

Size. The run uses the real chunk sizes when all buffers of all ranks hold at most 65536
elements (and at most ``max_elements``). Otherwise every chunk size is divided by the greatest
common divisor of all chunk and block sizes (an exact rescaling: the schedule's shape is
unchanged, one element stands for ``gcd`` of them). If that is still over ``max_elements``,
each distinct chunk size is replaced by a small stand-in (1..4 elements; equal chunks stay
equal, empty chunks stay empty); the stand-in run is only possible when the stand-in sizes
still agree wherever the collective needs them to (e.g. alltoall block i->j is as big on both
ends, every op moves as many elements as it receives), and :class:`ScheduleError` says so when
they do not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from math import gcd

import numpy as np

from cclc.collective import CollectiveKind, DType, ReduceOp
from cclc.errors import ScheduleError
from cclc.ir import Buf, OpKind, Schedule, format_op
from cclc.semantics import chunk_map

__all__ = ["DTYPES", "check_numeric", "numpy_dtype"]

#: numpy storage type of each dtype (bf16 values live in float32, rounded to bf16)
_STORAGE: dict[DType, type[np.floating] | type[np.integer]] = {
    DType.FP64: np.float64, DType.FP32: np.float32, DType.FP16: np.float16,
    DType.BF16: np.float32, DType.INT8: np.int8, DType.UINT8: np.uint8,
    DType.INT32: np.int32, DType.UINT32: np.uint32, DType.INT64: np.int64,
    DType.UINT64: np.uint64}
DTYPES = tuple(DType)

#: up to this many elements in all buffers the run uses the real chunk sizes; beyond it the
#: exact gcd rescaling is as telling (ops move whole chunks) and cheaper
_REAL_LIMIT = 1 << 16

_UFUNC = {ReduceOp.SUM: np.add, ReduceOp.PROD: np.multiply, ReduceOp.MIN: np.minimum,
          ReduceOp.MAX: np.maximum}


def numpy_dtype(dtype: DType) -> type:
    """The numpy type the numeric interpreter stores ``dtype`` in."""
    return _STORAGE[dtype]


def _round_bf16(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to the nearest bfloat16 (ties to even), still as float32."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) \
        & np.uint32(0xFFFF0000)
    # NaN stays NaN (rounding could carry it into the exponent)
    return np.where(np.isnan(x), x, rounded.view(np.float32))


@dataclass(frozen=True, eq=False)
class _Plan:
    """Element sizes used for the run and where every (buffer, rank) region lives."""

    chunk_starts: tuple[np.ndarray, ...]   # (n, n_chunks+1) per buffer
    region: tuple[np.ndarray, ...]         # (n,) start of each rank's buffer
    total: int
    input_blocks: list[np.ndarray]    # per rank: block boundaries in the input, run elements
    output_blocks: list[np.ndarray]   # per rank: block boundaries in the output
    how: str                          # words for the report
    input_present: np.ndarray         # (n,) whether each rank's input holds data


def check_numeric(schedule: Schedule, seed: int = 0, dtypes=None, ops=None,
                  max_elements: int = 1 << 25) -> None:
    """Run ``schedule`` on real data for every dtype and reduction op; raise on a mismatch.

    ``dtypes`` / ``ops`` restrict the sweep (default: all; ops only matter when reducing).
    Raises :class:`ScheduleError` naming the dtype, op, rank, chunk and both values.

    >>> check_numeric(schedule)              # doctest: +SKIP
    """
    coll = schedule.collective
    plan = _plan(schedule, max_elements)
    reducing = coll.kind in (CollectiveKind.REDUCESCATTER, CollectiveKind.ALLREDUCE,
                             CollectiveKind.REDUCE)
    op_list = list(ops) if ops is not None else (list(ReduceOp) if reducing else [coll.op])
    rng = np.random.default_rng(seed)
    steps = _steps(schedule, plan)
    # products may overflow a float to inf: that is order-independent, hence still exact
    with np.errstate(over="ignore"):
        for dtype in (dtypes or DTYPES):
            for op in op_list:
                _run_one(schedule, plan, steps, dtype, op, reducing, rng)


# -- sizes -----------------------------------------------------------------------------------

def _plan(s: Schedule, max_elements: int) -> _Plan:
    cm = chunk_map(s)                     # checks sizes and block alignment
    c = cm.contract
    elems = [s.chunk_elems(b) for b in Buf]
    real_total = int(sum(int(e.sum()) for e in elems))
    if real_total <= min(max_elements, _REAL_LIMIT):
        return _layout(s, elems, c, lambda e: e, "real chunk sizes")
    g = 0
    for a in elems + [c.input_blocks, c.output_blocks]:
        for v in np.unique(a).tolist():
            g = gcd(g, int(v))
    g = max(g, 1)
    if real_total // g <= max_elements:
        return _layout(s, elems, c, lambda e: e // g,
                       f"one element per {g} (every chunk and block size divides by {g})")
    distinct = np.unique(np.concatenate([e.ravel() for e in elems]))
    distinct = distinct[distinct > 0]
    # the k-th smallest distinct size becomes 1 + k % 4 elements (never more than its size
    # in gcd units); 0 stays 0
    table = np.concatenate([[0], np.minimum(1 + np.arange(len(distinct)) % 4,
                                            distinct // g)]).astype(np.int64)

    def standin(e: np.ndarray) -> np.ndarray:
        k = np.searchsorted(distinct, e)
        return np.where(e > 0, table[np.minimum(k, len(distinct) - 1) + 1], 0)

    plan = _layout(s, [standin(e) for e in elems], c, None,
                   "stand-in chunk sizes of 1..4 elements")
    if plan.total > max_elements:
        raise ScheduleError(f"the numeric check needs {plan.total} elements even with stand-in "
                            f"chunk sizes, over its limit of {max_elements}")
    return plan


def _layout(s: Schedule, elems, c, scale, how: str) -> _Plan:
    n = s.n
    sized = [e if scale is None else scale(e) for e in elems]
    starts, regions, at = [], [], 0
    for e in sized:
        st = np.zeros((n, e.shape[1] + 1), dtype=np.int64)
        np.cumsum(e, axis=1, out=st[:, 1:])
        starts.append(st)
        regions.append(at + np.concatenate([[0], np.cumsum(st[:, -1])[:-1]]))
        at += int(st[:, -1].sum())
    blocks = []
    for buf, b in ((Buf.INPUT, c.input_blocks), (Buf.OUTPUT, c.output_blocks)):
        real = s.chunk_starts(buf)
        per_rank = []
        for r in range(n):
            bstart = np.concatenate([[0], np.cumsum(b[r])])
            # block boundaries are chunk boundaries (chunk_map checked): find the chunk index
            k = np.searchsorted(real[r], bstart)
            per_rank.append(starts[buf][r, k])
        blocks.append(per_rank)
    plan = _Plan(chunk_starts=tuple(starts), region=tuple(regions), total=at,
                 input_blocks=blocks[0], output_blocks=blocks[1], how=how,
                 input_present=c.input_present)
    _check_consistent(s, plan)
    return plan


def _check_consistent(s: Schedule, plan: _Plan) -> None:
    """The run's sizes must still fit the collective and every op (matters for stand-ins)."""
    coll = s.collective
    n = s.n
    ib = np.array([np.diff(b) for b in plan.input_blocks])
    ob = np.array([np.diff(b) for b in plan.output_blocks])
    k = coll.kind
    if k is CollectiveKind.ALLTOALL:
        ok = np.array_equal(ib, ob.T)
    elif k is CollectiveKind.ALLGATHER:
        ok = (ob == ib[:, 0][None, :]).all()
    elif k is CollectiveKind.REDUCESCATTER:
        ok = (ib == ob[:, 0][None, :]).all()
    else:
        ok = (ib == ib[0, 0]).all() and (ob == ib[0, 0]).all()
    if not ok:
        raise ScheduleError(f"the numeric check cannot run this {k.value} with {plan.how}: "
                            "the blocks would no longer match; raise max_elements")
    o = s.ops
    src_len = _range_len(plan, o.src_buf, o.src, o.src_off, o.count, n)
    dst_len = _range_len(plan, o.dst_buf, o.dst, o.dst_off, o.count, n)
    bad = np.flatnonzero(src_len != dst_len)
    if len(bad):
        i = int(bad[0])
        raise ScheduleError(f"op #{i} ({format_op(s, i)}) moves {int(src_len[i])} elements into "
                            f"{int(dst_len[i])} (numeric run with {plan.how})")


def _range_len(plan: _Plan, buf, rank, off, count, n) -> np.ndarray:
    out = np.zeros(len(buf), dtype=np.int64)
    for b in Buf:
        m = buf == b
        if not m.any():
            continue
        st = plan.chunk_starts[b]
        r, a, cnt = rank[m].astype(np.int64), off[m].astype(np.int64), count[m].astype(np.int64)
        if (r < 0).any() or (r >= n).any() or (a < 0).any() or (cnt < 1).any() \
                or (a + cnt >= st.shape[1]).any():
            raise ScheduleError("the schedule has an op whose chunk range is out of bounds; "
                                "run verify() for the details")
        out[m] = st[r, a + cnt] - st[r, a]
    return out


# -- data ------------------------------------------------------------------------------------

def _inputs(rng: np.random.Generator, dtype: DType, op: ReduceOp, reducing: bool,
            shape: tuple[int, int]) -> np.ndarray:
    """Input data whose reduction is exact in any order (see the module docstring)."""
    t = _STORAGE[dtype]
    is_float = np.issubdtype(t, np.floating)
    unsigned = np.issubdtype(t, np.unsignedinteger)
    n, m = shape
    if not reducing:
        lo, hi = ((-200, 200) if dtype is DType.BF16 else (-2000, 2000)) if is_float else \
            ((0, 255) if unsigned else (-128, 127))
        if not is_float and np.dtype(t).itemsize > 1:
            lo, hi = (0, 60000) if unsigned else (-30000, 30000)
        return rng.integers(lo, hi, size=shape, endpoint=True).astype(t)
    if op is ReduceOp.SUM:
        lo, hi = (0, 3) if unsigned else (-3, 3)
        v = rng.integers(lo, hi, size=shape, endpoint=True)
        if is_float and n > 64:
            # at most ~64 nonzero terms per element keeps every partial sum an exact bf16
            keep = (np.arange(n)[:, None] + np.arange(m)[None, :]) % -(-n // 64) == 0
            v = np.where(keep, v, 0)
        return v.astype(t)
    if op is ReduceOp.PROD:
        choices = np.array([1, 2, 3] if unsigned else [1, -1, 2])
        if is_float:
            choices = np.array([1, -1, 2])
        return choices[rng.integers(0, 3, size=shape)].astype(t)
    lo, hi = (0, 255) if unsigned else (-120, 120)
    return rng.integers(lo, hi, size=shape, endpoint=True).astype(t)


def _garbage(rng: np.random.Generator, dtype: DType, size: int) -> np.ndarray:
    t = _STORAGE[dtype]
    if issubclass(t, np.floating):
        return np.full(size, np.nan, dtype=t)
    info = np.iinfo(t)
    return rng.integers(info.min // 2, info.max // 2, size=size).astype(t)


def _reference(kind: CollectiveKind, op: ReduceOp, dtype: DType, inputs: list[np.ndarray],
               plan: _Plan, root: int | None) -> Sequence[np.ndarray | None]:
    """numpy's answer: each rank's expected output (None where unspecified)."""
    n = len(inputs)
    t = _STORAGE[dtype]

    def reduce(stack: np.ndarray) -> np.ndarray:
        if op is ReduceOp.SUM:
            out = np.sum(stack, axis=0, dtype=t)
        elif op is ReduceOp.PROD:
            out = np.prod(stack, axis=0, dtype=t)
        elif op is ReduceOp.MIN:
            out = np.min(stack, axis=0)
        else:
            out = np.max(stack, axis=0)
        return _round_bf16(out) if dtype is DType.BF16 else out

    if kind is CollectiveKind.ALLTOALL:
        # output block i of rank j is input block j of rank i: a transpose of blocks, done as
        # one gather over the concatenated inputs
        flat = np.concatenate(inputs)
        base = np.concatenate([[0], np.cumsum([len(x) for x in inputs])[:-1]])
        starts = np.array([b[:-1] for b in plan.input_blocks])          # (i, j)
        sizes = np.array([np.diff(b) for b in plan.input_blocks])
        gathered = flat[_expand((base[:, None] + starts).T.ravel(), sizes.T.ravel())]
        cut = np.cumsum(sizes.sum(axis=0))[:-1]
        return np.split(gathered, cut)
    if kind is CollectiveKind.ALLGATHER:
        whole = np.concatenate(inputs)
        return [whole for _ in range(n)]
    if kind is CollectiveKind.REDUCESCATTER:
        # the blocks are cut alike on every rank (checked when the sizes were planned)
        whole = reduce(np.stack(inputs))
        b = plan.input_blocks[0]
        return [whole[b[r]:b[r + 1]] for r in range(n)]
    if kind is CollectiveKind.ALLREDUCE:
        whole = reduce(np.stack(inputs))
        return [whole for _ in range(n)]
    if root is None:
        raise ScheduleError(f"numeric check: a {kind.value} needs a root")
    if kind is CollectiveKind.BROADCAST:
        return [inputs[root] for _ in range(n)]
    out: list[np.ndarray | None] = [None] * n
    out[root] = reduce(np.stack(inputs))
    return out


# -- the run ---------------------------------------------------------------------------------

def _element_index(plan: _Plan, buf, rank, off, count) -> tuple[np.ndarray, np.ndarray]:
    """Start and length in the flat state of each op's chunk range."""
    start = np.zeros(len(buf), dtype=np.int64)
    length = np.zeros(len(buf), dtype=np.int64)
    for b in Buf:
        m = buf == b
        if m.any():
            st = plan.chunk_starts[b]
            r, a = rank[m].astype(np.int64), off[m].astype(np.int64)
            start[m] = plan.region[b][r] + st[r, a]
            length[m] = st[r, a + count[m]] - st[r, a]
    return start, length


def _expand(start: np.ndarray, length: np.ndarray) -> np.ndarray:
    """All indices ``start[k] .. start[k]+length[k]-1``, op after op."""
    total = int(length.sum())
    first = np.cumsum(length) - length
    return np.repeat(start - first, length) + np.arange(total)


def _steps(s: Schedule, plan: _Plan
           ) -> list[tuple[np.ndarray, np.ndarray, np.ndarray | None]]:
    """Per step: the flat element indices every op reads and writes, and which are reduced.

    Computed once and shared by every dtype and op of the sweep.
    """
    o = s.ops
    order = np.argsort(o.step, kind="stable")
    cuts = np.flatnonzero(np.diff(o.step[order])) + 1
    index_type = np.int32 if plan.total < 2**31 else np.int64
    out = []
    for idx in np.split(order, cuts) if len(order) else []:
        s_start, length = _element_index(plan, o.src_buf[idx], o.src[idx], o.src_off[idx],
                                         o.count[idx])
        d_start, _ = _element_index(plan, o.dst_buf[idx], o.dst[idx], o.dst_off[idx],
                                    o.count[idx])
        red = np.repeat(o.kind[idx] == OpKind.REDUCE, length)
        out.append((_expand(s_start, length).astype(index_type),
                    _expand(d_start, length).astype(index_type),
                    red if red.any() else None))
    return out


def _run_one(s: Schedule, plan: _Plan, steps, dtype: DType, op: ReduceOp, reducing: bool,
             rng: np.random.Generator) -> None:
    coll = s.collective
    n = s.n
    t = _STORAGE[dtype]
    state = _garbage(rng, dtype, plan.total)
    in_len = plan.chunk_starts[Buf.INPUT][:, -1]
    data = _inputs(rng, dtype, op, reducing, (n, int(in_len.max(initial=0))))
    inputs = [data[r, :int(in_len[r])] for r in range(n)]
    for r in range(n):
        if plan.input_present[r]:
            a = int(plan.region[Buf.INPUT][r])
            state[a:a + len(inputs[r])] = inputs[r]
    ufunc = _UFUNC[op]
    for src, dst, red in steps:
        values = state[src]                      # every op reads the previous step's state
        if red is not None:
            combined = ufunc(state[dst[red]], values[red])
            if dtype is DType.BF16:
                combined = _round_bf16(combined)
            values[red] = combined.astype(t)
        state[dst] = values
    expected = _reference(coll.kind, op, dtype, inputs, plan, coll.root)
    for r in range(n):
        want = expected[r]
        if want is None:
            continue
        a = int(plan.region[Buf.OUTPUT][r])
        got = state[a:a + int(plan.chunk_starts[Buf.OUTPUT][r, -1])]
        if not np.array_equal(got, want):
            bad = np.flatnonzero(~((got == want)
                                   | (np.isnan(got) & np.isnan(want)
                                      if np.issubdtype(t, np.floating) else False)))
            e = int(bad[0]) if len(bad) else 0
            chunk = int(np.searchsorted(plan.chunk_starts[Buf.OUTPUT][r], e, side="right") - 1)
            what = f"{dtype.value} {op.value}" if reducing else dtype.value
            raise ScheduleError(
                f"numeric check ({what}, {plan.how}): rank {r} output element {e} (chunk "
                f"{chunk}) is {got[e]!r} but numpy's reference is {want[e]!r}")
