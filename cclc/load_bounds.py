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

**Step bound** (lockstep models: ``ir``, ``nccl-lockstep`` and ``mscclpp``). Steps run one
after another, and relay lowering only cuts a step into sub-steps (every relayed chain ends in
the step's last sub-step, where the ops the routing carries stay). So each step ``s`` costs at
least::

    max_l busy(s, l) + latency(l)                                   (its busiest link)
    max_l early(s, l) + latency(l)  +  max_l carried(s, l) + latency(l)

where ``early`` are the bytes of relayed hops before a chain's last segment (sub-steps before
the last) and ``carried`` those of ops the routing carries (the last sub-step); the step bound
is the sum over steps of the larger, plus the per-step cost of the steps that must exist:
the steps (and relayed sub-steps) that carry link traffic, each holding an op between two
ranks, so each pays it whether the model charges every step or only those with such an op
(``mscclpp``, :attr:`cclc.execution.ExecutionModel.overhead_steps`). It sees what the load
bound cannot: a lockstep step waits for its slowest ring, and MATE's relayed detours cannot
overlap the normal traffic of their step. For ``direct`` on a GPU torus
(routing ``none``) the rule lays out the relayed hops in their sub-steps themselves (one chunk
per op: hop ``k`` of a chain of ``h`` hops in sub-step ``L - h + k``), so the bound is the
lockstep time itself.

Both are true lower bounds on the simulated time, not estimates with an error: ``auto``
evaluates the candidates in order of their bounds and skips one whose bound is already above
the time of a simulated candidate, which therefore never changes the choice
(``tests/plan/test_load_bounds.py`` and ``tests/plan/test_step_bounds.py`` check the bounds
against simulation under every model and routing, the traffic against the built schedules, and
pruned ``auto`` against unpruned ``auto``). A bound within rounding (1e-9) of the best time
does not prune: exact bounds are summed in another order than the simulator sums.

How tight (bandwidth-bound sizes, GPU tori, routing ``none``; the tests pin the healthy
figures): the load bound is within 1% for DimRotation on a healthy torus, 1.09-1.34x below
Pipeline (6 chunks), 2.0-2.2x below FoldedRing, 1.2-2.4x below direct and 2.0-3.3x below Bruck
(relayed hop by hop). Under the ``ir`` model the step bound is the simulated time of Line and
HalfRing with either schedule and of direct; on the 8x8x8 torus with one failed link MATE's
simulated time is 1.09x its step bound and MATEe's 1.05x.

