"""The ``.ccl`` language: parse a file and elaborate it into topologies and collectives.

>>> program = loads('''
... topology ring = torus(8) { link 50 GB/s, 1 us }
... collective ag = allgather on ring { size 8 MiB }
... ''', "ring.ccl")
>>> program.collectives[0].topology.n_links
16
"""

from __future__ import annotations

import os
from pathlib import Path

from cclc.errors import CclError
from dsl.elaborate import Program, elaborate
from dsl.parser import parse
from dsl.source import display_source, read_source

__all__ = ["Program", "display_source", "elaborate", "load", "loads", "parse", "read_source"]


def load(path: str | os.PathLike) -> Program:
    """Read, parse and elaborate the ``.ccl`` file at ``path``.

    Spans name the file as ``path`` was given; relative file names inside it (``sizes``) are
    found next to it. The file is UTF-8 (a leading byte-order mark is dropped); bytes that are
    not UTF-8 are a :class:`SyntaxErr` at their line and column. An unreadable file is a
    :class:`CclError` without a span.
    """
    p = Path(path)
    if p.exists() and not p.is_file():
        # a folder, a device such as /dev/zero, a pipe: never read without end
        raise CclError(f"cannot read '{os.fspath(path)}': it is not a regular file")
    try:
        text = read_source(path)
    except OSError as err:
        raise CclError(f"cannot read '{os.fspath(path)}': {err.strerror or err}") from None
    if text.lstrip().startswith("{") and '"format"' in text[:200]:
        raise CclError(f"'{os.fspath(path)}' is a JSON document written by cclc, not a .ccl "
                       "file: read schedules with 'cclc verify', 'cclc sim' or 'cclc viz'")
    return loads(text, os.fspath(path))


def loads(text: str, filename: str = "<string>", base_dir: str | os.PathLike | None = None
          ) -> Program:
    """Parse and elaborate ``.ccl`` source; ``base_dir`` defaults to ``filename``'s directory."""
    if base_dir is None:
        base_dir = Path(filename).parent
    return elaborate(parse(text, filename), base_dir)
