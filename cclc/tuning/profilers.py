"""Profilers: what a configuration of one collective achieves, behind one interface.

A profiler maps a :class:`Case` (collective function, bytes, machine) and a batch of
:class:`~cclc.tuning.space.Config` to bus bandwidths in GB/s (nccl-tests' busbw; ``None`` when
the configuration cannot be measured). Three implementations:

- :class:`ModelProfiler` predicts from the topology: NCCL's latency tables (cclc.nccl_model) for
  the fixed costs, and AutoCCL's resource model for the rest — per-channel bandwidth that
  grows with threads, channels adding up until the link (transport × protocol efficiency)
  saturates, a *congestion factor* that makes more channels slightly worse beyond that point,
  and chunk size trading per-chunk synchronisation against pipeline fill. The per-channel and
  per-chunk constants are modelling assumptions (named below), not measurements.
- :class:`CsvProfiler` replays measurements from a CSV file.
- :class:`NcclTestsProfiler` runs real ``nccl-tests`` with the NCCL_* environment of each
  configuration and parses the busbw column.
"""

from __future__ import annotations

import csv
import hashlib
import math
import os
import shlex
import subprocess
from abc import ABC, abstractmethod
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from cclc import nccl_model
from cclc.errors import SemanticError
from cclc.nccl_model import Algo, Func, Proto
from cclc.tuning.baseline import machine_model
from cclc.tuning.space import (
    ALGO_NAMES,
    FUNC_NAMES,
    NCCL_STEPS,
    PROTO_NAMES,
    Config,
    Machine,
    max_chunk,
)

__all__ = [
    "NCCL_TESTS_BINARY",
    "Case",
    "CsvProfiler",
    "ModelProfiler",
    "NcclTestsProfiler",
    "NcclTestsRow",
    "Profiler",
    "nccl_env",
    "parse_nccl_tests",
    "profiler_from_spec",
]


@dataclass(frozen=True, slots=True)
class Case:
    """One thing to tune: ``func`` on ``nbytes`` (nccl-tests ``size``) over ``machine``."""

    func: Func
    nbytes: int
    machine: Machine

    @property
    def key(self) -> str:
        return f"{FUNC_NAMES[self.func]}:{self.nbytes}:{self.machine.signature}"


class Profiler(ABC):
    """Measures busbw (GB/s) of configurations; ``identity`` keys the result cache.

    ``measured`` says whether the numbers come from running NCCL (csv replay of
    measurements, nccl-tests) or from a model: only measured numbers may lower NCCL's
    channels or threads (:func:`cclc.tuning.table.tune`).
    """

    name: str = "profiler"
    measured: bool = True

    @property
    def evaluated(self) -> str:
        """How reports say this profiler's numbers were obtained (a model's are not measured)."""
        return "measured" if self.measured else "evaluated under the NCCL model"

    @abstractmethod
    def identity(self) -> str:
        """Text that changes whenever the numbers this profiler returns could change."""

    @abstractmethod
    def measure(self, case: Case, configs: Sequence[Config]) -> list[float | None]:
        """busbw in GB/s for each config, ``None`` where it cannot be measured."""


# --- model profiler ------------------------------------------------------------------------

# AutoCCL-style resource model constants (assumptions; see the module docstring)
PROTO_EFFICIENCY = {Proto.LL: 0.5, Proto.LL128: 120 / 128, Proto.SIMPLE: 1.0}
# threads at which one channel reaches its peak copy rate; above it, register pressure
# costs a little (so the thread axis is unimodal with an interior peak)
THREAD_SATURATION = {Proto.LL: 256, Proto.LL128: 512, Proto.SIMPLE: 448}
THREAD_OVERSHOOT_PENALTY = 0.1
CONGESTION = 0.05           # relative slowdown per doubling of channel demand above capacity
SYNC_US = {Proto.LL: 0.05, Proto.LL128: 0.2, Proto.SIMPLE: 0.6}   # per chunk and step
CHANNEL_US = 0.02           # per channel and step: bookkeeping of one more CTA
SHM_BW_FACTOR = 0.5         # host-staged copies: two crossings of the host bridge
SHM_LAT_US = 1.5


