"""Tuning a set of collectives into one parameter table (what ``cclc tune`` runs).

Each target is a collective function on a machine (a group of ranks of a topology) at a list
of sizes; each size is searched separately and becomes a table entry valid for a size range
around it. Afterwards the parameters stock NCCL only takes process-wide are settled once for
the whole table: the thread counts (NCCL_NTHREADS, NCCL_LL128_NTHREADS) and, on PCIe
machines, the transport (NCCL_P2P_DISABLE) are each set to the value that loses least over
all entries, and every entry is re-measured with it — so the table says what a process will
actually get. A channel count above NCCL's init-time count is only reachable by raising
NCCL_MIN_NCHANNELS, which becomes a setting too.

A table from a model (``--profiler model``) cannot harm: a model may choose the algorithm and
protocol, but every entry keeps NCCL's own channels, threads and chunk for that size (NCCL's
size heuristic inside the chosen implementation), and no process-wide setting is written.
Only measured profiles (csv, nccl-tests, online) may move the resources. Each entry records
where it came from (``source``: model or measured) and the generated plugin enforces the rule.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from itertools import pairwise

from cclc.collective import Collective, CollectiveKind
from cclc.errors import SemanticError
from cclc.nccl_model import DEFAULT_THREADS, MAX_CHANNELS, Algo, Func, Proto
from cclc.topology import Topology
from cclc.tuning.baseline import default_point, nccl_default
from cclc.tuning.profilers import Case, Profiler
from cclc.tuning.search import Evaluator, MeasurementCache, SearchResult, search
from cclc.tuning.space import (
    FUNC_NAMES,
    Config,
    Machine,
    NcclVersion,
    Space,
    func_of,
    machine_of,
    space_for,
)
from cclc.units import parse_quantity

__all__ = [
    "Setting",
    "TableEntry",
    "TuneOptions",
    "TuneResult",
    "TuneTarget",
    "describe",
    "parse_sizes",
    "size_ranges",
    "targets_from_collectives",
    "targets_from_grid",
    "tune",
]


@dataclass(frozen=True, slots=True)
class TuneTarget:
    """``func`` on ``machine`` at ``sizes`` bytes (nccl-tests ``size``); ``name`` for reports."""

    name: str
    func: Func
    machine: Machine
    sizes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class TuneOptions:
    """How to search: NCCL version, method, per-size step budget, restarts, seed."""

    version: NcclVersion = NcclVersion(2, 30)
    method: str = "cd"
    budget: int | None = None
    retries: int = 1
    seed: int = 0
    max_channels: int = MAX_CHANNELS


@dataclass(frozen=True, slots=True)
class TableEntry:
    """The tuned configuration of one (target, size), valid for ``min_bytes..max_bytes``."""

    target: str
    func: Func
    n_ranks: int
    n_nodes: int
    nbytes: int
    min_bytes: int
    max_bytes: int
    config: Config
    busbw: float
    default: Config
    default_busbw: float | None
    evaluations: int
    measured: int
    space_size: int
    source: str = "measured"   # "model": NCCL's own resources, algorithm/protocol only

    @property
    def gain(self) -> float | None:
        """Tuned over NCCL's default busbw (under the same profiler)."""
        if not self.default_busbw:
            return None
        return self.busbw / self.default_busbw


@dataclass(frozen=True, slots=True)
class Setting:
    """A process-wide NCCL variable for the conf file, and why it is set."""

    name: str
    value: str
    why: str


@dataclass(frozen=True, slots=True)
class TuneResult:
    entries: tuple[TableEntry, ...]
    settings: tuple[Setting, ...]
    notes: tuple[str, ...]
    version: NcclVersion
    profiler: str
    method: str


