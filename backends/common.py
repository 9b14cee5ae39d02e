"""What every code-emitting backend shares: C names, templates, and an entry point's ``count``.

Backends never change the IR. The ones that emit code read a schedule re-expressed in equal
units by the pass :func:`backends.units.to_units`; the NCCL and MPI builds turn that into
per-rank dataflow tables with :func:`backends.nccl.tables.dataflow_tables`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

# the one options type lives with the backend contract; re-exported for the backends' imports
from backends.contract import EmitOptions
from cclc.collective import CollectiveKind
from cclc.ir import Buf, Schedule

__all__ = [
    "EmitOptions",
    "RecentLowerings",
    "c_identifier",
    "count_convention",
    "entry_count",
    "is_padded",
    "padded_count",
    "render_template",
]

T = TypeVar("T")


class RecentLowerings(Generic[T]):
    """The last few lowerings of schedules, found again by the schedule's identity and a key.

    ``auto`` asks a backend whether a candidate fits its runtime (which needs the candidate
    lowered) and then renders the one it chose: keeping the last lowerings lowers the winner
    once. Two are kept, since a second lowering of the same schedule (in place or another
    protocol) may come between.
    """

    def __init__(self, keep: int = 2) -> None:
        self._keep = keep
        self._items: list[tuple[Schedule, Hashable, T]] = []

    def get(self, schedule: Schedule, key: Hashable, lower: Callable[[], T]) -> T:
        """The lowering of ``schedule`` under ``key``: kept, or ``lower()`` (then kept)."""
        for seen, seen_key, result in self._items:
            if seen is schedule and seen_key == key:
                return result
        result = lower()
        self._items.insert(0, (schedule, key, result))
        del self._items[self._keep:]
        return result


_C_KEYWORDS = frozenset("""
    auto break case char const continue default do double else enum extern float for goto if
    inline int long register restrict return short signed sizeof static struct switch typedef
    union unsigned void volatile while
    bool true false
    class namespace template typename this new delete operator private public protected virtual
    friend using
""".split())


def c_identifier(name: str) -> str:
    """``name`` as a C identifier: other characters become ``_``; never empty, a keyword, or
    starting with a digit.

    >>> c_identifier("a2a-fast.v2")
    'a2a_fast_v2'
    >>> c_identifier("3d")
    '_3d'
    """
    ident = re.sub(r"[^A-Za-z0-9_]", "_", name)
    if not ident:
        return "_"
    if ident[0].isdigit() or ident in _C_KEYWORDS:
        ident = "_" + ident
    return ident


def count_convention(kind: CollectiveKind) -> str:
    """What the ``count`` argument of an entry point counts (the NCCL convention)."""
    return {
        CollectiveKind.ALLTOALL: "elements each rank sends to each peer",
        CollectiveKind.ALLGATHER: "elements each rank contributes (sendcount)",
        CollectiveKind.REDUCESCATTER: "elements each rank receives (recvcount)",
    }.get(kind, "elements of the buffer")


def entry_count(s: Schedule) -> int:
    """The compiled ``count`` of the entry point, in elements."""
    c = s.collective
    if c.kind in (CollectiveKind.ALLTOALL, CollectiveKind.ALLGATHER,
                  CollectiveKind.REDUCESCATTER):
        return c.count // c.n
    return c.count


def is_padded(schedule: Schedule) -> bool:
    """Do the ranks' input (or output) buffers differ in size (a non-uniform alltoall)?"""
    return any(bool((t != t[0]).any()) for t in
               (schedule.chunk_starts(buf)[:, -1] for buf in (Buf.INPUT, Buf.OUTPUT)))


def padded_count(schedule: Schedule) -> int:
    """A non-uniform alltoall's ``count``: the largest input or output buffer of any rank."""
    return max(int(schedule.chunk_starts(buf)[:, -1].max()) for buf in (Buf.INPUT, Buf.OUTPUT))


def render_template(package: str, template: str, **values) -> str:
    """Render jinja2 template ``template`` that sits beside ``package`` (strict: a missing value is
    an error, not an empty string)."""
    # jinja2 only when a template is rendered, not when cclc --help lists the backends
    import jinja2

    env = _ENVS.get(package)
    if env is None:
        env = jinja2.Environment(loader=jinja2.PackageLoader(package, "templates"),
                                 undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                                 trim_blocks=True, lstrip_blocks=True, autoescape=False)
        _ENVS[package] = env
    return env.get_template(template).render(**values)


_ENVS: dict = {}
