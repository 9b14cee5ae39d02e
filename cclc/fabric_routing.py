"""Routes through a leaf/spine or three-tier (leaf/spine/core) fabric: ECMP hashing (what a \
user gets today) or a planned assignment.

A schedule's ops name explicit link paths, and the simulator charges exactly those links, so the
choice of spine for every flow that leaves its leaf *is* the routing model:

* :func:`ecmp_routes` — each flow's spine is a deterministic hash of ``(src, dst, step)`` over
  the spines reachable on healthy links. Real ECMP is blind to load, so flows collide on one
  spine while others idle (the balls-in-bins collisions that rail-optimized fabric studies
  report for ECMP). We
  assume the switches have withdrawn failed links from their ECMP groups (routing converged), so
  ECMP never sends into a failed link; a fabric whose tables are stale would instead black-hole
  the flows, which no schedule can fix and which is therefore not modelled.
* :func:`planned_routes` — per step, flows are assigned to spines so that no leaf-spine link
  carries more than its fair share (:func:`step_fair_share`) and no failed link is used: a greedy
  largest-first assignment, repaired by a small CP-SAT model when the greedy one overloads a link.

On a three-tier fabric (:func:`cclc.topology.fat_tree`) a flow between pods climbs leaf,
spine, core, spine, leaf; its choice is the core (which fixes both spines, one per pod). ECMP
hashes it over the healthy (spine, core) paths; the plan gives every flow of a step, in its pod
or between pods, the path whose busiest link (in seconds) stays least busy, largest flows first.

Both return a new :class:`~cclc.ir.Schedule`; only the spine (and core) hops change. The
routing pass :func:`route_spines` applies the planned assignment to every schedule the algorithm
table builds.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Callable

import numpy as np

from cclc.errors import ScheduleError
from cclc.ir import (
    Routes,
    Schedule,
    csr_join_offsets,
    csr_offsets,
    csr_take,
    csr_take_pieces,
    intern_paths,
)
from cclc.least_busy import least_busy_picks
from cclc.sorting import first_occurrence_ids, lexsort_ints
from cclc.topology import Topology

__all__ = [
    "ecmp_pair_links",
    "ecmp_routes",
    "fair_shares",
    "has_spines",
    "planned_routes",
    "route_spines",
    "spine_link_loads",
    "step_fair_share",
]


# ----------------------------------------------------------------------------------------------
# the routing pass


def route_spines(s: Schedule) -> Schedule:
    """The routing pass: on a fabric with spines, ``s`` with a planned spine for every
    spine-crossing flow (:func:`planned_routes`); any other schedule unchanged.

    cclc's own schedules are always planned: leaving the spine to ECMP would throw away the
    compile-time knowledge of every flow of every step. The algorithm table applies this pass
    to every schedule it builds (:mod:`cclc.algorithms`), so no algorithm routes by itself.
    """
    return planned_routes(s) if has_spines(s.topology) else s


# ----------------------------------------------------------------------------------------------
# fabric structure


def has_spines(topo: Topology) -> bool:
    return _fabric(topo) is not None


def _fabric(topo: Topology) -> dict | None:
    """Leaf and spine vertices and the leaf<->spine link matrix, or ``None`` without spines."""
    if "fabric_routing" in topo._cache:
        return topo._cache["fabric_routing"]
    info = None
    if topo.kind == "fabric":
        names = topo.vertex_names
        leaves = [v for v in range(topo.n_ranks, topo.n_vertices) if names[v].startswith("leaf")]
        spines = [v for v in range(topo.n_ranks, topo.n_vertices) if names[v].startswith("spine")]
        if leaves and spines:
            li = {v: i for i, v in enumerate(leaves)}
            si = {v: i for i, v in enumerate(spines)}
            up, down = _tier_links(topo, li, si)
            info = {"leaf_index": li, "spine_index": si, "up": up, "down": down,
                    "up_ok": (up >= 0) & ~topo.link_failed[np.maximum(up, 0)],
                    "down_ok": (down >= 0) & ~topo.link_failed[np.maximum(down, 0)]}
            cores = [v for v in range(topo.n_ranks, topo.n_vertices)
                     if names[v].startswith("core")]
            if cores:
                info.update(_core_tier(topo, li, si, cores, up))
    topo._cache["fabric_routing"] = info
    return info


def _tier_links(topo: Topology, lower: dict, upper: dict) -> tuple[np.ndarray, np.ndarray]:
    """The links between two tiers of switches (``lower`` and ``upper``: vertex -> index):
    ``up[i, j]`` from lower ``i`` to upper ``j`` and ``down[j, i]`` back (-1: no link)."""
    up = np.full((len(lower), len(upper)), -1, dtype=np.int64)
    down = np.full((len(upper), len(lower)), -1, dtype=np.int64)
    pairs = zip(topo.link_src.tolist(), topo.link_dst.tolist(), strict=True)
    for link, (u, v) in enumerate(pairs):
        if u in lower and v in upper:
            up[lower[u], upper[v]] = link
        elif u in upper and v in lower:
            down[upper[u], lower[v]] = link
    return up, down


def _core_tier(topo: Topology, li: dict, si: dict, cores: list[int], up: np.ndarray) -> dict:
    """The spine<->core links of a three-tier fabric, and for every pod (leaves and spines
    joined by leaf-spine links) the spine through which it reaches each core (-1: none)."""
    ci = {v: i for i, v in enumerate(cores)}
    sc, cs = _tier_links(topo, si, ci)
    # pods: connected components of the leaf-spine wiring (failed or not)
    n_leaves = len(li)
    wiring = np.argwhere(up >= 0)
    # scipy.sparse (~0.2 s to import) only when this runs: importing the module needs no scipy
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    n = n_leaves + len(si)
    adj = coo_matrix((np.ones(len(wiring)), (wiring[:, 0], n_leaves + wiring[:, 1])),
                     shape=(n, n))
    _, label = connected_components(adj, directed=False)
    pods = {int(x): i for i, x in enumerate(dict.fromkeys(label[:n_leaves].tolist()))}
    leaf_pod = np.array([pods[int(x)] for x in label[:n_leaves]], dtype=np.int64)
    spine_pod = np.array([pods.get(int(x), -1) for x in label[n_leaves:]], dtype=np.int64)
    pod_spine = np.full((len(pods), len(cores)), -1, dtype=np.int64)
    for s_, c in np.argwhere(sc >= 0).tolist():
        if spine_pod[s_] >= 0:
            pod_spine[spine_pod[s_], c] = s_
    return {"core_index": ci, "sc": sc, "cs": cs,
            "sc_ok": (sc >= 0) & ~topo.link_failed[np.maximum(sc, 0)],
            "cs_ok": (cs >= 0) & ~topo.link_failed[np.maximum(cs, 0)],
            "leaf_pod": leaf_pod, "pod_spine": pod_spine}


def _spine_hops(s: Schedule, fab: dict
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """For each route: position of its leaf->spine link (-1 if none), source leaf, dest leaf,
    and whether it climbs to a core (leaf, spine, core, spine, leaf: three tiers).

    All routes at once (a 4,096-rank alltoall has 16.7M of them): every leaf->spine link of
    the CSR table is found in one pass and attributed to its route."""
    topo = s.topology
    n_routes = len(s.routes)
    pos = np.full(n_routes, -1, dtype=np.int64)
    la = np.full(n_routes, -1, dtype=np.int64)
    lb = np.full(n_routes, -1, dtype=np.int64)
    core = np.zeros(n_routes, dtype=bool)
    offs, links = s.routes.offsets, s.routes.links
    leaf_of, tier = _vertex_tiers(topo, fab)
    # per link, not per route hop: a 4,096-rank table has 130M hops
    src_tier, dst_tier = tier[topo.link_src], tier[topo.link_dst]
    ks = np.flatnonzero(((src_tier == _LEAF) & (dst_tier == _SPINE))[links])
    if not len(ks):
        return pos, la, lb, offs, core
    # the route of every such link (empty routes share an offset with the next one)
    rs = np.searchsorted(offs, ks, side="right") - 1
    first = np.ones(len(ks), dtype=bool)
    first[1:] = rs[1:] != rs[:-1]
    # a second leaf->spine link: no spine reaches both leaves over healthy links, the path
    # detours through a third leaf and is kept as found (there is no spine choice to plan)
    twice = np.zeros(n_routes, dtype=bool)
    twice[rs[~first]] = True
    k, r = ks[first], rs[first]
    del ks, rs, first
    end = offs[r + 1]
    last = len(links) - 1
    next_head = topo.link_dst[links[np.minimum(k + 1, last)]]
    climbs = (k + 1 < end) & (tier[next_head] == _CORE)
    down_leaf = leaf_of[topo.link_dst[links[np.minimum(k + 3, last)]]]
    bad_spine = k + 1 >= end
    bad_core = climbs & ((k + 3 >= end) | (down_leaf < 0))
    if (bad_spine | bad_core).any():
        j = int(np.flatnonzero(bad_spine | bad_core)[0])
        if bad_spine[j]:
            raise ScheduleError(f"route {int(r[j])} ends at a spine")
        raise ScheduleError(f"route {int(r[j])} climbs to a core and does not come down to a "
                            "leaf")
    pos[r] = k - offs[r]
    la[r] = leaf_of[topo.link_src[links[k]]]
    core[r] = climbs
    lb[r] = np.where(climbs, down_leaf, leaf_of[next_head])
    pos[twice], la[twice], lb[twice], core[twice] = -1, -1, -1, False
    return pos, la, lb, offs, core


#: vertex tiers in :func:`_vertex_tiers`
_OTHER, _LEAF, _SPINE, _CORE = 0, 1, 2, 3


def _vertex_tiers(topo: Topology, fab: dict) -> tuple[np.ndarray, np.ndarray]:
    """``(leaf index of every vertex or -1, tier of every vertex)``: the leaf/spine/core
    dictionaries of ``fab`` as arrays, so that routes are classified without a Python loop."""
    if "tiers" not in fab:
        leaf_of = np.full(topo.n_vertices, -1, dtype=np.int64)
        tier = np.full(topo.n_vertices, _OTHER, dtype=np.int8)
        leaf_of[list(fab["leaf_index"])] = list(fab["leaf_index"].values())
        tier[list(fab["leaf_index"])] = _LEAF
        tier[list(fab["spine_index"])] = _SPINE
        if fab.get("core_index"):
            tier[list(fab["core_index"])] = _CORE
        fab["tiers"] = (leaf_of, tier)
    return fab["tiers"]


def _rewrite(s: Schedule, fab: dict, spine_of_op: np.ndarray,
             core_of_op: np.ndarray | None = None, used_only: bool = False) -> Schedule:
    """``s`` with the spine of every op where ``spine_of_op >= 0`` replaced, and the core
    (and with it both spines) of every op where ``core_of_op >= 0``.

    The new route table holds every distinct path of the old one (``used_only``: of those
    the ops not rewritten take, in the old order), then the new paths in the order the ops
    first use them (spines first, then cores), each once: route ids stay as an op-by-op
    rewrite numbers them."""
    ops = s.ops
    topo = s.topology
    old_offs, old_links = s.routes.offsets, s.routes.links
    old_row = ops.route.astype(np.int64)
    # a new path keeps its old route's spine hop where it was, and its leaves and tiers: the
    # new table's hops are the old ones of the rows each new path is made from
    old_hops = _route_hops(s, fab)
    hop_rows = [np.arange(len(s.routes))]
    if used_only:
        kept = np.ones(len(ops), dtype=bool)
        for choice in (spine_of_op, core_of_op):
            if choice is not None:
                kept &= choice < 0
        rows = np.unique(np.concatenate([[0], old_row[kept]]))
        row_of = np.zeros(len(s.routes), dtype=np.int64)
        row_of[rows] = np.arange(len(rows))
        old_row = row_of[old_row]
        del kept, row_of
        pieces = [csr_take(old_offs, old_links, rows)]
        hop_rows = [rows]
    else:
        pieces = [(old_offs, old_links)]
    picks: list[tuple[np.ndarray, np.ndarray]] = []    # (ops, their index among new paths)
    n_new = len(pieces[0][0]) - 1
    news = []                                           # (rows, choices, spine hops, offsets)
    for choice, hops in ((spine_of_op, 2), (core_of_op, 4)):
        if choice is None:
            continue
        picked = np.flatnonzero(choice >= 0)
        if not len(picked):
            continue
        r, c = ops.route[picked].astype(np.int64), choice[picked]
        # in the order the ops first use them, so new routes are numbered as op by op
        rank, first = first_occurrence_ids(r * (int(choice.max()) + 1) + c)
        r, c = r[first], c[first]
        news.append((r, c, hops, csr_offsets(old_offs, r)))
        hop_rows.append(r)
        picks.append((picked, n_new + rank))
        n_new += len(first)
    # the new paths' links laid out after the kept ones in one array: when every path is
    # distinct (an alltoall's) it is the new table as it stands, not joined from pieces
    # (at 4,096 ranks a copy of 0.5 GB)
    kept_offs, kept_links = pieces[0]
    table = np.empty(len(kept_links) + sum(int(o[-1]) for *_, o in news), dtype=np.int32)
    table[:len(kept_links)] = kept_links
    pieces = [(kept_offs, table[:len(kept_links)])]
    start = len(kept_links)
    for r, c, hops, offs in news:
        links = table[start:start + int(offs[-1])]
        csr_take(old_offs, old_links, r, out=links)
        _replace_spine_hops(fab, topo, links, offs[:-1] + old_hops[0][r], c, hops)
        pieces.append((offs, links))
        start += len(links)
    del news                    # (the choices: at 4,096 ranks every op's is 0.1 GB)
    ids, keep = intern_paths(pieces)
    new_route = ids[old_row]
    for picked, at in picks:
        new_route[picked] = ids[at]
    distinct = len(keep) == len(ids)
    del ids, old_row, picks
    if distinct:
        # every path distinct: the table as laid out
        offsets, links = csr_join_offsets([o for o, _ in pieces]), table
    else:
        offsets, links = csr_take_pieces(pieces, keep)
    cols = ops.columns()
    cols["route"] = new_route
    out = s.replace(ops=type(ops)(**cols), routes=Routes(offsets, links))
    from_row = np.concatenate(hop_rows)[keep]
    out._cache["spine_hops"] = tuple(h[from_row] for h in old_hops)
    return out


def _route_hops(s: Schedule, fab: dict
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """:func:`_spine_hops` of ``s``'s routes (position, source leaf, dest leaf, climbs to a
    core) without the CSR offsets; kept with the schedule, where :func:`_rewrite` leaves
    those of the table it builds (pricing ECMP after the routing pass reads them there)."""
    if "spine_hops" not in s._cache:
        pos, la, lb, _, core = _spine_hops(s, fab)
        # narrow: kept as long as the schedule (at 4,096 GPUs 16.7M routes: 0.2 GB, not 0.5)
        s._cache["spine_hops"] = (pos.astype(np.int16), la.astype(np.int32),
                                  lb.astype(np.int32), core)
    return s._cache["spine_hops"]


def _flows(s: Schedule):
    """(fabric info, hop positions per route, ops crossing spines, their source/dest leaves,
    whether each climbs to a core), or ``None`` without spines."""
    fab = _fabric(s.topology)
    if fab is None:
        return None
    pos, la, lb, core = _route_hops(s, fab)
    r = s.ops.route
    crossing = np.flatnonzero(pos[r] >= 0)
    rc = r[crossing]
    # (leaves widened: keys like la * (leaves + 1) + lb are formed from them)
    return fab, pos, crossing, la[rc].astype(np.int64), lb[rc].astype(np.int64), core[rc]


def _candidates(fab: dict, a: int, b: int) -> np.ndarray:
    """Spines reachable from leaf ``a`` to leaf ``b`` over healthy links."""
    return np.flatnonzero(fab["up_ok"][a] & fab["down_ok"][:, b])


def _core_candidates(fab: dict, a: int, b: int) -> np.ndarray:
    """Cores through which leaf ``a`` reaches leaf ``b`` (in another pod) over healthy links:
    up to the spine of ``a``'s pod wired to the core, down from the one of ``b``'s pod."""
    sa = fab["pod_spine"][fab["leaf_pod"][a]]
    sb = fab["pod_spine"][fab["leaf_pod"][b]]
    cores = np.arange(len(sa))
    wired = (sa >= 0) & (sb >= 0)
    sa_, sb_ = np.maximum(sa, 0), np.maximum(sb, 0)
    ok = (wired & fab["up_ok"][a, sa_] & fab["sc_ok"][sa_, cores] & fab["cs_ok"][cores, sb_]
          & fab["down_ok"][sb_, b])
    return np.flatnonzero(ok)


def _core_path(fab: dict, a: int, b: int, core) -> np.ndarray:
    """The four links leaf ``a`` -> spine -> ``core`` -> spine -> leaf ``b``; for an array of
    cores, one row of four per core."""
    core = np.asarray(core)
    sa = fab["pod_spine"][fab["leaf_pod"][a], core]
    sb = fab["pod_spine"][fab["leaf_pod"][b], core]
    return np.stack([fab["up"][a, sa], fab["sc"][sa, core], fab["cs"][core, sb],
                     fab["down"][sb, b]], axis=-1).astype(np.int64)


def _no_path(s: Schedule, a: int, b: int) -> ScheduleError:
    return ScheduleError(f"no healthy spine connects leaf index {a} to leaf index {b} in "
                         f"'{s.topology.name}': every leaf-spine path between them has failed")


# ----------------------------------------------------------------------------------------------
# ECMP


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 finalizer: a fixed, well-spread hash (switch ASICs use CRCs; any fixed,
    load-blind function shows the same collisions)."""
    x = x.astype(np.uint64)
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    return x


