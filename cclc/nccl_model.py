"""The one model of NCCL: what its topology search builds and what its cost model predicts.

Every "vs NCCL" figure of cclc (compile and sim reports, ``cclc tune``'s baseline, the
benchmarks) comes from this module; :mod:`cclc.nccl_comparison` sets it beside cclc's own.
It replays, on a cclc topology, the two things NCCL does at communicator init and at every
call:

1. **Topology search** (NCCL ``src/graph/search.cc`` ``ncclTopoCompute``; ``paths.cc``): a
   ring graph (and a tree graph, the same channels: :func:`_tree_of`) is a set of channels, each
   with a per-channel bandwidth ``bwIntra``/``bwInter`` taken from NCCL's list of candidate
   speeds (one list per GPU generation, inside a node and across nodes). The search starts at
   the fastest speed the GPU's paths allow, packs as many channels as the links hold at that
   speed (across nodes: each channel leaves the node through one NIC, so the channels spread
   over all NICs/rails), keeps the graph with the largest ``nChannels x bw``, stops once
   that reaches the GPU's total bandwidth, and tries lower speeds only while they are more
   than 0.49 of the best found. Then ``ncclTopoDupChannels`` doubles the channels (halving
   their bandwidth) when ``bwIntra >= 25``, except on sm80+ with ``bwIntra < 50`` and more
   than 4 channels. The communicator runs twice the graph's channels (``ncclTopoPostset``).
2. **Tuning model** (``src/graph/tuning.cc`` ``ncclTopoTuneModel`` and
   ``ncclTopoGetAlgoTime``, NCCL 2.28-2.29 constants and NVLS formulas): per algorithm and
   protocol a bus
   bandwidth ``nChannels x bw`` with NCCL's protocol caps, the tree correction factors and
   NVLS efficiency, converted to algorithm bandwidth, plus a latency from NCCL's default
   constants; time = latency + bytes / algbw. NCCL runs the argmin. Channels and threads
   follow NCCL's size heuristic (``src/enqueue.cc``).

How NCCL sees the hardware (its constants, not the link's marketing figure): an NVLink counts
``NCCL per-link bandwidth`` (20 GB/s on Volta/Ampere, 20.6 on Hopper, 40.1 on Blackwell) per
physical link (25 GB/s each, 50 on Blackwell); a GPU reaches its NIC through a PCIe switch that
NCCL rates at 12 / 24 / 48 GB/s (Gen3 on Volta, Gen4 on Ampere, Gen5 on Hopper and later);
PCIe links and NICs are taken as declared (the examples declare PCIe as NCCL rates it).

Known simplifications (docs/nccl-model.md lists where the model is weak): the tree graph is the
ring graph (BALANCED_TREE) except on one-GPU nodes, where it follows NCCL's plain TREE pattern
(:func:`_tree_of`); Broadcast and Reduce rings take NCCL's ``sameChannels`` latency; the
NVLS graph follows NCCL 2.27 search.cc's NVLS rules in closed form (heads, NVLink load, NIC
path) rather than a path search; CollNet/SHARP is never on,
because a cclc topology cannot declare in-network reduction; link faults inside the fabric are
invisible to NCCL's search and so to this model; on a three-tier fabric the choice is made
fabric-blind, as NCCL makes it, and its time then held to what the pods' core links carry
(:mod:`cclc.nccl_fabric`); a torus is seen as one NVLink domain whose
rings use one link per hop.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from enum import IntEnum
from pathlib import Path

import numpy as np

from cclc.collective import Collective, CollectiveKind
from cclc.errors import CollectiveError
from cclc.nccl_fabric import CoreLimits, core_limits
from cclc.topology import LinkKind, Topology

__all__ = [
    "ARCHS",
    "BASE_LAT",
    "CALIBRATION_DATA",
    "CALIBRATION_TOLERANCE",
    "COMPUTE_CAPABILITY",
    "DEFAULT_THREADS",
    "HW_LAT",
    "LL_MAX_BW",
    "MAX_CHANNELS",
    "NVLINK",
    "NVLS_EFFICIENCY",
    "PER_CH_NVLS_TREE",
    "PER_CH_RING_LL128",
    "PER_CH_TREE",
    "PER_CH_TREE_LL128",
    "Algo",
    "Func",
    "Graph",
    "NcclChoice",
    "NcclModel",
    "NcclSystem",
    "NvlinkRate",
    "Proto",
    "bus_factor",
    "cost_table",
    "gpu_nic_bandwidth",
    "graph_busbw",
    "latency_us",
    "max_threads",
    "nccl_choice",
    "nccl_chunk",
    "nccl_estimate",
    "nccl_init",
    "nccl_resources",
    "nccl_time",
    "nsteps",
    "nvlink_as_nccl_sees_it",
    "scale_index",
    "system_of",
    "table_bandwidth",
    "thread_threshold",
]

class Algo(IntEnum):
    """NCCL_ALGO_* indices (rows of the tuner cost table)."""

    TREE = 0
    RING = 1
    COLLNET_DIRECT = 2
    COLLNET_CHAIN = 3
    NVLS = 4
    NVLS_TREE = 5
    PAT = 6


class Proto(IntEnum):
    """NCCL_PROTO_* indices (columns of the tuner cost table)."""

    LL = 0
    LL128 = 1
    SIMPLE = 2


class Func(IntEnum):
    """ncclFunc_t values that have a cost table (NCCL_NUM_FUNCTIONS == 5)."""

    BROADCAST = 0
    REDUCE = 1
    ALLGATHER = 2
    REDUCESCATTER = 3
    ALLREDUCE = 4

    @property
    def kind(self) -> CollectiveKind:
        """The collective this NCCL function runs."""
        return CollectiveKind[self.name]


ARCHS = ("volta", "ampere", "hopper", "blackwell")

#: The published measurements the model is checked against (nccl-tests figures for real
#: machines, each row with its source), shipped with the package.
CALIBRATION_DATA = Path(__file__).resolve().parent / "data" / "nccl_published.csv"
#: The relative error the model is checked to against :data:`CALIBRATION_DATA`: a predicted
#: difference from NCCL smaller than this is not a claim the model can carry.
CALIBRATION_TOLERANCE = 0.25

# -- ncclTunerConstantsDefaults (µs, GB/s), NCCL 2.29 src/graph/tuning.cc ---------------------
# baseLat [algo][LL, LL128, Simple]
BASE_LAT = {Algo.TREE: (6.8, 14.0, 8.4), Algo.RING: (6.6, 14.0, 8.4),
            Algo.COLLNET_DIRECT: (0.0, 0.0, 0.0), Algo.COLLNET_CHAIN: (0.0, 0.0, 0.0),
            Algo.NVLS: (0.0, 0.0, 0.0), Algo.NVLS_TREE: (0.0, 0.0, 0.0), Algo.PAT: (8.0, 8.0, 8.0)}
# hwLat [link][algo][proto]; NCCL's table has zeros for combinations that do not exist
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
# [arch][1 node, 2 nodes, 4+ nodes]
LL_MAX_BW = {"volta": (39.0, 39.0, 20.4), "ampere": (87.7, 22.5, 19.0),
             "hopper": (141.0, 45.0, 35.0), "blackwell": (282.0, 90.0, 70.0)}
PER_CH_RING_LL128 = {"volta": 20.0, "ampere": 20.0, "hopper": 36.7, "blackwell": 40.0}
# NCCL has Hopper/Blackwell rows only; older GPUs use their Ring LL128 cap
PER_CH_TREE_LL128 = {"volta": (20.0, 20.0, 20.0), "ampere": (20.0, 20.0, 20.0),
                     "hopper": (36.7, 36.7, 29.0), "blackwell": (55.6, 31.67, 20.0)}
PER_CH_TREE = {"volta": (26.5, 18.5, 10.0), "ampere": (24.0, 23.6, 17.8),
               "hopper": (38.7, 41.4, 36.0), "blackwell": (70.0, 42.8, 24.0)}
PER_CH_NVLS_TREE = {"volta": (0.0, 0.0, 0.0), "ampere": (0.0, 0.0, 0.0),
                    "hopper": (0.0, 57.7, 45.5), "blackwell": (0.0, 96.0, 43.8)}
NVLS_EFFICIENCY = {"volta": 0.0, "ampere": 0.0, "hopper": 0.85, "blackwell": 0.74}
NET_OVERHEAD_US = 1.0      # Intel hosts (2.0 on AMD); x3 for Simple
# tuning.cc: tree AllReduce bandwidth x this, by log2(nBytes / 64), 64 B .. 256 MiB
TREE_CORRECTION = (
    (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0,
     1.0, 1.0),
    (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9,
     1.0, 1.0),
    (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9),
)

# -- topology search (search.cc) -------------------------------------------------------------
_SPEEDS_INTRA = {"old": (40.0, 30.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0,
                         3.0),
                 "hopper": (60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0),
                 "blackwell": (90.0, 80.0, 70.0, 60.0, 50.0, 45.0, 40.0, 30.0, 24.0, 20.0, 19.0,
                               18.0)}
_SPEEDS_INTER = {"old": (48.0, 30.0, 28.0, 24.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0,
                         5.0, 4.0, 3.0, 2.4, 1.2, 0.24, 0.12),
                 "hopper": (48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0,
                            6.0, 3.0, 2.4, 1.2, 0.24, 0.12),
                 "blackwell": (96.0, 80.0, 48.0, 45.1, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5,
                               15.0, 12.0, 6.0, 3.0, 2.4, 1.2, 0.24, 0.12)}


@dataclass(frozen=True, slots=True)
class NvlinkRate:
    """One NVLink generation's bandwidth per link and direction, two ways: ``hardware``
    (bytes/s), the link's rate as cclc's hand-written examples and the NCCL XML import declare
    it; ``nccl`` (GB/s), the figure NCCL's own model counts for it."""

    hardware: float
    nccl: float