def parse_sizes(text: str) -> tuple[int, ...]:
    """Sizes from ``64KiB,1MiB`` or a geometric range ``4KiB:1GiB:x4`` (both may mix)."""
    sizes: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        if ":" in part:
            bits = part.split(":")
            if len(bits) not in (2, 3):
                raise SemanticError(f"size range '{part}' is not LOW:HIGH[:xFACTOR]")
            low, high = _size(bits[0]), _size(bits[1])
            factor = 2.0
            if len(bits) == 3:
                try:
                    factor = float(bits[2].lstrip("x*"))
                except ValueError:
                    raise SemanticError(f"size range factor '{bits[2]}' is not a number") from None
            if factor <= 1 or low > high:
                raise SemanticError(f"size range '{part}' needs LOW <= HIGH and a factor > 1")
            s = float(low)
            while s <= high * (1 + 1e-9):
                sizes.append(int(round(s)))
                s *= factor
        else:
            sizes.append(_size(part))
    if not sizes:
        raise SemanticError("no sizes given")
    return tuple(sorted(set(sizes)))


def _size(text: str) -> int:
    t = text.strip()
    i = len(t)
    while i > 0 and not (t[i - 1].isdigit() or t[i - 1] == "."):
        i -= 1
    try:
        value = float(t[:i])
    except ValueError:
        raise SemanticError(f"'{text}' is not a size like 64KiB") from None
    nbytes = parse_quantity(value, t[i:].strip() or "B", "size")
    if nbytes < 1 or nbytes != int(nbytes):
        raise SemanticError(f"size '{text}' must be a whole number of bytes >= 1")
    return int(nbytes)


def targets_from_collectives(collectives: Iterable[Collective], sizes: Sequence[int] | None = None,
                             arch: str = "hopper", nccl_channels: int | None = None
                             ) -> tuple[list[TuneTarget], list[str]]:
    """One target per collective (its own size, or ``sizes``); notes say what was skipped."""
    targets, notes = [], []
    for coll in collectives:
        if coll.kind is CollectiveKind.ALLTOALL:
            notes.append(f"skipped '{coll.name}': NCCL has no tuning table for alltoall")
            continue
        try:
            machine = machine_of(coll.topology, coll.group, arch=arch, nccl_channels=nccl_channels)
        except SemanticError as err:
            notes.append(f"skipped '{coll.name}': {err.message}")
            continue
        targets.append(TuneTarget(coll.name, func_of(coll.kind), machine,
                                  tuple(sizes) if sizes else (coll.size,)))
    return targets, notes


def targets_from_grid(topologies: Iterable[Topology], kinds: Iterable[CollectiveKind],
                      sizes: Sequence[int], arch: str = "hopper",
                      nccl_channels: int | None = None) -> tuple[list[TuneTarget], list[str]]:
    """Every ``kind`` on all live ranks of every topology, at ``sizes``."""
    targets, notes = [], []
    kinds = list(kinds)
    for topo in topologies:
        try:
            machine = machine_of(topo, arch=arch, nccl_channels=nccl_channels)
        except SemanticError as err:
            notes.append(f"skipped topology '{topo.name}': {err.message}")
            continue
        for kind in kinds:
            targets.append(TuneTarget(f"{topo.name}.{kind.value}", func_of(kind), machine,
                                      tuple(sizes)))
    return targets, notes


def size_ranges(sizes: Sequence[int]) -> list[tuple[int, int]]:
    """Inclusive byte ranges around sorted ``sizes``: split at geometric midpoints, and
    reaching half a step beyond the ends (a size far from every tuned one stays untabled)."""
    s = sorted(sizes)
    if len(s) == 1:
        ratios = [2.0, 2.0]
    else:
        ratios = [s[1] / s[0], s[-1] / s[-2]]
    cuts = [int(math.floor(math.sqrt(a * b))) for a, b in pairwise(s)]
    low = max(1, int(math.ceil(s[0] / math.sqrt(ratios[0]))))
    high = int(math.floor(s[-1] * math.sqrt(ratios[1])))
    bounds = [low - 1] + cuts + [high]
    return [(bounds[i] + 1, bounds[i + 1]) for i in range(len(s))]


def _space(target: TuneTarget, options: TuneOptions) -> Space:
    return space_for(target.func, target.machine, options.version, options.max_channels)


#: one searched (target, size): the target, its space, the case, its byte range, the search
#: result, NCCL's default configuration and its bus bandwidth
_Raw = tuple[TuneTarget, Space, Case, tuple[int, int], SearchResult, Config, float | None]


