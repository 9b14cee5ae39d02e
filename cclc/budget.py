"""An up-front size estimate: refuse a compile the machine cannot finish, before any work.

Planning a collective builds, verifies and simulates schedules whose op count grows like
``n^2`` for ring and direct schedules on ``n`` ranks, and relay lowering multiplies it by the
hops of the routes the routing does not carry; a million-rank mesh, or an alltoall on a
4096-rank torus, would run out of memory after minutes of work. :func:`estimate_size` gives a
*lower bound* on what planning needs, from each algorithm entry's own closed form
(:meth:`cclc.algorithms.Algorithm.min_ops`, which sees the hint parameters, ``chunks``
included), so a refusal is never caused by an overestimate:

* ops: the entry's bound, e.g. ``n(n-1)`` for the one-block-per-op entries, the sum of every
  pair's hop distance where relay lowering cuts their moves into single hops (direct and the
  torus AllToAll entries on a torus with routing ``none``), ``chunks x (n-1)`` for a
  broadcast chain; ``n`` (every rank receives something) where an entry has no bound.
  ``auto`` builds every applicable candidate and keeps the fastest: its peak is the largest.
* memory: :data:`BYTES_PER_OP` per op (the IR's ten int32 columns and a route offset, held by
  the builder and again by the verifier), :data:`BYTES_PER_LINK` per route link where an
  entry's routes are longer than its ops (direct's, over a whole torus), plus the verifier's
  contributor bitsets for reductions (one bit per rank per chunk slot: at least ``n`` slots,
  or the entry's own bound, :meth:`cclc.algorithms.Algorithm.min_slots`) and
  the hop matrix of the alltoall bounds (``n^2`` float64) where no closed form replaces it.
* time: :data:`SECONDS_PER_OP` per op (build, verify, simulate), measured by
  ``benchmarks/ir_scale.py`` at 1.5-4 us per op on 2 cores.

``auto`` plans the candidates that fit (:func:`split_by_budget`; the others are reported as
too large). The CLI refuses when the ops exceed :data:`MAX_OPS`, the memory exceeds what the
process can get (the machine's available memory, or a lower address-space limit) or the time exceeds
:data:`TIME_LIMIT`; it prints the estimate and the ways out (a smaller collective, the entry
with the smallest schedule, ``--no-size-check``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass

from cclc.algorithms import every_rank_ops
from cclc.collective import Collective, CollectiveKind
from cclc.errors import CclError
from cclc.units import format_bytes

__all__ = ["AUTO_MAX_OPS", "BYTES_PER_LINK", "BYTES_PER_OP", "MAX_OPS", "SECONDS_PER_OP",
           "TIME_LIMIT", "SizeEstimate", "available_memory", "budget_reason", "check_budget",
           "estimate_ops", "estimate_size", "split_by_budget"]

#: bytes per op at the least: 10 int32 columns + an int64 route offset, twice
BYTES_PER_OP = 2 * (10 * 4 + 8)
#: bytes per route link at the least: an int32 held by the builder and the verifier, and the
#: row of the load bound's traffic (:mod:`cclc.load_bounds`: int64 step and link, int8 role,
#: float64 bytes)
BYTES_PER_LINK = 2 * 4 + 8 + 8 + 1 + 8
#: seconds per op at the least (benchmarks/ir_scale.py measures 1.5-4 us to build and verify)
SECONDS_PER_OP = 1e-6
#: the largest candidate ``auto`` plans when a smaller one applies (at about 10 us per op a
#: whole compile, ~100 s each): at thousands of ranks the ``n (n - 1)``-op rings and direct
#: schedules fit :data:`MAX_OPS` but would take minutes each beside a candidate of a few
#: hundred thousand ops; named explicitly, they are planned up to :data:`MAX_OPS`
AUTO_MAX_OPS = 10_000_000
#: the longest planning time accepted without --no-size-check
TIME_LIMIT = 3600.0
#: the largest schedule (ops, at the least) planned without --no-size-check. A whole compile
#: (build, relay, verify, simulate, write) takes about 10 us and 400 bytes per op (a relayed
#: 1.2M-op alltoall on 512 ranks: 12.6 s, 530 MB), so 20M ops are minutes and ~8 GB
MAX_OPS = 20_000_000

_REDUCING = frozenset({CollectiveKind.REDUCESCATTER, CollectiveKind.ALLREDUCE,
                       CollectiveKind.REDUCE})


@dataclass(frozen=True, slots=True)
class SizeEstimate:
    """Lower bounds on what planning ``collective`` needs; ``largest`` names the candidate
    whose schedule dominates; ``smallest`` (name, ops) the applicable entry with the smallest
    bound when it is another one (the way out to suggest), else ``None``."""

    collective: str
    ops: int
    memory: float
    seconds: float
    largest: str
    smallest: tuple[str, int] | None = None


def estimate_ops(coll: Collective, entry, params: dict | None = None) -> int:
    """A lower bound on the ops of registry ``entry``'s schedule of ``coll`` with hint
    ``params`` (:meth:`cclc.algorithms.Algorithm.min_ops`); with parameters the entry
    rejects, what every schedule has (its ``applicable`` says what is wrong with them)."""
    try:
        return entry.min_ops(coll, **(params or {}))
    except CclError:
        return every_rank_ops(coll)


def estimate_size(coll: Collective, entries: Sequence, params: dict, others: Sequence = ()
                  ) -> SizeEstimate:
    """The :class:`SizeEstimate` of planning ``coll`` with the registry ``entries`` (one explicit
    entry, or the candidates of ``auto``); ``params`` are the hint parameters. ``others``:
    more entries serving ``coll``, without parameters, only looked at for the smallest (the
    alternatives to an explicit entry).

    The largest candidate that applies counts: they are tried largest first, so the cheap
    ``applicable`` checks usually stop at the first (some take seconds on huge inputs).
    """
    def applies(entry) -> bool:
        return len(entries) == 1 or _applies(coll, entry, params)

    sized = sorted(((estimate_ops(coll, e, params), i, e) for i, e in enumerate(entries)),
                   key=lambda t: (-t[0], t[1]))
    ops, largest, chosen = 0, "-", None
    for k, (size, _, entry) in enumerate(sized):
        if applies(entry):
            ops, largest, chosen = size, entry.name, entry
            sized = sized[k + 1:]
            break
    # the way out: the smallest applicable alternative (entries here, others without params)
    names = {e.name for e in entries}
    sized += [(estimate_ops(coll, e, {}), len(entries) + i, e)
              for i, e in enumerate(others) if e.name not in names]
    sized.sort(key=lambda t: (t[0], t[1]))
    smallest = next(((e.name, size) for size, _, e in sized
                     if size < ops and _applies(coll, e, params if e.name in names else {})),
                    None)
    memory = _memory(coll, chosen, params, ops)
    return SizeEstimate(coll.name, ops, memory, ops * SECONDS_PER_OP, largest, smallest)


def _memory(coll: Collective, entry, params: dict, ops: int) -> float:
    """Bytes planning ``entry``'s schedule of ``coll`` (``ops`` ops) needs at the least."""
    n = coll.n
    links = entry.min_links(coll, **params) if entry is not None else 0
    memory = float(ops) * BYTES_PER_OP + float(links) * BYTES_PER_LINK
    if coll.kind in _REDUCING:
        # the verifier's contributor bitsets: one per chunk slot of every buffer
        slots = max(n, entry.min_slots(coll, **params) if entry is not None else 0)
        memory += float(slots) * 8 * math.ceil(n / 64)
    topo = coll.topology
    closed_form = (topo.dims is not None and not topo.link_failed.any()
                   and not topo.failed_ranks and coll.pair_sizes is None)
    if coll.kind is CollectiveKind.ALLTOALL and not closed_form:
        memory += 8.0 * n * n
    return memory


