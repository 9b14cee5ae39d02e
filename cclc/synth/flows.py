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

import itertools
import time
from dataclasses import dataclass

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import shortest_path

from cclc.collective import Collective
from cclc.errors import CclError
from cclc.synth.symmetry import Symmetry, identity_symmetry, translations
from cclc.topology import Topology

__all__ = ["FlowSolution", "SynthBudgetError", "group_connected", "pair_bytes", "solve_flows",
           "usable_links"]


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


@dataclass(frozen=True, eq=False)
class FlowSolution:
    """The LP's weighted paths for every commodity (all ranks, translations applied).

    ``src``/``dst`` (group indices), ``weight`` (fraction of the pair's bytes) and ``path``
    (global link ids) per path; ``lp_time`` the LP optimum in seconds (a lower bound on any
    schedule over the usable links when ``status == "optimal"``); ``status`` "optimal" or
    "budget" (pricing stopped by the time budget: the paths are feasible, the time may not be
    the optimum); ``rounds`` pricing rounds; ``symmetry`` the order of the translation group.
    """

    src: np.ndarray
    dst: np.ndarray
    weight: np.ndarray
    path: tuple[tuple[int, ...], ...]
    lp_time: float
    status: str
    rounds: int
    symmetry: int
    solve_s: float


def usable_links(coll: Collective) -> np.ndarray:
    """Links a schedule of ``coll`` may use: healthy, and every rank they touch in the group."""
    topo = coll.topology
    is_rank = np.zeros(topo.n_vertices, dtype=bool)
    is_rank[:topo.n_ranks] = True
    member = np.zeros(topo.n_vertices, dtype=bool)
    member[list(coll.group)] = True
    ends_ok = lambda v: member[v] | ~is_rank[v]  # noqa: E731 - switches forward for anyone
    return ~topo.link_failed & ends_ok(topo.link_src) & ends_ok(topo.link_dst)


def group_connected(coll: Collective) -> bool:
    """Whether every rank of the group reaches every other over usable links (relaying only
    through members of the group and switches)."""
    from scipy.sparse.csgraph import connected_components

    topo = coll.topology
    ok = usable_links(coll)
    V = topo.n_vertices
    g = csr_matrix((np.ones(int(ok.sum())), (topo.link_src[ok], topo.link_dst[ok])),
                   shape=(V, V))
    _, label = connected_components(g, directed=True, connection="strong")
    return len(set(label[list(coll.group)].tolist())) == 1


def pair_bytes(coll: Collective) -> np.ndarray:
    """``(n, n)`` bytes rank ``s`` sends rank ``j`` (the diagonal stays local)."""
    n = coll.n
    if coll.pair_sizes is not None:
        return np.asarray(coll.pair_sizes, dtype=np.float64)
    return np.full((n, n), coll.size / n)


@dataclass(frozen=True, eq=False)
class _FlowData:
    """The path LP's data, fixed before the first solve.

    ``group`` the group's vertices and ``index`` their group index per vertex (-1 outside);
    ``reps`` the representative sources (group indices, sorted); commodity ``k`` sends ``d[k]``
    bytes from ``ks[k]`` to ``kd[k]`` (group indices, sources among ``reps``) and its shortest
    paths are row ``k_row[k]`` of a pricing; ``orbit_row`` maps each usable link to its
    capacity row (-1 for others), ``orbits`` the rows' orbit ids and ``cap`` their bandwidth.
    ``dn``/``cn`` are demands/capacities over ``dmax``/``cmax``: the LP sees numbers near one
    whatever the sizes and link rates, and its ``T`` is in units of ``dmax / cmax`` seconds.
    """

    group: np.ndarray
    index: np.ndarray
    reps: np.ndarray
    ks: np.ndarray
    kd: np.ndarray
    k_row: np.ndarray
    d: np.ndarray
    orbit_row: np.ndarray
    orbits: np.ndarray
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
        # only pairs from a representative source are variables (the others are translates),
        # and only pairs with bytes to move (the diagonal stays local)
        demand = pair_bytes(coll)
        ks, kd = np.nonzero(demand[reps] > 0)
        ks = reps[ks]
        keep = ks != kd
        ks, kd = ks[keep], kd[keep]
        d = demand[ks, kd]
        rep_row = {int(r): i for i, r in enumerate(reps.tolist())}
        k_row = np.array([rep_row[int(s)] for s in ks.tolist()], dtype=np.int64)
        # one capacity row per orbit of usable links: a row stands for every link of its orbit
        orbit = sym.link_orbits(usable)
        orbits = np.unique(orbit[usable])
        orbit_row = np.full(topo.n_links, -1, dtype=np.int64)
        orbit_row[usable] = np.searchsorted(orbits, orbit[usable])
        cap = topo.link_bandwidth[orbits].astype(np.float64)
        dmax, cmax = float(d.max()) if len(d) else 1.0, float(cap.max())
        return cls(group=group, index=index, reps=reps, ks=ks, kd=kd, k_row=k_row, d=d,
                   orbit_row=orbit_row, orbits=orbits, cap=cap, dmax=dmax, cmax=cmax,
                   dn=d / dmax, cn=cap / cmax)

    def seconds(self, t: float) -> float:
        """The LP's ``T`` in seconds."""
        return t * self.dmax / self.cmax


