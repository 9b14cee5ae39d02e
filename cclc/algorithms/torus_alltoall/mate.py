"""MATE and MATEe: DimRotation on a torus with one failed link, the faulty ring accelerated.

Each stage has a normal part (healthy rings: HalfRing; the faulty ring idles in its dimension,
or for ``matee`` moves a share ``f = T_HR / T_FR`` by FoldedRing) and an acceleration part, in
which the faulty ring's remaining data moves over 3-link detours through the parallel rings one
step away in every other dimension (one lane per neighbour ring, a HalfRing over the virtual
ring of detours) plus a share by FoldedRing on its own surviving links. The shares make every
lane finish together: a lane's share is proportional to ``1 / (time per unit)`` of its plan,
measured on the actual links (``rho="derived"``: gives ``rho = T_HR/T_FR = (N+1)/(4N)`` for odd
``N``, ``N/(4(N-1))`` for even ``N``). ``rho="artifact"`` reproduces the paper artifact's
accelerating divisor (``HalfRing.cc``), which swaps the two formulas; ``rho="lockstep"`` solves
a small LP for the shares that minimize the lockstep time; a number sets ``rho``.
``shares="lanes"`` cuts every chunk into one lane per share (exact); ``shares="slots"`` gives
each share a range of whole slots of every aggregated block (``1/m`` precision, but the op count
of plain DimRotation); ``auto`` picks lanes while the torus is small.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from cclc.algorithms.common import torus_link_table
from cclc.algorithms.torus_alltoall.faults import (
    TorusFaults,
    active_dims,
    torus_faults,
    torus_reason,
)
from cclc.algorithms.torus_alltoall.ring_plans import (
    MINUS,
    PLUS,
    RING,
    RingPlan,
    detour_plan,
    folded_plan,
    halfring_plan,
)
from cclc.algorithms.torus_alltoall.strategies import (
    Group,
    Layout,
    PlanUse,
    dim_groups,
    needs_direction_lanes,
    phase_len,
    rotated_phases,
)
from cclc.collective import Collective
from cclc.errors import ScheduleError

__all__ = ["mate_applicable", "mate_layout"]

#: most chunks (``n^2`` x pieces x lanes over all ranks) for which ``shares=auto`` picks lanes
_AUTO_LANES_LIMIT = 4_000_000


def _plan_time_per_unit(topo, plans: list[RingPlan], ring: np.ndarray, d: int) -> float:
    """Seconds the busiest link needs per byte of a rank's data when ``plans`` (equal shares:
    the two antipode directions of an even ring) move it on ``ring``; a block is 1/N of it."""
    table = torus_link_table(topo)
    load: dict[int, float] = {}
    for plan in plans:
        for src, pid in zip(plan.src.tolist(), plan.path.tolist(), strict=True):
            r = int(ring[src])
            for axis, direction in plan.paths[pid]:
                link = int(table[r, d if axis == RING else axis, direction])
                load[link] = load.get(link, 0.0) + 1.0 / (plan.n * len(plans))
                r = int(topo.link_dst[link])
    return max(v / topo.link_bandwidth[k] for k, v in load.items())


def _stage_costs(topo, plans: list[RingPlan], ring: np.ndarray, d: int, length: int
                 ) -> np.ndarray:
    """Per stage: seconds the busiest link needs per byte of a rank's data (as above, but
    stage by stage: what a lockstep step costs)."""
    table = torus_link_table(topo)
    load: dict[tuple[int, int], float] = {}
    for plan in plans:
        for st, src, pid in zip(plan.stage.tolist(), plan.src.tolist(), plan.path.tolist(),
                                strict=True):
            r = int(ring[src])
            for axis, direction in plan.paths[pid]:
                link = int(table[r, d if axis == RING else axis, direction])
                key = (st, link)
                load[key] = load.get(key, 0.0) + 1.0 / (plan.n * len(plans))
                r = int(topo.link_dst[link])
    out = np.zeros(length)
    for (st, link), v in load.items():
        out[st] = max(out[st], v / topo.link_bandwidth[link])
    return out


def _lockstep_shares(normal: np.ndarray, normal_fr: np.ndarray | None,
                     accel: list[np.ndarray]) -> tuple[float, np.ndarray]:
    """Shares that minimize the lockstep time of one stage of the faulty dimension.

    ``normal[k]``: cost of normal step ``k`` without the faulty ring (fixed); ``normal_fr``:
    per-unit cost of the faulty ring's FoldedRing share in the normal part (MATEe) or None;
    ``accel[l]``: per-unit cost per accelerating step of lane ``l``. A small LP: minimize the
    sum over steps of the slowest lane, shares summing to one.
    """
    # OR-Tools (0.1-0.4 s to import) only when this model is solved
    from ortools.linear_solver import pywraplp

    # costs are ~1e-11 s/B: scale them to ~1 so that they sit far above the LP's tolerances
    scale = max(float(np.max(a)) for a in accel)
    normal = normal / scale
    normal_fr = None if normal_fr is None else normal_fr / scale
    accel = [a / scale for a in accel]
    solver = pywraplp.Solver.CreateSolver("GLOP")
    w = [solver.NumVar(0.0, 1.0, f"w{i}") for i in range(len(accel))]
    f = solver.NumVar(0.0, 1.0 if normal_fr is not None else 0.0, "f")
    solver.Add(sum(w) + f == 1.0)
    cost = []
    length = max(len(normal), len(normal_fr) if normal_fr is not None else 0)
    for k in range(length):
        t = solver.NumVar(0.0, solver.infinity(), f"n{k}")
        if k < len(normal):
            solver.Add(t >= float(normal[k]))
        if normal_fr is not None and k < len(normal_fr):
            solver.Add(t >= float(normal_fr[k]) * f)
        cost.append(t)
    for k in range(max(len(a) for a in accel)):
        t = solver.NumVar(0.0, solver.infinity(), f"a{k}")
        for wi, a in zip(w, accel, strict=True):
            if k < len(a):
                solver.Add(t >= float(a[k]) * wi)
        cost.append(t)
    solver.Minimize(sum(cost))
    if solver.Solve() != pywraplp.Solver.OPTIMAL:
        raise ScheduleError("internal: the lockstep share LP has no optimum")
    return float(f.solution_value()), np.array([x.solution_value() for x in w])


def _mate_families(f: TorusFaults, fd: int) -> list[tuple[int, int]]:
    """Detour families (dimension, sign) around the faulty ring of dimension ``fd``."""
    fam = []
    for j in active_dims(f.dims):
        if j == fd:
            continue
        signs = [PLUS] if f.dims[j] == 2 else [PLUS, MINUS]
        fam += [(j, s) for s in signs]
    return fam


def _usable_families(topo, f: TorusFaults, d: int, g: int) -> list[tuple[int, int]]:
    """The detour families whose first link exists at every rank of the faulty ring."""
    table = torus_link_table(topo)
    ring = f.rings[d][g]
    return [(j, s) for j, s in _mate_families(f, d) if (table[ring, j, s] >= 0).all()]


def _param_reason(what: str, params: dict) -> str | None:
    """Why MATE's parameters are wrong, or None."""
    rho = params.get("rho", "derived")
    if not (rho in ("derived", "artifact", "lockstep") or isinstance(rho, (int, float))):
        return f"rho must be 'derived', 'artifact', 'lockstep' or a number, not {rho!r}"
    if isinstance(rho, (int, float)) and not rho >= 0:
        return f"rho must be >= 0, got {rho}"
    if params.get("shares", "auto") not in ("auto", "lanes", "slots"):
        return f"shares must be 'auto', 'lanes' or 'slots', not {params['shares']!r}"
    extra = set(params) - {"rho", "shares"}
    if extra:
        return f"{what} takes only the parameters rho and shares (got {', '.join(sorted(extra))})"
    return None