#: The one NVLink table, by the GPU's compute capability (``sm``): the hardware's rate (NVLink1
#: on P100 20 GB/s, NVLink2-4 on V100/A100/H100 25 GB/s, NVLink5 on B200/B300 50 GB/s) and
#: NCCL's derated figure (NVIDIA/nccl 5067397c2676d5aed50042fc39e5c8ee96eb0027,
#: src/graph/topo.h ``SM60_NVLINK_BW`` ... ``SM100_NVLINK_BW``: 18, 20, 20, 20.6, 40.1 GB/s).
NVLINK = {60: NvlinkRate(20e9, 18.0), 70: NvlinkRate(25e9, 20.0), 80: NvlinkRate(25e9, 20.0),
          90: NvlinkRate(25e9, 20.6), 100: NvlinkRate(50e9, 40.1),
          103: NvlinkRate(50e9, 40.1)}
# the PCIe switch between a GPU and its NIC as NCCL rates it (Gen3 / Gen4 / Gen5 x16)
_GPU_NIC_PCIE = {"volta": 12.0, "ampere": 24.0, "hopper": 48.0, "blackwell": 48.0}
#: the compute capability NCCL's tables are keyed by, per GPU generation
COMPUTE_CAPABILITY = {"volta": 70, "ampere": 80, "hopper": 90, "blackwell": 100}
#: NCCL's channel limit: NCCL_MIN/MAX_NCHANNELS are clamped to it (NVIDIA/nccl 5067397c,
#: src/include/device.h ``MAXCHANNELS``)
MAX_CHANNELS = 64
_GRAPH_MAX_CHANNELS = 32       # ring/tree graphs search up to MAXCHANNELS/2
_NVLS_CHANNELS = {"hopper": 16, "blackwell": 16}   # NCCL_NVLS_NCHANNELS default
#: the threads NCCL's ring kernels run per protocol, the most each may (NVIDIA/nccl 5067397c,
#: src/include/device.h ``NCCL_LL_MAX_NTHREADS``, ``NCCL_LL128_MAX_NTHREADS``,
#: ``NCCL_SIMPLE_MAX_NTHREADS``)
DEFAULT_THREADS = {Proto.LL: 512, Proto.LL128: 640, Proto.SIMPLE: 512}
_MAX_NTHREADS = 640             # NCCL_MAX_NTHREADS: what tree and PAT kernels run
_PCI_BW = 12.0                  # tuning.cc PCI_BW: a ring this slow runs 256 Simple threads


