"""Lower bounds on the time of a collective on its topology, faults included.

Every bound is in seconds and holds for any schedule the cost model of :mod:`cclc.sim` can
time (alpha-beta links; reductions only at ranks, never in switches). ``S`` below is the
collective's ``size`` (nccl-tests convention, see :class:`cclc.collective.Collective`), ``n``
the group size, ``B`` bandwidths of healthy links only (a failed link or rank carries
nothing).

"Links" below are only those a schedule of the group can use (:mod:`cclc.group_links`; why
that keeps every bound a bound: :mod:`cclc.bounds_closed_form`).

``hop_bytes``, ``injection``, ``cut``, ``latency``
    The closed forms, each described where it is computed (:mod:`cclc.bounds_closed_form`).
``lp``
    The max-concurrent-flow LP, for any graph: only the usable links (above); switches relay
    flow. Variables are one flow per (commodity family, link). On a torus or mesh the LP keeps
    one family per orbit of the automorphisms (translations, reflections, permutations of alike
    dimensions) that the faults, the group and the sizes leave intact (:mod:`cclc.flow_lp`;
    exact: the optimum is the full LP's), so a healthy torus of any size has one family and a
    5x5x5 torus with one failed link 30. It is skipped, and the report says so, above
    ``LP_MAX_VARIABLES`` flow variables (alltoall: one LP with shared capacities) or
    ``LP_MAX_FAMILIES`` max-flow LPs or ``LP_MAX_FLOW_LINKS`` links (the others, OR-Tools
    GLOP, one small LP per family;
    allreduce: its joint LP, see below); the closed forms then stand alone. The alltoall LP
    is solved exactly (HiGHS interior point + crossover) up to ``LP_EXACT_MAX_VARIABLES``
    flow variables; above, PDLP solves it to a tolerance and the bound is the *certified*
    lower value of its solution (:mod:`cclc.flow_dual`: weak duality turns any link prices
    into a valid bound, so PDLP's accuracy only decides how close it comes), reported with
    the gap to a feasible flow repaired from PDLP's (an upper value of the LP). Above
    ``LP_PDLP_MAX_VARIABLES`` PDLP is not run (minutes): the bound is the best weak-duality
    certificate of the hop counts, the best candidate cut's links and the link prices of a
    routing (:func:`cclc.flow_lp.alltoall_lp_routed`), never below the hop-bytes and cut
    bounds, and the routing's feasible flow (:mod:`cclc.flow_route`) is the upper value
    whose gap is printed.
    The optimum over ``S`` does not
    depend on ``S``: it is kept on the topology for the next size or candidate.

    * alltoall: one family per source (commodities aggregated by source) sending
      ``pair_sizes[s, j]`` to each ``j``; all families share the link capacities; maximize the
      throughput ``lambda``; the bound is ``1 / lambda``.
    * allgather: bytes that reach one destination form a flow from every other rank (``S/n``
      each) to it, but different destinations may share bytes (multicast), so each destination
      is its own family, limited only by the capacities (not shared). This is exactly the
      cut bound over every cut (max-flow = min-cut), which on a torus is the injection bound.
    * reducescatter: by duality, one family per source sending ``S/n`` to each other rank,
      families not sharing capacity (contributions to one destination may merge on the way).
    * allreduce: one joint LP of both phases. Every element of the buffer is first complete
      (all ``n`` contributions summed) at some rank, its owner; ``a_o`` bytes have owner
      ``o`` (variables, ``a_o >= 0``, summing to ``S``: a schedule chooses where each
      element's reduction completes). Reduce-scatter: one family per source sending ``a_o``
      to each other owner ``o``; allgather: one family per destination receiving ``a_o`` from
      each other owner. Within a phase families do not share capacity (one byte on a link
      can serve several families: merged partial sums, multicast), so each phase puts
      ``u_e`` (reduce-scatter) and ``w_e`` (allgather) bytes on link ``e``, at least every
      family's flow there; the phases share the link: ``u_e + w_e <= c_e T``; minimize ``T``.
      It is at least the cut bound (``S`` each way across every cut: ``a`` inside plus ``a``
      outside), so at least the reducescatter and the allgather LPs, and at most their sum
      (the bound of the two phases one after the other, which overlapping phases beat on
      full-duplex links: ``sum`` is not a bound). On a torus the owners' shares, ``u`` and
      ``w`` keep one value per orbit and the families one per orbit (exact, as above). One
      HiGHS LP (interior point + crossover) with ``2 x families x links`` flow variables;
      above ``LP_MAX_JOINT_VARIABLES`` of them (or ``--lp-max-variables``) the bound is the
      larger of the reducescatter and allgather LPs (each at most a cut bound, so valid),
      and the description says so.
    * broadcast / reduce: one family per non-root rank: ``S`` from the root (to the root),
      capacities not shared — the max-flow bound.
``routes``
    A group smaller than the machine: one flow per pair of members along the routes the
    routing carries between them, every member sending and receiving what it must, all
    sharing each link (:mod:`cclc.route_bound`). The LP above lets a link any pair's route
    reaches carry any commodity; this one knows that a GPU outside the group forwards nothing,
    so a link only one pair's routes reach carries only that pair's bytes.

``Bounds.best`` is the largest of the bounds, ``Bounds.name`` which one it is; "% of bound"
is ``best / simulated time``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp
from scipy.optimize import linprog

from cclc.bounds_closed_form import (
    Bound,
    Facts,
    candidate_cuts,
    cut_bound,
    cut_time,
    hop_bytes_bound,
    injection_bound,
    latency_bound,
    latency_graph,
    vertex_nodes,
)
from cclc.collective import Collective, CollectiveKind
from cclc.errors import CclError
from cclc.flow_lp import (
    CertifiedLP,
    Symmetry,
    alltoall_lp_certified,
    alltoall_lp_routed,
    alltoall_lp_time,
    torus_automorphism_count,
    torus_symmetry,
)
from cclc.route_bound import routes_bound

__all__ = ["LP_EXACT_MAX_VARIABLES", "LP_MAX_FAMILIES", "LP_MAX_FLOW_LINKS",
           "LP_MAX_JOINT_VARIABLES",
           "LP_MAX_VARIABLES", "LP_PDLP_MAX_VARIABLES", "Bound", "Bounds",
           "bounds", "cut_bound", "hop_bytes_bound", "injection_bound", "latency_bound",
           "latency_graph", "lp_bound",
           "lp_size", "lp_skipped_note", "vertex_nodes"]

#: the alltoall LP (one multi-commodity LP, capacities shared) is skipped by default above this
#: many flow variables (commodity families x healthy links, after the symmetry reduction); up
#: to it, PDLP and a certificate (see ``LP_EXACT_MAX_VARIABLES``) take about 2 s on a 5x5x5
#: torus with one or four failed links and 53 s on an 8x8x8 torus with one (120 x 3071; 2
#: cores, load 7); with four (512 x 3068, routed: ``LP_PDLP_MAX_VARIABLES``) 21 s.
#: A healthy torus of any size has one family. The default keeps every 5x5x5 case (four
#: failed links: 75 x 746) and leaves the faulty 8x8x8 out, because ``cclc compile`` prints
#: this bound and must not spend 20-55 s on a report line (there the certified value
#: is the cut bound, which compile prints anyway); ``cclc bounds --lp-max-variables`` raises
#: it.
LP_MAX_VARIABLES = 60_000
#: up to this many flow variables the alltoall LP is solved exactly (HiGHS interior point and
#: crossover, about a second); above it PDLP solves it approximately and the bound is the
#: certified lower value of its solution (:func:`cclc.flow_lp.alltoall_lp_certified`):
#: HiGHS took 30 s on 56 000 variables and failed on 368 000
LP_EXACT_MAX_VARIABLES = 10_000
#: PDLP's relative tolerance and iteration limit for the certified alltoall LP: the
#: certificate holds whatever they are. On 8x8x8 with one failed link (120 x 3071, 2 cores,
#: load 7) 1e-4 took 63 s for a gap of 0.0035% to a feasible flow, 3e-4 50 s for 0.26% and
#: 1e-3 15 s for 9.7%: 3e-4 keeps the bound within a minute and the gap under 0.5%
PDLP_TOLERANCE = 3e-4
PDLP_ITERATION_LIMIT = 20_000
#: above this many flow variables PDLP is not run: the alltoall LP is pinned by routing
#: (:func:`cclc.flow_lp.alltoall_lp_routed`: certified prices below, a routed feasible flow
#: above). PDLP took 53 s on 368 520 variables (8x8x8, one failed link: kept, gap 0.26%) and
#: 347 s on 1.57M (8x8x8, four; routed: 21 s, gap 1.4%; see ``benchmarks/bounds_scale.py``)
LP_PDLP_MAX_VARIABLES = 400_000
#: passes of the routing and the gap at which it stops early
ROUTED_PASSES = 40
ROUTED_TARGET_GAP = 5e-3
#: the joint allreduce LP (one HiGHS LP, 2 x families x links flow variables) is replaced by the
#: larger of the reducescatter and allgather LPs above this many flow variables by default:
#: tpuv4_4x4x4_ocs has 9120 (4-7 s), a 5x5x5 torus with one failed link 44940 (about a minute)
LP_MAX_JOINT_VARIABLES = 10_000
#: the other LPs split into one max-flow LP per family (links variables each): skipped above
#: this many families (8x8x8 with a failed link: 120 allgather families)
LP_MAX_FAMILIES = 1024
#: the max-flow LPs (not alltoall) are skipped above this many links each: a node of 4,096
#: NICs (a mutated example) made 7 LPs of 2.1M variables each, which GLOP worked on for
#: minutes; the largest machine cclc ships, 4,096 GPUs on a three-tier fabric, has 29,184
LP_MAX_FLOW_LINKS = 500_000
#: the torus symmetry search (every automorphism of the torus checked against the faults) is
#: skipped above this many vertices
SYMMETRY_MAX_VERTICES = 4096
#: the symmetry search maps every healthy link by every automorphism: above this many link
#: images it searches the translations alone (a subgroup: the reduction stays exact), and
#: above it for those too it is skipped. About 1e7 images a second: 8x8x8 (24576
#: automorphisms x 3072 links) takes 8 s; 16x16x16 would be 196608 x 24576 (minutes), and
#: the twelve alike dimensions of torus(2, ..., 2) have 12! permutations to list
SYMMETRY_MAX_IMAGES = 80_000_000

K = CollectiveKind


@dataclass(frozen=True)
class Bounds:
    """Every bound computed for one collective; ``notes`` say what was skipped and why."""

    collective: str
    items: tuple[Bound, ...]
    notes: tuple[str, ...] = ()

    @property
    def best_bound(self) -> Bound:
        """The strongest bound; among (numerically) equal ones the first listed."""
        top = max(b.seconds for b in self.items)
        return next(b for b in self.items if b.seconds >= top * (1 - 1e-9))

    @property
    def best(self) -> float:
        """The strongest (largest) lower bound, in seconds."""
        return self.best_bound.seconds

    @property
    def name(self) -> str:
        """The name of the strongest bound."""
        return self.best_bound.name

    def __getitem__(self, name: str) -> Bound:
        for b in self.items:
            if b.name == name:
                return b
        raise KeyError(name)

    def get(self, name: str) -> Bound | None:
        for b in self.items:
            if b.name == name:
                return b
        return None


# --------------------------------------------------------------------------------------------
# the LP


def _families(f: Facts, sym: Symmetry | None = None) -> tuple[list[tuple[int, np.ndarray]],
                                                                  bool]:
    """Commodity families: (root vertex, net supply per vertex) and whether they share
    capacity. Supply is positive where flow enters the network, negative where it leaves.
    With a symmetry, the allgather / reducescatter families keep one member per orbit (the
    families of one orbit are images of each other, so they have the same max-flow)."""
    V = f.topo.n_vertices
    n, S, g = f.n, f.S, f.group
    fams: list[tuple[int, np.ndarray]] = []
    if f.kind is K.ALLTOALL:
        m = f.pair_bytes()
        for i in range(n):
            sup = np.zeros(V)
            np.add.at(sup, g, -m[i])
            sup[g[i]] += m[i].sum()
            fams.append((int(g[i]), sup))
        return fams, True
    members = range(n)
    if sym is not None and f.kind in (K.ALLGATHER, K.REDUCESCATTER):
        members = sym.representatives(g).tolist()
    for i in members:
        sup = np.zeros(V)
        if f.kind is K.ALLGATHER:          # into destination i from every other rank
            sup[g] = S / n
            sup[g[i]] = -(n - 1) * S / n
        elif f.kind is K.REDUCESCATTER:    # out of source i to every other rank
            sup[g] = -S / n
            sup[g[i]] = (n - 1) * S / n
        elif f.kind is K.BROADCAST:
            if i == f.root:
                continue
            sup[g[f.root]], sup[g[i]] = S, -S
        elif f.kind is K.REDUCE:
            if i == f.root:
                continue
            sup[g[i]], sup[g[f.root]] = S, -S
        fams.append((int(g[i]), sup))
    return fams, False


def _symmetry(f: Facts) -> Symmetry:
    """The torus automorphisms the faults, the group and the sizes leave intact (see
    :mod:`cclc.flow_lp`); the translations alone, or the trivial group, where checking them
    all is over ``SYMMETRY_MAX_IMAGES`` link images (the trivial group beyond
    ``SYMMETRY_MAX_VERTICES``)."""
    search = symmetry_search(f.topo, len(f.src))
    if search is None:
        return Symmetry.trivial(f.topo.n_vertices, f.src, f.dst)
    pair = f.pair_bytes() if f.kind is K.ALLTOALL and f.coll.pair_sizes is not None else None
    # kept on the topology: every kind and size over one group shares it
    key = ("torus_symmetry", f.group.tobytes(), None if pair is None else pair.tobytes())
    cache = f.topo._cache
    if key not in cache:
        f.say(f"searching the torus symmetries ({search[1]} automorphisms x {len(f.src)} "
              "links)")
        cache[key] = torus_symmetry(f.topo, f.src, f.dst, f.bw, f.group, pair,
                                    point_maps=search[0])
    return cache[key]


def symmetry_search(topo, n_links: int) -> tuple[bool, int] | None:
    """How the LP's symmetry search runs on ``topo`` with ``n_links`` usable links: (whether
    it checks the point maps too, or the translations alone; the automorphisms it checks),
    or ``None`` when it is skipped (not a torus of ranks, or too many link images)."""
    if (topo.dims is None or topo.wrap is None or topo.n_vertices != topo.n_ranks
            or topo.n_vertices > SYMMETRY_MAX_VERTICES):
        return None
    point_maps, translations = torus_automorphism_count(topo.dims, topo.wrap)
    if point_maps * translations * n_links <= SYMMETRY_MAX_IMAGES:
        return True, point_maps * translations
    if translations * n_links <= SYMMETRY_MAX_IMAGES:
        return False, translations
    return None


def _lp_families(f: Facts, sym: Symmetry) -> int:
    """How many commodity families the LP of ``f.kind`` solves with the symmetry ``sym``."""
    if f.kind in (K.ALLTOALL, K.ALLGATHER, K.REDUCESCATTER):
        return len(sym.representatives(f.group))
    if f.kind is K.ALLREDUCE:
        return 2 * len(sym.representatives(f.group))
    return f.n - 1


def _check_connected(f: Facts, fams: list[tuple[int, np.ndarray]]) -> None:
    for _, sup in fams:
        for v in np.flatnonzero(sup).tolist():
            if f.cap_out[v] + f.cap_in[v] <= 0:
                raise CclError(f"collective '{f.coll.name}': {f.topo.vertex_names[v]} has no "
                               "healthy link")


def _solve_lp(f: Facts, sym: Symmetry | None = None) -> float:
    """Max-concurrent-flow time bound (seconds) for ``f.kind`` (not allreduce)."""
    cmax = float(f.bw.max())
    if f.kind is K.ALLTOALL:
        return _alltoall_lp(f, sym if sym is not None else _symmetry(f))[0]
    fams, _ = _families(f, sym)
    if not fams:
        return 0.0
    _check_connected(f, fams)
    # families do not share capacity, so the LP splits into one max-flow per family: solve
    # them one by one on the same model (only lambda's coefficients change), and the bound is
    # set by the worst family
    f.say(f"solving {len(fams)} max-flow LPs ({len(f.src)} variables each)")
    model = _FlowLP(f, 1, shared=False)
    lam = min(model.solve([sup]) for _, sup in fams)
    if lam <= 0:
        raise CclError(f"collective '{f.coll.name}': the LP finds no flow; the group is "
                       "disconnected")
    # the model is scaled (demands in units of S, capacities in units of the largest
    # bandwidth): lambda demands per second is lambda_scaled * cmax / S
    return f.S / (lam * cmax)


def _alltoall_lp(f: Facts, sym: Symmetry) -> tuple[float, CertifiedLP | None]:
    """The alltoall LP bound (seconds): exact (HiGHS) up to ``LP_EXACT_MAX_VARIABLES`` flow
    variables, above that the certified lower value of PDLP's solution, above
    ``LP_PDLP_MAX_VARIABLES`` the best certificate of the routed bracket (and the certificate,
    in the LP's scaled units)."""
    cmax = float(f.bw.max())
    pair = f.pair_bytes()
    g = f.group
    active = (pair.sum(axis=1) > 0) | (pair.sum(axis=0) > 0)
    for v in g[active].tolist():
        if f.cap_out[v] + f.cap_in[v] <= 0:
            raise CclError(f"collective '{f.coll.name}': {f.topo.vertex_names[v]} has no "
                           "healthy link")
    if not active.any():
        return 0.0, None
    # the largest pair is one unit: HiGHS's tolerances are absolute (1e-7), so demands
    # of 1/n of the size would leave them room to bend the optimum at 512 ranks
    unit = float(pair.max())
    args = (f.topo.n_vertices, f.src, f.dst, f.bw / cmax, g, pair / unit, sym)
    cert = None
    try:
        n_variables = _lp_families(f, sym) * len(f.src)
        if n_variables <= LP_EXACT_MAX_VARIABLES:
            f.say(f"solving the flow LP ({n_variables} variables, HiGHS)")
            t = alltoall_lp_time(*args)
        elif n_variables <= LP_PDLP_MAX_VARIABLES:
            f.say(f"solving the flow LP ({n_variables} variables, PDLP)")
            cert = alltoall_lp_certified(*args, tolerance=PDLP_TOLERANCE,
                                         iteration_limit=PDLP_ITERATION_LIMIT,
                                         prices=_cut_prices(f))
            t = cert.lower
        else:
            f.say(f"bracketing the flow LP ({n_variables} variables) by routing")
            cert = alltoall_lp_routed(*args[:-1], prices=_cut_prices(f), passes=ROUTED_PASSES,
                                      target_gap=ROUTED_TARGET_GAP)
            t = cert.lower
    except CclError as e:
        raise CclError(f"collective '{f.coll.name}': {e}") from None
    if not np.isfinite(t):
        raise CclError(f"collective '{f.coll.name}': no flow routes every pair of the "
                       "alltoall: the group is disconnected")
    return unit * t / cmax, cert


def _cut_prices(f: Facts) -> tuple[np.ndarray, ...]:
    """Link prices that certify the best candidate cut: the indicator of its links in each
    direction (weak duality then gives that cut's bound, so the LP's certified value is never
    below the cut bound)."""
    pair = f.pair_bytes() if f.coll.pair_sizes is not None else None
    best, side = 0.0, None
    for _, mask in candidate_cuts(f):
        t = cut_time(f, mask, pair)
        if t > best:
            best, side = t, mask
    if side is None:
        return ()
    return ((side[f.src] & ~side[f.dst]).astype(np.float64),
            (~side[f.src] & side[f.dst]).astype(np.float64))


class _FlowLP:
    """``k`` flow families over the healthy links: maximize lambda such that family ``i``
    routes ``lambda * supply_i`` (scaled: bytes / S) within the capacities (bandwidth / the
    largest bandwidth), shared by all families or separate for each."""

    def __init__(self, f: Facts, k: int, shared: bool):
        # OR-Tools (0.1-0.4 s to import) only when this model is solved
        from ortools.linear_solver import pywraplp

        self.pywraplp = pywraplp
        self.f = f
        solver = pywraplp.Solver.CreateSolver("GLOP")
        if solver is None:
            raise CclError("OR-Tools GLOP is not available: cannot solve the LP bound")
        self.solver = solver
        cap = (f.bw / float(f.bw.max())).tolist()
        src, dst = f.src.tolist(), f.dst.tolist()
        E = len(cap)
        inf = solver.infinity()
        self.lam = solver.NumVar(0.0, inf, "lambda")
        solver.Maximize(self.lam)
        vertices = sorted(set(src) | set(dst))
        self.rows: list[dict[int, Any]] = []      # pywraplp constraints, by vertex
        flows = []
        for _ in range(k):
            x = [solver.NumVar(0.0, inf if shared else cap[e], "") for e in range(E)]
            flows.append(x)
            # conservation: out - in - lambda * supply = 0 at every vertex with links
            rows = {v: solver.Constraint(0.0, 0.0) for v in vertices}
            for e in range(E):
                rows[src[e]].SetCoefficient(x[e], 1.0)
                rows[dst[e]].SetCoefficient(x[e], -1.0)
            self.rows.append(rows)
        if shared:
            for e in range(E):
                c = solver.Constraint(-inf, cap[e])
                for x in flows:
                    c.SetCoefficient(x[e], 1.0)
        self.set_lam: list[list[int]] = [[] for _ in range(k)]

    def solve(self, supplies: list[np.ndarray]) -> float:
        """lambda (scaled) for these family supplies; the model is reused between calls."""
        pywraplp = self.pywraplp
        for i, sup in enumerate(supplies):
            rows = self.rows[i]
            for v in self.set_lam[i]:
                rows[v].SetCoefficient(self.lam, 0.0)
            nz = np.flatnonzero(sup).tolist()
            for v in nz:
                rows[v].SetCoefficient(self.lam, -float(sup[v]) / self.f.S)
            self.set_lam[i] = nz
        status = self.solver.Solve()
        if status != pywraplp.Solver.OPTIMAL:
            raise CclError(f"the LP bound of collective '{self.f.coll.name}' did not solve "
                           f"(status {status})")
        return float(self.lam.solution_value())


def _allreduce_lp(f: Facts, sym: Symmetry, free_owners: bool = True) -> float:
    """The joint reduce-scatter + allgather LP of an allreduce (seconds); see the module
    docstring. Units: bytes of ``S/n`` and capacities over the largest bandwidth."""
    V, E, n = f.topo.n_vertices, len(f.src), f.n
    g = f.group
    reps = sym.representatives(g)
    k = len(reps)
    # the vertex orbits of the members: the owners' shares, one per orbit
    _, member_orbit, orbit_members = np.unique(sym.vertex_key[g], return_inverse=True,
                                               return_counts=True)
    n_own = len(orbit_members)
    orbits = sym.n_link_orbits
    cap = np.zeros(orbits)
    cap[sym.link_orbit] = f.bw / float(f.bw.max())          # equal within an orbit
    # columns: RS flows (k x E), AG flows (k x E), u (orbits), w (orbits), owners' shares, T
    n_flow = k * E
    c_u, c_w = 2 * n_flow, 2 * n_flow + orbits
    c_a = c_w + orbits
    c_t = c_a + n_own
    n_col = c_t + 1
    r_idx = np.repeat(np.arange(k), E)
    e_idx = np.tile(np.arange(E), k)
    flow = r_idx * E + e_idx
    # conservation, phase p (0: RS out of each representative source, 1: AG into each
    # representative destination), family r, vertex v: out - in = net supply, where a member
    # o other than the family's rank takes (RS) / gives (AG) its share a_o and the family's
    # rank gives (RS) / takes (AG) the sum of the others' shares
    rows, cols, vals = [], [], []
    for p in (0, 1):
        base = p * k * V
        rows += [base + r_idx * V + f.src[e_idx], base + r_idx * V + f.dst[e_idx]]
        cols += [p * n_flow + flow, p * n_flow + flow]
        vals += [np.ones(n_flow), -np.ones(n_flow)]
        sign = 1.0 if p == 0 else -1.0          # RS: the rank supplies; AG: it absorbs
        for r_pos, r in enumerate(reps.tolist()):
            others = np.arange(n) != r
            row_of = base + r_pos * V
            # member o != r: out - in = -sign * a_o  ->  out - in + sign * a_o = 0
            rows.append(row_of + g[others])
            cols.append(c_a + member_orbit[others])
            vals.append(np.full(int(others.sum()), sign))
            # the rank: out - in = sign * sum_{o != r} a_o
            rows.append(np.full(n - 1, row_of + g[r]))
            cols.append(c_a + member_orbit[others])
            vals.append(np.full(n - 1, -sign))
    eq = sp.csr_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                       shape=(2 * k * V, n_col))
    b_eq = np.zeros(2 * k * V)
    # every phase's family fits in the bytes that phase puts on the link: x <= u, y <= w
    link = sym.link_orbit[e_idx]
    le_rows = np.arange(2 * n_flow)
    ub = [sp.csr_matrix((np.concatenate([np.ones(2 * n_flow), -np.ones(2 * n_flow)]),
                         (np.concatenate([le_rows, le_rows]),
                          np.concatenate([np.arange(2 * n_flow),
                                          np.concatenate([c_u + link, c_w + link])]))),
                        shape=(2 * n_flow, n_col))]
    # the two phases share each directed link: u + w <= cap * T
    o = np.arange(orbits)
    ub.append(sp.csr_matrix((np.concatenate([np.ones(orbits), np.ones(orbits), -cap]),
                             (np.concatenate([o, o, o]),
                              np.concatenate([c_u + o, c_w + o, np.full(orbits, c_t)]))),
                            shape=(orbits, n_col)))
    A_ub = sp.vstack(ub).tocsr()
    b_ub = np.zeros(2 * n_flow + orbits)
    # the shares add up to the buffer (n units of S/n); fixed at one unit each unless free
    bounds_: list[tuple[float, float | None]] = [(0, None)] * n_col
    if free_owners:
        A_eq = sp.vstack([eq, sp.csr_matrix((orbit_members.astype(float),
                                             (np.zeros(n_own, dtype=int), c_a + np.arange(n_own))),
                                            shape=(1, n_col))]).tocsr()
        b_eq = np.append(b_eq, float(n))
    else:
        A_eq = eq
        for i in range(n_own):
            bounds_[c_a + i] = (1.0, 1.0)
    cost = np.zeros(n_col)
    cost[c_t] = 1.0
    res = linprog(cost, A_ub=A_ub, b_ub=b_ub, A_eq=A_eq, b_eq=b_eq, bounds=bounds_,
                  method="highs-ipm")
    if res.status == 2:
        raise CclError(f"collective '{f.coll.name}': the LP finds no flow; the group is "
                       "disconnected")
    if res.status != 0:
        raise CclError(f"the allreduce LP bound of collective '{f.coll.name}' did not solve "
                       f"(HiGHS: {res.message})")
    # T is in units of (S/n) / the largest bandwidth
    return float(res.fun) * f.S / n / float(f.bw.max())


