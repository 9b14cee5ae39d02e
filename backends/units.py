"""The pass that re-expresses a schedule in equal units, for the code-emitting backends.

MSCCL's chunks are equal, and the C++ backends serve any ``count`` that is a multiple of the
compiled one from the same tables; both need every offset and count as a whole number of
equal *units*. :func:`to_units` returns the same IR, a :class:`~cclc.ir.Schedule`, with every
chunk cut into units (so an op's ``src_off``, ``dst_off`` and ``count`` are in units), and a
:class:`UnitFacts` with what the IR cannot say: the unit's size, the entry point's ``count``
in units, and how a call's ``count`` maps units onto elements.

The unit schedule moves exactly the elements the original moves, op for op (same rows, same
order, same routes): a unit chunk holds the elements of its unit at the compiled size, so the
verifier and the simulator give it the verdict and times of the original. A rank whose buffer
is shorter than another's (scratch, or a padded alltoall) ends its row with empty chunks:
:func:`rank_units` counts the real ones.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from backends.common import entry_count, padded_count
from cclc.errors import NotExpressible, ScheduleError
from cclc.ir import Buf, Ops, Schedule

__all__ = ["UnitFacts", "buffer_units", "rank_units", "to_units", "units_refusal",
           "writes_input"]


@dataclass(frozen=True, slots=True)
class UnitFacts:
    """What a unit schedule's IR does not say about its units.

    ``unit``: elements in one unit at the compiled size (for the near-equal form only the
    floor of ``count / count_units``). ``count_units``: the entry point's ``count`` (see
    :func:`backends.common.count_convention`) in units. ``exact``: False for the near-equal
    form of :func:`to_units`, whose units are atoms of unequal size at the compiled ``count``.
    ``split``: how the generated C++ finds unit ``u`` of a buffer for a call's ``count``
    (with ``K = count_units``, block ``b = u / K``, ``i = u % K``): 0 ``u * (count / K)``
    (``count`` a multiple of K); 1 ``b * count + floor(i * count / K)``; 2 ``b * count + i *
    (count / K) + min(i, count % K)`` (``numpy.array_split``); 1 and 2 serve every ``count``.
    ``padded``: a non-uniform alltoall whose buffers all count as long as the largest.
    """

    unit: int
    count_units: int
    exact: bool = True
    split: int = 0
    padded: bool = False


def buffer_units(units: Schedule) -> tuple[int, int, int]:
    """Units per rank of each buffer of a unit schedule (the largest of any rank)."""
    return (units.n_chunks(Buf.INPUT), units.n_chunks(Buf.OUTPUT), units.n_chunks(Buf.SCRATCH))


def rank_units(units: Schedule, buf: Buf) -> tuple[int, ...]:
    """Each rank's own units of ``buf`` (a unit chunk is never empty; padding chunks are)."""
    return tuple(int(x) for x in np.count_nonzero(units.chunk_elems(buf), axis=1))


def writes_input(schedule: Schedule) -> bool:
    """Does some op write the input buffer (which the runtimes pass as const)?"""
    return bool((schedule.ops.dst_buf == Buf.INPUT).any())


def to_units(schedule: Schedule, max_units: int | None = None, split: bool = False,
             pad: bool = False) -> tuple[Schedule, UnitFacts]:
    """``schedule`` in equal units (the gcd of all chunk sizes and of ``count``).

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
    :attr:`UnitFacts.split` at the compiled ``count`` and every op moves data by whole blocks:
    then the generated C++ computes each unit's element offset from the call's ``count``,
    exact for any ``count``, not just multiples of the compiled one.

    With ``pad``, a non-uniform alltoall is accepted (see :func:`backends.common.is_padded`):
    every rank's buffers count as long as the largest (the padding is never read or written)
    and ``count`` is the largest input or output buffer of any rank, in elements
    (:func:`backends.common.padded_count`).
    """
    longest = _exact_longest(schedule, pad)
    if max_units is None and longest is not None and longest > _LONGEST_TABLES:
        # no runtime limit, but tables of one unit per element would not fit in memory
        near = _near_form(schedule, _LONGEST_TABLES)
        if near is not None:
            return near
        raise UnitsTooLong(_too_long(longest, None))
    if (max_units is not None and not split and longest is not None
            and longest > max(max_units, _LONGEST_BUILT)):
        # the exact form would be too long to address, and too large to build first (a gcd
        # of one element makes one unit per element): the near-equal form or a clear refusal
        near = _near_form(schedule, max_units)
        if near is not None:
            return near
        raise UnitsTooLong(_too_long(longest, max_units) + "; choose chunk counts that "
                           "divide the buffer evenly, or fewer chunks")
    exact = _exact_form(schedule, pad)
    if exact[1].padded:
        return exact
    if split:
        near = _near_form(schedule, max(buffer_units(exact[0])), whole_blocks=True)
        if near is not None and near[1].split and near[1].count_units < exact[1].count_units:
            return near
        return exact
    if max_units is None or max(buffer_units(exact[0])) <= max_units:
        return exact
    return _near_form(schedule, max_units) or exact


