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
   A finished pair over a part counts against it as a black hole (``-CLIP``).
4. **Explain greedily.** The best hypothesis is a candidate when its score and its pairs'
   median slowdown clear the thresholds; it is named only when it explains at least
   :data:`MIN_EVIDENCE` slow or hung pairs (else it is reported as weak evidence, with pairs
   to measure next). Its pairs are then taken as explained (z set to 0) and the search repeats
   for a second fault. Slowness counts only against a baseline of :data:`MIN_BASELINE` finished
   pairs.
5. **Confidence** is ``posterior * (1 - p)``. ``posterior`` is the winner's share among all
   distinct hypotheses under that Gaussian shift model, ``1 / sum_k exp(-(s_1^2 - s_k^2) / 2)``;
   it compares hypotheses but takes the MAD as exact, so alone it reads 1.00 on one slow pair
   among three. ``p`` is the one-sided Mann-Whitney p-value of "the suspect's pairs are no
   slower than the other finished pairs": rank-based, exact where it matters (all its ``n``
   pairs slower than the ``m`` others: ``1 / C(n + m, n)``), and large when there are few pairs.
   Fault statements are written only for suspects at :data:`PATCH_CONFIDENCE` or above.
6. **The evidence as a whole** gets statements of its own (:class:`Finding`): no pair finished
   (nothing to compare with), too few pairs for a baseline, the median pair off the model by
   :data:`MODEL_MISMATCH` or more (the whole machine or the model, not one part), and hangs
   that no named part explains.

The C4D paper's reading (hot row: sender; hot column: receiver; hot cell: link) is the special
case of rows, columns and one-hop links; the reference for the method is the C4 paper (Alibaba,
HPCA 2025) and its C4D component.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from cclc.diagnose.pair_timings import Timings, TimingsError
from cclc.diagnose.routes import pair_routes
from cclc.topology import LinkKind, Topology

__all__ = ["CLIP", "MIN_BASELINE", "MIN_EVIDENCE", "MODEL_MISMATCH", "PATCH_CONFIDENCE",
           "Diagnosis", "DiagnoseOptions", "Finding", "Suspect", "diagnose", "pairs_to_measure"]

#: largest |z| a single pair contributes (a hang counts as this)
CLIP = 10.0
#: slow or hung pairs a part must explain before it is named. One slow pair is one cell of the
#: matrix: its sender, its receiver and every link of its route explain it equally well, and
#: the merged hypothesis "any of these" is no finding; two pairs can share a part by chance.
#: Three pairs that meet in one part are the fewest that point at it.
MIN_EVIDENCE = 3
#: finished pairs the healthy baseline (median and MAD) needs. With fewer, the spread of
#: healthy pairs is unknown: of three pairs within 4% of each other one is always the
#: "slowest", and the MAD of three numbers can be as small as the noise floor.
MIN_BASELINE = 8
#: confidence a suspect needs before its ``fault`` statement is written (``--patch``,
#: ``--faults``): a wrong fault statement takes a healthy part out of every schedule
PATCH_CONFIDENCE = 0.95
#: median of measured over modelled time beyond which (either way) the pairs are off alike:
#: the machine as a whole or the model, not one part (the robust z-scores compare pairs with
#: each other and cannot see it)
MODEL_MISMATCH = 2.0
#: at most this many pairs are suggested to measure next
_MEASURE_NEXT = 6
#: what to measure next when every pair over a part was measured already
_REPEAT = "the same probe again (every pair over it was measured; repeated pairs add up)"
#: at most this many candidates with too little evidence are reported
_MAX_WEAK = 3
#: a group of pairs smaller than this borrows the global median (too few for its own)
_MIN_CLASS = 5
#: z above which a pair is called slow in the evidence
_SLOW_Z = 3.0

#: the order in which equivalent hypotheses are named: the most specific first
_KIND_ORDER = ("link", "cable", "sender", "receiver", "nic", "switch", "rank")


