"""AllToAll paths where the path LP is too large: a routed flow cut into a few weighted paths.

On an 8x8x8 torus with two failed links in different rings no symmetry is left and the path
LP of :mod:`cclc.synth.flows` has 261 632 commodities: PDLP does not reach its tolerance in
600 s. The block Frank-Wolfe routing of :mod:`cclc.flow_route` (the routed upper value of the
LP bound) gets a feasible flow within 1-2% of the certified lower value in under a minute, but
its flow is one link vector per source, not paths per pair. This module turns it into paths in
three stages:

1. **Route** (:func:`cclc.flow_route.route_alltoall`, used as the bound uses it): the flow of
   the pass with the smallest busiest link is kept, and every pass's link prices certify a
   lower value by weak duality (:func:`cclc.flow_dual.certified_time`), with the hop counts
   and the closed-form bounds of :mod:`cclc.bounds`: that certified value is the solution's
   ``lp_time``, a lower bound on any schedule over the usable links.
2. **Candidates**: the routing's trace spells every source's flow out as the fewest-hop start
   plus the trees of its block moves, each weighted by its step and the later ``1 - step``
   factors. Every tree gives each pair one path; equal paths merge, up to :data:`SLOTS` per
   pair (:func:`_tree_paths`). The steps are small, so most of the weight is still the
   fewest-hop start's (87% on a 4x4x4 torus with two failed links): it goes to
   :data:`FEWEST_HOP_SEEDS` fewest-hop paths per pair. Up to :data:`SMALL_COMMODITIES`
   commodities both are larger (:data:`SLOTS_SMALL`, :data:`FEWEST_HOP_SEEDS_SMALL`).
   Candidates more than :data:`MAX_DETOUR` hops longer than their pair's fewest are dropped
   (:func:`_candidates`).
3. **Re-balance**: Frank-Wolfe over the candidates' shares only, on the smoothed maximum the
   routing uses, block by block of pairs, each pair moving toward a soft minimum of its
   candidates' costs under the potential's gradient (:meth:`_Paths.rebalance`), aiming at the
   certified value. Then every pair keeps at most :data:`cclc.synth.flow_solution.MAX_PATHS` paths,
   none under ``MIN_SHARE`` of its largest (the packer's limits, :func:`_cut`), and the kept
   paths are re-balanced once more and cut again.

The result has the shape of :func:`cclc.synth.flows.solve_flows`'s (status ``"routed"``, the
number of routing passes as ``rounds``, no symmetry); :func:`routed_flows` is its entry point.
"""

from __future__ import annotations

import time

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import shortest_path

from cclc.bounds import cut_bound, hop_bytes_bound, injection_bound
from cclc.collective import Collective
from cclc.errors import CclError
from cclc.flow_dual import certified_time
from cclc.flow_route import line_search, route_alltoall, smooth_max
from cclc.synth.flow_solution import (
    LONG_SHARE,
    MAX_PATHS,
    MIN_SHARE,
    FlowSolution,
    pair_bytes,
    usable_links,
)

__all__ = ["ROUTE_PASSES", "ROUTE_TARGET_GAP", "routed_flows"]