def lp_size(coll: Collective) -> tuple[int, int]:
    """(commodity families, healthy links) of the LP :func:`lp_bound` solves for ``coll``,
    after the symmetry reduction; their product is the number of flow variables."""
    f = Facts(coll)
    return _lp_families(f, _symmetry(f)), len(f.src)


def lp_bound(coll: Collective, max_ranks: int | None = None,
             max_variables: int | None = None,
             on_stage: Callable[[str], None] | None = None) -> Bound | None:
    """The max-concurrent-flow LP bound (see the module docstring), or ``None`` when it is too
    large: more than ``max_ranks`` ranks when given, else more than ``max_variables`` (default
    ``LP_MAX_VARIABLES``) flow variables (alltoall, one LP) or ``LP_MAX_FAMILIES`` max-flow LPs
    (the others). ``on_stage(what)`` is told what each long step waits for, before it starts.

    The scaled optimum does not depend on the size, so it is kept on the topology and a second
    call for the same group (another size, another candidate) costs nothing."""
    if max_ranks is not None and coll.n > max_ranks:
        return None
    f = Facts(coll, on_stage)
    if f.n < 2:
        return Bound("lp", 0.0, "a single rank")
    what = {K.ALLTOALL: "max-concurrent-flow LP, commodities by source",
            K.ALLGATHER: "max-flow LP into every rank (= best cut)",
            K.REDUCESCATTER: "max-flow LP out of every rank (= best cut)",
            K.ALLREDUCE: "joint LP: reduce-scatter and allgather flows sharing each link",
            K.BROADCAST: "max-flow LP from the root to every rank",
            K.REDUCE: "max-flow LP from every rank to the root"}[f.kind]
    pair = coll.pair_sizes
    key = ("lp_bound", f.kind, f.group.tobytes(), f.root,
           None if pair is None else (pair.tobytes(), f.S))
    cache = f.topo._cache
    default = LP_MAX_JOINT_VARIABLES if f.kind is K.ALLREDUCE else LP_MAX_VARIABLES
    limit = default if max_variables is None else max_variables
    forced = max_ranks is not None
    if (key not in cache or (cache[key][0] is None and (forced or limit > default))
            or (cache[key][2] and (forced or cache[key][2] <= limit))):
        cache[key] = _scaled_lp(f, forced, limit)
    scaled, sym, fallback, cert = cache[key]
    if scaled is None:
        return None
    if fallback:
        what = ("max(reduce-scatter LP, allgather LP): the joint allreduce LP has "
                f"{fallback} flow variables > {limit}")
    if sym.order > 1:
        what += (f", reduced by {sym.order} torus symmetries to "
                 f"{_lp_families(f, sym)} commodity families")
    if cert is not None and cert.method == "routed":
        what += ("; certified lower value (weak duality: the best of hop counts, the best cut "
                 f"and routing's link prices), a routed feasible flow {100 * cert.gap:.3g}% "
                 "above it")
    elif cert is not None:
        what += (f"; certified lower value of PDLP's solution (weak duality, link prices; "
                 f"the best cut's links too), a feasible flow {100 * cert.gap:.3g}% above it")
    return Bound("lp", scaled * f.S, what)


