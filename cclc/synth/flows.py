"""AllToAll bandwidth: the max-concurrent-flow LP over paths, solved by column generation.

Every pair ``(s, j)`` of the group with bytes ``d`` to move is a commodity; a path is a walk
over *usable* links (healthy, and not touching a rank outside the group: only members of the
group can store and forward). The LP (OR-Tools GLOP)::

    minimize T  subject to  sum_p x[k, p] = 1                      for every commodity k
                            sum_{k, p through e} d_k x[k, p] <= T c_e  for every link e

gives the time ``T`` of the best fractional routing at full link rate: for every routing a
schedule can use, a lower bound on its time (the same optimum as the node-arc LP of
:mod:`cclc.bounds` when that one also keeps to the usable links). Paths are generated as needed
(column generation): after each solve, the link duals price every link, and a commodity whose
shortest priced path costs less than its dual gets that path as a new column; when none does,
the restricted LP is optimal for the full one. A basic optimum has at most one path per
commodity beyond the first for each tight link, so the decomposition into weighted paths is
small by construction.

Symmetry (:mod:`cclc.synth.symmetry`): with a group of translations, only commodities whose
source is an orbit representative are variables; a link's constraint stands for its orbit, and
a path's coefficient on it counts the path's links in that orbit (each translate of the path
crosses a given link of the orbit once per such link).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import shortest_path

from cclc.bounds import cut_bound, hop_bytes_bound, injection_bound
from cclc.collective import Collective
from cclc.errors import CclError
from cclc.synth.flow_solution import (
    LONG_SHARE,
    MAX_PATHS,
    MIN_SHARE,
    FlowSolution,
    pair_bytes,
    usable_links,
)
from cclc.synth.routed import routed_flows
from cclc.synth.symmetry import Symmetry, automorphisms, identity_symmetry, translations
from cclc.topology import Topology

__all__ = ["SynthBudgetError", "choose_symmetry", "solve_flows"]


class SynthBudgetError(CclError):
    """The solver stopped (time budget or failure) before it had a routing."""

#: at most this many pricing rounds (the LP is usually optimal after 5-20)
MAX_ROUNDS = 60
#: the LP solver: PDLP (first-order) solves the path LP of a faulty 4x4x4 torus ~10x faster
#: than GLOP's simplex here, at a tolerance (1e-4 relative) far below the schedules' gaps
SOLVER = "PDLP"
#: fewest-hop paths per pair (jittered ties) in the first LP
SEED_PATHS = 6
#: a column enters when its reduced cost is below -REDUCED_TOL * its commodity's dual
REDUCED_TOL = 1e-6
#: the whole automorphism group is used when the translations leave more commodities than
#: this. It shrinks the LP (a 5x5x5 torus with one failed link: 15 500 commodities, 6 s of
#: CPU time; 970 over its 16 automorphisms, 1 s), but a pair fixed by a reflection is then
#: spread evenly over its mirror paths, and those schedules pack a few % further from the LP
#: (88% against 95% there, benchmarks/synth_scale.py --quick --compare)
FULL_GROUP_ABOVE = 20_000
#: a path dropped for its length (:data:`~cclc.synth.flow_solution.LONG_SHARE`) is kept when
#: dropping it leaves the busiest link more than this above its load before
LONG_SLACK = 0.01
#: PDLP's relative and absolute optimality tolerance (on the LP scaled to numbers near one)
TOLERANCE = 1e-4
#: above this many commodities (after the symmetry reduction) the paths come from a routed flow
#: (:mod:`cclc.synth.routed`) instead of this LP: PDLP did not reach its tolerance within 600 s
#: on 261 632 (8x8x8 with two failed links in different rings, no symmetry left), and solved
#: 16 352 (8x8x8 with one failed link, over its 16 automorphisms) in about a minute of CPU time
ROUTE_ABOVE = 100_000


@dataclass(frozen=True, eq=False)
class _FlowData:
    """The path LP's data, fixed before the first solve.

    ``group`` the group's vertices and ``index`` their group index per vertex (-1 outside);
    ``reps`` the representative sources (group indices, sorted); commodity ``k`` sends ``d[k]``
    bytes from ``ks[k]`` to ``kd[k]`` (group indices, sources among ``reps``), stands for the
    ``k_orbit[k]`` pairs of its orbit, and its shortest paths are row ``k_row[k]`` of a
    pricing; ``orbit_row`` maps each usable link to its capacity row (-1 for others),
    ``orbits`` the rows' orbit ids, ``orbit_size`` their links and ``cap`` their bandwidth.
    ``dn``/``cn`` are demands/capacities over ``dmax``/``cmax``: the LP sees numbers near one
    whatever the sizes and link rates, and its ``T`` is in units of ``dmax / cmax`` seconds.
    """

    group: np.ndarray
    index: np.ndarray
    reps: np.ndarray
    ks: np.ndarray
    kd: np.ndarray
    k_row: np.ndarray
    k_orbit: np.ndarray
    d: np.ndarray
    orbit_row: np.ndarray
    orbits: np.ndarray
    orbit_size: np.ndarray
    cap: np.ndarray
    dmax: float
    cmax: float
    dn: np.ndarray
    cn: np.ndarray

    @classmethod
    def build(cls, coll: Collective, usable: np.ndarray, sym: Symmetry) -> _FlowData:
        topo = coll.topology
        group = np.asarray(coll.group, dtype=np.int64)
        index = np.full(topo.n_vertices, -1, dtype=np.int64)
        index[group] = np.arange(len(group))
        reps = np.sort(index[sym.vertex_representatives(group)])
        # only pairs from a representative source to a representative of its orbit under the
        # source's stabilizer are variables (the others are images), and only pairs with bytes
        # to move (the diagonal stays local)
        demand = pair_bytes(coll)
        ks_l, kd_l, orbit_l = [], [], []
        for s in reps.tolist():
            targets = np.flatnonzero((demand[s] > 0) & (np.arange(len(group)) != s))
            kept, fixed = sym.pair_representatives(int(group[s]), group[targets])
            ks_l.append(np.full(len(kept), s, dtype=np.int64))
            kd_l.append(index[kept])
            orbit_l.append(sym.order // fixed)
        ks = np.concatenate(ks_l) if ks_l else np.zeros(0, dtype=np.int64)
        kd = np.concatenate(kd_l) if kd_l else np.zeros(0, dtype=np.int64)
        k_orbit = (np.concatenate(orbit_l) if orbit_l else np.zeros(0)).astype(np.float64)
        d = demand[ks, kd]
        k_row = np.searchsorted(reps, ks)
        # one capacity row per orbit of usable links: a row stands for every link of its orbit
        orbit = sym.link_orbits(usable)
        orbits, orbit_size = np.unique(orbit[usable], return_counts=True)
        orbit_row = np.full(topo.n_links, -1, dtype=np.int64)
        orbit_row[usable] = np.searchsorted(orbits, orbit[usable])
        cap = topo.link_bandwidth[orbits].astype(np.float64)
        dmax, cmax = float(d.max()) if len(d) else 1.0, float(cap.max())
        return cls(group=group, index=index, reps=reps, ks=ks, kd=kd, k_row=k_row,
                   k_orbit=k_orbit, d=d, orbit_row=orbit_row, orbits=orbits,
                   orbit_size=orbit_size.astype(np.float64), cap=cap, dmax=dmax, cmax=cmax,
                   dn=d / dmax, cn=cap / cmax)

    def seconds(self, t: float) -> float:
        """The LP's ``T`` in seconds."""
        return t * self.dmax / self.cmax


