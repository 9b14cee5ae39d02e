"""The NCCL tuner backend: C source of a tuner + profiler plugin carrying a tuned table.

:data:`BACKEND` renders ``plugin.c`` and a ``Makefile`` from the templates beside this file and,
with ``options.build``, its build step compiles ``libnccl-tuner-cclc.so`` with ``gcc -Wall -Wextra
-Werror -fPIC -shared`` after the pipeline wrote the sources (:func:`emit` does both). The rows come
from :func:`cclc.tuning.outputs.plugin_rows`: plain dicts with ``func, n_ranks, n_nodes, min_bytes,
max_bytes, algo, proto, channels, chunk, measured``. The plugin exports ``ncclTunerPlugin_v6`` …
``_v2`` and ``ncclProfiler_v6``/``_v5``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import jinja2

from backends.contract import Backend, EmitOptions, Facts, TunerRows
from backends.write import write_backend
from cclc.errors import CclError

if TYPE_CHECKING:
    from cclc.execution import ExecutionModel

__all__ = [
    "BACKEND",
    "CFLAGS",
    "LDFLAGS",
    "LIBRARY",
    "PROFILER_SYMBOLS",
    "TUNER_SYMBOLS",
    "TunerBackend",
    "build",
    "emit",
    "render",
]

LIBRARY = "libnccl-tuner-cclc.so"
CFLAGS = "-O2 -std=c11 -D_DEFAULT_SOURCE -Wall -Wextra -Werror -fPIC -shared -fvisibility=hidden"
LDFLAGS = "-lpthread"
TUNER_SYMBOLS = tuple(f"ncclTunerPlugin_v{v}" for v in (6, 5, 4, 3, 2))
PROFILER_SYMBOLS = ("ncclProfiler_v6", "ncclProfiler_v5")
_ROW_KEYS = ("func", "n_ranks", "n_nodes", "min_bytes", "max_bytes", "algo", "proto",
             "channels", "chunk", "measured")

_ENV = jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).parent),
                          undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                          autoescape=False)


def _check_rows(rows: Sequence[Mapping[str, int]]) -> list[dict]:
    out = []
    for i, r in enumerate(rows):
        missing = [k for k in _ROW_KEYS if k not in r]
        if missing:
            raise CclError(f"tuner row {i} lacks {', '.join(missing)}")
        row = {k: int(r[k]) for k in _ROW_KEYS}
        if not 0 <= row["func"] <= 4 or not 0 <= row["algo"] <= 6 or not 0 <= row["proto"] <= 2:
            raise CclError(f"tuner row {i} has an out-of-range function/algorithm/protocol")
        if row["min_bytes"] > row["max_bytes"] or row["min_bytes"] < 0:
            raise CclError(f"tuner row {i}: byte range {row['min_bytes']}..{row['max_bytes']} "
                           "is empty")
        if not 0 <= row["channels"] <= 64 or row["chunk"] < 0:
            raise CclError(f"tuner row {i}: channels must be 0..64 and chunk >= 0")
        if row["measured"] not in (0, 1):
            raise CclError(f"tuner row {i}: measured must be 0 (model) or 1 (measured)")
        if not row["measured"] and (row["channels"] or row["chunk"]):
            raise CclError(f"tuner row {i} comes from a model: it may choose the algorithm "
                           "and protocol only, not channels or chunk")
        out.append(row)
    return out


def render(rows: Sequence[Mapping[str, int]]) -> dict[str, str]:
    """``{"plugin.c": ..., "Makefile": ...}`` for ``rows``."""
    checked = _check_rows(rows)
    return {"plugin.c": _ENV.get_template("plugin.c.j2").render(rows=checked),
            "Makefile": _ENV.get_template("Makefile.j2").render(cflags=CFLAGS, ldflags=LDFLAGS)}


def build(source_dir: str | os.PathLike, cc: str | None = None, extra_flags: Sequence[str] = (),
          output: str | os.PathLike | None = None) -> Path:
    """Compile ``plugin.c`` in ``source_dir`` into ``output`` (default: the library there).

    Uses the flags of the generated Makefile; raises :class:`CclError` with the compiler's
    messages when it fails or when no C compiler is found.
    """
    cc = cc or os.environ.get("CC") or "gcc"
    if shutil.which(cc) is None:
        raise CclError(f"no C compiler '{cc}' to build {LIBRARY} (install gcc, or use --no-build "
                       "and run make where one exists)")
    src = Path(source_dir) / "plugin.c"
    target = Path(output) if output is not None else Path(source_dir) / LIBRARY
    argv = [cc, *CFLAGS.split(), *extra_flags, f"-Wl,-soname,{LIBRARY}", "-o", str(target),
            str(src), *LDFLAGS.split()]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise CclError(f"building {LIBRARY} failed ({' '.join(argv)}):\n{done.stderr.strip()}")
    return target


class TunerBackend:
    """The tuner + profiler plugin of a table of NCCL parameters (``cclc tune``)."""

    name = "tuner"
    wants_simulation = False
    renders_symmetric = False
    own_nics = False
    #: the plugin picks NCCL's own algorithms: it runs no schedule of cclc's
    execution_model: ExecutionModel | None = None
    #: its subject is a table of parameters, not a schedule
    seconds_per_op = 0.0

    def files(self, key: TunerRows, options: EmitOptions) -> tuple[str, ...]:
        return ("plugin.c", "Makefile") + ((LIBRARY,) if options.build else ())

    def render(self, subject: TunerRows, options: EmitOptions, facts: Facts
               ) -> dict[str, str | bytes]:
        return dict(render(subject))

    def refusal(self, subject: TunerRows, options: EmitOptions) -> str | None:
        """Every table of rows has a plugin."""
        return None

    def build(self, folder: Path, key: TunerRows, options: EmitOptions) -> list[str]:
        if not options.build:
            return []
        build(folder, cc=options.cc)
        # keep the library executable like a linker's output (it is, but a umask may differ)
        try:
            os.chmod(Path(folder) / LIBRARY, 0o755)
        except OSError:
            pass                  # the library still loads with dlopen without the x bit
        return [LIBRARY]


BACKEND: Backend[TunerRows, TunerRows] = TunerBackend()


def emit(rows: TunerRows, outdir, build_library: bool = True, cc: str | None = None
         ) -> list[str]:
    """Write ``plugin.c`` and ``Makefile`` (and, with ``build_library``, build the ``.so``)
    into ``outdir`` -- a :class:`cclc.outdir.OutputDir` or a folder path -- through the
    pipeline's writer; returns the names written."""
    paths = write_backend(BACKEND, rows, rows, outdir, EmitOptions(build=build_library, cc=cc))
    return [p.name for p in paths]