The traffic is each algorithm entry's own ``load`` rule (:attr:`cclc.algorithms.Algorithm.load`):
``direct``, ``bruck``, the multi-dimensional torus AllToAll entries (``ring``, ``halfring``,
``foldedring``, ``line`` with ``pipeline`` or ``dimrotation``), ``mate`` and ``matee`` have one.
Where an entry has no traffic rule, or on a fabric with spines (the priced routes are ECMP's
hash, not the algorithm's), its bound is the send bound of :mod:`cclc.send_bounds`: from what
its members send in each step (the entry's ``sends`` rule), over cuts every route crosses, so
it holds whatever the routes. The others (trees, hierarchical, switches, synthesis,
rail_halving, the torus rings other than biring) state a :class:`~cclc.algorithms.NoBound`
with its reason, which the planner reports beside the candidate, and are always evaluated
(first: any of them may be fastest).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from cclc.algorithms import Algorithm, NoBound
from cclc.collective import Collective
from cclc.fabric_routing import has_spines
from cclc.link_traffic import CARRIED, EARLY, Traffic
from cclc.send_bounds import send_bound

__all__ = ["LoadBound", "candidate_bounds", "evaluation_order", "load_bound", "lower_bound",
           "prune_reason", "step_bound", "traffic"]


@dataclass(frozen=True, slots=True)
class LoadBound:
    """A candidate's lower bound: ``time`` (seconds) is a lower bound on its simulated time
    under the model it was computed for; ``link`` the busiest link (``None`` for a bound
    from what the members send, which knows no links); ``what`` names the bound
    (``"load bound"``, ``"lockstep step bound"`` or ``"send bound"``)."""

    time: float
    link: int | None
    what: str = "load bound"


def traffic(coll: Collective, entry: Algorithm, params: dict) -> Traffic | NoBound:
    """The traffic of registry ``entry`` serving ``coll`` with hint ``params`` (the entry
    must be applicable), or why there is none: the entry says so, or the topology's routing
    prices other routes (ECMP on a fabric with spines)."""
    if has_spines(coll.topology):
        return NoBound("ECMP on a fabric with spines prices other routes than the algorithm's")
    return entry.traffic(coll, **params)


def _bound_of_loads(coll: Collective, load: np.ndarray) -> LoadBound | NoBound:
    topo = coll.topology
    used = np.flatnonzero(load > 0)
    if not len(used):
        return NoBound("its schedule puts nothing on a link")
    t = load[used] / topo.link_bandwidth[used] + topo.link_latency[used]
    k = int(np.argmax(t))
    return LoadBound(float(t[k]), int(used[k]))


def _load_bound(coll: Collective, t: Traffic) -> LoadBound | NoBound:
    load = np.bincount(t.link, weights=t.nbytes, minlength=coll.topology.n_links)
    return _bound_of_loads(coll, load)


def step_bound(coll: Collective, t: Traffic, step_overhead: float = 0.0) -> float:
    """The lockstep step bound of traffic ``t`` (see the module docstring), seconds.

    ``step_overhead`` is charged once per step (and relayed sub-step) that carries link
    traffic: such a step holds an op between two ranks, so it pays the cost under either
    :attr:`cclc.execution.ExecutionModel.overhead_steps`, and the steps of local ops alone,
    which a ``"peer"`` model does not charge, are not counted."""
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


def load_bound(coll: Collective, entry: Algorithm, params: dict, call_overhead: float = 0.0
               ) -> LoadBound | NoBound:
    """The load bound of registry ``entry`` serving ``coll`` with hint ``params`` (the entry
    must be applicable), plus the model's per-call cost; or why there is none
    (:func:`traffic`)."""
    t = traffic(coll, entry, params)
    est = t if isinstance(t, NoBound) else _load_bound(coll, t)
    if isinstance(est, NoBound):
        return est
    return LoadBound(est.time + call_overhead, est.link)


def lower_bound(coll: Collective, entry: Algorithm, params: dict, model) -> LoadBound | NoBound:
    """The best lower bound of ``entry`` under execution ``model``
    (:class:`cclc.execution.ExecutionModel`): the load bound, and for a lockstep model the
    step bound when it is higher; where the entry has no traffic here (or its routes are not
    the ones priced: a fabric with spines), the bound of what its members send
    (:mod:`cclc.send_bounds`), which holds whatever the routes; or why there is none."""
    t = traffic(coll, entry, params)
    est = t if isinstance(t, NoBound) else _load_bound(coll, t)
    if isinstance(est, NoBound):
        return _send_bound(coll, entry, params, model, est)
    assert isinstance(t, Traffic)
    best = LoadBound(est.time + model.call_overhead, est.link)
    if model.mode == "lockstep":
        steps = step_bound(coll, t, model.step_overhead) + model.call_overhead
        if steps > best.time:
            best = LoadBound(steps, est.link, "lockstep step bound")
    return best


def _send_bound(coll: Collective, entry: Algorithm, params: dict, model, why: NoBound
                ) -> LoadBound | NoBound:
    """The bound of what ``entry``'s members send, or ``why`` there is no link-traffic bound
    with the reason there is no send rule either."""
    steps = entry.step_sends(coll, **params)
    if isinstance(steps, NoBound):
        return NoBound(f"{why.reason}; {steps.reason}")
    found = send_bound(coll, steps, model)
    if found.seconds <= 0:
        return NoBound(f"{why.reason}; its members send nothing across a cut")
    return LoadBound(found.seconds, None,
                     f"send bound (bytes across a {found.cut}'s links, whatever the routes)")


#: relative margin of :func:`prune_reason` (float rounding of sums of ~1e3 terms is ~1e-13)
_ROUNDING = 1e-9


def prune_reason(est: LoadBound | NoBound | None, best_time: float | None,
                 best_name: str | None) -> str | None:
    """Why a candidate with bound ``est`` cannot beat the simulated ``best_time``, or
    ``None`` when it might (it is then built and simulated); one without a bound
    (``NoBound`` or ``None``) always might."""
    # a bound that is exact (single-hop lockstep schedules) is summed in another order than
    # the simulator sums the same time: within rounding of a tie it must not prune, or a tie
    # that registration order breaks could go the other way
    if not isinstance(est, LoadBound) or best_time is None \
            or not est.time > best_time * (1 + _ROUNDING):
        return None
    return f"its {est.what} is above {best_name}'s simulated time: it cannot win"


def candidate_bounds(coll: Collective, algos: list[Algorithm], params: dict, model
                     ) -> list[LoadBound | NoBound | None]:
    """:func:`lower_bound` of every applicable entry of ``algos`` under execution ``model``
    (``None`` for the others)."""
    return [lower_bound(coll, a, params, model)
            if a.applicable(coll, **params) is None else None for a in algos]


def evaluation_order(bounds: Sequence[LoadBound | NoBound | None],
                     synthesizes: Sequence[bool] | None = None) -> list[int]:
    """Indices in the order ``auto`` evaluates them: candidates without a bound first (any of
    them may be the fastest), then by increasing bound, registration order among equals; among
    those without a bound, the ones that ``synthesizes`` (seconds where a template takes
    milliseconds) after the others, so they know the time to beat
    (:attr:`cclc.algorithms.BuildContext.beat`)."""
    late = synthesizes if synthesizes is not None else [False] * len(bounds)

    def key(i: int) -> tuple[bool, bool, float, int]:
        b = bounds[i]
        if isinstance(b, LoadBound):
            return (True, False, b.time, i)
        return (False, late[i], 0.0, i)

    return sorted(range(len(bounds)), key=key)