@dataclass(frozen=True, slots=True)
class DiagnoseOptions:
    """Thresholds: a suspect needs ``score >= min_score`` (sigmas, see the module docstring),
    a median slowdown of its pairs ``>= min_slowdown`` and :data:`MIN_EVIDENCE` slow or hung
    pairs; at most ``max_suspects``. The noise
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
    #: suspects below this confidence are reported but get no fault statement
    min_confidence: float = PATCH_CONFIDENCE


@dataclass(frozen=True, slots=True)
class Suspect:
    """One part found to explain slow pairs.

    ``kind`` is one of ``link cable sender receiver nic switch rank``; ``name`` the part in
    cclc's vertex names, ``same_pairs`` the other parts that slow exactly the same pairs.
    ``links`` are the directed link ids it stands for (empty for a sender/receiver/rank);
    ``rank`` is set for sender/receiver/rank. Evidence: ``pairs`` routed over it, ``slow``
    of them slow (z > 3), ``hung`` never finished, ``slowdown`` the median of their time over
    the baseline, ``explained`` of the ``slow_total`` slow pairs still unexplained when it was
    chosen. ``confidence`` is ``posterior * (1 - p_value)``: ``posterior`` its share among all
    hypotheses, ``p_value`` the one-sided Mann-Whitney test that its pairs are no slower than
    the other finished pairs (see the module docstring).
    """

    kind: str
    name: str
    same_pairs: tuple[str, ...]
    links: tuple[int, ...]
    rank: int | None
    score: float
    confidence: float
    posterior: float
    p_value: float
    pairs: int
    slow: int
    hung: int
    slowdown: float
    explained: int
    slow_total: int
    pair_index: np.ndarray


@dataclass(frozen=True, slots=True)
class Finding:
    """A statement about the evidence itself, apart from the suspects.

    ``kind``: ``all-hung`` (no pair finished), ``too-few-pairs`` (no baseline to compare
    with), ``slow-everywhere`` / ``fast-everywhere`` (the pairs are off the model alike),
    ``hung-pairs`` (pairs that never finished and that no named part explains),
    ``slow-pairs`` (pairs :data:`MODEL_MISMATCH` times slower than their peers that no part
    explains),
    ``weak-evidence`` (a candidate with fewer than :data:`MIN_EVIDENCE` pairs),
    ``low-confidence`` (a named suspect below the confidence for a fault statement).
    ``measure_next``: pairs (``"a -> b"``, rank ids) whose timing would settle it; ``problem``:
    the timings show something wrong (as opposed to too little to tell).
    """

    kind: str
    message: str
    measure_next: tuple[str, ...] = ()
    problem: bool = True


@dataclass(frozen=True, eq=False)
class Diagnosis:
    """Everything :func:`diagnose` found: suspects (best first), findings about the evidence,
    the slow and hung pairs, the links no measured pair crosses (where a fault would be
    invisible), and notes. ``confident`` are the suspects that reach ``min_confidence``."""

    suspects: tuple[Suspect, ...]
    findings: tuple[Finding, ...]
    min_confidence: float
    n_pairs: int
    slow_pairs: int
    hung_pairs: int
    unobserved_links: int
    best_rejected: tuple[tuple[str, tuple[str, ...]], float, float] | None
    notes: tuple[str, ...]
    z: np.ndarray
    slowdown: np.ndarray

    @property
    def confident(self) -> tuple[Suspect, ...]:
        return tuple(s for s in self.suspects if s.confidence >= self.min_confidence)

    @property
    def problem(self) -> bool:
        """Whether the timings show something wrong: a suspect, or a finding of a problem."""
        return bool(self.suspects) or any(f.problem for f in self.findings)


@dataclass(frozen=True, slots=True)
class _Hypotheses:
    kinds: tuple[str, ...]
    names: tuple[tuple[str, tuple[str, ...]], ...]   # (first "kind name", the others)
    links: tuple[tuple[int, ...], ...]
    ranks: tuple[int | None, ...]
    matrix: sp.csc_matrix          # pairs x hypotheses, 1 where the hypothesis slows the pair


def diagnose(topo: Topology, t: Timings, options: DiagnoseOptions = DiagnoseOptions()
             ) -> Diagnosis:
    """Locate the parts of ``topo`` that explain the slow pairs of ``t``, and say what the
    evidence cannot support (:class:`Finding`).

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
    bad = np.flatnonzero(~(t.seconds > 0))
    if len(bad):
        k = int(bad[0])
        raise TimingsError(f"{t.source}: pair {int(t.src[k])} -> {int(t.dst[k])} took "
                           f"{float(t.seconds[k])!r} seconds (a time must be > 0; a hang is inf)")
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
    hung = ~np.isfinite(secs)
    findings = _evidence_findings(topo, src, dst, secs, expected, options.concurrent)
    if hung.all():
        # nothing finished: no part can be told from the rest (see _evidence_findings)
        return Diagnosis(suspects=(), findings=findings,
                         min_confidence=options.min_confidence, n_pairs=len(keep),
                         slow_pairs=0, hung_pairs=int(hung.sum()),
                         unobserved_links=_unobserved(topo, routes), best_rejected=None,
                         notes=tuple(notes), z=z, slowdown=slowdown)
    slow_hyp, hang_hyp = _cached_hypotheses(topo, routes, src, dst, nbytes, options.concurrent)
    # too few finished pairs for a baseline: slowness is no evidence (only hangs are)
    baseline = int((~hung).sum()) >= MIN_BASELINE
    signals = [(slow_hyp, np.where(hung | (not baseline), 0.0, np.clip(z, -CLIP, CLIP)))]
    if hung.any():
        # a black-holing part stops every pair it carries: a pair over it that finished
        # speaks against it as strongly as a hung one for it
        signals.append((hang_hyp, np.where(hung, CLIP, -CLIP)))
    slow = (z > _SLOW_Z) & (baseline | hung)
    suspects: list[Suspect] = []
    weak: list[tuple[_Hypotheses, int, np.ndarray]] = []
    rejected = None
    open_slow = slow.copy()
    taken = np.zeros(len(keep), dtype=bool)     # pairs explained by an earlier candidate
    # weak candidates are set aside and the search goes on, so a few of them cannot hide a
    # real fault that scores below them
    for _ in range(options.max_suspects + 2 * _MAX_WEAK):
        if len(suspects) == options.max_suspects:
            break
        best = None
        for hyp, signal in signals:
            scores = _scores(hyp, signal)
            i = int(np.argmax(scores))
            if best is None or scores[i] > best[2][best[1]]:
                best = (hyp, i, scores)
        assert best is not None     # the slow signal is always there
        hyp, i, scores = best
        col = hyp.matrix[:, i]
        cols = col.indices
        strong = cols[col.data >= 0.5] if (col.data >= 0.5).any() else cols
        med = float(np.median(slowdown[strong]))
        if scores[i] < options.min_score or med < options.min_slowdown:
            rejected = (hyp.names[i], float(scores[i]), med)
            break
        if int(open_slow[cols].sum()) >= MIN_EVIDENCE:
            suspects.append(_suspect(hyp, i, scores, cols, strong, z, slowdown, open_slow,
                                     taken))
        else:
            weak.append((hyp, i, cols[open_slow[cols]]))
        signals = [(h, np.where(np.isin(np.arange(len(sig)), cols), 0.0, sig))
                   for h, sig in signals]
        open_slow[cols] = False
        taken[cols] = True
    if not baseline and not hung.any():
        rejected = None         # nothing was scored: the too-few-pairs finding says why
    findings += _search_findings(topo, t, src, dst, routes, hung, z, slowdown, baseline,
                                 suspects, weak, options.min_confidence)
    return Diagnosis(suspects=tuple(suspects), findings=findings,
                     min_confidence=options.min_confidence, n_pairs=len(keep),
                     slow_pairs=int(slow.sum()), hung_pairs=int(hung.sum()),
                     unobserved_links=_unobserved(topo, routes), best_rejected=rejected,
                     notes=tuple(notes), z=z, slowdown=slowdown)


