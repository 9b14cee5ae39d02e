"""cclc.units: the formats every report line uses."""

from __future__ import annotations

import pytest

from cclc.units import format_duration


@pytest.mark.parametrize(("seconds", "text"), [
    (40.0, "40 s"), (59.9, "59.9 s"), (60.0, "1 minute"), (90.0, "1.5 minutes"),
    (2580.0, "43 minutes"), (3600.0, "1 hour"), (9000.0, "2.5 hours"), (86400.0, "1 day"),
    (3 * 86400.0, "3 days")])
def test_durations_read_as_words_and_one_is_singular(seconds, text):
    assert format_duration(seconds) == text


def test_a_guess_gets_two_digits():
    assert format_duration(304.2, digits=2) == "5.1 minutes"
    assert format_duration(304.2) == "5.07 minutes"