def _per_channel(algo: Algo, proto: Proto, m: Machine) -> float:
    """Peak data rate of one channel (one CTA) in GB/s, from NCCL's per-channel tables."""
    arch, scale = m.arch, nccl_model.scale_index(m.n_nodes)
    if algo is Algo.TREE:
        if proto is Proto.SIMPLE:
            return nccl_model.PER_CH_TREE[arch][scale]
        if proto is Proto.LL128:
            return nccl_model.PER_CH_TREE_LL128[arch][scale]
        return nccl_model.PER_CH_TREE[arch][scale] / 3.8
    if algo in (Algo.NVLS, Algo.NVLS_TREE):
        return max(nccl_model.PER_CH_NVLS_TREE[arch][1:])
    ring_ll128 = nccl_model.PER_CH_RING_LL128[arch]
    if proto is Proto.LL128:
        return ring_ll128
    if proto is Proto.LL:
        return ring_ll128 / 4
    # Simple: a CTA copying through registers, a little faster than LL128's line format
    rate = ring_ll128 * 1.1
    return rate * 0.75 if algo is Algo.PAT else rate


class ModelProfiler(Profiler):
    """Predicted busbw from the machine model; deterministic and vectorized per subspace."""

    name = "model"
    measured = False
    VERSION = 2

    def identity(self) -> str:
        return f"model-v{self.VERSION}"

    def measure(self, case: Case, configs: Sequence[Config]) -> list[float | None]:
        out: list[float | None] = [None] * len(configs)
        groups: dict[tuple, list[int]] = defaultdict(list)
        for i, c in enumerate(configs):
            groups[c.subspace].append(i)
        for (algo, proto, transport), idx in groups.items():
            nc = np.array([configs[i].channels for i in idx], dtype=np.float64)
            nt = np.array([configs[i].threads for i in idx], dtype=np.float64)
            ck = np.array([configs[i].chunk for i in idx], dtype=np.float64)
            bw = self.busbw_array(case, algo, proto, transport, nc, nt, ck)
            for j, i in enumerate(idx):
                out[i] = None if not np.isfinite(bw[j]) or bw[j] <= 0 else float(bw[j])
        return out

    def time_us(self, case: Case, algo: Algo, proto: Proto, transport: str, nc: np.ndarray,
                nt: np.ndarray, chunk: np.ndarray) -> np.ndarray:
        """Predicted time in µs of each (channels, threads, chunk) triple."""
        m, func, size = case.machine, case.func, float(case.nbytes)
        n, nodes = m.n_ranks, m.n_nodes
        if np.any(chunk == 0):
            # chunk 0 is NCCL's own choice, which depends on the channel count
            model = machine_model(m)
            own = {c: nccl_model.nccl_chunk(model, algo, proto, case.nbytes, int(c), func,
                                          max_chunk(algo, proto))
                   for c in np.unique(nc[chunk == 0])}
            chunk = np.where(chunk == 0, [own.get(c, 1) for c in nc], chunk)
        # the link capacity is the bus bandwidth of the graph NCCL's search builds on this
        # machine (cclc.nccl_model): all its channels, over all NICs/rails
        model = machine_model(m)
        graph = nccl_model.graph_busbw(model, Algo.RING if algo in (Algo.PAT, Algo.TREE)
                                     else algo)
        cap_gbs = graph * (SHM_BW_FACTOR if transport == "shm" else 1.0) * PROTO_EFFICIENCY[proto]
        if proto is Proto.LL:
            cap_gbs = min(cap_gbs, nccl_model.LL_MAX_BW[m.arch][nccl_model.scale_index(nodes)])
        if algo in (Algo.NVLS, Algo.NVLS_TREE):
            cap_gbs *= nccl_model.NVLS_EFFICIENCY[m.arch]
        sat = THREAD_SATURATION[proto] if algo is Algo.RING else 640
        demand = nc * _per_channel(algo, proto, m) * np.minimum(1.0, nt / sat)
        # threads beyond saturation add nothing to the copy rate but cost occupancy
        overshoot = 1 - THREAD_OVERSHOOT_PENALTY * np.maximum(0.0, nt - sat) / sat
        # congestion: channels asking for more than the link gives contend for it; the loss
        # grows with the log of the oversubscription (a few % per doubling)
        over = np.log2(np.maximum(1.0, demand / cap_gbs))
        bus = np.minimum(demand, cap_gbs) / (1 + CONGESTION * over) * overshoot
        # algbw: ring-like algorithms move (n-1)/n or 2(n-1)/n of the data per rank; a tree
        # (and a broadcast/reduce chain) streams the whole buffer through each link
        ring_like = algo in (Algo.RING, Algo.PAT, Algo.NVLS)
        if algo is Algo.NVLS and func is Func.ALLREDUCE:
            # the switch reduces (multimem.ld_reduce) and multicasts (multimem.st): each GPU
            # moves about the buffer once per direction instead of 2(n-1)/n of it
            alg = bus
            unit = size / n
        elif (ring_like and func in (Func.ALLREDUCE, Func.ALLGATHER, Func.REDUCESCATTER)
              or algo is Algo.NVLS_TREE):
            alg = bus / nccl_model.bus_factor(func.kind, n)
            unit = size / n
        else:
            alg = bus * (0.5 if func is Func.ALLREDUCE and algo is Algo.TREE else 1.0)
            unit = size
        log_nodes = math.ceil(math.log2(nodes)) if nodes > 1 else 0
        if algo is Algo.RING:
            syncs = nccl_model.nsteps(func, n) if func in (Func.ALLREDUCE, Func.ALLGATHER,
                                                         Func.REDUCESCATTER) else n - 1
            fill = 1 if func in (Func.ALLREDUCE, Func.ALLGATHER, Func.REDUCESCATTER) else n - 1
        elif algo is Algo.TREE:
            syncs = fill = 2 * (m.ppn - 1 + log_nodes)
        elif algo is Algo.PAT:
            syncs = fill = max(1, math.ceil(math.log2(n)))
        else:
            syncs, fill = 2, 1
        part = unit / nc                                       # bytes per channel per step
        ceff = np.maximum(1.0, np.minimum(chunk, part))
        loops = np.ceil(part / ceff)
        ch_rate = np.maximum(bus / nc, 1e-12) * 1e3           # bytes per µs per channel
        lat = nccl_model.latency_us(model, func, algo, proto, case.nbytes)
        if transport == "shm" and m.ppn > 1:
            lat += SHM_LAT_US * (m.ppn - 1)
        return (lat + size / np.maximum(alg * 1e3, 1e-12) + syncs * loops * SYNC_US[proto]
                + fill * ceff / ch_rate + syncs * nc * CHANNEL_US)

    def busbw_array(self, case: Case, algo: Algo, proto: Proto, transport: str,
                    nc: np.ndarray, nt: np.ndarray, chunk: np.ndarray) -> np.ndarray:
        t = self.time_us(case, algo, proto, transport, nc, nt, chunk)
        return case.nbytes / t / 1e3 * nccl_model.bus_factor(case.func.kind, case.machine.n_ranks)