def tune(targets: Sequence[TuneTarget], profiler: Profiler, options: TuneOptions = TuneOptions(),
         cache: MeasurementCache | None = None) -> TuneResult:
    """Search every (target, size), then settle the process-wide parameters."""
    if not targets:
        raise SemanticError("nothing to tune: no collective NCCL can tune was given")
    notes: list[str] = []
    raw = _search_every_size(targets, profiler, options, cache, notes)
    if not raw:
        raise SemanticError(f"no configuration could be {profiler.evaluated} for any target")
    if not profiler.measured:
        notes.append("a model, not a measurement: the table chooses NCCL's algorithm and "
                     "protocol only and keeps NCCL's own channels, threads and chunk (AutoCCL's "
                     "gains come from measuring: use --profiler csv:FILE or nccl-tests:CMD)")
    # process-wide parameters: one value for the whole process
    configs = {i: r[4].best for i, r in enumerate(raw)}
    # a model never sets process-wide resources: threads, transport and channel floors stay
    # NCCL's (the settling runs over measured tables only)
    settings = _settle_process_wide(raw, configs, profiler, cache) if profiler.measured else []
    entries, over_init = _table(raw, configs, profiler, cache)
    if over_init:
        settings.append(Setting("NCCL_MIN_NCHANNELS", str(max(over_init)),
                                "the tuner can only lower NCCL's channel count; "
                                f"{len(over_init)} entries want more than NCCL sets up at init"))
    return TuneResult(entries=tuple(entries), settings=tuple(settings), notes=tuple(notes),
                      version=options.version, profiler=profiler.identity(),
                      method=options.method)


def _search_every_size(targets: Sequence[TuneTarget], profiler: Profiler, options: TuneOptions,
                       cache: MeasurementCache | None, notes: list[str]) -> list[_Raw]:
    """Search every size of every target; a size nothing could be evaluated at gets a note."""
    raw: list[_Raw] = []
    for target in targets:
        space = _space(target, options)
        for nbytes, rng in zip(sorted(target.sizes), size_ranges(target.sizes), strict=True):
            case = Case(target.func, nbytes, target.machine)
            default = nccl_default(space, nbytes)
            if profiler.measured:
                result = search(space, case, profiler, options.method, options.budget, cache,
                                options.seed, options.retries)
            else:
                result = _implementations_only(space, case, profiler, cache)
            default_bw = Evaluator(profiler, case, cache).evaluate([default])[0]
            if result.best is None:
                notes.append(f"{target.name} at {nbytes} B: no configuration could be "
                             f"{profiler.evaluated}; NCCL keeps its own choice")
                continue
            raw.append((target, space, case, rng, result, default, default_bw))
    return raw


def _settle_process_wide(raw: list[_Raw], configs: dict, profiler: Profiler,
                         cache: MeasurementCache | None) -> list[Setting]:
    """One thread count per protocol class and one PCIe transport for the whole process;
    ``configs`` are updated to them."""
    settings: list[Setting] = []
    thread_classes = (("NCCL_NTHREADS", (Proto.LL, Proto.SIMPLE)),
                      ("NCCL_LL128_NTHREADS", (Proto.LL128,)))
    for cls_name, protos in thread_classes:
        members = [i for i, c in configs.items() if c.algo is Algo.RING and c.proto in protos]
        if not members:
            continue
        values = sorted({v for i in members for v in
                         raw[i][1].subspace(*configs[i].subspace).threads})
        chosen = _settle(raw, configs, members, profiler, cache,
                         lambda c, v: replace(c, threads=v), values, DEFAULT_THREADS[protos[0]])
        for i in members:
            configs[i] = replace(configs[i], threads=chosen)
        if chosen != DEFAULT_THREADS[protos[0]]:
            settings.append(Setting(cls_name, str(chosen),
                                    f"best single thread count over {len(members)} Ring "
                                    f"{'/'.join(p.name for p in protos)} entries"))
    pcie = [i for i in configs
            if raw[i][0].machine.interconnect == "pcie" and raw[i][0].machine.ppn > 1]
    if pcie:
        chosen_t = _settle(raw, configs, pcie, profiler, cache,
                           lambda c, v: replace(c, transport=v), ["p2p", "shm"], "p2p")
        for i in pcie:
            configs[i] = replace(configs[i], transport=chosen_t)
        if chosen_t == "shm":
            settings.append(Setting("NCCL_P2P_DISABLE", "1",
                                    "host shared memory beats PCIe peer-to-peer over the table"))
    return settings


