"""The project's habits, checked: ruff (bugbear, complexity, zip strictness), mypy over every
package (``MYPY_TARGETS``), and every docstring example that can run."""

from __future__ import annotations

import doctest
import importlib
import importlib.util
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: what mypy must find clean: every package of the project (the configuration is in
#: pyproject.toml; annotate, don't ignore)
MYPY_TARGETS = ("cclc/", "backends/", "dsl/")


def _tool(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed (pip install -e '.[test]' installs it)")


def test_ruff_is_clean():
    _tool("ruff")
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--quiet", "."],
                          cwd=ROOT, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_mypy_is_clean():
    _tool("mypy")
    done = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental",
                           "--cache-dir", "/dev/null", *MYPY_TARGETS],
                          cwd=ROOT, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def _modules_with_examples() -> list[str]:
    names = []
    for package in ("cclc", "dsl", "backends"):
        pkg = importlib.import_module(package)
        names.append(package)
        names += [m.name for m in pkgutil.walk_packages(pkg.__path__, f"{package}.")]
    return sorted(n for n in names if ">>>" in _source(n))


def _source(name: str) -> str:
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        return ""
    return Path(spec.origin).read_text(encoding="utf-8")


@pytest.mark.parametrize("name", _modules_with_examples())
def test_docstring_examples_run(name):
    """Every example in the module's docstrings runs and prints what it says (examples that
    need a whole schedule at hand are marked ``# doctest: +SKIP`` where they stand)."""
    module = importlib.import_module(name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in finder.find(module):
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{result.failed} docstring examples of {name} failed"


def test_examples_are_found():
    # the walk above must see the modules known to carry runnable examples
    found = set(_modules_with_examples())
    assert {"cclc.outdir", "cclc.units", "cclc.semantics", "dsl.parser", "backends.common"} <= found
