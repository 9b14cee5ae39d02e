"""An up-front size estimate: refuse a compile the machine cannot finish, before any work.

Planning a collective builds, verifies and simulates schedules whose op count grows like
``n^2`` for ring and direct schedules on ``n`` ranks; a million-rank mesh would run out of
memory after minutes of work. :func:`estimate` gives a *lower bound* on what planning needs,
from closed forms per algorithm family, so a refusal is never caused by an overestimate:

* ops: ``n(n-1)`` for the one-block-per-op entries (direct, ring, biring, foldedring) on
  allgather / reducescatter / allreduce / alltoall; ``n`` for every other entry of those
  collectives (every rank receives something; aggregating schedules such as recursive
  doubling need far fewer ops than ``n log2 n`` when ``n`` is not a power of two);
  ``n - 1`` for broadcast/reduce.
  ``auto`` builds every applicable candidate and keeps the fastest: its peak is the largest.
* memory: :data:`BYTES_PER_OP` per op (the IR's ten int32 columns and a route offset, held by
  the builder and again by the verifier), plus the verifier's contributor bitsets for
  reductions (one bit per rank per chunk, at least ``n`` chunks) and the hop matrix of the
  alltoall bounds (``n^2`` float64) where no closed form replaces it.
* time: :data:`SECONDS_PER_OP` per op (build, verify, simulate), measured by
  ``benchmarks/ir_scale.py`` at 1.5-4 us per op on 2 cores.

The CLI refuses when the memory exceeds what the machine has available or the time exceeds
:data:`TIME_LIMIT`, prints the estimate, and takes ``--no-size-check`` to try anyway.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from cclc.collective import Collective, CollectiveKind
from cclc.errors import CclError
from cclc.units import format_bytes

__all__ = ["BYTES_PER_OP", "SECONDS_PER_OP", "TIME_LIMIT", "Estimate", "available_memory",
           "check_budget", "estimate", "estimate_ops"]

#: bytes per op at the least: 10 int32 columns + an int64 route offset, twice
BYTES_PER_OP = 2 * (10 * 4 + 8)
#: seconds per op at the least (benchmarks/ir_scale.py measures 1.5-4 us to build and verify)
SECONDS_PER_OP = 1e-6
#: the longest planning time accepted without --no-size-check
TIME_LIMIT = 3600.0

#: families that move one block per op, so every rank sends at least n-1 ops
_QUADRATIC = frozenset({"direct", "ring", "biring", "foldedring"})
_DATA_PER_RANK = frozenset({CollectiveKind.ALLGATHER, CollectiveKind.REDUCESCATTER,
                            CollectiveKind.ALLREDUCE, CollectiveKind.ALLTOALL})
_REDUCING = frozenset({CollectiveKind.REDUCESCATTER, CollectiveKind.ALLREDUCE,
                       CollectiveKind.REDUCE})


@dataclass(frozen=True, slots=True)
class Estimate:
    """Lower bounds on what planning ``collective`` needs; ``largest`` names the candidate
    whose schedule dominates."""

    collective: str
    ops: int
    memory: float
    seconds: float
    largest: str


def estimate_ops(coll: Collective, entry_name: str) -> int:
    """A lower bound on the ops of entry ``entry_name``'s schedule of ``coll``."""
    n = coll.n
    if n < 2:
        return 0
    if coll.kind not in _DATA_PER_RANK:
        return n - 1
    if entry_name in _QUADRATIC:
        return n * (n - 1)
    return n


def estimate(coll: Collective, entries: list, params: dict) -> Estimate:
    """The :class:`Estimate` of planning ``coll`` with the registry ``entries`` (one explicit
    entry, or the candidates of ``auto``); ``params`` are the hint parameters.

    The largest candidate that applies counts: they are tried largest first, so the cheap
    ``applicable`` checks usually stop at the first (some take seconds on huge inputs).
    """
    n = coll.n
    ops, largest = 0, "-"
    for entry in sorted(entries, key=lambda e: -estimate_ops(coll, e.name)):
        try:
            applies = len(entries) == 1 or entry.applicable(coll, **params) is None
        except CclError:
            applies = False
        if applies:
            ops, largest = estimate_ops(coll, entry.name), entry.name
            break
    memory = float(ops) * BYTES_PER_OP
    if coll.kind in _REDUCING:
        memory += float(n) * 8 * math.ceil(n / 64)
    topo = coll.topology
    closed_form = (topo.dims is not None and not topo.link_failed.any()
                   and not topo.failed_ranks and coll.pair_sizes is None)
    if coll.kind is CollectiveKind.ALLTOALL and not closed_form:
        memory += 8.0 * n * n
    return Estimate(coll.name, ops, memory, ops * SECONDS_PER_OP, largest)


def available_memory() -> int | None:
    """Bytes the machine can still give (``MemAvailable``), or ``None`` when unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        return None


def check_budget(est: Estimate, memory: int | None) -> None:
    """:class:`CclError` when ``est`` needs more than ``memory`` bytes or :data:`TIME_LIMIT`."""
    too_big = memory is not None and est.memory > memory
    too_long = est.seconds > TIME_LIMIT
    if not (too_big or too_long):
        return
    have = f" (this machine has {format_bytes(memory)} available)" if memory is not None else ""
    raise CclError(
        f"collective '{est.collective}' is too large to plan here: its {est.largest} schedule "
        f"alone has at least {est.ops:.3g} ops, needing at least {format_bytes(est.memory)} of "
        f"memory{have} and {_duration(est.seconds)}; use a smaller topology or group, a "
        "cheaper algorithm, or --no-size-check to try anyway")


def _duration(seconds: float) -> str:
    for unit, size in (("days", 86400.0), ("hours", 3600.0), ("minutes", 60.0)):
        if seconds >= size:
            return f"{seconds / size:.3g} {unit}"
    return f"{seconds:.3g} s"