def _cached_hypotheses(topo: Topology, routes, src, dst, nbytes, concurrent: bool
                       ) -> tuple[_Hypotheses, _Hypotheses]:
    """The hypotheses against slow pairs (what a slow part would slow, weighted) and against
    hung pairs (everything a black-holing part carries, bottleneck or not), kept on the
    topology for later diagnoses of the same pairs."""
    key = ("diagnose.hypotheses", concurrent,
           hashlib.sha1(src.tobytes() + dst.tobytes() + nbytes.tobytes()).hexdigest())
    if key not in topo._cache:
        weight = _weights(topo, routes, nbytes) if concurrent else None
        topo._cache[key] = (_hypotheses(topo, routes, src, dst, weight),
                            _hypotheses(topo, routes, src, dst, None))
    return topo._cache[key]


def _unobserved(topo: Topology, routes) -> int:
    """Healthy links that no measured pair crosses."""
    return max(topo.n_links - len(np.unique(routes.links)) - int(topo.link_failed.sum()), 0)


def _evidence_findings(topo: Topology, src, dst, secs, expected, concurrent: bool
                       ) -> tuple[Finding, ...]:
    """What the timings as a whole say before any part is compared: nothing finished, too few
    pairs for a baseline, or every pair off the model alike."""
    finite = np.isfinite(secs)
    n, done = len(secs), int(finite.sum())
    live = len(topo.live_ranks())
    probe = f"an all-pairs probe ({live * (live - 1)} pairs of the {live} live ranks)"
    if done == 0:
        return (Finding("all-hung", f"all {n} measured pairs never finished: with no pair that "
                        "finished there is nothing to tell a faulty part from (a part is found "
                        "by the pairs over it hanging while the others finish), so none is "
                        "named; the probe, the job or the whole machine did not run",
                        (f"one pair alone (e.g. {int(src[0])} -> {int(dst[0])}) to check that "
                         "the probe runs at all", probe)),)
    out = []
    if done < MIN_BASELINE:
        out.append(Finding("too-few-pairs", f"only {done} measured pairs finished: telling a "
                           "slow pair from the spread of healthy ones needs a baseline of at "
                           f"least {MIN_BASELINE}, so no part is named for being slow",
                           (probe,), problem=False))
    ratio = float(np.median(secs[finite] / expected[finite]))
    over = float((secs[finite] > MODEL_MISMATCH * expected[finite]).mean())
    how = ("its busiest link's busy time with all pairs running at once" if concurrent else
           "its bytes over its slowest link")
    if ratio > MODEL_MISMATCH:
        out.append(Finding("slow-everywhere", f"the pairs are slow alike: the median pair took "
                           f"{_times(ratio)} the time the topology's links predict ({how}), and "
                           f"{over:.0%} of them more than {MODEL_MISMATCH:g}x. That is the "
                           "machine as a whole (another job, throttled links, a slow software "
                           "path) or the model (the .ccl's link bandwidths, the bytes in the "
                           "timings" + (", pairs timed one at a time: --pairwise" if concurrent
                                       else "") + ") being off, not one part (the search for "
                           "one faulty part compares pairs with each other and cannot see it)"))
    elif ratio < 1.0 / MODEL_MISMATCH:
        out.append(Finding("fast-everywhere", f"the pairs are faster than the topology allows: "
                           f"the median pair took {_times(ratio)} the time its links predict "
                           f"({how}): the .ccl's link bandwidths or the bytes in the timings do "
                           "not describe what was measured"))
    return tuple(out)


