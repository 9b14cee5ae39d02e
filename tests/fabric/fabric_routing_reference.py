"""The per-route and per-flow spine and core routing that cclc.fabric_routing computed before
it worked over arrays, kept as the reference its tests compare with: the same routes, route
ids and choices, one route or flow at a time in Python (the loops it replaced took minutes
at a million pairs). What the array rewrite left as it was (the fabric's structure, a pair's
spine and core candidates, ECMP's hash, the two-tier step assignment) is the module's own,
imported, so only the replaced loops are kept here."""

from __future__ import annotations

import numpy as np

from cclc.errors import ScheduleError
from cclc.fabric_routing import (
    _assign_step,
    _candidates,
    _core_candidates,
    _core_path,
    _fabric,
    _mix,
    _no_path,
)
from cclc.ir import Routes, Schedule

__all__ = ["ecmp_routes", "planned_routes"]


# ----------------------------------------------------------------------------------------------
# the per-route and per-flow loops


def _spine_hops(s: Schedule, fab: dict
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """For each route: position of its leaf->spine link (-1 if none), source leaf, dest leaf,
    and whether it climbs to a core (leaf, spine, core, spine, leaf: three tiers)."""
    topo = s.topology
    li, si = fab["leaf_index"], fab["spine_index"]
    n_routes = len(s.routes)
    pos = np.full(n_routes, -1, dtype=np.int64)
    la = np.full(n_routes, -1, dtype=np.int64)
    lb = np.full(n_routes, -1, dtype=np.int64)
    offs, links = s.routes.offsets, s.routes.links
    src_v, dst_v = topo.link_src[links], topo.link_dst[links]
    is_up = np.isin(src_v, list(li)) & np.isin(dst_v, list(si))
    twice = np.zeros(n_routes, dtype=bool)
    core = np.zeros(n_routes, dtype=bool)
    ci = fab.get("core_index", {})
    for k in np.flatnonzero(is_up).tolist():
        r = int(np.searchsorted(offs, k, side="right")) - 1
        if pos[r] >= 0:
            # no spine reaches both leaves over healthy links: the path detours through a
            # third leaf and is kept as found (there is no spine choice to plan)
            twice[r] = True
            continue
        if k + 1 >= offs[r + 1]:
            raise ScheduleError(f"route {r} ends at a spine")
        pos[r] = k - offs[r]
        la[r] = li[int(src_v[k])]
        if int(dst_v[k + 1]) in ci:
            if k + 3 >= offs[r + 1] or int(dst_v[k + 3]) not in li:
                raise ScheduleError(f"route {r} climbs to a core and does not come down to a "
                                    "leaf")
            core[r] = True
            lb[r] = li[int(dst_v[k + 3])]
        else:
            lb[r] = li[int(dst_v[k + 1])]
    pos[twice], la[twice], lb[twice], core[twice] = -1, -1, -1, False
    return pos, la, lb, offs, core


def _rewrite(s: Schedule, fab: dict, spine_of_op: np.ndarray, hop_pos: np.ndarray,
             core_of_op: np.ndarray | None = None, used_only: bool = False) -> Schedule:
    """``s`` with the spine of every op where ``spine_of_op >= 0`` replaced, and the core
    (and with it both spines) of every op where ``core_of_op >= 0``; ``used_only``: the old
    table's paths only where an op not rewritten takes them."""
    ops = s.ops
    new_route = ops.route.astype(np.int64).copy()
    table: dict[tuple[int, ...], int] = {}
    paths: list[tuple[int, ...]] = [()]
    table[()] = 0
    old_rows = range(1, len(s.routes))
    if used_only:
        rewritten = np.zeros(len(ops), dtype=bool)
        for choice in (spine_of_op, core_of_op):
            if choice is not None:
                rewritten |= choice >= 0
        old_rows = sorted(set(ops.route[~rewritten].tolist()) - {0})
    for r in old_rows:
        p = s.routes.path(r)
        if p not in table:
            table[p] = len(paths)
            paths.append(p)
    # (paths no op keeps map to 0: every op of theirs is rewritten below)
    old_to_new = np.array([table.get(s.routes.path(r), 0) for r in range(len(s.routes))],
                          dtype=np.int64)
    new_route = old_to_new[new_route]
    topo = s.topology
    # one new path per distinct (old route, choice): millions of ops share a few thousand
    for choice, hops in ((spine_of_op, 2), (core_of_op, 4)):
        if choice is None:
            continue
        picked = np.flatnonzero(choice >= 0)
        if not len(picked):
            continue
        pairs, first, inverse = np.unique(np.stack([ops.route[picked].astype(np.int64),
                                                    choice[picked]], axis=1), axis=0,
                                          return_index=True, return_inverse=True)
        ids = np.empty(len(pairs), dtype=np.int64)
        # in the order the ops first use them, so new routes are numbered as op by op
        for j in np.argsort(first, kind="stable").tolist():
            r, c = (int(x) for x in pairs[j])
            path = list(s.routes.path(r))
            k = int(hop_pos[r])
            a = fab["leaf_index"][int(topo.link_src[path[k]])]
            b = fab["leaf_index"][int(topo.link_dst[path[k + hops - 1]])]
            if hops == 2:
                path[k], path[k + 1] = int(fab["up"][a, c]), int(fab["down"][c, b])
            else:
                path[k:k + 4] = _core_path(fab, a, b, c).tolist()
            ids[j] = _route_id(table, paths, tuple(path))
        new_route[picked] = ids[inverse.ravel()]
    offsets = np.zeros(len(paths) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(p) for p in paths])
    links = np.fromiter((x for p in paths for x in p), dtype=np.int32, count=int(offsets[-1]))
    cols = ops.columns()
    cols["route"] = new_route
    return s.replace(ops=type(ops)(**cols), routes=Routes(offsets, links))


