"""The contract between the pipeline and a backend: one options type, the facts, the protocol.

A backend never writes. It says which files it will write (:meth:`Backend.files`, from what is
known before anything is planned, so the pipeline can refuse to clobber a file cclc did not
write before any long work starts) and renders their contents (:meth:`Backend.render`); the
pipeline (:mod:`cclc.pipeline`) writes them through :class:`cclc.outdir.OutputDir`. A file
too big to hold whole in memory (a large schedule's MSCCL XML) is rendered as an iterable of
text pieces, produced lazily: the pipeline writes each piece as it comes. A backend
whose sources need a build step (the NCCL library, the tuner plugin) builds them in
:meth:`Backend.build`, after the pipeline wrote them.

Everything the planner needs to know about an output hangs on its backend too: the execution
model of the runtime it emits for (:attr:`Backend.execution_model`, what ``auto`` prices the
candidates with), what rendering costs per op (:attr:`Backend.seconds_per_op`, what ``auto``'s
synthesis candidate budgets for) and the limits it can check before rendering
(:meth:`Backend.refusal`, asked of ``auto``'s fastest candidate, and of the next where
refused). This module imports no backend: each
backend checks the options that only it reads (the MSCCL runtime's name is checked by
``backends.msccl``).

A schedule backend's key is the :class:`~cclc.collective.Collective` (file names depend on its
name only) and its subject the verified :class:`~cclc.ir.Schedule`; the tuner's key and subject
are both its table of rows.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from cclc.errors import ScheduleError

if TYPE_CHECKING:
    from cclc.bounds import Bounds
    from cclc.execution import ExecutionModel
    from cclc.nccl_comparison import NcclComparison
    from cclc.plan import Candidate
    from cclc.sim import SimResult
    from cclc.symmetric import ExceptedSchedule, SymmetricSchedule

__all__ = ["Backend", "Contents", "EmitOptions", "Facts", "TunerRows", "symmetric_refusal"]

_PROTOCOLS = ("Simple", "LL", "LL128")

#: the tuner backend's subject: rows of ``func, n_ranks, n_nodes, min_bytes, max_bytes, algo,
#: proto, channels, chunk, measured`` (see :mod:`backends.tuner`)
TunerRows = Sequence[Mapping[str, int]]

#: a rendered file: its text, its bytes, or its text in pieces (a lazy iterable, consumed once
#: as the pipeline writes it; pieces already encoded may be bytes)
Contents = str | bytes | Iterable[str] | Iterable[bytes]

Key = TypeVar("Key", contravariant=True)
Subject = TypeVar("Subject", contravariant=True)


@dataclass(frozen=True, slots=True)
class EmitOptions:
    """The one options type of every backend (the CLI fills it; every field has a safe default).

    ``msccl_runtime``: which runtime's XML dialect and limits (``msccl`` = microsoft/msccl,
    ``msccl-executor`` = Azure/msccl-executor-nccl, ``rccl``; the keys of
    :data:`backends.msccl.runtimes.RUNTIMES`, checked by the MSCCL backend, the one output
    that reads it). ``protocol``: the MSCCL ``proto`` and the MSCCL++ plans' protocol.
    ``nchannels``: channels the MSCCL lowering may spread concurrent messages over (``None``:
    as many as it needs up to the runtime limit). ``fuse``: emit fused MSCCL instructions.
    ``min_bytes``/``max_bytes``: the MSCCL size window (``None``: the runtime's widest).
    ``nthreads``: MSCCL ``nthreads`` attribute (``None``: omitted, runtime default).
    ``build``: run the backend's build after the sources are written (the NCCL library, the
    tuner plugin). ``mpi``: also emit and build the MPI (CPU) variant. ``nccl_home``: a folder
    with ``include/nccl.h`` and ``lib/libnccl.so.2`` (``None``: the ``nvidia-nccl-cu13``
    wheel). ``cuda_arch``: nvcc ``-arch`` value. ``cc``: the C compiler of the tuner plugin
    (``None``: ``$CC``, else ``gcc``). ``nccl_lane_memory``: bytes per rank the NCCL
    library's lane buffers may take (``--nccl-lane-memory``; ``None``: the default,
    :data:`cclc.lane_cost.DEFAULT_LANE_MEMORY`), which its refusal asks before anything is
    rendered.
    """

    msccl_runtime: str = "msccl"
    protocol: str = "Simple"
    nchannels: int | None = None
    fuse: bool = True
    min_bytes: int | None = None
    max_bytes: int | None = None
    nthreads: int | None = None
    build: bool = False
    mpi: bool = False
    nccl_home: str | None = None
    cuda_arch: str = "sm_90"
    cc: str | None = None
    nccl_lane_memory: int | None = None

    def __post_init__(self) -> None:
        if self.protocol not in _PROTOCOLS:
            raise ScheduleError(f"unknown MSCCL protocol '{self.protocol}': choose one of "
                                + ", ".join(_PROTOCOLS))
        if self.nchannels is not None and self.nchannels < 1:
            raise ScheduleError(f"nchannels must be >= 1, not {self.nchannels}")
        if self.nthreads is not None and (self.nthreads <= 0 or self.nthreads % 32):
            raise ScheduleError(f"nthreads must be a positive multiple of 32, not {self.nthreads}")


@dataclass(frozen=True, slots=True)
class Facts:
    """What the pipeline knows about a schedule when a backend renders it, so that no backend
    recomputes it: ``bounds`` (:func:`cclc.bounds.bounds` of its collective), ``lockstep`` and
    ``event`` (:func:`cclc.sim.simulate` in each mode; ``None`` unless a backend asked for them
    with ``wants_simulation``), ``time`` (the planner's prediction under ``model``, the
    execution model it priced the choice with: what ``cclc compile`` prints),
    ``candidates`` (the planner's table) and ``nccl``
    (:func:`cclc.nccl_comparison.nccl_comparison` of that time: NCCL's predicted choice on the
    same machine; ``None`` where NCCL's tables have nothing to say)."""

    bounds: Bounds | None = None
    lockstep: SimResult | None = None
    event: SimResult | None = None
    time: float | None = None
    model: ExecutionModel | None = None
    candidates: tuple[Candidate, ...] = ()
    nccl: NcclComparison | None = None


class Backend(Protocol[Key, Subject]):
    """One output of cclc. ``name`` is what ``--emit`` takes; ``wants_simulation`` asks the
    pipeline for :attr:`Facts.lockstep` and :attr:`Facts.event`; ``execution_model`` is how
    the runtime the output is for executes a schedule (:mod:`cclc.execution`), the model
    ``auto`` prices the candidates with when this is the first such output of ``--emit``
    (``None``: the output runs nothing, as the schedule document or the page);
    ``renders_symmetric`` says that :meth:`render` also takes a schedule stored by symmetry
    (:class:`~cclc.symmetric.SymmetricSchedule`) as it is; any other output gets the expanded
    schedule, where it fits the size limit (:func:`symmetric_refusal`); ``seconds_per_op`` is
    what rendering a schedule (and the simulations it wants) costs per op, measured, which
    ``auto``'s synthesis candidate pays for within its budget
    (:func:`cclc.algorithms.tree_budget.auto_op_limit`); ``own_nics`` says that its runtime
    sends a GPU's messages between servers through that GPU's own NIC, relayed by no other
    GPU (MSCCL++'s port channels), so the planner routes them so
    (:func:`cclc.own_nics.own_nic_routes`)."""

    name: str
    wants_simulation: bool
    execution_model: ExecutionModel | None
    renders_symmetric: bool
    seconds_per_op: float
    own_nics: bool

    def files(self, key: Key, options: EmitOptions) -> tuple[str, ...]:
        """Every file (relative POSIX names) the backend will write for ``key``, including what
        its build makes when ``options.build``; known before anything is planned."""
        ...

    def render(self, subject: Subject, options: EmitOptions, facts: Facts
               ) -> Mapping[str, Contents]:
        """Name -> contents of every source file (a subset of :meth:`files`); nothing is
        written (an iterable of pieces may do its work as the pipeline consumes it).
        :class:`~cclc.errors.CclError` when the subject cannot take this output."""
        ...

    def refusal(self, subject: Subject, options: EmitOptions) -> str | None:
        """Why :meth:`render` would refuse ``subject``, found without rendering it, or
        ``None``; ``auto`` asks it of its fastest candidate, and of the next when refused. A
        limit found only while rendering is reported then. A backend without limits returns
        ``None``."""
        ...

    def build(self, folder: Path, key: Key, options: EmitOptions) -> list[str]:
        """After the sources are written into ``folder`` (the output folder), build them if
        ``options.build`` asks for it; returns the built files' names relative to ``folder``
        (``[]`` when there is nothing to build)."""
        ...


def symmetric_refusal(backend: Backend[Any, Any],
                      subject: SymmetricSchedule | ExceptedSchedule, max_ops: int
                      ) -> str | None:
    """Why ``backend`` cannot take the schedule stored by symmetry ``subject``: it needs every
    rank's ops (not ``renders_symmetric``) and the expanded schedule has more than ``max_ops``
    (the size check's limit); ``None`` when it renders the form itself or the expansion fits."""
    if backend.renders_symmetric or subject.expanded_ops() <= max_ops:
        return None
    return (f"the {backend.name} output needs every rank's ops, and this schedule is stored by "
            f"symmetry: expanded it has {subject.expanded_ops():,} ops, over cclc's limit of "
            f"{max_ops:,}; --emit json writes it in symmetric form")
