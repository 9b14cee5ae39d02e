"""Make ``backend_helpers.py`` (hand-built schedules, the MPI runner) and the simulator tests'
hand-built schedules it shares (``tests/sim/sim_builders.py``) importable.

pytest runs with ``--import-mode=importlib``, which does not put a test's directory on
``sys.path``; the helpers are plain functions, imported as a module.
"""

import sys
from pathlib import Path

for _folder in (Path(__file__).parent, Path(__file__).parents[1] / "sim"):
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))
