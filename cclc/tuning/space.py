"""The NCCL parameter space of one collective on one machine, for one NCCL version.

AutoCCL's six parameters: the *implementation* ⟨algorithm, protocol, transport⟩ picks a
subspace; the *resources* ⟨channels, threads, chunk size⟩ are the axes searched inside it.
What exists depends on the collective and the NCCL version (NCCL's ``nccl_tuner.h`` and
``src/graph/tuning.cc``, release by release): Tree only serves AllReduce; PAT (2.23+) only
AllGather/ReduceScatter with Simple and one GPU per node; NVLS needs NVSwitch nodes; chunk
size is reachable only through the v6 tuner (2.30+); Tree and PAT always run 640 threads, so
their thread axis has one value.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from cclc.collective import CollectiveKind
from cclc.errors import SemanticError
from cclc.nccl_model import (
    MAX_CHANNELS,
    Algo,
    Func,
    NcclSystem,
    Proto,
    gpu_nic_bandwidth,
    nccl_init,
    nvlink_as_nccl_sees_it,
    system_of,
)
from cclc.topology import LinkKind, Topology

__all__ = [
    "ALGO_NAMES",
    "FUNC_NAMES",
    "PROTO_NAMES",
    "TRANSPORTS",
    "Config",
    "Machine",
    "NcclVersion",
    "Space",
    "Subspace",
    "func_of",
    "machine_of",
    "max_chunk",
    "space_for",
]


# NCCL's own spellings (src/init.cc), used in NCCL_ALGO/NCCL_PROTO and in profiler strings
ALGO_NAMES = ("Tree", "Ring", "CollNetDirect", "CollNetChain", "NVLS", "NVLSTree", "PAT")
PROTO_NAMES = ("LL", "LL128", "Simple")
FUNC_NAMES = ("Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce")

_FUNC_OF_KIND = {CollectiveKind.BROADCAST: Func.BROADCAST, CollectiveKind.REDUCE: Func.REDUCE,
                 CollectiveKind.ALLGATHER: Func.ALLGATHER,
                 CollectiveKind.REDUCESCATTER: Func.REDUCESCATTER,
                 CollectiveKind.ALLREDUCE: Func.ALLREDUCE}

NCCL_STEPS = 8
# default buffer sizes (NCCL_BUFFSIZE, NCCL_LL_BUFFSIZE, NCCL_LL128_BUFFSIZE)
BUFF_SIZES = {Proto.LL: 524288, Proto.LL128: 4915200, Proto.SIMPLE: 4194304}
# chunk alignment per protocol: LL moves 8 data bytes per 16-byte line, LL128 120 of every
# 128 bytes (derived from the protocol formats; NCCL aligns the tuner's value down to these)
_CHUNK_GRAIN = {Proto.LL: 16, Proto.LL128: 960, Proto.SIMPLE: 128}
# NCCL_NTHREADS / NCCL_LL128_NTHREADS ranges (multiples of 32)
_THREADS = {Proto.LL: tuple(range(64, 513, 32)), Proto.SIMPLE: tuple(range(64, 513, 32)),
            Proto.LL128: tuple(range(160, 641, 32))}
# transports: NVLink/PCIe peer-to-peer, or staged through host shared memory
# (NCCL_P2P_DISABLE=1); a real choice only between GPUs on a PCIe switch
TRANSPORTS = ("p2p", "shm")


def func_of(kind: CollectiveKind) -> Func:
    """The NCCL function of a collective kind; NCCL has no tuning table for alltoall."""
    try:
        return _FUNC_OF_KIND[kind]
    except KeyError:
        raise SemanticError(f"NCCL has no tuning table for {kind.value}: its tuner API covers "
                            "broadcast, reduce, allgather, reducescatter and allreduce") from None


@dataclass(frozen=True, slots=True, order=True)
class Config:
    """One point of the space: implementation ⟨algo, proto, transport⟩ + resources.

    ``chunk`` is in bytes; 0 means NCCL's own choice (the only one before the v6 tuner).
    """

    algo: Algo
    proto: Proto
    transport: str
    channels: int
    threads: int
    chunk: int

    @property
    def subspace(self) -> tuple[Algo, Proto, str]:
        return (self.algo, self.proto, self.transport)

    def label(self) -> str:
        return (f"{ALGO_NAMES[self.algo]}/{PROTO_NAMES[self.proto]}/{self.transport} "
                f"nc={self.channels} nt={self.threads} chunk={self.chunk or 'nccl'}")


@dataclass(frozen=True, slots=True)
class NcclVersion:
    """An NCCL release; decides which algorithms and which tuner ABI exist."""

    major: int
    minor: int

    @classmethod
    def parse(cls, text: str) -> NcclVersion:
        parts = text.strip().split(".")
        try:
            major, minor = int(parts[0]), int(parts[1])
        except (IndexError, ValueError):
            raise SemanticError(f"NCCL version '{text}' is not MAJOR.MINOR[.PATCH]") from None
        version = cls(major, minor)
        if version.tuner_abi is None:
            raise SemanticError(f"NCCL {text} has no tuner ABI this plugin supports: "
                                "the context-based tuner API (v2) starts at NCCL 2.21")
        return version

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}"

    @property
    def key(self) -> tuple[int, int]:
        return (self.major, self.minor)

    @property
    def tuner_abi(self) -> int | None:
        """The newest ncclTunerPlugin_vN this release probes (§1.1)."""
        for (ma, mi), abi in (((2, 30), 6), ((2, 28), 5), ((2, 24), 4), ((2, 22), 3),
                              ((2, 21), 2)):
            if self.key >= (ma, mi):
                return abi
        return None

    @property
    def has_pat(self) -> bool:
        return self.key >= (2, 23)

    @property
    def chunk_tunable(self) -> bool:
        """Only the v6 tuner's getChunkSize reaches the chunk size per collective."""
        return self.key >= (2, 30)

    @property
    def online_capable(self) -> bool:
        """Online tuning joins tuner and profiler contexts by commId: tuner v5 + profiler v5."""
        return self.key >= (2, 28)


