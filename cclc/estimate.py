"""Cheap lower bounds per candidate, so that ``auto`` builds only the candidates that can win.

Building, verifying and simulating a candidate costs seconds at hundreds of ranks; its *link
traffic* costs milliseconds: it follows from the topology, the size and the algorithm's routes
alone, without a schedule. A rule gives a candidate's bytes per (step, link), with the steps
the schedule has before relay lowering (:mod:`cclc.relay`), and two bounds follow from it.

**Load bound** (every execution model). Every model of :mod:`cclc.execution` serves the bytes
of one link one after another at the link's bandwidth (lockstep: a step lasts at least its
busiest link's busy time plus that link's latency, and the steps add up; event and dataflow:
a link serves its ops first come, first served), so for every link ``l``::

    time >= bytes(l) / bandwidth(l) + latency(l)      (+ the model's per-call cost)

**Step bound** (lockstep models: ``ir`` and ``nccl-lockstep``). Steps run one after another,
and relay lowering only cuts a step into sub-steps (every relayed chain ends in the step's
last sub-step, where the ops the routing carries stay). So each step ``s`` costs at least::

    max_l busy(s, l) + latency(l)                                   (its busiest link)
    max_l early(s, l) + latency(l)  +  max_l carried(s, l) + latency(l)

where ``early`` are the bytes of relayed hops before a chain's last segment (sub-steps before
the last) and ``carried`` those of ops the routing carries (the last sub-step); the step bound
is the sum over steps of the larger, plus the per-step cost of the steps that must exist. It
sees what the load bound cannot: a lockstep step waits for its slowest ring, and MATE's
relayed detours cannot overlap the normal traffic of their step. For ``direct`` on a GPU torus
(routing ``none``) the rule lays out the relayed hops in their sub-steps themselves (one chunk
per op: hop ``k`` of a chain of ``h`` hops in sub-step ``L - h + k``), so the bound is the
lockstep time itself.

Both are true lower bounds on the simulated time, not estimates with an error: ``auto``
evaluates the candidates in order of their bounds and skips one whose bound is already above
the time of a simulated candidate, which therefore never changes the choice
(``tests/plan/test_estimate.py`` and ``tests/plan/test_step_bounds.py`` check the bounds
against simulation under every model and routing, the traffic against the built schedules, and
pruned ``auto`` against unpruned ``auto``). A bound within rounding (1e-9) of the best time
does not prune: exact bounds are summed in another order than the simulator sums.

How tight (bandwidth-bound sizes, GPU tori, routing ``none``; the tests pin the healthy
figures): the load bound is within 1% for DimRotation on a healthy torus, 1.09-1.34x below
Pipeline (6 chunks), 2.0-2.2x below FoldedRing, 1.2-2.4x below direct and 2.0-3.3x below Bruck
(relayed hop by hop). Under the ``ir`` model the step bound is the simulated time of Line and
HalfRing with either schedule and of direct; on the 8x8x8 torus with one failed link MATE's
simulated time is 1.09x its step bound and MATEe's 1.05x.

Rules exist for ``direct``, ``bruck``, the multi-dimensional torus AllToAll entries (``ring``,
``halfring``, ``foldedring``, ``line`` with ``pipeline`` or ``dimrotation``), ``mate`` and
``matee``. The others (trees, hierarchical, switches, synthesis) get ``None`` and are always
evaluated; so are all candidates on a fabric with spines, where the priced routes are ECMP's
hash, not the algorithm's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from cclc.collective import Collective, CollectiveKind
from cclc.link_traffic import CARRIED, EARLY, LATE, Traffic

__all__ = ["RULES", "Estimate", "candidate_bounds", "estimate", "evaluation_order",
           "lower_bound", "prune_reason", "step_bound", "traffic"]


@dataclass(frozen=True, slots=True)
class Estimate:
    """A candidate's lower bound: ``time`` (seconds) is a lower bound on its simulated time
    under the model it was computed for; ``link`` the busiest link; ``what`` names the bound
    (``"load bound"`` or ``"lockstep step bound"``)."""

    time: float
    link: int
    what: str = "load bound"


def _traffic(steps, links, nbytes, roles=None) -> Traffic:
    links = np.asarray(links, dtype=np.int64)
    return Traffic(np.broadcast_to(np.asarray(steps, dtype=np.int64), links.shape),
                   links,
                   np.broadcast_to(np.asarray(LATE if roles is None else roles, dtype=np.int8),
                                   links.shape),
                   np.asarray(nbytes, dtype=np.float64))


def _bound_of_loads(coll: Collective, load: np.ndarray) -> Estimate | None:
    topo = coll.topology
    used = np.flatnonzero(load > 0)
    if not len(used):
        return None
    t = load[used] / topo.link_bandwidth[used] + topo.link_latency[used]
    k = int(np.argmax(t))
    return Estimate(float(t[k]), int(used[k]))


def _pair_traffic(coll: Collective, src: np.ndarray, dst: np.ndarray, nbytes: np.ndarray,
                  one_chunk_ops: bool = False) -> Traffic:
    """The traffic of one step in which group members ``src`` send ``nbytes`` to ``dst``
    over the shortest healthy routes the algorithms take
    (:func:`cclc.algorithms.common.route_table`).

    ``one_chunk_ops``: every pair is one op of one chunk, so on a plain torus with routing
    ``none`` relay lowering puts hop ``k`` of a chain of ``h`` links in sub-step ``L - h + k``
    of the step (``L`` the longest chain): the traffic is laid out in those sub-steps.
    """
    from cclc.algorithms.common import route_table, topo_is_plain_torus
    from cclc.ir import Routes
    from cclc.routing import carried_routes

    topo = coll.topology
    group = np.asarray(coll.group, dtype=np.int64)
    remote = (src != dst) & (nbytes > 0)
    if not remote.any():
        return _traffic(0, [], [])
    offsets, links = route_table(topo, group[src[remote]], group[dst[remote]])
    offsets = np.asarray(offsets, dtype=np.int64)
    hops = np.diff(offsets)
    op = np.repeat(np.arange(len(hops)), hops)
    k = np.arange(len(links)) - offsets[op]
    per_link = np.repeat(nbytes[remote].astype(np.float64), hops)
    if one_chunk_ops and topo.routing == "none" and topo_is_plain_torus(topo):
        sub = int(hops.max()) - hops[op] + k
        return _traffic(sub, links, per_link, CARRIED)
    carried = carried_routes(topo, Routes(np.concatenate([[0], offsets]), links))[1:]
    role = np.where(k == 0, EARLY, LATE)
    if topo.routing == "none":
        role = np.where(k < hops[op] - 1, EARLY, LATE)
    return _traffic(0, links, per_link, np.where(carried[op], CARRIED, role))


def _block_bytes(coll: Collective) -> int:
    return (coll.count // coll.n) * coll.dtype.itemsize


def _direct(coll: Collective, params: dict) -> Traffic | None:
    n = coll.n
    src = np.repeat(np.arange(n), n)
    dst = np.tile(np.arange(n), n)
    if coll.pair_sizes is not None:
        nbytes = np.asarray(coll.pair_sizes, dtype=np.int64).ravel()
    else:
        nbytes = np.full(n * n, _block_bytes(coll), dtype=np.int64)
    # direct's network ops are one chunk each, all in step 0
    return _pair_traffic(coll, src, dst, nbytes, one_chunk_ops=True)


def _bruck(coll: Collective, params: dict) -> Traffic | None:
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
    t = _pair_traffic(coll, np.concatenate(src), np.concatenate(dst), np.concatenate(nbytes))
    # the rounds' steps are the builder's: one step of everything is all this rule claims
    return _traffic(0, t.link, t.nbytes)


def _torus_alltoall(algorithm: str, schedule: str) -> Callable[[Collective, dict],
                                                                 Traffic | None]:
    """The traffic of ``algorithm+schedule`` (or MATE / MATEe) of
    :mod:`cclc.algorithms.torus_alltoall`, from the layout the builder lowers
    (:func:`~cclc.algorithms.torus_alltoall.traffic.layout_traffic`)."""

    def rule(coll: Collective, params: dict) -> Traffic | None:
        from cclc.algorithms.torus_alltoall.mate import mate_layout
        from cclc.algorithms.torus_alltoall.strategies import ring_layout
        from cclc.algorithms.torus_alltoall.traffic import layout_traffic

        if coll.pair_sizes is not None:
            return None
        if schedule in ("mate", "matee"):
            lay = mate_layout(coll, schedule == "matee", params)
        else:
            lay = ring_layout(coll, algorithm, schedule, params)
        if not lay.groups:
            return None
        t = layout_traffic(coll, lay)
        # a plan over a missing link: the builder refuses it, there is nothing to bound
        return None if (t.link < 0).any() else t

    return rule


_A2A, _AG, _RS = CollectiveKind.ALLTOALL, CollectiveKind.ALLGATHER, CollectiveKind.REDUCESCATTER

#: traffic rules by (registry name, collective kind): one name may be registered for
#: several kinds by different modules (``ring+dimrotation`` also serves allreduce); a missing
#: pair has no bound and is always evaluated
RULES: dict[tuple[str, CollectiveKind], Callable[[Collective, dict], Traffic | None]] = {
    **{("direct", k): _direct for k in (_A2A, _AG, _RS)},
    **{("bruck", k): _bruck for k in (_A2A, _AG)},
    **{(f"{a}+{s}", _A2A): _torus_alltoall(a, s)
       for a in ("ring", "halfring", "foldedring", "line")
       for s in ("pipeline", "dimrotation")},
    ("mate", _A2A): _torus_alltoall("halfring", "mate"),
    ("matee", _A2A): _torus_alltoall("halfring", "matee"),
}


def traffic(coll: Collective, name: str, params: dict) -> Traffic | None:
    """The traffic of registry entry ``name`` serving ``coll`` with hint ``params`` (the
    entry must be applicable); ``None`` when there is no rule or the topology's routing
    prices other routes (ECMP on a fabric with spines)."""
    from cclc.fabric_routing import has_spines

    rule = RULES.get((name, coll.kind))
    if rule is None or has_spines(coll.topology):
        return None
    return rule(coll, params)


def _load_bound(coll: Collective, t: Traffic) -> Estimate | None:
    load = np.bincount(t.link, weights=t.nbytes, minlength=coll.topology.n_links)
    return _bound_of_loads(coll, load)


def step_bound(coll: Collective, t: Traffic, step_overhead: float = 0.0) -> float:
    """The lockstep step bound of traffic ``t`` (see the module docstring), seconds."""
    topo = coll.topology
    live = t.nbytes > 0
    if not live.any():
        return 0.0
    n_links = topo.n_links
    # dense (step, link) cells over the steps that carry traffic: bincounts, no sort
    step = t.step[live]
    used = np.flatnonzero(np.bincount(step))
    index_of = np.zeros(int(step.max()) + 1, dtype=np.int64)
    index_of[used] = np.arange(len(used))
    cell = index_of[step] * n_links + t.link[live]
    n_cells = len(used) * n_links
    nbytes, role = t.nbytes[live], t.role[live]
    bandwidth = np.tile(topo.link_bandwidth, len(used))
    latency = np.tile(topo.link_latency, len(used))

    def per_step(mask: np.ndarray | None) -> np.ndarray:
        """max over links of busy + latency in every step (0 where nothing is selected)."""
        w = nbytes if mask is None else np.where(mask, nbytes, 0.0)
        busy = np.bincount(cell, weights=w, minlength=n_cells)
        cost = np.where(busy > 0, busy / bandwidth + latency, 0.0)
        return cost.reshape(len(used), n_links).max(axis=1)

    whole = per_step(None)
    early = per_step(role == EARLY)
    carried = per_step(role == CARRIED)
    split = np.where((early > 0) & (carried > 0), early + carried, 0.0)
    # a step with relayed chains has at least two sub-steps, each paying the step cost
    n_sub = len(used) + int((early > 0).sum())
    return float(np.maximum(whole, split).sum()) + step_overhead * n_sub


def estimate(coll: Collective, name: str, params: dict, call_overhead: float = 0.0
             ) -> Estimate | None:
    """The load bound of registry entry ``name`` serving ``coll`` with hint ``params`` (the
    entry must be applicable), plus the model's per-call cost; ``None`` when there is no
    rule or the topology's routing prices other routes (ECMP on a fabric with spines)."""
    t = traffic(coll, name, params)
    est = None if t is None else _load_bound(coll, t)
    if est is None:
        return None
    return Estimate(est.time + call_overhead, est.link)