def ecmp_routes(s: Schedule, seed: int = 0, used_only: bool = False) -> Schedule:
    """``s`` with every spine-crossing flow hashed onto a spine by ``(src, dst, step)``.

    The hash picks among the spines with healthy links on both sides (converged routing tables;
    see the module docstring). Ops of one pair in one step share a hash, as packets of one
    connection do. ``used_only``: the route table holds only the paths the ops take (the same
    times; at 4,096 ranks the full table would hold three paths per pair).
    """
    got = _ecmp_choices(s, seed)
    if got is None:
        return s
    fab, _, spine_of_op, core_of_op = got
    return _rewrite(s, fab, spine_of_op, core_of_op, used_only)


def ecmp_pair_links(s: Schedule, seed: int = 0) -> np.ndarray | None:
    """The links of ``s.op_links()``'s (op, link) pairs with every spine-crossing flow hashed
    as :func:`ecmp_routes` hashes it: the pairs its schedule expands to, in the same order,
    without building its route table (what pricing ECMP needs: at 4,096 ranks the table is
    rewritten over 84M links); ``None`` where no flow crosses a spine."""
    got = _ecmp_choices(s, seed)
    if got is None:
        return None
    fab, pos, spine_of_op, core_of_op = got
    route = s.ops.route
    lengths = s.routes.lengths()[route]
    first = np.cumsum(lengths)
    first -= lengths                                    # each op's first pair
    del lengths                 # (at 4,096 GPUs 0.1 GB each, at the compile's peak)
    # (a writable copy of the pairs' links: op_links keeps its own read-only)
    links = s.op_links()[1].copy()
    for choice, hops in ((spine_of_op, 2), (core_of_op, 4)):
        picked = np.flatnonzero(choice >= 0)
        if len(picked):
            _replace_spine_hops(fab, s.topology, links, first[picked] + pos[route[picked]],
                                choice[picked], hops)
    return links