@dataclass(frozen=True, slots=True)
class Machine:
    """What the space and the model profiler need to know about the ranks being tuned.

    Bandwidths are bytes/s per GPU per direction; latencies in seconds. ``nccl_channels``
    is the channel count NCCL sets up at init (the tuner can only go below it unless
    NCCL_MIN_NCHANNELS raises it): by default what :mod:`cclc.nccl_model`'s replica of
    NCCL's topology search gives, overridable. ``system`` is the machine as that model sees
    it; a Machine built by hand without one is read as one NIC per GPU.
    """

    n_ranks: int
    n_nodes: int
    interconnect: str          # "nvswitch" | "pcie"
    intra_bw: float
    intra_lat: float
    inter_bw: float            # per GPU: its share of the node's NICs and of the fabric
    inter_lat: float
    arch: str = "hopper"       # volta | ampere | hopper | blackwell
    collnet: bool = False
    nccl_channels: int = 16
    system: NcclSystem | None = None

    @property
    def ppn(self) -> int:
        return self.n_ranks // self.n_nodes

    @property
    def nccl_system(self) -> NcclSystem:
        """The machine as cclc's model of NCCL sees it."""
        if self.system is not None:
            return self.system
        nvswitch = self.interconnect == "nvswitch"
        intra = self.intra_bw / 1e9
        nic = self.inter_bw / 1e9
        gpu_bw = nvlink_as_nccl_sees_it(intra, self.arch) if nvswitch and intra else intra
        if self.n_nodes > 1 and not gpu_bw:
            gpu_bw = min(nic, gpu_nic_bandwidth(self.arch))
        return NcclSystem(self.arch, self.n_ranks, self.n_nodes, "nvlink" if nvswitch else "pci",
                          gpu_bw, self.ppn if self.n_nodes > 1 else 0, nic,
                          min(nic, gpu_nic_bandwidth(self.arch)) if self.n_nodes > 1 else 0.0,
                          nvswitch)

    @property
    def nvls(self) -> bool:
        # NVLink SHARP needs NVSwitch (third generation, Hopper and later) and >1 GPU per node
        return self.interconnect == "nvswitch" and self.ppn > 1 and self.arch in ("hopper",
                                                                                   "blackwell")

    @property
    def signature(self) -> str:
        """A stable text identifying the machine, for the measurement cache."""
        return (f"{self.n_ranks}r{self.n_nodes}n-{self.interconnect}-{self.intra_bw:.6g}-"
                f"{self.intra_lat:.6g}-{self.inter_bw:.6g}-{self.inter_lat:.6g}-{self.arch}-"
                f"{int(self.collnet)}-{self.nccl_channels}"
                + ("" if self.system is None else f"-{self.system}"))


