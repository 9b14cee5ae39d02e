"""What every code-emitting backend shares: options, C names, and an entry point's ``count``.

Backends never change the IR. The ones that emit code read a schedule re-expressed in equal
units by the pass :func:`backends.units.to_units`; the NCCL and MPI builds turn that into
per-rank dataflow tables with :func:`backends.nccl.tables.dataflow_tables`.
"""

from __future__ import annotations

import os
import pathlib
import re
from collections.abc import Iterable
from dataclasses import dataclass, fields

from cclc.collective import CollectiveKind
from cclc.errors import ScheduleError
from cclc.ir import Buf, Schedule

__all__ = [
    "MSCCL_RUNTIMES",
    "EmitOptions",
    "c_identifier",
    "coerce_options",
    "count_convention",
    "entry_count",
    "is_padded",
    "padded_count",
    "render_template",
    "write_file",
]

#: the MSCCL runtimes whose XML dialect the msccl backend can write
MSCCL_RUNTIMES = ("msccl", "msccl-executor", "rccl")
_PROTOCOLS = ("Simple", "LL", "LL128")


@dataclass(frozen=True, slots=True)
class EmitOptions:
    """Options shared by the backends (the CLI fills them; every field has a safe default).

    ``msccl_runtime``: which runtime's XML dialect and limits (``msccl`` = microsoft/msccl,
    ``msccl-executor`` = Azure/msccl-executor-nccl, ``rccl``). ``protocol``: MSCCL ``proto``.
    ``nchannels``: channels the MSCCL lowering may spread concurrent messages over (``None``:
    as many as it needs up to the runtime limit). ``fuse``: emit fused MSCCL instructions.
    ``min_bytes``/``max_bytes``: the MSCCL size window (``None``: the runtime's widest).
    ``nthreads``: MSCCL ``nthreads`` attribute (``None``: omitted, runtime default).
    ``build``: run the generated build after writing the sources. ``mpi``: also emit and build
    the MPI (CPU) variant. ``nccl_home``: a folder with ``include/nccl.h`` and ``lib/libnccl.so.2``
    (``None``: the ``nvidia-nccl-cu13`` wheel). ``cuda_arch``: nvcc ``-arch`` value.
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

    def __post_init__(self) -> None:
        if self.msccl_runtime not in MSCCL_RUNTIMES:
            raise ScheduleError(f"unknown MSCCL runtime '{self.msccl_runtime}': choose one of "
                                + ", ".join(MSCCL_RUNTIMES))
        if self.protocol not in _PROTOCOLS:
            raise ScheduleError(f"unknown MSCCL protocol '{self.protocol}': choose one of "
                                + ", ".join(_PROTOCOLS))
        if self.nchannels is not None and self.nchannels < 1:
            raise ScheduleError(f"nchannels must be >= 1, not {self.nchannels}")
        if self.nthreads is not None and (self.nthreads <= 0 or self.nthreads % 32):
            raise ScheduleError(f"nthreads must be a positive multiple of 32, not {self.nthreads}")


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
    import jinja2

    env = _ENVS.get(package)
    if env is None:
        env = jinja2.Environment(loader=jinja2.PackageLoader(package, "templates"),
                                 undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                                 trim_blocks=True, lstrip_blocks=True, autoescape=False)
        _ENVS[package] = env
    return env.get_template(template).render(**values)


_ENVS: dict = {}


def coerce_options(options) -> EmitOptions:
    """``options`` as :class:`EmitOptions`: the CLI may pass its own options object; the fields
    it shares by name with :class:`EmitOptions` are taken, the rest keep their defaults."""
    if options is None:
        return EmitOptions()
    if isinstance(options, EmitOptions):
        return options
    values = {f.name: getattr(options, f.name) for f in fields(EmitOptions)
              if getattr(options, f.name, None) is not None}
    return EmitOptions(**values)


def write_file(outdir, name: str, text: str | Iterable[str]) -> pathlib.Path:
    """Write ``text`` (or its pieces, as they come) to ``outdir/name`` and return the path.
    ``outdir`` is a folder path or a :class:`cclc.outdir.OutputDir` (then its manifest and
    overwrite rules apply)."""
    if hasattr(outdir, "path_for") and hasattr(outdir, "write_text"):
        rel = outdir.write_text(name, text)
        return pathlib.Path(outdir.path) / rel
    path = pathlib.Path(os.fspath(outdir)) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        f.writelines([text] if isinstance(text, str) else text)
    return path
