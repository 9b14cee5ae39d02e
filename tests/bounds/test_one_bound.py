"""One bound everywhere: ``cclc bounds``, ``cclc compile`` (the plan's % of bound) and the
README's table (``benchmarks/collectives.py``) report the same ``bounds(coll).best``."""

from __future__ import annotations

import glob
import importlib.util
import os
import re

import pytest

import dsl
from cclc.bounds import bounds
from cclc.cli import main
from cclc.collective import CollectiveKind
from cclc.plan import plan

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
EXAMPLES = sorted(glob.glob(os.path.join(ROOT, "examples", "*.ccl")))


def _collectives_benchmark():
    spec = importlib.util.spec_from_file_location(
        "collectives_benchmark", os.path.join(ROOT, "benchmarks", "collectives.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.parametrize("path", EXAMPLES, ids=os.path.basename)
def test_cclc_bounds_prints_the_bound_compile_uses(path, capsys):
    program = dsl.load(path)
    assert main(["bounds", path]) == 0
    best = re.findall(r"best: (\w+), ([0-9.]+) us", capsys.readouterr().out)
    assert len(best) == len(program.collectives)
    for coll, (name, us) in zip(program.collectives, best, strict=True):
        b = bounds(coll)
        assert b.get("lp") is not None, "every example gets the LP bound"
        assert (name, float(us)) == (b.name, pytest.approx(b.best * 1e6, abs=1e-3))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["torus5x5_fault.ccl", "hgx_node.ccl"])
def test_compile_and_the_readme_table_use_the_same_bound(name):
    """The plan behind ``cclc compile`` and a row of the README's table, side by side."""
    bench = _collectives_benchmark()
    program = dsl.load(os.path.join(ROOT, "examples", name))
    for coll in program.collectives:
        p = plan(coll)
        assert p.bound == bounds(coll).best
    topo = next(iter(program.topologies.values()))
    for kind in (CollectiveKind.ALLGATHER, CollectiveKind.ALLREDUCE):
        row = bench.run_row(name, topo, kind, 1 << 20)
        coll = bench.make_collective(kind.value, kind, topo, topo.live_ranks(),
                                     size=row["bytes"], dtype=bench.DTYPE)
        b = bounds(coll)
        assert (row["bound"], row["bound_s"]) == (b.name, b.best)
        if b.name == "lp":
            p = plan(coll)
            assert p.bound == row["bound_s"]