@dataclass(frozen=True, slots=True)
class NcclSystem:
    """The machine as NCCL's search sees it (GB/s, NCCL's own figures)."""

    arch: str
    n_ranks: int
    n_nodes: int
    intra: str                 # "nvlink" | "pci": the GPU's link inside a node
    gpu_bw: float              # one GPU's total intra-node bandwidth (NCCL's totalBw)
    nics: int = 0              # NICs per node the group's GPUs use
    nic_bw: float = 0.0        # each NIC
    gpu_nic_bw: float = 0.0    # GPU -> NIC path (the PCIe switch), NCCL's figure
    nvswitch: bool = False

    @property
    def ppn(self) -> int:
        return self.n_ranks // self.n_nodes

    @property
    def nvls(self) -> bool:
        """NVLink SHARP: NVSwitch nodes of Hopper or later, more than one GPU per node."""
        return self.nvswitch and self.ppn > 1 and self.arch in ("hopper", "blackwell")


@dataclass(frozen=True, slots=True)
class Graph:
    """One graph of the search: ``n_channels`` channels of ``bw_intra``/``bw_inter`` GB/s.
    ``simple_tree``: a tree graph of NCCL's plain TREE pattern (not BALANCED_TREE), whose
    Tree bandwidth NCCL takes at 0.85."""

    n_channels: int
    bw_intra: float
    bw_inter: float
    simple_tree: bool = False

    @property
    def total(self) -> float:
        return self.n_channels * self.bw_inter


@dataclass(frozen=True, slots=True)
class NcclModel:
    """What NCCL has after init: its graphs and the communicator's channel counts."""

    system: NcclSystem
    ring: Graph
    tree: Graph
    nvls: Graph | None
    channels: int              # comm->nChannels (ring/tree collectives)
    nvls_channels: int


@dataclass(frozen=True, slots=True)
class NcclChoice:
    """What NCCL runs for one call: its argmin, its resources, its predicted time (µs)."""

    func: Func
    nbytes: int
    algo: Algo
    proto: Proto
    time_us: float
    channels: int
    threads: int
    table: tuple[tuple[Algo, Proto, float | None], ...]
    model: NcclModel
    #: the bus bandwidth (GB/s) a three-tier fabric's core held the choice to, when it did
    #: (:func:`nccl_estimate`; ``time_us`` includes it)
    core_limit: float | None = None

    @property
    def name(self) -> str:
        return f"{self.algo.name.lower()}/{self.proto.name.lower()}"

    @property
    def algbw(self) -> float:
        """GB/s, nccl-tests' definition (size / time)."""
        return self.nbytes / self.time_us / 1e3

    @property
    def busbw(self) -> float:
        return self.algbw * bus_factor(self.func.kind, self.model.system.n_ranks)


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


def bus_factor(kind: CollectiveKind, n: int) -> float:
    """nccl-tests' bus-bandwidth factor for ``kind`` on ``n`` ranks: busbw = algbw x this.

    ``2(n-1)/n`` for allreduce, ``(n-1)/n`` for allgather, reducescatter and alltoall, ``1``
    for broadcast and reduce (NVIDIA/nccl-tests a0b82b2260cf5152b9f8c061bbf7eaf0ba096432,
    ``src/alltoall.cu`` ``AlltoAllGetBw``: ``factor = (nranks-1)/nranks``; the same in
    ``src/all_gather.cu`` ``AllGatherGetBw``). The one factor of cclc: the simulator, the page,
    the tuner's profilers and the benchmarks all use this function.

    >>> bus_factor(CollectiveKind.ALLTOALL, 8), bus_factor(CollectiveKind.ALLREDUCE, 8)
    (0.875, 1.75)
    """
    if kind is CollectiveKind.ALLREDUCE:
        return 2 * (n - 1) / n
    if kind in (CollectiveKind.ALLGATHER, CollectiveKind.REDUCESCATTER, CollectiveKind.ALLTOALL):
        return (n - 1) / n
    return 1.0


# -- the machine ------------------------------------------------------------------------------

def _gb(bytes_per_s: float) -> float:
    return float(bytes_per_s) / 1e9


