"""Make the simulator tests' hand-built schedules (``tests/sim/sim_builders.py``) importable
for ``cclc sim`` and ``cclc bounds`` end to end: ``--import-mode=importlib`` does not put a
test's directory on ``sys.path``."""

import sys
from pathlib import Path

_SIM = str(Path(__file__).parents[1] / "sim")
if _SIM not in sys.path:
    sys.path.insert(0, _SIM)
