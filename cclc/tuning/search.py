"""Searching the space: AutoCCL's subspace-then-coordinate-descent, exhaustive and random.

Every search runs through an :class:`Evaluator`, which remembers what it measured (and,
with a :class:`MeasurementCache`, what earlier runs measured), counts evaluations, and stops
the search when the step budget is spent. The best configuration found so far is always the
answer, so a budget cut short still returns something usable.

Coordinate descent (AutoCCL, jobs/coordinate_descent_job.h): inside one implementation
subspace the resource parameters have a unimodal effect, so the search walks one axis at a
time from NCCL's own point: it keeps stepping while the neighbour is better (doubling the
step after each success, the role of AutoCCL's gain-scaled "lr"), flips direction on a
failure, moves to the next axis after both directions failed, and has converged after
2 × #axes failures in a row; then it restarts from a random unvisited point (``retries``).
Two additions keep it honest on NCCL's real surfaces: on a plateau (equal values, e.g. every
chunk above a channel's share of the buffer) it looks along the plateau at doubling
distances instead of stopping, and each subspace is also descended from the few-channels end
of the channel axis, because NCCL adapts its chunk to the channel count and so puts small saw
teeth on that axis. Subspaces are visited best-first by the value of their starting point, so
a tight budget is spent where it pays.
"""

from __future__ import annotations

import json
import math
import os
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from cclc.errors import SemanticError
from cclc.tuning.baseline import default_point, nccl_default
from cclc.tuning.profilers import Case, Profiler
from cclc.tuning.space import Config, Space, Subspace

__all__ = [
    "METHODS",
    "Evaluator",
    "MeasurementCache",
    "SearchResult",
    "coordinate_descent",
    "exhaustive",
    "random_search",
    "search",
]

METHODS = ("cd", "exhaustive", "random")


class _BudgetSpent(Exception):
    """Raised inside a search when the evaluator's budget is used up."""


class MeasurementCache:
    """Measured busbw by (profiler identity, case, config), read from the JSON a previous run
    wrote (:meth:`dumps`), when ``path`` names one."""

    FORMAT = "cclc-tune-cache"

    def __init__(self, path: str | None = None):
        self.path = path
        self._data: dict[str, float | None] = {}
        if path and os.path.exists(path):
            try:
                with open(path, encoding="utf-8") as f:
                    doc = json.load(f)
            except (OSError, ValueError, RecursionError) as err:
                raise SemanticError(f"cannot read the tuning cache '{path}': {err}") from None
            if not isinstance(doc, dict) or doc.get("format") != self.FORMAT:
                raise SemanticError(f"'{path}' is not a cclc tuning cache")
            self._data = dict(doc.get("entries", {}))

    @staticmethod
    def key(profiler: Profiler, case: Case, config: Config) -> str:
        return (f"{profiler.identity()}|{case.key}|{int(config.algo)},{int(config.proto)},"
                f"{config.transport},{config.channels},{config.threads},{config.chunk}")

    def get(self, key: str) -> tuple[bool, float | None]:
        if key in self._data:
            return True, self._data[key]
        return False, None

    def put(self, key: str, value: float | None) -> None:
        self._data[key] = value

    def __len__(self) -> int:
        return len(self._data)

    def dumps(self) -> str:
        """The cache as JSON text: what ``cclc tune`` writes back to ``tune-cache.json``
        through its output folder (this class reads the file, never writes it)."""
        return json.dumps({"format": self.FORMAT, "version": 1, "entries": self._data})


