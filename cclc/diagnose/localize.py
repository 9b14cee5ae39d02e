"""Find what makes the slow pairs slow: robust outliers, then the part that explains them.

1. **Normalise.** Each pair's cost is ``y = log(seconds / expected)``, ``expected`` its time
   on the healthy machine under cclc's alpha-beta model (so pairs that share a busy link are
   not mistaken for slow ones). Pairs are grouped by the
   kinds of links along their route (NVLink-only pairs are not compared with pairs that cross
   InfiniBand); within a group the median and the MAD (x 1.4826) give a robust z-score
   ``z = (y - median) / sigma``, so a few slow pairs cannot hide themselves by moving the
   baseline. A pair that never finished gets the largest z.
2. **Candidates.** Every part that pairs share is a hypothesis with the set of pairs it would
   slow down: each directed link, each cable (both directions), each NIC or switch (all its
   links), each rank as a sender (its row of the matrix), as a receiver (its column) and as a
   whole (all its links). Hypotheses that slow exactly the same pairs cannot
   be told apart by timings and are reported together.
3. **Score.** A hypothesis weighs each pair ``p`` by ``w_p`` in [0, 1], how much of its
   slowdown would show in ``p`` (:func:`_weights`: with all pairs running at once a slow link
   only shows where it becomes the bottleneck) and scores ``sum_p w_p zc_p / sqrt(sum_p
   w_p^2)`` with ``zc`` the z-score clipped to ``[-CLIP, CLIP]`` (the matched filter of a
   shift shaped like ``w``): adding healthy pairs or leaving slow pairs out lowers the score,
   so the part whose pairs match the slow pairs wins. Clipping keeps one hung pair from
   outvoting many slow ones. Pairs that never finished are scored separately against what
   each part *carries* (a black-holing link stops every pair over it, bottleneck or not).
4. **Explain greedily.** The best hypothesis is reported when its score and its pairs' median
   slowdown clear the thresholds; its pairs are then taken as explained (z set to 0) and the
   search repeats for a second fault. Confidence is the posterior of the winner among all
   distinct hypotheses under that Gaussian shift model, ``1 / sum_k exp(-(s_1^2 - s_k^2) / 2)``.

The C4D paper's reading (hot row: sender; hot column: receiver; hot cell: link) is the special
case of rows, columns and one-hop links; the reference for the method is the C4 paper (Alibaba,
HPCA 2025) and its C4D component.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from cclc.diagnose.routes import pair_routes
from cclc.diagnose.timings import Timings, TimingsError
from cclc.topology import LinkKind, Topology

__all__ = ["CLIP", "Diagnosis", "DiagnoseOptions", "Suspect", "diagnose"]

#: largest |z| a single pair contributes (a hang counts as this)
CLIP = 10.0
#: a group of pairs smaller than this borrows the global median (too few for its own)
_MIN_CLASS = 5
#: z above which a pair is called slow in the evidence
_SLOW_Z = 3.0

#: the order in which equivalent hypotheses are named: the most specific first
_KIND_ORDER = ("link", "cable", "sender", "receiver", "nic", "switch", "rank")


@dataclass(frozen=True, slots=True)
class DiagnoseOptions:
    """Thresholds: a suspect needs ``score >= min_score`` (sigmas, see the module docstring)
    and a median slowdown of its pairs ``>= min_slowdown``; at most ``max_suspects``. The noise
    floor ``min_sigma`` stops a perfectly quiet measurement from making tiny differences
    significant. ``concurrent``: the pairs were timed while all of them ran at once (one
    alltoall), so a slow link can only slow the pairs for which it becomes the bottleneck
    (see :func:`_sensitive`); ``False``: pairs were timed one at a time, and a slow link slows
    every pair routed over it."""

    min_score: float = 8.0
    min_slowdown: float = 1.1
    max_suspects: int = 5
    min_sigma: float = 0.01
    concurrent: bool = True


@dataclass(frozen=True, slots=True)
class Suspect:
    """One part found to explain slow pairs.

    ``kind`` is one of ``link cable sender receiver nic switch rank``; ``name`` the part in
    cclc's vertex names, ``same_pairs`` the other parts that slow exactly the same pairs.
    ``links`` are the directed link ids it stands for (empty for a sender/receiver/rank);
    ``rank`` is set for sender/receiver/rank. Evidence: ``pairs`` routed over it, ``slow``
    of them slow (z > 3), ``hung`` never finished, ``slowdown`` the median of their time over
    the baseline, ``explained`` of the ``slow_total`` slow pairs still unexplained when it was
    chosen.
    """

    kind: str
    name: str
    same_pairs: tuple[str, ...]
    links: tuple[int, ...]
    rank: int | None
    score: float
    confidence: float
    pairs: int
    slow: int
    hung: int
    slowdown: float
    explained: int
    slow_total: int
    pair_index: np.ndarray


@dataclass(frozen=True, eq=False)
class Diagnosis:
    """Everything :func:`diagnose` found: suspects (best first), the slow and hung pairs, the
    links no measured pair crosses (where a fault would be invisible), and notes."""

    suspects: tuple[Suspect, ...]
    n_pairs: int
    slow_pairs: int
    hung_pairs: int
    unobserved_links: int
    best_rejected: tuple[str, float, float] | None
    notes: tuple[str, ...]
    z: np.ndarray
    slowdown: np.ndarray


@dataclass(frozen=True, slots=True)
class _Hypotheses:
    kinds: tuple[str, ...]
    names: tuple[str, ...]
    links: tuple[tuple[int, ...], ...]
    ranks: tuple[int | None, ...]
    matrix: sp.csc_matrix          # pairs x hypotheses, 1 where the hypothesis slows the pair


def diagnose(topo: Topology, t: Timings, options: DiagnoseOptions = DiagnoseOptions()
             ) -> Diagnosis:
    """Locate the parts of ``topo`` that explain the slow pairs of ``t``.

    >>> d = diagnose(topo, read_timings("probe.csv"))          # doctest: +SKIP
    >>> d.suspects[0].name, d.suspects[0].confidence            # doctest: +SKIP
    ('(2,2)->(3,2)', 1.0)
    """
    notes = []
    bad = np.flatnonzero((t.src >= topo.n_ranks) | (t.dst >= topo.n_ranks))
    if len(bad):
        k = int(bad[0])
        raise TimingsError(f"{t.source}: pair {int(t.src[k])} -> {int(t.dst[k])} names a rank "
                           f"that '{topo.name}' does not have (ranks 0..{topo.n_ranks - 1})")
    dead = np.isin(t.src, list(topo.failed_ranks)) | np.isin(t.dst, list(topo.failed_ranks))
    if dead.any():
        notes.append(f"{int(dead.sum())} pairs with a rank the topology declares failed were "
                     "left out")
    keep = np.flatnonzero(~dead)
    src, dst = t.src[keep], t.dst[keep]
    secs, nbytes = t.seconds[keep], t.nbytes[keep]
    if len(keep) == 0:
        raise TimingsError(f"{t.source}: no measured pair between live ranks")
    routes = pair_routes(topo, src, dst)
    expected = _expected(topo, routes, nbytes, options.concurrent)
    z, slowdown = _zscores(topo, routes, secs, expected, options.min_sigma)
    key = ("diagnose.hypotheses", options.concurrent,
           hashlib.sha1(src.tobytes() + dst.tobytes() + nbytes.tobytes()).hexdigest())
    if key not in topo._cache:
        weight = _weights(topo, routes, nbytes) if options.concurrent else None
        # slow pairs: what a slow part would slow (weighted); hung pairs: everything a
        # black-holing part carries, bottleneck or not
        topo._cache[key] = (_hypotheses(topo, routes, src, dst, weight),
                            _hypotheses(topo, routes, src, dst, None))
    slow_hyp, hang_hyp = topo._cache[key]
    hung = ~np.isfinite(secs)
    signals = [(slow_hyp, np.where(hung, 0.0, np.clip(z, -CLIP, CLIP)))]
    if hung.any():
        signals.append((hang_hyp, np.where(hung, CLIP, 0.0)))
    slow = z > _SLOW_Z
    suspects: list[Suspect] = []
    rejected = None
    open_slow = slow.copy()
    for _ in range(options.max_suspects):
        best = None
        for hyp, signal in signals:
            scores = _scores(hyp, signal)
            i = int(np.argmax(scores))
            if best is None or scores[i] > best[2][best[1]]:
                best = (hyp, i, scores)
        hyp, i, scores = best
        col = hyp.matrix[:, i]
        cols = col.indices
        strong = cols[col.data >= 0.5] if (col.data >= 0.5).any() else cols
        med = float(np.median(slowdown[strong]))
        if scores[i] < options.min_score or med < options.min_slowdown:
            rejected = (hyp.names[i], float(scores[i]), med)
            break
        suspects.append(_suspect(hyp, i, scores, cols, strong, z, slowdown, open_slow))
        signals = [(h, np.where(np.isin(np.arange(len(sig)), cols), 0.0, sig))
                   for h, sig in signals]
        open_slow[cols] = False
    unobserved = topo.n_links - len(np.unique(routes.links)) - int(topo.link_failed.sum())
    return Diagnosis(suspects=tuple(suspects), n_pairs=len(keep), slow_pairs=int(slow.sum()),
                     hung_pairs=int((~np.isfinite(secs)).sum()),
                     unobserved_links=max(unobserved, 0), best_rejected=rejected,
                     notes=tuple(notes), z=z, slowdown=slowdown)


def _expected(topo: Topology, routes, nbytes: np.ndarray, concurrent: bool) -> np.ndarray:
    """Each pair's time on the healthy machine under cclc's alpha-beta model: its route's
    latency plus, all pairs at once, the busy time of its busiest link (lockstep simulation of
    one step), or alone, its bytes over its slowest link."""
    pair_of = routes.pair_of_entry()
    starts = routes.offsets[:-1]
    if not len(routes.links):
        return np.ones(len(nbytes))
    latency = np.add.reduceat(topo.link_latency[routes.links], starts)
    if concurrent:
        load = np.bincount(routes.links, weights=nbytes[pair_of], minlength=topo.n_links)
        per_entry = (load / topo.link_bandwidth)[routes.links]
        return latency + np.maximum.reduceat(per_entry, starts)
    slowest = np.minimum.reduceat(topo.link_bandwidth[routes.links], starts)
    return latency + nbytes / slowest


def _zscores(topo: Topology, routes, secs: np.ndarray, expected: np.ndarray, min_sigma: float
             ) -> tuple[np.ndarray, np.ndarray]:
    """Robust z-score and slowdown (time over its group's median) of every pair."""
    finite = np.isfinite(secs)
    y = np.full(len(secs), np.inf)
    y[finite] = np.log(np.maximum(secs[finite], 1e-300) / expected[finite])
    # the group of a pair: the sequence of link kinds along its route
    kinds = topo.link_kind.astype(np.int64)[routes.links] + 1
    code = np.zeros(len(secs), dtype=np.int64)
    # fold the kind sequence into one integer per pair (routes are short)
    for k in range(int(np.diff(routes.offsets).max(initial=0))):
        at = routes.offsets[:-1] + k
        has = at < routes.offsets[1:]
        code[has] = code[has] * (len(LinkKind) + 1) + kinds[at[has]]
    groups, inv = np.unique(code, return_inverse=True)
    inv = inv.reshape(-1)
    base = np.zeros(len(secs))
    sigma = np.zeros(len(secs))
    ok_all = y[finite]
    g_med = float(np.median(ok_all)) if len(ok_all) else 0.0
    g_sig = max(1.4826 * float(np.median(np.abs(ok_all - g_med))), min_sigma) \
        if len(ok_all) else min_sigma
    for g in range(len(groups)):
        members = inv == g
        vals = y[members & finite]
        if len(vals) >= _MIN_CLASS:
            med = float(np.median(vals))
            sig = max(1.4826 * float(np.median(np.abs(vals - med))), min_sigma)
        else:
            med, sig = g_med, g_sig
        base[members] = med
        sigma[members] = sig
    z = np.full(len(secs), CLIP)
    z[finite] = (y[finite] - base[finite]) / sigma[finite]
    slowdown = np.full(len(secs), np.inf)
    slowdown[finite] = np.exp(y[finite] - base[finite])
    return z, slowdown


def _hypotheses(topo: Topology, routes, src: np.ndarray, dst: np.ndarray,
                weight: np.ndarray | None) -> _Hypotheses:
    """Every hypothesis as a weighted column over the pairs (identical columns merged).
    ``weight`` (per route entry, see :func:`_weights`) is how much a slow link would show in
    a pair; ``None``: fully in every pair it carries."""
    n_pairs = len(src)
    pair_of = routes.pair_of_entry()
    w = np.ones(len(routes.links)) if weight is None else weight
    entry = w > 0
    # a pair crosses a link at most once on a shortest path: no duplicates to add up
    link_pairs = sp.csc_matrix((w[entry], (pair_of[entry], routes.links[entry])),
                               shape=(n_pairs, topo.n_links))
    used = np.flatnonzero(np.asarray(link_pairs.sum(axis=0)).ravel() > 0)
    ip, ix, dv = link_pairs.indptr, link_pairs.indices, link_pairs.data
    kinds: list[str] = []
    names: list[str] = []
    links: list[tuple[int, ...]] = []
    ranks: list[int | None] = []
    col_rows: list[np.ndarray] = []
    col_vals: list[np.ndarray] = []

    def add(kind: str, name: str, ls: tuple[int, ...], rank: int | None, rows, vals) -> None:
        kinds.append(kind)
        names.append(name)
        links.append(ls)
        ranks.append(rank)
        col_rows.append(rows)
        col_vals.append(vals)

    def over(ls) -> tuple[np.ndarray, np.ndarray]:
        """The pairs of links ``ls``, each by its most visible link (largest weight)."""
        rows = np.concatenate([ix[ip[li]:ip[li + 1]] for li in ls])
        vals = np.concatenate([dv[ip[li]:ip[li + 1]] for li in ls])
        if len(ls) > 1 and len(rows):
            order = np.lexsort((-vals, rows))
            rows, vals = rows[order], vals[order]
            first = np.concatenate([[True], rows[1:] != rows[:-1]])
            rows, vals = rows[first], vals[first]
        return rows, vals

    vn = topo.vertex_names
    lsrc, ldst = topo.link_src, topo.link_dst
    for li in used.tolist():
        add("link", f"{vn[lsrc[li]]}->{vn[ldst[li]]}", (li,), None, *over([li]))
    used_set = set(used.tolist())
    for li in used.tolist():
        back = topo.link_id(int(ldst[li]), int(lsrc[li]))
        if back is not None and back in used_set and li < back:
            add("cable", f"{vn[lsrc[li]]}--{vn[ldst[li]]}", (li, back), None, *over([li, back]))
    # vertices: a non-rank vertex (NIC, switch) slows every pair through any of its links
    incident: dict[int, list[int]] = {}
    for li in used.tolist():
        incident.setdefault(int(lsrc[li]), []).append(li)
        incident.setdefault(int(ldst[li]), []).append(li)
    for v in sorted(incident):
        if v >= topo.n_ranks:
            kind = "nic" if ".nic" in vn[v] else "switch"
            add(kind, vn[v], _all_links(topo, v), None, *over(sorted(set(incident[v]))))
    by_src = np.argsort(src, kind="stable")
    by_dst = np.argsort(dst, kind="stable")
    for r in sorted(set(src.tolist()) | set(dst.tolist())):
        lo, hi = np.searchsorted(src[by_src], [r, r + 1])
        add("sender", vn[r], (), r, np.sort(by_src[lo:hi]), np.ones(hi - lo))
        lo, hi = np.searchsorted(dst[by_dst], [r, r + 1])
        add("receiver", vn[r], (), r, np.sort(by_dst[lo:hi]), np.ones(hi - lo))
        if r in incident:
            # a slow GPU: every link of it, as for a NIC (the rows and columns above are the
            # sender and receiver sides alone)
            add("rank", vn[r], (), r, *over(sorted(set(incident[r]))))
    cols = np.repeat(np.arange(len(col_rows)), [len(x) for x in col_rows])
    m = sp.csc_matrix((np.concatenate(col_vals), (np.concatenate(col_rows), cols)),
                      shape=(n_pairs, len(col_rows)))
    m.eliminate_zeros()
    return _merge_identical(kinds, names, links, ranks, m)


def _weights(topo: Topology, routes, nbytes: np.ndarray) -> np.ndarray:
    """Per route entry: how much of a halving of link ``l`` pair ``p`` would show, 0 ... 1.

    With every pair running at once, pair ``p`` takes about its route's latency plus
    ``b_p = max over l in route(p) of busy_l`` (the simulator's lockstep model, with
    ``busy_l`` the bytes crossing ``l`` over its bandwidth). Halving ``l`` makes that
    ``max(b_p, 2 busy_l)``; the weight is the log of that ratio over ``log 2``: 1 when ``l``
    is the bottleneck, 0 when it would stay hidden (a half-speed NVLink that also carries a
    GPU's cross-rail traffic is invisible to pairs held back by their NIC).
    """
    pair_of = routes.pair_of_entry()
    load = np.bincount(routes.links, weights=nbytes[pair_of], minlength=topo.n_links)
    busy = load / topo.link_bandwidth
    entry_busy = busy[routes.links]
    starts = routes.offsets[:-1]
    bottleneck = np.maximum.reduceat(entry_busy, starts)[pair_of] if len(entry_busy) \
        else entry_busy
    ratio = np.maximum(2.0 * entry_busy, bottleneck) / np.maximum(bottleneck, 1e-300)
    w = np.log(ratio) / np.log(2.0)
    return np.where(w > 1e-6, w, 0.0)


def _all_links(topo: Topology, v: int) -> tuple[int, ...]:
    return tuple(np.flatnonzero((topo.link_src == v) | (topo.link_dst == v)).tolist())


def _merge_identical(kinds, names, links, ranks, m: sp.csc_matrix) -> _Hypotheses:
    """One column per distinct pair set; its name lists every hypothesis with that set, the
    most specific (:data:`_KIND_ORDER`) first."""
    # two random projections of the pair set; equal sets (same sorted indices) give
    # bit-identical sums, different sets collide with probability ~2^-100
    rng = np.random.default_rng(12345)
    key1 = m.T @ rng.random(m.shape[0])
    key2 = m.T @ rng.random(m.shape[0])
    sizes = np.diff(m.indptr)
    order = sorted(range(len(kinds)), key=lambda i: (_KIND_ORDER.index(kinds[i]), i))
    seen: dict[tuple, int] = {}
    groups: list[list[int]] = []
    for i in order:
        k = (int(sizes[i]), float(key1[i]), float(key2[i]))
        if k in seen:
            groups[seen[k]].append(i)
        else:
            seen[k] = len(groups)
            groups.append([i])
    heads = [g[0] for g in groups]
    merged_names = []
    for g in groups:
        first = f"{kinds[g[0]]} {names[g[0]]}"
        others = [f"{kinds[i]} {names[i]}" for i in g[1:]]
        merged_names.append((first, tuple(others)))
    return _Hypotheses(kinds=tuple(kinds[i] for i in heads),
                       names=tuple(x for x in merged_names),
                       links=tuple(links[i] for i in heads),
                       ranks=tuple(ranks[i] for i in heads),
                       matrix=m[:, heads].tocsc())


def _scores(hyp: _Hypotheses, signal: np.ndarray) -> np.ndarray:
    """Matched-filter score of every hypothesis: ``sum w_p zc_p / sqrt(sum w_p^2)``."""
    norm = np.sqrt(np.asarray(hyp.matrix.multiply(hyp.matrix).sum(axis=0)).ravel())
    scores = np.full(len(norm), -np.inf)
    ok = norm > 0
    scores[ok] = (hyp.matrix.T @ signal)[ok] / norm[ok]
    return scores


def _suspect(hyp: _Hypotheses, best: int, scores: np.ndarray, cols: np.ndarray,
             strong: np.ndarray, z, slowdown, open_slow) -> Suspect:
    s1 = float(scores[best])
    finite = scores[np.isfinite(scores)]
    expo = np.clip(-(s1 ** 2 - np.maximum(finite, 0.0) ** 2) / 2.0, -700.0, 0.0)
    confidence = float(1.0 / np.exp(expo).sum())
    name, same = hyp.names[best]
    return Suspect(kind=hyp.kinds[best], name=name.split(" ", 1)[1],
                   same_pairs=same, links=hyp.links[best], rank=hyp.ranks[best],
                   score=s1, confidence=confidence, pairs=len(cols),
                   slow=int((z[cols] > _SLOW_Z).sum()),
                   hung=int((~np.isfinite(slowdown[cols])).sum()),
                   slowdown=float(np.median(slowdown[strong])),
                   explained=int(open_slow[cols].sum()), slow_total=int(open_slow.sum()),
                   pair_index=cols)