def _replace_spine_hops(fab: dict, topo: Topology, links: np.ndarray, at: np.ndarray,
                        choice: np.ndarray, hops: int) -> None:
    """Write into ``links``, at ``at[i]`` and the ``hops - 1`` entries after it, the spine
    hops of a path through spine (or core) ``choice[i]`` between the leaves those entries
    join now. A block of paths at a time: at 4,096 ranks the leaves and new hops of all 16.6M
    paths at once are a gigabyte of temporaries."""
    leaf_of, _ = _vertex_tiers(topo, fab)
    for lo in range(0, len(at), _HOP_BLOCK):
        where, c = at[lo:lo + _HOP_BLOCK], choice[lo:lo + _HOP_BLOCK]
        a = leaf_of[topo.link_src[links[where]]]
        b = leaf_of[topo.link_dst[links[where + hops - 1]]]
        for k, hop in enumerate(_replaced_hops(fab, a, b, c, hops)):
            links[where + k] = hop


#: paths whose spine hops :func:`_replace_spine_hops` rewrites at once
_HOP_BLOCK = 1 << 20


def _replaced_hops(fab: dict, a: np.ndarray, b: np.ndarray, c: np.ndarray, hops: int
                   ) -> tuple[np.ndarray, ...]:
    """The links that replace a flow's spine hops from leaf ``a`` to leaf ``b`` through spine
    ``c`` (``hops == 2``), or through core ``c`` and a spine of each pod (``hops == 4``)."""
    if hops == 2:
        return fab["up"][a, c], fab["down"][c, b]
    sa = fab["pod_spine"][fab["leaf_pod"][a], c]
    sb = fab["pod_spine"][fab["leaf_pod"][b], c]
    return fab["up"][a, sa], fab["sc"][sa, c], fab["cs"][c, sb], fab["down"][sb, b]


