"""NCCL's own cost tables and its default choice (src/graph/tuning.cc, src/enqueue.cc).

Self-contained in cclc/tune (cclc/nccl_model.py did not exist when this was written). Two
uses: the constants are the starting point of the model profiler, and :func:`nccl_default`
predicts what stock NCCL would run — algorithm/protocol by the argmin of its time estimate,
channels and threads by its size heuristic, the default chunk — so that a tuned result can be
reported as a gain over NCCL. Facts: NCCL's ``src/graph/tuning.cc`` and ``src/graph/topo.h``;
lines marked *derived* are this module's approximations of quantities NCCL measures at init
(graph bandwidths).
"""

from __future__ import annotations

import math

from cclc.tune.space import (
    DEFAULT_THREADS,
    Algo,
    Config,
    Func,
    Machine,
    Proto,
    Space,
    Subspace,
    max_chunk,
)

__all__ = [
    "ARCHS",
    "nccl_chunk",
    "BASE_LAT",
    "HW_LAT",
    "LL_MAX_BW",
    "NVLS_EFFICIENCY",
    "PER_CH_NVLS_TREE",
    "PER_CH_RING_LL128",
    "PER_CH_TREE",
    "PER_CH_TREE_LL128",
    "bus_factor",
    "default_point",
    "nccl_default",
    "nccl_time",
    "nsteps",
    "scale_index",
]

ARCHS = ("volta", "ampere", "hopper", "blackwell")

# baseLat [algo][LL, LL128, Simple] in µs
BASE_LAT = {Algo.TREE: (6.8, 14.0, 8.4), Algo.RING: (6.6, 14.0, 8.4),
            Algo.COLLNET_DIRECT: (0.0, 0.0, 0.0), Algo.COLLNET_CHAIN: (0.0, 0.0, 0.0),
            Algo.NVLS: (0.0, 0.0, 0.0), Algo.NVLS_TREE: (0.0, 0.0, 0.0), Algo.PAT: (8.0, 8.0, 8.0)}
# hwLat [link][algo][proto] in µs; entries not listed here are 0 (NCCL's table
# has zeros for unsupported combinations)
HW_LAT = {
    "nvlink": {Algo.TREE: (0.6, 1.25, 4.0), Algo.RING: (0.6, 1.9, 3.4),
               Algo.COLLNET_DIRECT: (0.0, 0.0, 3.7), Algo.COLLNET_CHAIN: (0.0, 0.0, 2.8),
               Algo.NVLS: (0.0, 0.0, 25.0), Algo.NVLS_TREE: (0.0, 0.0, 25.0),
               Algo.PAT: (0.0, 0.0, 4.0)},
    "pci": {Algo.TREE: (1.0, 1.9, 4.0), Algo.RING: (1.0, 2.5, 5.7),
            Algo.COLLNET_DIRECT: (0.0, 0.0, 3.7), Algo.COLLNET_CHAIN: (0.0, 0.0, 2.8),
            Algo.NVLS: (0.0, 0.0, 0.0), Algo.NVLS_TREE: (0.0, 0.0, 0.0),
            Algo.PAT: (0.0, 0.0, 4.0)},
    "net": {Algo.TREE: (5.0, 8.5, 14.0), Algo.RING: (2.7, 4.0, 14.0),
            Algo.COLLNET_DIRECT: (0.0, 0.0, 31.0), Algo.COLLNET_CHAIN: (0.0, 0.0, 30.0),
            Algo.NVLS: (0.0, 0.0, 18.0), Algo.NVLS_TREE: (0.0, 0.0, 20.9),
            Algo.PAT: (0.0, 0.0, 14.0)},
}
# [arch][1 node, 2 nodes, 4+ nodes], GB/s
LL_MAX_BW = {"volta": (39.0, 39.0, 20.4), "ampere": (87.7, 22.5, 19.0),
             "hopper": (141.0, 45.0, 35.0), "blackwell": (282.0, 90.0, 70.0)}
PER_CH_RING_LL128 = {"volta": 20.0, "ampere": 20.0, "hopper": 36.7, "blackwell": 40.0}
# Volta/Ampere values were not taken from NCCL: their Ring LL128 per-channel cap stands in
PER_CH_TREE_LL128 = {"volta": (20.0, 20.0, 20.0), "ampere": (20.0, 20.0, 20.0),
                     "hopper": (36.7, 36.7, 29.0), "blackwell": (55.6, 31.67, 20.0)}
PER_CH_TREE = {"volta": (26.5, 18.5, 10.0), "ampere": (24.0, 23.6, 17.8),
               "hopper": (38.7, 41.4, 36.0), "blackwell": (70.0, 42.8, 24.0)}
PER_CH_NVLS_TREE = {"volta": (0.0, 0.0, 0.0), "ampere": (0.0, 0.0, 0.0),
                    "hopper": (0.0, 57.7, 45.5), "blackwell": (0.0, 96.0, 80.0)}
NVLS_EFFICIENCY = {"volta": 0.0, "ampere": 0.0, "hopper": 0.85, "blackwell": 0.74}
NET_OVERHEAD_US = 1.0      # Intel hosts (2.0 on AMD), ×3 for Simple


