"""Direct: every pair exchanges its block in one step, each over a shortest healthy path.

The natural algorithm on a switch (every rank one hop from the crossbar) and the baseline
everywhere else. On a torus the routes are dimension-order (computed in bulk, see
:mod:`cclc.algorithms.common`); a route that would cross a failed link takes a healthy detour.

* alltoall: one step of ``n^2`` copies (uniform blocks, or the per-pair sizes of a
  non-uniform alltoall with a per-rank layout; a zero-byte pair gets no op).
* allgather: one step in which every rank copies its input to every output.
* reducescatter: one step in which every rank sends block ``j`` to rank ``j``'s scratch, then
  ``n - 1`` local steps in which each rank reduces the received blocks into its output.
"""

from __future__ import annotations

import numpy as np

from cclc.algorithms import Algorithm, register
from cclc.algorithms.common import add_pair_routes, pair_distance, pair_hops
from cclc.algorithms.member_sends import all_pairs, block_bytes
from cclc.algorithms.pair_traffic import direct_traffic
from cclc.collective import Collective, CollectiveKind
from cclc.ir import Buf, OpKind, Schedule, ScheduleBuilder
from cclc.sends import Sends, sends

__all__ = ["build_direct"]

_KINDS = frozenset({CollectiveKind.ALLTOALL, CollectiveKind.ALLGATHER,
                    CollectiveKind.REDUCESCATTER})


def _applicable(coll: Collective, **params) -> str | None:
    if coll.kind not in _KINDS:
        return f"direct does not serve {coll.kind.value}"
    if params:
        return f"direct takes no parameters (got {', '.join(params)})"
    return None


def build_direct(coll: Collective, **params) -> Schedule:
    """The direct schedule of ``coll`` (alltoall, allgather or reducescatter)."""
    return _BUILDERS[coll.kind](coll)


def _all_pairs(n: int) -> tuple[np.ndarray, np.ndarray]:
    src = np.repeat(np.arange(n, dtype=np.int64), n)
    dst = np.tile(np.arange(n, dtype=np.int64), n)
    return src, dst


def _alltoall(coll: Collective) -> Schedule:
    n = coll.n
    if coll.pair_sizes is not None:
        elems = coll.pair_sizes // coll.dtype.itemsize
        b = ScheduleBuilder(coll, input=elems, output=elems.T)
        src, dst = np.nonzero(elems)  # zero-size pairs move nothing: no op
    else:
        per_block = coll.count // n
        b = ScheduleBuilder(coll, input=[per_block] * n, output=[per_block] * n)
        src, dst = _all_pairs(n)
    routes = add_pair_routes(b, coll, src, dst)
    b.add(step=0, src=src, dst=dst, route=routes, src_buf=Buf.INPUT, src_off=dst,
          dst_buf=Buf.OUTPUT, dst_off=src)
    return b.build("direct")


def _allgather(coll: Collective) -> Schedule:
    n = coll.n
    per_block = coll.count // n
    b = ScheduleBuilder(coll, input=[per_block], output=[per_block] * n)
    src, dst = _all_pairs(n)
    routes = add_pair_routes(b, coll, src, dst)
    b.add(step=0, src=src, dst=dst, route=routes, src_buf=Buf.INPUT, src_off=0,
          dst_buf=Buf.OUTPUT, dst_off=src)
    return b.build("direct")


def _reducescatter(coll: Collective) -> Schedule:
    n = coll.n
    per_block = coll.count // n
    # scratch slot i of rank j receives rank i's block j
    b = ScheduleBuilder(coll, input=[per_block] * n, output=[per_block],
                        scratch=[per_block] * n)
    src, dst = _all_pairs(n)
    remote = src != dst
    src, dst = src[remote], dst[remote]
    routes = add_pair_routes(b, coll, src, dst)
    b.add(step=0, src=src, dst=dst, route=routes, src_buf=Buf.INPUT, src_off=dst,
          dst_buf=Buf.SCRATCH, dst_off=src)
    ranks = np.arange(n)
    b.add(step=0, src=ranks, dst=ranks, src_buf=Buf.INPUT, src_off=ranks, dst_buf=Buf.OUTPUT,
          dst_off=0)
    # one contribution per step: two reductions into one slot in a step would race
    for s in range(1, n):
        other = (ranks + s) % n
        b.add(step=s, src=ranks, dst=ranks, kind=OpKind.REDUCE, src_buf=Buf.SCRATCH,
              src_off=other, dst_buf=Buf.OUTPUT, dst_off=0)
    return b.build("direct")


def _ops(coll: Collective) -> int:
    """Every pair's block in one op (cut in hops by relay lowering: :func:`pair_hops`), and
    the local ops: each rank's own block copied (alltoall, allgather), or each rank's ``n`` blocks
    copied and summed into its output (reducescatter)."""
    n = coll.n
    return pair_hops(coll) + (n * n if coll.kind is CollectiveKind.REDUCESCATTER else n)


def _slots(coll: Collective) -> int:
    """One rank's chunk slots: a block per rank in input and output (alltoall), in output
    (allgather), in input and scratch (reducescatter); one chunk in the other buffers."""
    n = coll.n
    return n + 1 if coll.kind is CollectiveKind.ALLGATHER else 2 * n + (
        coll.kind is CollectiveKind.REDUCESCATTER)


def _sends(coll: Collective, **params) -> tuple[Sends, ...]:
    """Step 0: every pair's block (a non-uniform alltoall: each non-empty pair's); the
    reducescatter's later steps are local."""
    if coll.pair_sizes is not None:
        sizes = np.asarray(coll.pair_sizes, dtype=np.int64)
        src, dst = np.nonzero(sizes)
        return (sends(src, dst, sizes[src, dst]),)
    block = block_bytes(coll)
    return all_pairs(coll.n, lambda src, dst: np.full(len(src), block))


_BUILDERS = {CollectiveKind.ALLTOALL: _alltoall, CollectiveKind.ALLGATHER: _allgather,
             CollectiveKind.REDUCESCATTER: _reducescatter}

register(Algorithm(
    name="direct", collectives=_KINDS, applicable=_applicable, build=build_direct,
    # every pair's block in one op, over a shortest path that relay lowering may cut in hops
    ops=lambda coll, **params: _ops(coll),
    slots=lambda coll, **params: _slots(coll), exact_ops=True,
    links=lambda coll, **params: pair_distance(coll),
    load=direct_traffic, sends=_sends,
    description="every pair in one step over a shortest healthy path"))
