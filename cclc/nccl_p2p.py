"""NCCL's AllToAll: a group of sends and receives to every peer, and the time it takes.

NCCL has no AllToAll with a cost model: nccl-tests' ``alltoall_perf`` runs it as
``ncclGroupStart``, an ``ncclSend`` and an ``ncclRecv`` per peer, ``ncclGroupEnd``, or from NCCL
2.28 on as ``ncclAlltoAll`` (NVIDIA/nccl-tests a0b82b2260cf5152b9f8c061bbf7eaf0ba096432,
``src/alltoall.cu`` ``AlltoAllRunColl``), which NCCL turns into the same send and receive
task per peer (NVIDIA/nccl 5067397c2676d5aed50042fc39e5c8ee96eb0027, ``src/enqueue.cc``
``taskAppend``; only with ``NCCL_CTA_POLICY_ZERO`` and registered symmetric buffers does it use
the copy engines instead, which is not modelled). Its tuning tables (:mod:`cclc.nccl_model`)
cover only the five collectives, so this module models what those point-to-point operations
do, from NCCL's source (the same commit):

* **Channels.** Point-to-point work runs on ``p2pnChannels`` channels: the communicator's
  channels, at most ``NCCL_MAX_P2P_NCHANNELS`` (default ``MAXCHANNELS`` = 64), rounded up to a
  power of two (``src/graph/paths.cc`` ``ncclTopoComputeP2pChannels``). Each peer gets
  ``p2pnChannelsPerPeer`` of them, the least over the peers of: ``2 x`` the NVLink count for
  an NVLink peer, 2 for a PCIe peer, and for a peer across the network
  ``max(local NICs, ceil(NIC GB/s / NCCL_P2P_PER_CHANNEL_NET_BW = 14))``
  (``ncclTopoGetNchannels``); rounded up to a power of two, and across nodes halved while
  ``perPeer x ceil(peers / 8)`` exceeds ``p2pnChannels`` (8 =
  ``NCCL_MAX_DEV_WORK_P2P_PER_BATCH``, ``src/include/device.h``).
* **Schedule.** Peers are visited in rounds (``src/init.cc``, ``p2pSchedule``: node groups
  in a quadratic order, then the local ranks), and one launch serves
  ``p2pnChannels / perPeer x 8`` peers at once (``src/enqueue.cc``, ``maxConcurrent``), so
  every link carries its share of the exchange at the same time: the bandwidth term is the
  most loaded of each GPU's NVLink (the bytes to peers on its node), each GPU's share of its
  node's NICs (the bytes to other nodes; PXN relays them to the NIC on the peer's rail over
  NVLink, which spreads them evenly over the NICs) and, on a three-tier fabric, each pod's
  core links (:func:`cclc.nccl_fabric.pod_core_seconds`).
* **Protocol and chunk.** Simple, except LL where a peer's bytes are at most
  ``perPeer x NCCL_P2P_LL_THRESHOLD`` (16 KiB; ``src/enqueue.cc``); LL moves 8 bytes of data
  per 16-byte line, so its bandwidth is half (the factor NCCL's tuner gives Ring LL). The
  chunk is ``NCCL_P2P_NET_CHUNKSIZE`` (128 KiB, doubled on Arm hosts with sm100+) across
  nodes, ``NCCL_P2P_NVL_CHUNKSIZE`` (512 KiB) on an all-NVLink node, else
  ``NCCL_P2P_PCI_CHUNKSIZE`` (128 KiB) (``src/init.cc`` ``computeBuffSizes``).

The link rates are NCCL's own figures, as :func:`cclc.nccl_model.system_of` derives them: an
H100's NVLink as 18 x 20.6 = 370.8 GB/s (NCCL's measured effective NVLink bandwidth is "~370
GB/s", NVIDIA/nccl-tests issue 212), a GPU's path to its NIC capped by the PCIe switch.

Assumed (NCCL's source has no figure for it): the latency. NCCL's tuner has no p2p row, so a
launch is charged NCCL's Ring/Simple base latency plus one Simple step of the slowest link kind
(NVLink or PCIe on one node, the network otherwise) per round of concurrently served peers.
Large sizes, which the calibration checks, are bound by bandwidth.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from cclc.collective import Collective, CollectiveKind
from cclc.nccl_fabric import pod_core_seconds
from cclc.nccl_model import (
    BASE_LAT,
    COMPUTE_CAPABILITY,
    HW_LAT,
    MAX_CHANNELS,
    NVLINK,
    Algo,
    NcclSystem,
    Proto,
    bus_factor,
    nccl_init,
    system_of,
)
from cclc.topology import Topology

__all__ = [
    "P2P_BATCH",
    "P2P_LL_THRESHOLD",
    "P2P_PER_CHANNEL_NET_BW",
    "NcclAllToAll",
    "alltoall_estimate",
    "nccl_alltoall",
    "p2p_channels",
    "p2p_chunk",
]

#: ``NCCL_MAX_DEV_WORK_P2P_PER_BATCH``: p2p operations one channel runs at once
#: (NVIDIA/nccl 5067397c, ``src/include/device.h``)
P2P_BATCH = 8
#: ``NCCL_P2P_PER_CHANNEL_NET_BW`` default, GB/s a channel to a network peer is given
#: (``src/graph/paths.cc``)
P2P_PER_CHANNEL_NET_BW = 14
#: ``NCCL_P2P_LL_THRESHOLD`` default, bytes per channel up to which a p2p uses LL
#: (``src/enqueue.cc``)
P2P_LL_THRESHOLD = 16384
# NCCL_P2P_NET_CHUNKSIZE, NCCL_P2P_NVL_CHUNKSIZE, NCCL_P2P_PCI_CHUNKSIZE (src/init.cc)
_NET_CHUNK, _NVL_CHUNK, _PCI_CHUNK = 1 << 17, 1 << 19, 1 << 17


def _pow2_up(x: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(1, x))))


@dataclass(frozen=True, slots=True)
class NcclAllToAll:
    """NCCL's AllToAll as grouped send/recv: its resources and its predicted time (µs).

    ``bound`` names what sets the bandwidth term: ``"nvlink"`` (the GPU's link inside its
    node), ``"network"`` (its share of the node's NICs) or ``"core"`` (a pod's core links;
    ``core_limit`` is then the bus bandwidth they hold it to, GB/s).
    """

    nbytes: int
    n_ranks: int
    proto: Proto
    time_us: float
    latency_us: float
    channels: int
    channels_per_peer: int
    chunk: int
    bound: str
    core_limit: float | None = None

    @property
    def name(self) -> str:
        """What NCCL runs, in the form of :attr:`cclc.nccl_model.NcclChoice.name`."""
        return f"p2p/{self.proto.name.lower()}"

    @property
    def algbw(self) -> float:
        """GB/s, nccl-tests' definition (size / time)."""
        return self.nbytes / self.time_us / 1e3

    @property
    def busbw(self) -> float:
        return self.algbw * bus_factor(CollectiveKind.ALLTOALL, self.n_ranks)


