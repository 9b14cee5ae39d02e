"""What every code-emitting backend shares: C names, templates, and the schedule in equal units.

Backends never change the IR. They read a :class:`~cclc.ir.Schedule` through
:func:`prepare`, which re-expresses it in *units*: the greatest common divisor of every chunk
size (and of the entry point's ``count``), so that every offset and count is a whole number of
equal units. MSCCL needs that because its chunks are equal; the C++ backends need it so the
same tables serve any ``count`` that is a multiple of the compiled one.

The NCCL and MPI builds turn the units into per-rank dataflow tables with
:func:`backends.nccl.tables.dataflow_tables`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

# the one options type lives with the backend contract; re-exported for the backends' imports
from backends.contract import EmitOptions
from cclc.collective import CollectiveKind
from cclc.errors import ScheduleError
from cclc.ir import Buf, Schedule

__all__ = [
    "EmitOptions",
    "UnitSchedule",
    "c_identifier",
    "count_convention",
    "entry_count",
    "is_padded",
    "padded_count",
    "prepare",
    "render_template",
]

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


@dataclass(frozen=True, eq=False)
class UnitSchedule:
    """A schedule in equal units. Arrays are per op (same order as ``schedule.ops``).

    ``unit`` elements make one unit at the compiled size; ``units[buf]`` is units per rank of
    each buffer (the largest scratch of any rank); ``scratch_units[r]`` is rank r's own scratch;
    ``count_units`` is the entry point's ``count`` (see :func:`count_convention`) in units.
    """

    schedule: Schedule
    unit: int
    units: tuple[int, int, int]
    scratch_units: tuple[int, ...]
    count_units: int
    step: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    kind: np.ndarray
    src_buf: np.ndarray
    src_off: np.ndarray
    dst_buf: np.ndarray
    dst_off: np.ndarray
    count: np.ndarray
    #: False for the near-equal form (see :func:`prepare`): units are atoms of unequal size
    #: at the compiled ``count``, and ``unit`` is only the floor of ``count / count_units``
    exact: bool = True
    #: how the generated C++ finds unit ``u`` of a buffer for a call's ``count`` (with ``K =
    #: count_units``, block ``b = u / K``, ``i = u % K``): 0 ``u * (count / K)`` (``count`` a
    #: multiple of K); 1 ``b * count + floor(i * count / K)``; 2 ``b * count + i * (count / K) +
    #: min(i, count % K)`` (``numpy.array_split``). 1 and 2 serve every ``count``.
    split: int = 0

    @property
    def n(self) -> int:
        return self.schedule.n

    @property
    def n_ops(self) -> int:
        return len(self.step)

    def writes_input(self) -> bool:
        return bool((self.dst_buf == Buf.INPUT).any())


def entry_count(s: Schedule) -> int:
    """The compiled ``count`` of the entry point, in elements."""
    c = s.collective
    if c.kind in (CollectiveKind.ALLTOALL, CollectiveKind.ALLGATHER,
                  CollectiveKind.REDUCESCATTER):
        return c.count // c.n
    return c.count


def prepare(schedule: Schedule, max_units: int | None = None, split: bool = False,
            pad: bool = False) -> UnitSchedule:
    """Express ``schedule`` in equal units (the gcd of all chunk sizes and of ``count``).

    Ranks may cut their buffers differently and use different amounts of scratch, but every
    rank's input (and output) must hold the same number of elements, since an entry point
    takes one ``count``: :class:`ScheduleError` otherwise (a non-uniform alltoall).

    With ``max_units``, a schedule whose exact units would make a buffer longer than that
    (chunks cut as ``floor(i * count / K)`` when ``K`` does not divide ``count``) is expressed
    in the *near-equal* form instead, if it has one. Every buffer is seen as blocks of
    ``count`` elements, all cut alike into ``K`` atoms at the offsets (modulo ``count``) of
    every chunk boundary -- uneven splits such as ``floor(i * count / K)`` or
    ``numpy.array_split`` give near-equal atoms -- and atom ``u`` becomes unit ``u``;
    ``count_units`` is ``K`` and ``exact`` is False. Every op must move whole atoms onto atoms
    of the same sizes (shifts by whole blocks always do), so the unit schedule moves exactly
    what this one moves, atom for atom: it is this schedule with its cuts made equal, which is
    what it is at every ``count`` that is a multiple of ``K`` (MSCCL's XML is size-generic and
    runs only at those sizes). None of that holds: the exact form is returned.

    With ``split``, the near-equal form is returned instead of the exact one whenever it has
    fewer units per ``count`` and its cuts follow one of the conventions of
    :attr:`UnitSchedule.split` at the compiled ``count`` and every op moves data by whole
    blocks: then the generated C++ computes each unit's element offset from the call's
    ``count``, exact for any ``count``, not just multiples of the compiled one.

    With ``pad``, a non-uniform alltoall is accepted (see :func:`is_padded`): every rank's
    buffers count as long as the largest (the padding is never read or written) and ``count``
    is the largest input or output buffer of any rank, in elements (:func:`padded_count`).
    """
    us = _prepare_exact(schedule, pad)
    if pad and is_padded(schedule):
        return us
    if split:
        near = _prepare_near(schedule, max(us.units), whole_blocks=True)
        if near is not None and near.split and near.count_units < us.count_units:
            return near
        return us
    if max_units is None or max(us.units) <= max_units:
        return us
    return _prepare_near(schedule, max_units) or us


def is_padded(schedule: Schedule) -> bool:
    """Do the ranks' input (or output) buffers differ in size (a non-uniform alltoall)?"""
    return any(bool((t != t[0]).any()) for t in
               (schedule.chunk_starts(buf)[:, -1] for buf in (Buf.INPUT, Buf.OUTPUT)))


