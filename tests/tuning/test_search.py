"""Searches on synthetic surfaces with known optima, and the cache and budget around them."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cclc.errors import SemanticError
from cclc.nccl_model import Func
from cclc.outdir import OutputDir
from cclc.tuning.profilers import Case, ModelProfiler, Profiler
from cclc.tuning.search import MeasurementCache, search
from cclc.tuning.space import NcclVersion, space_for

V230 = NcclVersion.parse("2.30")


class Surface(Profiler):
    """busbw as a function of the axis indices of each subspace."""

    name = "synthetic"

    def __init__(self, space, peaks):
        # peaks: per subspace index, a list of (height, (ci, ti, ki), width)
        self.space, self.peaks, self.calls = space, peaks, 0
        self.index = {s.subspace if hasattr(s, "subspace") else (s.algo, s.proto, s.transport): i
                      for i, s in enumerate(space.subspaces)}

    def identity(self):
        return f"surface-{id(self)}"

    def value(self, c):
        si = self.index[c.subspace]
        sub = self.space.subspaces[si]
        x = (sub.channels.index(c.channels), sub.threads.index(c.threads),
             sub.chunks.index(c.chunk))
        best = 0.0
        for height, center, width in self.peaks[si]:
            d2 = sum(((a - b) / w) ** 2 for a, b, w in zip(x, center, width, strict=True))
            best = max(best, height * math.exp(-d2))
        return 1.0 + best

    def measure(self, case, configs):
        self.calls += len(configs)
        return [self.value(c) for c in configs]


def _optimum(surface, space):
    return max(surface.value(c) for c in space.configs())


@pytest.fixture
def ar_space(hgx_node):
    return space_for(Func.ALLREDUCE, hgx_node, V230)


def _unimodal(space, seed):
    import random
    rng = random.Random(seed)
    peaks = []
    for s in space.subspaces:
        center = tuple(rng.randrange(len(a)) for a in s.axes)
        width = tuple(max(1.0, len(a) / 2) for a in s.axes)
        peaks.append([(rng.uniform(10, 100), center, width)])
    return peaks


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_cd_on_unimodal_surfaces_finds_the_optimum(hgx_node, seed):
    space = space_for(Func.ALLREDUCE, hgx_node, V230)
    surface = Surface(space, _unimodal(space, seed))
    case = Case(Func.ALLREDUCE, 1 << 20, hgx_node)
    cd = search(space, case, surface, "cd", retries=0)
    assert cd.busbw == pytest.approx(_optimum(surface, space))
    assert cd.evaluations <= 0.10 * space.size


def test_cd_on_multi_peak_surfaces_reports_its_fraction(ar_space, hgx_node):
    """Several peaks per subspace break unimodality: report what CD reaches and at what cost;
    random restarts must not make it worse."""
    import random
    rng = random.Random(7)
    peaks = []
    for s in ar_space.subspaces:
        peaks.append([(rng.uniform(10, 100), tuple(rng.randrange(len(a)) for a in s.axes),
                       tuple(max(1.0, len(a) / 16) for a in s.axes)) for _ in range(6)])
    surface = Surface(ar_space, peaks)
    case = Case(Func.ALLREDUCE, 1 << 20, hgx_node)
    best = _optimum(surface, ar_space)
    plain = search(ar_space, case, surface, "cd", retries=0)
    restarted = search(ar_space, case, surface, "cd", retries=4)
    exhaustive = search(ar_space, case, surface, "exhaustive")
    assert exhaustive.busbw == pytest.approx(best) and exhaustive.evaluations == ar_space.size
    frac_plain, frac_restart = plain.busbw / best, restarted.busbw / best
    print(f"multi-peak: cd {frac_plain:.3f} of the optimum in {plain.evaluations} evaluations, "
          f"cd+4 restarts {frac_restart:.3f} in {restarted.evaluations}, exhaustive "
          f"{exhaustive.evaluations}")
    assert 0 < frac_plain <= frac_restart <= 1.0 + 1e-12
    assert restarted.evaluations < 0.10 * ar_space.size


def test_budget_is_a_hard_limit(ar_space, hgx_node):
    surface = Surface(ar_space, _unimodal(ar_space, 3))
    case = Case(Func.ALLREDUCE, 1 << 20, hgx_node)
    for method in ("cd", "exhaustive"):
        r = search(ar_space, case, surface, method, budget=25)
        assert r.evaluations == 25 and r.exhausted_budget and r.best is not None
    # random search spends exactly its budget as its sample count
    assert search(ar_space, case, surface, "random", budget=25).evaluations == 25
    with pytest.raises(SemanticError):
        search(ar_space, case, surface, "cd", budget=0)
    with pytest.raises(SemanticError, match="unknown search"):
        search(ar_space, case, surface, "annealing")


def test_random_search_draws_distinct_configs(ar_space, hgx_node):
    surface = Surface(ar_space, _unimodal(ar_space, 4))
    r = search(ar_space, Case(Func.ALLREDUCE, 1 << 20, hgx_node), surface, "random", samples=300)
    assert r.evaluations == r.measured == surface.calls == 300


def test_cache_avoids_measuring_again(tmp_path, ar_space, hgx_node):
    path = str(tmp_path / "cache.json")
    case = Case(Func.ALLREDUCE, 1 << 24, hgx_node)
    prof = ModelProfiler()
    cache = MeasurementCache(path)
    first = search(ar_space, case, prof, "cd", cache=cache)
    OutputDir(tmp_path).write_text("cache.json", cache.dumps())   # as cclc tune writes it
    again = search(ar_space, case, prof, "cd", cache=MeasurementCache(path))
    assert first.measured == first.evaluations > 0
    assert again.measured == 0 and again.best == first.best and again.busbw == first.busbw
    (tmp_path / "junk.json").write_text("[1, 2]")
    with pytest.raises(SemanticError, match="not a cclc tuning cache"):
        MeasurementCache(str(tmp_path / "junk.json"))


def test_cd_never_below_nccl_default(hgx_cluster):
    from cclc.tuning.baseline import nccl_default
    prof = ModelProfiler()
    for func in (Func.ALLREDUCE, Func.ALLGATHER, Func.BROADCAST):
        space = space_for(func, hgx_cluster, V230)
        for nbytes in (1 << 12, 1 << 20, 1 << 28):
            case = Case(func, nbytes, hgx_cluster)
            r = search(space, case, prof, "cd")
            assert r.busbw >= prof.measure(case, [nccl_default(space, nbytes)])[0]
