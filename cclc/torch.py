"""Run a cclc-generated NCCL library on PyTorch CUDA tensors.

PyTorch does not hand out the ``ncclComm_t`` of its process groups, so :class:`Communicator`
creates one NCCL communicator beside the default process group (its unique id travels over
that group) and :func:`load` opens ``nccl-<name>/libcclc_<name>.so``::

    import torch.distributed as dist
    from cclc.torch import Communicator, load

    dist.init_process_group("nccl")              # or "gloo": only the unique id travels on it
    comm = Communicator()                        # same ranks, same order as the process group
    grads = load("out/nccl-grads")               # cclc compile ... --emit nccl --build
    out = grads(x, comm=comm)                    # x: a CUDA tensor; returns the output tensor

MSCCL++ (microsoft/mscclpp) runs the plans of ``cclc compile ... --emit mscclpp`` instead, through
its NCCL-API library: an unchanged ``torch.distributed`` program, started with
:func:`mscclpp_environment` (``LD_PRELOAD=libmscclpp_nccl.so``), calls the plans that
:func:`register_mscclpp` registered before ``init_process_group``; :func:`mscclpp_plans` reads
which calls each plan serves.

torch is imported when these functions run, never when cclc is imported: cclc does not depend
on it (nor on MSCCL++'s Python package, imported by :func:`register_mscclpp` only). The library and
the communicator must use the same ``libnccl.so.2``; :func:`load` opens
the library first, so NCCL is the one its rpath names unless the process already loaded one
(PyTorch's), which the dynamic loader then shares.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Collective", "Communicator", "MscclppPlan", "load", "mscclpp_environment",
           "mscclpp_plans", "nccl_type", "register_mscclpp"]

#: ncclDataType_t by torch dtype name (uint32/uint64 exist in recent PyTorch only)
_NCCL_TYPES = {"int8": 0, "uint8": 1, "int32": 2, "uint32": 3, "int64": 4, "uint64": 5,
               "float16": 6, "float32": 7, "float64": 8, "bfloat16": 9}
_KINDS = ("alltoall", "allgather", "reducescatter", "allreduce", "broadcast", "reduce")


def nccl_type(dtype) -> int:
    """The ``ncclDataType_t`` of a torch dtype (``torch.float32`` -> 7)."""
    name = str(dtype).removeprefix("torch.")
    if name not in _NCCL_TYPES:
        raise TypeError(f"the cclc library takes {', '.join(_NCCL_TYPES)}; got {name}")
    return _NCCL_TYPES[name]


class _UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_byte * 128)]   # NCCL_UNIQUE_ID_BYTES


def _libnccl():
    # RTLD_GLOBAL: one NCCL for the communicator and the cclc library
    return ctypes.CDLL("libnccl.so.2", mode=ctypes.RTLD_GLOBAL)


class Communicator:
    """An NCCL communicator over the ranks of a ``torch.distributed`` process group.

    Rank i of the communicator is rank i of ``group`` (the default group if ``None``), on the
    current CUDA device. :meth:`close` (or the end of a ``with`` block) destroys it.
    """

    def __init__(self, group=None):
        # optional dependency: present only where it is installed
        import torch.distributed as dist

        nccl = _libnccl()
        self._nccl = nccl
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        uid = _UniqueId()
        if self.rank == 0:
            _check(nccl, nccl.ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId")
        box = [bytes(uid.internal)]
        src = 0 if group is None else dist.get_global_rank(group, 0)
        dist.broadcast_object_list(box, src=src, group=group)
        ctypes.memmove(uid.internal, box[0], 128)
        self.handle = ctypes.c_void_p()
        # release functions of the cclc libraries run on this communicator: each keeps lane
        # communicators split from it, which must go before it does
        self._releases: dict[str, Callable[..., int]] = {}
        _check(nccl, nccl.ncclCommInitRank(ctypes.byref(self.handle), self.size, uid,
                                           self.rank), "ncclCommInitRank")

    def close(self) -> None:
        if self.handle:
            for name, release in self._releases.items():
                _check(self._nccl, release(self.handle), f"cclc_{name}_release")
            self._releases.clear()
            self._nccl.ncclCommDestroy(self.handle)
            self.handle = ctypes.c_void_p()

    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@dataclass(frozen=True)
class Collective:
    """One generated collective: ``kind`` on ``n_ranks`` ranks, callable on CUDA tensors.

    The buffer sizes follow the generated headers: input and output hold ``in_units`` and
    ``out_units`` units of ``count / count_units`` elements, ``count`` in NCCL's convention.
    """

    name: str
    kind: str
    n_ranks: int
    root: int | None
    op: str | None
    count_units: int
    in_units: int
    out_units: int
    split: bool
    padded: bool
    library: Path
    _fn: Callable[..., int]
    _release: Callable[..., int]

    def count_of(self, numel: int) -> int:
        """The ``count`` argument for an input tensor of ``numel`` elements."""
        if self.padded:
            raise ValueError(f"'{self.name}' is a non-uniform alltoall: pass count= (the "
                             "largest buffer of any rank, see the generated header)")
        if self.kind in ("alltoall", "reducescatter"):
            return numel // self.n_ranks
        return numel

    def elements(self, count: int) -> tuple[int, int]:
        """Elements of the input and output buffers for ``count``."""
        def size(units: int) -> int:
            if self.split:
                return units // self.count_units * count
            return units * (count // self.count_units)
        return size(self.in_units), size(self.out_units)

    def __call__(self, input, output=None, *, comm: Communicator, count: int | None = None,
                 stream=None):
        """Run on ``input`` (a contiguous CUDA tensor) into ``output`` (allocated if ``None``;
        ``output is input`` runs in place) on ``stream`` (the current one by default)."""
        # optional dependency: present only where it is installed
        import torch

        if not input.is_cuda or not input.is_contiguous():
            raise ValueError("the input must be a contiguous CUDA tensor")
        if comm.size != self.n_ranks:
            raise ValueError(f"'{self.name}' runs on {self.n_ranks} ranks; the communicator "
                             f"has {comm.size}")
        count = self.count_of(input.numel()) if count is None else count
        if not self.split and count % self.count_units:
            raise ValueError(f"count {count} is not a multiple of {self.count_units}")
        in_elems, out_elems = self.elements(count)
        if input.numel() < in_elems:
            raise ValueError(f"the input has {input.numel()} elements; count {count} needs "
                             f"{in_elems}")
        if output is None:
            output = torch.empty(out_elems, dtype=input.dtype, device=input.device)
        elif output.numel() < out_elems or output.dtype != input.dtype or not output.is_cuda:
            raise ValueError(f"the output must be a CUDA tensor of {out_elems} {input.dtype} "
                             "elements")
        if stream is None:
            stream = torch.cuda.current_stream(input.device)
        rc = self._fn(ctypes.c_void_p(input.data_ptr()), ctypes.c_void_p(output.data_ptr()),
                      ctypes.c_size_t(count), ctypes.c_int(nccl_type(input.dtype)),
                      comm.handle, ctypes.c_void_p(stream.cuda_stream))
        comm._releases.setdefault(self.name, self._release)
        if rc != 0:
            _check(_libnccl(), rc, f"cclc_{self.name}")
        return output


def load(path: str | Path) -> Collective:
    """Open a generated library: its folder (``out/nccl-grads``) or ``libcclc_<name>.so``.

    The collective's kind, ranks and buffer layout are read from ``cclc_<name>_perf.h`` beside
    the library.
    """
    path = Path(path)
    folder = path if path.is_dir() else path.parent
    libs = [path] if path.is_file() else sorted(folder.glob("libcclc_*.so"))
    if len(libs) != 1:
        raise FileNotFoundError(f"no single libcclc_<name>.so in {folder}: build it with "
                                "cclc compile ... --emit nccl --build (or make)")
    lib_path = libs[0].resolve()
    ident = lib_path.name[len("libcclc_"):-len(".so")]
    header = (folder / f"cclc_{ident}_perf.h").read_text()
    consts = dict(re.findall(r"\b(k[A-Z]\w*) = (-?\w+)", header))
    kind = _KINDS[("ALLTOALL", "ALLGATHER", "REDUCESCATTER", "ALLREDUCE", "BROADCAST",
                   "REDUCE").index(consts["kKind"])]
    lib = ctypes.CDLL(str(lib_path), mode=ctypes.RTLD_GLOBAL)
    fn = getattr(lib, f"cclc_{ident}")
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                   ctypes.c_void_p, ctypes.c_void_p]
    release = getattr(lib, f"cclc_{ident}_release")
    release.restype = ctypes.c_int
    release.argtypes = [ctypes.c_void_p]
    root = int(consts["kRoot"])
    op_name = re.search(r'kOpName = "(\w+)"', header)
    if op_name is None:
        raise ValueError(f"cclc_{ident}_perf.h names no kOpName: generate it again with "
                         "cclc compile ... --emit nccl")
    op = op_name.group(1)
    return Collective(name=ident, kind=kind, n_ranks=int(consts["kRanks"]),
                      root=None if root < 0 else root, op=None if op == "none" else op,
                      count_units=int(consts["kCountUnits"]),
                      in_units=int(consts["kInUnits"]), out_units=int(consts["kOutUnits"]),
                      split=consts["kSplit"] != "0", padded=consts["kPadded"] == "true",
                      library=lib_path, _fn=fn, _release=release)


@dataclass(frozen=True, slots=True)
class MscclppPlan:
    """One MSCCL++ execution plan written by ``--emit mscclpp``, and the calls it serves.

    MSCCL++'s NCCL interface gives a call to the first registered plan that matches it
    (microsoft/mscclpp 1f5f065, ``src/ext/nccl/algorithm_selector.cc`` ``matchExecutionPlan``):
    the same collective, world size and ranks per node, buffer mode, and a size (the input's
    bytes; the output's for allgather) within ``[min_bytes, max_bytes]``. The loader also needs
    the size to be a multiple of ``granularity`` (``checkMessageSize``).
    """

    path: Path
    name: str
    collective: str
    inplace: bool
    protocol: str
    world_size: int
    granularity: int
    min_bytes: int
    max_bytes: int

    def serves(self, collective: str, nbytes: int, inplace: bool) -> bool:
        """Whether MSCCL++ runs a ``collective`` call of ``nbytes`` bytes (per rank's input;
        for allgather the gathered output) with this plan."""
        return (collective == self.collective and inplace == self.inplace
                and self.min_bytes <= nbytes <= self.max_bytes
                and nbytes % self.granularity == 0)


def mscclpp_plans(folder: str | Path) -> tuple[MscclppPlan, ...]:
    """The MSCCL++ plans in a ``cclc compile -o FOLDER --emit mscclpp`` folder, by name."""
    plans = []
    for path in sorted(Path(folder).glob("*.mscclpp.json")):
        doc = json.loads(path.read_text())
        gpu = doc["gpus"][0]
        chunks = gpu["output_chunks" if doc["collective"] == "allgather" else "input_chunks"]
        plans.append(MscclppPlan(
            path=path.resolve(), name=doc["name"], collective=doc["collective"],
            inplace=bool(doc["inplace"]), protocol=doc["protocol"],
            world_size=len(doc["gpus"]), granularity=int(doc["buffer_alignment"]) * chunks,
            min_bytes=int(doc["min_message_size"]), max_bytes=int(doc["max_message_size"])))
    if not plans:
        raise FileNotFoundError(f"no *.mscclpp.json plan in {folder}: write them with "
                                "cclc compile FILE --emit mscclpp -o FOLDER")
    return tuple(plans)


def mscclpp_environment(mscclpp_lib: str | Path, nccl_lib: str | Path | None = None
                        ) -> dict[str, str]:
    """The environment under which ``torchrun`` runs an unchanged program on MSCCL++:
    ``LD_PRELOAD`` of ``libmscclpp_nccl.so`` (``mscclpp_lib``: the file, or the folder of an
    MSCCL++ build's ``lib``), so that PyTorch's ``ncclAllReduce``, ``ncclAllGather`` and
    ``ncclReduceScatter`` reach MSCCL++; with ``nccl_lib`` (a ``libnccl.so``) also
    ``MSCCLPP_NCCL_LIB_PATH``, the real NCCL that MSCCL++ hands the calls no plan serves
    (``src/core/env.cpp``; without it such calls fail)."""
    lib = Path(mscclpp_lib)
    if lib.is_dir():
        lib = lib / "libmscclpp_nccl.so"
    env = {"LD_PRELOAD": str(lib)}
    if nccl_lib is not None:
        env["MSCCLPP_NCCL_LIB_PATH"] = str(nccl_lib)
    return env


def register_mscclpp(folder: str | Path, *, inplace: bool, rank: int | None = None,
                     ranks_per_node: int | None = None) -> tuple[MscclppPlan, ...]:
    """Register the plans of ``folder`` with MSCCL++'s NCCL interface (call it before
    ``torch.distributed.init_process_group``, whose ``ncclCommInitRank`` builds MSCCL++'s
    algorithm collection from what was registered); returns the plans registered.

    Only the plans of one buffer mode are registered: ``inplace=True`` for
    ``all_reduce`` (in place), ``False`` for ``all_gather_into_tensor`` and
    ``reduce_scatter_tensor`` into a separate output. At microsoft/mscclpp 1f5f065
    ``DslAlgorithm::bufferMode`` (``src/core/algorithm.cc``) keeps the mode in a function-level
    ``static``, so every registered plan reports the mode of the first one asked: with both
    modes registered, a call could run a plan written for the other mode. A
    ``reduce_scatter_tensor`` whose output is the rank's slice of its input is out of place to
    MSCCL++ (``CollectiveRequest::bufferMode``): it never reaches an in-place plan, and it
    runs an out-of-place one on overlapping buffers (right on every plan the tests run so,
    not proven for every schedule). ``rank`` and ``ranks_per_node`` default to torchrun's
    ``RANK`` and ``LOCAL_WORLD_SIZE``.
    """
    # optional dependency: present only where it is installed
    import mscclpp
    import mscclpp.ext

    rank = int(os.environ["RANK"]) if rank is None else rank
    per_node = (int(os.environ["LOCAL_WORLD_SIZE"]) if ranks_per_node is None
                else ranks_per_node)
    chosen = tuple(p for p in mscclpp_plans(folder) if p.inplace == inplace)
    builder = mscclpp.ext.AlgorithmCollectionBuilder()
    for plan in chosen:
        algo = mscclpp.Algorithm(
            id=plan.name, execution_plan=mscclpp.ExecutionPlan(str(plan.path), rank),
            constraint=mscclpp.Algorithm.Constraint(plan.world_size, per_node), tags={})
        builder.add_algorithm_builder(algo)
    return chosen


def _check(nccl, rc: int, what: str) -> None:
    if rc != 0:
        nccl.ncclGetErrorString.restype = ctypes.c_char_p
        raise RuntimeError(f"{what} failed: {nccl.ncclGetErrorString(rc).decode()} ({rc})")
