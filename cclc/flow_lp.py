"""The max-concurrent-flow LP of an alltoall, reduced by the torus symmetries the faults leave
intact.

An automorphism of a torus (a translation along wrapped dimensions, a reflection, a
permutation of alike dimensions) that maps the healthy links onto themselves (bandwidths
included), the group onto itself and every pair's bytes onto the same pair's bytes is a
symmetry of the LP: it maps a feasible flow onto a feasible flow of the same time. Averaging an
optimal flow over the group ``G`` of such symmetries gives an optimal flow that is itself
symmetric (the flow of source ``g r`` is the flow of ``r`` moved by ``g``), so the LP may keep
one commodity family per *orbit* of sources and one capacity row per orbit of links: a link of
orbit ``O`` carries ``sum_r |orbit(r)| / |O| * x_r(O)``, where ``x_r(O)`` is family ``r``'s
flow summed over the links of ``O``. Every flow of the reduced LP extends to a symmetric flow
of the full one and back, so the optimum is the same: the reduction is exact.

A healthy 8x8x8 torus keeps all 24576 automorphisms: one family, 3072 variables. One failed
link keeps the 8 that fix it (reflections and the swap of the two other dimensions): 120
families. :func:`alltoall_lp_time` solves the LP exactly (HiGHS's interior point method with
crossover to a vertex); :func:`alltoall_lp_certified` solves it approximately with PDLP, which
scales further, and pins the optimum between a certified lower value (weak duality, from
PDLP's link prices) and the time of a feasible flow (PDLP's, repaired to conserve exactly,
extended to every source by averaging over the group, like any reduced flow).
:func:`alltoall_lp_routed` pins it without solving it, for LPs too large for PDLP: certified
link prices below, a routed feasible flow (:mod:`cclc.flow_route`) above.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from scipy.optimize import linprog
from scipy.sparse.csgraph import breadth_first_order

from cclc.errors import CclError
from cclc.topology import Topology

__all__ = ["CertifiedLP", "Symmetry", "alltoall_lp_certified", "alltoall_lp_routed",
           "alltoall_lp_time", "torus_automorphism_count",
           "torus_point_maps", "torus_symmetry"]


#: PDLP's threads: fixed, not the machine's core count, because its sums are sharded by it
#: and the certified bound should not change from one machine to the next
PDLP_THREADS = 2


class Symmetry:
    """Orbits of a group of vertex permutations: the orbit key of every vertex and the orbit
    index of every healthy link, with the orbit sizes (``order``: the group's size)."""

    def __init__(self, vertex_key: np.ndarray, link_key: np.ndarray, order: int):
        self.order = order
        self.vertex_key = vertex_key
        _, self.link_orbit, link_sizes = np.unique(link_key, return_inverse=True,
                                                   return_counts=True)
        self.link_orbit_size = link_sizes
        self.n_link_orbits = len(link_sizes)
        _, inverse, sizes = np.unique(vertex_key, return_inverse=True, return_counts=True)
        self.vertex_orbit_size = sizes[inverse]

    @classmethod
    def trivial(cls, n_vertices: int, src: np.ndarray, dst: np.ndarray) -> Symmetry:
        return cls(np.arange(n_vertices), src * n_vertices + dst, 1)

    def representatives(self, members: np.ndarray) -> np.ndarray:
        """Positions in ``members`` of one member per orbit (the one whose vertex is the key)."""
        return np.flatnonzero(self.vertex_key[members] == members)


def _torus_automorphisms(topo: Topology) -> list[tuple[tuple[int, ...], tuple[bool, ...]]]:
    """The dimension permutations (among dimensions of equal size and wrap) and reflections
    (dimensions where a reflection is not a translation) that, with the translations along
    wrapped dimensions, make up the automorphisms of the torus graph."""
    return torus_point_maps(topo.grid_dims, topo.grid_wrap)


def torus_point_maps(dims: tuple[int, ...], wrap: tuple[bool, ...]
                     ) -> list[tuple[tuple[int, ...], tuple[bool, ...]]]:
    """(permutation, reflections) of every point map of a torus of ``dims``: permutations
    among dimensions alike in size and wrap, reflections where one is not a translation
    (rings of more than two ranks, lines); the identity first."""
    nd = len(dims)
    perms = [p for p in itertools.permutations(range(nd))
             if all(dims[p[d]] == dims[d] and wrap[p[d]] == wrap[d] for d in range(nd))]
    flippable = [d for d in range(nd) if dims[d] > 2 or (dims[d] == 2 and not wrap[d])]
    out = []
    for p in perms:
        for bits in itertools.product((False, True), repeat=len(flippable)):
            flip = [False] * nd
            for d, b in zip(flippable, bits, strict=True):
                flip[d] = b
            out.append((p, tuple(flip)))
    return out


def torus_automorphism_count(dims: tuple[int, ...], wrap: tuple[bool, ...]
                             ) -> tuple[int, int]:
    """(point maps, translations) of a torus of ``dims``, counted without listing them: the
    search of :func:`torus_symmetry` checks their product, and the point maps alone are
    ``d!`` for ``d`` alike dimensions (479 001 600 for twelve)."""
    alike: dict[tuple[int, bool], int] = {}
    for m, w in zip(dims, wrap, strict=True):
        alike[(m, w)] = alike.get((m, w), 0) + 1
    flippable = sum(1 for m, w in zip(dims, wrap, strict=True) if m > 2 or (m == 2 and not w))
    point_maps = math.prod(math.factorial(k) for k in alike.values()) << flippable
    translations = math.prod(m for m, w in zip(dims, wrap, strict=True) if w)
    return point_maps, translations


def torus_symmetry(topo: Topology, src: np.ndarray, dst: np.ndarray, bw: np.ndarray,
                   group: np.ndarray, pair: np.ndarray | None,
                   point_maps: bool = True) -> Symmetry:
    """The automorphisms of ``topo`` (a torus or mesh: translations along wrapped dimensions,
    reflections, permutations of alike dimensions) that keep the healthy links ``src -> dst``
    with their bandwidths ``bw``, the ``group`` and the per-pair bytes ``pair`` (``None``:
    uniform) unchanged, as orbits. Anything but a torus of ranks gets the trivial group.
    ``point_maps=False`` searches the translations only: a subgroup, so the reduction stays
    exact, for tori whose point maps are too many to check."""
    V = topo.n_vertices
    if topo.dims is None or V != topo.n_ranks:
        return Symmetry.trivial(V, src, dst)
    dims, wrap = topo.grid_dims, topo.grid_wrap
    nd = len(dims)
    coords = np.array(np.unravel_index(np.arange(V), dims))            # (nd, V)
    # the healthy links as a lookup: bandwidth of u -> v, 0 where there is none
    key = src * V + dst
    order = np.argsort(key)
    key_sorted, bw_sorted = key[order], bw[order]
    dense = None
    if V <= 2048:                      # a V x V table of bandwidths (0: no healthy link)
        dense = np.zeros(V * V)
        dense[key] = bw
    failed = topo.link_failed
    bad_src = topo.link_src[failed].astype(np.int64)
    bad_dst = topo.link_dst[failed].astype(np.int64)
    bad = np.unique(bad_src * V + bad_dst)
    members = np.zeros(V, dtype=bool)
    members[group] = True
    pos = np.full(V, -1)
    pos[group] = np.arange(len(group))
    shifts = np.array(np.meshgrid(*[np.arange(m) if w else np.zeros(1, dtype=np.int64)
                                    for m, w in zip(dims, wrap, strict=True)], indexing="ij"))
    shifts = shifts.reshape(nd, -1)                                     # (nd, translations)
    vertex_key = np.arange(V)
    link_key = key.copy()
    count = 0
    maps = _torus_automorphisms(topo) if point_maps else [(tuple(range(nd)), (False,) * nd)]
    for perm, flip in maps:
        base = np.array([(-coords[perm[d]]) % dims[d] if flip[d] and wrap[d]
                         else dims[d] - 1 - coords[perm[d]] if flip[d]
                         else coords[perm[d]] for d in range(nd)])      # (nd, V)
        for lo in range(0, shifts.shape[1], max(1, (1 << 22) // max(1, len(src)))):
            t = shifts[:, lo:lo + max(1, (1 << 22) // max(1, len(src)))]
            img = np.zeros((t.shape[1], V), dtype=np.int64)             # (batch, V)
            for d in range(nd):
                img = img * dims[d] + (base[d][None, :] + t[d][:, None]) % dims[d]
            # cheap first: the failed links must map onto failed links (most candidates fail
            # here when there are faults), and the group onto itself
            ok = (members[img] == members).all(axis=1)
            if len(bad):
                ok &= np.isin(img[:, bad_src] * V + img[:, bad_dst], bad).all(axis=1)
            img = img[ok]
            if not len(img):
                continue
            moved = img[:, src] * V + img[:, dst]                       # (batch, E)
            if dense is not None:
                ok = (dense[moved] == bw).all(axis=1)
            else:
                at = np.searchsorted(key_sorted, moved).clip(0, len(key_sorted) - 1)
                ok = (key_sorted[at] == moved).all(axis=1) & (bw_sorted[at] == bw).all(axis=1)
            for i in np.flatnonzero(ok):
                if pair is not None:
                    p = pos[img[i, group]]
                    if not np.array_equal(pair[np.ix_(p, p)], pair):
                        ok[i] = False
            if ok.any():
                count += int(ok.sum())
                vertex_key = np.minimum(vertex_key, img[ok].min(axis=0))
                link_key = np.minimum(link_key, moved[ok].min(axis=0))
    return Symmetry(vertex_key, link_key, count)


@dataclass(frozen=True, slots=True)
class _ReducedLP:
    """The symmetry-reduced alltoall LP: variables ``x[r, e]`` (family ``r`` on link ``e``,
    row-major) then ``T``; ``conservation @ v == supply`` and ``capacity @ v <= 0``."""

    reps: np.ndarray
    conservation: sp.csr_matrix
    supply: np.ndarray            # (families, vertices)
    capacity: sp.csr_matrix
    weight: np.ndarray            # a family's share of its link orbit's load, per variable


def _reduced_lp(n_vertices: int, src: np.ndarray, dst: np.ndarray, cap: np.ndarray,
                group: np.ndarray, pair: np.ndarray, sym: Symmetry) -> _ReducedLP:
    V, E = n_vertices, len(src)
    reps = sym.representatives(group)
    k = len(reps)
    # variables: x[r, e] (family r on link e), then T; minimize T
    r_idx = np.repeat(np.arange(k), E)
    e_idx = np.tile(np.arange(E), k)
    col = r_idx * E + e_idx
    conservation = sp.csr_matrix(
        (np.concatenate([np.ones(k * E), -np.ones(k * E)]),
         (np.concatenate([r_idx * V + src[e_idx], r_idx * V + dst[e_idx]]),
          np.concatenate([col, col]))), shape=(k * V, k * E + 1))
    supply = np.zeros((k, V))
    supply[:, group] = -pair[reps]
    supply[np.arange(k), group[reps]] += pair[reps].sum(axis=1)
    orbits = sym.n_link_orbits
    orbit_cap = np.zeros(orbits)
    orbit_cap[sym.link_orbit] = cap                   # equal within an orbit
    # a symmetric flow loads each link of orbit O with sum_r |orbit of r| / |O| x_r(O)
    weight = (sym.vertex_orbit_size[group[reps]][r_idx]
              / sym.link_orbit_size[sym.link_orbit[e_idx]])
    capacity = sp.hstack([
        sp.csr_matrix((weight, (sym.link_orbit[e_idx], col)), shape=(orbits, k * E)),
        sp.csr_matrix(-orbit_cap.reshape(-1, 1))]).tocsr()
    return _ReducedLP(reps, conservation, supply, capacity, weight)


def alltoall_lp_time(n_vertices: int, src: np.ndarray, dst: np.ndarray, cap: np.ndarray,
                     group: np.ndarray, pair: np.ndarray, sym: Symmetry) -> float:
    """The smallest ``T`` such that every ``pair[i, j]`` from ``group[i]`` to ``group[j]`` fits
    within ``T * cap`` on every link (the units of ``pair`` over those of ``cap``): the
    max-concurrent-flow LP with commodities aggregated by source, one family per orbit."""
    lp = _reduced_lp(n_vertices, src, dst, cap, group, pair, sym)
    n_col = lp.conservation.shape[1]
    cost = np.zeros(n_col)
    cost[-1] = 1.0
    # HiGHS's interior point method, then crossover to a vertex: the optimum to the simplex's
    # tolerances (the dual simplex alone takes 30x longer on these LPs)
    res = linprog(cost, A_ub=lp.capacity, b_ub=np.zeros(lp.capacity.shape[0]),
                  A_eq=lp.conservation, b_eq=lp.supply.ravel(), bounds=(0, None),
                  method="highs-ipm")
    if res.status == 2:
        raise CclError("no flow routes every pair of the alltoall: the group is disconnected")
    if res.status != 0:
        raise CclError(f"the alltoall LP bound did not solve (HiGHS: {res.message}); --no-lp "
                       "skips it")
    return float(res.fun)


@dataclass(frozen=True, slots=True)
class CertifiedLP:
    """The alltoall LP's optimum pinned between two certified values (units of
    :func:`alltoall_lp_time`): ``lower`` from link prices by weak duality
    (:func:`cclc.flow_dual.certified_time`), ``upper`` the time of a feasible flow;
    ``iterations`` of PDLP (passes of the routing)."""

    lower: float
    upper: float
    iterations: int
    #: how the upper value was found: "PDLP" (its flows, repaired) or "routed"
    #: (:func:`alltoall_lp_routed`)
    method: str = "PDLP"

    @property
    def gap(self) -> float:
        """How far ``upper`` is above ``lower``, as a fraction of ``lower``."""
        return self.upper / self.lower - 1.0 if self.lower > 0 else float("inf")


def alltoall_lp_certified(n_vertices: int, src: np.ndarray, dst: np.ndarray, cap: np.ndarray,
                          group: np.ndarray, pair: np.ndarray, sym: Symmetry,
                          tolerance: float, iteration_limit: int,
                          prices: tuple[np.ndarray, ...] = ()) -> CertifiedLP:
    """The same LP as :func:`alltoall_lp_time`, solved approximately by PDLP (a first-order
    method: no factorization, so it scales to millions of variables) and then certified:
    the capacity rows' duals price the links and :func:`cclc.flow_dual.certified_time` turns
    the prices into a lower bound that holds whatever PDLP's accuracy; PDLP's flows, repaired
    to conserve flow exactly (:func:`_repair`), give an upper value. A fixed thread count
    (``PDLP_THREADS``: PDLP shards its sums by it) and iteration limit: the same input gives
    the same numbers on every run. ``prices``: more link lengths to certify (a cut's links)."""
    # OR-Tools (0.1-0.4 s to import) only when this model is solved; cclc.flow_dual only when
    # this runs, not for cclc --help
    from ortools.pdlp import solvers_pb2
    from ortools.pdlp.python import pdlp

    from cclc.flow_dual import certified_time

    lp = _reduced_lp(n_vertices, src, dst, cap, group, pair, sym)
    n_col = lp.conservation.shape[1]
    rows_eq, rows_cap = lp.conservation.shape[0], lp.capacity.shape[0]
    qp = pdlp.QuadraticProgram()
    cost = np.zeros(n_col)
    cost[-1] = 1.0
    qp.objective_vector = cost
    qp.constraint_matrix = sp.vstack([lp.conservation, lp.capacity]).tocsc()
    qp.constraint_lower_bounds = np.concatenate([lp.supply.ravel(), np.full(rows_cap, -np.inf)])
    qp.constraint_upper_bounds = np.concatenate([lp.supply.ravel(), np.zeros(rows_cap)])
    qp.variable_lower_bounds = np.zeros(n_col)
    qp.variable_upper_bounds = np.full(n_col, np.inf)
    params = solvers_pb2.PrimalDualHybridGradientParams()
    criteria = params.termination_criteria.simple_optimality_criteria
    criteria.eps_optimal_relative = tolerance
    criteria.eps_optimal_absolute = tolerance
    params.termination_criteria.iteration_limit = iteration_limit
    params.num_threads = PDLP_THREADS
    result = pdlp.primal_dual_hybrid_gradient(qp, params)
    if len(result.primal_solution) != n_col:
        raise CclError("the alltoall LP bound did not solve (PDLP: "
                       f"{solvers_pb2.TerminationReason.Name(result.solve_log.termination_reason)}"
                       "); --no-lp skips it")
    dual = np.asarray(result.dual_solution)[rows_eq:]
    # a <= row of a minimization has a dual <= 0 here; its negation prices the orbit's links,
    # each link of orbit O getting 1/|O| of it (the reduced row is the mean of its links' rows)
    price = np.maximum(-dual, 0.0)[sym.link_orbit] / sym.link_orbit_size[sym.link_orbit]
    lower = certified_time(n_vertices, src, dst, cap, group, pair, price)
    # the prices of a first-order method can be poor on a hard LP; hop counts (the hop-bytes
    # bound) are a certificate too, and so are the caller's (a cut's links: its cut bound)
    for length in (np.ones(len(src)), *prices):
        lower = max(lower, certified_time(n_vertices, src, dst, cap, group, pair, length))
    if not np.isfinite(lower):           # a pair with bytes and no path between them
        raise CclError("no flow routes every pair of the alltoall: the group is disconnected")
    flow = np.maximum(np.asarray(result.primal_solution)[:-1], 0.0).reshape(len(lp.reps), -1)
    flow = _repair(n_vertices, src, dst, lp.supply, group[lp.reps], flow)
    load = np.bincount(sym.link_orbit[np.tile(np.arange(len(src)), len(lp.reps))],
                       weights=lp.weight * flow.ravel(), minlength=sym.n_link_orbits)
    orbit_cap = np.zeros(sym.n_link_orbits)
    orbit_cap[sym.link_orbit] = cap
    upper = float((load / orbit_cap).max())
    return CertifiedLP(lower, max(upper, lower), int(result.solve_log.iteration_count))


def alltoall_lp_routed(n_vertices: int, src: np.ndarray, dst: np.ndarray, cap: np.ndarray,
                       group: np.ndarray, pair: np.ndarray, prices: tuple[np.ndarray, ...],
                       passes: int, target_gap: float) -> CertifiedLP:
    """The same LP as :func:`alltoall_lp_time`, pinned without solving it: the lower value is
    the best weak-duality certificate (:func:`cclc.flow_dual.certified_time`) of the hop
    counts, of the caller's ``prices`` (link lengths; a cut's links give that cut's bound)
    and of the link prices of every pass of :func:`cclc.flow_route.route_alltoall`, whose
    feasible flow gives the upper value (at most ``passes`` passes, fewer once within
    ``target_gap``). Every source is its own family (no symmetry reduction: the routing is
    cheap per source); deterministic, so the same input gives the same numbers. ``iterations``
    counts the passes."""
    # cclc.flow_dual, cclc.flow_route only when this runs, not for cclc --help
    from cclc.flow_dual import certified_time
    from cclc.flow_route import route_alltoall

    args = (n_vertices, src, dst, cap, group, pair)
    lower = max(certified_time(*args, length) for length in [np.ones(len(src)), *prices])
    if not np.isfinite(lower):           # a pair with bytes and no path between them
        raise CclError("no flow routes every pair of the alltoall: the group is disconnected")
    upper, done = float("inf"), 0
    for flows, length in route_alltoall(*args, lower=lower, passes=passes,
                                        target_gap=target_gap):
        done += 1
        upper = min(upper, float((flows.sum(axis=0) / cap).max()))
        lower = max(lower, certified_time(*args, length))
    return CertifiedLP(lower, max(upper, lower), done, "routed")


def _repair(n_vertices: int, src: np.ndarray, dst: np.ndarray, supply: np.ndarray,
            roots: np.ndarray, flow: np.ndarray) -> np.ndarray:
    """Flows ``flow[r]`` (>= 0, one per family, conserving only approximately) made exact:
    each vertex's excess goes to (its shortfall comes from) the family's root along a
    fewest-hop path, which balances the root too (excesses add up to zero). What is added is
    PDLP's residual, so the repaired flows cost a little more than PDLP's."""
    k, E = flow.shape
    net = np.zeros((k, n_vertices))
    for r in range(k):
        net[r] = (np.bincount(src, weights=flow[r], minlength=n_vertices)
                  - np.bincount(dst, weights=flow[r], minlength=n_vertices))
    residual = supply - net                       # > 0: the vertex must send that much more
    rows = np.arange(k)
    residual[rows, roots] = 0.0                   # the root is balanced by the rest
    excess, shortfall = np.maximum(residual, 0.0), np.maximum(-residual, 0.0)
    out_tree = _tree_loads(n_vertices, src, dst, roots, shortfall)        # root -> vertex
    in_tree = _tree_loads(n_vertices, dst, src, roots, excess)            # vertex -> root
    return flow + out_tree + in_tree


def _tree_loads(n_vertices: int, src: np.ndarray, dst: np.ndarray, roots: np.ndarray,
                demand: np.ndarray) -> np.ndarray:
    """Per root ``r``, the load on every link ``src -> dst`` of sending ``demand[r, v]`` from
    ``roots[r]`` to each ``v`` down a fewest-hop tree (k x links)."""
    V, E, k = n_vertices, len(src), len(roots)
    key = src.astype(np.int64) * V + dst
    order = np.argsort(key, kind="stable")
    graph = sp.csr_matrix((np.ones(E), (src, dst)), shape=(V, V))
    loads = np.zeros((k, E))
    for r in range(k):
        visit, pred = breadth_first_order(graph, int(roots[r]), directed=True,
                                          return_predecessors=True)
        acc = demand[r].copy()
        # children before parents: BFS order backwards
        for v in visit[:0:-1].tolist():
            acc[pred[v]] += acc[v]
        child = visit[1:]
        link = order[np.searchsorted(key[order], pred[child].astype(np.int64) * V + child)]
        loads[r, link] = acc[child]
    return loads