def _ecmp_choices(s: Schedule, seed: int
                  ) -> tuple[dict, np.ndarray, np.ndarray, np.ndarray] | None:
    """ECMP's hash of every spine-crossing flow of ``s``: ``(fabric, each route's spine hop
    position, spine of every op or -1, core of every op or -1)``; ``None`` where no flow
    crosses a spine."""
    got = _flows(s)
    if got is None:
        return None
    fab, pos, crossing, la, lb, up3 = got
    if not len(crossing):
        return None
    group = np.asarray(s.collective.group, dtype=np.int64)
    ops = s.ops
    with np.errstate(over="ignore"):
        key = (group[ops.src[crossing]].astype(np.uint64) * np.uint64(1_000_003)
               + group[ops.dst[crossing]].astype(np.uint64)) * np.uint64(1_000_033) \
            + ops.step[crossing].astype(np.uint64) + np.uint64(seed) * np.uint64(0x9E3779B9)
    h = _mix(key)
    del key
    # the candidates of every distinct (source leaf, dest leaf, through a core), padded
    pairs, inverse = _leaf_pairs(fab, la, lb, up3)
    cands = [_path_candidates(fab, a, b, c) for a, b, c in pairs]
    count = np.array([len(c) for c in cands], dtype=np.int64)
    if not count.all():
        # the first op without a healthy path names it
        j = int(np.flatnonzero(count[inverse] == 0)[0])
        raise _no_path(s, int(la[j]), int(lb[j]))
    del la, lb              # (a pair's row names them now: 0.1 GB each at 4,096 GPUs)
    table = np.zeros((len(pairs), int(count.max())), dtype=np.int64)
    for row, c in enumerate(cands):
        table[row, :len(c)] = c
    # through a core, one hash over the (spine, core) paths: with the fat tree's equal
    # groups, as even as a leaf hashing onto a spine and the spine onto a core
    pick = table[inverse, (h % count[inverse].astype(np.uint64)).astype(np.int64)]
    del h, inverse
    spine_of_op = np.full(len(ops), -1, dtype=np.int32)
    core_of_op = np.full(len(ops), -1, dtype=np.int32)
    spine_of_op[crossing[~up3]] = pick[~up3]
    core_of_op[crossing[up3]] = pick[up3]
    return fab, pos, spine_of_op, core_of_op