def _scaled_lp(f: Facts, forced: bool,
               max_variables: int) -> tuple[float | None, Symmetry, int, CertifiedLP | None]:
    """The LP bound over ``S`` (``None``: over the limits, unless ``forced``), and for an
    allreduce whose joint LP is over ``max_variables`` flow variables (unless ``forced``) that
    number: the bound is then the larger of the reduce-scatter and allgather LPs (0: not)."""
    if not forced and f.kind is not K.ALLTOALL and len(f.src) > LP_MAX_FLOW_LINKS:
        # over the link limit whatever the symmetry: skipped before searching for it
        return None, Symmetry.trivial(f.topo.n_vertices, f.src, f.dst), 0, None
    sym = _symmetry(f)
    families = _lp_families(f, sym)
    if not forced:
        if f.kind is K.ALLTOALL and families * len(f.src) > max_variables:
            return None, sym, 0, None
        if f.kind is not K.ALLTOALL and families > LP_MAX_FAMILIES:
            return None, sym, 0, None
    fallback = 0
    cert = None
    if f.kind is K.ALLREDUCE and (forced or families * len(f.src) <= max_variables):
        f.say(f"solving the joint allreduce LP ({families * len(f.src)} flow variables, "
              "HiGHS)")
        t = _allreduce_lp(f, sym)
    elif f.kind is K.ALLREDUCE:
        # valid: each is at most the cut bound S / (capacity leaving a vertex set) of the
        # minimum cut of some family, and S must cross every cut each way
        fallback = families * len(f.src)
        t = max(_solve_lp(_with_kind(f, K.REDUCESCATTER), sym),
                _solve_lp(_with_kind(f, K.ALLGATHER), sym))
    elif f.kind is K.ALLTOALL:
        t, cert = _alltoall_lp(f, sym)
    else:
        t = _solve_lp(f, sym)
    return t / f.S, sym, fallback, cert


