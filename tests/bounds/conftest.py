"""Make this folder's helpers (``test_bounds_lp_certified``'s LP references) and the
simulator tests' hand-built schedules (``tests/sim/sim_builders.py``, shared with them)
importable: ``--import-mode=importlib`` does not put a test's directory on ``sys.path``."""

import sys
from pathlib import Path

for _folder in (Path(__file__).parent, Path(__file__).parents[1] / "sim"):
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))