class Evaluator:
    """Measures configs of one case through a profiler, with memo, cache and budget.

    ``evaluations`` counts distinct configs the search looked at (the figure compared
    against exhaustive search); ``measured`` counts those the profiler actually ran (the rest
    came from the cache).
    """

    def __init__(self, profiler: Profiler, case: Case, cache: MeasurementCache | None = None,
                 budget: int | None = None):
        if budget is not None and budget < 1:
            raise SemanticError(f"the step budget must be >= 1, got {budget}")
        self.profiler = profiler
        self.case = case
        self.cache = cache
        self.budget = budget
        self.memo: dict[Config, float | None] = {}
        self.measured = 0
        self.best: tuple[float, Config] | None = None

    @property
    def evaluations(self) -> int:
        return len(self.memo)

    def _remember(self, config: Config, value: float | None) -> None:
        self.memo[config] = value
        if value is not None and (self.best is None or value > self.best[0]):
            self.best = (value, config)

    def evaluate(self, configs: Sequence[Config]) -> list[float | None]:
        """busbw of each config; raises :class:`_BudgetSpent` after measuring what the budget
        still allows."""
        todo: list[Config] = []
        for c in dict.fromkeys(configs):
            if c in self.memo:
                continue
            if self.cache is not None:
                hit, value = self.cache.get(MeasurementCache.key(self.profiler, self.case, c))
                if hit:
                    if self._over_budget(1):
                        raise _BudgetSpent
                    self._remember(c, value)
                    continue
            todo.append(c)
        spent = False
        if todo and self.budget is not None:
            room = self.budget - self.evaluations
            if room < len(todo):
                todo, spent = todo[:max(room, 0)], True
        if todo:
            values = self.profiler.measure(self.case, todo)
            self.measured += len(todo)
            for c, v in zip(todo, values, strict=True):
                self._remember(c, v)
                if self.cache is not None:
                    self.cache.put(MeasurementCache.key(self.profiler, self.case, c), v)
        if spent:
            raise _BudgetSpent
        return [self.memo[c] for c in configs]

    def _over_budget(self, extra: int) -> bool:
        return self.budget is not None and self.evaluations + extra > self.budget

    def value(self, config: Config) -> float:
        """One config's busbw, ``-inf`` when unmeasurable (so it never wins)."""
        v = self.evaluate([config])[0]
        return float("-inf") if v is None else v


@dataclass(frozen=True, slots=True)
class SearchResult:
    """The best configuration a search found and what it cost."""

    method: str
    best: Config | None
    busbw: float | None
    evaluations: int
    measured: int
    exhausted_budget: bool


def _result(method: str, ev: Evaluator, spent: bool) -> SearchResult:
    if ev.best is None:
        return SearchResult(method, None, None, ev.evaluations, ev.measured, spent)
    return SearchResult(method, ev.best[1], ev.best[0], ev.evaluations, ev.measured, spent)


def _index_of(sub: Subspace, config: Config) -> list[int]:
    return [min(range(len(axis)), key=lambda i: abs(axis[i] - v))
            for axis, v in zip(sub.axes, (config.channels, config.threads, config.chunk),
                               strict=True)]


def _descend(sub: Subspace, ev: Evaluator, start: list[int]) -> None:
    """One coordinate descent from ``start``; results land in the evaluator."""
    axes = sub.axes
    dims = [d for d in range(3) if len(axes[d]) > 1]
    if not dims:
        ev.value(sub.config(start))
        return
    cur = list(start)
    f_cur = ev.value(sub.config(cur))
    fails, di, direction, step = 0, 0, +1, 1
    while fails < 2 * len(dims):
        d = dims[di]
        nxt = list(cur)
        nxt[d] += direction * step
        if 0 <= nxt[d] < len(axes[d]):
            f_nxt = ev.value(sub.config(nxt))
            if f_nxt > f_cur:
                cur, f_cur, fails = nxt, f_nxt, 0
                step *= 2                   # a success: stride further along this axis
                continue
            if f_nxt == f_cur and math.isfinite(f_cur):
                # a plateau (e.g. every chunk above the per-channel share performs alike):
                # strict descent would stop on it, so look along it at doubling distances
                found = _across_plateau(sub, ev, cur, f_cur, d, direction, step)
                if found is not None:
                    cur, f_cur = found
                    fails, step = 0, 1
                    continue
        if step > 1:                        # overshot: come back to unit steps first
            step = 1
            continue
        fails += 1
        if direction > 0:
            direction = -1
        else:
            direction, di = +1, (di + 1) % len(dims)


