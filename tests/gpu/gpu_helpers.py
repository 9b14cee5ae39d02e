"""Running generated NCCL code on one GPU with several processes.

NCCL refuses two ranks of one communicator on one GPU of one host, but accepts them when each
process claims its own host with ``NCCL_HOSTID``; the ranks then talk over NCCL's socket
transport on the loopback interface. ``NCCL_COMM_ID`` gives every rank the same bootstrap
address (rank 0 listens there), so no MPI is needed to share the unique id.
"""

from __future__ import annotations

import itertools
import os
import pathlib
import re
import shutil
import socket
import subprocess

import numpy as np
from backend_helpers import NP_TYPES, check_outputs, write_exact_inputs

from backends.common import EmitOptions, entry_count
from backends.nccl import emit
from backends.nccl.build import cuda_home, nccl_home
from backends.units import buffer_units, to_units
from cclc.collective import CollectiveKind, DType
from cclc.ir import Buf, Schedule

HARNESS = pathlib.Path(__file__).with_name("harness.cu")


def why_no_gpu() -> str | None:
    """Why the GPU tier cannot run here, or ``None`` when it can."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return "no NVIDIA GPU (nvidia-smi is not installed)"
    try:
        listed = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=60,
                                check=False).stdout
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"nvidia-smi -L failed: {err}"
    if "GPU " not in listed:
        return "no NVIDIA GPU (nvidia-smi -L lists none)"
    if shutil.which("nvcc") is None and not (pathlib.Path(cuda_home()) / "bin" / "nvcc").exists():
        return "no nvcc (CUDA toolkit) to build the libraries"
    return None


_PORTS = itertools.count()


def free_port() -> int:
    """A port for rank 0's bootstrap that no other test of this session is given: from
    20000 up to the kernel's ephemeral range (32768: no ``bind(0)`` elsewhere lands there),
    split into one block per pytest-xdist worker, never the same twice in one worker, and
    free when asked."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    index = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:])
    block = (32768 - 20000) // workers
    base = 20000 + index * block
    for _ in range(block):
        port = base + next(_PORTS) % block
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError(f"no free port in {base}..{base + block - 1}")


def rank_env(rank: int, port: int, **extra: str) -> dict[str, str]:
    """The environment of rank ``rank`` of a communicator whose ranks share one GPU."""
    env = dict(os.environ)
    env.update(NCCL_HOSTID=f"cclc-gpu-tier-{rank}", NCCL_SOCKET_IFNAME="lo",
               NCCL_IB_DISABLE="1", NCCL_COMM_ID=f"127.0.0.1:{port}", **extra)
    return env


def run_ranks(argvs: list[list[str]], envs: list[dict[str, str]], timeout: float = 300):
    """Start one process per rank, wait for all; return their (status, stdout, stderr)."""
    procs = [subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for argv, env in zip(argvs, envs, strict=True)]
    results = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise AssertionError("the ranks did not finish (a hang?)") from None
        results.append((p.returncode, out, err))
    return results


def build_harness(folder: pathlib.Path) -> pathlib.Path:
    """Compile harness.cu against the library built in ``folder``."""
    ident = next(folder.glob("cclc_*_schedule.h")).name[len("cclc_"):-len("_schedule.h")]
    home = nccl_home()
    nvcc = shutil.which("nvcc") or str(pathlib.Path(cuda_home()) / "bin" / "nvcc")
    exe = folder / "gpu_harness"
    subprocess.run([nvcc, "-O2", "-std=c++17", "--Werror", "all-warnings", str(HARNESS),
                    "-o", str(exe), f"-I{folder}", f"-I{home}/include",
                    f'-DCCLC_HEADER="cclc_{ident}.h"', f"-DCCLC_FN=cclc_{ident}",
                    f"-DCCLC_RELEASE=cclc_{ident}_release",
                    f"-L{folder}", f"-lcclc_{ident}", f"-L{home}/lib", "-l:libnccl.so.2",
                    f"-Xlinker=-rpath,{folder}:{home}/lib"], check=True, capture_output=True)
    return exe


def nccl_version() -> tuple[int, int, int]:
    """The (major, minor, patch) of the ``nccl.h`` the libraries are built against."""
    text = (pathlib.Path(nccl_home()) / "include" / "nccl.h").read_text(errors="replace")
    major, minor, patch = (int(re.search(rf"#define NCCL_{part}\s+(\d+)", text).group(1))
                           for part in ("MAJOR", "MINOR", "PATCH"))
    return major, minor, patch


