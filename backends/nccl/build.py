"""Running the generated build: where NCCL and CUDA are, and ``make`` in the output folder."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess

from backends.common import EmitOptions
from cclc.errors import CclError

__all__ = ["TARGET_FILES", "BuildError", "build", "cuda_home", "nccl_home"]


class BuildError(CclError):
    """The generated code did not build (the message carries the compiler's complaint)."""


def nccl_home(options: EmitOptions | None = None) -> str:
    """A folder with ``include/nccl.h`` and ``lib/libnccl.so.2``: ``options.nccl_home``, else
    ``$NCCL_HOME``, else the ``nvidia-nccl-cu13`` wheel (``pip install cclc[nccl]``)."""
    if options is not None and options.nccl_home:
        return options.nccl_home
    if os.environ.get("NCCL_HOME"):
        return os.environ["NCCL_HOME"]
    try:
        # optional dependency: present only where it is installed
        import nvidia.nccl as wheel  # a namespace package: no __file__
    except ImportError:
        raise BuildError("NCCL headers not found: pip install 'cclc[nccl]' (the "
                         "nvidia-nccl-cu13 wheel) or set NCCL_HOME") from None
    for path in wheel.__path__:
        if (pathlib.Path(path) / "include" / "nccl.h").exists():
            return str(path)
    raise BuildError("the nvidia.nccl package has no include/nccl.h; set NCCL_HOME")


def cuda_home() -> str:
    """``$CUDA_HOME``, else the folder above the ``nvcc`` on PATH, else /usr/local/cuda."""
    if os.environ.get("CUDA_HOME"):
        return os.environ["CUDA_HOME"]
    nvcc = shutil.which("nvcc")
    if nvcc:
        real = pathlib.Path(nvcc).resolve()
        # a wrapper script (not the real binary) may sit on PATH: prefer a real install
        if real.parent.name == "bin" and (real.parent.parent / "include").is_dir():
            return str(real.parent.parent)
    return "/usr/local/cuda"


#: make target -> the files it produces (``{ident}`` is the collective's C name)
TARGET_FILES = {"all": "libcclc_{ident}.so", "mpi": "cclc_{ident}_mpitest",
                "perf": "cclc_{ident}_perf", "mpiperf": "cclc_{ident}_mpiperf"}


def build(folder: pathlib.Path, targets: list[str], options: EmitOptions | None = None,
          timeout: float = 600.0) -> list[pathlib.Path]:
    """Run ``make`` for ``targets`` in ``folder``; return the built files.

    :class:`BuildError` (with the end of the compiler output) when a tool is missing or the
    build fails.
    """
    folder = pathlib.Path(folder)
    if shutil.which("make") is None:
        raise BuildError("cannot build: 'make' is not installed")
    ident = next(folder.glob("cclc_*_schedule.h")).name[len("cclc_"):-len("_schedule.h")]
    env = dict(os.environ)
    if {"all", "perf"} & set(targets):
        env.setdefault("NCCL_HOME", nccl_home(options))
        nvcc = pathlib.Path(cuda_home()) / "bin" / "nvcc"
        if not nvcc.exists() and shutil.which("nvcc") is None:
            raise BuildError("cannot build the NCCL library: nvcc (CUDA) is not installed; "
                             "set CUDA_HOME or build on a machine with CUDA")
        if not nvcc.exists():
            env["NVCC"] = shutil.which("nvcc") or "nvcc"
    mpi_targets = {"mpi", "perf", "mpiperf"} & set(targets)
    if mpi_targets and shutil.which(env.get("MPICXX", "mpicxx")) is None:
        raise BuildError("cannot build the MPI driver: mpicxx is not installed "
                         "(apt-get install openmpi-bin libopenmpi-dev)")
    try:
        proc = subprocess.run(["make", "-C", str(folder), *targets], env=env,
                              capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise BuildError(f"the build in {folder} took longer than {timeout:.0f} s") from None
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-30:])
        raise BuildError(f"the build in {folder} failed (make {' '.join(targets)}):\n{tail}")
    return [folder / TARGET_FILES[t].format(ident=ident) for t in targets]