def mate_applicable(coll: Collective, enhanced: bool, params: dict) -> str | None:
    """Why MATE (``enhanced``: MATEe) cannot serve ``coll`` with ``params``, or None."""
    what = "matee" if enhanced else "mate"
    reason = torus_reason(coll, what)
    if reason:
        return reason
    f = torus_faults(coll.topology)
    faulty = [(d, g) for d in range(len(f.dims)) for g in f.broken[d]]
    if not faulty:
        return (f"{what} accelerates a ring with a failed link; this "
                f"{coll.topology.kind_name} has none (halfring+dimrotation is its healthy "
                "counterpart)")
    if len(faulty) > 1:
        where = ", ".join(f"dimension {d}" for d, _ in faulty)
        return (f"{what} accelerates one faulty ring; here {len(faulty)} rings have failed links "
                f"({where}) and their detours would share links: foldedring+dimrotation serves "
                f"any number of rings with one failed link each")
    d, g = faulty[0]
    if not f.wrap[d] or f.dims[d] < 3:
        return f"{what} needs the failed link on a wrapped ring of at least 3 ranks"
    if not _usable_families(coll.topology, f, d, g):
        return (f"{what} detours through the rings of other dimensions, and this "
                f"{coll.topology.kind_name} has no other dimension of size > 1 around the faulty "
                "ring: foldedring+pipeline "
                f"serves it")
    return _param_reason(what, params)


