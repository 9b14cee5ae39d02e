"""A lower bound that counts what each member sends and receives over the routes the routing
carries between members: the ``routes`` bound of a group smaller than the machine.

Why another bound: the others count links (:mod:`cclc.group_links` keeps those some schedule
of the group can use) and let any flow cross any of them, as if every switch and every GPU
outside the group forwarded anything anywhere. A GPU outside the group forwards nothing (the
relay lowering refuses it), so a link that only one pair's routes reach carries only that
pair's bytes. The case that shows it: the AllGather of one rail of a rail-optimized fabric
whose GPU ``g`` has lost its NIC. ``g``'s fewest-hop routes to the others leave through the
other NICs of its server and enter theirs through the same rails, so every NIC of every member's
server is a usable link, and the max-flow bound lets every member receive over eight NICs at
once; but the routes through the other rails all start or end at ``g``, so all that those rails
bring in is what ``g`` sends, over its server's seven NICs.

The bound is the least ``T`` of a linear program over one flow per ordered pair of members
``(a, b)``: its bytes ``f_ab``, carried from ``a`` to ``b`` along the links the routing's routes
from ``a`` to ``b`` use (the links of the fewest-hop paths over live links under ``ecmp``,
``adaptive``, ``shortest`` and ``dimension_order``, whose path is one of them where it is
healthy; the direct links under ``none``; any path under ``source``), every link carrying at
most its capacity times ``T`` of all pairs' bytes, with

* every member receiving at least the bytes it must receive and sending at least the bytes it
  must send (below), and all pairs together carrying at least the collective's total.

Every schedule is a solution: its ops run between members (a route the routing does not carry
is cut into carried pieces at members), so the bytes of its ops from ``a`` to ``b`` are such a
flow, and it must move at least (``S`` the collective's size, ``n`` its members, elements
counted in bytes):

* AllGather: each member receives the ``(n-1)/n S`` of the others' blocks and sends its own
  ``S/n`` at least once; each block reaches ``n - 1`` members in messages of its own, ``(n-1) S``
  in all;
* ReduceScatter: the reverse (each member's contributions to the others' blocks leave it,
  ``(n-1)/n S``; its own block's partial sums reach it, ``S/n``; ``(n-1) S`` in all);
* AllReduce: every member sends and receives ``S``. An element is complete first at some member,
  its owner; every other member's contribution leaves it before that, and the owner sends the
  complete element after; every other member receives the complete element, and the owner at
  least one partial sum. The ``n - 1`` messages before (distinct senders) and the ``n - 1``
  after (distinct receivers) are ``2 (n-1) S`` in all;
* Broadcast / Reduce: the root sends (receives) ``S``, every other member receives (sends)
  ``S``, ``(n-1) S`` in all; AllToAll: each member's row and column of the size matrix.

It is computed only for a group smaller than the machine's live ranks (in a group of every
rank every GPU may relay, which is what the link-counting bounds assume, and its pairs are
many) and only while the pairs' route links stay under :data:`ROUTES_MAX_VARIABLES`; the report
says when it was skipped.
The optimum over ``S`` does not depend on ``S`` (the demands are proportional to it), so it is
kept on the topology for the next size or candidate.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import scipy.sparse as sp
from scipy.optimize import linprog
from scipy.sparse.csgraph import dijkstra

from cclc.bounds_closed_form import Bound, Facts
from cclc.collective import Collective, CollectiveKind

__all__ = ["ROUTES_MAX_VARIABLES", "routes_bound"]

K = CollectiveKind

#: the most flow variables (a pair and a link of its routes) the LP takes (HiGHS solves the
#: 16-member rail AllGather of the 128-GPU fabric, 1,900 of them, in milliseconds)
ROUTES_MAX_VARIABLES = 300_000
#: the most (pair, usable link) tests spent finding the pairs' route links before counting them
_MAX_TESTS = 200_000_000
#: the LP's optimum is HiGHS's to its feasibility tolerance (1e-7): the bound is taken that
#: much lower, so that it stays a bound and equals the closed forms where they are tight
_SOLVER_SLACK = 1e-6


def routes_bound(coll: Collective, on_stage: Callable[[str], None] | None = None
                 ) -> tuple[Bound | None, str | None]:
    """The ``routes`` bound of ``coll`` (module docstring) and a note: ``(bound, None)``,
    ``(None, why it was skipped)``, or ``(None, None)`` where it does not apply (a group of
    every live rank, a single member, a group that is not connected: the other bounds say
    so). ``on_stage(what)`` is told what the LP waits for, before it starts."""
    topo = coll.topology
    live_ranks = topo.n_ranks - len(topo.failed_ranks)
    if coll.n < 2 or coll.n >= live_ranks:
        return None, None
    f = Facts(coll, on_stage)
    # every live link, not only those the other bounds keep: the routes are the routing's
    # over the live links, found here on their own
    live = np.flatnonzero(topo.live_links())
    tests = coll.n * (coll.n - 1) * len(live)
    if tests > _MAX_TESTS:
        return None, (f"routes: skipped, {coll.n * (coll.n - 1)} member pairs x {len(live)} "
                      f"links are too many to search (over {_MAX_TESTS:.3g})")
    key = ("routes_bound", topo.routing, f.kind, f.group.tobytes(), f.root,
           None if coll.pair_sizes is None else (coll.pair_sizes.tobytes(), f.S))
    cache = topo._cache
    if key not in cache:
        cache[key] = _scaled(f, live)
    scaled, variables = cache[key]
    if scaled is None:
        if variables:
            return None, (f"routes: skipped, {variables} route flow variables > "
                          f"{ROUTES_MAX_VARIABLES}")
        return None, None
    return (Bound("routes", scaled * f.S, "LP: each member's bytes in and out over the routes "
                  f"between members ({variables} pair-link flows sharing each link; GPUs "
                  "outside the group forward nothing)"), None)


def _scaled(f: Facts, live: np.ndarray) -> tuple[float | None, int]:
    """The LP's optimum over ``S`` and its number of flow variables; ``(None, count)`` over the
    variable limit, ``(None, 0)`` where no flow meets the demands (members the routes and
    relays cannot join: the other bounds say so)."""
    pair_a, pair_b, var_pair, var_link = _route_links(f, live)
    if len(var_link) > ROUTES_MAX_VARIABLES:
        return None, len(var_link)
    f.say(f"solving the routes LP ({len(var_link)} pair-link flow variables, HiGHS)")
    send, recv, total = _demands(f)
    topo = f.topo
    src, dst = topo.link_src.astype(np.int64), topo.link_dst.astype(np.int64)
    cap = topo.link_bandwidth.astype(np.float64)
    top = float(cap[live].max())
    nv, npairs = len(var_link), len(pair_a)
    a_of, b_of = f.group[pair_a], f.group[pair_b]
    # conservation at every vertex but the pair's ends: into it minus out of it, zero
    tail, head = src[var_link], dst[var_link]
    p = var_pair
    into = head != b_of[p]
    out_of = tail != a_of[p]
    rows_key = np.concatenate([p[into] * topo.n_vertices + head[into],
                               p[out_of] * topo.n_vertices + tail[out_of]])
    cols = np.concatenate([np.flatnonzero(into), np.flatnonzero(out_of)])
    vals = np.concatenate([np.ones(int(into.sum())), -np.ones(int(out_of.sum()))])
    _, rows = np.unique(rows_key, return_inverse=True)
    n_cons = int(rows.max(initial=-1)) + 1
    # the variables: the pair-link flows, then T (in units of S over the largest capacity)
    a_eq = sp.csr_matrix((vals, (rows, cols)), shape=(n_cons, nv + 1))
    # a pair's bytes: what enters b less what leaves it (a route under `source` may pass b)
    delivered = sp.csr_matrix(
        (np.where(head == b_of[p], 1.0, 0.0) - np.where(tail == b_of[p], 1.0, 0.0),
         (p, np.arange(nv))), shape=(npairs, nv))
    n = f.n
    by_receiver = sp.csr_matrix((np.ones(npairs), (pair_b, np.arange(npairs))), shape=(n, npairs))
    by_sender = sp.csr_matrix((np.ones(npairs), (pair_a, np.arange(npairs))), shape=(n, npairs))
    links, link_row = np.unique(var_link, return_inverse=True)
    load = sp.csr_matrix((np.ones(nv), (link_row, np.arange(nv))), shape=(len(links), nv))
    a_ub = sp.vstack([
        sp.hstack([load, sp.csr_matrix(-(cap[links] / top)[:, None])]),
        sp.hstack([-(by_receiver @ delivered), sp.csr_matrix((n, 1))]),
        sp.hstack([-(by_sender @ delivered), sp.csr_matrix((n, 1))]),
        sp.hstack([-sp.csr_matrix(delivered.sum(axis=0)), sp.csr_matrix((1, 1))]),
    ]).tocsr()
    b_ub = np.concatenate([np.zeros(len(links)), -recv, -send, [-total]])
    c = np.zeros(nv + 1)
    c[-1] = 1.0
    res = linprog(c, A_ub=a_ub, b_ub=b_ub, A_eq=a_eq, b_eq=np.zeros(n_cons),
                  bounds=(0, None), method="highs")
    if res.status != 0:
        return None, 0
    return float(res.fun) * (1 - _SOLVER_SLACK) / top, nv


def _route_links(f: Facts, live: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The ordered member pairs with a route (indices into the group: senders, receivers)
    and, per flow variable, its pair and its link: the links of ``live`` on the routes the
    routing carries from ``a`` to ``b``."""
    topo = f.topo
    g = f.group
    src = topo.link_src.astype(np.int64)[live]
    dst = topo.link_dst.astype(np.int64)[live]
    v = topo.n_vertices
    n = f.n
    # fewest hops from every member (the topology's searches, which routing shares) and to
    # every member (the same search on the reversed links)
    d_from = topo.fewest_hops(g)[0]                                 # (n, V)
    keys, _ = topo.hop_links()
    back = sp.csr_matrix((np.ones(len(keys)), (keys % v, keys // v)), shape=(v, v))
    d_to = dijkstra(back, unweighted=True, indices=g)               # (n, V): vertex -> member
    found = []
    for i in range(n):
        # (member b, link) for source member i, one source at a time ((n, links) at most)
        if topo.routing == "none":
            on = (src[None, :] == g[i]) & (dst[None, :] == g[:, None])
        elif topo.routing == "source":
            # on some walk a -> u -> v -> b
            on = np.isfinite(d_from[i, src])[None, :] & np.isfinite(d_to[:, dst])
        else:
            # on a fewest-hop path: d(a, u) + 1 + d(v, b) = d(a, b)
            on = ((d_from[i, src][None, :] + 1 + d_to[:, dst] == d_from[i, g][:, None])
                  & np.isfinite(d_from[i, src])[None, :])
        on[i] = False
        b, e = np.nonzero(on)
        found.append((np.full(len(b), i), b, e))
    a = np.concatenate([x[0] for x in found])
    b = np.concatenate([x[1] for x in found])
    e = np.concatenate([x[2] for x in found])
    # the pairs with a route (under `none` only neighbours: the others relay through members)
    pairs, var_pair = np.unique(a * n + b, return_inverse=True)
    return pairs // n, pairs % n, var_pair.ravel(), live[e]


def _demands(f: Facts) -> tuple[np.ndarray, np.ndarray, float]:
    """Per member, the bytes it must send and receive, and the bytes all must move, over ``S``
    (module docstring)."""
    n = f.n
    send, recv = np.zeros(n), np.zeros(n)
    if f.kind is K.ALLGATHER:
        send[:], recv[:], total = 1 / n, (n - 1) / n, float(n - 1)
    elif f.kind is K.REDUCESCATTER:
        send[:], recv[:], total = (n - 1) / n, 1 / n, float(n - 1)
    elif f.kind is K.ALLREDUCE:
        send[:], recv[:], total = 1.0, 1.0, 2.0 * (n - 1)
    elif f.kind is K.BROADCAST:
        recv[:], total = 1.0, float(n - 1)
        recv[f.root], send[f.root] = 0.0, 1.0
    elif f.kind is K.REDUCE:
        send[:], total = 1.0, float(n - 1)
        send[f.root], recv[f.root] = 0.0, 1.0
    else:
        m = f.pair_bytes() / f.S
        send, recv, total = m.sum(axis=1), m.sum(axis=0), float(m.sum())
    return send, recv, total