def units_refusal(schedule: Schedule, max_units: int | None = None) -> str | None:
    """Why :func:`to_units` with ``max_units`` would refuse ``schedule`` (its exact units too
    many to address, or with no runtime limit too many to build tables of, and no near-equal
    form), or None; cheap when the exact form fits (the gcd of the chunk sizes, nothing
    built), so a planner can ask it of every winner."""
    longest = _exact_longest(schedule, False)
    limit = _LONGEST_TABLES if max_units is None else max_units
    if longest is None or longest <= limit:
        return None
    if _near_form(schedule, limit) is not None:
        return None
    return _too_long(longest, max_units)


def _too_long(longest: int, max_units: int | None) -> str:
    """Why ``longest`` units per buffer are refused: past a runtime's limit, or (``None``)
    past what cclc builds tables for."""
    if max_units is None:
        return (f"the schedule's chunks, counted in equal units (the gcd of its chunk sizes and "
                f"its count), make {longest} units per buffer, more than cclc builds tables "
                f"for ({_LONGEST_TABLES})")
    return (f"MSCCL needs equal chunks: the gcd of this schedule's chunk sizes and its count "
            f"makes {longest} chunks per buffer, more than the runtime can address "
            f"({max_units})")


def _unit_layout(rank_totals: np.ndarray, unit_elems: np.ndarray) -> np.ndarray:
    """A buffer's layout in units: rank r has ``rank_totals[r]`` units whose elements are
    ``unit_elems[:rank_totals[r]]``, then empty chunks up to the longest rank (1-D when every
    rank has the same units)."""
    longest = int(rank_totals.max()) if len(rank_totals) else 0
    row = np.asarray(unit_elems[:longest], dtype=np.int64)
    if (rank_totals == longest).all():
        return row
    keep = np.arange(longest)[None, :] < rank_totals[:, None]
    return np.where(keep, row[None, :], 0)


def _element_offsets(schedule: Schedule) -> tuple[np.ndarray, np.ndarray]:
    """Element offset where every op reads and where it writes."""
    s, ops = schedule, schedule.ops
    src_e = np.zeros(len(ops), dtype=np.int64)
    dst_e = np.zeros(len(ops), dtype=np.int64)
    for buf in Buf:
        starts = s.chunk_starts(buf)
        m = ops.src_buf == buf
        src_e[m] = starts[ops.src[m], ops.src_off[m]]
        m = ops.dst_buf == buf
        dst_e[m] = starts[ops.dst[m], ops.dst_off[m]]
    return src_e, dst_e


def _with_ops(schedule: Schedule, layouts: list[np.ndarray], src_off: np.ndarray,
              dst_off: np.ndarray, count: np.ndarray) -> Schedule:
    """``schedule`` with new layouts and its ops' offsets and counts replaced."""
    cols = schedule.ops.columns()
    cols.update(src_off=src_off, dst_off=dst_off, count=count)
    return schedule.replace(layouts=tuple(layouts), ops=Ops(**cols))


class UnitsTooLong(ScheduleError):
    """The schedule in equal units would be longer than ``max_units`` (a runtime's limit)."""


#: the longest exact form built only to be refused by the runtime's limit (16M units: 128 MB
#: per buffer layout); a longer one is refused without building it
_LONGEST_BUILT = 1 << 24

#: the longest exact form built for a runtime with no limit of its own (the NCCL library):
#: 268M units, 2 GiB per buffer layout; 149M (a 4x4x4 TPU torus relayed by GPUs) build, 512M
#: (a 1 GiB bf16 AllReduce cut element by element) ran a 24 GiB machine out of memory
_LONGEST_TABLES = 1 << 28