@dataclass(frozen=True)
class _FaultyRing:
    """The one ring with a failed link (``fd``: dimension, ``fg``: ring index, ``cut``: edge)
    and the detour families around it."""

    f: TorusFaults
    fd: int
    fg: int
    cut: int
    fams: tuple[tuple[int, int], ...]

    @property
    def N(self) -> int:
        return self.f.dims[self.fd]

    @property
    def ring(self) -> np.ndarray:
        return self.f.rings[self.fd][self.fg]

    @property
    def healthy_ring(self) -> np.ndarray:
        """A ring of the same dimension without failures (the next one)."""
        rings = self.f.rings[self.fd]
        return rings[(self.fg + 1) % rings.shape[0]]


def _faulty_ring(topo) -> _FaultyRing:
    f = torus_faults(topo)
    (fd, fg), = [(d, g) for d in range(len(f.dims)) for g in f.broken[d]]
    (cut,) = f.broken[fd][fg]
    return _FaultyRing(f, fd, fg, cut, tuple(_usable_families(topo, f, fd, fg)))


@dataclass(frozen=True)
class _Shares:
    """Fractions of the faulty ring's data: ``accel`` per detour family then its own
    FoldedRing in the acceleration part; ``normal`` by FoldedRing in the normal part (MATEe)."""

    accel: np.ndarray
    normal: float


def _derived_or_fixed_shares(topo, fr: _FaultyRing, enhanced: bool, rho) -> _Shares:
    """Shares from the time per unit of every plan, or from a fixed ``rho``."""
    ways = (PLUS, MINUS) if fr.N % 2 == 0 else (PLUS,)
    t_hr = _plan_time_per_unit(topo, [halfring_plan(fr.N, a) for a in ways], fr.healthy_ring,
                               fr.fd)
    t_fr = _plan_time_per_unit(topo, [folded_plan(fr.N, fr.cut)], fr.ring, fr.fd)
    share_normal = t_hr / t_fr if enhanced else 0.0
    rest = 1.0 - share_normal
    if rho == "derived":
        t_det = [_plan_time_per_unit(topo, [detour_plan(fr.N, j, s, a) for a in ways], fr.ring,
                                     fr.fd) for j, s in fr.fams]
        inv = np.array([1.0 / t for t in t_det] + [1.0 / t_fr])
        return _Shares(rest * inv / inv.sum(), share_normal)
    r = _artifact_rho(fr.N) if rho == "artifact" else float(rho)
    per_dim: dict[int, int] = {}
    for j, _ in fr.fams:
        per_dim[j] = per_dim.get(j, 0) + 1
    div = len(per_dim) + r
    return _Shares(np.array([rest / div / per_dim[j] for j, _ in fr.fams] + [rest * r / div]),
                   share_normal)