def padded_count(schedule: Schedule) -> int:
    """A non-uniform alltoall's ``count``: the largest input or output buffer of any rank."""
    return max(int(schedule.chunk_starts(buf)[:, -1].max()) for buf in (Buf.INPUT, Buf.OUTPUT))


def _prepare_exact(schedule: Schedule, pad: bool = False) -> UnitSchedule:
    s = schedule
    count = entry_count(s)
    for buf in (Buf.INPUT, Buf.OUTPUT):
        totals = s.chunk_starts(buf)[:, -1]
        if (totals != totals[0]).any():
            if not pad:
                raise ScheduleError(
                    f"the {buf.name.lower()} buffers of the ranks differ in size "
                    f"({int(totals.min())} to {int(totals.max())} elements, a non-uniform "
                    "alltoall); MSCCL's alltoall needs one size for every rank (it has no "
                    "alltoallv): use the NCCL library (--emit nccl), which pads every rank's "
                    "buffers to the largest")
            count = padded_count(s)
    sizes = [int(x) for buf in Buf for x in np.unique(s.chunk_elems(buf)) if x > 0]
    unit = math.gcd(count, *sizes) if sizes else count
    if unit <= 0:
        raise ScheduleError("the schedule moves no data")
    units = tuple(int(s.chunk_starts(buf)[:, -1].max()) // unit for buf in Buf)
    ops = s.ops
    src_off = np.zeros(len(ops), dtype=np.int64)
    dst_off = np.zeros(len(ops), dtype=np.int64)
    for buf in Buf:
        starts = s.chunk_starts(buf)
        m = ops.src_buf == buf
        src_off[m] = starts[ops.src[m], ops.src_off[m]] // unit
        m = ops.dst_buf == buf
        dst_off[m] = starts[ops.dst[m], ops.dst_off[m]] // unit
    return UnitSchedule(
        schedule=s, unit=unit, units=units,
        scratch_units=tuple(int(x) // unit for x in s.chunk_starts(Buf.SCRATCH)[:, -1]),
        count_units=count // unit,
        step=ops.step.astype(np.int64), src=ops.src.astype(np.int64),
        dst=ops.dst.astype(np.int64), kind=ops.kind.astype(np.int64),
        src_buf=ops.src_buf.astype(np.int64), src_off=src_off,
        dst_buf=ops.dst_buf.astype(np.int64), dst_off=dst_off,
        count=(s.op_elems() // unit).astype(np.int64))


class _Atoms:
    """The cut of every block of ``count`` elements into atoms: ``points`` are the distinct
    offsets, modulo ``count``, of every chunk boundary of every buffer and rank (0 included).
    Atom ``u`` of a buffer is unit ``u`` of the near-equal form."""

    def __init__(self, bounds: np.ndarray, count: int):
        self.count = count
        self.points = np.unique(np.concatenate([[0], bounds % count]))
        self.k = len(self.points)

    def units(self, elems) -> np.ndarray:
        e = np.asarray(elems, dtype=np.int64)
        return (e // self.count) * self.k + np.searchsorted(self.points, e % self.count)

    def inside(self, lo: int, hi: int) -> np.ndarray:
        """Every atom boundary in [lo, hi], as element offsets."""
        c = self.count
        blocks = np.arange(lo // c, hi // c + 1, dtype=np.int64)
        e = (blocks[:, None] * c + self.points[None, :]).ravel()
        return e[(e >= lo) & (e <= hi)]


def _prepare_near(schedule: Schedule, max_units: int, whole_blocks: bool = False
                  ) -> UnitSchedule | None:
    """The near-equal form of :func:`prepare`, or None when the schedule has none (or, with
    ``whole_blocks``, when some op moves data by other than whole blocks)."""
    s = schedule
    count = entry_count(s)
    raws = {buf: s.chunk_starts(buf) for buf in Buf}
    atoms = _Atoms(np.concatenate([r.ravel() for r in raws.values()]), count)
    if max(int(atoms.units(r[:, -1].max())) for r in raws.values()) > max_units:
        return None
    ops = s.ops
    elems = s.op_elems()
    src_e = np.zeros(len(ops), dtype=np.int64)
    dst_e = np.zeros(len(ops), dtype=np.int64)
    for buf, raw in raws.items():
        m = ops.src_buf == buf
        src_e[m] = raw[ops.src[m], ops.src_off[m]]
        m = ops.dst_buf == buf
        dst_e[m] = raw[ops.dst[m], ops.dst_off[m]]
    src_off, dst_off = atoms.units(src_e), atoms.units(dst_e)
    cnt = atoms.units(src_e + elems) - src_off
    if (cnt != atoms.units(dst_e + elems) - dst_off).any() or (cnt <= 0).any():
        return None
    if whole_blocks and ((dst_e - src_e) % count).any():
        return None
    # an op that shifts its data by a whole number of blocks maps atoms onto equal atoms;
    # any other must find the same atom cuts at both ends, element for element, so that
    # moving whole units moves exactly what the op moves
    for i in np.flatnonzero((dst_e - src_e) % count):
        a, b, n = int(src_e[i]), int(dst_e[i]), int(elems[i])
        if not np.array_equal(atoms.inside(a, a + n) - a, atoms.inside(b, b + n) - b):
            return None
    k = atoms.k
    split = 0
    i = np.arange(k, dtype=np.int64)
    if not ((dst_off - src_off) % k).any():
        if np.array_equal(atoms.points, i * count // k):
            split = 1
        elif np.array_equal(atoms.points, i * (count // k) + np.minimum(i, count % k)):
            split = 2
    return UnitSchedule(
        schedule=s, unit=count // atoms.k, split=split,
        units=tuple(int(atoms.units(raws[buf][:, -1].max())) for buf in Buf),
        scratch_units=tuple(int(x) for x in atoms.units(raws[Buf.SCRATCH][:, -1])),
        count_units=atoms.k,
        step=ops.step.astype(np.int64), src=ops.src.astype(np.int64),
        dst=ops.dst.astype(np.int64), kind=ops.kind.astype(np.int64),
        src_buf=ops.src_buf.astype(np.int64), src_off=src_off,
        dst_buf=ops.dst_buf.astype(np.int64), dst_off=dst_off, count=cnt, exact=False)


def render_template(package: str, template: str, **values) -> str:
    """Render jinja2 template ``template`` that sits beside ``package`` (strict: a missing value is
    an error, not an empty string)."""
    import jinja2

    env = _ENVS.get(package)
    if env is None:
        env = jinja2.Environment(loader=jinja2.PackageLoader(package, "templates"),
                                 undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                                 trim_blocks=True, lstrip_blocks=True, autoescape=False)
        _ENVS[package] = env
    return env.get_template(template).render(**values)


_ENVS: dict = {}