def _across_plateau(sub: Subspace, ev: Evaluator, cur: list[int], f_cur: float, d: int,
                    direction: int, step: int) -> tuple[list[int], float] | None:
    """The first point better than ``f_cur`` along axis ``d`` beyond a flat stretch, probing
    at doubling distances until the value changes; ``None`` when it only gets worse."""
    k = step
    while True:
        k *= 2
        probe = list(cur)
        probe[d] += direction * k
        if not 0 <= probe[d] < len(sub.axes[d]):
            probe[d] = 0 if direction < 0 else len(sub.axes[d]) - 1
            if probe[d] == cur[d] + direction * (k // 2):
                return None             # already looked at the end of the axis
        f_probe = ev.value(sub.config(probe))
        if f_probe > f_cur:
            return probe, f_probe
        if f_probe < f_cur or probe[d] in (0, len(sub.axes[d]) - 1):
            return None


def coordinate_descent(space: Space, ev: Evaluator, retries: int = 1, seed: int = 0,
                       starts: Sequence[Config] = ()) -> SearchResult:
    """AutoCCL's search: per subspace, coordinate descent from NCCL's own point (and from
    any ``starts`` in that subspace), then ``retries`` random restarts."""
    rng = random.Random(seed)
    nbytes = ev.case.nbytes
    try:
        # rank the subspaces by their starting point: a budget goes to the promising ones
        points = [default_point(space, sub, nbytes) for sub in space.subspaces]
        values = ev.evaluate(points)
        order = sorted(range(len(points)), key=lambda i: -(values[i] or float("-inf")))
        for i in order:
            sub = space.subspaces[i]
            # NCCL's point, the caller's starts, and the few-channels end of the channel axis:
            # NCCL adapts its chunk to the channel count, which puts small saw teeth on that
            # axis that a descent from NCCL's (high) count alone can stall on
            low = replace(points[i], channels=sub.channels[min(1, len(sub.channels) - 1)])
            begin = ([points[i]] + [c for c in starts if c.subspace == points[i].subspace]
                     + [low])
            for c in begin:
                _descend(sub, ev, _index_of(sub, c))
            for _ in range(retries):
                if sub.size <= ev.evaluations:
                    break
                idx = _random_unvisited(sub, ev, rng)
                if idx is None:
                    break
                _descend(sub, ev, idx)
    except _BudgetSpent:
        return _result("cd", ev, True)
    return _result("cd", ev, False)


def _random_unvisited(sub: Subspace, ev: Evaluator, rng: random.Random) -> list[int] | None:
    for _ in range(64):
        idx = [rng.randrange(len(axis)) for axis in sub.axes]
        if sub.config(idx) not in ev.memo:
            return idx
    return None


def exhaustive(space: Space, ev: Evaluator) -> SearchResult:
    """Every configuration of every subspace (one profiler batch per subspace)."""
    try:
        for sub in space.subspaces:
            ev.evaluate(list(sub.configs()))
    except _BudgetSpent:
        return _result("exhaustive", ev, True)
    return _result("exhaustive", ev, False)


def random_search(space: Space, ev: Evaluator, samples: int, seed: int = 0) -> SearchResult:
    """``samples`` configurations drawn uniformly without replacement from the whole space."""
    rng = random.Random(seed)
    sizes = [s.size for s in space.subspaces]
    total = sum(sizes)
    picks = rng.sample(range(total), min(samples, total))
    configs = []
    for p in picks:
        for sub, size in zip(space.subspaces, sizes, strict=True):
            if p < size:
                c, rest = divmod(p, len(sub.threads) * len(sub.chunks))
                t, k = divmod(rest, len(sub.chunks))
                configs.append(sub.config((c, t, k)))
                break
            p -= size
    try:
        ev.evaluate(configs)
    except _BudgetSpent:
        return _result("random", ev, True)
    return _result("random", ev, False)


def search(space: Space, case: Case, profiler: Profiler, method: str = "cd",
           budget: int | None = None, cache: MeasurementCache | None = None, seed: int = 0,
           retries: int = 1, samples: int | None = None) -> SearchResult:
    """Tune ``case`` over ``space`` with ``method`` (cd | exhaustive | random).

    NCCL's default configuration is always among the evaluated points (cd starts there), so
    a cd result is never below what stock NCCL does under the same profiler.
    """
    ev = Evaluator(profiler, case, cache, budget)
    if method == "cd":
        return coordinate_descent(space, ev, retries=retries, seed=seed,
                                  starts=[nccl_default(space, case.nbytes)])
    if method == "exhaustive":
        return exhaustive(space, ev)
    if method == "random":
        n = samples if samples is not None else (budget if budget is not None
                                                 else max(1, space.size // 20))
        return random_search(space, ev, n, seed=seed)
    raise SemanticError(f"unknown search method '{method}' (use {', '.join(METHODS)})")


def with_threads(config: Config, threads: int, sub: Subspace) -> Config:
    """``config`` with its threads moved to the subspace's value nearest ``threads``."""
    return replace(config, threads=min(sub.threads, key=lambda v: abs(v - threads)))


def evaluate_all(profiler: Profiler, case: Case, configs: Iterable[Config],
                 cache: MeasurementCache | None = None) -> list[float | None]:
    """Measure ``configs`` of ``case`` without a budget (used for re-fitting)."""
    return Evaluator(profiler, case, cache).evaluate(list(configs))