def _check_arch(arch: str) -> None:
    if arch not in ARCHS:
        raise CollectiveError(f"unknown GPU architecture '{arch}'; known: {', '.join(ARCHS)}")


def gpu_nic_bandwidth(arch: str) -> float:
    """NCCL's figure for the PCIe switch between a GPU and its NIC (GB/s)."""
    return _GPU_NIC_PCIE[arch]


def nvlink_as_nccl_sees_it(declared_gbs: float, arch: str) -> float:
    """A GPU's NVLink bandwidth in NCCL's units: whole links x NCCL's per-link figure."""
    rate = NVLINK[COMPUTE_CAPABILITY[arch]]
    links = max(1, round(declared_gbs / (rate.hardware / 1e9)))
    return links * rate.nccl


def system_of(topology: Topology, group: tuple[int, ...] | list[int] | None = None,
              arch: str = "hopper") -> NcclSystem:
    """The :class:`NcclSystem` of ranks ``group`` (default: all live ranks) of ``topology``."""
    _check_arch(arch)
    ranks = list(group) if group is not None else list(topology.live_ranks())
    n = len(ranks)
    src, dst, kind = topology.link_src, topology.link_dst, topology.link_kind
    healthy = ~topology.link_failed
    r0 = ranks[0]
    if topology.kind == "torus" or topology.node_of_rank is None:
        out = topology.link_bandwidth[(src == r0) & healthy]
        # point-to-point NVLink without a switch (a DGX-1-like mesh): one NVLink domain whose
        # rings use one link per hop
        return NcclSystem(arch, n, 1, "nvlink", _gb(out.max(initial=0.0)))
    node_of = topology.node_of_rank
    nodes = sorted({int(node_of[r]) for r in ranks})
    intra = np.flatnonzero((src == r0) & healthy & np.isin(kind, (LinkKind.NVLINK,
                                                                  LinkKind.PCIE)))
    to_switch = [int(k) for k in intra
                 if topology.vertex_names[dst[k]].endswith((".nvswitch", ".pcie"))]
    nvswitch = any(kind[k] == LinkKind.NVLINK for k in to_switch)
    declared = _gb(topology.link_bandwidth[to_switch].max()) if to_switch else 0.0
    gpu_bw = nvlink_as_nccl_sees_it(declared, arch) if nvswitch else declared
    nics, nic_bw, gpu_nic = 0, 0.0, 0.0
    if len(nodes) > 1:
        nics, nic_bw = _group_nics(topology, ranks, nodes, nvswitch)
        if nvswitch or len(nodes) == n:
            gpu_nic = min(nic_bw, gpu_nic_bandwidth(arch))
        else:
            gpu_nic = min(nic_bw, declared)      # NIC and GPU share the declared PCIe switch
        if not to_switch:
            gpu_bw = gpu_nic * max(nics, 1)
    intra_hw = "nvlink" if nvswitch else "pci"
    return NcclSystem(arch, n, len(nodes), intra_hw, gpu_bw, nics, nic_bw, gpu_nic, nvswitch)


def _group_nics(topology: Topology, ranks: list[int], nodes: list[int], nvswitch: bool
                ) -> tuple[int, float]:
    """The NICs per node that the group's GPUs use, and the slowest one's bandwidth (GB/s),
    as NCCL settles them: each rank's search sees its own node, and every graph then takes
    the fewest channels and the lowest bandwidth over all ranks (NVIDIA/nccl v2.28.9,
    src/init.cc, the ``graphInfo`` loop after the third allgather), so the worst node
    decides. A failed NIC is not there for NCCL (its port is down). With one GPU per node
    each keeps the NICs on its PCIe switch; where all of those failed it reaches another
    GPU's over NVLink (PXN, src/graph/paths.cc ``ncclTopoComputePaths``: a path through the
    NVLink peer whose PCIe switch holds the NIC) at that NIC's bandwidth."""
    src, kind = topology.link_src, topology.link_kind
    uplink = ~topology.link_failed & np.isin(kind, (LinkKind.IB, LinkKind.ETH))
    up = np.bincount(src[uplink], weights=topology.link_bandwidth[uplink],
                     minlength=topology.n_vertices)
    nic_node = topology.nic_nodes()
    nic_of_node: dict[int, list[int]] = {h: [] for h in nodes}
    for v in np.flatnonzero(nic_node >= 0).tolist():
        if int(nic_node[v]) in nic_of_node:
            nic_of_node[int(nic_node[v])].append(v)
    node_of = topology.node_of_rank
    assert node_of is not None
    if len(nodes) == len(ranks):
        # the NICs on each GPU's PCIe switch, failed or not
        near: dict[int, list[tuple[int, bool]]] = {}
        for r, v, ok in zip(*(a.tolist() for a in topology.gpu_nics()), strict=True):
            near.setdefault(r, []).append((v, ok))
        used = []
        for r in ranks:
            on_node = nic_of_node[int(node_of[r])]
            mine = [(v, ok) for v, ok in near.get(r, []) if v in on_node]
            mine = mine or [(v, up[v] > 0) for v in on_node[:1]]
            live = [v for v, ok in mine if ok]
            if not live and nvswitch:
                live = sorted((v for v in on_node if up[v] > 0), key=lambda v: -up[v])[:1]
            used.append(live)
    else:
        used = [[v for v in nic_of_node[h] if up[v] > 0] for h in nodes]
    count = min(len(u) for u in used)
    if not count:
        return 0, 0.0
    return count, _gb(min(up[v] for u in used for v in u))


