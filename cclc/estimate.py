"""Cheap lower bounds per candidate, so that ``auto`` builds only the candidates that can win.

Building, verifying and simulating a candidate costs seconds to minutes at hundreds of ranks;
its *link loads* cost milliseconds: they follow from the topology, the size and the
algorithm's routes alone, without a schedule. Every execution model of :mod:`cclc.execution`
serves the bytes of one link one after another at the link's bandwidth (lockstep: a step
lasts at least its busiest link's busy time plus that link's latency, and the steps add up;
event and dataflow: a link serves its ops first come, first served), so for every link ``l``::

    time >= bytes(l) / bandwidth(l) + latency(l)      (+ the model's per-call cost)

The maximum over links is the candidate's *load bound*: a true lower bound on its simulated
time, not an estimate with an error. ``auto`` evaluates the candidates in order of their
bounds and skips one whose bound is already above the time of a simulated candidate: it cannot
win, so pruning never changes the choice (``tests/plan/test_estimate.py`` checks both the
bounds against simulation and pruned ``auto`` against unpruned ``auto``).

How tight it is (measured at bandwidth-bound sizes on GPU tori, routing ``none``, 4x4, 5x5 and
4x4x4, healthy and with one failed link; the tests pin the healthy figures): under the ``ir``
model the simulated time is 1.00x the bound for DimRotation on a healthy torus and 1.13-1.17x
for Line+DimRotation with a failed link, 1.09-1.34x for Pipeline (6 chunks), 2.0-2.2x for
FoldedRing (its two-hop edges are relayed in two sub-steps), 1.2-2.4x for direct and
2.0-3.3x for Bruck (relayed hop by hop); under ``nccl`` and ``msccl`` 1.0-2.8x. A loose bound
only prunes less; it never prunes wrongly.

Rules exist for ``direct``, ``bruck`` and the multi-dimensional torus AllToAll entries
(``ring``, ``halfring``, ``foldedring``, ``line`` with ``pipeline`` or ``dimrotation``). The
others (trees, MATE's shares, hierarchical, switches) get ``None`` and are always evaluated;
so are all candidates on a fabric with spines, where the priced routes are ECMP's hash, not
the algorithm's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from cclc.collective import Collective, CollectiveKind

__all__ = ["RULES", "Estimate", "candidate_bounds", "estimate", "evaluation_order",
           "prune_reason"]


@dataclass(frozen=True, slots=True)
class Estimate:
    """A candidate's load bound: ``time`` (seconds) is a lower bound on its simulated time
    under the model it was computed for; ``link`` the link that sets it."""

    time: float
    link: int


def _bound_of_loads(coll: Collective, load: np.ndarray) -> Estimate | None:
    topo = coll.topology
    used = np.flatnonzero(load > 0)
    if not len(used):
        return None
    t = load[used] / topo.link_bandwidth[used] + topo.link_latency[used]
    k = int(np.argmax(t))
    return Estimate(float(t[k]), int(used[k]))


def _pair_loads(coll: Collective, src: np.ndarray, dst: np.ndarray, nbytes: np.ndarray
                ) -> np.ndarray:
    """Bytes per link when group members ``src`` send ``nbytes`` to ``dst`` over the
    shortest healthy routes the algorithms take (:func:`cclc.algorithms.common.route_table`)."""
    from cclc.algorithms.common import route_table

    topo = coll.topology
    group = np.asarray(coll.group, dtype=np.int64)
    remote = (src != dst) & (nbytes > 0)
    load = np.zeros(topo.n_links)
    if not remote.any():
        return load
    offsets, links = route_table(topo, group[src[remote]], group[dst[remote]])
    per_link = np.repeat(nbytes[remote].astype(np.float64), np.diff(offsets))
    return np.bincount(links, weights=per_link, minlength=topo.n_links)


def _block_bytes(coll: Collective) -> int:
    return (coll.count // coll.n) * coll.dtype.itemsize


def _direct(coll: Collective, params: dict) -> Estimate | None:
    n = coll.n
    src = np.repeat(np.arange(n), n)
    dst = np.tile(np.arange(n), n)
    if coll.pair_sizes is not None:
        nbytes = np.asarray(coll.pair_sizes, dtype=np.int64).ravel()
    else:
        nbytes = np.full(n * n, _block_bytes(coll), dtype=np.int64)
    return _bound_of_loads(coll, _pair_loads(coll, src, dst, nbytes))


def _bruck(coll: Collective, params: dict) -> Estimate | None:
    n = coll.n
    ranks = np.arange(n)
    block = _block_bytes(coll)
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
    return _bound_of_loads(coll, _pair_loads(coll, np.concatenate(src), np.concatenate(dst),
                                             np.concatenate(nbytes)))


def _torus_alltoall(algorithm: str, schedule: str) -> Callable[[Collective, dict], Estimate | None]:
    """The load bound of ``algorithm+schedule`` (:mod:`cclc.algorithms.torus_alltoall`).

    Every phase on dimension ``d`` moves all of a rank's data around its ring of ``d``, by the
    ring plan of that ring (HalfRing, Ring, Line, FoldedRing: the plans and their choice per
    ring are the builder's), so over the whole schedule a ring link carries ``blocks(link) x
    (n / N)`` slots per lane, whatever the pipelining. Slots are cut into ``K`` pieces and
    ``L`` lanes with whole elements; each piece-lane has at least ``floor(e / (K L))``
    elements, which the bound uses (so rounding never makes it exceed the real load).
    """

    def rule(coll: Collective, params: dict) -> Estimate | None:
        from cclc.algorithms.common import torus_link_table
        from cclc.algorithms.torus_alltoall.faults import torus_faults
        from cclc.algorithms.torus_alltoall.ring_plans import (
            MINUS,
            PLUS,
            folded_plan,
            halfring_plan,
            line_plan,
            per_link_blocks,
            ring_plan,
        )

        if coll.pair_sizes is not None:
            return None
        topo = coll.topology
        f = torus_faults(topo)
        active = [d for d, size in enumerate(f.dims) if size > 1]
        if not active:
            return None
        lanes = 2 if algorithm == "ring" or any(
            f.wrap[d] and f.dims[d] % 2 == 0 and f.dims[d] >= 4 for d in active) else 1
        pieces = len(active) if schedule == "dimrotation" else int(params.get("chunks", 6))
        n = coll.n
        e = coll.count // n
        slot_lane_bytes = pieces * (e // (pieces * lanes)) * coll.dtype.itemsize
        table = torus_link_table(topo)
        load = np.zeros(topo.n_links)
        for d in active:
            N, wrap = f.dims[d], f.wrap[d]
            per_block = (n // N) * slot_lane_bytes

            def healthy(lane: int, N: int = N, wrap: bool = wrap):
                if not wrap:
                    return line_plan(N, None)
                make = ring_plan if algorithm == "ring" else halfring_plan
                return make(N, PLUS if lane % 2 == 0 else MINUS)

            rings = f.rings[d]
            for lane in range(lanes):
                plans: dict[object, list[int]] = {}
                for g in range(rings.shape[0]):
                    cut = f.broken[d].get(g)
                    key = ("broken", cut[0]) if cut else "healthy"
                    plans.setdefault(key, []).append(g)
                for key, members in plans.items():
                    if key == "healthy":
                        plan = healthy(lane)
                    else:
                        cut = key[1]
                        plan = folded_plan(N, cut) if algorithm == "foldedring" \
                            else line_plan(N, cut)
                    ring = rings[members]
                    for (pos, direction), blocks in per_link_blocks(plan).items():
                        link = table[ring[:, pos], d, direction]
                        link = link[link >= 0]
                        np.add.at(load, link, blocks * per_block)
        return _bound_of_loads(coll, load)

    return rule


_A2A, _AG, _RS = CollectiveKind.ALLTOALL, CollectiveKind.ALLGATHER, CollectiveKind.REDUCESCATTER

#: load-bound rules by (registry name, collective kind): one name may be registered for
#: several kinds by different modules (``ring+dimrotation`` also serves allreduce); a missing
#: pair has no bound and is always evaluated
RULES: dict[tuple[str, CollectiveKind], Callable[[Collective, dict], Estimate | None]] = {
    **{("direct", k): _direct for k in (_A2A, _AG, _RS)},
    **{("bruck", k): _bruck for k in (_A2A, _AG)},
    **{(f"{a}+{s}", _A2A): _torus_alltoall(a, s)
       for a in ("ring", "halfring", "foldedring", "line")
       for s in ("pipeline", "dimrotation")},
}


def estimate(coll: Collective, name: str, params: dict, call_overhead: float = 0.0
             ) -> Estimate | None:
    """The load bound of registry entry ``name`` serving ``coll`` with hint ``params`` (the
    entry must be applicable), plus the model's per-call cost; ``None`` when there is no
    rule or the topology's routing prices other routes (ECMP on a fabric with spines)."""
    from cclc.fabric_routing import has_spines

    rule = RULES.get((name, coll.kind))
    if rule is None or has_spines(coll.topology):
        return None
    est = rule(coll, params)
    if est is None:
        return None
    return Estimate(est.time + call_overhead, est.link)


def prune_reason(est: Estimate | None, best_time: float | None, best_name: str | None
                 ) -> str | None:
    """Why a candidate with bound ``est`` cannot beat the simulated ``best_time``, or
    ``None`` when it might (it is then built and simulated)."""
    if est is None or best_time is None or not est.time > best_time:
        return None
    return f"its load bound is above {best_name}'s simulated time: it cannot win"


def candidate_bounds(coll: Collective, algos, params: dict, model) -> list[Estimate | None]:
    """:func:`estimate` of every applicable entry of ``algos`` under execution ``model``
    (``None`` for the others)."""
    return [estimate(coll, a.name, params, model.call_overhead)
            if a.applicable(coll, **params) is None else None for a in algos]


def evaluation_order(bounds: list[Estimate | None]) -> list[int]:
    """Indices in the order ``auto`` evaluates them: candidates without a bound first (any of
    them may be the fastest), then by increasing bound, registration order among equals."""
    return sorted(range(len(bounds)),
                  key=lambda i: (bounds[i] is not None,
                                 bounds[i].time if bounds[i] is not None else 0.0, i))