def split_by_budget(coll: Collective, entries: Sequence, params: dict, memory: int | None
                    ) -> tuple[list, list[tuple[str, str]]]:
    """``auto``'s candidates ``entries`` split into those whose schedule fits the budget
    (:func:`budget_reason`) and ``(name, why)`` for the others, so that ``auto`` plans what
    fits rather than refusing a collective for its largest candidate. No entry fits when
    none of those within the budget applies."""
    fits, too_large = [], []
    for entry in entries:
        ops = estimate_ops(coll, entry, params)
        est = SizeEstimate(coll.name, ops, _memory(coll, entry, params, ops),
                           ops * SECONDS_PER_OP, entry.name)
        why = budget_reason(est, memory)
        if why is None:
            fits.append((ops, entry))
        else:
            too_large.append((entry.name, why))
    if too_large and not any(_applies(coll, e, params) for _, e in fits):
        # only what cannot run fits: the collective is refused for its largest candidate
        return [], too_large
    small = [e for ops, e in fits if ops <= AUTO_MAX_OPS]
    if len(small) < len(fits) and any(_applies(coll, e, params) for e in small):
        too_large += [(e.name, f"left out by auto: at least {_count(ops)} ops (auto plans "
                      f"candidates of at most {_count(AUTO_MAX_OPS)} when a smaller one "
                      "applies; name it to plan it)")
                      for ops, e in fits if ops > AUTO_MAX_OPS]
        return small, too_large
    return [e for _, e in fits], too_large