def _exact_longest(schedule: Schedule, pad: bool) -> int | None:
    """The longest buffer of the exact form, in units, without building it (None: the
    buffers differ in size, which :func:`_exact_form` handles)."""
    s = schedule
    # from the layouts themselves: a layout all ranks share is one row, not n (the planner
    # asks this of every candidate; at 4,096 ranks n rows of 12,288 chunks are 400 MB)
    totals = [np.atleast_1d(s.layouts[buf].sum(axis=-1)) for buf in Buf]
    if any((t != t[0]).any() for t in totals[:2]):
        return None
    count = entry_count(s)
    sizes = [int(x) for buf in Buf for x in np.unique(s.layouts[buf]) if x > 0]
    unit = math.gcd(count, *sizes) if sizes else count
    if unit <= 0:
        return None
    return max(int(t.max(initial=0)) // unit for t in totals)


def _exact_form(schedule: Schedule, pad: bool) -> tuple[Schedule, UnitFacts]:
    s = schedule
    count = entry_count(s)
    padded = False
    for buf in (Buf.INPUT, Buf.OUTPUT):
        totals = s.chunk_starts(buf)[:, -1]
        if (totals != totals[0]).any():
            if not pad:
                raise NotExpressible(
                    f"the {buf.name.lower()} buffers of the ranks differ in size "
                    f"({int(totals.min())} to {int(totals.max())} elements, a non-uniform "
                    "alltoall); MSCCL's alltoall needs one size for every rank (it has no "
                    "alltoallv): use the NCCL library (--emit nccl), which pads every rank's "
                    "buffers to the largest")
            padded = True
    if padded:
        count = padded_count(s)
    sizes = [int(x) for buf in Buf for x in np.unique(s.chunk_elems(buf)) if x > 0]
    unit = math.gcd(count, *sizes) if sizes else count
    if unit <= 0:
        raise ScheduleError("the schedule moves no data")
    layouts = []
    for buf in Buf:
        totals = s.chunk_starts(buf)[:, -1] // unit
        layouts.append(_unit_layout(totals, np.full(int(totals.max(initial=0)), unit)))
    src_e, dst_e = _element_offsets(s)
    return (_with_ops(s, layouts, src_e // unit, dst_e // unit, s.op_elems() // unit),
            UnitFacts(unit=unit, count_units=count // unit, padded=padded))


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

    def elems(self, n_units: int) -> np.ndarray:
        """Elements of atoms 0 .. n_units - 1."""
        u = np.arange(n_units + 1, dtype=np.int64)
        starts = (u // self.k) * self.count + self.points[u % self.k]
        return np.diff(starts)

    def inside(self, lo: int, hi: int) -> np.ndarray:
        """Every atom boundary in [lo, hi], as element offsets."""
        c = self.count
        blocks = np.arange(lo // c, hi // c + 1, dtype=np.int64)
        e = (blocks[:, None] * c + self.points[None, :]).ravel()
        return e[(e >= lo) & (e <= hi)]


def _near_form(schedule: Schedule, max_units: int, whole_blocks: bool = False
               ) -> tuple[Schedule, UnitFacts] | None:
    """The near-equal form of :func:`to_units`, or None when the schedule has none (or, with
    ``whole_blocks``, when some op moves data by other than whole blocks)."""
    s = schedule
    count = entry_count(s)
    raws = [s.chunk_starts(buf) for buf in Buf]
    atoms = _Atoms(np.concatenate([r.ravel() for r in raws]), count)
    if max(int(atoms.units(r[:, -1].max())) for r in raws) > max_units:
        return None
    elems = s.op_elems()
    src_e, dst_e = _element_offsets(s)
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
    convention = 0
    atom = np.arange(k, dtype=np.int64)
    if not ((dst_off - src_off) % k).any():
        if np.array_equal(atoms.points, atom * count // k):
            convention = 1
        elif np.array_equal(atoms.points, atom * (count // k) + np.minimum(atom, count % k)):
            convention = 2
    layouts = []
    for raw in raws:
        totals = atoms.units(raw[:, -1])
        layouts.append(_unit_layout(totals, atoms.elems(int(totals.max(initial=0)))))
    return (_with_ops(s, layouts, src_off, dst_off, cnt),
            UnitFacts(unit=count // k, count_units=k, exact=False, split=convention))
