"""Direct AllReduce on a switch or an NVSwitch node: direct reduce-scatter + direct all-gather.

(Direct AllToAll / AllGather / ReduceScatter live in :mod:`cclc.algorithms.direct`; this entry
adds AllReduce to the same name.)

The buffer is cut into ``n`` near-equal blocks; block ``r`` is owned by rank ``r``.

1. One step, all pairs: every rank sends block ``r`` of its input to rank ``r``, which receives
   the ``n - 1`` contributions into separate scratch slots (two writes to one slot in one step
   would race); its own contribution goes to its output by a local copy.
2. Local steps reduce the scratch slots into the output, one slot per step (local steps cost
   no time in the default cost model; on real hardware they are one fused kernel).
3. One step, all pairs: every rank sends its reduced block to every other rank.

Two network steps and ``2 (n-1)/n`` of the buffer per rank: bandwidth- and latency-optimal on
a non-blocking switch, where every rank has its own full-bandwidth port; on a torus every pair
shares links, so it is not offered there.
"""

from __future__ import annotations

import numpy as np

from cclc.algorithms import Algorithm, NoBound, register
from cclc.algorithms.common import add_pair_routes, even_split
from cclc.algorithms.member_sends import all_pairs
from cclc.collective import Collective, CollectiveKind
from cclc.ir import Buf, OpKind, Schedule, ScheduleBuilder
from cclc.sends import Sends

__all__: list[str] = []


def _allreduce(coll: Collective) -> Schedule:
    n = coll.n
    blocks = even_split(coll.count, n)
    # rank r's scratch holds n slots the size of its own block r (slot i: from rank i)
    scratch = np.repeat(blocks[:, None], n, axis=1)
    b = ScheduleBuilder(coll, input=blocks, output=blocks, scratch=scratch)
    ranks = np.arange(n)
    src = np.repeat(ranks, n)
    dst = np.tile(ranks, n)
    remote = src != dst
    s, d = src[remote], dst[remote]
    b.add(step=0, src=ranks, dst=ranks, src_buf=Buf.INPUT, src_off=ranks, dst_buf=Buf.OUTPUT,
          dst_off=ranks)
    b.add(step=0, src=s, dst=d, route=add_pair_routes(b, coll, s, d), src_buf=Buf.INPUT,
          src_off=d, dst_buf=Buf.SCRATCH, dst_off=s)
    for k in range(1, n):
        other = (ranks + k) % n
        b.add(step=k, src=ranks, dst=ranks, kind=OpKind.REDUCE, src_buf=Buf.SCRATCH,
              src_off=other, dst_buf=Buf.OUTPUT, dst_off=ranks)
    b.add(step=n, src=s, dst=d, route=add_pair_routes(b, coll, s, d), src_buf=Buf.OUTPUT,
          src_off=s, dst_buf=Buf.OUTPUT, dst_off=s)
    return b.build("direct")


def _sends(coll: Collective, **params) -> tuple[Sends, ...]:
    """Two all-pairs steps: block ``d`` of every input to its owner ``d``, then every owner's
    reduced block ``s`` to every other rank (the local sums between them move nothing)."""
    block = even_split(coll.count, coll.n) * coll.dtype.itemsize
    return (all_pairs(coll.n, lambda src, dst: block[dst])
            + all_pairs(coll.n, lambda src, dst: block[src]))


def _applicable(coll: Collective, **params) -> str | None:
    if coll.kind is not CollectiveKind.ALLREDUCE:
        return f"this direct entry serves allreduce, not {coll.kind.value}"
    if params:
        return f"direct takes no parameters (got {', '.join(sorted(params))})"
    if coll.n < 2:
        return "direct allreduce needs at least 2 ranks"
    if coll.topology.dims is not None:
        return (f"direct sends between every pair at once, which on a "
                f"{coll.topology.kind_name} piles the traffic onto shared links; use biring or "
                "ring+dimrotation")
    return None


register(Algorithm(
    name="direct", collectives=frozenset({CollectiveKind.ALLREDUCE}), applicable=_applicable,
    build=lambda coll, **params: _allreduce(coll),
    # a local copy, n - 1 blocks out, n - 1 sums and n - 1 results back per rank; a block of
    # every rank in each buffer
    ops=lambda coll, **params: 3 * coll.n * coll.n - 2 * coll.n, exact_ops=True,
    slots=lambda coll, **params: 3 * coll.n,
    load=NoBound("no traffic rule for the all-pairs allreduce: it is always built"),
    sends=_sends,
    description="allreduce: all-pairs reduce-scatter into scratch, local sums, all-pairs "
                "all-gather"))