def lp_skipped_note(coll: Collective, max_variables: int | None = None) -> str:
    """Why :func:`lp_bound` skipped ``coll`` under these limits (the symmetry searched for
    only where the note counts families: not over the link limit, which it was not searched
    for)."""
    f = Facts(coll)
    links = len(f.src)
    over_links = coll.kind is not K.ALLTOALL and links > LP_MAX_FLOW_LINKS
    families = 0 if over_links else _lp_families(f, _symmetry(f))
    topo = coll.topology
    unreduced = ""
    if (topo.dims is not None and topo.wrap is not None and topo.n_vertices == topo.n_ranks
            and symmetry_search(topo, links) is None):
        point_maps, translations = torus_automorphism_count(topo.dims, topo.wrap)
        unreduced = (f"; not reduced by symmetry: {point_maps * translations:.3g} torus "
                     f"automorphisms x {links} links are too many to check")
    if coll.kind is K.ALLTOALL:
        limit = LP_MAX_VARIABLES if max_variables is None else max_variables
        return (f"lp: skipped, {families} commodity families x {links} links = "
                f"{families * links} flow variables > {limit} (closed forms only{unreduced})")
    if over_links:
        return (f"lp: skipped, {links} links > {LP_MAX_FLOW_LINKS} in each of its max-flow "
                f"LPs (closed forms only{unreduced})")
    return (f"lp: skipped, {families} max-flow LPs > {LP_MAX_FAMILIES} (closed forms "
            f"only{unreduced})")