def machine_of(topology: Topology, group: Sequence[int] | None = None, arch: str = "hopper",
               nccl_channels: int | None = None) -> Machine:
    """Summarize the ranks ``group`` of ``topology`` (default: all live ranks) for tuning.

    Only machines made of GPU nodes (``single_node``, ``single_switch``, ``leaf_spine``) run
    NCCL; a torus or mesh raises :class:`SemanticError`.
    """
    if topology.kind not in ("node", "fabric") or topology.node_of_rank is None:
        raise SemanticError(f"topology '{topology.name}' is a {topology.kind_name}: NCCL tuning "
                            "needs GPU nodes (a node or a fabric of nodes)")
    ranks = tuple(group) if group is not None else topology.live_ranks()
    nodes = sorted({int(topology.node_of_rank[r]) for r in ranks})
    per_node = [sum(1 for r in ranks if int(topology.node_of_rank[r]) == nd) for nd in nodes]
    if len(set(per_node)) != 1:
        raise SemanticError(f"the group has {min(per_node)} to {max(per_node)} GPUs per node; "
                            "NCCL tuning assumes the same number of GPUs on every node")
    src, dst, kind = topology.link_src, topology.link_dst, topology.link_kind
    r0 = ranks[0]
    gpu_links = np.flatnonzero((src == r0) & ((kind == LinkKind.NVLINK) | (kind == LinkKind.PCIE))
                               & (dst >= topology.n_ranks))
    nvlink = bool(np.any(kind[gpu_links] == LinkKind.NVLINK)) if len(gpu_links) else False
    interconnect = "nvswitch" if nvlink or _node_has(topology, "nvswitch") else "pcie"
    intra_bw, intra_lat = 0.0, 0.0
    if per_node[0] > 1:
        peer = next(r for r in ranks if r != r0 and topology.node_of_rank[r]
                    == topology.node_of_rank[r0])
        path = topology.shortest_path_links(r0, peer)
        intra_bw = float(min(topology.link_bandwidth[list(path)]))
        intra_lat = float(sum(topology.link_latency[list(path)]))
    inter_bw, inter_lat = 0.0, 0.0
    if len(nodes) > 1:
        far = next(r for r in reversed(ranks)
                   if topology.node_of_rank[r] != topology.node_of_rank[r0])
        far_path = list(topology.shortest_path_links(r0, far))
        inter_lat = float(sum(topology.link_latency[far_path]))
        ib = np.flatnonzero((kind == LinkKind.IB) | (kind == LinkKind.ETH))
        gpus = topology.n_ranks // topology.n_nodes
        # NIC injection bandwidth per GPU: the live NIC->fabric ports of a node over its
        # GPUs, the node with the fewest deciding (NCCL takes the minimum over ranks)
        nic_node = topology.nic_nodes()
        up = ib[nic_node[src[ib]] >= 0]
        live = up[~topology.link_failed[up]]
        node_up = np.bincount(nic_node[src[live]], weights=topology.link_bandwidth[live],
                              minlength=max(nodes) + 1)
        inter_bw = float(node_up[nodes].min()) / gpus
        # an oversubscribed spine layer shares its uplinks among the leaf's downlinks
        nic_total = float(topology.link_bandwidth[up].sum())
        core = [e for e in ib if topology.vertex_names[src[e]].startswith("leaf")
                and topology.vertex_names[dst[e]].startswith("spine")]
        if core and nic_total > 0:
            inter_bw *= min(1.0, float(sum(topology.link_bandwidth[core])) / nic_total)
        if per_node[0] == 1 and intra_bw == 0.0:
            intra_bw = inter_bw
    if per_node[0] == 1 and len(nodes) == 1:
        raise SemanticError("tuning a single GPU: there is nothing to communicate")

    system = system_of(topology, ranks, arch)
    if nccl_channels is None:
        # the "coll channels" NCCL sets up at init, from the replica of its topology search;
        # override when NCCL_DEBUG=INFO shows a different count
        nccl_channels = nccl_init(system).channels
    return Machine(n_ranks=len(ranks), n_nodes=len(nodes), interconnect=interconnect,
                   intra_bw=intra_bw, intra_lat=intra_lat, inter_bw=inter_bw,
                   inter_lat=inter_lat, arch=arch, nccl_channels=nccl_channels, system=system)


def _node_has(topology: Topology, what: str) -> bool:
    return any(name.endswith("." + what) for name in topology.vertex_names)


