"""The error catalogue: each tests/errors/NAME.ccl renders exactly as NAME.expected.

The files are loaded from inside tests/errors with their bare names, so the expected text
holds relative paths. To rewrite the expected files after an intended change of wording, run
``CCLC_REGEN=1 pytest tests/dsl/test_errors.py`` and review the diff.
"""

import os
import re
from pathlib import Path

import pytest

from cclc.errors import CclError, SyntaxErr, render_error
from dsl import display_source, load

ERRORS = Path(__file__).resolve().parents[1] / "errors"
CASES = sorted(p.name for p in ERRORS.glob("*.ccl"))
REGEN = os.environ.get("CCLC_REGEN") == "1"


def test_catalogue_is_large_and_complete():
    assert len(CASES) >= 25
    assert sum(name.startswith("syntax_") for name in CASES) >= 5
    missing = [n for n in CASES if not (ERRORS / n).with_suffix(".expected").exists()]
    assert REGEN or not missing, f"no .expected file for {missing}"
    orphans = [p.name for p in ERRORS.glob("*.expected") if not p.with_suffix(".ccl").exists()]
    assert not orphans


@pytest.mark.parametrize("name", CASES)
def test_error_renders_as_expected(name, monkeypatch):
    monkeypatch.chdir(ERRORS)
    with pytest.raises(CclError) as info:
        load(name)
    err = info.value
    assert err.span is not None and err.span.file == name
    assert isinstance(err, SyntaxErr) == name.startswith("syntax_")
    rendered = render_error(err, display_source(name)) + "\n"
    assert re.match(rf"{re.escape(name)}:\d+:\d+: error: \S", rendered)
    expected = Path(name).with_suffix(".expected")
    if REGEN:
        expected.write_text(rendered, encoding="utf-8")
    assert rendered == expected.read_text(encoding="utf-8")


def test_unreadable_file_renders_without_location(tmp_path):
    with pytest.raises(CclError) as info:
        load(tmp_path / "nope.ccl")
    assert render_error(info.value) == f"error: cannot read '{tmp_path / 'nope.ccl'}': " \
                                       "No such file or directory"
