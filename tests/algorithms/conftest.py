"""Puts this directory on ``sys.path`` for the helper modules (pytest's importlib mode does not
put a test's directory there)."""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