# -- the search -------------------------------------------------------------------------------

def _speeds(arch: str, inter: bool) -> tuple[float, ...]:
    table = _SPEEDS_INTER if inter else _SPEEDS_INTRA
    return table.get(arch, table["old"])


def _capacity(s: NcclSystem, speed: float, limit: int) -> int:
    """How many channels of ``speed`` GB/s the links hold (0: none)."""
    if s.n_nodes == 1:
        # each channel enters and leaves every GPU once
        return min(limit, int(s.gpu_bw / speed + 1e-9))
    per_nic = int(s.gpu_nic_bw / speed + 1e-9)
    n = s.nics * per_nic
    if s.ppn > 1:
        # a channel crosses the node over NVLink/PCIe: (ppn-1)/ppn of it on each GPU's link
        n = min(n, int(s.gpu_bw / (speed * (s.ppn - 1) / s.ppn) + 1e-9))
    return min(limit, n)


def _search(s: NcclSystem, limit: int, duplicate: bool) -> Graph:
    inter = s.n_nodes > 1
    max_bw = s.gpu_nic_bw if inter else s.gpu_bw
    total = s.gpu_bw if s.ppn > 1 or not inter else s.gpu_nic_bw * s.nics
    speeds = [v for v in _speeds(s.arch, inter) if v <= max_bw + 1e-9] or [_speeds(s.arch,
                                                                                   inter)[-1]]
    best: tuple[int, float] | None = None
    for i, speed in enumerate(speeds):
        n = _capacity(s, speed, limit)
        if n and (best is None or n * speed > best[0] * best[1] + 1e-9):
            best = (n, speed)
        if best is not None and best[0] * best[1] >= total - 1e-9:
            break
        nxt = speeds[i + 1] if i + 1 < len(speeds) else None
        if nxt is None or (best is not None and nxt / best[1] <= 0.49):
            break
    if best is None:
        best = (1, speeds[-1])
    n, bw = best
    if duplicate and bw >= 25.0 and not (COMPUTE_CAPABILITY[s.arch] > 80 and bw < 50.0 and n > 4):
        dup = min(2 * n, limit)
        bw /= math.ceil(dup / n)
        n = dup
    return Graph(n, bw, bw)


def _nvls_fits(s: NcclSystem, n: int, bw_intra: float, bw_inter: float) -> bool:
    """Whether ``n`` NVLS channels of ``bw_intra``/``bw_inter`` fit the links.

    NCCL 2.27 search.cc ``ncclTopoSearchTryNvls``: each channel loads every GPU's NVLink to
    the NVSwitch with ``bwIntra`` in each direction, its head GPU with twice that, and the
    heads are distinct GPUs, so a GPU carries at most ``(n + 1) x bwIntra``. Across nodes each
    channel's head pulls from its own NIC (``ncclTopoSearchRecNet``) over the GPU's PCIe
    path, both at ``bwInter``.
    """
    if n < 1 or (n + 1) * bw_intra > s.gpu_bw + 1e-9:
        return False
    return s.n_nodes == 1 or bw_inter <= min(s.gpu_nic_bw, s.nic_bw) + 1e-9


def _nvls_search(s: NcclSystem) -> Graph | None:
    """The NVLS graph (NCCL 2.27 search.cc ``ncclTopoCompute``, pattern NVLS).

    Channels are heads: one per GPU on a single node (min = max = the GPU count, "pull
    evenly from all GPUs"), one per NIC with a distinct local GPU across nodes
    (``NCCL_MAX_NVLS_ARITY`` = 32 at most). Pass 1 tries the speed list (the intra list on one
    node, the inter list across nodes) with ``bwIntra = bwInter`` from the first speed with
    ``speed x minChannels <= totalBw x ngpus/(ngpus-1)``, keeps a graph with more channels or
    more ``nChannels x bwInter``, and goes on while the next speed is above 0.49 of the best.
    NVLS graphs are not duplicated. Pass 2 raises ``bwInter`` alone while it is below
    ``2 x bwIntra`` and the NIC path holds it.
    """
    ngpus = s.ppn
    heads = min(32, ngpus) if s.n_nodes == 1 else min(32, ngpus, s.nics)
    if heads < 1:
        return None
    inter = s.n_nodes > 1
    speeds = _speeds(s.arch, inter)
    max_bw = s.gpu_nic_bw if inter else s.gpu_bw
    min_channels = heads if not inter else 1
    total = s.gpu_bw * ngpus / (ngpus - 1)
    i = 0
    while i < len(speeds) - 1 and (speeds[i] > max_bw + 1e-9
                                   or speeds[i] * min_channels > total + 1e-9):
        i += 1
    best: tuple[int, float] | None = None
    while True:
        speed = speeds[i]
        fits = [n for n in range(min_channels, heads + 1) if _nvls_fits(s, n, speed, speed)]
        if fits:
            n = max(fits)
            if best is None or n > best[0] or n * speed > best[0] * best[1] + 1e-9:
                best = (n, speed)
        if best is not None and best[0] * best[1] >= s.gpu_bw - 1e-9:
            break
        if i + 1 >= len(speeds) or (best is not None and speeds[i + 1] / best[1] <= 0.49):
            break
        i += 1
    if best is None:
        return None
    n, bw_intra = best
    bw_inter = bw_intra
    j = speeds.index(bw_intra)
    while j > 0 and bw_inter < 2 * bw_intra and _nvls_fits(s, n, bw_intra, speeds[j - 1]):
        j -= 1
        bw_inter = speeds[j]
    return Graph(n, bw_intra, bw_inter)