def _table(raw: list[_Raw], configs: dict, profiler: Profiler, cache: MeasurementCache | None
           ) -> tuple[list[TableEntry], list[int]]:
    """The table's entries, and the channel counts of measured entries that want more
    channels than NCCL sets up at init."""
    entries, over_init = [], []
    for i, (target, space, case, (lo, hi), result, default, default_bw) in enumerate(raw):
        config = configs[i]
        bw = Evaluator(profiler, case, cache).evaluate([config])[0]
        if bw is None:
            continue
        entries.append(TableEntry(
            target=target.name, func=target.func, n_ranks=target.machine.n_ranks,
            n_nodes=target.machine.n_nodes, nbytes=case.nbytes, min_bytes=lo, max_bytes=hi,
            config=config, busbw=bw, default=default, default_busbw=default_bw,
            evaluations=result.evaluations, measured=result.measured, space_size=space.size,
            source="measured" if profiler.measured else "model"))
        # NVLS runs on its own channel set (NCCL_NVLS_NCHANNELS), not the ring channels
        if profiler.measured and config.algo not in (Algo.NVLS, Algo.NVLS_TREE) and \
                config.channels > target.machine.nccl_channels:
            over_init.append(config.channels)
    return entries, over_init


def _implementations_only(space: Space, case: Case, profiler: Profiler,
                          cache: MeasurementCache | None) -> SearchResult:
    """The best implementation (algorithm, protocol) with NCCL's own resources in each: what a
    model may decide. AutoCCL's gains from channels, threads and chunk need measurements."""
    ev = Evaluator(profiler, case, cache)
    candidates = [default_point(space, sub, case.nbytes) for sub in space.subspaces
                  if sub.transport == "p2p"]
    values = ev.evaluate(candidates)
    scored = [(v, c) for v, c in zip(values, candidates, strict=True) if v is not None]
    if not scored:
        return SearchResult("model-implementation", None, None, ev.evaluations, ev.measured,
                            False)
    bw, best = max(scored, key=lambda vc: vc[0])
    return SearchResult("model-implementation", best, bw, ev.evaluations, ev.measured, False)


def _settle(raw, configs, members, profiler, cache, change, values, default):
    """The value of one process-wide parameter that keeps the most of the tuned busbw:
    argmax over ``values`` of the summed ratio (changed config / tuned config); NCCL's
    ``default`` wins ties, so nothing is set without a measured reason."""
    score: dict = defaultdict(float)
    for i in members:
        _, space, case, *_ = raw[i]
        base = configs[i]
        sub = space.subspace(*base.subspace)
        candidates = []
        for v in values:
            c = change(base, v)
            if (c.algo, c.proto, c.transport) != base.subspace and \
                    space.subspace(*c.subspace) is None:
                continue
            if sub is not None and c.subspace == base.subspace and c.threads not in sub.threads:
                continue
            candidates.append((v, c))
        measured = Evaluator(profiler, case, cache).evaluate([c for _, c in candidates])
        ref = raw[i][4].busbw or 1.0
        for (v, _), bw in zip(candidates, measured, strict=True):
            score[v] += (bw or 0.0) / ref
    return max(values, key=lambda v: (round(score[v], 9), v == default))


def describe(entry: TableEntry) -> str:
    """One line for reports; an entry from the model says so (its busbw is not measured)."""
    g = entry.gain
    gain = "n/a" if not g else f"{g:.2f}x" if g >= 1 else f"{1 / g:.2f}x slower"
    how = "; evaluated under the NCCL model" if entry.source == "model" else ""
    return (f"{entry.target} {FUNC_NAMES[entry.func]} {entry.nbytes} B: {entry.config.label()} "
            f"busbw {entry.busbw:.2f} GB/s (NCCL default {entry.default_busbw or 0:.2f}, "
            f"{gain}{how})")
