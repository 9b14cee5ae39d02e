"""Make the hand-built schedules in ``helpers.py`` importable (``--import-mode=importlib``
does not put a test's directory on ``sys.path``; hypothesis tests call them as functions)."""

import sys
from pathlib import Path

_HERE = str(Path(__file__).parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