#: routing passes at most, and the gap to the certified lower value at which routing stops: the
#: bound's own settings (cclc.bounds ROUTED_PASSES, ROUTED_TARGET_GAP)
ROUTE_PASSES = 40
ROUTE_TARGET_GAP = 5e-3
#: the routing may use this share of the time left before the deadline (the rest: the
#: re-balancing, the packing and writing the ops)
ROUTE_SHARE = 0.5
#: paths kept per pair while the trees of the routing are merged into paths
SLOTS = 6
#: fewest-hop paths per pair (jittered hop counts) for the routing's fewest-hop start
FEWEST_HOP_SEEDS = 3
#: up to this many commodities, more of both (a candidate set sized for 512 ranks misses paths
#: the LP uses on small tori: a 4x4 torus with three one-way faults 10.6% above the LP with 6
#: and 3, 0.2% with 10 and 6)
SMALL_COMMODITIES = 10_000
SLOTS_SMALL = 10
FEWEST_HOP_SEEDS_SMALL = 6
#: hops a candidate may take beyond its pair's fewest
MAX_DETOUR = 2
#: the re-balancing moves this many blocks of pairs per iteration, one line search each
REBALANCE_BLOCKS = 8
#: Frank-Wolfe iterations over the candidates, then over the kept paths; each stops early once
#: the busiest link is within REBALANCE_GAP of the certified value
REBALANCE_ITERATIONS = 150
KEPT_ITERATIONS = 100
REBALANCE_GAP = 2e-3
#: the temperatures of the soft minimum (over a pair's candidates, on their cost above the
#: cheapest relative to it): on a 4x4x4 torus with two failed links, 100 iterations with
#: 10-100 left the busiest link 5.5% above the bound, with 30-1000 7.9%, and pairwise steps
#: (a pair's dearest path's share to its cheapest) 7.9%
BETAS = (3.0, 10.0, 30.0)
#: the smoothing of the maximum: within this share of it (the routing's finest)
SMOOTHING = 1e-3


def routed_flows(coll: Collective, deadline: float | None = None) -> FlowSolution:
    """Weighted paths for every pair of ``coll`` (an alltoall) from a routed flow (see the
    module docstring): at most :data:`~cclc.synth.flow_solution.MAX_PATHS` per pair. ``lp_time`` is
    the certified lower value in seconds (a lower bound on any schedule over the usable
    links), ``status`` ``"routed"``. Raises :class:`~cclc.errors.CclError` when a pair has no
    usable path."""
    t0, c0 = time.monotonic(), time.process_time()
    net = _Network(coll)
    route_until = None if deadline is None else t0 + ROUTE_SHARE * max(deadline - t0, 0.0)
    flows, lower, passes, moves = _route(net, route_until)
    lp_time = max(lower * net.unit / net.cmax, _closed_form_bound(coll))
    # the re-balancing aims at the certified value, not at the routed flow: the restricted
    # problem can beat the routing where that stalled (a 4x4 torus with three failed links:
    # routed 10% above the certified value, the kept paths 2.1%)
    target = lp_time * net.cmax / net.unit
    cand, x = _candidates(net, moves)
    paths = _Paths(net, cand)
    x = _cut(paths.rebalance(x, target, deadline, REBALANCE_ITERATIONS), paths.hops)
    # the cut moves what it drops onto the kept paths blindly: re-balance over those alone
    cand[x <= 0] = -1
    paths = _Paths(net, cand)
    x = _cut(paths.rebalance(x, target, deadline, KEPT_ITERATIONS), paths.hops)
    k, j = np.nonzero(x > 0)
    s, t = net.ks[k], net.kt[k]
    links = net.links[cand[k, j]]
    hops = paths.hops[k, j]
    out = tuple(tuple(row[:h]) for row, h in zip(links.tolist(), hops.tolist(), strict=True))
    return FlowSolution(src=s, dst=t, weight=x[k, j], path=out, lp_time=lp_time,
                        status="routed", rounds=passes, symmetry=1,
                        solve_s=time.monotonic() - t0, cpu_s=time.process_time() - c0)