def p2p_channels(system: NcclSystem) -> tuple[int, int]:
    """(``p2pnChannels``, ``p2pnChannelsPerPeer``) NCCL sets up for ``system``
    (``ncclTopoComputeP2pChannels``, ``ncclTopoComputeP2pChannelsPerPeer``)."""
    s = system
    channels = min(MAX_CHANNELS, _pow2_up(min(nccl_init(s).channels, MAX_CHANNELS)))
    per_peer = MAX_CHANNELS
    if s.ppn > 1:
        if s.intra == "nvlink":
            nvl = NVLINK[COMPUTE_CAPABILITY[s.arch]].nccl
            per_peer = min(per_peer, 2 * max(1, int(s.gpu_bw / nvl + 1e-9)))
        else:
            per_peer = min(per_peer, 2)
    if s.n_nodes > 1:
        nics = max(1, min(s.nics, math.ceil(s.nics / s.ppn)))
        net_bw = nics * s.nic_bw
        per_peer = min(per_peer, max(nics, math.ceil(net_bw / P2P_PER_CHANNEL_NET_BW)))
    per_peer = _pow2_up(per_peer)
    if s.n_nodes > 1:
        # across nodes the network is the bottleneck: fit every peer in one round of batches
        while per_peer * math.ceil(s.n_ranks / P2P_BATCH) > channels and per_peer > 1:
            per_peer //= 2
    else:
        per_peer = min(channels, per_peer)
    return channels, per_peer


def p2p_chunk(system: NcclSystem, arm_host: bool = False) -> int:
    """The p2p chunk NCCL uses (``computeBuffSizes``): net across nodes (x2 on Arm hosts with
    sm100+), NVLink on an all-NVLink node, PCIe otherwise."""
    if system.n_nodes > 1:
        return _NET_CHUNK * (2 if arm_host and COMPUTE_CAPABILITY[system.arch] >= 100 else 1)
    return _NVL_CHUNK if system.intra == "nvlink" else _PCI_CHUNK


def _per_gpu_bandwidth(s: NcclSystem) -> tuple[float, float]:
    """(GB/s inside the node, GB/s to other nodes) one GPU drives, as NCCL rates them."""
    inter = 0.0
    if s.n_nodes > 1:
        inter = min(s.gpu_nic_bw, s.nics * s.nic_bw / s.ppn) if s.nics else 0.0
    return s.gpu_bw, inter