# ----------------------------------------------------------------------------------------------
# planned


def _least_max_load(sizes: np.ndarray, links: int) -> int:
    """The least possible load of the busiest of ``links`` links carrying indivisible flows of
    ``sizes``: at least the largest flow, the mean, and the ``ceil(F / links)`` smallest flows
    (some link gets that many). For equal flows: ``ceil(F / links)`` flows."""
    if not len(sizes) or links <= 0:
        return 0
    k = math.ceil(len(sizes) / links)
    return int(max(sizes.max(), math.ceil(int(sizes.sum()) / links),
                   np.sort(sizes)[:k].sum()))


def step_fair_share(fab: dict, sizes: np.ndarray, la: np.ndarray, lb: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Fair share, in bytes, of every healthy uplink and downlink of each leaf in one step.

    A flow may only use the spines with healthy links on both of its sides. For a leaf and any
    set ``U`` of spines, the flows of that leaf that can use nothing but spines of ``U`` must
    share ``U``'s links (Hall's condition), so no assignment can load the busiest of them less
    than :func:`_least_max_load` of those flows over ``|U|`` links. The share is the largest
    such bound over the unions of the flows' spine sets (``U`` = all healthy spines gives the
    plain ``ceil(F / H)`` flows). It is a lower bound for every assignment, ECMP's included;
    on a healthy fabric the plan meets it. With failures the shares of different leaves can
    conflict (an odd cycle of forced choices), and the plan minimises the overload instead.
    Returns ``(up, down)`` indexed by leaf.
    """
    n_leaves = fab["up"].shape[0]
    cand = {}
    for x, y in set(zip(la.tolist(), lb.tolist(), strict=True)):
        cand[(x, y)] = frozenset(_candidates(fab, x, y).tolist())
    sets = [cand[(x, y)] for x, y in zip(la.tolist(), lb.tolist(), strict=True)]
    up = np.zeros(n_leaves, dtype=np.int64)
    down = np.zeros(n_leaves, dtype=np.int64)
    for leaf_of, out in ((la, up), (lb, down)):
        for leaf in np.unique(leaf_of).tolist():
            idx = np.flatnonzero(leaf_of == leaf)
            out[leaf] = _hall_share(sizes[idx], [sets[i] for i in idx.tolist()])
    return up, down


#: distinct spine sets per leaf beyond which only single sets and their full union are tried
_HALL_MAX_SETS = 10


def _hall_share(sizes: np.ndarray, sets: list[frozenset]) -> int:
    distinct = sorted(set(sets), key=sorted)
    if len(distinct) <= _HALL_MAX_SETS:
        unions = set()
        for mask in range(1, 1 << len(distinct)):
            unions.add(frozenset().union(*(d for k, d in enumerate(distinct) if mask >> k & 1)))
    else:
        unions = set(distinct) | {frozenset().union(*distinct)}
    best = 0
    for u in unions:
        if not u:
            continue
        inside = np.array([c <= u for c in sets])
        best = max(best, _least_max_load(sizes[inside], len(u)))
    return best


def fair_shares(s: Schedule) -> dict[int, np.ndarray]:
    """``{leaf-spine link id: fair share in bytes per step}`` for every healthy spine link
    (see :func:`step_fair_share`); 0 in steps where its leaf sends (receives) nothing."""
    fab = _fabric(s.topology)
    got = _flows(s)
    if fab is None or got is None:
        return {}
    if "core_index" in fab:
        raise ScheduleError(f"'{s.topology.name}' has three tiers: fair shares are computed for "
                            "leaf/spine fabrics only (routes through the core are planned by "
                            "least load; see planned_routes)")
    _, _, crossing, la, lb, _ = got
    sizes = s.op_bytes()[crossing]
    steps = s.ops.step[crossing]
    out: dict[int, np.ndarray] = {}
    for link in np.concatenate([fab["up"][fab["up_ok"]], fab["down"][fab["down_ok"]]]).tolist():
        out[int(link)] = np.zeros(s.n_steps, dtype=np.int64)
    for step in np.unique(steps).tolist():
        m = steps == step
        cap_up, cap_down = step_fair_share(fab, sizes[m], la[m], lb[m])
        for a in np.unique(la[m]).tolist():
            for link in fab["up"][a][fab["up_ok"][a]].tolist():
                out[link][step] = cap_up[a]
        for b in np.unique(lb[m]).tolist():
            for link in fab["down"][:, b][fab["down_ok"][:, b]].tolist():
                out[link][step] = cap_down[b]
    return out


#: CP-SAT's limit per step assignment, in its deterministic time units (about seconds)
CPSAT_DETERMINISTIC_TIME = 2.0


def _assign_step(fab: dict, sizes: np.ndarray, la: np.ndarray, lb: np.ndarray) -> np.ndarray:
    """Spine per flow for one step: greedy largest-first; CP-SAT when greedy breaks a share."""
    n_leaves, n_spines = fab["up"].shape
    cap_up, cap_down = step_fair_share(fab, sizes, la, lb)
    up = np.zeros((n_leaves, n_spines), dtype=np.int64)
    down = np.zeros((n_spines, n_leaves), dtype=np.int64)
    choice = np.empty(len(sizes), dtype=np.int64)
    cands = [_candidates(fab, a, b) for a, b in zip(la.tolist(), lb.tolist(), strict=True)]
    for f in np.argsort(-sizes, kind="stable").tolist():
        a, b, c = int(la[f]), int(lb[f]), cands[f]
        # least loaded pair of links (largest flows first: LPT), ties by relative fill
        load = np.maximum(up[a, c], down[c, b]) + sizes[f]
        fill = np.maximum((up[a, c] + sizes[f]) / max(cap_up[a], 1),
                          (down[c, b] + sizes[f]) / max(cap_down[b], 1))
        s = int(c[np.lexsort((fill, load))[0]])
        choice[f] = s
        up[a, s] += sizes[f]
        down[s, b] += sizes[f]
    if (up <= cap_up[:, None]).all() and (down <= cap_down[None, :]).all():
        return choice
    return _assign_cpsat(fab, sizes, la, lb, cands, cap_up, cap_down, choice)


def _assign_cpsat(fab, sizes, la, lb, cands, cap_up, cap_down, hint) -> np.ndarray:
    """Exact assignment: minimise the worst link's overload above its fair share (0 when the
    shares can all be met), then the busiest link's load."""
    # OR-Tools (0.1-0.4 s to import) only when this model is solved
    from ortools.sat.python import cp_model

    scale = max(1, int(np.gcd.reduce(sizes.astype(np.int64))))
    w = (sizes // scale).astype(int).tolist()
    m = cp_model.CpModel()
    x = {}
    for f, c in enumerate(cands):
        vs = []
        for s in c.tolist():
            x[f, s] = m.new_bool_var(f"x{f}_{s}")
            m.add_hint(x[f, s], int(hint[f] == s))
            vs.append(x[f, s])
        m.add_exactly_one(vs)
    total = int(sizes.sum() // scale)
    over = m.new_int_var(0, total, "over")
    busiest = m.new_int_var(0, total, "busiest")
    by_up: dict[tuple[int, int], list] = {}
    by_down: dict[tuple[int, int], list] = {}
    for (f, s), v in x.items():
        by_up.setdefault((int(la[f]), s), []).append((w[f], v))
        by_down.setdefault((s, int(lb[f])), []).append((w[f], v))
    for (a, _spine), terms in by_up.items():
        m.add(sum(c * v for c, v in terms) <= int(cap_up[a] // scale) + over)
        m.add(sum(c * v for c, v in terms) <= busiest)
    for (_spine, b), terms in by_down.items():
        m.add(sum(c * v for c, v in terms) <= int(cap_down[b] // scale) + over)
        m.add(sum(c * v for c, v in terms) <= busiest)
    m.minimize(over * (total + 1) + busiest)
    solver = cp_model.CpSolver()
    solver.parameters.num_search_workers = 1
    solver.parameters.random_seed = 0
    # a limit in CP-SAT's deterministic time, not seconds: where it stops short the routes
    # are the same on every machine (a wall-clock limit made them depend on its speed), and
    # hard steps (a GPU without its NIC on hgx16: 118 flows) took 10 s each for what 2 units
    # (about 2.3 s here) find
    solver.parameters.max_deterministic_time = CPSAT_DETERMINISTIC_TIME
    status = solver.solve(m)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return hint
    out = np.empty(len(sizes), dtype=np.int64)
    for (f, s), v in x.items():
        if solver.value(v):
            out[f] = s
    return out


def planned_routes(s: Schedule) -> Schedule:
    """``s`` with a planned spine for every spine-crossing op, step by step.

    Each op is its own flow (several ops of one pair may take different spines, as NCCL's
    multiple queue pairs per connection do). Steps with the same flow pattern are solved once.
    """
    got = _flows(s)
    if got is None or not len(got[2]):
        return s
    fab, _, crossing, la, lb, up3 = got
    del got
    core_of_op: np.ndarray | None = None
    if "core_index" in fab:
        spine_of_op, core_of_op = _tier_choices(s, fab, crossing, la, lb, up3)
    else:
        spine_of_op = _spine_choices(s, fab, crossing, la, lb)
    # the flows' arrays go before the table is rewritten, the pass's busiest moment (at
    # 4,096 GPUs 16.7M flows: 0.6 GB with their sizes)
    del crossing, la, lb, up3
    # only the paths ops take: the ones replaced would double the table (and the JSON)
    return _rewrite(s, fab, spine_of_op, core_of_op, used_only=True)


def _spine_choices(s: Schedule, fab: dict, crossing: np.ndarray, la: np.ndarray,
                   lb: np.ndarray) -> np.ndarray:
    """:func:`planned_routes` on two tiers: the spine of every op (-1: crossing none)."""
    _check_paths(s, fab, la, lb, None)
    sizes = s.op_bytes()[crossing]
    steps = s.ops.step[crossing]
    spine_of_op = np.full(len(s.ops), -1, dtype=np.int32)
    # every step in canonical order: the greedy (and CP-SAT's model) takes the flows in the
    # order given
    solved = _solved_once(
        [i[lexsort_ints((sizes[i], lb[i], la[i]))]
         for i in np.split(np.arange(len(crossing)), np.flatnonzero(np.diff(steps)) + 1)],
        lambda i: i, lambda i: np.stack([la[i], lb[i], sizes[i]]).tobytes(),
        lambda i: _assign_step(fab, sizes[i], la[i], lb[i]))
    for idx, choice in solved:
        spine_of_op[crossing[idx]] = choice
    return spine_of_op


def _solved_once(steps: list[np.ndarray], canonical: Callable[[np.ndarray], np.ndarray],
                 pattern: Callable[[np.ndarray], bytes],
                 solve: Callable[[np.ndarray], np.ndarray]) -> list[tuple[np.ndarray, np.ndarray]]:
    """``(flows, solve(flows))`` of every step's flows, solved once per distinct
    ``pattern(flows)`` of the flows in ``canonical`` order. ``solve`` must give each flow the
    same choice whatever order the flows come in (it orders them itself, ties by their order
    among equal flows, which ``canonical`` keeps), unless the steps come in canonical order
    already (``canonical`` the identity). Only steps with as many flows as another
    step are put in canonical order and given a pattern (equal patterns have equal lengths):
    a one-step alltoall's 16.7M flows would be sorted, and a 0.5 GB pattern built, to find no
    other step like it."""
    count = collections.Counter(len(flows) for flows in steps)
    memo: dict[bytes, np.ndarray] = {}
    out = []
    for flows in steps:
        if count[len(flows)] == 1:
            out.append((flows, solve(flows)))
            continue
        flows = canonical(flows)
        key = pattern(flows)
        if key not in memo:
            memo[key] = solve(flows)
        out.append((flows, memo[key]))
    return out


def _check_paths(s: Schedule, fab: dict, la: np.ndarray, lb: np.ndarray,
                 up3: np.ndarray | None) -> None:
    """Raise :func:`_no_path` if a flow's leaves have no healthy path (``up3``: which flows
    climb to a core; ``None`` on two tiers). Each distinct flow is checked once; only when
    one fails are the flows walked as a set, as they always were, to name the same pair."""
    climbs = np.zeros(len(la), dtype=bool) if up3 is None else up3
    if all(len(_path_candidates(fab, a, b, c))
           for a, b, c in _leaf_pairs(fab, la, lb, climbs)[0]):
        return
    if up3 is None:
        for a, b in set(zip(la.tolist(), lb.tolist(), strict=True)):
            if not len(_candidates(fab, a, b)):
                raise _no_path(s, a, b)
    for a, b, c in set(zip(la.tolist(), lb.tolist(), climbs.tolist(), strict=True)):
        if not len((_core_candidates if c else _candidates)(fab, a, b)):
            raise _no_path(s, a, b)


def _leaf_pairs(fab: dict, la: np.ndarray, lb: np.ndarray, climbs: np.ndarray
                ) -> tuple[list[tuple[int, int, bool]], np.ndarray]:
    """The distinct (source leaf, dest leaf, climbs to a core) of the flows, and the row of
    each flow among them. Marked in their small key space (leaves >= 0 on crossing flows):
    sorting the 4,096-GPU AllToAll's 16.7M keys took a second."""
    width = len(fab["leaf_index"]) + 1
    key = (la * width + lb) * 2 + climbs
    seen = np.zeros(2 * width * width, dtype=bool)
    seen[key] = True
    distinct = np.flatnonzero(seen)
    row = np.zeros(len(seen), dtype=np.int64)
    row[distinct] = np.arange(len(distinct))
    pairs = list(zip((distinct // 2 // width).tolist(), (distinct // 2 % width).tolist(),
                     (distinct % 2).astype(bool).tolist(), strict=True))
    return pairs, row[key]


def _path_candidates(fab: dict, a: int, b: int, climbs: bool) -> np.ndarray:
    """:func:`_core_candidates` or :func:`_candidates` of leaves ``a`` and ``b``, kept on the
    fabric's structure (the plan's check and ECMP's hash ask for the same 16K pairs)."""
    kept = fab.setdefault("path_candidates", {})
    key = (a, b, climbs)
    if key not in kept:
        kept[key] = (_core_candidates if climbs else _candidates)(fab, a, b)
    return kept[key]


def _tier_choices(s: Schedule, fab: dict, crossing: np.ndarray, la: np.ndarray,
                  lb: np.ndarray, up3: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`planned_routes` on a three-tier fabric: the spine of every op that stays in its
    pod and the core of every op that leaves it (-1 elsewhere). Every flow of a step gets the
    path that keeps the busiest link it crosses least busy (in seconds: core links may be
    faster than leaf links), largest flows first. No fair-share repair here: the Hall bounds
    of :func:`step_fair_share` are for two tiers."""
    _check_paths(s, fab, la, lb, up3)
    sizes = s.op_bytes()[crossing]
    steps = s.ops.step[crossing]
    spine_of_op = np.full(len(s.ops), -1, dtype=np.int32)
    core_of_op = np.full(len(s.ops), -1, dtype=np.int32)
    paths: dict[tuple[int, int, bool], tuple[np.ndarray, np.ndarray]] = {}
    solved = _solved_once(
        np.split(np.arange(len(crossing)), np.flatnonzero(np.diff(steps)) + 1),
        lambda i: i[lexsort_ints((sizes[i], up3[i], lb[i], la[i]))],
        lambda i: np.stack([la[i], lb[i], sizes[i], up3[i]]).tobytes(),
        lambda i: _assign_step_tiers(s.topology.link_bandwidth, fab, paths, sizes[i], la[i],
                                     lb[i], up3[i]))
    for idx, choice in solved:
        at, climbs = crossing[idx], up3[idx]
        core_of_op[at[climbs]] = choice[climbs]
        spine_of_op[at[~climbs]] = choice[~climbs]
    return spine_of_op, core_of_op


def _assign_step_tiers(bandwidth: np.ndarray, fab: dict, paths: dict, sizes: np.ndarray,
                       la: np.ndarray, lb: np.ndarray, up3: np.ndarray) -> np.ndarray:
    """Spine (in a pod) or core (between pods) per flow of one step: least busiest link in
    seconds, then least total, largest flows first (LPT).

    Flows are taken in runs of one (source leaf, dest leaf, tier) and one size, each run at
    once (:func:`cclc.least_busy.least_busy_picks`): a 4,096-rank alltoall has 16.7M flows
    in 16K runs."""
    load = np.zeros(len(bandwidth))
    choice = np.empty(len(sizes), dtype=np.int64)
    key = (la * (int(lb.max(initial=0)) + 1) + lb) * 2 + up3
    # largest first, then by leaves and tier, then in the order given (one sort of a combined
    # key: the flows of a one-step alltoall come in the ops' order)
    order = lexsort_ints((key, int(sizes.max(initial=0)) - sizes))
    key = key[order]
    cut = np.flatnonzero((np.diff(key) != 0) | (np.diff(sizes[order]) != 0)) + 1
    starts = np.concatenate([[0], cut]).tolist()
    ends = np.concatenate([cut, [len(order)]]).tolist()
    for lo, hi in zip(starts, ends, strict=True):
        f = int(order[lo])
        cand, links, comp = _tier_paths(fab, paths, int(la[f]), int(lb[f]), bool(up3[f]))
        picks = least_busy_picks(load, bandwidth, links, comp, sizes[f], hi - lo)
        choice[order[lo:hi]] = cand[picks]
        # each path's flows at once (whole byte counts: exact in float64, as one at a time)
        taken = np.bincount(picks, minlength=len(links)) * sizes[f]
        np.add.at(load, links.ravel(), np.repeat(taken, links.shape[1]))
    return choice


def _tier_paths(fab: dict, paths: dict, a: int, b: int, up3: bool
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The candidates (spines or cores) from leaf ``a`` to leaf ``b``, their paths' links
    (one row each) and each path's component (paths joined by shared links: the two cores
    of a group share their spines' links); kept in ``paths``."""
    key = (a, b, up3)
    got = paths.get(key)
    if got is None:
        if up3:
            cand = _core_candidates(fab, a, b)
            links = _core_path(fab, a, b, cand)
            # two core paths share a link only where they share a spine (each link joins one
            # pair of switches), so their components follow from their spines, which repeat
            # for every leaf pair of two pods: joined once per spines (16K leaf pairs at
            # 4,096 GPUs, a handful of spine patterns)
            spines = (fab["pod_spine"][fab["leaf_pod"][a], cand].tobytes(),
                      fab["pod_spine"][fab["leaf_pod"][b], cand].tobytes())
            comps = fab.setdefault("core_components", {})
            if spines not in comps:
                comps[spines] = _components(links)
            comp = comps[spines]
        else:
            cand = _candidates(fab, a, b)
            links = np.stack([fab["up"][a, cand], fab["down"][cand, b]], axis=1)
            # distinct spines: no link shared, every path alone
            comp = np.arange(len(cand))
        got = paths[key] = (cand, links, comp)
    return got


def _components(links: np.ndarray) -> np.ndarray:
    """The component of every path (row of ``links``) among paths joined by shared links,
    named by its first row."""
    comp = np.arange(len(links))
    # join paths that share a link until nothing changes (a handful of rounds)
    changed = True
    while changed and len(links):
        low = np.full(int(links.max()) + 1, len(links))
        np.minimum.at(low, links.ravel(), np.repeat(comp, links.shape[1]))
        new = np.minimum(comp, low[links].min(axis=1))
        new = new[new]
        changed = bool((new != comp).any())
        comp = new
    return comp


def spine_link_loads(s: Schedule) -> dict[int, np.ndarray]:
    """Bytes per step on every leaf<->spine (and spine<->core) link: ``{link id: bytes per
    step}`` (links used only).

    For tests and reports: compare with :func:`fair_shares` or look for ECMP collisions.
    """
    fab = _fabric(s.topology)
    if fab is None:
        return {}
    spine_links = set(fab["up"][fab["up"] >= 0].tolist()) | set(fab["down"][fab["down"] >= 0]
                                                               .tolist())
    for tier in ("sc", "cs"):
        if tier in fab:
            spine_links |= set(fab[tier][fab[tier] >= 0].tolist())
    out: dict[int, np.ndarray] = {}
    nb = s.op_bytes()
    n_steps = s.n_steps
    for i in range(len(s.ops)):
        for link in s.routes.path(int(s.ops.route[i])):
            if link in spine_links:
                out.setdefault(link, np.zeros(n_steps, dtype=np.int64))[int(s.ops.step[i])] += nb[i]
    return out
