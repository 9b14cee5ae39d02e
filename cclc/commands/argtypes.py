"""Argument types for flags: argparse reports a bad value as a usage error (exit 2)."""

from __future__ import annotations

import argparse

__all__ = ["int_at_least", "path_named"]


def int_at_least(low: int, high: int | None = None):
    """An argparse ``type`` accepting integers in ``low..high`` (``high=None``: no limit)."""

    def parse(text: str) -> int:
        try:
            value = int(text, 10)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low or (high is not None and value > high):
            limit = f">= {low}" if high is None else f"in {low}..{high}"
            raise argparse.ArgumentTypeError(f"must be an integer {limit}, got {value}")
        return value

    parse.__name__ = "integer"
    return parse


def path_named(text: str) -> str:
    """An argparse ``type`` for a file or folder the user names: not empty (``-o ''`` would
    otherwise mean the current folder)."""
    if text == "":
        raise argparse.ArgumentTypeError("expected a path, got an empty name (write . for the "
                                         "current folder)")
    return text


path_named.__name__ = "path"