def _latency(s: NcclSystem, channels: int, per_peer: int, proto: Proto) -> float:
    """NCCL's Ring base latency plus one step of the slowest link per round of peers."""
    concurrent = max(1, channels // per_peer) * P2P_BATCH
    rounds = math.ceil((s.n_ranks - 1) / concurrent)
    link = "net" if s.n_nodes > 1 else s.intra
    return BASE_LAT[Algo.RING][proto] + rounds * HW_LAT[link][Algo.RING][proto]


def _time(s: NcclSystem, nbytes: int, intra: float, inter: float, peer_bytes: float,
          core_s: float | None) -> NcclAllToAll:
    """The prediction from the busiest GPU's bytes inside (``intra``) and across (``inter``)
    nodes, the largest bytes to one peer, and the pods' core time (seconds) if any."""
    channels, per_peer = p2p_channels(s)
    proto = Proto.LL if peer_bytes <= per_peer * P2P_LL_THRESHOLD else Proto.SIMPLE
    slow = 0.5 if proto is Proto.LL else 1.0
    bw_intra, bw_inter = _per_gpu_bandwidth(s)
    terms = {"nvlink": intra / (1e3 * bw_intra * slow) if intra else 0.0,
             "network": (inter / (1e3 * bw_inter * slow) if bw_inter else math.inf)
             if inter else 0.0}
    if core_s is not None:
        terms["core"] = core_s * 1e6
    bound = max(terms, key=lambda k: terms[k])
    latency = _latency(s, channels, per_peer, proto)
    time_us = latency + terms[bound]
    core_limit = None
    if bound == "core" and terms["core"] > 0:
        core_limit = nbytes / terms["core"] / 1e3 * bus_factor(CollectiveKind.ALLTOALL,
                                                                s.n_ranks)
    return NcclAllToAll(nbytes, s.n_ranks, proto, time_us, latency, channels, per_peer,
                        p2p_chunk(s), bound, core_limit)


def nccl_alltoall(system: NcclSystem, nbytes: int) -> NcclAllToAll:
    """NCCL's AllToAll of ``nbytes`` per rank (nccl-tests' size: ``nbytes / n`` to each peer)
    on ``system``, every node holding ``system.ppn`` ranks and no fabric beyond the NICs.

    >>> from cclc.nccl_model import NcclSystem
    >>> node = NcclSystem("hopper", 8, 1, "nvlink", 370.8, nvswitch=True)
    >>> round(nccl_alltoall(node, 8 << 30).busbw)
    371
    """
    n, ppn = system.n_ranks, system.ppn
    per_peer = nbytes / n
    return _time(system, nbytes, per_peer * (ppn - 1), per_peer * (n - ppn), per_peer, None)


def _node_loads(topo: Topology, group: tuple[int, ...], sent: np.ndarray
                ) -> tuple[float, float]:
    """The most bytes one member sends or receives inside its node, and across nodes."""
    n = len(group)
    if topo.node_of_rank is None:
        node = np.zeros(n, dtype=np.int64)
    else:
        node = np.asarray(topo.node_of_rank)[np.asarray(group)]
    own = np.diagonal(sent)
    intra_out, intra_in = np.zeros(n), np.zeros(n)
    for v in np.unique(node).tolist():
        members = np.flatnonzero(node == v)
        block = sent[np.ix_(members, members)]
        intra_out[members] = block.sum(axis=1)
        intra_in[members] = block.sum(axis=0)
    intra_out -= own
    intra_in -= own
    inter_out = sent.sum(axis=1) - own - intra_out
    inter_in = sent.sum(axis=0) - own - intra_in
    return (float(max(intra_out.max(), intra_in.max())),
            float(max(inter_out.max(), inter_in.max())))


def alltoall_estimate(coll: Collective, arch: str = "hopper") -> NcclAllToAll | None:
    """NCCL's predicted AllToAll for ``coll`` (uniform, or the pairs of ``pair_sizes``) on its
    topology, held to what the pods' core links carry on a three-tier fabric; ``None`` for
    another collective, a single rank, or a machine without nodes and switches (a torus or
    mesh: NCCL's p2p reaches a GPU that is not a direct NVLink neighbour over PCIe and host
    memory, which such a topology does not describe, so no time is claimed), or where the
    bytes inside or across nodes have no bandwidth the model can see."""
    if coll.kind is not CollectiveKind.ALLTOALL or coll.n < 2:
        return None
    if coll.topology.kind == "torus" or coll.topology.node_of_rank is None:
        return None
    system = system_of(coll.topology, coll.group, arch)
    topo, group = coll.topology, tuple(coll.group)
    if coll.pair_sizes is None:
        # the fullest node's members send the most over NVLink, the emptiest's over the NICs
        assert topo.node_of_rank is not None
        _, members = np.unique(np.asarray(topo.node_of_rank)[np.asarray(group)],
                               return_counts=True)
        n, per_peer = coll.n, coll.size / coll.n
        intra = per_peer * (int(members.max()) - 1)
        inter = per_peer * (n - int(members.min()))
        largest = per_peer
        core = pod_core_seconds(topo, group, per_peer)
    else:
        sent = np.asarray(coll.pair_sizes, dtype=np.float64)
        intra, inter = _node_loads(topo, group, sent)
        largest = float(sent.max())
        core = pod_core_seconds(topo, group, sent)
    bw_intra, bw_inter = _per_gpu_bandwidth(system)
    if (intra and not bw_intra) or (inter and not bw_inter):
        # bytes to move over a path the model finds no bandwidth on (a schedule document whose
        # vertex names no longer say which vertex is a node's switch): no time is claimed
        return None
    return _time(system, coll.size, intra, inter, largest, None if core is None else core[0])
