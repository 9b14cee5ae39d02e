"""A basic optimum of the path LP: few paths per pair, so that rounding loses nothing.

The column generation of :mod:`cclc.synth.flows` solves its LP with PDLP, a first-order
method whose optimum lies inside the optimal face: every pair keeps a share on most of its
paths (up to seven on a faulty 4x4x4 torus). The packing keeps at most a few paths per pair
and drops small shares, and that truncation, renormalized, overloads some links: on the 4x4x4
torus with two failed links in different rings the kept paths' busiest link was at 93.6% of
the LP rate before any packing.

A basic (vertex) optimum of the same LP over the same columns has at most one path per pair
beyond the first for every tight link (the LP has one row per pair and one per link), so almost
every pair routes over one path and the rounding to whole units touches few. This re-solves the
LP restricted to the columns PDLP used, with HiGHS's interior point method followed by
crossover to a vertex (SciPy), on the same 4x4x4: 4318 paths for 4032 pairs, 3748 pairs on one
path, and the rounded paths' busiest link at 99.8% of the LP rate.
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
import scipy.sparse as sp
from scipy.optimize import linprog

from cclc.collective import Collective
from cclc.synth.flow_solution import FlowSolution, pair_bytes, usable_links
from cclc.synth.piece_table import Piece, hop_table
from cclc.synth.symmetry import Symmetry

__all__ = ["basic_orbit_paths", "basic_paths"]

#: below this share of its pair a path is dropped (the vertex's round-off, not a real share)
ZERO_SHARE = 1e-7
#: the vertex is kept only when its time is within this of the LP's (HiGHS is exact to ~1e-9;
#: PDLP's own optimum is within ~1e-4)
TIME_SLACK = 1e-3


def basic_paths(coll: Collective, flows: FlowSolution,
                time_limit: float | None = None) -> FlowSolution:
    """``flows`` with the same paths re-weighted to a basic optimum of the path LP (see the
    module docstring), unused paths left out; ``flows`` itself when HiGHS does not reach an
    optimum within ``time_limit`` seconds or its time is not within :data:`TIME_SLACK` of
    ``flows.lp_time``.

    The LP is the one :mod:`cclc.synth.flows` solves, over the given paths only: minimize
    ``T`` such that every pair's shares sum to 1 and every link's bytes over its bandwidth
    stay below ``T``.
    """
    if len(flows.path) == 0 or flows.status == "routed":
        # routed paths (cclc.synth.routed) carry a certified lower value, not the LP's optimum:
        # no vertex would be within TIME_SLACK of it, and the LP is the size PDLP gave up on
        return flows
    topo = coll.topology
    d = pair_bytes(coll)
    n_paths = len(flows.path)
    pair_key = flows.src.astype(np.int64) * coll.n + flows.dst.astype(np.int64)
    pairs, pair_of = np.unique(pair_key, return_inverse=True)
    if len(pairs) == n_paths:
        return flows                        # one path per pair already: nothing to choose
    t0 = time.monotonic()
    lengths = np.fromiter((len(p) for p in flows.path), dtype=np.int64, count=n_paths)
    links = np.fromiter((e for p in flows.path for e in p), dtype=np.int64,
                        count=int(lengths.sum()))
    col = np.repeat(np.arange(n_paths), lengths)
    seconds = d[flows.src, flows.dst][col] / topo.link_bandwidth[links]
    used, row = np.unique(links, return_inverse=True)
    load = sp.csr_matrix((seconds, (row, col)), shape=(len(used), n_paths))
    shares = sp.csr_matrix((np.ones(n_paths), (pair_of, np.arange(n_paths))),
                           shape=(len(pairs), n_paths))
    found = _min_peak(load, shares, flows.lp_time, time_limit)
    if found is None:
        return flows
    return _reweighted(flows, found, pair_of, len(pairs), t0)


def basic_orbit_paths(coll: Collective, flows: FlowSolution, sym: Symmetry,
                      time_limit: float | None = None) -> FlowSolution:
    """:func:`basic_paths` over one share per orbit of paths under ``sym`` (the group the LP
    was solved over), for path sets too large to re-solve whole: a vertex of the LP whose
    paths of one orbit carry equal shares, so the result stays symmetric (the orbit packing
    of :mod:`cclc.synth.orbit_pack` needs that). ``flows`` itself when HiGHS does not reach an
    optimum within ``time_limit`` seconds or its time is not within :data:`TIME_SLACK` of
    ``flows.lp_time``.

    Variable ``x[o]`` is the share of each path of orbit ``o``. A pair of pair orbit ``P``
    has ``size[o] / |P|`` paths of ``o``, so its shares sum to ``sum_o x[o] size[o] / |P|``
    (one row per pair orbit). With every orbit's paths at one share, all links of a link orbit
    ``O`` carry the same load: the orbit's bytes over the links' bandwidth, divided by |O|
    (one row per link orbit)."""
    # cclc.synth.orbit_pack (~50 ms to import) only when orbit paths are built, not for cclc --help
    from cclc.synth.orbit_pack import piece_orbits

    if len(flows.path) == 0:
        return flows
    t0 = time.monotonic()
    topo = coll.topology
    src, dst = flows.src.tolist(), flows.dst.tolist()
    # one unit piece per path: its orbit is the path's orbit
    pieces = [Piece(s, d, 0, 1, tuple((e,) for e in p), (0,) * len(p))
              for s, d, p in zip(src, dst, flows.path, strict=True)]
    table = hop_table(topo, pieces)
    orbits = piece_orbits(coll, pieces, sym, usable_links(coll), table)
    n_orb = len(orbits.reps)
    pair_key = flows.src.astype(np.int64) * coll.n + flows.dst.astype(np.int64)
    pairs, pair_of = np.unique(pair_key, return_inverse=True)
    # pairs per pair orbit, and each path orbit's pair orbit
    pair_orbit_of_pair = np.zeros(len(pairs), dtype=np.int64)
    pair_orbit_of_pair[pair_of] = orbits.pair_orbit
    n_porb = int(orbits.pair_orbit.max()) + 1
    pairs_in = np.bincount(pair_orbit_of_pair, minlength=n_porb)
    col_porb = orbits.pair_orbit[orbits.reps]
    eq_val = orbits.size / pairs_in[col_porb]
    d = pair_bytes(coll)
    entry_path = table.piece[table.entry_hop]
    link = table.entry_link
    row = orbits.link_row[link]
    secs = (d[flows.src[entry_path], flows.dst[entry_path]] / topo.link_bandwidth[link]
            / orbits.row_size[row])
    n_rows = len(orbits.row_size)
    load = sp.coo_matrix((secs, (row, orbits.orbit[entry_path])), shape=(n_rows, n_orb)).tocsr()
    load = load[np.flatnonzero(np.diff(load.indptr))]
    shares = sp.csr_matrix((eq_val, (col_porb, np.arange(n_orb))), shape=(n_porb, n_orb))
    found = _min_peak(load, shares, flows.lp_time, time_limit)
    if found is None:
        return flows
    return _reweighted(flows, found[orbits.orbit], pair_of, len(pairs), t0)


def _min_peak(load: sp.csr_matrix, shares: sp.csr_matrix, lp_time: float,
              time_limit: float | None) -> np.ndarray | None:
    """The columns' values ``x >= 0`` minimizing ``T`` with ``load @ x <= T`` (seconds, one
    row per link or link orbit) and ``shares @ x = 1`` (one row per pair or pair orbit), at a
    basic optimum (HiGHS interior point and crossover); ``None`` when HiGHS stops before an
    optimum within ``time_limit`` seconds or ``T`` is not within :data:`TIME_SLACK` of
    ``lp_time``."""
    n_rows, n_cols = load.shape
    scale = float(load.data.max())
    # columns: the values, then T in units of ``scale`` seconds; load - T <= 0
    a_ub = sp.hstack([load / scale, sp.csr_matrix(-np.ones((n_rows, 1)))], format="csr")
    a_eq = sp.hstack([shares, sp.csr_matrix((shares.shape[0], 1))], format="csr")
    cost = np.zeros(n_cols + 1)
    cost[-1] = 1.0
    options = {} if time_limit is None else {"time_limit": max(float(time_limit), 1.0)}
    res = linprog(cost, A_ub=a_ub, b_ub=np.zeros(n_rows), A_eq=a_eq,
                  b_eq=np.ones(shares.shape[0]), bounds=(0, None), method="highs-ipm",
                  options=options)
    if res.status != 0 or res.x[-1] * scale > lp_time * (1 + TIME_SLACK):
        return None
    return np.maximum(res.x[:n_cols], 0.0)


def _reweighted(flows: FlowSolution, share: np.ndarray, pair_of: np.ndarray, n_pairs: int,
                t0: float) -> FlowSolution:
    """``flows`` with every path at ``share`` renormalized per pair, the paths left at
    (nearly) nothing dropped, and the seconds since ``t0`` added to its solve time."""
    total = np.bincount(pair_of, weights=share, minlength=n_pairs)
    share = share / total[pair_of]
    keep = np.flatnonzero(share > ZERO_SHARE)
    return replace(flows, src=flows.src[keep], dst=flows.dst[keep], weight=share[keep],
                   path=tuple(flows.path[i] for i in keep.tolist()),
                   solve_s=flows.solve_s + time.monotonic() - t0)