def _artifact_rho(N: int) -> float:
    # the artifact's MATE accelerating divisor swaps the odd/even formulas
    return N / (4 * (N - 1)) if N % 2 else (N + 1) / (4 * N)


def _lockstep(topo, fr: _FaultyRing, enhanced: bool) -> _Shares:
    """Shares from the lockstep LP over the stage costs of every plan."""
    ways = (PLUS, MINUS) if fr.N % 2 == 0 else (PLUS,)
    folded = folded_plan(fr.N, fr.cut)
    hr_len = halfring_plan(fr.N).n_stages
    normal = _stage_costs(topo, [halfring_plan(fr.N, a) for a in ways], fr.healthy_ring, fr.fd,
                          hr_len)
    fr_cost = _stage_costs(topo, [folded], fr.ring, fr.fd, folded.n_stages)
    det_cost = [_stage_costs(topo, [detour_plan(fr.N, j, s, a) for a in ways], fr.ring, fr.fd,
                             hr_len) for j, s in fr.fams]
    share_normal, accel = _lockstep_shares(normal, fr_cost if enhanced else None,
                                           det_cost + [fr_cost])
    return _Shares(accel, share_normal)


def _share_mode(params: dict, fr: _FaultyRing, n_scheme: int, ldir: int) -> str:
    mode = params.get("shares", "auto")
    if mode != "auto":
        return mode
    # exact lanes while the input (n^2 x pieces x lanes chunks over all ranks) stays small
    n = math.prod(fr.f.dims)
    D = len(active_dims(fr.f.dims))
    return "lanes" if n ** 2 * D * n_scheme * ldir <= _AUTO_LANES_LIMIT else "slots"


def _slot_counts(scheme_w: np.ndarray, m_f: int) -> np.ndarray:
    """Whole slots of a block of ``m_f`` per scheme entry (largest remainders)."""
    counts = np.floor(scheme_w * m_f).astype(int)
    order = np.argsort(-(scheme_w * m_f - counts), kind="stable")
    counts[order[:m_f - counts.sum()]] += 1
    return counts


def _faulty_uses(fr: _FaultyRing, scheme: list[tuple], ldir: int, bounds: np.ndarray | None,
                 normal_len: int, cache: dict) -> tuple[tuple[PlanUse, ...], ...]:
    """What each lane of the faulty ring runs: detours and its own FoldedRing after the normal
    part, (MATEe) FoldedRing in the normal part. Lane shares (``bounds`` None) give every scheme
    entry ``ldir`` lanes; slot shares give it a slot range in each of the ``ldir`` lanes."""
    folded = folded_plan(fr.N, fr.cut)
    L = ldir if bounds is not None else len(scheme) * ldir
    uses: list[list[PlanUse]] = [[] for _ in range(L)]
    for k, sch in enumerate(scheme):
        for lane in range(ldir):
            antipode = PLUS if lane % 2 == 0 else MINUS
            if sch[0] == "detour":
                key = ("detour", fr.N, sch[1], sch[2], antipode)
                if key not in cache:
                    cache[key] = detour_plan(fr.N, sch[1], sch[2], antipode)
                plan, offset = cache[key], normal_len
            else:
                plan, offset = folded, (normal_len if sch[0] == "own" else 0)
            if bounds is None:
                uses[k * ldir + lane].append(PlanUse(plan, offset, 0.0, 1.0))
            else:
                uses[lane].append(PlanUse(plan, offset, float(bounds[k]), float(bounds[k + 1])))
    return tuple(tuple(u) for u in uses)