def scale_index(n_nodes: int) -> int:
    """NCCL's tuning scale: 1 node, 2 nodes, 4 (or more) nodes."""
    return 0 if n_nodes <= 1 else 1 if n_nodes == 2 else 2


def nsteps(func: Func, n: int) -> int:
    """Ring steps: 2(n-1) for AllReduce, n-1 for AllGather/ReduceScatter, n otherwise."""
    if func is Func.ALLREDUCE:
        return 2 * (n - 1)
    if func in (Func.ALLGATHER, Func.REDUCESCATTER):
        return n - 1
    return n


def bus_factor(func: Func, n: int) -> float:
    """nccl-tests busbw = algbw × this (§4)."""
    if func is Func.ALLREDUCE:
        return 2 * (n - 1) / n
    if func in (Func.ALLGATHER, Func.REDUCESCATTER):
        return (n - 1) / n
    return 1.0


def _link_kind(m: Machine) -> str:
    return "nvlink" if m.interconnect == "nvswitch" else "pci"


def graph_bw(m: Machine) -> float:
    """busBw of NCCL's graph in GB/s: nChannels × per-channel bw ≈ the bottleneck link
    (derived: NCCL's graph search measures bwIntra/bwInter; this uses the topology's)."""
    if m.n_nodes <= 1:
        return m.intra_bw / 1e9
    intra = m.intra_bw if m.ppn > 1 else math.inf
    return min(intra, m.inter_bw) / 1e9


def latencies(algo: Algo, proto: Proto, m: Machine) -> tuple[float, float]:
    """(intraLat, interLat) in µs: NCCL's hardware latency plus the topology's path latency."""
    intra = HW_LAT[_link_kind(m)][algo][proto] + m.intra_lat * 1e6
    inter = HW_LAT["net"][algo][proto] + m.inter_lat * 1e6 * (2 if proto is Proto.SIMPLE else 1)
    return intra, inter


def nccl_latency(func: Func, algo: Algo, proto: Proto, m: Machine, nbytes: int,
                 channels: int) -> float:
    """NCCL's latency term in µs (§7), numPipeOps = 1."""
    n, nodes, ppn = m.n_ranks, m.n_nodes, m.ppn
    base = BASE_LAT[algo][proto]
    intra, inter = latencies(algo, proto, m)
    log_nodes = math.log2(nodes) if nodes > 1 else 0.0
    if algo is Algo.RING:
        steps = nsteps(func, n) if func in (Func.ALLREDUCE, Func.ALLGATHER,
                                            Func.REDUCESCATTER) else n - 1
        inter_steps = (2 * (nodes - 1) if func is Func.ALLREDUCE else nodes - 1)
        overhead = NET_OVERHEAD_US * (3 if proto is Proto.SIMPLE else 1) if nodes > 1 else 0.0
        lat = base + (steps - inter_steps) * max(intra, overhead) + inter_steps * inter
        if (func is Func.ALLREDUCE and proto is Proto.SIMPLE and nodes > 1
                and nbytes / (channels * n) >= 64):
            lat *= 1.4
        return lat
    if algo is Algo.TREE:
        return base + 2 * ((ppn - 1) * intra + log_nodes * inter)
    if algo is Algo.PAT:
        return 8.0 + log_nodes * (inter / 3.5) + n * 2.8
    if algo is Algo.NVLS:
        return intra + (inter if nodes > 1 else 0.0)
    if algo is Algo.NVLS_TREE:
        return base + intra + 2 * log_nodes * inter
    return base + intra + (inter if nodes > 1 else 0.0)          # CollNet


def nccl_bus_bw(func: Func, algo: Algo, proto: Proto, m: Machine, channels: int) -> float:
    """NCCL's modelled bus bandwidth in GB/s with its per-protocol refinements (§7)."""
    arch, scale = m.arch, scale_index(m.n_nodes)
    bus = graph_bw(m)
    if algo is Algo.RING:
        if proto is Proto.LL:
            return min(LL_MAX_BW[arch][scale], bus * 0.5)
        if proto is Proto.LL128:
            return min(bus * 0.92, channels * PER_CH_RING_LL128[arch])
        return bus
    if algo is Algo.TREE:
        if proto is Proto.SIMPLE:
            return min(bus * 0.92, channels * PER_CH_TREE[arch][scale])
        if proto is Proto.LL:
            return min(bus / 3.8, LL_MAX_BW[arch][scale])
        frac = 7 / 9 if m.n_nodes == 1 else 120 / 128
        return min(bus * frac, channels * PER_CH_TREE_LL128[arch][scale])
    if algo is Algo.PAT:
        return bus * 0.75
    if algo in (Algo.NVLS, Algo.NVLS_TREE):
        nv = m.intra_bw / 1e9 * NVLS_EFFICIENCY[arch] * (channels - 1) / max(channels, 1)
        if func is Func.ALLREDUCE:
            nv *= 2
        if algo is Algo.NVLS_TREE:
            nv = min(nv, channels * max(PER_CH_NVLS_TREE[arch][scale], 1e-9),
                     m.inter_bw / 1e9 if m.n_nodes > 1 else math.inf)
        elif m.n_nodes > 1:
            nv = min(nv, m.inter_bw / 1e9)
        return nv
    return bus