class _Network:
    """The usable links (local ids ``0..E-1``; ``links`` their global ids) with capacities
    over the largest (``cmax``), the group, pair bytes over the largest (``unit``), and the
    commodities ``ks -> kt`` (group indices) with bytes ``d`` (over ``unit``)."""

    def __init__(self, coll: Collective):
        topo = coll.topology
        self.links = np.flatnonzero(usable_links(coll))
        self.V = topo.n_vertices
        self.src = topo.link_src[self.links].astype(np.int64)
        self.dst = topo.link_dst[self.links].astype(np.int64)
        bw = topo.link_bandwidth[self.links].astype(np.float64)
        self.cmax = float(bw.max())
        self.cap = bw / self.cmax
        self.group = np.asarray(coll.group, dtype=np.int64)
        pair = pair_bytes(coll).copy()
        np.fill_diagonal(pair, 0.0)
        self.unit = float(pair.max()) if pair.size and pair.max() > 0 else 1.0
        self.pair = pair / self.unit
        self.ks, self.kt = np.nonzero(self.pair > 0)
        self.d = self.pair[self.ks, self.kt]

    def args(self) -> tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        return (self.V, self.src, self.dst, self.cap, self.group, self.pair)

    def trees(self, length: np.ndarray, sources: np.ndarray) -> np.ndarray:
        """Predecessors ``(len(sources), V)`` of the shortest paths under ``length`` (local
        links; parallel links: the shortest)."""
        key = self.src * self.V + self.dst
        order = np.lexsort((length, key))
        first = np.ones(len(order), dtype=bool)
        first[1:] = key[order][1:] != key[order][:-1]
        keep = order[first]
        g = sp.csr_matrix((length[keep], (self.src[keep], self.dst[keep])),
                          shape=(self.V, self.V))
        _, pred = shortest_path(g, method="D", indices=sources, return_predecessors=True)
        return pred

    def walk(self, pred: np.ndarray, ks: np.ndarray, length: np.ndarray) -> np.ndarray:
        """The paths of commodities ``ks`` down the trees ``pred`` (row: the commodity's
        source), as ``(len(ks), hops)`` local links padded with -1 at the end. Between parallel
        links the shortest under ``length`` is the one taken (as in :meth:`trees`)."""
        V = self.V
        key = self.src * V + self.dst
        order = np.lexsort((length, key))
        first = np.ones(len(order), dtype=bool)
        first[1:] = key[order][1:] != key[order][:-1]
        keys, lid = key[order][first], order[first]
        s_v, cur = self.group[self.ks[ks]], self.group[self.kt[ks]].copy()
        rows = self.ks[ks]
        back = []
        for _ in range(V):
            active = np.flatnonzero(cur != s_v)
            if not len(active):
                break
            prev = pred[rows[active], cur[active]]
            if (prev < 0).any():
                k = int(ks[active[np.flatnonzero(prev < 0)[0]]])
                raise CclError(f"rank {int(self.group[self.ks[k]])} has no usable path to "
                               f"rank {int(self.group[self.kt[k]])}")
            col = np.full(len(ks), -1, dtype=np.int64)
            col[active] = lid[np.searchsorted(keys, prev * V + cur[active])]
            back.append(col)
            cur[active] = prev
        if not back:
            return np.full((len(ks), 1), -1, dtype=np.int64)
        # links were collected from the destination back: reverse each row's used part
        walked = np.stack(back, axis=1)
        hops = (walked >= 0).sum(axis=1)
        width = walked.shape[1]
        idx = hops[:, None] - 1 - np.arange(width)[None, :]
        out = np.take_along_axis(walked, np.maximum(idx, 0), axis=1)
        out[idx < 0] = -1
        return out


def _route(net: _Network, until: float | None
           ) -> tuple[np.ndarray, float, int, list]:
    """The routed flow with the smallest busiest link, the certified lower value (the LP's
    scaled units), the passes run and the block moves up to that flow (see the ``trace`` of
    :func:`cclc.flow_route.route_alltoall`)."""
    args = net.args()
    lower = certified_time(*args, np.ones(len(net.src)))
    if not np.isfinite(lower):
        raise CclError("no flow routes every pair of the alltoall: the group is disconnected")
    trace: list = []
    best, best_top, best_moves, passes = None, float("inf"), 0, 0
    for flows, length in route_alltoall(*args, lower=lower, passes=ROUTE_PASSES,
                                        target_gap=ROUTE_TARGET_GAP, trace=trace):
        passes += 1
        top = float((flows.sum(axis=0) / net.cap).max())
        if top < best_top:
            best, best_top, best_moves = flows.copy(), top, len(trace)
        lower = max(lower, certified_time(*args, length))
        if until is not None and time.monotonic() > until:
            break
    assert best is not None, "route_alltoall yields once per pass, and there are passes"
    return best, lower, passes, trace[:best_moves]