def inplace_offsets(kind: CollectiveKind, rank: int, in_bytes: int, out_bytes: int
                    ) -> tuple[int, int]:
    """Where an in-place call of ``rank`` puts its input and its output in its one buffer
    (bytes), as NCCL lays them out: allgather's input is the rank's slice of the output,
    reducescatter's output the rank's slice of the input, others share the buffer whole."""
    return (rank * in_bytes if kind is CollectiveKind.ALLGATHER else 0,
            rank * out_bytes if kind is CollectiveKind.REDUCESCATTER else 0)


def run_harness(exe: pathlib.Path, coll, dtype: DType, count: int, in_elems: int,
                out_elems: int, workdir: pathlib.Path, inplace: bool = False, seed: int = 0,
                **env: str) -> tuple[list[tuple[int, str, str]], list[np.ndarray], pathlib.Path]:
    """Run ``exe`` (:func:`build_harness`) with one process per rank on GPU 0 on random
    small-integer inputs of ``in_elems`` elements (``env``: more environment for every rank);
    returns each rank's (status, stdout, stderr), the inputs and the folder of the buffers,
    for :func:`backend_helpers.check_outputs`."""
    code = NP_TYPES[dtype][1]
    data = workdir / "data"
    inputs = write_exact_inputs(coll, dtype, in_elems, seed, data)
    in_bytes, out_bytes = in_elems * dtype.itemsize, out_elems * dtype.itemsize
    port = free_port()
    argvs, envs = [], []
    for r in range(coll.n):
        shared, (in_at, out_at) = 0, (0, 0)
        if inplace:
            shared = max(in_bytes, out_bytes)
            in_at, out_at = inplace_offsets(coll.kind, r, in_bytes, out_bytes)
        argvs.append([str(exe), str(data), str(count), str(code), str(r), str(coll.n),
                      str(in_bytes), str(out_bytes), str(shared), str(in_at), str(out_at)])
        envs.append(rank_env(r, port, **env))
    return run_ranks(argvs, envs), inputs, data


def run_gpu(schedule: Schedule, workdir: pathlib.Path, dtype: DType | None = None,
            inplace: bool = False, scale: int = 1, seed: int = 0, api: str = "lanes") -> None:
    """Build the library (``api``: its lanes or its one-sided form), run it with one process
    per rank on GPU 0 on random small-integer inputs of ``scale`` times the compiled count, and
    compare every output with numpy."""
    coll = schedule.collective
    folder = emit(schedule, workdir, EmitOptions(build=True), api=api)[0].parent
    exe = build_harness(folder)
    units, us = to_units(schedule, split=True)
    widths = buffer_units(units)
    count = (us.count_units * us.unit if us.exact else entry_count(schedule)) * scale
    in_elems = (widths[Buf.INPUT] // us.count_units * count if us.split
                else widths[Buf.INPUT] * (count // us.count_units))
    out_elems = (widths[Buf.OUTPUT] // us.count_units * count if us.split
                 else widths[Buf.OUTPUT] * (count // us.count_units))
    dtype = dtype or coll.dtype
    results, inputs, data = run_harness(exe, coll, dtype, count, in_elems, out_elems, workdir,
                                        inplace=inplace, seed=seed)
    for r, (status, out, err) in enumerate(results):
        assert status == 0, f"rank {r} exited with {status}:\n{out}\n{err}"
    check_outputs(coll, dtype, inputs, data)


def one_gpu_mpirun(n: int, argv: list[str], **env: str) -> list[str]:
    """An mpirun command line whose ranks share one GPU (each sets its own NCCL_HOSTID)."""
    mpirun = shutil.which("mpirun")
    assert mpirun is not None, "mpirun is not installed"
    exports = []
    for key, value in {"NCCL_SOCKET_IFNAME": "lo", "NCCL_IB_DISABLE": "1", **env}.items():
        exports += ["-x", f"{key}={value}"]
    wrapper = ('NCCL_HOSTID="cclc-gpu-tier-${OMPI_COMM_WORLD_RANK:-$PMI_RANK}" '
               'exec "$0" "$@"')
    return [mpirun, "--allow-run-as-root", "--oversubscribe", "-np", str(n), *exports,
            "sh", "-c", wrapper, *argv]


__all__ = ["build_harness", "free_port", "inplace_offsets", "nccl_version", "one_gpu_mpirun",
           "rank_env", "run_gpu", "run_harness", "run_ranks", "why_no_gpu"]