def _tree_of(s: NcclSystem, ring: Graph) -> Graph:
    """The tree graph (Tree and PAT run on it): the ring's channels, except with one GPU per
    node, where NCCL's search (search.cc ``ncclTopoCompute``) settles on the plain TREE
    pattern and its second pass raises ``bwIntra`` a speed at a time while it is below twice
    ``bwInter``: no link inside such a node limits it (NCCL 2.28.9's own graph dump of 2-8
    one-GPU nodes: ring 1.2/1.2, tree 2.4/1.2, pattern 3)."""
    if s.ppn != 1 or s.n_nodes < 2:
        return ring
    speeds = sorted(_speeds(s.arch, inter=True))
    intra = ring.bw_intra
    for speed in speeds:
        if intra >= 2 * ring.bw_inter - 1e-9:
            break
        if speed > intra + 1e-9:
            intra = speed
    return Graph(ring.n_channels, intra, ring.bw_inter, simple_tree=True)


def nccl_init(system: NcclSystem) -> NcclModel:
    """NCCL's graphs and channel counts for ``system`` (its communicator init)."""
    ring = _search(system, _GRAPH_MAX_CHANNELS, duplicate=True)
    nvls = _nvls_search(system) if system.nvls else None
    channels = min(MAX_CHANNELS, 2 * ring.n_channels)
    nvls_channels = _NVLS_CHANNELS.get(system.arch, 0) if nvls is not None else 0
    return NcclModel(system, ring, _tree_of(system, ring), nvls, channels, nvls_channels)


# -- the cost model ---------------------------------------------------------------------------

def _enabled(func: Func, algo: Algo, proto: Proto, s: NcclSystem) -> bool:
    if proto is Proto.LL128 and s.intra != "nvlink":
        return False           # LL128 is on by default only over NVLink (every algorithm)
    if func not in (Func.ALLREDUCE, Func.ALLGATHER, Func.REDUCESCATTER) or s.n_ranks < 2:
        return algo is Algo.RING and s.n_ranks >= 2 and func in (Func.BROADCAST, Func.REDUCE)
    if algo in (Algo.COLLNET_DIRECT, Algo.COLLNET_CHAIN):
        return False           # no in-network reduction can be declared
    if algo is Algo.TREE:
        return func is Func.ALLREDUCE
    if algo is Algo.PAT:
        return func is not Func.ALLREDUCE and proto is Proto.SIMPLE and s.ppn == 1 \
            and s.n_nodes > 1
    if algo is Algo.NVLS:
        # across nodes NVLS needs CollNet; AllGather/ReduceScatter NVLS is single-node here
        return s.nvls and s.n_nodes == 1 and proto is Proto.SIMPLE
    if algo is Algo.NVLS_TREE:
        return s.nvls and s.n_nodes > 1 and func is Func.ALLREDUCE and proto is Proto.SIMPLE
    return True


def _bus_bw(func: Func, algo: Algo, proto: Proto, m: NcclModel) -> float:
    """NCCL's modelled bus bandwidth in GB/s after its per-protocol refinements."""
    s = m.system
    arch, sc = s.arch, scale_index(s.n_nodes)
    if algo in (Algo.NVLS, Algo.NVLS_TREE):
        g = m.nvls
        if g is None or g.n_channels < 2:
            return 0.0
        intra = g.bw_intra * NVLS_EFFICIENCY[arch] * (g.n_channels - 1) / g.n_channels
        intra *= 2.0 if func is Func.ALLREDUCE else (s.ppn - 1) / s.ppn
        inter = g.bw_inter * (2 if s.n_nodes <= 2 and algo is Algo.NVLS_TREE else 1)
        cap = PER_CH_NVLS_TREE[arch][sc] if algo is Algo.NVLS_TREE else math.inf
        return g.n_channels * min(intra, inter, cap)
    g = m.tree if algo in (Algo.TREE, Algo.PAT) else m.ring
    bus = g.n_channels * (g.bw_intra if s.n_nodes <= 2 else g.bw_inter)
    n_ch = g.n_channels
    simple = 0.85 if g.simple_tree else 1.0     # tuning.cc: TREE pattern x 0.85
    if algo is Algo.RING:
        if proto is Proto.LL:
            return min(LL_MAX_BW[arch][sc], bus * 0.5)
        if proto is Proto.LL128:
            return min(bus * 0.92, n_ch * PER_CH_RING_LL128[arch])
        return bus
    if algo is Algo.TREE:
        # tuning.cc: every Tree AllReduce first at min(0.92 x, per-channel cap), then the
        # protocol's own refinement of that
        bus = min(bus * 0.92, n_ch * PER_CH_TREE[arch][sc])
        if proto is Proto.LL:
            bus = min(bus / 3.8, LL_MAX_BW[arch][sc])
        elif proto is Proto.LL128:
            bus = min(bus * (7 / 9 if s.n_nodes == 1 else 120 / 128),
                      n_ch * PER_CH_TREE_LL128[arch][sc])
        return simple * bus
    if algo is Algo.PAT:
        return bus * 0.75
    return 0.0