# --- CSV replay ----------------------------------------------------------------------------

_CSV_REQUIRED = ("collective", "nbytes", "algorithm", "protocol", "channels", "busbw")
_CSV_OPTIONAL = ("transport", "threads", "chunk", "nranks", "nnodes")


def _lookup(names: Sequence[str], text: str, what: str, where: str) -> int:
    low = text.strip().lower().replace("_", "")
    for i, name in enumerate(names):
        if name.lower() == low:
            return i
    raise SemanticError(f"{where}: unknown {what} '{text}' (expected one of "
                        f"{', '.join(names)})")


class CsvProfiler(Profiler):
    """Replays measured busbw from a CSV file.

    Header (any order): ``collective,nbytes,algorithm,protocol,channels,busbw`` and optionally
    ``transport,threads,chunk,nranks,nnodes``. An empty optional cell matches any value.
    A configuration with no matching row is unmeasured (``None``).
    """

    name = "csv"

    def __init__(self, path: str):
        self.path = path
        try:
            with open(path, newline="", encoding="utf-8") as f:
                text = f.read()
        except OSError as err:
            raise SemanticError(f"cannot read measurements '{path}': {err.strerror}") from None
        except UnicodeDecodeError:
            raise SemanticError(f"cannot read measurements '{path}': it is not UTF-8 text "
                                "(a CSV file is expected)") from None
        self._digest = hashlib.sha256(text.encode()).hexdigest()[:16]
        rows = list(csv.DictReader(line for line in text.splitlines()
                                   if line.strip() and not line.lstrip().startswith("#")))
        if not rows:
            raise SemanticError(f"'{path}' has no measurement rows")
        header = {h.strip().lower() for h in rows[0]}
        missing = [c for c in _CSV_REQUIRED if c not in header]
        if missing:
            raise SemanticError(f"'{path}' lacks the column(s) {', '.join(missing)}")
        self._rows: dict[tuple, list[tuple]] = defaultdict(list)
        for line_no, raw in enumerate(rows, start=2):
            row = {k.strip().lower(): (v or "").strip() for k, v in raw.items() if k}
            where = f"{path}:{line_no}"
            func = Func(_lookup(FUNC_NAMES, row["collective"], "collective", where))
            algo = Algo(_lookup(ALGO_NAMES, row["algorithm"], "algorithm", where))
            proto = Proto(_lookup(PROTO_NAMES, row["protocol"], "protocol", where))
            try:
                nbytes, channels = int(row["nbytes"]), int(row["channels"])
                busbw = float(row["busbw"])
                opt = tuple(None if not row.get(k)
                            else (row[k] if k == "transport" else int(row[k]))
                            for k in _CSV_OPTIONAL)
            except ValueError as err:
                raise SemanticError(f"{where}: {err}") from None
            self._rows[(func, nbytes, algo, proto, channels)].append(opt + (busbw,))

    def identity(self) -> str:
        return f"csv:{os.path.abspath(self.path)}:{self._digest}"

    def measure(self, case: Case, configs: Sequence[Config]) -> list[float | None]:
        out: list[float | None] = []
        m = case.machine
        for c in configs:
            found = None
            for transport, threads, chunk, nranks, nnodes, busbw in self._rows.get(
                    (case.func, case.nbytes, c.algo, c.proto, c.channels), ()):
                if ((transport is None or transport == c.transport)
                        and (threads is None or threads == c.threads)
                        and (chunk is None or chunk == c.chunk)
                        and (nranks is None or nranks == m.n_ranks)
                        and (nnodes is None or nnodes == m.n_nodes)):
                    found = busbw
                    break
            out.append(found)
        return out


