"""Writing one backend's files: render, check the names against what it declared, write
through :class:`cclc.outdir.OutputDir` (atomic, manifest, lock), then build. The pipeline
writes every output with :func:`write_outputs`; the backends' ``emit`` functions, for callers
outside the pipeline, are :func:`write_backend`. It sits with the backends (below the
pipeline) so that a backend's ``emit`` imports nothing above it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from backends.contract import Backend, EmitOptions, Facts
from cclc.errors import ScheduleError
from cclc.outdir import OutputDir

__all__ = ["write_backend", "write_outputs"]


def write_outputs(backend: Backend[Any, Any], key: Any, subject: Any, out: OutputDir,
                  options: EmitOptions, facts: Facts) -> list[str]:
    """Render ``backend``'s files for ``subject``, write them into ``out``, then run its build
    step; returns the names written and built. Every name must be one the backend declared
    (:meth:`~backends.contract.Backend.files`): that list is what the foreign-file check sees."""
    declared = backend.files(key, options)
    contents = backend.render(subject, options, facts)
    undeclared = [name for name in contents if name not in declared]
    if undeclared:
        raise ScheduleError(f"backend {backend.name} rendered files it did not declare: "
                            f"{', '.join(undeclared)} (a bug in the backend)")
    # text in pieces (an iterable) is written as it is produced, never held whole
    written = [out.write_bytes(name, data) if isinstance(data, bytes)
               else out.write_text(name, data) for name, data in contents.items()]
    built = backend.build(out.path, key, options)
    out.adopt(built)
    return written + built


def write_backend(backend: Backend[Any, Any], key: Any, subject: Any,
                  outdir: str | os.PathLike | OutputDir, options: EmitOptions | None = None,
                  facts: Facts | None = None) -> list[Path]:
    """:func:`write_outputs` into a folder path or an :class:`OutputDir` (after refusing the
    backend's declared files that cclc did not write); returns paths. The backends' ``emit``
    functions are this, for callers outside the pipeline."""
    options = options or EmitOptions()
    out = outdir if isinstance(outdir, OutputDir) else OutputDir(outdir)
    with out:
        out.refuse_foreign(list(backend.files(key, options)))
        names = write_outputs(backend, key, subject, out, options, facts or Facts())
    return [out.path / name for name in names]