def max_chunk(algo: Algo, proto: Proto) -> int:
    """NCCL's default (and largest) chunk: stepSize × chunkSteps, in data bytes (§1.5)."""
    step = BUFF_SIZES[proto] // NCCL_STEPS
    if proto is Proto.LL:
        return step // 2                         # half of every LL line is flags
    if proto is Proto.LL128:
        return step * 15 // 16 // _CHUNK_GRAIN[proto] * _CHUNK_GRAIN[proto]
    # Ring/Simple moves 4 steps per chunk (NCCL_STEPS/2), the other algorithms 1
    return step * (NCCL_STEPS // 2 if algo is Algo.RING else 1)


@dataclass(frozen=True, slots=True)
class Subspace:
    """An implementation ⟨algo, proto, transport⟩ with its resource axes."""

    algo: Algo
    proto: Proto
    transport: str
    channels: tuple[int, ...]
    threads: tuple[int, ...]
    chunks: tuple[int, ...]

    @property
    def axes(self) -> tuple[tuple[int, ...], ...]:
        return (self.channels, self.threads, self.chunks)

    @property
    def size(self) -> int:
        return len(self.channels) * len(self.threads) * len(self.chunks)

    def config(self, index: Sequence[int]) -> Config:
        """The config at axis indices ``(i_channels, i_threads, i_chunk)``."""
        return Config(self.algo, self.proto, self.transport, self.channels[index[0]],
                      self.threads[index[1]], self.chunks[index[2]])

    def configs(self) -> Iterator[Config]:
        for c, t, k in itertools.product(self.channels, self.threads, self.chunks):
            yield Config(self.algo, self.proto, self.transport, c, t, k)

    def label(self) -> str:
        return f"{ALGO_NAMES[self.algo]}/{PROTO_NAMES[self.proto]}/{self.transport}"


@dataclass(frozen=True, slots=True)
class Space:
    """All subspaces of one collective function on one machine and NCCL version."""

    func: Func
    machine: Machine
    version: NcclVersion
    subspaces: tuple[Subspace, ...]

    @property
    def size(self) -> int:
        return sum(s.size for s in self.subspaces)

    def configs(self) -> Iterator[Config]:
        for s in self.subspaces:
            yield from s.configs()

    def subspace(self, algo: Algo, proto: Proto, transport: str) -> Subspace | None:
        for s in self.subspaces:
            if (s.algo, s.proto, s.transport) == (algo, proto, transport):
                return s
        return None


def _algorithms(func: Func, machine: Machine, version: NcclVersion) -> list[Algo]:
    algos = [Algo.RING]
    if func is Func.ALLREDUCE:
        algos.append(Algo.TREE)
        # NVLS spans nodes only with CollNet (SHARP); across plain fabrics it is NVLSTree
        if machine.nvls and (machine.n_nodes == 1 or machine.collnet):
            algos.append(Algo.NVLS)
        if machine.nvls and machine.n_nodes > 1:
            algos.append(Algo.NVLS_TREE)
        if machine.collnet:
            algos += [Algo.COLLNET_DIRECT, Algo.COLLNET_CHAIN]
    if func in (Func.ALLGATHER, Func.REDUCESCATTER):
        # PAT's auto rule: one GPU per node (nNodes == nRanks) and more than one node
        if version.has_pat and machine.ppn == 1 and machine.n_nodes > 1:
            algos.append(Algo.PAT)
        if machine.nvls and machine.n_nodes == 1:
            algos.append(Algo.NVLS)
    return algos


def _protocols(algo: Algo, machine: Machine) -> list[Proto]:
    if algo in (Algo.PAT, Algo.NVLS, Algo.NVLS_TREE, Algo.COLLNET_DIRECT, Algo.COLLNET_CHAIN):
        return [Proto.SIMPLE]                 # these kernels exist only for Simple
    protos = [Proto.LL, Proto.SIMPLE]
    # LL128 is on by default only over NVLink paths (NCCL_PROTO auto rule, §3)
    if machine.interconnect == "nvswitch":
        protos.insert(1, Proto.LL128)
    return protos


def _chunks(algo: Algo, proto: Proto, version: NcclVersion, steps: int = 8) -> tuple[int, ...]:
    if not version.chunk_tunable:
        return (0,)                    # 0: whatever NCCL picks (it adapts it to the size)
    top = max_chunk(algo, proto)
    grain = _CHUNK_GRAIN[proto]
    values = sorted({max(grain, (top >> k) // grain * grain) for k in range(steps)})
    return tuple(values)


def space_for(func: Func, machine: Machine, version: NcclVersion,
              max_channels: int = MAX_CHANNELS) -> Space:
    """The search space of ``func`` on ``machine`` under NCCL ``version``.

    Channels run 1..``max_channels`` (NCCL's MAXCHANNELS = 64 by default: reaching above
    NCCL's init-time count needs NCCL_MIN_NCHANNELS, which the conf file output sets).
    """
    if not 1 <= max_channels <= MAX_CHANNELS:
        raise SemanticError(f"max channels must be in 1..{MAX_CHANNELS}, got {max_channels}")
    channels = tuple(range(1, max_channels + 1))
    transports = TRANSPORTS if (machine.interconnect == "pcie" and machine.ppn > 1) else ("p2p",)
    subs = []
    for algo in _algorithms(func, machine, version):
        for proto in _protocols(algo, machine):
            # Tree and PAT always launch NCCL_MAX_NTHREADS = 640; NVLS kernels ignore
            # NCCL_NTHREADS as well (derived), so those axes have one value
            threads = _THREADS[proto] if algo is Algo.RING else (640,)
            for transport in transports:
                subs.append(Subspace(algo, proto, transport, channels, threads,
                                     _chunks(algo, proto, version)))
    return Space(func=func, machine=machine, version=version, subspaces=tuple(subs))


def log2_bucket(nbytes: int) -> int:
    """The power-of-two size bucket of ``nbytes`` (the online tuner's key)."""
    return max(0, int(math.log2(max(1, nbytes))))