def _times(ratio: float) -> str:
    """A ratio for people: ``1,487x``, ``31.2x``, ``0.104x``."""
    return f"{ratio:,.0f}x" if ratio >= 100 else f"{ratio:.3g}x"


def _search_findings(topo: Topology, t: Timings, src, dst, routes, hung, z, slowdown,
                     baseline: bool, suspects: list[Suspect], weak, min_confidence: float
                     ) -> tuple[Finding, ...]:
    """What the search could not settle: candidates with too few pairs, suspects below the
    confidence for a fault statement, and hung or far too slow pairs no part explains."""
    out = []
    covered = np.zeros(len(src), dtype=bool)
    for s in suspects:
        covered[s.pair_index] = True
        if s.confidence < min_confidence:
            out.append(Finding("low-confidence", f"{s.kind} {s.name} has confidence "
                               f"{s.confidence:.2f}, below the {min_confidence:g} a fault "
                               "statement needs",
                               pairs_to_measure(topo, t, s.links, s.rank) or (_REPEAT,)))
    for hyp, i, pairs in weak[:_MAX_WEAK]:
        if hung[pairs].all():
            continue        # hangs: stated below
        name = f"{hyp.kinds[i]} {hyp.names[i][0].split(' ', 1)[1]}"
        shown = ", ".join(f"{int(src[k])} -> {int(dst[k])}" for k in pairs[:4])
        out.append(Finding("weak-evidence", f"not enough evidence: {name} would explain "
                           f"{len(pairs)} slow pair{'s' if len(pairs) != 1 else ''} ({shown}), "
                           f"and naming a part needs at least {MIN_EVIDENCE}",
                           pairs_to_measure(topo, t, hyp.links[i], hyp.ranks[i])
                           or (_REPEAT,)))
    for _, _, pairs in weak:
        if not hung[pairs].all():
            covered[pairs] = True
    out += _lone_pairs(topo, t, src, dst, routes, hung & ~covered, "hung-pairs",
                       "never finished", "hangs it")
    if baseline:
        # far slower than their peers (noise does not double a time) yet no part explains them
        stray = (slowdown >= MODEL_MISMATCH) & (z > _SLOW_Z) & ~hung & ~covered
        out += _lone_pairs(topo, t, src, dst, routes, stray, "slow-pairs",
                           f"ran {MODEL_MISMATCH:g}x or more slower than the median pair",
                           "slows it")
    return tuple(out)