def _route_id(table: dict[tuple[int, ...], int], paths: list[tuple[int, ...]],
              path: tuple[int, ...]) -> int:
    """The id of ``path`` in the new route table, adding it when new."""
    rid = table.get(path)
    if rid is None:
        rid = table[path] = len(paths)
        paths.append(path)
    return rid


def _flows(s: Schedule):
    """(fabric info, hop positions per route, ops crossing spines, their source/dest leaves,
    whether each climbs to a core), or ``None`` without spines."""
    fab = _fabric(s.topology)
    if fab is None:
        return None
    pos, la, lb, _, core = _spine_hops(s, fab)
    r = s.ops.route
    crossing = np.flatnonzero(pos[r] >= 0)
    rc = r[crossing]
    return fab, pos, crossing, la[rc], lb[rc], core[rc]


def ecmp_routes(s: Schedule, seed: int = 0) -> Schedule:
    """``s`` with every spine-crossing flow hashed onto a spine by ``(src, dst, step)``.

    The hash picks among the spines with healthy links on both sides (converged routing tables;
    see the module docstring). Ops of one pair in one step share a hash, as packets of one
    connection do.
    """
    got = _flows(s)
    if got is None:
        return s
    fab, pos, crossing, la, lb, up3 = got
    if not len(crossing):
        return s
    group = np.asarray(s.collective.group, dtype=np.int64)
    ops = s.ops
    with np.errstate(over="ignore"):
        key = (group[ops.src[crossing]].astype(np.uint64) * np.uint64(1_000_003)
               + group[ops.dst[crossing]].astype(np.uint64)) * np.uint64(1_000_033) \
            + ops.step[crossing].astype(np.uint64) + np.uint64(seed) * np.uint64(0x9E3779B9)
    h = _mix(key)
    spine_of_op = np.full(len(ops), -1, dtype=np.int64)
    core_of_op = np.full(len(ops), -1, dtype=np.int64)
    cand_cache: dict[tuple[int, int, bool], np.ndarray] = {}
    for j, (i, a, b, c) in enumerate(zip(crossing.tolist(), la.tolist(), lb.tolist(),
                                         up3.tolist(), strict=True)):
        cand = cand_cache.get((a, b, c))
        if cand is None:
            cand = cand_cache[(a, b, c)] = (_core_candidates if c else _candidates)(fab, a, b)
        if not len(cand):
            raise _no_path(s, a, b)
        # through a core, one hash over the (spine, core) paths: with the fat tree's equal
        # groups, as even as a leaf hashing onto a spine and the spine onto a core
        (core_of_op if c else spine_of_op)[i] = cand[int(h[j] % np.uint64(len(cand)))]
    return _rewrite(s, fab, spine_of_op, pos, core_of_op)


# ----------------------------------------------------------------------------------------------
# planned