def _tree_paths(net: _Network, moves: list) -> tuple[np.ndarray, np.ndarray]:
    """Every pair's paths through the trees of the block moves, merged: candidates ``(K, M,
    hops)`` (local links, -1 padded; an unused slot is all -1) and their weights ``(K, M)``.

    A move by ``step`` scales every earlier weight of its sources by ``1 - step`` and gives its
    tree ``step``; the tree's path for a pair adds to the slot that holds the same path (links
    hashed as a set, which names a simple path) or takes a free slot, or the lightest slot
    when that one is lighter. What no slot holds (the fewest-hop start, which splits a pair
    over all its fewest-hop paths, and overflow) is left out: the weights then sum to less
    than one and are renormalized by the caller."""
    K = len(net.ks)
    M = SLOTS_SMALL if K <= SMALL_COMMODITIES else SLOTS
    key = np.random.default_rng(0).integers(1, 2**62, size=len(net.src), dtype=np.int64)
    slot_hash = np.zeros((K, M), dtype=np.int64)
    weight = np.zeros((K, M))
    cand = np.full((K, M, 16), -1, dtype=np.int32)
    first_k = np.searchsorted(net.ks, np.arange(len(net.group) + 1))
    for lo, hi, step, into in moves:
        ks = np.arange(first_k[lo], first_k[hi])
        row, s_v = net.ks[ks] - lo, net.group[net.ks[ks]]
        cur = net.group[net.kt[ks]].copy()
        back = []
        while True:
            active = cur != s_v
            if not active.any():
                break
            e = np.where(active, into[row, cur], -1)
            back.append(e)
            cur = np.where(active, net.src[np.maximum(e, 0)], cur)
        links = np.stack(back, axis=1)[:, ::-1]            # (pairs, hops), -1 first
        hops = (links >= 0).sum(axis=1)
        links = np.take_along_axis(links, (np.arange(links.shape[1])[None, :]
                                           + links.shape[1] - hops[:, None])
                                   % links.shape[1], axis=1)
        links[np.arange(links.shape[1])[None, :] >= hops[:, None]] = -1
        if links.shape[1] > cand.shape[2]:
            cand = np.pad(cand, ((0, 0), (0, 0), (0, links.shape[1] - cand.shape[2])),
                          constant_values=-1)
        h = np.where(links >= 0, key[np.maximum(links, 0)], 0).sum(axis=1)
        weight[ks] *= 1.0 - step
        same = (slot_hash[ks] == h[:, None]) & (weight[ks] > 0)
        free = weight[ks] <= 0
        slot = np.where(same.any(axis=1), same.argmax(axis=1),
                        np.where(free.any(axis=1), free.argmax(axis=1),
                                 weight[ks].argmin(axis=1)))
        old = weight[ks, slot]
        fresh = ~same[np.arange(len(ks)), slot] & (old < step)
        put = ks[fresh]
        weight[put, slot[fresh]] = 0.0
        slot_hash[put, slot[fresh]] = h[fresh]
        cand[put, slot[fresh]] = -1
        cand[put, slot[fresh], :links.shape[1]] = links[fresh]
        add = same[np.arange(len(ks)), slot] | fresh
        weight[ks[add], slot[add]] += step
    return cand.astype(np.int64), weight