def _lone_pairs(topo: Topology, t: Timings, src, dst, routes, mask: np.ndarray, kind: str,
                what: str, does: str) -> tuple[Finding, ...]:
    """The statement for pairs in ``mask`` that no part explains (hung or far too slow)."""
    lone = np.flatnonzero(mask)
    if not len(lone):
        return ()
    shown = ", ".join(f"{int(src[k])} -> {int(dst[k])}" for k in lone[:4])
    more = f" and {len(lone) - 4} more" if len(lone) > 4 else ""
    k = int(lone[0])
    route = routes.links[routes.offsets[k]:routes.offsets[k + 1]]
    why = (f"one pair cannot say which part {does}: its sender, its receiver or any of the "
           f"{len(route)} links of its route" if len(lone) == 1 else
           f"no part explains {MIN_EVIDENCE} or more of them while the other pairs over it "
           "look healthy")
    again = f"{int(src[k])} -> {int(dst[k])} again, alone (a fault that stays with the pair " \
        "is in its route or its ends; one that moves is not)"
    return (Finding(kind, f"{len(lone)} pair{'s' if len(lone) > 1 else ''} {what} ({shown}"
                    f"{more}): {why}",
                    pairs_to_measure(topo, t, tuple(route.tolist()), None) or (again,)),)


def pairs_to_measure(topo: Topology, t: Timings, links: tuple[int, ...], rank: int | None,
                     limit: int = _MEASURE_NEXT) -> tuple[str, ...]:
    """Pairs of live ranks (``"a -> b"``) not in ``t`` whose traffic crosses ``links`` or
    starts or ends at ``rank``: what to time next to confirm or clear that part. Empty when
    every such pair was measured (then more samples of them help: repeated pairs add up)."""
    live = np.asarray(topo.live_ranks(), dtype=np.int64)
    s, d = np.repeat(live, len(live)), np.tile(live, len(live))
    keep = s != d
    s, d = s[keep], d[keep]
    measured = set(zip(t.src.tolist(), t.dst.tolist(), strict=True))
    new = np.array([(a, b) not in measured for a, b in zip(s.tolist(), d.tolist(),
                                                            strict=True)], dtype=bool)
    s, d = s[new], d[new]
    if not len(s):
        return ()
    hit = np.zeros(len(s), dtype=bool)
    if rank is not None:
        hit |= (s == rank) | (d == rank)
    if links:
        r = pair_routes(topo, s, d)
        on = np.isin(r.links, list(links))
        hit |= np.bincount(r.pair_of_entry(), weights=on, minlength=len(s)) > 0
    return tuple(f"{int(a)} -> {int(b)}" for a, b in zip(s[hit][:limit], d[hit][:limit],
                                                          strict=True))


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
             strong: np.ndarray, z, slowdown, open_slow, taken) -> Suspect:
    s1 = float(scores[best])
    finite = scores[np.isfinite(scores)]
    expo = np.clip(-(s1 ** 2 - np.maximum(finite, 0.0) ** 2) / 2.0, -700.0, 0.0)
    posterior = float(1.0 / np.exp(expo).sum())
    rest = np.ones(len(z), dtype=bool)
    rest[cols] = False
    rest &= ~taken & np.isfinite(slowdown)
    p_value = _mann_whitney_greater(slowdown[strong], slowdown[rest])
    name, same = hyp.names[best]
    return Suspect(kind=hyp.kinds[best], name=name.split(" ", 1)[1],
                   same_pairs=same, links=hyp.links[best], rank=hyp.ranks[best],
                   score=s1, confidence=posterior * (1.0 - p_value), posterior=posterior,
                   p_value=p_value, pairs=len(cols),
                   slow=int((z[cols] > _SLOW_Z).sum()),
                   hung=int((~np.isfinite(slowdown[cols])).sum()),
                   slowdown=float(np.median(slowdown[strong])),
                   explained=int(open_slow[cols].sum()), slow_total=int(open_slow.sum()),
                   pair_index=cols)


def _mann_whitney_greater(mine: np.ndarray, others: np.ndarray) -> float:
    """One-sided p-value that ``mine`` is no slower than ``others`` (Mann-Whitney U).

    Rank-based, so it assumes nothing about the spread of healthy pairs and is exact where it
    matters: when every pair of the suspect is slower than every other pair, the chance of
    that under no fault is ``1 / C(n + m, n)``: 1/3 for one slow pair among three, 1/56 for
    three among eight, ~1e-7 for three among 200. No pair to compare with: 1.
    """
    n, m = len(mine), len(others)
    if n == 0 or m == 0:
        return 1.0
    if float(np.min(mine)) > float(np.max(others)):
        log_p = math.lgamma(n + 1) + math.lgamma(m + 1) - math.lgamma(n + m + 1)
        return math.exp(log_p)
    # scipy.stats (~0.8 s to import) only when a diagnosis tests its evidence
    from scipy.stats import mannwhitneyu

    return float(mannwhitneyu(mine, others, alternative="greater").pvalue)