def planned_routes(s: Schedule) -> Schedule:
    """``s`` with a planned spine for every spine-crossing op, step by step.

    Each op is its own flow (several ops of one pair may take different spines, as NCCL's
    multiple queue pairs per connection do). Steps with the same flow pattern are solved once.
    """
    got = _flows(s)
    if got is None:
        return s
    fab, pos, crossing, la, lb, up3 = got
    if not len(crossing):
        return s
    if "core_index" in fab:
        return _planned_tiers(s, fab, pos, crossing, la, lb, up3)
    for a, b in set(zip(la.tolist(), lb.tolist(), strict=True)):
        if not len(_candidates(fab, a, b)):
            raise _no_path(s, a, b)
    sizes = s.op_bytes()[crossing]
    steps = s.ops.step[crossing]
    spine_of_op = np.full(len(s.ops), -1, dtype=np.int64)
    memo: dict[bytes, np.ndarray] = {}
    bounds = np.flatnonzero(np.diff(steps)) + 1
    for idx in np.split(np.arange(len(crossing)), bounds):
        # canonical order inside the step so that equal patterns share one solution
        order = np.lexsort((sizes[idx], lb[idx], la[idx]))
        idx = idx[order]
        key = np.stack([la[idx], lb[idx], sizes[idx]]).tobytes()
        choice = memo.get(key)
        if choice is None:
            choice = memo[key] = _assign_step(fab, sizes[idx], la[idx], lb[idx])
        spine_of_op[crossing[idx]] = choice
    return _rewrite(s, fab, spine_of_op, pos, used_only=True)


def _planned_tiers(s: Schedule, fab: dict, pos: np.ndarray, crossing: np.ndarray,
                   la: np.ndarray, lb: np.ndarray, up3: np.ndarray) -> Schedule:
    """:func:`planned_routes` on a three-tier fabric: every flow of a step, in its pod or
    through a core, gets the path that keeps the busiest link it crosses least busy (in
    seconds: core links may be faster than leaf links), largest flows first. No fair-share
    repair here: the Hall bounds of :func:`step_fair_share` are for two tiers."""
    for a, b, c in set(zip(la.tolist(), lb.tolist(), up3.tolist(), strict=True)):
        if not len((_core_candidates if c else _candidates)(fab, a, b)):
            raise _no_path(s, a, b)
    sizes = s.op_bytes()[crossing]
    steps = s.ops.step[crossing]
    choice_of_op = np.full(len(s.ops), -1, dtype=np.int64)
    memo: dict[bytes, np.ndarray] = {}
    paths: dict[tuple[int, int, bool], tuple[np.ndarray, np.ndarray]] = {}
    for idx in np.split(np.arange(len(crossing)), np.flatnonzero(np.diff(steps)) + 1):
        order = np.lexsort((sizes[idx], up3[idx], lb[idx], la[idx]))
        idx = idx[order]
        key = np.stack([la[idx], lb[idx], sizes[idx], up3[idx]]).tobytes()
        choice = memo.get(key)
        if choice is None:
            choice = memo[key] = _assign_step_tiers(s.topology.link_bandwidth, fab, paths,
                                                    sizes[idx], la[idx], lb[idx], up3[idx])
        choice_of_op[crossing[idx]] = choice
    core_op = np.zeros(len(s.ops), dtype=bool)
    core_op[crossing] = up3
    return _rewrite(s, fab, np.where(core_op, -1, choice_of_op), pos,
                    np.where(core_op, choice_of_op, -1), used_only=True)


def _assign_step_tiers(bandwidth: np.ndarray, fab: dict, paths: dict, sizes: np.ndarray,
                       la: np.ndarray, lb: np.ndarray, up3: np.ndarray) -> np.ndarray:
    """Spine (in a pod) or core (between pods) per flow of one step: least busiest link in
    seconds, then least total, largest flows first (LPT)."""
    load = np.zeros(len(bandwidth))
    choice = np.empty(len(sizes), dtype=np.int64)
    for f in np.argsort(-sizes, kind="stable").tolist():
        key = (int(la[f]), int(lb[f]), bool(up3[f]))
        got = paths.get(key)
        if got is None:
            a, b, c = key
            if c:
                cand = _core_candidates(fab, a, b)
                links = np.array([_core_path(fab, a, b, x) for x in cand.tolist()])
            else:
                cand = _candidates(fab, a, b)
                links = np.stack([fab["up"][a, cand], fab["down"][cand, b]], axis=1)
            got = paths[key] = (cand, links)
        cand, links = got
        busy = (load[links] + sizes[f]) / bandwidth[links]
        pick = int(np.lexsort((busy.sum(axis=1), busy.max(axis=1)))[0])
        choice[f] = cand[pick]
        load[links[pick]] += sizes[f]
    return choice
