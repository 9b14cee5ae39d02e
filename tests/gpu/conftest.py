"""The GPU tier: skipped, with the reason, where no NVIDIA GPU (or no CUDA toolkit) is at hand.

Make ``backend_helpers`` (schedules, numpy references), the simulator tests' hand-built
schedules it uses and ``gpu_helpers`` importable, as tests/backends/conftest.py does for its
folder.
"""

import sys
from pathlib import Path

import pytest

_HERE = Path(__file__).parent
for folder in (_HERE, _HERE.parent / "backends", _HERE.parent / "sim"):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

from gpu_helpers import why_no_gpu  # noqa: E402

_WHY = why_no_gpu()


def pytest_collection_modifyitems(config, items):
    if _WHY is None:
        return
    skip = pytest.mark.skip(reason=f"GPU tier: {_WHY}")
    for item in items:
        if _HERE in Path(str(item.fspath)).parents:
            item.add_marker(skip)
