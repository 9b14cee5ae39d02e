"""Reading .ccl source: UTF-8, a leading byte-order mark, bytes that are not UTF-8."""

import pytest

from cclc.errors import SyntaxErr, render_error
from dsl import display_source, load, loads, read_source
from dsl.source import describe_character

RING = "topology ring = torus(4) { link 50 GB/s, 100 ns }\n"


def test_a_byte_order_mark_is_dropped(tmp_path):
    path = tmp_path / "bom.ccl"
    path.write_bytes(b"\xef\xbb\xbf" + RING.encode())
    assert read_source(path) == RING
    assert display_source(path) == RING
    assert load(path).topologies["ring"].n_ranks == 4
    assert loads("\ufeff" + RING).topologies["ring"].n_ranks == 4


def test_a_byte_order_mark_elsewhere_is_named(tmp_path):
    with pytest.raises(SyntaxErr) as info:
        loads(RING + "\ufeff" + RING, "two.ccl")
    assert info.value.span.line == 2 and info.value.span.col == 1
    assert "U+FEFF (ZERO WIDTH NO-BREAK SPACE)" in info.value.message


def test_bytes_that_are_not_utf8_are_placed(tmp_path):
    path = tmp_path / "latin1.ccl"
    path.write_bytes(b"\xef\xbb\xbf" + RING.encode() + "# café\n".encode("latin-1"))
    with pytest.raises(SyntaxErr) as info:
        load(path)
    span = info.value.span
    assert (span.line, span.col) == (2, 6)       # the BOM is no column
    assert "byte 0xE9" in info.value.message
    rendered = render_error(info.value, display_source(path))
    assert rendered.endswith("# caf\ufffd\n     ^")


@pytest.mark.parametrize("char, described", [
    ("\u043e", "'\u043e' (U+043E CYRILLIC SMALL LETTER O)"),
    ("\uff11", "'\uff11' (U+FF11 FULLWIDTH DIGIT ONE)"),
    ("\u00a0", "U+00A0 (NO-BREAK SPACE)"),
])
def test_describe_character(char, described):
    assert describe_character(char) == described


@pytest.mark.parametrize("text, col, char", [
    ("t\u043epology r = torus(4) { link 50 GB/s, 100 ns }", 2, "U+043E"),
    ("topology r = torus(4) { link 50 GB/s, 100 \u043cs }", 43, "U+043C"),
    ("topology r = torus(4) { link 50\u00a0GB/s, 100 ns }", 32, "U+00A0"),
    ("topology r = torus(\uff14) { link 50 GB/s, 100 ns }", 20, "U+FF14"),
])
def test_non_ascii_is_pointed_at_and_named(text, col, char):
    with pytest.raises(SyntaxErr) as info:
        loads(text + "\n", "f.ccl")
    assert (info.value.span.line, info.value.span.col) == (1, col)
    assert info.value.message.startswith("unexpected character ")
    assert f"{char} " in info.value.message


def test_non_ascii_in_comments_and_names_of_files_is_fine():
    program = loads("# Тор 4×1 — ok\n" + RING)
    assert program.topologies["ring"].n_ranks == 4
