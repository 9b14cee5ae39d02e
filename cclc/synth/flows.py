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
from cclc.synth.symmetry import identity_symmetry, translations

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


def solve_flows(coll: Collective, deadline: float | None = None,
                use_symmetry: bool = True) -> FlowSolution:
    """Solve the path LP of ``coll`` (an alltoall) by column generation.

    ``deadline`` (a ``time.monotonic()`` value) stops pricing early (status "budget"). Raises
    :class:`~cclc.errors.CclError` when GLOP is missing or a pair has no usable path.
    """
    from ortools.linear_solver import pywraplp

    t0 = time.monotonic()
    topo = coll.topology
    usable = usable_links(coll)
    sym = (translations(coll, usable) if use_symmetry
           else identity_symmetry(topo.n_vertices, topo.n_links))
    group = np.asarray(coll.group, dtype=np.int64)
    index = np.full(topo.n_vertices, -1, dtype=np.int64)
    index[group] = np.arange(len(group))
    reps = np.sort(index[sym.vertex_representatives(group)])
    demand = pair_bytes(coll)
    ks, kd = np.nonzero(demand[reps] > 0)
    ks = reps[ks]
    keep = ks != kd
    ks, kd = ks[keep], kd[keep]
    d = demand[ks, kd]
    orbit = sym.link_orbits(usable)
    orbits = np.unique(orbit[usable])
    orbit_row = np.full(topo.n_links, -1, dtype=np.int64)
    orbit_row[usable] = np.searchsorted(orbits, orbit[usable])
    cap = topo.link_bandwidth[orbits].astype(np.float64)
    # scale: demands in units of the largest, capacities in units of the largest, so the LP's
    # T is in units of dmax / cmax seconds
    dmax, cmax = float(d.max()) if len(d) else 1.0, float(cap.max())
    dn, cn = d / dmax, cap / cmax

    solver = pywraplp.Solver.CreateSolver(SOLVER)
    if solver is None:
        raise CclError(f"OR-Tools {SOLVER} is not available: cannot synthesize")
    T = solver.NumVar(0.0, solver.infinity(), "T")
    solver.Minimize(T)
    dem_rows = [solver.Constraint(1.0, 1.0) for _ in range(len(d))]
    cap_rows = [solver.Constraint(-solver.infinity(), 0.0) for _ in range(len(orbits))]
    for o, row in enumerate(cap_rows):
        row.SetCoefficient(T, -float(cn[o]))
    columns: list[tuple[int, tuple[int, ...], object]] = []
    seen: set[tuple[int, tuple[int, ...]]] = set()

    src_v, dst_v = topo.link_src.astype(np.int64), topo.link_dst.astype(np.int64)
    V = topo.n_vertices
    link_at = {}
    for e in np.flatnonzero(usable).tolist():
        key = (int(src_v[e]), int(dst_v[e]))
        # parallel links: keep the fastest (the LP prices orbits, equal links price alike)
        if key not in link_at or topo.link_bandwidth[e] > topo.link_bandwidth[link_at[key]]:
            link_at[key] = e

    graph_links = np.array(sorted(link_at.values()), dtype=np.int64)

    def add_column(k: int, path: tuple[int, ...]) -> bool:
        if (k, path) in seen:
            return False
        seen.add((k, path))
        x = solver.NumVar(0.0, solver.infinity(), "")
        dem_rows[k].SetCoefficient(x, 1.0)
        counts = np.bincount(orbit_row[list(path)], minlength=len(orbits))
        for o in np.flatnonzero(counts).tolist():
            cap_rows[o].SetCoefficient(x, float(dn[k] * counts[o]))
        columns.append((k, path, x))
        return True

    def priced_paths(weight: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        """Shortest paths under ``weight`` per link from every representative source:
        (distances, predecessors) rows, in the order of ``rep_vertices``."""
        g = csr_matrix((weight[orbit_row[graph_links]], (src_v[graph_links], dst_v[graph_links])),
                       shape=(V, V))
        dist, pred = shortest_path(g, method="D", directed=True, indices=group[reps],
                                   return_predecessors=True)
        return dist, pred

    def walk(pred_row: np.ndarray, s_v: int, t_v: int) -> tuple[int, ...] | None:
        verts = [t_v]
        while verts[-1] != s_v:
            p = int(pred_row[verts[-1]])
            if p < 0:
                return None
            verts.append(p)
        verts.reverse()
        return tuple(link_at[(a, b)] for a, b in itertools.pairwise(verts))

    rep_row = {int(r): i for i, r in enumerate(reps.tolist())}

    def add_priced(weight: np.ndarray, only: np.ndarray | None) -> int:
        dist, pred = priced_paths(weight)
        added = 0
        for k in (range(len(d)) if only is None else only.tolist()):
            row = rep_row[int(ks[k])]
            path = walk(pred[row], int(group[ks[k]]), int(group[kd[k]]))
            if path is None:
                raise CclError(f"collective '{coll.name}': rank {coll.group[int(ks[k])]} has "
                               f"no usable path to rank {coll.group[int(kd[k])]}")
            added += add_column(k, path)
        return added

    # start from fewest-hop paths, several per pair: hop counts with a small random jitter
    # pick different ones among equally short paths, so the first solve is already close to
    # the optimum and pricing needs few rounds (each round re-solves the whole LP)
    known = _bandwidth_bound(coll)
    rng = np.random.default_rng(0)
    for _ in range(SEED_PATHS):
        add_priced(1.0 + 0.2 * rng.random(len(orbits)), None)
    status, rounds = "budget", 0
    for rounds in range(1, MAX_ROUNDS + 1):  # noqa: B007 (reported after the loop)
        if deadline is not None:
            solver.SetTimeLimit(max(1, int(1000 * (deadline - time.monotonic()))))
        code = solver.Solve()
        if code not in (pywraplp.Solver.OPTIMAL, pywraplp.Solver.FEASIBLE):
            raise SynthBudgetError(f"the flow LP of collective '{coll.name}' did not solve "
                                   f"(OR-Tools {SOLVER} status {code})")
        if code != pywraplp.Solver.OPTIMAL or (
                deadline is not None and time.monotonic() > deadline):
            break
        if float(T.solution_value()) * dmax / cmax <= known * (1 + 1e-4):
            # the restricted LP meets a closed-form lower bound: nothing can be better
            status = "optimal"
            break
        # link prices: minus the capacity rows' duals (>= 0 for <= rows of a minimization)
        price = np.maximum(-np.array([r.dual_value() for r in cap_rows]), 0.0)
        pi = np.array([r.dual_value() for r in dem_rows])
        dist, pred = priced_paths(price + 1e-12)
        rs = np.array([rep_row[int(s)] for s in ks.tolist()], dtype=np.int64)
        reduced = dn * dist[rs, group[kd]] - pi
        enter = np.flatnonzero(reduced < -REDUCED_TOL * np.maximum(np.abs(pi), 1e-12))
        if not len(enter):
            status = "optimal"
            break
        added = 0
        for k in enter.tolist():
            path = walk(pred[rs[k]], int(group[ks[k]]), int(group[kd[k]]))
            if path is not None:
                added += add_column(k, path)
        if not added:
            status = "optimal"
            break
    lp_time = float(T.solution_value()) * dmax / cmax

    # the used columns, translated to every rank
    val = np.array([x.solution_value() for _, _, x in columns])
    used = np.flatnonzero(val > 1e-9)
    kk = np.array([columns[i][0] for i in used.tolist()], dtype=np.int64)
    wt = val[used]
    # renormalize per commodity (GLOP's tolerances)
    tot = np.bincount(kk, weights=wt, minlength=len(d))
    wt = wt / tot[kk]
    out_s, out_d, out_w, out_p = [], [], [], []
    for g in range(sym.order):
        vmap, lmap = sym.vertex[g], sym.link[g]
        for c, i in enumerate(used.tolist()):
            k, path, _ = columns[i]
            out_s.append(index[vmap[group[ks[k]]]])
            out_d.append(index[vmap[group[kd[k]]]])
            out_w.append(wt[c])
            out_p.append(tuple(int(lmap[e]) for e in path))
    return FlowSolution(src=np.array(out_s, dtype=np.int64), dst=np.array(out_d, dtype=np.int64),
                        weight=np.array(out_w), path=tuple(out_p), lp_time=lp_time,
                        status=status, rounds=rounds, symmetry=sym.order,
                        solve_s=time.monotonic() - t0)


def _bandwidth_bound(coll: Collective) -> float:
    """The strongest closed-form bandwidth bound (hop bytes, injection, cut) in seconds: the
    LP can stop pricing as soon as it meets it."""
    from cclc.bounds import cut_bound, hop_bytes_bound, injection_bound

    return max(b(coll).seconds for b in (hop_bytes_bound, injection_bound, cut_bound))