class _LinkGraph:
    """The usable links as a simple directed graph, for shortest paths under link prices."""

    def __init__(self, topo: Topology, usable: np.ndarray, orbit_row: np.ndarray):
        self.V = topo.n_vertices
        self.orbit_row = orbit_row
        src = topo.link_src.astype(np.int64)
        dst = topo.link_dst.astype(np.int64)
        ok = np.flatnonzero(usable)
        # parallel links: keep the fastest (the LP prices orbits, equal links price alike)
        key = src[ok] * self.V + dst[ok]
        order = np.lexsort((-topo.link_bandwidth[ok], key))
        first = np.ones(len(order), dtype=bool)
        first[1:] = key[order][1:] != key[order][:-1]
        self.keys = key[order][first]
        self.links = ok[order][first]
        self.src_v, self.dst_v = src[self.links], dst[self.links]

    def shortest(self, price: np.ndarray, sources: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(distances, predecessors) from each of ``sources`` (vertices) with every link
        costing ``price`` of its capacity row."""
        g = csr_matrix((price[self.orbit_row[self.links]], (self.src_v, self.dst_v)),
                       shape=(self.V, self.V))
        return shortest_path(g, method="D", directed=True, indices=sources,
                             return_predecessors=True)

    def walk(self, pred: np.ndarray, rows: np.ndarray, s_v: np.ndarray, t_v: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray]:
        """The shortest paths ``s_v[i] -> t_v[i]`` along ``pred[rows[i]]``, all at once: a
        ``(len, hops)`` array of link ids padded with -1 at the end, and whether each exists."""
        cur = t_v.copy()
        verts = [cur.copy()]
        found = np.ones(len(cur), dtype=bool)
        for _ in range(self.V):
            active = np.flatnonzero(found & (cur != s_v))
            if not len(active):
                break
            step = pred[rows[active], cur[active]]
            found[active[step < 0]] = False
            moved = active[step >= 0]
            cur[moved] = step[step >= 0]
            row = np.full(len(cur), -1, dtype=np.int64)
            row[moved] = cur[moved]
            verts.append(row)
        vs = np.stack(verts[::-1], axis=1)                    # (paths, hops + 1), -1 first
        # left-align: every path starts at column 0
        lead = (vs < 0).sum(axis=1)
        width = vs.shape[1]
        cols = (np.arange(width)[None, :] + lead[:, None]) % width
        vs = np.take_along_axis(vs, cols, axis=1)
        vs[np.arange(width)[None, :] >= (width - lead)[:, None]] = -1
        a, b = vs[:, :-1], vs[:, 1:]
        has = (a >= 0) & (b >= 0)
        out = np.full(a.shape, -1, dtype=np.int64)
        out[has] = self.links[np.searchsorted(self.keys, a[has] * self.V + b[has])]
        return out, found


class _PathLP:
    """The restricted path LP: the columns generated so far, and the rounds that add more.

    Columns live in flat arrays (commodity, padded links) and the constraint matrix is built
    from them with SciPy for each solve; OR-Tools PDLP takes it as is, warm-started from the
    previous round's primal and dual (new columns start at zero)."""

    def __init__(self, coll: Collective, data: _FlowData, graph: _LinkGraph):
        self.coll, self.data, self.graph = coll, data, graph
        #: (commodity, links padded with -1) per column, in the order added
        self.col_k = np.zeros(0, dtype=np.int64)
        self.col_links = np.zeros((0, 1), dtype=np.int64)
        self.seen: set[bytes] = set()
        self.primal: np.ndarray | None = None
        self.dual: np.ndarray | None = None
        self.t_value = 0.0
        self.optimal = False

    def add_columns(self, ks: np.ndarray, links: np.ndarray) -> int:
        """Add the paths ``links`` (padded rows) for commodities ``ks`` unless already there;
        how many were new."""
        if not len(ks):
            return 0
        width = max(links.shape[1], self.col_links.shape[1])
        links = np.pad(links, ((0, 0), (0, width - links.shape[1])), constant_values=-1)
        rows = np.concatenate([ks[:, None], links], axis=1)
        fresh = []
        for i, row in enumerate(rows):
            key = row[:1 + int((row[1:] >= 0).sum())].tobytes()
            if key not in self.seen:
                self.seen.add(key)
                fresh.append(i)
        if not fresh:
            return 0
        pad = width - self.col_links.shape[1]
        self.col_links = np.concatenate(
            [np.pad(self.col_links, ((0, 0), (0, pad)), constant_values=-1), links[fresh]])
        self.col_k = np.concatenate([self.col_k, ks[fresh]])
        return len(fresh)

    def priced_paths(self, price: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Shortest paths under ``price`` per capacity row from every representative source
        (rows in the order of ``data.reps``)."""
        data = self.data
        return self.graph.shortest(price, data.group[data.reps])

    def paths_of(self, pred: np.ndarray, ks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        data = self.data
        return self.graph.walk(pred, data.k_row[ks], data.group[data.ks[ks]],
                               data.group[data.kd[ks]])

    def seed(self, price: np.ndarray) -> None:
        """Add every commodity's shortest path under ``price``; a pair without one has no
        routing at all."""
        _, pred = self.priced_paths(price)
        data, group = self.data, self.coll.group
        ks = np.arange(len(data.d))
        links, found = self.paths_of(pred, ks)
        if not found.all():
            k = int(np.flatnonzero(~found)[0])
            raise CclError(f"collective '{self.coll.name}': rank {group[int(data.ks[k])]} "
                           f"has no usable path to rank {group[int(data.kd[k])]}")
        self.add_columns(ks, links)

    def lp_time(self) -> float:
        return self.data.seconds(self.t_value)

    def matrix(self) -> csr_matrix:
        """Rows: one per commodity (its shares add to one), one per link orbit (its load
        within ``T`` times its capacity); columns: ``T``, then the paths. A path's coefficient
        on an orbit's row counts its links in that orbit, weighted by how many pairs its
        commodity stands for over how many links the row does (see the module docstring)."""
        data = self.data
        C, K = len(self.col_k), len(data.d)
        has = self.col_links >= 0
        col = np.broadcast_to(np.arange(C)[:, None], has.shape)[has]
        orow = data.orbit_row[self.col_links[has]]
        coef = (data.dn * data.k_orbit)[self.col_k][col] / data.orbit_size[orow]
        rows = np.concatenate([self.col_k, K + orow, K + np.arange(len(data.orbits))])
        cols = np.concatenate([1 + np.arange(C), 1 + col, np.zeros(len(data.orbits), np.int64)])
        vals = np.concatenate([np.ones(C), coef, -data.cn])
        return csr_matrix((vals, (rows, cols)), shape=(K + len(data.orbits), C + 1))

    def solve(self, deadline: float | None) -> bool:
        """Solve the restricted LP; whether it is optimal (False: stopped by the time limit
        with a point). Raises when it has none."""
        # OR-Tools (0.1-0.4 s to import) only when this model is solved
        from ortools.pdlp import solve_log_pb2, solvers_pb2
        from ortools.pdlp.python import pdlp

        data = self.data
        K, R, C = len(data.d), len(data.orbits), len(self.col_k)
        qp = pdlp.QuadraticProgram()
        qp.resize_and_initialize(C + 1, K + R)
        qp.objective_vector = np.concatenate([[1.0], np.zeros(C)])
        qp.constraint_matrix = self.matrix().tocsc()
        qp.constraint_lower_bounds = np.concatenate([np.ones(K), np.full(R, -np.inf)])
        qp.constraint_upper_bounds = np.concatenate([np.ones(K), np.zeros(R)])
        qp.variable_lower_bounds = np.zeros(C + 1)
        qp.variable_upper_bounds = np.full(C + 1, np.inf)
        params = solvers_pb2.PrimalDualHybridGradientParams()
        crit = params.termination_criteria.simple_optimality_criteria
        crit.eps_optimal_relative = TOLERANCE
        crit.eps_optimal_absolute = TOLERANCE
        if deadline is not None:
            params.termination_criteria.time_sec_limit = max(deadline - time.monotonic(), 0.5)
        init = None
        if self.primal is not None:
            init = pdlp.PrimalAndDualSolution()
            init.primal_solution = np.concatenate(
                [self.primal, np.zeros(C + 1 - len(self.primal))])
            init.dual_solution = self.dual
        result = pdlp.primal_dual_hybrid_gradient(qp, params, initial_solution=init)
        reason = result.solve_log.termination_reason
        primal = np.asarray(result.primal_solution)
        if (reason != solve_log_pb2.TERMINATION_REASON_OPTIMAL
                and not (reason == solve_log_pb2.TERMINATION_REASON_TIME_LIMIT
                         and len(primal) == C + 1 and np.isfinite(primal).all())):
            raise SynthBudgetError(
                f"the flow LP of collective '{self.coll.name}' did not solve (OR-Tools {SOLVER}: "
                f"{solve_log_pb2.TerminationReason.Name(reason)})")
        self.primal = np.maximum(primal, 0.0)
        self.dual = np.asarray(result.dual_solution)
        # the LP's T (within PDLP's tolerance of the optimum); the shares meet their rows only
        # to that tolerance too and are renormalized per commodity when used
        self.t_value = float(self.primal[0])
        self.optimal = reason == solve_log_pb2.TERMINATION_REASON_OPTIMAL
        return self.optimal

    def shares(self) -> np.ndarray:
        """Every column's share of its commodity (renormalized per commodity)."""
        assert self.primal is not None, "solve() sets the primal"
        x = self.primal[1:]
        tot = np.bincount(self.col_k, weights=x, minlength=len(self.data.d))
        return np.where(tot[self.col_k] > 0, x / np.maximum(tot[self.col_k], 1e-300), 0.0)

    def price(self) -> int:
        """Add the columns with negative reduced cost; how many were new (0: optimal)."""
        data = self.data
        K = len(data.d)
        assert self.dual is not None, "solve() sets the duals"
        # link prices: minus the capacity rows' duals (>= 0 for <= rows of a minimization),
        # per link of the row's orbit
        price = np.maximum(-self.dual[K:], 0.0) / data.orbit_size
        pi = self.dual[:K]
        # a tiny positive floor: every usable link stays an edge with a cost (a zero entry of
        # the sparse graph could read as no link, and free links would tie any path length)
        dist, pred = self.priced_paths(price + 1e-12)
        reduced = data.dn * data.k_orbit * dist[data.k_row, data.group[data.kd]] - pi
        enter = np.flatnonzero(reduced < -REDUCED_TOL * np.maximum(np.abs(pi), 1e-12))
        if not len(enter):
            return 0
        links, found = self.paths_of(pred, enter)
        return self.add_columns(enter[found], links[found])

    def round(self, deadline: float | None, known: float) -> str | None:
        """One round: solve, then price. The status when column generation stops ("budget"
        when out of time, "optimal" when nothing can improve), None to go on."""
        if not self.solve(deadline) or (deadline is not None and time.monotonic() > deadline):
            return "budget"
        if self.lp_time() <= known * (1 + TOLERANCE):
            # the restricted LP meets a closed-form lower bound: nothing can be better
            return "optimal"
        return None if self.price() else "optimal"

    def run(self, deadline: float | None, known: float) -> tuple[str, int]:
        """Column generation: (status, rounds); "budget" also when MAX_ROUNDS run out."""
        for rounds in range(1, MAX_ROUNDS + 1):
            status = self.round(deadline, known)
            if status is not None:
                return status, rounds
        return "budget", MAX_ROUNDS

    def used(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The columns with weight (commodity, padded links) and their share of their
        commodity, at most :data:`MAX_PATHS` per commodity (:func:`_reduce_shares` with the
        loads of the capacity rows)."""
        data = self.data
        share = self.shares()
        used = np.flatnonzero(share > 1e-9)
        k, links, share = self.col_k[used], self.col_links[used], share[used].copy()
        a = self.matrix()[len(data.d):, 1:][:, used].tocsc()
        a = a.multiply(1.0 / data.cn[:, None]).tocsc()
        busy = (a @ share).tolist()
        rows = [a.indices[a.indptr[i]:a.indptr[i + 1]].tolist() for i in range(len(used))]
        coef = [a.data[a.indptr[i]:a.indptr[i + 1]].tolist() for i in range(len(used))]
        hops = (links >= 0).sum(axis=1)
        keep = _cut_shares(k, share, hops, rows, coef, busy)
        k, links, share = k[keep], links[keep], share[keep]
        tot = np.bincount(k, weights=share, minlength=len(data.d))
        return k, links, share / tot[k]


def choose_symmetry(coll: Collective, usable: np.ndarray,
                    full_group: bool | None = None) -> Symmetry:
    """The group the LP is solved over: the translations the faults leave intact, or every
    automorphism (``full_group``; ``None``: when the translations leave more than
    :data:`FULL_GROUP_ABOVE` commodities)."""
    trans = translations(coll, usable)
    if full_group is None:
        full_group = coll.n * (coll.n - 1) / trans.order > FULL_GROUP_ABOVE
    return automorphisms(coll, usable) if full_group else trans


def solve_flows(coll: Collective, deadline: float | None = None,
                use_symmetry: bool = True, full_group: bool | None = None,
                route: bool | None = None) -> FlowSolution:
    """Solve the path LP of ``coll`` (an alltoall) by column generation.

    ``deadline`` (a ``time.monotonic()`` value) stops pricing early (status "budget").
    ``use_symmetry`` solves one commodity per orbit of the torus translations the faults leave
    intact, or of all the automorphisms they leave intact (``full_group``, see
    :func:`choose_symmetry`). ``route`` takes the paths from a routed flow instead
    (:func:`cclc.synth.routed.routed_flows`, status "routed"; ``None``: above
    :data:`ROUTE_ABOVE` commodities). Raises
    :class:`~cclc.errors.CclError` when a pair has no usable path, :class:`SynthBudgetError`
    when the LP solver stops without a point.
    """
    t0, c0 = time.monotonic(), time.process_time()
    topo = coll.topology
    usable = usable_links(coll)
    sym = (choose_symmetry(coll, usable, full_group) if use_symmetry
           else identity_symmetry(topo, usable))
    if route is None:
        has = pair_bytes(coll) > 0
        route = (int(has.sum()) - int(np.trace(has))) / sym.order > ROUTE_ABOVE
    if route:
        return routed_flows(coll, deadline)
    data = _FlowData.build(coll, usable, sym)
    lp = _PathLP(coll, data, _LinkGraph(topo, usable, data.orbit_row))
    # start from fewest-hop paths, several per pair: hop counts with a small random jitter
    # pick different ones among equally short paths, so the first solve is already close to
    # the optimum and pricing needs few rounds (each round re-solves the whole LP)
    known = _bandwidth_bound(coll)
    rng = np.random.default_rng(0)
    for _ in range(SEED_PATHS):
        lp.seed(1.0 + 0.2 * rng.random(len(data.orbits)))
    status, rounds = lp.run(deadline, known)
    lp_time = lp.lp_time()
    k, links, wt = lp.used()
    out_s, out_d, out_w, out_p = _fewer_paths(coll, *_map_to_all(data, sym, k, links, wt))
    return FlowSolution(src=out_s, dst=out_d, weight=out_w, path=out_p, lp_time=lp_time,
                        status=status, rounds=rounds, symmetry=sym.order,
                        solve_s=time.monotonic() - t0, cpu_s=time.process_time() - c0)


def _map_to_all(data: _FlowData, sym: Symmetry, k: np.ndarray, links: np.ndarray,
                wt: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The used columns (representative commodities only) mapped to every pair: each element
    of the group maps a column to the same flow between the images of its pair. A commodity
    fixed by ``m`` elements receives each image ``m`` times, so each carries ``1/m`` of the
    share: the routing of every pair is the average over the images, which loads every link
    of an orbit alike. Images that coincide are merged. Paths come back padded with -1."""
    s_v, d_v = data.group[data.ks[k]], data.group[data.kd[k]]
    per = wt * data.k_orbit[k] / sym.order                         # share / stabilizer size
    has = links >= 0
    out_s, out_d, out_w, out_l = [], [], [], []
    for g in range(sym.order):
        img = np.full(links.shape, -1, dtype=np.int64)
        img[has] = sym.link_image(g, links[has])
        vmap = sym.vertex[g]
        out_s.append(data.index[vmap[s_v]])
        out_d.append(data.index[vmap[d_v]])
        out_w.append(per)
        out_l.append(img)
    src, dst, w = np.concatenate(out_s), np.concatenate(out_d), np.concatenate(out_w)
    paths = np.concatenate(out_l)
    if (data.k_orbit[k] < sym.order).any():
        # only a commodity fixed by some element has coinciding images
        rows = np.ascontiguousarray(np.concatenate([src[:, None], dst[:, None], paths], axis=1))
        _, first, inverse = np.unique(rows, axis=0, return_index=True, return_inverse=True)
        w = np.bincount(inverse.ravel(), weights=w)
        src, dst, paths = src[first], dst[first], paths[first]
    return src, dst, w, paths


def _owners_to_cut(owner: np.ndarray, w: np.ndarray, hops: np.ndarray,
                   long_paths: bool = True
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """Entries sorted by owner and falling share, each owner's run (starts, ends), and the
    owners with an entry to drop (over MAX_PATHS, under MIN_SHARE of the largest, or, with
    ``long_paths``, a path longer than every path with LONG_SHARE of its owner's largest: a
    few stray long paths would add steps to the whole schedule, which small sizes pay in
    latency)."""
    order = np.lexsort((-w, owner))
    o = owner[order]
    starts = np.flatnonzero(np.r_[True, o[1:] != o[:-1]])
    ends = np.r_[starts[1:], len(order)]
    rank_in = np.arange(len(order)) - np.repeat(starts, ends - starts)
    wo = w[order]
    largest = np.repeat(wo[starts], ends - starts)
    ho = hops[order]
    longest = 0 if not len(order) else \
        int((ho[wo >= LONG_SHARE * largest] if long_paths else ho).max())
    drop = (rank_in >= MAX_PATHS) | (wo < MIN_SHARE * largest) | ((ho > longest) & (rank_in > 0))
    work = np.unique(np.searchsorted(starts, np.flatnonzero(drop), side="right") - 1)
    return order, starts, ends, work, longest


def _cut_shares(owner: np.ndarray, w: np.ndarray, hops: np.ndarray, rows, coef,
                busy: list[float]) -> np.ndarray:
    """:func:`_reduce_shares`, dropping stray long paths only where that leaves the busiest
    row within :data:`LONG_SLACK` of its load before the cut; ``w`` and ``busy`` are updated
    in place. On a 3x3 torus with two failed links the long-path rule alone left the kept
    paths' busiest link 16% above the LP (PDLP's long detours carry small shares of many
    pairs); without it 0.02%."""
    before = max(busy, default=0.0)
    w_long, busy_long = w.copy(), list(busy)
    keep = _reduce_shares(owner, w_long, hops, rows, coef, busy_long)
    if max(busy_long, default=0.0) > before * (1 + LONG_SLACK):
        keep = _reduce_shares(owner, w, hops, rows, coef, busy, long_paths=False)
    else:
        w[:], busy[:] = w_long, busy_long
    return keep


def _reduce_shares(owner: np.ndarray, w: np.ndarray, hops: np.ndarray, rows, coef,
                   busy: list[float], long_paths: bool = True) -> np.ndarray:
    """At most :data:`MAX_PATHS` entries per owner (a commodity or a pair), none under
    :data:`MIN_SHARE` of the owner's largest; which entries stay (``w`` is updated in place).

    The packer keeps only that many paths per pair (each costs ops and step slots), and PDLP's
    optimum is an interior point that spreads a pair over many paths (so does the averaging
    over a stabilizer, see :func:`_map_to_all`): cutting the rest and scaling up what is left
    overloads links (about 6% on a faulty 5x5x5 torus). Here an owner's dropped share goes in
    quarters, each to the kept entry whose busiest row would end least loaded, with every other
    entry's load counted. Entry ``i`` loads row ``rows[i][j]`` by ``coef[i][j]`` per unit of
    share (lists, or mappings holding at least the entries of owners with work); ``busy``
    holds every row's load and is updated in place."""
    order, starts, ends, work, longest = _owners_to_cut(owner, w, hops, long_paths)
    keep = np.ones(len(w), dtype=bool)
    hl = hops.tolist()
    wl = w.tolist()
    for g in work.tolist():
        kept = order[starts[g]:ends[g]].tolist()
        while True:
            # a share moved onto a path can leave another under MIN_SHARE of the new largest
            kept.sort(key=lambda i: -wl[i])
            gone = [i for r, i in enumerate(kept)
                    if r >= MAX_PATHS or wl[i] < MIN_SHARE * wl[kept[0]]
                    or (r > 0 and hl[i] > longest)]
            if not gone:
                break
            dropped = set(gone)
            kept = [i for i in kept if i not in dropped]
            moved = 0.0
            for i in gone:
                for r, c in zip(rows[i], coef[i], strict=True):
                    busy[r] -= wl[i] * c
                moved += wl[i]
                wl[i] = 0.0
                keep[i] = False
            part = moved / 4
            for _ in range(4):
                best = min(kept, key=lambda i: max(
                    busy[r] + part * c for r, c in zip(rows[i], coef[i], strict=True)))
                for r, c in zip(rows[best], coef[best], strict=True):
                    busy[r] += part * c
                wl[best] += part
    w[:] = wl
    return keep


def _fewer_paths(coll: Collective, src: np.ndarray, dst: np.ndarray, w: np.ndarray,
                 paths: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                             tuple[tuple[int, ...], ...]]:
    """:func:`_reduce_shares` over every pair's paths, loads on links (seconds of busy time),
    and the paths as tuples. After a reduction over orbits only the pairs a stabilizer spread
    out have anything to drop."""
    topo = coll.topology
    demand = pair_bytes(coll)
    d = demand[src, dst]
    has = paths >= 0
    idx = np.broadcast_to(np.arange(len(w))[:, None], paths.shape)[has]
    inv_bw = 1.0 / topo.link_bandwidth.astype(np.float64)
    busy = np.bincount(paths[has], weights=(w * d)[idx], minlength=topo.n_links) * inv_bw
    lengths = has.sum(axis=1)
    plist = paths.tolist()
    owner = src * coll.n + dst
    order, starts, ends, work, _ = _owners_to_cut(owner, w, lengths)
    w = w.copy()
    keep = np.ones(len(w), dtype=bool)
    if len(work):
        involved = np.concatenate([order[starts[g]:ends[g]] for g in work.tolist()]).tolist()
        ib = inv_bw.tolist()
        rows = {i: plist[i][:lengths[i]] for i in involved}
        coef = {i: [float(d[i]) * ib[e] for e in rows[i]] for i in involved}
        keep = _cut_shares(owner, w, lengths, rows, coef, busy.tolist())
    out_p = tuple(tuple(p[:n]) for p, n, k in zip(plist, lengths.tolist(), keep.tolist(),
                                                  strict=True) if k)
    return src[keep], dst[keep], w[keep], out_p


def _bandwidth_bound(coll: Collective) -> float:
    """The strongest closed-form bandwidth bound (hop bytes, injection, cut) in seconds: the
    LP can stop pricing as soon as it meets it."""
    return max(b(coll).seconds for b in (hop_bytes_bound, injection_bound, cut_bound))