def _with_kind(f: Facts, kind: CollectiveKind) -> Facts:
    g = object.__new__(Facts)
    g.__dict__.update(f.__dict__)
    g.kind = kind
    return g


# --------------------------------------------------------------------------------------------


def bounds(coll: Collective, lp: bool = True, lp_max_ranks: int | None = None,
           lp_max_variables: int | None = None,
           on_stage: Callable[[str], None] | None = None) -> Bounds:
    """Every lower bound of ``coll`` (seconds); ``.best`` is the strongest. The LP's limits
    are those of :func:`lp_bound`; ``on_stage(what)`` is told what each long step waits for
    (a progress line: the LP's size and solver, the symmetry search), before it starts.

    >>> from cclc.topology import torus                                          # doctest: +SKIP
    >>> b = bounds(make_collective("a", CollectiveKind.ALLTOALL, torus("r", (8,)),
    ...                            tuple(range(8)), size=8 << 20))                # doctest: +SKIP
    >>> b.name, b.best                                                           # doctest: +SKIP
    """
    try:
        return _bounds(coll, lp, lp_max_ranks, lp_max_variables, on_stage)
    except CclError as e:
        # a group no schedule can join: point at the collective in the file
        if coll.span is not None:
            e.with_span(coll.span)
        raise


def _bounds(coll: Collective, lp: bool, lp_max_ranks: int | None,
            lp_max_variables: int | None, on_stage: Callable[[str], None] | None) -> Bounds:
    say = on_stage or (lambda what: None)
    say("closed forms (hop bytes, injection, cuts, latency)")
    items = [hop_bytes_bound(coll), injection_bound(coll), cut_bound(coll), latency_bound(coll)]
    notes: list[str] = []
    if lp:
        b = lp_bound(coll, max_ranks=lp_max_ranks, max_variables=lp_max_variables,
                     on_stage=on_stage)
        if b is None and lp_max_ranks is not None:
            notes.append(f"lp: skipped, {coll.n} ranks > {lp_max_ranks} (closed forms only)")
        elif b is None:
            notes.append(lp_skipped_note(coll, lp_max_variables))
        else:
            items.append(b)
        # a group smaller than the machine: what its members send and receive over the routes
        # between them (GPUs outside it forward nothing)
        routes, skipped = routes_bound(coll, on_stage)
        if routes is not None:
            items.append(routes)
        if skipped is not None:
            notes.append(skipped)
    else:
        notes.append("lp: not computed")
    return Bounds(collective=coll.name, items=tuple(items), notes=tuple(notes))
