"""Which links each measured pair's traffic crosses: the topology's routing, in one place.

Diagnosis needs the path of every pair as the network really carried it. Today that is the
routing the simulator and verifier use for a pair talking directly: shortest healthy paths
(dimension order on tori, detouring around declared faults), and on a leaf/spine fabric the
ECMP hash of :func:`cclc.fabric_routing.ecmp_routes` (switches hash flows blindly; a fabric
routes what the user sends, not a cclc plan). :func:`pair_routes` is the only function that
knows this; when topologies declare their routing it is the one place to follow it.
"""

from __future__ import annotations

import hashlib

import numpy as np

from cclc.algorithms.common import add_pair_routes
from cclc.collective import CollectiveKind, make_collective
from cclc.fabric_routing import ecmp_routes, has_spines
from cclc.ir import Buf, ScheduleBuilder
from cclc.topology import Topology

__all__ = ["PairRoutes", "pair_routes"]


class PairRoutes:
    """Routes of pairs ``src[k] -> dst[k]`` as CSR: pair ``k`` crosses
    ``links[offsets[k]:offsets[k + 1]]``."""

    __slots__ = ("offsets", "links")

    def __init__(self, offsets: np.ndarray, links: np.ndarray):
        self.offsets = offsets
        self.links = links

    def pair_of_entry(self) -> np.ndarray:
        """The pair index of every entry of :attr:`links`."""
        return np.repeat(np.arange(len(self.offsets) - 1), np.diff(self.offsets))


def pair_routes(topo: Topology, src: np.ndarray, dst: np.ndarray) -> PairRoutes:
    """The links crossed by each pair ``src[k] -> dst[k]`` (rank ids) under ``topo``'s routing.

    The routes are those of a direct alltoall among the pairs' ranks, built by the same code as
    cclc's ``direct`` schedules, with the fabric's spines chosen by ECMP.
    """
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    # diagnosing many measurements of one machine routes the same pairs again: keep them
    key = ("diagnose.pair_routes", hashlib.sha1(src.tobytes() + dst.tobytes()).hexdigest())
    if key not in topo._cache:
        topo._cache[key] = _pair_routes(topo, src, dst)
    return topo._cache[key]


def _pair_routes(topo: Topology, src: np.ndarray, dst: np.ndarray) -> PairRoutes:
    group = tuple(sorted(set(src.tolist()) | set(dst.tolist())))
    index = {r: i for i, r in enumerate(group)}
    gs = np.array([index[r] for r in src.tolist()], dtype=np.int64)
    gd = np.array([index[r] for r in dst.tolist()], dtype=np.int64)
    n = len(group)
    coll = make_collective("probe", CollectiveKind.ALLTOALL, topo, group, size=4 * n * n)
    b = ScheduleBuilder(coll, input=[n] * n, output=[n] * n)
    rid = add_pair_routes(b, coll, gs, gd)
    b.add(step=0, src=gs, dst=gd, route=rid, src_buf=Buf.INPUT, src_off=gd,
          dst_buf=Buf.OUTPUT, dst_off=gs)
    s = b.build("direct")
    if has_spines(topo):
        s = ecmp_routes(s)
    route = s.ops.route.astype(np.int64)
    offs = s.routes.offsets.astype(np.int64)
    lengths = offs[route + 1] - offs[route]
    out_offs = np.concatenate([[0], np.cumsum(lengths)])
    starts = np.repeat(offs[route], lengths)
    within = np.arange(out_offs[-1]) - np.repeat(out_offs[:-1], lengths)
    links = s.routes.links.astype(np.int64)[starts + within]
    return PairRoutes(out_offs, links)