def _candidates(net: _Network, moves: list) -> tuple[np.ndarray, np.ndarray]:
    """The paths of :func:`_tree_paths` and :data:`FEWEST_HOP_SEEDS` (or
    :data:`FEWEST_HOP_SEEDS_SMALL`) fewest-hop paths per pair
    (hop counts with a small random jitter, so equally short paths in different directions
    come in), which share the weight the trees leave (the fewest-hop start's); repeated
    paths merged. ``(K, M, hops)`` and weights ``(K, M)`` summing to one per pair."""
    cand, weight = _tree_paths(net, moves)
    rest = np.maximum(1.0 - weight.sum(axis=1), 0.0)
    rng = np.random.default_rng(0)
    more = []
    seeds = FEWEST_HOP_SEEDS_SMALL if len(net.ks) <= SMALL_COMMODITIES else FEWEST_HOP_SEEDS
    for _ in range(seeds):
        length = 1.0 + 0.2 * rng.random(len(net.src))
        more.append(net.walk(net.trees(length, net.group), np.arange(len(net.ks)), length))
    width = max(cand.shape[2], *(m.shape[1] for m in more))
    cand = np.pad(cand, ((0, 0), (0, 0), (0, width - cand.shape[2])), constant_values=-1)
    more_c = np.full((len(net.ks), len(more), width), -1, dtype=np.int64)
    for j, m in enumerate(more):
        more_c[:, j, :m.shape[1]] = m
    cand = np.concatenate([cand, more_c], axis=1)
    weight = np.concatenate([weight, np.repeat(rest[:, None] / len(more), len(more), 1)], 1)
    key = np.random.default_rng(1).integers(1, 2**62, size=len(net.src), dtype=np.int64)
    h = np.where(cand >= 0, key[np.maximum(cand, 0)], 0).sum(axis=2)
    rows = np.arange(len(cand))
    for j in range(1, cand.shape[1]):
        for i in range(j):
            same = (h[:, j] == h[:, i]) & (h[:, i] != 0)
            weight[rows[same], i] += weight[same, j]
            weight[same, j] = 0.0
            h[same, j] = 0
            cand[same, j] = -1
    # long detours go: the routing's trees follow link prices that are nearly zero on idle
    # links, so a few pairs wander (5x5x5, two failed links: up to 5 hops over the diameter,
    # 1.2% of the weight more than 2 hops over the pair's fewest), and the longest path sets
    # the schedule's step count. The fewest-hop candidates always stay.
    fewest = shortest_path(sp.csr_matrix((np.ones(len(net.src)), (net.src, net.dst)),
                                         shape=(net.V, net.V)),
                           unweighted=True, indices=net.group)[net.ks, net.group[net.kt]]
    long = (cand >= 0).sum(axis=2) > fewest[:, None] + MAX_DETOUR
    cand[long] = -1
    weight[cand[:, :, 0] < 0] = 0.0
    total = weight.sum(axis=1, keepdims=True)
    even = (cand[:, :, 0] >= 0) / (cand[:, :, 0] >= 0).sum(axis=1, keepdims=True)
    return cand, np.where(total > 0, weight / np.maximum(total, 1e-300), even)