def table_bandwidth(func: Func, algo: Algo, proto: Proto, m: NcclModel) -> float:
    """The bandwidth (GB/s) of NCCL's tuning table (``comm->bandwidths``, what
    ``NCCL_DEBUG_SUBSYS=TUNING`` prints): busBw converted the way NCCL 2.28 tuning.cc does
    (Ring, NVLS and NVLSTree x n/nsteps, others 0.5; nothing for non-ring
    AllGather/ReduceScatter), before the size's tree correction."""
    s = m.system
    bus = _bus_bw(func, algo, proto, m)
    if algo is not Algo.RING and func in (Func.ALLGATHER, Func.REDUCESCATTER):
        return bus
    if algo in (Algo.RING, Algo.NVLS, Algo.NVLS_TREE):
        # NCCL 2.28 tuning.cc converts NVLS and NVLSTree like Ring (2.19-2.27: x 5/6)
        return bus * s.n_ranks / nsteps(func, s.n_ranks)
    return bus * 0.5


def _latency(func: Func, algo: Algo, proto: Proto, m: NcclModel, nbytes: int) -> float:
    """NCCL's latency term in µs (numPipeOps = 1)."""
    s = m.system
    n, nodes, ppn = s.n_ranks, s.n_nodes, s.ppn
    base = BASE_LAT[algo][proto]
    intra = HW_LAT[s.intra][algo][proto]
    # with one GPU per node every step is exposed: NCCL uses the tree's network latency
    inter = HW_LAT["net"][Algo.TREE if ppn == 1 else algo][proto]
    log_nodes = nodes.bit_length() - 1        # NCCL's log2i: the floor
    if algo is Algo.RING and func in (Func.BROADCAST, Func.REDUCE):
        # one hop's latency (the graph's channels are the same: sameChannels), whatever n
        return base + HW_LAT["net" if nodes > 1 else s.intra][algo][proto]
    if algo is Algo.RING:
        steps = nsteps(func, n)
        inter_steps = (2 * (nodes - 1) if func is Func.ALLREDUCE else nodes - 1)
        if nodes > 1:
            intra = max(intra, NET_OVERHEAD_US * (3 if proto is Proto.SIMPLE else 1))
        lat = base + (steps - inter_steps) * intra + inter_steps * inter
        if (func is Func.ALLREDUCE and proto is Proto.SIMPLE and nodes > 1
                and nbytes / (m.channels * n) >= 64):
            lat *= 1.4 if COMPUTE_CAPABILITY[s.arch] >= 80 else 1.9
        return lat
    if algo is Algo.TREE:
        return base + 2 * ((ppn - 1) * intra + log_nodes * inter)
    if algo is Algo.PAT:
        return base + log_nodes * (inter / 3.5) + n * 2.8
    if algo is Algo.NVLS:
        return intra + (inter if nodes > 1 else 0.0)
    if algo is Algo.NVLS_TREE:
        return base + intra + 2 * log_nodes * inter
    return base + intra + (inter if nodes > 1 else 0.0)


def latency_us(m: NcclModel, func: Func, algo: Algo, proto: Proto, nbytes: int) -> float:
    """NCCL's latency term in µs for one call (numPipeOps = 1)."""
    return _latency(func, algo, proto, m, nbytes)


def graph_busbw(m: NcclModel, algo: Algo) -> float:
    """The bus bandwidth (GB/s) of the graph ``algo`` runs on: its channels times their
    bandwidth, before any protocol refinement."""
    s = m.system
    if algo in (Algo.NVLS, Algo.NVLS_TREE):
        g = m.nvls
        return 0.0 if g is None else g.n_channels * g.bw_intra
    g = m.tree if algo in (Algo.TREE, Algo.PAT) else m.ring
    return g.n_channels * (g.bw_intra if s.n_nodes <= 2 else g.bw_inter)


def nccl_time(m: NcclModel, func: Func, algo: Algo, proto: Proto, nbytes: int) -> float | None:
    """NCCL's estimated time in µs (the entry of its tuner cost table), ``None`` where NCCL
    disables the combination (its IGNORE entries)."""
    if not _enabled(func, algo, proto, m.system):
        return None
    bw = table_bandwidth(func, algo, proto, m)
    if bw <= 0:
        return None
    if algo is Algo.TREE and func is Func.ALLREDUCE:
        log_size = int(math.log2(nbytes >> 6)) if nbytes >= 64 else -1
        if 0 <= log_size < len(TREE_CORRECTION[proto]):
            bw *= TREE_CORRECTION[proto][log_size]
    return _latency(func, algo, proto, m, nbytes) + nbytes / (1000.0 * bw)


def cost_table(m: NcclModel, func: Func, nbytes: int
               ) -> tuple[tuple[Algo, Proto, float | None], ...]:
    """Every (algorithm, protocol) with NCCL's time in µs, or ``None`` where disabled."""
    return tuple((a, p, nccl_time(m, func, a, p, nbytes)) for a in Algo for p in Proto)


def thread_threshold(algo: Algo, proto: Proto, n: int) -> int:
    """NCCL's ``threadThresholds[algo][proto]`` on ``n`` ranks (bytes per thread below which
    its channel heuristic drops a channel)."""
    if proto is Proto.LL:
        return 8 * (n if algo is Algo.RING else 1)
    if proto is Proto.LL128:
        return 8
    return 64


def max_threads(m: NcclModel, algo: Algo, proto: Proto) -> int:
    """NCCL's ``maxThreads[algo][proto]`` (tuning.cc): the protocol's default, except Ring
    Simple, which runs 256 threads where the ring graph's bandwidth (``bwIntra x
    nChannels``) is at most PCI_BW = 12 GB/s (``simpleDefaultThreads``)."""
    if algo is Algo.RING and proto is Proto.SIMPLE \
            and m.ring.bw_intra * m.ring.n_channels <= _PCI_BW + 1e-9:
        return 256
    return DEFAULT_THREADS[proto]


