"""An up-front size estimate: refuse a compile the machine cannot finish, before any work.

Planning a collective builds, verifies and simulates schedules whose op count grows like
``n^2`` for ring and direct schedules on ``n`` ranks, and relay lowering multiplies it by the
hops of the routes the routing does not carry; a million-rank mesh, or an alltoall on a
4096-rank torus, would run out of memory after minutes of work. :func:`estimate_size` gives a
*lower bound* on what planning needs, from each algorithm entry's own closed form
(:meth:`cclc.algorithms.Algorithm.min_ops`, which sees the hint parameters, ``chunks``
included), so a refusal is never caused by an overestimate:

* ops: the entry's rule: the exact count before relay lowering for the entries that state
  ``exact_ops`` (ring: ``3n^2 - 2n`` for AllReduce, ``2n^2 - n`` for ReduceScatter, ``n^2``
  for AllGather, ``chunks x n`` for a broadcast chain; biring, foldedring, ring+dimrotation,
  direct, pat), the sum of every pair's hop distance where relay lowering cuts the moves into
  single hops (direct and the torus AllToAll entries on a torus with routing ``none``), and
  ``n`` (every rank receives something) where an entry has no better bound.
  ``auto`` builds the applicable candidates that can win and keeps the fastest: its peak is
  the largest it builds.
* memory: :data:`BYTES_PER_OP` per op (the IR's ten int32 columns and a route offset, held by
  the builder and again by the verifier), :data:`BYTES_PER_LINK` per route link where an
  entry's routes are longer than its ops (direct's, over a whole torus), plus the verifier's
  interpreter (:func:`verifier_bytes`: every rank's chunk slots, from the entry's ``slots``
  rule, each with a value and a stamp and, in a reduction, a bitset of ``n`` contributor
  bits, or the number of its set where all sets would pass :data:`cclc.verify.SLICE_BYTES`:
  a ring AllReduce's whole sets are ``n^3 / 4`` bytes, 16 GiB at 4,096 ranks, which the
  verifier makes a slice of ranks at a time) and the hop matrix of
  the alltoall bounds (``n^2`` float64) where no closed form replaces it.
* time: :data:`SECONDS_PER_OP` per op (build, verify, simulate), measured by
  ``benchmarks/ir_scale.py`` at 1.5-4 us per op on 2 cores.

The CLI refuses when the ops exceed :data:`MAX_OPS`, the memory exceeds :data:`MEMORY_SHARE` of
what the process can get (the machine's available memory, or a lower address-space limit: the
estimates count the largest arrays only) or the time exceeds :data:`TIME_LIMIT`; it prints the
estimate and the ways out (a smaller collective, the entry with the smallest schedule but a
synthesis no bound prunes, ``--no-size-check``). Under ``auto`` the largest applicable candidate
decides unless a candidate whose estimate is its exact count fits (:func:`fitting_entries`):
then the collective is admitted, and the planner skips each candidate whose own estimate does
not fit (:meth:`Limits.candidate_refusal`: the memory of its verifier need not grow with its
ops) and says so in its table. An estimate that is a loose lower bound admits nothing by itself
(recursive doubling counts ``n`` where it builds ``n log2 n``); admitted, such a candidate is
built only if its bound (:mod:`cclc.load_bounds`) does not show that it cannot win; where a
synthesis would be built with no send bound to prune it (``synth`` counts ``n`` ops, and its
search runs minutes past its budget at 4,096 ranks) nothing is admitted: the collective is
refused in seconds as before.

The estimates are the exact counts before relay lowering where the builders' counts have a
closed form, and lower bounds elsewhere (``tests/plan/test_op_estimates.py`` measures every
entry against what it builds), so a candidate the estimate admits may still build more than
fits. The limits are therefore checked once more on the built schedule itself, before the
verifier allocates its interpreter (:meth:`Limits.schedule_refusal`): such a candidate is
skipped, or refused with the same message, never left to run out of memory.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace

from cclc.algorithms import NoBound, every_rank_ops
from cclc.collective import Collective, CollectiveKind
from cclc.errors import CclError
from cclc.ir import Buf, Schedule
from cclc.units import format_bytes, format_duration
from cclc.verify import holds_whole_sets

__all__ = ["BYTES_PER_LINK", "BYTES_PER_OP", "BYTES_PER_SLOT", "MAX_OPS", "MEMORY_SHARE",
           "SECONDS_PER_OP", "TIME_LIMIT", "Limits", "SizeEstimate", "available_memory",
           "candidate_estimate", "check_budget", "estimate_ops", "estimate_size",
           "fitting_entries", "verifier_bytes"]

#: bytes per op at the least: 10 int32 columns + an int64 route offset, twice
BYTES_PER_OP = 2 * (10 * 4 + 8)
#: bytes per route link at the least: an int32 held by the builder and the verifier, and the
#: row of the load bound's traffic (:mod:`cclc.load_bounds`: int64 step and link, int8 role,
#: float64 bytes)
BYTES_PER_LINK = 2 * 4 + 8 + 8 + 1 + 8
#: seconds per op at the least (benchmarks/ir_scale.py measures 1.5-4 us to build and verify)
SECONDS_PER_OP = 1e-6
#: the longest planning time accepted without --no-size-check
TIME_LIMIT = 3600.0
#: the largest schedule (ops, at the least) planned without --no-size-check. A whole compile
#: (build, relay, verify, simulate, write) takes about 10 us and 400 bytes per op (a relayed
#: 1.2M-op alltoall on 512 ranks: 12.6 s, 530 MB), so 20M ops are minutes and ~8 GB
MAX_OPS = 20_000_000

#: bytes per chunk slot in the verifier's interpreter (:mod:`cclc.verify`): an int64 value and
#: an int32 stamp; a reduction adds uint64 words of contributor bits (:func:`verifier_bytes`)
BYTES_PER_SLOT = 8 + 4

_REDUCING = frozenset({CollectiveKind.REDUCESCATTER, CollectiveKind.ALLREDUCE,
                       CollectiveKind.REDUCE})


@dataclass(frozen=True, slots=True)
class SizeEstimate:
    """Lower bounds on what planning ``collective`` needs; ``largest`` names the candidate
    whose schedule dominates; ``smallest`` (name, ops) the applicable entry with the smallest
    bound when it is another one and not a synthesis that no bound prunes (the way out to
    suggest), else ``None``."""

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


def verifier_bytes(coll: Collective, slots_per_rank: int) -> float:
    """Bytes the verifier's interpreter allocates for ``coll`` with ``slots_per_rank`` chunk
    slots per rank (input, output and scratch together): :data:`BYTES_PER_SLOT` per slot and,
    in a reduction, a bitset of ``n`` contributor bits per slot where those fit in
    :data:`cclc.verify.SLICE_BYTES` (:func:`cclc.verify.holds_whole_sets`), else the number
    of its contributor set per slot (an int64; the sets themselves are made a slice of ranks
    at a time, within about :data:`~cclc.verify.SLICE_BYTES`, and not counted: their number
    is the reductions')."""
    n = coll.n
    slots = float(n) * slots_per_rank
    per_slot = float(BYTES_PER_SLOT)
    if coll.kind in _REDUCING:
        whole = holds_whole_sets(n, n * slots_per_rank)
        per_slot += 8 * math.ceil(n / 64) if whole else 8
    return slots * per_slot


def candidate_estimate(coll: Collective, entry, params: dict) -> SizeEstimate:
    """The :class:`SizeEstimate` of registry ``entry``'s schedule of ``coll`` alone (it must
    apply) with hint ``params``."""
    ops = estimate_ops(coll, entry, params)
    try:
        links = entry.min_links(coll, **params)
        slots = entry.min_slots(coll, **params)
    except CclError:
        links, slots = 0, 2
    memory = float(ops) * BYTES_PER_OP + float(links) * BYTES_PER_LINK
    memory += verifier_bytes(coll, slots)
    n = coll.n
    topo = coll.topology
    closed_form = (topo.dims is not None and not topo.link_failed.any()
                   and not topo.failed_ranks and coll.pair_sizes is None)
    if coll.kind is CollectiveKind.ALLTOALL and not closed_form:
        memory += 8.0 * n * n
    return SizeEstimate(coll.name, ops, memory, ops * SECONDS_PER_OP, entry.name)


def estimate_size(coll: Collective, entries: Sequence, params: dict, others: Sequence = ()
                  ) -> SizeEstimate:
    """The :class:`SizeEstimate` of planning ``coll`` with the registry ``entries`` (one explicit
    entry, or the candidates of ``auto``); ``params`` are the hint parameters. ``others``:
    more entries serving ``coll``, without parameters, only looked at for the smallest (the
    alternatives to an explicit entry).

    The largest candidate that applies counts (by ops: its memory is the larger of its own and
    that of any applicable candidate): they are tried largest first, so the cheap
    ``applicable`` checks usually stop at the first (some take seconds on huge inputs).
    """
    def applies(entry) -> bool:
        return len(entries) == 1 or _applies(coll, entry, params)

    sized = sorted(((estimate_ops(coll, e, params), i, e) for i, e in enumerate(entries)),
                   key=lambda t: (-t[0], t[1]))
    est = SizeEstimate(coll.name, 0, verifier_bytes(coll, 2), 0.0, "-")
    for k, (_, _, entry) in enumerate(sized):
        if applies(entry):
            est = candidate_estimate(coll, entry, params)
            sized = sized[k + 1:]
            break
    # the way out: the smallest applicable alternative (entries here, others without params),
    # but never a synthesis that no bound prunes: its estimate says nothing of its cost (synth
    # counts n ops, and its search runs minutes past its budget at 4,096 ranks)
    names = {e.name for e in entries}
    sized += [(estimate_ops(coll, e, {}), len(entries) + i, e)
              for i, e in enumerate(others) if e.name not in names]
    sized.sort(key=lambda t: (t[0], t[1]))
    smallest = next(((e.name, size) for size, _, e in sized
                     if size < est.ops and not _unbounded_synthesis(coll, e, {})
                     and _applies(coll, e, params if e.name in names else {})), None)
    return replace(est, smallest=smallest)


def fitting_entries(coll: Collective, entries: Sequence, params: dict, memory: int | None
                    ) -> tuple[str, ...]:
    """The names of the applicable ``entries`` (``auto``'s candidates) whose estimate is the
    exact count of what they build (``exact_ops``, within relay lowering's factor) and fits
    the limits with ``memory`` bytes available: the ones that admit a collective whose largest
    candidate does not fit."""
    limits = Limits(memory)
    built = [e for e in entries
             if _applies(coll, e, params) and limits.candidate_refusal(coll, e, params) is None]
    if any(_unbounded_synthesis(coll, e, params) for e in built):
        # a synthesis, whose cost no op count states, that no send bound can prune would be
        # built whatever it costs (synth's search runs minutes past its budget on a 4,096-rank
        # torus): nothing is admitted
        return ()
    return tuple(e.name for e in built if e.exact_ops)


def _unbounded_synthesis(coll: Collective, entry, params: dict) -> bool:
    """Whether registry ``entry`` is a synthesis whose cost no send bound states (its op
    estimate is no measure of what building it takes)."""
    return entry.synthesize is not None and isinstance(entry.step_sends(coll, **params), NoBound)


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


#: the share of the available memory an estimate may take: estimates count the largest arrays
#: only, and a run holds more beside them (a 4,096-rank ReduceScatter whose verifier bitsets
#: were estimated at 16 GiB passed 25 GB and was killed with 23 GB available)
MEMORY_SHARE = 0.5


@dataclass(frozen=True, slots=True)
class Limits:
    """What planning may take: ``memory`` bytes (``None``: unknown), :data:`MAX_OPS` ops and
    :data:`TIME_LIMIT` seconds; the planner asks it about each candidate (``auto`` skips the
    ones that do not fit) and about each built schedule before verifying it."""

    memory: int | None

    def refusal(self, est: SizeEstimate, lead: str = "too large to plan here: at least"
                ) -> str | None:
        """What in ``est`` is over the limits, in words after ``lead``, or ``None`` when it
        fits."""
        over = []
        if est.ops > MAX_OPS:
            over.append(f"more than the {_count(MAX_OPS)} ops cclc plans")
        if self.memory is not None and est.memory > self.memory * MEMORY_SHARE:
            over.append(f"more than half the {format_bytes(self.memory)} of memory available "
                        "(estimates count the largest arrays only)")
        if est.seconds > TIME_LIMIT:
            over.append(f"more than {format_duration(TIME_LIMIT)}")
        if not over:
            return None
        return (f"{lead} {_count(est.ops)} ops, "
                f"{format_bytes(est.memory)} of memory and {format_duration(est.seconds)} "
                f"({'; '.join(over)})")

    def candidate_refusal(self, coll: Collective, entry, params: dict) -> str | None:
        """Why registry ``entry``'s schedule of ``coll`` is too large to build, from its
        estimate (:func:`candidate_estimate`), or ``None``."""
        return self.refusal(candidate_estimate(coll, entry, params))

    def schedule_refusal(self, schedule: Schedule) -> str | None:
        """Why the built ``schedule`` is too large to verify, or ``None``: its real op count,
        and the verifier's copy of its ops and its interpreter for its real chunk slots."""
        ops = len(schedule.ops)
        slots = sum(schedule.n_chunks(b) for b in Buf)
        memory = ops * BYTES_PER_OP / 2 + verifier_bytes(schedule.collective, slots)
        return self.refusal(SizeEstimate(schedule.collective.name, ops, memory,
                                         ops * SECONDS_PER_OP, schedule.algorithm),
                            "too large to verify here: built, it has")


def check_budget(est: SizeEstimate, memory: int | None) -> None:
    """:class:`CclError` when ``est`` has more than :data:`MAX_OPS` ops or needs more than
    ``memory`` bytes or :data:`TIME_LIMIT`; the message gives the estimate and the ways out."""
    if Limits(memory).refusal(est) is None:
        return
    too_many = est.ops > MAX_OPS
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
        f"{format_bytes(est.memory)} of memory{have} and {format_duration(est.seconds)}; use a "
        f"smaller topology, group, size or chunks{cheaper}, or --no-size-check to try "
        f"anyway{none_fits}")


def _count(ops: int) -> str:
    return f"{ops:,}" if ops < 1_000_000 else f"{ops:.3g}"
