"""What the user asks to run: a collective on a group of ranks of a topology."""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum

import numpy as np

from cclc.errors import CollectiveError, Span
from cclc.topology import Topology

__all__ = ["CollectiveKind", "DType", "ReduceOp", "Hint", "Collective", "make_collective",
           "REDUCING_KINDS"]


class CollectiveKind(Enum):
    ALLTOALL = "alltoall"
    ALLGATHER = "allgather"
    REDUCESCATTER = "reducescatter"
    ALLREDUCE = "allreduce"
    BROADCAST = "broadcast"
    REDUCE = "reduce"


REDUCING_KINDS = frozenset({CollectiveKind.REDUCESCATTER, CollectiveKind.ALLREDUCE,
                            CollectiveKind.REDUCE})


class DType(Enum):
    """Element types; ``value`` is the language spelling."""

    FP64 = "fp64"
    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"
    INT8 = "int8"
    UINT8 = "uint8"
    INT32 = "int32"
    UINT32 = "uint32"
    INT64 = "int64"
    UINT64 = "uint64"

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE[self]


_ITEMSIZE = {DType.FP64: 8, DType.FP32: 4, DType.FP16: 2, DType.BF16: 2, DType.INT8: 1,
             DType.UINT8: 1, DType.INT32: 4, DType.UINT32: 4, DType.INT64: 8, DType.UINT64: 8}


class ReduceOp(Enum):
    SUM = "sum"
    PROD = "prod"
    MIN = "min"
    MAX = "max"


@dataclass(frozen=True, slots=True)
class Hint:
    """An algorithm or schedule choice: ``auto`` or a name with parameters; ``param_spans``
    says where each parameter is written (``key = value``), when it came from a file."""

    name: str = "auto"
    params: tuple[tuple[str, int | float | str], ...] = ()
    span: Span | None = None
    param_spans: tuple[tuple[str, Span], ...] = ()

    def param(self, key: str, default=None):
        return dict(self.params).get(key, default)

    def param_span(self, key: str) -> Span | None:
        """Where parameter ``key`` is written, or ``None``."""
        return dict(self.param_spans).get(key)

    def __str__(self) -> str:
        if not self.params:
            return self.name
        return f"{self.name}(" + ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                                           for k, v in self.params) + ")"


@dataclass(frozen=True, eq=False)
class Collective:
    """A collective on ``group`` (global rank ids, in group order) of ``topology``.

    ``size`` follows nccl-tests: alltoall = bytes each rank sends in total; allgather = output
    bytes per rank; reducescatter = input bytes per rank; allreduce, broadcast, reduce = buffer
    bytes. ``pair_sizes[i, j]`` (alltoall only) is the bytes group member i sends to member j.
    ``root`` is an index into ``group``.
    """

    name: str
    kind: CollectiveKind
    topology: Topology
    group: tuple[int, ...]
    size: int
    dtype: DType = DType.FP32
    op: ReduceOp = ReduceOp.SUM
    root: int | None = None
    algorithm: Hint = Hint()
    schedule: Hint = Hint()
    pair_sizes: np.ndarray | None = None
    span: Span | None = None

    @property
    def n(self) -> int:
        return len(self.group)

    @property
    def root_index(self) -> int:
        """``root`` of a broadcast or reduce; :class:`CollectiveError` for a kind without one."""
        if self.root is None:
            raise CollectiveError(f"collective '{self.name}' ({self.kind.value}) has no root")
        return self.root

    @property
    def count(self) -> int:
        """Elements of ``size``."""
        return self.size // self.dtype.itemsize

    def as_auto(self) -> Collective:
        """This collective with ``auto`` algorithm and schedule hints, without the hints'
        parameters (their spans stay)."""
        return replace(self, algorithm=replace(self.algorithm, name="auto", params=()),
                       schedule=replace(self.schedule, name="auto", params=()))


