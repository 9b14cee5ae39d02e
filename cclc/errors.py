"""User-facing errors and their one rendering.

Every mistake a user can make is raised as a :class:`CclError` carrying the source span it
refers to; only the CLI renders and exits. The rendering is ``FILE:LINE:COL: error: message``,
the source line, and a caret (``^``) or an underline (``^~~~``) under the spot.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Span", "CclError", "SyntaxErr", "SemanticError", "TopologyError",
           "CollectiveError", "ScheduleError", "NotExpressible", "render_error"]


@dataclass(frozen=True, slots=True)
class Span:
    """A region of a source file: 1-based line and column, end exclusive on the end line."""

    file: str
    line: int
    col: int
    end_line: int | None = None
    end_col: int | None = None


class CclError(Exception):
    """Base of every error a user can cause; ``span`` is where, when a file is involved."""

    def __init__(self, message: str, span: Span | None = None):
        super().__init__(message)
        self.message = message
        self.span = span

    def with_span(self, span: Span) -> CclError:
        """The same error placed at ``span`` unless it already has a place."""
        if self.span is None:
            self.span = span
        return self


class SyntaxErr(CclError):
    """The text does not follow the grammar."""


class SemanticError(CclError):
    """The text parses but means something impossible (unknown name, bad unit, ...)."""


class TopologyError(CclError):
    """A topology that cannot be built as asked (missing link, disconnected group, ...)."""


class CollectiveError(CclError):
    """A collective that cannot run as asked on its group."""


class ScheduleError(CclError):
    """A schedule that is malformed or fails verification."""


class NotExpressible(ScheduleError):
    """An output format has no form at all for a collective (MSCCL has no alltoallv): not a
    limit the schedule exceeds, so no other schedule would do; the compile skips that output
    with a note instead of failing."""


def render_error(err: CclError, source: str | None = None) -> str:
    """``FILE:LINE:COL: error: message`` plus the source line and a caret or underline."""
    span = err.span
    if span is None:
        return f"error: {err.message}"
    head = f"{span.file}:{span.line}:{span.col}: error: {err.message}"
    if source is None:
        return head
    lines = source.splitlines()
    if not 1 <= span.line <= len(lines):
        return head
    text = lines[span.line - 1].expandtabs(1)
    width = 1
    if span.end_line == span.line and span.end_col is not None and span.end_col > span.col:
        width = span.end_col - span.col
    elif span.end_line is not None and span.end_line > span.line:
        width = max(1, len(text) - span.col + 1)
    col = span.col
    if len(text) > _MAX_SHOWN:
        # show a window around the spot, not a whole machine-written line
        start = max(0, col - 1 - _MAX_SHOWN // 2)
        text = ("..." if start else "") + text[start:start + _MAX_SHOWN] + "..."
        col = col - start + (3 if start else 0)
        width = min(width, _MAX_SHOWN)
    marker = "^" + "~" * (width - 1)
    return f"{head}\n{text}\n{' ' * (col - 1)}{marker}"


#: longest source excerpt shown under an error
_MAX_SHOWN = 160
