"""The MSCCL lowering's data: the ops it starts from (:class:`Op`), the MSCCL steps it builds
(:class:`Instr`) in their threadblocks (:class:`Threadblock`), the result (:class:`Lowered`), and
the errors that name a runtime limit the schedule does not fit. The stages that fill them in
are listed in :mod:`backends.msccl.lower`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from cclc.errors import ScheduleError
from cclc.ir import Buf, OpKind

__all__ = ["DepidLimitError", "Instr", "LimitError", "Lowered", "Op", "StepLimitError",
           "Threadblock", "ThreadblockLimitError", "assigned"]


class LimitError(ScheduleError):
    """The schedule does not fit a limit of the runtime (the message names it).
    ``channels``: how many channels the lowering that failed could use (None: not known)."""

    channels: int | None = None


class ThreadblockLimitError(LimitError):
    """A GPU needs ``needed`` threadblocks, more than the runtime allows."""

    def __init__(self, message: str, needed: int):
        super().__init__(message)
        self.needed = needed


class StepLimitError(LimitError):
    """A threadblock needs more steps than the runtime allows; ``local``: it is one of the
    threadblocks of local copies and reductions (no peer)."""

    def __init__(self, message: str, local: bool):
        super().__init__(message)
        self.local = local


class DepidLimitError(ThreadblockLimitError):
    """Steps of a GPU (with ``needed`` threadblocks) wait on more threadblocks than an int8
    ``depid`` can name."""


class Op(NamedTuple):
    """An op in units after input relocation; ``ir`` is its row in the schedule (None for
    the copies that relocate the input, which run at step -1, before the schedule). A named
    tuple, not a frozen dataclass: there is one per op, and a tuple is cheaper to build."""

    ir: int | None
    step: int
    src: int
    dst: int
    kind: OpKind
    sb: Buf
    so: int
    db: Buf
    do: int
    cnt: int


@dataclass(slots=True)
class Instr:
    """One MSCCL step before numbering; ``key`` orders ties in the topological sort."""

    rank: int
    type: str
    sb: Buf
    so: int | None               # None: a nop, which names no data
    db: Buf
    do: int | None
    cnt: int
    key: tuple
    send: int | None = None      # send peer it needs (its tb's)
    recv: int | None = None      # recv peer it needs
    chan: int = 0
    tb: int | None = None        # set by stage 4
    pos: int | None = None       # index in the global order (stage 5)
    index: int | None = None     # step index in its tb (final after stage 6)
    depid: int | None = None     # the tb it waits on, and that tb's step (stage 6)
    deps: int | None = None
    hasdep: bool = False
    uid: int | None = None       # index in the list of all instructions


@dataclass(slots=True)
class Threadblock:
    """One MSCCL threadblock of a GPU: its peers (None: it sends, or receives, nothing),
    channel and steps. Stages 4 and 6 build it up; :class:`Lowered` hands it out."""

    id: int
    send: int | None
    recv: int | None
    chan: int
    steps: list[Instr] = field(default_factory=list)


@dataclass(frozen=True, eq=False)
class Lowered:
    """The lowered program: per GPU its tbs (ids dense from 0) and buffer sizes in units."""

    tbs: tuple[tuple[Threadblock, ...], ...]
    units: tuple[int, int, int]
    scratch: tuple[int, ...]     # s_chunks of each GPU
    nchannels: int
    n_fused: int


def assigned(value: int | None) -> int:
    """A number an earlier stage has set (an internal error otherwise)."""
    if value is None:
        raise ScheduleError("internal: the MSCCL lowering used a number before setting it")
    return value