def budget_reason(est: SizeEstimate, memory: int | None) -> str | None:
    """Why ``est`` is over the budget (more than :data:`MAX_OPS` ops, more than ``memory``
    bytes or more than :data:`TIME_LIMIT`), in a few words, or ``None``."""
    if est.ops > MAX_OPS:
        return (f"too large to plan here: at least {_count(est.ops)} ops (cclc plans at most "
                f"{_count(MAX_OPS)})")
    if memory is not None and est.memory > memory:
        return (f"too large to plan here: needs at least {format_bytes(est.memory)} of memory "
                f"({format_bytes(memory)} available)")
    if est.seconds > TIME_LIMIT:
        return f"too large to plan here: needs at least {_duration(est.seconds)}"
    return None


def _applies(coll: Collective, entry, params: dict) -> bool:
    try:
        return entry.applicable(coll, **params) is None
    except CclError:
        return False


def available_memory() -> int | None:
    """Bytes the process can still get: the machine's ``MemAvailable``, or the process's
    address-space limit (``ulimit -v``) when lower; ``None`` when neither is known."""
    limits = [m for m in (_machine_memory(), _address_space_limit()) if m is not None]
    return min(limits) if limits else None


def _machine_memory() -> int | None:
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


def _address_space_limit() -> int | None:
    try:
        # not on every platform (not on Windows), where a module-level import would fail
        import resource
    except ImportError:
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    return None if soft == resource.RLIM_INFINITY else int(soft)


def check_budget(est: SizeEstimate, memory: int | None) -> None:
    """:class:`CclError` when ``est`` has more than :data:`MAX_OPS` ops or needs more than
    ``memory`` bytes or :data:`TIME_LIMIT`; the message gives the estimate and the ways out."""
    too_big = memory is not None and est.memory > memory
    too_long = est.seconds > TIME_LIMIT
    too_many = est.ops > MAX_OPS
    if not (too_big or too_long or too_many):
        return
    have = f" (this machine has {format_bytes(memory)} available)" if memory is not None else ""
    limit = f" (cclc plans at most {_count(MAX_OPS)})" if too_many else ""
    cheaper, none_fits = ", a cheaper algorithm", ""
    if est.smallest is not None:
        name, ops = est.smallest
        algo, _, sched = name.partition("+")
        hint = f"algorithm {algo}" + (f"; schedule {sched}" if sched else "")
        fits = (ops <= MAX_OPS and ops * SECONDS_PER_OP <= TIME_LIMIT
                and (memory is None or ops * BYTES_PER_OP <= memory))
        if fits:
            cheaper = (f", the algorithm with the smallest schedule ({hint}: at least "
                       f"{_count(ops)} ops)")
        else:
            # no algorithm is a way out: say so rather than send the user to another refusal
            cheaper = ""
            none_fits = f" (the smallest, {name}, has at least {_count(ops)} ops)"
    raise CclError(
        f"collective '{est.collective}' is too large to plan here: its {est.largest} schedule "
        f"alone has at least {_count(est.ops)} ops{limit}, needing at least "
        f"{format_bytes(est.memory)} of memory{have} and {_duration(est.seconds)}; use a "
        f"smaller topology, group, size or chunks{cheaper}, or --no-size-check to try "
        f"anyway{none_fits}")


def _count(ops: int) -> str:
    return f"{ops:,}" if ops < 1_000_000 else f"{ops:.3g}"


def _duration(seconds: float) -> str:
    for unit, size in (("days", 86400.0), ("hours", 3600.0), ("minutes", 60.0)):
        if seconds >= size:
            return f"{seconds / size:.3g} {unit}"
    return f"{seconds:.3g} s"
