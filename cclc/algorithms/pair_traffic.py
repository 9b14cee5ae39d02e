"""The link traffic of schedules that send blocks between pairs over shortest routes.

The ``load`` rules of ``direct`` and ``bruck`` (:attr:`cclc.algorithms.Algorithm.load`): the
bytes per (step, link) their schedules put on the links before relay lowering, from which the
planner's load and step bounds (:mod:`cclc.load_bounds`) follow without building anything.
"""

from __future__ import annotations

import numpy as np

from cclc.algorithms.common import route_table, topo_is_plain_torus
from cclc.algorithms.member_sends import block_bytes
from cclc.collective import Collective, CollectiveKind
from cclc.ir import Routes
from cclc.link_traffic import CARRIED, EARLY, LATE, Traffic, traffic_rows
from cclc.routing import carried_routes

__all__ = ["bruck_traffic", "direct_traffic", "pair_traffic"]


def pair_traffic(coll: Collective, src: np.ndarray, dst: np.ndarray, nbytes: np.ndarray,
                 one_chunk_ops: bool = False) -> Traffic:
    """The traffic of one step in which group members ``src`` send ``nbytes`` to ``dst``
    over the shortest healthy routes the algorithms take
    (:func:`cclc.algorithms.common.route_table`).

    ``one_chunk_ops``: every pair is one op of one chunk, so on a plain torus with routing
    ``none`` relay lowering puts hop ``k`` of a chain of ``h`` links in sub-step ``L - h + k``
    of the step (``L`` the longest chain): the traffic is laid out in those sub-steps.
    """
    topo = coll.topology
    group = np.asarray(coll.group, dtype=np.int64)
    remote = (src != dst) & (nbytes > 0)
    if not remote.any():
        return traffic_rows(0, [], [])
    offsets, links = route_table(topo, group[src[remote]], group[dst[remote]])
    offsets = np.asarray(offsets, dtype=np.int64)
    hops = np.diff(offsets)
    op = np.repeat(np.arange(len(hops)), hops)
    k = np.arange(len(links)) - offsets[op]
    per_link = np.repeat(nbytes[remote].astype(np.float64), hops)
    if one_chunk_ops and topo.routing == "none" and topo_is_plain_torus(topo):
        sub = int(hops.max()) - hops[op] + k
        return traffic_rows(sub, links, per_link, CARRIED)
    carried = carried_routes(topo, Routes(np.concatenate([[0], offsets]), links))[1:]
    role = np.where(k == 0, EARLY, LATE)
    if topo.routing == "none":
        role = np.where(k < hops[op] - 1, EARLY, LATE)
    return traffic_rows(0, links, per_link, np.where(carried[op], CARRIED, role))


def direct_traffic(coll: Collective, **params) -> Traffic:
    """``direct``'s traffic: every pair's block in one op of one chunk, all in step 0."""
    n = coll.n
    src = np.repeat(np.arange(n), n)
    dst = np.tile(np.arange(n), n)
    if coll.pair_sizes is not None:
        nbytes = np.asarray(coll.pair_sizes, dtype=np.int64).ravel()
    else:
        nbytes = np.full(n * n, block_bytes(coll), dtype=np.int64)
    return pair_traffic(coll, src, dst, nbytes, one_chunk_ops=True)


def bruck_traffic(coll: Collective, **params) -> Traffic:
    """``bruck``'s traffic (AllToAll and AllGather), all its rounds counted in one step."""
    n = coll.n
    ranks = np.arange(n)
    block = block_bytes(coll)
    src, dst, nbytes = [], [], []
    if coll.kind is CollectiveKind.ALLTOALL:
        # round k: every position with bit k set goes to rank i + 2^k
        for k in range((n - 1).bit_length()):
            blocks = sum(1 for p in range(n) if p >> k & 1)
            src.append(ranks)
            dst.append((ranks + (1 << k)) % n)
            nbytes.append(np.full(n, blocks * block))
    else:
        # allgather: rank i sends what it holds (at most what the others lack) to i - 2^k
        held, k = 1, 0
        while held < n:
            send = min(held, n - held)
            src.append(ranks)
            dst.append((ranks - (1 << k)) % n)
            nbytes.append(np.full(n, send * block))
            held += send
            k += 1
    t = pair_traffic(coll, np.concatenate(src), np.concatenate(dst), np.concatenate(nbytes))
    # the rounds' steps are the builder's: one step of everything is all this rule claims
    return traffic_rows(0, t.link, t.nbytes)