def lower_bound(coll: Collective, name: str, params: dict, model) -> Estimate | None:
    """The best lower bound of entry ``name`` under execution ``model``
    (:class:`cclc.execution.ExecutionModel`): the load bound, and for a lockstep model the
    step bound when it is higher."""
    t = traffic(coll, name, params)
    est = None if t is None else _load_bound(coll, t)
    if est is None:
        return None
    best = Estimate(est.time + model.call_overhead, est.link)
    if model.mode == "lockstep":
        steps = step_bound(coll, t, model.step_overhead) + model.call_overhead
        if steps > best.time:
            best = Estimate(steps, est.link, "lockstep step bound")
    return best


#: relative margin of :func:`prune_reason` (float rounding of sums of ~1e3 terms is ~1e-13)
_ROUNDING = 1e-9


def prune_reason(est: Estimate | None, best_time: float | None, best_name: str | None
                 ) -> str | None:
    """Why a candidate with bound ``est`` cannot beat the simulated ``best_time``, or
    ``None`` when it might (it is then built and simulated)."""
    # a bound that is exact (single-hop lockstep schedules) is summed in another order than
    # the simulator sums the same time: within rounding of a tie it must not prune, or a tie
    # that registration order breaks could go the other way
    if est is None or best_time is None or not est.time > best_time * (1 + _ROUNDING):
        return None
    return f"its {est.what} is above {best_name}'s simulated time: it cannot win"


def candidate_bounds(coll: Collective, algos, params: dict, model) -> list[Estimate | None]:
    """:func:`lower_bound` of every applicable entry of ``algos`` under execution ``model``
    (``None`` for the others)."""
    return [lower_bound(coll, a.name, params, model)
            if a.applicable(coll, **params) is None else None for a in algos]


def evaluation_order(bounds: list[Estimate | None]) -> list[int]:
    """Indices in the order ``auto`` evaluates them: candidates without a bound first (any of
    them may be the fastest), then by increasing bound, registration order among equals."""
    return sorted(range(len(bounds)),
                  key=lambda i: (bounds[i] is not None,
                                 bounds[i].time if bounds[i] is not None else 0.0, i))