def make_collective(name: str, kind: CollectiveKind, topology: Topology, group: tuple[int, ...],
                    size: int | None = None, dtype: DType = DType.FP32,
                    op: ReduceOp = ReduceOp.SUM, root: int | None = None,
                    algorithm: Hint = Hint(), schedule: Hint = Hint(),
                    pair_sizes: np.ndarray | None = None, span: Span | None = None) -> Collective:
    """Validate and build a :class:`Collective`; :class:`CollectiveError` says what is wrong."""
    group = tuple(int(r) for r in group)
    _check_group(name, topology, group)
    n = len(group)
    if pair_sizes is not None:
        pair_sizes = _checked_pair_sizes(kind, n, dtype, pair_sizes)
        size = int(pair_sizes.sum(axis=1).max())
    if size is None:
        raise CollectiveError(f"collective '{name}' needs a size")
    if size <= 0:
        raise CollectiveError(f"the size of collective '{name}' must be > 0")
    if pair_sizes is None:
        _check_even_split(kind, n, dtype, size)
    root = _checked_root(kind, n, root)
    return Collective(name=name, kind=kind, topology=topology, group=group, size=int(size),
                      dtype=dtype, op=op, root=root, algorithm=algorithm, schedule=schedule,
                      pair_sizes=pair_sizes, span=span)


def _check_group(name: str, topology: Topology, group: tuple[int, ...]) -> None:
    n = len(group)
    if n < 1:
        raise CollectiveError(f"collective '{name}' has an empty group")
    if len(set(group)) != n:
        raise CollectiveError(f"collective '{name}' lists a rank twice in its group")
    for r in group:
        if not 0 <= r < topology.n_ranks:
            raise CollectiveError(f"rank {r} is not in topology '{topology.name}'")
        if r in topology.failed_ranks:
            raise CollectiveError(f"rank {topology.vertex_names[r]} of collective '{name}' "
                                  "has failed")
    if not topology.is_connected(group):
        raise CollectiveError(f"the faults disconnect the group of collective '{name}': some of "
                              f"its {n} ranks cannot reach each other over healthy links")


def _checked_pair_sizes(kind: CollectiveKind, n: int, dtype: DType, pair_sizes) -> np.ndarray:
    """The per-pair byte matrix of a non-uniform alltoall, checked and read-only."""
    item = dtype.itemsize
    if kind is not CollectiveKind.ALLTOALL:
        raise CollectiveError("per-pair sizes are only for alltoall")
    pair_sizes = np.asarray(pair_sizes, dtype=np.int64)
    if pair_sizes.shape != (n, n):
        raise CollectiveError(f"the size matrix is {pair_sizes.shape[0]}x"
                              f"{pair_sizes.shape[1] if pair_sizes.ndim > 1 else 1} but "
                              f"the group has {n} ranks: it must be {n}x{n}")
    if (pair_sizes < 0).any():
        raise CollectiveError("the size matrix has a negative entry")
    if (pair_sizes % item).any():
        raise CollectiveError(f"every entry of the size matrix must be a multiple of the "
                              f"{dtype.value} element size ({item} B)")
    pair_sizes = pair_sizes.copy()
    pair_sizes.setflags(write=False)
    return pair_sizes


def _check_even_split(kind: CollectiveKind, n: int, dtype: DType, size: int) -> None:
    item = dtype.itemsize
    split = kind in (CollectiveKind.ALLTOALL, CollectiveKind.ALLGATHER,
                     CollectiveKind.REDUCESCATTER)
    unit = item * (n if split else 1)
    if size % unit:
        what = f"{n} ranks x {item} B ({dtype.value})" if split else f"{item} B ({dtype.value})"
        raise CollectiveError(f"size {size} B cannot be split evenly over {what}: it must be "
                              f"a multiple of {unit} B")


def _checked_root(kind: CollectiveKind, n: int, root: int | None) -> int | None:
    """The root of a broadcast or reduce (rank 0 of the group by default); ``None`` else."""
    if kind in (CollectiveKind.BROADCAST, CollectiveKind.REDUCE):
        root = 0 if root is None else root
        if not 0 <= root < n:
            raise CollectiveError(f"root {root} is outside the group of {n} ranks "
                                  f"(0..{n - 1})")
        return root
    if root is not None:
        raise CollectiveError(f"a root only makes sense for broadcast and reduce, not {kind.value}")
    return None