def _realized_rho(rho, mode: str, shares: _Shares, fr: _FaultyRing, enhanced: bool,
                  topo) -> float:
    """The rho as the paper defines it: own share / share of one other dimension."""
    if rho == "lockstep" or mode == "slots":
        per_dim_share = shares.accel[:-1].sum() / max(len({j for j, _ in fr.fams}), 1)
        return shares.accel[-1] / per_dim_share if per_dim_share > 0 else float("inf")
    if rho == "derived":
        ways = (PLUS, MINUS) if fr.N % 2 == 0 else (PLUS,)
        t_hr = _plan_time_per_unit(topo, [halfring_plan(fr.N, a) for a in ways],
                                   fr.healthy_ring, fr.fd)
        t_fr = _plan_time_per_unit(topo, [folded_plan(fr.N, fr.cut)], fr.ring, fr.fd)
        return t_hr / t_fr
    if rho == "artifact":
        return _artifact_rho(fr.N)
    return float(rho)


def mate_layout(coll: Collective, enhanced: bool, params: dict) -> Layout:
    """MATE's (``enhanced``: MATEe's) layout: DimRotation whose stages add an acceleration part
    for the faulty ring (see the module docstring)."""
    topo = coll.topology
    fr = _faulty_ring(topo)
    active = active_dims(fr.f.dims)
    ldir = 2 if needs_direction_lanes("halfring", fr.f, active) else 1
    cache: dict = {}
    # the faulty ring's data is split into a *scheme*: detour families, own ring, (matee) normal
    # share. Exact shares cut every chunk into one lane per scheme entry (x direction lanes);
    # slot shares give each entry a range of the slots of every aggregated block instead, which
    # keeps the op count of a large torus at that of DimRotation (precision 1/m of a block).
    scheme = ([("detour", j, s) for j, s in fr.fams] + [("own",)]
              + ([("normal",)] if enhanced else []))
    mode = _share_mode(params, fr, len(scheme), ldir)
    L = (len(scheme) if mode == "lanes" else 1) * ldir
    healthy_dims = {d: dim_groups("halfring", fr.f, d, L, cache) for d in active if d != fr.fd}
    rho = params.get("rho", "derived")
    shares = (_lockstep(topo, fr, enhanced) if rho == "lockstep"
              else _derived_or_fixed_shares(topo, fr, enhanced, rho))
    folded = folded_plan(fr.N, fr.cut)
    normal_len = max([phase_len(g) for g in healthy_dims.values()]
                     + [halfring_plan(fr.N).n_stages])
    if enhanced and not (rho == "lockstep" and shares.normal < 1e-9):
        normal_len = max(normal_len, folded.n_stages)
    scheme_w = np.concatenate([shares.accel, [shares.normal] if enhanced else []])
    scheme_w = np.maximum(scheme_w, 0.0) / np.maximum(scheme_w, 0.0).sum()
    m_f = math.prod(fr.f.dims) // fr.N
    if mode == "lanes":
        weights, bounds = np.repeat(scheme_w / ldir, ldir), None
    else:
        counts = _slot_counts(scheme_w, m_f)
        bounds = np.concatenate([[0], np.cumsum(counts)]) / m_f
        weights = np.full(ldir, 1.0 / ldir)
        shares = _Shares(counts[:len(fr.fams) + 1] / m_f,
                         float(counts[-1] / m_f) if enhanced else 0.0)
    accel_len = max([detour_plan(fr.N, j, s, PLUS).n_stages for j, s in fr.fams]
                    + [folded.n_stages])
    groups = dict(healthy_dims)
    groups[fr.fd] = (dim_groups("halfring", fr.f, fr.fd, L, cache, skip=fr.fg)
                     + [Group(fr.f.rings[fr.fd][[fr.fg]],
                              _faulty_uses(fr, scheme, ldir, bounds, normal_len, cache))])
    rho_used = _realized_rho(rho, mode, shares, fr, enhanced, topo)
    params_out: tuple[tuple[str, int | float | str], ...] = (
        ("rho", round(float(rho_used), 6)), ("faulty_dim", fr.fd), ("shares", mode))
    if enhanced:
        params_out += (("normal_share", round(float(shares.normal), 6)),)
    return Layout(weights, len(active), rotated_phases(active, normal_len + accel_len), groups,
                  params_out)
