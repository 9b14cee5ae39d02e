"""A lower bound on an AllGather's, ReduceScatter's or AllReduce's time in the IR's lockstep
model, on a machine made of nodes.

The bounds of :mod:`cclc.bounds` count bandwidth only, and hold in every execution model. In
the lockstep model (:mod:`cclc.sim`) every step lasts at least its slowest op, the op's route
latency plus the busiest link on its route, and data received in a step is forwarded in a
later one. On a machine made of nodes (servers of GPUs behind NICs) that costs a pipeline its
fill and drain: every byte that enters a node reaches the node's other GPUs a step later at
the earliest. This module bounds it, per node ``p`` of the group, by an LP over the steps:

* ``x_t``: bytes that cross into ``p`` in step ``t`` (over the links into ``p``'s vertices,
  total capacity ``C_in``), ``a_t <= x_t`` of them new to ``p``, ``sum a = F`` (the blocks of
  the members outside ``p``, which every member in ``p`` needs);
* ``D_t``: the members of ``p``'s first receipts of foreign bytes, ``L_t`` of their own node's
  bytes (over the links into the members, total capacity ``C_gpu``): ``sum D = G F``,
  ``sum L = G (G - 1) b`` for ``G`` members in ``p`` and blocks of ``b`` bytes;
* causality: up to step ``t``, ``sum D <= sum x + (G - 1) sum_{s < t} a_s`` (a byte present
  in ``p`` reaches each of the other members at most once, and only from a step after it
  entered);
* a step in which bytes cross into ``p`` lasts at least ``alpha_in + x_t / C_in``, and every
  step that delivers at least ``alpha_gpu + (D_t + L_t) / C_gpu`` (``alpha``: the least
  latency of a route that ends on such a link, from any member).

Any lockstep schedule gives a solution: a step in which nothing crosses into ``p`` merges
into the step after it (the merged step is no longer than both together, and no byte becomes
available earlier), so its steps are ``K`` that cross into ``p`` and at most one after them.
The bound is the least over ``K`` of the LP's value (``K`` stops where ``K alpha_in + F /
C_in`` alone exceeds the best found; past :data:`MAX_STEPS` that sum stands for every deeper
``K``), the most over the nodes. Where a step that crosses into
a node could deliver nothing to it (``alpha_gpu > alpha_in``) the argument does not hold and
no bound is given.

ReduceScatter is the same count on the reversed links: reverse a lockstep ReduceScatter's
steps and its ops' directions, and a member's contribution reaches a root exactly when, in
the reversed schedule, the root's block reaches the member over steps in order; every op
crosses the reverse of its links with the same bytes, so every step lasts as long as before.
The reversed schedule is an AllGather's flow of information on the reversed machine.

AllReduce counts information, not blocks: every member of ``p`` needs, for each of the
collective's ``S`` bytes, a receipt that carries the contribution of the members outside ``p``
(its own input has none of it), so ``F = S`` bytes must be new to ``p`` and every member's
first such receipts total ``G S``; the same causality holds (a byte of foreign information
present in ``p`` reaches each other member at most once first). What members need of each
other may ride in those same receipts, so ``L = 0``. Every member outside ``p`` needs ``p``'s
contribution the same way, which is the same count on the reversed links (as for
ReduceScatter: a reversed AllReduce is an AllReduce's flow of information); the bound is the
larger of the two.

Alike nodes (an AllReduce's group spread evenly over nodes of one kind) also get a count of
both ends of every element at once, averaged over the ``P`` nodes of ``G`` members each (a
step lasts at least as long as its busiest node needs, so at least as long as the average
node needs). Call a step that moves bytes between nodes a crossing step (``K`` of them, at
least ``alpha_in`` each, plus their bytes into a node over ``C_in``) and merge the steps
between two crossing steps into one (they move no byte between nodes; together they last at
least their receipts over ``C_gpu``). For one element (a byte of the collective), take the
crossing step ``t`` at which some node first holds every member's contribution in its
members together, and count that element's messages, each at least one receipt into a
member and each crossing at least one byte into a node:

* before: the ``n - G`` contributions from outside that node each leave their own node for
  the first time on a crossing at step ``t`` or before, which carries at most ``G`` of them;
  by crossing step ``k`` at most the crossings so far plus the receipts inside nodes before
  step ``k`` (the members a contribution passed through before leaving are joined by those
  receipts, and a component of ``m`` receipts spans at most ``m + 1`` members); at least
  ``P - 1`` crossings (a tree over the nodes) bring them there;
* after: every other node first holds every contribution on a crossing into it at step ``t``
  or later (a receipt from its own node adds nothing its members did not hold), at least
  ``P - 1`` crossings; each of the ``n`` members completes on a receipt of its own, never
  before its node completes: a crossing into it there or later, or a receipt from its own
  node in a step after that crossing step (at most ``G`` members of a node complete on the
  crossings that complete the node, the others on own-node receipts).

Summed over the elements by their ``t`` (an LP per ``K``, :func:`_joint_lp`), every lockstep
AllReduce is a solution, so the least over ``K`` bounds it: what the per-node counts above
leave free, the own-node sums before the first crossings and the own-node copies after the
last, are paid here.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
from scipy.sparse.csgraph import dijkstra

from cclc.bounds import Bound, latency_graph, vertex_nodes
from cclc.collective import Collective, CollectiveKind
from cclc.group_links import group_links

__all__ = ["lockstep_bound"]


def lockstep_bound(coll: Collective) -> Bound | None:
    """The lockstep lower bound of AllGather, ReduceScatter or AllReduce ``coll`` (see the
    module docstring), or ``None`` where it does not apply: another collective, a machine not
    made of nodes, a group in one node, or a node whose members' links are slower to reach than
    its own."""
    found = [count for reverse in _DIRECTIONS.get(coll.kind, ())
             if (count := _node_count(coll, reverse)) is not None]
    if not found:
        return None
    seconds, where, reverse = max(found, key=lambda f: f[0])    # (ties: the first)
    if not where:
        how = ("of every node (alike nodes, on average): what crosses between nodes was summed "
               "in its node a step earlier and reaches the other GPUs a step later"
               + (", on the reversed links" if reverse else ""))
    elif reverse:
        how = f"out of node {where}: what leaves was summed from its other GPUs a step earlier"
    else:
        how = f"into node {where}: what enters reaches its other GPUs a step later"
    return Bound("lockstep", seconds, f"lockstep steps {how}, and each step pays a route's "
                                      "latency")


#: per collective, the directions the count runs in: on the machine's links (``False``), on
#: the reversed links (``True``); each is a bound alone, AllReduce takes the larger
_DIRECTIONS = {CollectiveKind.ALLGATHER: (False,), CollectiveKind.REDUCESCATTER: (True,),
               CollectiveKind.ALLREDUCE: (False, True)}


def _node_count(coll: Collective, reverse: bool) -> tuple[float, str, bool] | None:
    """The most over the group's nodes of :func:`_node_bound` (on the reversed links with
    ``reverse``), with the node it is at; ``None`` where the count does not apply."""
    topo = coll.topology
    if topo.node_of_rank is None:
        return None
    group = np.asarray(coll.group, dtype=np.int64)
    vnode = vertex_nodes(topo)
    nodes = np.unique(vnode[group])
    if len(nodes) < 2:
        return None
    ok = group_links(topo, group)
    src, dst = topo.link_src[ok].astype(np.int64), topo.link_dst[ok].astype(np.int64)
    if reverse:
        src, dst = dst, src                               # the reversed schedule's links
    bw, lat = topo.link_bandwidth[ok], topo.link_latency[ok]
    reach = _least_latency_from(group, src, dst, lat, topo.n_vertices)
    block = float(coll.size) / coll.n
    counts = []                           # per node: its name and its LP's parameters
    for p in nodes.tolist():
        members = group[vnode[group] == p]
        into_p = (vnode[dst] == p) & (vnode[src] != p)
        into_gpu = np.isin(dst, members)
        if not into_p.any() or not into_gpu.any():
            return None
        alpha_in = float((reach[src[into_p]] + lat[into_p]).min())
        alpha_gpu = float((reach[src[into_gpu]] + lat[into_gpu]).min())
        if alpha_gpu > alpha_in:
            return None
        G = len(members)
        if coll.kind is CollectiveKind.ALLREDUCE:
            foreign, local = float(coll.size), 0.0
        else:
            foreign, local = block * (coll.n - G), G * (G - 1) * block
        counts.append((topo.vertex_names[int(members[0])].split(".")[0],
                       (G, foreign, local, float(bw[into_p].sum()), float(bw[into_gpu].sum()),
                        alpha_in, alpha_gpu)))
    entering: float | None = None
    if coll.kind is CollectiveKind.ALLREDUCE and len({key for _, key in counts}) == 1:
        entering = 2 * (len(nodes) - 1) * float(coll.size) / len(nodes)
    best, where = 0.0, ""
    solved: dict[tuple, float] = {}       # alike nodes (one per server type): one LP search
    for name, key in counts:
        if key not in solved:
            solved[key] = _node_bound(*key, entering=entering)
        if solved[key] > best:
            best, where = solved[key], name
    if entering is not None:
        G, size, _, c_in, c_gpu, alpha_in, alpha_gpu = counts[0][1]
        joint = _joint_bound(G, len(nodes), size, c_in, c_gpu, alpha_in, alpha_gpu)
        if joint > best:
            best, where = joint, ""           # (no one node: the average over them all)
    return best, where, reverse


def _least_latency_from(group: np.ndarray, src, dst, lat, n_vertices: int) -> np.ndarray:
    """Per vertex: the least latency of a path to it from any member (0 at the members)."""
    return dijkstra(latency_graph(src, dst, lat, n_vertices), directed=True, indices=group,
                    min_only=True)


def _node_bound(G: int, foreign: float, local: float, c_in: float, c_gpu: float,
                alpha_in: float, alpha_gpu: float, entering: float | None = None) -> float:
    """The least over ``K`` of :func:`_steps_lp` (see the module docstring): ``K`` up to
    :data:`MAX_STEPS`, past which ``K alpha_in + F / C_in`` stands for every deeper one. The
    LP's optimum is taken 1e-6 lower (the solver's tolerance)."""
    best = np.inf
    K = 1
    entering = foreign if entering is None else max(entering, foreign)
    while K * alpha_in + entering / c_in < best:
        if K > MAX_STEPS:
            best = K * alpha_in + entering / c_in
            break
        for drain in (False, True):
            best = min(best, _steps_lp(K, drain, G, foreign, local, c_in, c_gpu, alpha_in,
                                       alpha_gpu, entering) * (1 - 1e-6))
        K += 1
    return float(best)


#: the most steps into a node solved for (beyond, the steps' latency alone bounds them)
MAX_STEPS = 48


def _steps_lp(K: int, drain: bool, G: int, foreign: float, local: float, c_in: float,
              c_gpu: float, alpha_in: float, alpha_gpu: float, entering: float) -> float:
    """The least time of ``K`` steps that cross into the node and, with ``drain``, one step
    after them (microseconds inside, to keep the LP well scaled)."""
    # OR-Tools (0.1-0.4 s to import) only when this model is solved
    from ortools.linear_solver import pywraplp

    us, MB = 1e6, 1e-6            # seconds -> us, bytes -> MB: rates in MB/us
    solver = pywraplp.Solver.CreateSolver("GLOP")
    inf = solver.infinity()
    steps = K + int(drain)
    d = [solver.NumVar(0, inf, f"d{t}") for t in range(steps)]
    x = [solver.NumVar(0, inf, f"x{t}") for t in range(K)]
    a = [solver.NumVar(0, inf, f"a{t}") for t in range(K)]
    D = [solver.NumVar(0, inf, f"D{t}") for t in range(steps)]
    L = [solver.NumVar(0, inf, f"L{t}") for t in range(steps)]
    rate_in, rate_gpu = c_in * MB / us, c_gpu * MB / us
    for t in range(steps):
        if t < K:
            solver.Add(d[t] >= alpha_in * us + x[t] * (1 / rate_in))
            solver.Add(a[t] <= x[t])
        solver.Add(d[t] >= alpha_gpu * us + (D[t] + L[t]) * (1 / rate_gpu))
        entered = solver.Sum(x[:min(t + 1, K)])
        before = solver.Sum(a[:min(t, K)]) if t else 0
        solver.Add(solver.Sum(D[:t + 1]) <= entered + (G - 1) * before)
    solver.Add(solver.Sum(a) == foreign * MB)
    solver.Add(solver.Sum(x) >= entering * MB)
    solver.Add(solver.Sum(D) == G * foreign * MB)
    solver.Add(solver.Sum(L) == local * MB)
    solver.Minimize(solver.Sum(d))
    if solver.Solve() != pywraplp.Solver.OPTIMAL:
        return np.inf
    return solver.Objective().Value() / us


@functools.lru_cache(maxsize=64)
def _joint_bound(G: int, P: int, size: float, c_in: float, c_gpu: float, alpha_in: float,
                 alpha_gpu: float) -> float:
    """The AllReduce count over ``P`` alike nodes of ``G`` members each, both ends of every
    element's crossings at once (module docstring, "Alike nodes"): the least over ``K``
    crossing steps of :func:`_joint_lp`, ``K`` up to :data:`MAX_JOINT_STEPS`, past which
    ``K alpha_in`` and every byte's crossings alone stand for every deeper ``K``. Kept per
    machine and size: both directions of a symmetric machine, and every plan of a collective,
    ask for the same one."""
    entering = 2 * (P - 1) * size / P
    best = np.inf
    K = 1
    while K * alpha_in + entering / c_in < best:
        if K > MAX_JOINT_STEPS:
            best = K * alpha_in + entering / c_in
            break
        best = min(best, _joint_lp(K, G, P, size, c_in, c_gpu, alpha_in, alpha_gpu)
                   * (1 - 1e-6))
        K += 1
    return float(best)


#: the most crossing steps :func:`_joint_bound` solves for (its LP grows as their square)
MAX_JOINT_STEPS = 24


def _joint_lp(K: int, G: int, P: int, size: float, c_in: float, c_gpu: float,
              alpha_in: float, alpha_gpu: float) -> float:
    """The least time of a lockstep AllReduce with ``K`` crossing steps over ``P`` alike
    nodes of ``G`` members (the LP of the module docstring, "Alike nodes"; microseconds and
    megabytes inside). Per class ``t`` of elements (first complete in some node at crossing
    step ``t``, a fraction ``y_t`` of the bytes) and per element: crossings before
    (``X``) and after (``B``) it, members' receipts from their own node before (``L``) and
    after (``LB``), at positions ``2j`` (the steps between crossing steps ``j`` and ``j + 1``,
    no crossings in them) and ``2k - 1`` (crossing step ``k``)."""
    # OR-Tools (0.1-0.4 s to import) only when this model is solved
    from ortools.linear_solver import pywraplp

    us, MB = 1e6, 1e-6
    solver = pywraplp.Solver.CreateSolver("GLOP")
    inf = solver.infinity()

    def var():
        return solver.NumVar(0, inf, "")

    n = G * P
    edge = size * MB / P                  # one edge per element, per node on average: MB
    rate_in, rate_gpu = c_in * MB / us, c_gpu * MB / us
    cross = [var() for _ in range(K + 1)]          # crossing steps 1..K (0 unused)
    between = [var() for _ in range(K + 1)]        # the steps after crossing step j, 0..K
    y = {t: var() for t in range(1, K + 1)}
    X: dict[tuple[int, int], Any] = {}
    B: dict[tuple[int, int], Any] = {}
    L: dict[tuple[int, int], Any] = {}
    LB: dict[tuple[int, int], Any] = {}
    for t in y:
        X.update({(t, k): var() for k in range(1, t + 1)})
        B.update({(t, k): var() for k in range(t, K + 1)})
        L.update({(t, p): var() for p in range(0, 2 * t - 1)})
        LB.update({(t, p): var() for p in range(2 * t, 2 * K + 1)})
        # before: the P - 1 other nodes' contributions reach the node, each of the n - G
        # foreign members' contributions leaving its node for the first time in a crossing
        # that carries at most G of them, and by crossing step k no more than the crossings
        # so far and the own-node receipts before step k (a component of m receipts spans
        # at most m + 1 members)
        solver.Add(solver.Sum([X[t, k] for k in range(1, t + 1)]) >= (P - 1) * y[t])
        leave = {k: var() for k in range(1, t + 1)}
        for k in range(1, t + 1):
            solver.Add(leave[k] <= G * X[t, k])
            solver.Add(solver.Sum([leave[q] for q in range(1, k + 1)])
                       <= solver.Sum([X[t, q] for q in range(1, k + 1)]
                                     + [L[t, p] for p in range(0, 2 * k - 1)]))
        solver.Add(solver.Sum(list(leave.values())) >= (n - G) * y[t])

        # after: each of the other P - 1 nodes completes on a crossing into it, and each of
        # the n members on a receipt of its own: a crossing into a node completing at k
        # (at most G members of it each) or an own-node receipt after step k
        def into(k: int, t: int = t):
            return B[t, k] + X[t, t] if k == t else B[t, k]
        solver.Add(solver.Sum([B[t, k] for k in range(t, K + 1)]) >= (P - 1) * y[t])
        done = {k: var() for k in range(t, K + 1)}
        for k in range(t, K + 1):
            solver.Add(done[k] <= G * into(k))
            solver.Add(solver.Sum([done[q] for q in range(k, K + 1)])
                       <= solver.Sum([into(q) for q in range(k, K + 1)]
                                     + [LB[t, p] for p in range(2 * k, 2 * K + 1)]))
        solver.Add(solver.Sum(list(done.values())) >= n * y[t])
    solver.Add(solver.Sum(list(y.values())) == 1)

    def at(table: dict, position: int) -> list:
        return [v for (_, p), v in table.items() if p == position]

    for k in range(1, K + 1):
        crossing = solver.Sum([v for (_, q), v in X.items() if q == k]
                              + [v for (_, q), v in B.items() if q == k])
        local = solver.Sum(at(L, 2 * k - 1) + at(LB, 2 * k - 1))
        solver.Add(cross[k] >= alpha_in * us + crossing * (edge / rate_in))
        solver.Add(cross[k] >= alpha_gpu * us + (crossing + local) * (edge / rate_gpu))
    for j in range(K + 1):
        solver.Add(between[j] >= solver.Sum(at(L, 2 * j) + at(LB, 2 * j)) * (edge / rate_gpu))
    solver.Minimize(solver.Sum(cross[1:] + between))
    if solver.Solve() != pywraplp.Solver.OPTIMAL:
        return np.inf
    return solver.Objective().Value() / us
