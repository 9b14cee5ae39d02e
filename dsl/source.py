"""Reading ``.ccl`` source: bytes to text, the same way for parsing and for error messages.

A ``.ccl`` file is UTF-8. A leading byte-order mark (which editors on Windows write) is
dropped, so that line 1 column 1 is the first character a reader sees. Bytes that are not
UTF-8 are a :class:`SyntaxErr` placed at their line and column.
"""

from __future__ import annotations

import os
import unicodedata
from pathlib import Path

from cclc.errors import Span, SyntaxErr

__all__ = ["BOM", "decode_source", "describe_character", "display_source", "read_source"]

#: the byte-order mark as a character; tolerated only as the first character of a file
BOM = "\ufeff"


def read_source(path: str | os.PathLike) -> str:
    """The text of the file at ``path``, decoded as UTF-8 without a leading byte-order mark.

    Raises ``OSError`` when the file cannot be read and :class:`SyntaxErr` (placed at the first
    bad byte) when it is not UTF-8.
    """
    return decode_source(Path(path).read_bytes(), os.fspath(path))


def decode_source(data: bytes, filename: str) -> str:
    """``data`` decoded as UTF-8, a leading byte-order mark dropped.

    >>> decode_source(b"\\xef\\xbb\\xbftopology", "t.ccl")
    'topology'
    >>> decode_source(b"size 1 \\xb5s", "t.ccl")
    Traceback (most recent call last):
    ...
    cclc.errors.SyntaxErr: the file is not UTF-8 text: byte 0xB5 cannot be read as UTF-8 ...
    """
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise _not_utf8(data, err, filename) from None
    return text.removeprefix(BOM)


def display_source(path: str | os.PathLike) -> str | None:
    """The text of ``path`` for showing a line under an error, or ``None`` if unreadable.

    Decoded like :func:`read_source`, but each byte that is not UTF-8 shows as U+FFFD, so
    that the columns of an error about such a byte still point at it.
    """
    try:
        data = Path(path).read_bytes()
    except OSError:
        return None
    return data.decode("utf-8", errors="replace").removeprefix(BOM)


def describe_character(char: str) -> str:
    """A character with its code point and Unicode name, e.g. ``'о' (U+043E CYRILLIC ...)``.

    >>> describe_character("\\u043e")
    "'о' (U+043E CYRILLIC SMALL LETTER O)"
    >>> describe_character("\\u00a0")
    'U+00A0 (NO-BREAK SPACE)'
    """
    code = f"U+{ord(char):04X}"
    name = unicodedata.name(char, None)
    if char.isprintable() and not char.isspace():
        return f"'{char}' ({code} {name})" if name else f"'{char}' ({code})"
    return f"{code} ({name})" if name else code


def _not_utf8(data: bytes, err: UnicodeDecodeError, filename: str) -> SyntaxErr:
    """The error for the first byte that is not UTF-8, at its line and column."""
    line = data.count(b"\n", 0, err.start) + 1
    # columns count characters, as the parser's do; the bytes before err.start decode cleanly
    before = data[:err.start].decode("utf-8").removeprefix(BOM)
    col = len(before) - (before.rfind("\n") + 1) + 1
    return SyntaxErr(f"the file is not UTF-8 text: byte 0x{data[err.start]:02X} cannot be read "
                     f"as UTF-8 ({err.reason}); save the file as UTF-8",
                     Span(filename, line, col, line, col + 1))