class _Paths:
    """The candidates as one incidence matrix ``(K * M, E)`` (a missing candidate: an empty
    row), with each pair's bytes, for the re-balancing."""

    def __init__(self, net: _Network, cand: np.ndarray):
        self.net = net
        K, M, H = cand.shape
        self.shape = (K, M)
        self.hops = (cand >= 0).sum(axis=2)
        self.real = self.hops > 0
        flat = cand.reshape(K * M, H)
        row, col = np.nonzero(flat >= 0)
        self.inc = sp.csr_matrix((np.ones(len(row)), (row, flat[row, col])),
                                 shape=(K * M, len(net.src)))
        self.inc_t = self.inc.T.tocsr()
        self.d = net.d

    def load(self, x: np.ndarray) -> np.ndarray:
        """Every link's bytes over its capacity under shares ``x`` ``(K, M)``."""
        return self.inc_t @ (x * self.d[:, None]).ravel() / self.net.cap

    def rebalance(self, x: np.ndarray, target: float, deadline: float | None,
                  iterations: int) -> np.ndarray:
        """Frank-Wolfe on the smoothed busiest link over the shares ``x`` (see the module
        docstring), block by block of pairs, until the busiest link is within
        :data:`REBALANCE_GAP` of ``target``, :data:`REBALANCE_ITERATIONS` or the deadline; the
        best shares seen."""
        cap = self.net.cap
        K, M = self.shape
        blocks = np.array_split(np.arange(K), REBALANCE_BLOCKS)
        rows_of = [self.inc[b[0] * M:(b[-1] + 1) * M] for b in blocks]
        cols_of = [r.T.tocsr() for r in rows_of]
        u = self.load(x)
        x = x.copy()
        best, best_top = x.copy(), float(u.max())
        log_links = float(np.log(max(len(cap), 2)))
        for _ in range(iterations):
            top = float(u.max())
            if top <= target * (1.0 + REBALANCE_GAP):
                break
            if deadline is not None and time.monotonic() > deadline:
                break
            for blk, inc, inc_t in zip(blocks, rows_of, cols_of, strict=True):
                top = float(u.max())
                # smoothing within half the gap left: coarse while far (long steps), fine
                # when near (as the routing does)
                eps = min(2e-2, max(SMOOTHING, (top / target - 1.0) / 2))
                a = log_links / (eps * top)
                w = np.exp(a * (u - top))
                grad = w / w.sum() / cap
                xb = x[blk]
                cost = (inc @ grad).reshape(len(blk), M)
                # toward a soft minimum of the pair's candidates (an argmin would send every
                # pair of the block to the same few cheap links, and the step shrinks to
                # nothing): the best of a few temperatures, each with its own line search
                real = self.real[blk]
                low = np.where(real, cost, np.inf).min(axis=1, keepdims=True)
                excess = np.where(real, (cost - low) / np.maximum(low, 1e-300), np.inf)
                best_try = None
                for beta in BETAS:
                    y = np.exp(-beta * excess)
                    y /= y.sum(axis=1, keepdims=True)
                    d_try = y - xb
                    du_try = inc_t @ (d_try * self.d[blk, None]).ravel() / cap
                    st = line_search(u, du_try, a)
                    val = smooth_max(u + st * du_try, a)
                    if best_try is None or val < best_try[0]:
                        best_try = (val, st, d_try, du_try)
                assert best_try is not None, "BETAS is not empty"
                _, step, delta, du = best_try
                x[blk] = np.maximum(xb + step * delta, 0.0)
                u = u + step * du
            u = self.load(x)
            if float(u.max()) < best_top:
                best, best_top = x.copy(), float(u.max())
        return best


def _cut(x: np.ndarray, hops: np.ndarray) -> np.ndarray:
    """At most :data:`MAX_PATHS` shares per pair, none under :data:`MIN_SHARE` of the pair's
    largest, none on a path (other than the pair's largest) longer than every path that
    holds :data:`LONG_SHARE` of its pair's largest: the packer's limits
    (:func:`cclc.synth.flows.solve_flows` cuts the same way), renormalized per pair."""
    x = x.copy()
    largest = x.max(axis=1, keepdims=True)
    big = x >= LONG_SHARE * largest
    longest = int(hops[big & (x > 0)].max()) if (big & (x > 0)).any() else 0
    first = np.argmax(x, axis=1)
    is_first = np.zeros_like(x, dtype=bool)
    is_first[np.arange(len(x)), first] = True
    x[(x < MIN_SHARE * largest) | ((hops > longest) & ~is_first)] = 0.0
    rank = np.argsort(np.argsort(-x, axis=1, kind="stable"), axis=1)
    x[rank >= MAX_PATHS] = 0.0
    return x / x.sum(axis=1, keepdims=True)


def _closed_form_bound(coll: Collective) -> float:
    """The strongest closed-form bandwidth bound in seconds (hop bytes, injection, cut)."""
    return max(b(coll).seconds for b in (hop_bytes_bound, injection_bound, cut_bound))