# --- nccl-tests ----------------------------------------------------------------------------

NCCL_TESTS_BINARY = {Func.BROADCAST: "broadcast_perf", Func.REDUCE: "reduce_perf",
                     Func.ALLGATHER: "all_gather_perf", Func.REDUCESCATTER: "reduce_scatter_perf",
                     Func.ALLREDUCE: "all_reduce_perf"}


def nccl_env(config: Config) -> dict[str, str]:
    """The NCCL_* environment that makes stock NCCL run ``config`` for every collective.

    Channels are pinned with MIN = MAX; threads go to NCCL_NTHREADS (LL, Simple) or
    NCCL_LL128_NTHREADS; the chunk is reached through the protocol's buffer size (chunk =
    buffSize / NCCL_STEPS × chunkSteps, §1.5); ``shm`` disables peer-to-peer.
    """
    env = {"NCCL_ALGO": ALGO_NAMES[config.algo], "NCCL_PROTO": PROTO_NAMES[config.proto],
           "NCCL_MIN_NCHANNELS": str(config.channels), "NCCL_MAX_NCHANNELS": str(config.channels)}
    if config.algo is Algo.RING:
        key = "NCCL_LL128_NTHREADS" if config.proto is Proto.LL128 else "NCCL_NTHREADS"
        env[key] = str(config.threads)
    if config.chunk == 0:
        pass                            # NCCL's own chunk: leave the buffers alone
    elif config.proto is Proto.SIMPLE:
        steps = NCCL_STEPS // 2 if config.algo is Algo.RING else 1
        env["NCCL_BUFFSIZE"] = str(config.chunk * NCCL_STEPS // steps)
    elif config.proto is Proto.LL:
        env["NCCL_LL_BUFFSIZE"] = str(config.chunk * 2 * NCCL_STEPS)
    else:
        env["NCCL_LL128_BUFFSIZE"] = str(config.chunk * 16 // 15 * NCCL_STEPS)
    if config.transport == "shm":
        env["NCCL_P2P_DISABLE"] = "1"
    return env


@dataclass(frozen=True, slots=True)
class NcclTestsRow:
    """One data line of nccl-tests output (out-of-place and in-place halves)."""

    size: int
    count: int
    type: str
    redop: str
    root: int
    time_us: float
    algbw: float
    busbw: float
    wrong: str
    in_time_us: float | None
    in_algbw: float | None
    in_busbw: float | None


def parse_nccl_tests(text: str) -> list[NcclTestsRow]:
    """The result rows of an nccl-tests run (``*_perf`` stdout).

    Columns are located from the ``# size count type redop root time algbw busbw #wrong``
    header, so extra columns (``-I 1``: i_min/i_max/...) and ``N/A`` in ``#wrong`` (``-c 0``)
    parse too. Raises :class:`SemanticError` when there is no header or no row.
    """
    columns: list[str] | None = None
    rows = []
    for line in text.splitlines():
        s = line.strip()
        if not s:
            continue
        if s.startswith("#"):
            tokens = s.lstrip("#").split()
            if "size" in tokens and "busbw" in tokens:
                columns = tokens
            continue
        if columns is None:
            continue
        tokens = s.split()
        if not tokens or not tokens[0].isdigit() or len(tokens) < columns.index("busbw") + 1:
            continue
        first = {name: columns.index(name) for name in ("size", "count", "type", "redop",
                                                        "root", "time", "algbw", "busbw")}
        # "#wrong" in the header; its first occurrence belongs to the out-of-place half
        wrong_i = columns.index("#wrong") if "#wrong" in columns else None
        second = {name: _second_index(columns, name) for name in ("time", "algbw", "busbw")}
        try:
            rows.append(NcclTestsRow(
                size=int(tokens[first["size"]]), count=int(tokens[first["count"]]),
                type=tokens[first["type"]], redop=tokens[first["redop"]],
                root=int(tokens[first["root"]]), time_us=float(tokens[first["time"]]),
                algbw=float(tokens[first["algbw"]]), busbw=float(tokens[first["busbw"]]),
                wrong=tokens[wrong_i] if wrong_i is not None and wrong_i < len(tokens) else "",
                in_time_us=_float_at(tokens, second["time"]),
                in_algbw=_float_at(tokens, second["algbw"]),
                in_busbw=_float_at(tokens, second["busbw"])))
        except (ValueError, IndexError):
            continue          # a warning line interleaved by another rank; not a result row
    if columns is None:
        raise SemanticError("no nccl-tests result header ('# size count type ... busbw') in "
                            "the output")
    if not rows:
        raise SemanticError("nccl-tests printed a header but no result rows")
    return rows


def _second_index(columns: list[str], name: str) -> int | None:
    hits = [i for i, c in enumerate(columns) if c == name]
    return hits[1] if len(hits) > 1 else None


def _float_at(tokens: list[str], i: int | None) -> float | None:
    if i is None or i >= len(tokens):
        return None
    try:
        return float(tokens[i])
    except ValueError:
        return None


Runner = Callable[[list[str], Mapping[str, str], float], str]


def _subprocess_runner(argv: list[str], env: Mapping[str, str], timeout: float) -> str:
    try:
        done = subprocess.run(argv, env={**os.environ, **env}, capture_output=True, text=True,
                              timeout=timeout, check=False)
    except FileNotFoundError:
        raise SemanticError(f"cannot run '{argv[0]}': no such program") from None
    except subprocess.TimeoutExpired:
        raise SemanticError(f"'{' '.join(argv)}' ran past {timeout:g} s") from None
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        raise SemanticError(f"'{' '.join(argv)}' exited with {done.returncode}: "
                            + " | ".join(tail))
    return done.stdout


class NcclTestsProfiler(Profiler):
    """Runs nccl-tests once per configuration.

    ``template`` is a command line with ``{binary}`` (all_reduce_perf, ...), ``{bytes}``,
    ``{nranks}``, ``{nnodes}`` and ``{ppn}``, e.g.
    ``mpirun -np {nranks} -x NCCL_ALGO -x NCCL_PROTO ./build/{binary} -b {bytes} -e {bytes}
    -g 1``. Each run gets :func:`nccl_env` of its configuration added to the environment
    (with mpirun, forward those variables: ``-x NCCL_*`` or the launcher's equivalent).
    """

    name = "nccl-tests"

    def __init__(self, template: str, runner: Runner | None = None, timeout: float = 600.0):
        if "{binary}" not in template or "{bytes}" not in template:
            raise SemanticError("the nccl-tests command template needs {binary} and {bytes} "
                                "placeholders")
        self.template = template
        self.runner = runner or _subprocess_runner
        self.timeout = timeout

    def identity(self) -> str:
        return f"nccl-tests:{self.template}"

    def command(self, case: Case) -> list[str]:
        m = case.machine
        try:
            text = self.template.format(binary=NCCL_TESTS_BINARY[case.func], bytes=case.nbytes,
                                        nranks=m.n_ranks, nnodes=m.n_nodes, ppn=m.ppn)
        except (KeyError, IndexError) as err:
            raise SemanticError(f"unknown placeholder {err} in the nccl-tests template") from None
        return shlex.split(text)

    def measure(self, case: Case, configs: Sequence[Config]) -> list[float | None]:
        out: list[float | None] = []
        argv = self.command(case)
        for c in configs:
            rows = parse_nccl_tests(self.runner(argv, nccl_env(c), self.timeout))
            row = min(rows, key=lambda r: abs(r.size - case.nbytes))
            out.append(row.busbw if row.busbw > 0 else None)
        return out


def profiler_from_spec(spec: str) -> Profiler:
    """``model``, ``csv:PATH`` or ``nccl-tests:TEMPLATE`` (the CLI's --profiler)."""
    if spec == "model":
        return ModelProfiler()
    if spec.startswith("csv:"):
        return CsvProfiler(spec[4:])
    if spec.startswith("nccl-tests:"):
        return NcclTestsProfiler(spec[len("nccl-tests:"):])
    raise SemanticError(f"unknown profiler '{spec}': use model, csv:PATH or nccl-tests:TEMPLATE")
