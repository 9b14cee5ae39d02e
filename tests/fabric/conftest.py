"""Make the per-flow routing reference in ``fabric_routing_reference.py`` importable from
these tests.

pytest runs with ``--import-mode=importlib`` (pyproject.toml), which does not put a test's
directory on ``sys.path``; the reference is a plain module, not a fixture.
"""

import sys
from pathlib import Path

_HERE = str(Path(__file__).parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
