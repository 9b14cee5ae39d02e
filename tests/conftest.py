"""Settings every test directory shares.

Hypothesis draws its examples from a seed fixed per test (``derandomize``) unless
``HYPOTHESIS_PROFILE=explore`` is set: a test run, CI's included, then passes or fails the same
way every time, and a change that breaks a property fails on the examples it was checked
with, not one run in twenty. New examples are searched on purpose with the ``explore`` profile
(random seeds, each run different); what it finds is kept as an ``@example`` on the test.
"""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("default", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
