"""Make the shared tori in ``synth_tori.py`` importable (``--import-mode=importlib`` does not
put a test's directory on ``sys.path``), and a clock that stands still."""

import sys
import time
from pathlib import Path

import pytest

_HERE = str(Path(__file__).parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)


@pytest.fixture
def frozen_clock(monkeypatch):
    """The tree synthesis reads a clock that stands still (its deadlines are then exact);
    returns the instant it shows."""
    import cclc.algorithms.synth_trees as st_mod
    import cclc.algorithms.tree_budget as tb_mod
    import cclc.algorithms.tree_search as ts_mod

    t0 = time.monotonic()

    class Frozen:
        @staticmethod
        def monotonic():
            return t0

        @staticmethod
        def process_time():
            return 0.0
    for mod in (st_mod, tb_mod, ts_mod):
        monkeypatch.setattr(mod, "time", Frozen)
    return t0