class _LinkGraph:
    """The usable links as a simple directed graph, for shortest paths under link prices."""

    def __init__(self, topo: Topology, usable: np.ndarray, orbit_row: np.ndarray):
        self.src_v = topo.link_src.astype(np.int64)
        self.dst_v = topo.link_dst.astype(np.int64)
        self.V = topo.n_vertices
        self.orbit_row = orbit_row
        self.link_at: dict[tuple[int, int], int] = {}
        for e in np.flatnonzero(usable).tolist():
            key = (int(self.src_v[e]), int(self.dst_v[e]))
            # parallel links: keep the fastest (the LP prices orbits, equal links price alike)
            if (key not in self.link_at
                    or topo.link_bandwidth[e] > topo.link_bandwidth[self.link_at[key]]):
                self.link_at[key] = e
        self.links = np.array(sorted(self.link_at.values()), dtype=np.int64)

    def shortest(self, price: np.ndarray, sources: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(distances, predecessors) from each of ``sources`` (vertices) with every link
        costing ``price`` of its capacity row."""
        e = self.links
        g = csr_matrix((price[self.orbit_row[e]], (self.src_v[e], self.dst_v[e])),
                       shape=(self.V, self.V))
        return shortest_path(g, method="D", directed=True, indices=sources,
                             return_predecessors=True)

    def walk(self, pred_row: np.ndarray, s_v: int, t_v: int) -> tuple[int, ...] | None:
        """The links of the shortest path ``s_v`` -> ``t_v`` (None when there is none)."""
        verts = [t_v]
        while verts[-1] != s_v:
            p = int(pred_row[verts[-1]])
            if p < 0:
                return None
            verts.append(p)
        verts.reverse()
        return tuple(self.link_at[(a, b)] for a, b in itertools.pairwise(verts))


class _PathLP:
    """The restricted path LP: the columns generated so far, and the rounds that add more."""

    def __init__(self, coll: Collective, data: _FlowData, graph: _LinkGraph):
        from ortools.linear_solver import pywraplp

        self.pywraplp = pywraplp
        self.coll, self.data, self.graph = coll, data, graph
        solver = pywraplp.Solver.CreateSolver(SOLVER)
        if solver is None:
            raise CclError(f"OR-Tools {SOLVER} is not available: cannot synthesize")
        self.solver = solver
        self.T = solver.NumVar(0.0, solver.infinity(), "T")
        solver.Minimize(self.T)
        self.dem_rows = [solver.Constraint(1.0, 1.0) for _ in range(len(data.d))]
        self.cap_rows = [solver.Constraint(-solver.infinity(), 0.0)
                         for _ in range(len(data.orbits))]
        for o, row in enumerate(self.cap_rows):
            row.SetCoefficient(self.T, -float(data.cn[o]))
        #: (commodity, links, variable) in the order added: the output follows this order
        self.columns: list[tuple[int, tuple[int, ...], object]] = []
        self.seen: set[tuple[int, tuple[int, ...]]] = set()

    def add_column(self, k: int, path: tuple[int, ...]) -> bool:
        """Add ``path`` for commodity ``k`` unless it is already a column."""
        if (k, path) in self.seen:
            return False
        self.seen.add((k, path))
        data = self.data
        x = self.solver.NumVar(0.0, self.solver.infinity(), "")
        self.dem_rows[k].SetCoefficient(x, 1.0)
        # a path's coefficient on an orbit's row counts its links in that orbit
        counts = np.bincount(data.orbit_row[list(path)], minlength=len(data.orbits))
        for o in np.flatnonzero(counts).tolist():
            self.cap_rows[o].SetCoefficient(x, float(data.dn[k] * counts[o]))
        self.columns.append((k, path, x))
        return True

    def priced_paths(self, price: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Shortest paths under ``price`` per capacity row from every representative source
        (rows in the order of ``data.reps``)."""
        data = self.data
        return self.graph.shortest(price, data.group[data.reps])

    def path_of(self, pred: np.ndarray, k: int) -> tuple[int, ...] | None:
        data = self.data
        return self.graph.walk(pred[data.k_row[k]], int(data.group[data.ks[k]]),
                               int(data.group[data.kd[k]]))

    def seed(self, price: np.ndarray) -> None:
        """Add every commodity's shortest path under ``price``; a pair without one has no
        routing at all."""
        _, pred = self.priced_paths(price)
        data, group = self.data, self.coll.group
        for k in range(len(data.d)):
            path = self.path_of(pred, k)
            if path is None:
                raise CclError(f"collective '{self.coll.name}': rank {group[int(data.ks[k])]} "
                               f"has no usable path to rank {group[int(data.kd[k])]}")
            self.add_column(k, path)

    def lp_time(self) -> float:
        return self.data.seconds(float(self.T.solution_value()))

    def solve(self, deadline: float | None) -> bool:
        """Solve the restricted LP; whether it is optimal (False: stopped by the time limit
        with a feasible point). Raises when it has neither."""
        Solver = self.pywraplp.Solver
        if deadline is not None:
            self.solver.SetTimeLimit(max(1, int(1000 * (deadline - time.monotonic()))))
        code = self.solver.Solve()
        if code not in (Solver.OPTIMAL, Solver.FEASIBLE):
            raise SynthBudgetError(f"the flow LP of collective '{self.coll.name}' did not solve "
                                   f"(OR-Tools {SOLVER} status {code})")
        return code == Solver.OPTIMAL

    def price(self) -> int:
        """Add the columns with negative reduced cost; how many were new (0: optimal)."""
        data = self.data
        # link prices: minus the capacity rows' duals (>= 0 for <= rows of a minimization)
        price = np.maximum(-np.array([r.dual_value() for r in self.cap_rows]), 0.0)
        pi = np.array([r.dual_value() for r in self.dem_rows])
        # a tiny positive floor: every usable link stays an edge with a cost (a zero entry of
        # the sparse graph could read as no link, and free links would tie any path length)
        dist, pred = self.priced_paths(price + 1e-12)
        reduced = data.dn * dist[data.k_row, data.group[data.kd]] - pi
        enter = np.flatnonzero(reduced < -REDUCED_TOL * np.maximum(np.abs(pi), 1e-12))
        added = 0
        for k in enter.tolist():
            path = self.path_of(pred, k)
            if path is not None:
                added += self.add_column(k, path)
        return added

    def round(self, deadline: float | None, known: float) -> str | None:
        """One round: solve, then price. The status when column generation stops ("budget"
        when out of time, "optimal" when nothing can improve), None to go on."""
        if not self.solve(deadline) or (deadline is not None and time.monotonic() > deadline):
            return "budget"
        if self.lp_time() <= known * (1 + 1e-4):
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

    def used(self) -> tuple[list[tuple[int, tuple[int, ...]]], np.ndarray]:
        """The columns with weight, and their share of their commodity."""
        val = np.array([x.solution_value() for _, _, x in self.columns])
        used = np.flatnonzero(val > 1e-9)
        cols = [self.columns[i][:2] for i in used.tolist()]
        kk = np.array([k for k, _ in cols], dtype=np.int64)
        wt = val[used]
        # renormalize per commodity (the solver's tolerances)
        tot = np.bincount(kk, weights=wt, minlength=len(self.data.d))
        return cols, wt / tot[kk]


def solve_flows(coll: Collective, deadline: float | None = None,
                use_symmetry: bool = True) -> FlowSolution:
    """Solve the path LP of ``coll`` (an alltoall) by column generation.

    ``deadline`` (a ``time.monotonic()`` value) stops pricing early (status "budget"). Raises
    :class:`~cclc.errors.CclError` when the LP solver is missing or a pair has no usable path.
    """
    t0 = time.monotonic()
    topo = coll.topology
    usable = usable_links(coll)
    sym = (translations(coll, usable) if use_symmetry
           else identity_symmetry(topo.n_vertices, topo.n_links))
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
    cols, wt = lp.used()
    out_s, out_d, out_w, out_p = _translate(data, sym, cols, wt)
    return FlowSolution(src=out_s, dst=out_d, weight=out_w, path=out_p, lp_time=lp_time,
                        status=status, rounds=rounds, symmetry=sym.order,
                        solve_s=time.monotonic() - t0)


def _translate(data: _FlowData, sym: Symmetry, cols: list[tuple[int, tuple[int, ...]]],
               wt: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                        tuple[tuple[int, ...], ...]]:
    """The used columns (representative sources only) translated to every rank: each
    element of the symmetry group maps a column to the same flow between the images of its
    pair, so the LP's routing for all pairs is the union of the translates."""
    out_s, out_d, out_w, out_p = [], [], [], []
    for g in range(sym.order):
        vmap, lmap = sym.vertex[g], sym.link[g]
        for c, (k, path) in enumerate(cols):
            out_s.append(data.index[vmap[data.group[data.ks[k]]]])
            out_d.append(data.index[vmap[data.group[data.kd[k]]]])
            out_w.append(wt[c])
            out_p.append(tuple(int(lmap[e]) for e in path))
    return (np.array(out_s, dtype=np.int64), np.array(out_d, dtype=np.int64),
            np.array(out_w), tuple(out_p))


def _bandwidth_bound(coll: Collective) -> float:
    """The strongest closed-form bandwidth bound (hop bytes, injection, cut) in seconds: the
    LP can stop pricing as soon as it meets it."""
    from cclc.bounds import cut_bound, hop_bytes_bound, injection_bound

    return max(b(coll).seconds for b in (hop_bytes_bound, injection_bound, cut_bound))
