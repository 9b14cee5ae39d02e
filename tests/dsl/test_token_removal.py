"""Robustness: delete any one token of any example and the result is a clean user error.

The tokens are the parser's own (its contextual lexer, via lark's interactive parser), so a
keyword is a keyword only where the grammar reads it as one. Whatever the deletion does, loads()
either succeeds or raises a CclError placed in the file, never another exception.
"""

import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cclc.errors import CclError, render_error
from dsl import loads
from dsl.parser import PARSER

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
HEADER = re.compile(r"^(?P<file>[^:\n]+):(?P<line>\d+):(?P<col>\d+): error: \S.*")


def _check_clean(text: str, name: str) -> None:
    """``text`` loads, or fails with a CclError rendered as ``name:line:col: error: ...``."""
    try:
        loads(text, name, base_dir=EXAMPLES)
    except CclError as err:
        rendered = render_error(err, text)
        match = HEADER.match(rendered)
        assert match and match["file"] == name, rendered


def _tokens(text: str):
    return list(PARSER.parse_interactive(text).iter_parse())


@pytest.mark.parametrize("name", sorted(p.name for p in EXAMPLES.glob("*.ccl")))
def test_removing_any_token_gives_a_clean_error(name):
    path = EXAMPLES / name
    text = path.read_text()
    tokens = _tokens(text)
    assert len(tokens) > 20
    outcomes = {"ok": 0, "error": 0}
    for token in tokens:
        mutated = text[:token.start_pos] + text[token.end_pos:]
        try:
            loads(mutated, name, base_dir=EXAMPLES)
        except CclError as err:
            outcomes["error"] += 1
            rendered = render_error(err, mutated)
            match = HEADER.match(rendered)
            assert match, f"removing {token!r} at {token.line}:{token.column}:\n{rendered}"
            assert match["file"] == name
            lines = rendered.splitlines()
            # the source line and a caret follow the header when the span is inside the file
            if int(match["line"]) <= len(mutated.splitlines()):
                assert len(lines) == 3 and lines[2].lstrip().startswith("^"), rendered
        else:
            outcomes["ok"] += 1
    # most deletions break something; some (a comment's newline, an optional word) do not
    assert outcomes["error"] > outcomes["ok"]


EXAMPLE_TEXTS = {p.name: p.read_text() for p in sorted(EXAMPLES.glob("*.ccl"))}
EDIT_CHARACTERS = st.sampled_from(list("(){}[],;:.=-># \n\"x0123456789") + ["\t", "\u00a0", "é"])


@settings(max_examples=200, deadline=None)
@given(name=st.sampled_from(sorted(EXAMPLE_TEXTS)), data=st.data())
def test_random_character_edits_give_clean_errors(name, data):
    """Character-level edits (insert, delete, replace), which can split or merge tokens."""
    text = EXAMPLE_TEXTS[name]
    for _ in range(data.draw(st.integers(1, 3), label="edits")):
        at = data.draw(st.integers(0, len(text)), label="position")
        action = data.draw(st.sampled_from(["insert", "delete", "replace"]), label="action")
        if action == "insert":
            text = text[:at] + data.draw(EDIT_CHARACTERS) + text[at:]
        elif action == "delete":
            text = text[:at] + text[at + 1:]
        else:
            text = text[:at] + data.draw(EDIT_CHARACTERS) + text[at + 1:]
    _check_clean(text, name)
