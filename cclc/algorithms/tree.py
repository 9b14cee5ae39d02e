"""Tree: a binomial tree over the group, rooted at the collective's root.

Members are numbered by their distance ``v`` from the root along the group's ring order (so
on a torus the short tree edges are single links); each edge travels a shortest healthy path.
``ceil(log2 n)`` steps, the whole buffer per message: the latency-optimal choice for small
buffers.

* broadcast: in step ``k`` every member ``v < 2^k`` that holds the data sends it to
  ``v + 2^k``.
* reduce: after a local step that seeds every output with its own input, in step ``k + 1``
  member ``v`` with ``v mod 2^(k+1) == 2^k`` adds its partial sum into ``v - 2^k``.
"""

from __future__ import annotations

import numpy as np

from cclc.algorithms import Algorithm, NoBound, every_rank_ops, register
from cclc.algorithms.common import add_pair_routes, ring_order
from cclc.collective import Collective, CollectiveKind
from cclc.ir import Buf, OpKind, Schedule, ScheduleBuilder

__all__ = ["build_tree"]

_KINDS = frozenset({CollectiveKind.BROADCAST, CollectiveKind.REDUCE})


def _applicable(coll: Collective, **params) -> str | None:
    if coll.kind not in _KINDS:
        return f"tree does not serve {coll.kind.value}"
    if params:
        return f"tree takes no parameters (got {', '.join(sorted(params))})"
    return None


def _levels(n: int) -> int:
    return max(0, (n - 1).bit_length())


def _members_from_root(coll: Collective) -> np.ndarray:
    order = ring_order(coll)
    start = int(np.flatnonzero(order == coll.root)[0])
    return np.roll(order, -start)


def build_tree(coll: Collective, **params) -> Schedule:
    """The binomial-tree schedule of a broadcast or reduce."""
    n = coll.n
    members = _members_from_root(coll)
    b = ScheduleBuilder(coll, input=[coll.count], output=[coll.count])
    v = np.arange(n)
    if coll.kind is CollectiveKind.BROADCAST:
        b.add(step=0, src=members[0], dst=members[0], src_buf=Buf.INPUT, src_off=0,
              dst_buf=Buf.OUTPUT, dst_off=0)
        for k in range(_levels(n)):
            senders = v[(v < 2 ** k) & (v + 2 ** k < n)]
            src, dst = members[senders], members[senders + 2 ** k]
            b.add(step=k, src=src, dst=dst, route=add_pair_routes(b, coll, src, dst),
                  src_buf=np.where(senders == 0, Buf.INPUT, Buf.OUTPUT), src_off=0,
                  dst_buf=Buf.OUTPUT, dst_off=0)
    else:
        b.add(step=0, src=v, dst=v, src_buf=Buf.INPUT, src_off=0, dst_buf=Buf.OUTPUT,
              dst_off=0)
        for k in range(_levels(n)):
            senders = v[v % 2 ** (k + 1) == 2 ** k]
            src, dst = members[senders], members[senders - 2 ** k]
            b.add(step=k + 1, src=src, dst=dst, route=add_pair_routes(b, coll, src, dst),
                  kind=OpKind.REDUCE, src_buf=Buf.OUTPUT, src_off=0, dst_buf=Buf.OUTPUT,
                  dst_off=0)
    return b.build("tree")


register(Algorithm(
    name="tree", collectives=_KINDS, applicable=_applicable, build=build_tree,
    ops=every_rank_ops,
    load=NoBound("no traffic rule: the binomial tree's link loads are not derived before "
                 "building, so it is always built"),
    description="binomial tree over the group (log2 n steps, whole buffer per message)"))