def nccl_alg_bw(func: Func, algo: Algo, proto: Proto, m: Machine, channels: int) -> float:
    """busBw converted to algbw the way NCCL does (Ring/NVLS ×n/nsteps, others ×0.5)."""
    bus = nccl_bus_bw(func, algo, proto, m, channels)
    if algo in (Algo.RING, Algo.NVLS):
        return bus * m.n_ranks / nsteps(func, m.n_ranks)
    if func in (Func.ALLGATHER, Func.REDUCESCATTER):
        return bus
    return bus * 0.5


def nccl_time(func: Func, algo: Algo, proto: Proto, m: Machine, nbytes: int) -> float | None:
    """NCCL's estimated time in µs (what it writes into the tuner cost table), or ``None``
    where its bandwidth is 0 (the IGNORE entries)."""
    channels = m.nccl_channels
    bw = nccl_alg_bw(func, algo, proto, m, channels)
    if bw <= 0:
        return None
    return nccl_latency(func, algo, proto, m, nbytes, channels) + nbytes / (1000 * bw)


def nccl_chunk(algo: Algo, proto: Proto, m: Machine, nbytes: int, channels: int,
                func: Func = Func.ALLREDUCE) -> int:
    """The chunk NCCL itself uses: the protocol default, halved for pipelined trees and PAT
    while the buffer would give each channel too few chunks to fill the pipeline.

    PAT follows §5 (AllGather halves while chunk·nCh·32 > nBytes, ReduceScatter ·16, floor
    64 KiB). The tree rule (depth·8 / ·4 / ·1 chunks per channel, floors 128/64/32 KiB) is
    derived from enqueue.cc's chunk tuning and is approximate.
    """
    chunk = max_chunk(algo, proto)
    nc = max(1, channels)
    if algo is Algo.PAT:
        factor = 32 if func is Func.ALLGATHER else 16
        while chunk * nc * factor > nbytes and chunk > 65536:
            chunk //= 2
    elif algo in (Algo.TREE, Algo.NVLS_TREE, Algo.COLLNET_CHAIN) and proto is not Proto.LL:
        depth = max(1, m.ppn - 1 + (math.ceil(math.log2(m.n_nodes)) if m.n_nodes > 1 else 0))
        for per_channel, floor in ((8, 131072), (4, 65536), (1, 32768)):
            while nbytes / (nc * chunk) < depth * per_channel and chunk > floor:
                chunk //= 2
    return chunk


def _thread_threshold(algo: Algo, proto: Proto, n: int) -> int:
    if proto is Proto.LL:
        return 8 * (n if algo is Algo.RING else 1)
    if proto is Proto.LL128:
        return 8
    return 64


def nccl_default(space: Space, nbytes: int) -> Config:
    """What stock NCCL runs for ``nbytes`` on ``space``'s machine.

    Algorithm/protocol: argmin of :func:`nccl_time` over the space's subspaces (default
    transport); channels/threads: NCCL's heuristic (channels drop while
    ``nBytes < nc·nt·threshold``, then threads halve); chunk: the protocol default.
    """
    m = space.machine
    best: tuple[float, Algo, Proto] | None = None
    for sub in space.subspaces:
        if sub.transport != "p2p":
            continue
        t = nccl_time(space.func, sub.algo, sub.proto, m, nbytes)
        if t is not None and (best is None or t < best[0]):
            best = (t, sub.algo, sub.proto)
    if best is None:
        # cannot happen for a space built by space_for (Ring always exists); keep Ring/Simple
        best = (0.0, Algo.RING, Proto.SIMPLE)
    _, algo, proto = best
    sub = space.subspace(algo, proto, "p2p")
    assert sub is not None
    return default_point(space, sub, nbytes)


def default_point(space: Space, sub: Subspace, nbytes: int) -> Config:
    """NCCL's resources inside the implementation ``sub``: its channel/thread size heuristic
    and the protocol's default chunk (snapped to the subspace's axes)."""
    m, algo, proto = space.machine, sub.algo, sub.proto
    nc = min(m.nccl_channels, max(sub.channels))
    nt = DEFAULT_THREADS[proto] if algo is Algo.RING else 640
    threshold = _thread_threshold(algo, proto, m.n_ranks)
    while nbytes < nc * nt * threshold:
        if nc >= 2:
            nc -= 1
        elif nt % 128 == 0 and algo is Algo.RING:
            nt //= 2
        else:
            break
    nt = min(sub.threads, key=lambda v: abs(v - nt))
    chunk = 0
    if sub.chunks != (0,):
        own = nccl_chunk(algo, proto, m, nbytes, nc, space.func)
        chunk = min(sub.chunks, key=lambda v: abs(v - own))
    return Config(algo, proto, sub.transport, nc, nt, chunk)