def nccl_resources(m: NcclModel, algo: Algo, proto: Proto, nbytes: int) -> tuple[int, int]:
    """(channels, threads) NCCL launches (enqueue.cc ``topoGetAlgoInfo``): channels drop while
    ``nBytes < nc x maxThreads x threshold``, then Ring threads halve; Tree, PAT and NVLS run
    NCCL_MAX_NTHREADS = 640 whatever the loop left.

    PAT is an approximation: NCCL 2.28 leaves ``maxThreads[PAT]`` at 0, so its loop keeps every
    channel, and its scheduler then spreads a small call over fewer (NCCL's log shows 1 channel
    up to 16 KiB, 2 from 32 KiB on 8 one-GPU nodes); the loop with 640 threads gives 1 channel
    below 80 KiB instead (tests/nccl_model/test_nccl_logs.py records the three calls where it
    differs)."""
    if algo in (Algo.NVLS, Algo.NVLS_TREE):
        return max(1, m.nvls_channels), _MAX_NTHREADS
    nc = m.channels
    nt = _MAX_NTHREADS if algo is Algo.PAT else max_threads(m, algo, proto)
    threshold = thread_threshold(algo, proto, m.system.n_ranks)
    while nbytes < nc * nt * threshold:
        if nc >= 2:
            nc -= 1
        elif nt % 128 == 0 and algo is Algo.RING:
            nt //= 2
        else:
            break
    return nc, nt if algo is Algo.RING else _MAX_NTHREADS


def nccl_choice(m: NcclModel, func: Func, nbytes: int,
                allowed: set[tuple[Algo, Proto]] | None = None) -> NcclChoice | None:
    """NCCL's argmin over its cost table (restricted to ``allowed`` when given) and the
    channels/threads it launches; ``None`` when nothing is enabled."""
    table = cost_table(m, func, nbytes)
    best: tuple[float, Algo, Proto] | None = None
    for a, p, t in table:
        if t is None or (allowed is not None and (a, p) not in allowed):
            continue
        if best is None or t < best[0]:
            best = (t, a, p)
    if best is None:
        return None
    t, a, p = best
    nc, nt = nccl_resources(m, a, p, nbytes)
    return NcclChoice(func, nbytes, a, p, t, nc, nt, table, m)


def nccl_chunk(m: NcclModel, algo: Algo, proto: Proto, nbytes: int, channels: int,
               func: Func, default_chunk: int) -> int:
    """The chunk NCCL uses: the protocol default, halved for pipelined trees and PAT while
    each channel would get too few chunks to fill its pipeline.

    PAT: AllGather halves while chunk·nCh·32 > nBytes, ReduceScatter ·16, floor 64 KiB. The
    tree rule (depth·8 / ·4 / ·1 chunks per channel, floors 128/64/32 KiB) is derived from
    enqueue.cc's chunk tuning and is approximate.
    """
    s = m.system
    chunk = default_chunk
    nc = max(1, channels)
    if algo is Algo.PAT:
        factor = 32 if func is Func.ALLGATHER else 16
        while chunk * nc * factor > nbytes and chunk > 65536:
            chunk //= 2
    elif algo in (Algo.TREE, Algo.NVLS_TREE, Algo.COLLNET_CHAIN) and proto is not Proto.LL:
        depth = max(1, s.ppn - 1 + (math.ceil(math.log2(s.n_nodes)) if s.n_nodes > 1 else 0))
        for per_channel, floor in ((8, 131072), (4, 65536), (1, 32768)):
            while nbytes / (nc * chunk) < depth * per_channel and chunk > floor:
                chunk //= 2
    return chunk


# -- reports ----------------------------------------------------------------------------------

_FUNC_OF_KIND = {CollectiveKind.ALLREDUCE: Func.ALLREDUCE,
                 CollectiveKind.ALLGATHER: Func.ALLGATHER,
                 CollectiveKind.REDUCESCATTER: Func.REDUCESCATTER}


def nccl_estimate(coll: Collective, arch: str = "hopper") -> NcclChoice | None:
    """NCCL's predicted choice and time for ``coll``; ``None`` for what its tuning tables do
    not cover here (broadcast, reduce; alltoall, which NCCL runs as grouped send/recv, is
    :func:`cclc.nccl_p2p.alltoall_estimate`)."""
    func = _FUNC_OF_KIND.get(coll.kind)
    if func is None or coll.n < 2:
        return None
    model = nccl_init(system_of(coll.topology, coll.group, arch))
    choice = nccl_choice(model, func, coll.size)
    limits = core_limits(coll.topology, coll.group)
    if choice is None or limits is None:
        return choice
    return _core_limited(choice, limits)


def _core_limited(choice: NcclChoice, limits: CoreLimits) -> NcclChoice:
    """``choice`` run across pods: NCCL chooses without seeing the fabric, then the pods' core
    links hold its ring (or tree: Tree, NVLSTree) to :mod:`cclc.nccl_fabric`'s bound; the
    bandwidth term of the time stretches by how far the bus exceeds it."""
    limit = limits.ring if choice.algo in (Algo.RING, Algo.PAT) else limits.tree
    bus = _bus_bw(choice.func, choice.algo, choice.proto, choice.model)
    if not bus > limit:
        return choice
    latency = _latency(choice.func, choice.algo, choice.proto, choice.model, choice.nbytes)
    stretched = latency + (choice.time_us - latency) * bus / limit
    return replace(choice, time_us=stretched, core_limit=limit)
