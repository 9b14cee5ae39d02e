"""Make ``plan_checks.py`` importable (pytest runs with ``--import-mode=importlib``, which does
not put a test's directory on ``sys.path``)."""

import sys
from pathlib import Path

_HERE = str(Path(__file__).parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
