"""Make the hand-built schedules in ``ir_builders.py`` importable from these tests.

pytest runs with ``--import-mode=importlib`` (pyproject.toml), which does not put a test's
directory on ``sys.path``; the builders are plain functions (hypothesis tests call them), not
fixtures, so they are imported as a module.
"""

import sys
from pathlib import Path

_HERE = str(Path(__file__).parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
