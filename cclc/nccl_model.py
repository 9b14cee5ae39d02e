"""What a user gets today: NCCL's own algorithm/protocol choice and its predicted time.

NCCL picks, per call, the (algorithm, protocol) with the lowest time in its cost model
(NCCL 2.2x ``src/graph/tuning.cc``: ``ncclTopoTuneModel`` / ``ncclTopoGetAlgoTime``, where the
constants and formulas are)::

    time(us) = latency(algo, proto) + nBytes / (1000 * algbw(algo, proto))      # bw in GB/s

This module evaluates that model on a cclc topology, so every cclc report can say how much
faster its schedule is *predicted* to be than NCCL's default on the same machine. It is a model
of NCCL's model, with these documented simplifications:

* The topology search (rings/trees, channels, per-channel bandwidth) is replaced by its result
  on a well-formed machine: total per-GPU bandwidth = the GPU's NVLink/PCIe link inside a node
  (``bwIntra``), and its share of the node's NIC bandwidth across nodes, capped by that
  intra-node link (``bwInter``).
  ``nChannels`` (only used by the per-channel caps) is that bandwidth over NCCL's per-link
  NVLink figure (20.6 GB/s on Hopper), at most 32.
* ``treeCorrectionFactor`` (a 24-bucket table of 0.4..1.0) is not modelled: Tree is
  modelled without it, i.e. slightly optimistic for Tree.
* NVLS / CollNet need in-network reduction hardware the topology model does not describe and
  are left out; ``graph.latencyInter`` is 0.
* A torus has no NCCL; it is modelled the way NCCL sees GPUs joined by point-to-point NVLink
  without a switch (a DGX-1): one node, NVLink latencies, one link of bandwidth per ring
  (NCCL's topology search does not know tori and embeds one ring per channel).
* AllToAll is grouped send/recv in NCCL, outside the tuning tables: not modelled.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from cclc.collective import Collective, CollectiveKind
from cclc.errors import CollectiveError
from cclc.topology import LinkKind, Topology

__all__ = [
    "ALGORITHMS",
    "ARCHS",
    "PROTOCOLS",
    "NcclEstimate",
    "NcclView",
    "algo_time",
    "nccl_estimate",
    "nccl_view",
]

ALGORITHMS = ("tree", "ring", "pat")
PROTOCOLS = ("ll", "ll128", "simple")
ARCHS = ("volta", "ampere", "hopper", "blackwell")

# -- constants of ncclTunerConstantsDefaults (microseconds, GB/s) ------------------------------
_BASE_LAT = {"tree": (6.8, 14.0, 8.4), "ring": (6.6, 14.0, 8.4), "pat": (8.0, 8.0, 8.0)}
_HW_LAT = {  # [hw][algo] -> (LL, LL128, Simple)
    "nvlink": {"tree": (0.6, 1.25, 4.0), "ring": (0.6, 1.9, 3.4), "pat": (4.0, 4.0, 4.0)},
    "pci": {"tree": (1.0, 1.9, 4.0), "ring": (1.0, 2.5, 5.7), "pat": (4.0, 4.0, 4.0)},
    "net": {"tree": (5.0, 8.5, 14.0), "ring": (2.7, 4.0, 14.0), "pat": (14.0, 14.0, 14.0)},
}
_LL_MAX_BW = {"volta": (39.0, 39.0, 20.4), "ampere": (87.7, 22.5, 19.0),
              "hopper": (141.0, 45.0, 35.0), "blackwell": (282.0, 90.0, 70.0)}
_PER_CH_MAX_RING_LL128 = {"volta": 20.0, "ampere": 20.0, "hopper": 36.7, "blackwell": 40.0}
_PER_CH_MAX_TREE_LL128 = {"volta": (20.0, 20.0, 20.0), "ampere": (20.0, 20.0, 20.0),
                          "hopper": (36.7, 36.7, 29.0), "blackwell": (55.6, 31.67, 20.0)}
_PER_CH_MAX_TREE = {"volta": (26.5, 18.5, 10.0), "ampere": (24.0, 23.6, 17.8),
                    "hopper": (38.7, 41.4, 36.0), "blackwell": (70.0, 42.8, 24.0)}
#: NCCL's NVLink bandwidth per link (topo.h), used to turn a GPU's bandwidth into channels
_NVLINK_PER_CHANNEL = {"volta": 20.0, "ampere": 20.0, "hopper": 20.6, "blackwell": 40.1}
_MAX_CHANNELS = 32
_NET_OVERHEAD_US = 1.0  # Intel hosts; x3 for Simple


@dataclass(frozen=True)
class NcclView:
    """The machine as NCCL's tuning model sees it (bandwidths in GB/s, per GPU)."""

    n_ranks: int
    n_nodes: int
    bw_intra: float
    bw_inter: float
    intra_hw: str  # "nvlink" | "pci"
    n_channels: int

    @property
    def ppn(self) -> int:
        return self.n_ranks // self.n_nodes


@dataclass(frozen=True)
class NcclEstimate:
    """NCCL's choice for one collective and the whole table it chose from (seconds)."""

    algorithm: str
    protocol: str
    time: float
    algbw: float  # B/s, nccl-tests definition
    busbw: float
    table: tuple[tuple[str, str, float | None], ...]  # (algo, proto, seconds or None)
    view: NcclView

    @property
    def name(self) -> str:
        return f"{self.algorithm}/{self.protocol}"


def _gbps(bytes_per_s: float) -> float:
    return bytes_per_s / 1e9


def nccl_view(coll: Collective, arch: str = "hopper") -> NcclView:
    """The ``NcclView`` of ``coll``'s group on its topology."""
    topo = coll.topology
    n = coll.n
    if topo.kind == "torus":
        out = [float(topo.link_bandwidth[(topo.link_src == r) & ~topo.link_failed].max(initial=0))
               for r in coll.group[:1]]
        bw = _gbps(out[0])
        # GPUs joined by point-to-point links and no switch (a DGX-1's hybrid cube mesh) are one
        # NVLink domain to NCCL; its rings use one link per hop
        return NcclView(n, 1, bw, 0.0, "nvlink", _channels(bw, arch))
    nodes = topo.node_of_rank[np.asarray(coll.group)]
    n_nodes = len(np.unique(nodes))
    r0 = coll.group[0]
    intra_links = np.flatnonzero((topo.link_src == r0)
                                 & np.isin(topo.link_kind, (LinkKind.NVLINK, LinkKind.PCIE))
                                 & ~topo.link_failed)
    # the GPU's link to its node switch (not the PCIe link to its own NIC)
    to_switch = [int(k) for k in intra_links
                 if topo.vertex_names[topo.link_dst[k]].endswith(("nvswitch", "pcie"))]
    pick = to_switch or intra_links.tolist()
    bw_intra = _gbps(float(topo.link_bandwidth[pick].max())) if pick else 0.0
    kind = int(topo.link_kind[pick[0]]) if pick else int(LinkKind.NVLINK)
    intra_hw = "nvlink" if kind == LinkKind.NVLINK else "pci"
    # the network ring runs GPU -> (PCIe or NVLink) -> NIC: the slower of the two limits it
    bw_inter = min(_gbps(_nic_share(topo, int(topo.node_of_rank[r0]))), bw_intra or math.inf)
    bw = bw_intra if n_nodes <= 2 else bw_inter
    return NcclView(n, n_nodes, bw_intra, bw_inter, intra_hw, _channels(bw, arch))


def _nic_share(topo: Topology, node: int) -> float:
    """Network bandwidth per GPU of ``node``: its NICs' uplinks over its GPUs."""
    prefix = f"node{node}.nic"
    nic_v = [v for v in range(topo.n_ranks, topo.n_vertices)
             if topo.vertex_names[v].startswith(prefix)]
    if not nic_v:
        return 0.0
    up = np.isin(topo.link_src, nic_v) & np.isin(topo.link_kind, (LinkKind.IB, LinkKind.ETH))
    gpus = int((topo.node_of_rank == node).sum())
    return float(topo.link_bandwidth[up & ~topo.link_failed].sum()) / max(gpus, 1)


def _channels(bw: float, arch: str) -> int:
    return int(min(_MAX_CHANNELS, max(1, math.ceil(bw / _NVLINK_PER_CHANNEL[arch] - 1e-9))))


def _scale(n_nodes: int) -> int:
    return 0 if n_nodes == 1 else 1 if n_nodes == 2 else 2


def algo_time(kind: CollectiveKind, n_bytes: int, view: NcclView, algo: str, proto: str,
              arch: str = "hopper") -> float | None:
    """NCCL's predicted time (seconds) of ``algo``/``proto``, or ``None`` where NCCL disables it.

    >>> v = NcclView(8, 1, 450.0, 0.0, "nvlink", 22)
    >>> round(algo_time(CollectiveKind.ALLREDUCE, 1 << 30, v, "ring", "simple") * 1e3, 3)
    4.232
    """
    if arch not in ARCHS:
        raise CollectiveError(f"unknown GPU architecture '{arch}'; known: {', '.join(ARCHS)}")
    p = PROTOCOLS.index(proto)
    n, nodes = view.n_ranks, view.n_nodes
    if n < 2:
        return None
    if kind not in (CollectiveKind.ALLREDUCE, CollectiveKind.ALLGATHER,
                    CollectiveKind.REDUCESCATTER):
        return None
    if algo == "tree" and kind is not CollectiveKind.ALLREDUCE:
        return None
    if algo == "pat" and (kind is CollectiveKind.ALLREDUCE or proto != "simple"
                          or nodes != n):
        return None
    n_ch = view.n_channels
    bw = view.bw_intra if nodes <= 2 else view.bw_inter
    bus = bw  # graph.nChannels x per-channel bandwidth
    sc = _scale(nodes)
    if algo == "ring":
        if proto == "ll":
            bus = min(_LL_MAX_BW[arch][sc], bus * 0.5)
        elif proto == "ll128":
            bus = min(bus * 0.92, n_ch * _PER_CH_MAX_RING_LL128[arch])
    elif algo == "tree":
        if proto == "simple":
            bus = min(bus * 0.92, n_ch * _PER_CH_MAX_TREE[arch][sc])
        elif proto == "ll":
            bus = min(bus / 3.8, _LL_MAX_BW[arch][sc])
        else:
            bus = min(bus * (7 / 9 if nodes == 1 else 120 / 128),
                      n_ch * _PER_CH_MAX_TREE_LL128[arch][sc])
    elif algo == "pat":
        bus *= 0.75
    if bus <= 0:
        return None
    # bus bandwidth -> algorithm bandwidth
    n_steps = 2 * (n - 1) if kind is CollectiveKind.ALLREDUCE else n - 1
    if algo == "ring":
        algbw = bus * n / n_steps
    elif kind is CollectiveKind.ALLREDUCE:
        algbw = bus * 0.5
    else:
        algbw = bus
    intra_lat = _HW_LAT[view.intra_hw][algo][p]
    inter_lat = _HW_LAT["net"][algo][p]  # + graph.latencyInter (0 here, twice for Simple)
    if algo == "ring":
        if nodes > 1:
            overhead = _NET_OVERHEAD_US * (3 if proto == "simple" else 1)
            intra_lat = max(intra_lat, overhead)
        inter_steps = (2 * (nodes - 1) if kind is CollectiveKind.ALLREDUCE else nodes - 1)
        lat = _BASE_LAT[algo][p] + (n_steps - inter_steps) * intra_lat + inter_steps * inter_lat
        if (kind is CollectiveKind.ALLREDUCE and proto == "simple" and nodes > 1
                and n_bytes / (n_ch * n) >= 64):
            lat *= 1.4 if arch in ("ampere", "hopper", "blackwell") else 1.9
    elif algo == "tree":
        lat = _BASE_LAT[algo][p] + 2 * ((view.ppn - 1) * intra_lat
                                        + math.log2(nodes) * inter_lat)
    else:  # pat
        lat = _BASE_LAT[algo][p] + math.log2(nodes) * (inter_lat / 3.5) + n * 2.8
    us = lat + n_bytes / (1000.0 * algbw)
    return us * 1e-6


def nccl_estimate(coll: Collective, arch: str = "hopper") -> NcclEstimate | None:
    """NCCL's choice and predicted time for ``coll``; ``None`` for what NCCL's tables do not
    cover (alltoall, broadcast, reduce)."""
    if coll.kind not in (CollectiveKind.ALLREDUCE, CollectiveKind.ALLGATHER,
                         CollectiveKind.REDUCESCATTER):
        return None
    view = nccl_view(coll, arch)
    table = []
    best: tuple[float, str, str] | None = None
    for algo in ALGORITHMS:
        for proto in PROTOCOLS:
            t = algo_time(coll.kind, coll.size, view, algo, proto, arch)
            table.append((algo, proto, t))
            if t is not None and (best is None or t < best[0]):
                best = (t, algo, proto)
    if best is None:
        return None
    t, algo, proto = best
    algbw = coll.size / t
    factor = (2 * (coll.n - 1) / coll.n if coll.kind is CollectiveKind.ALLREDUCE
              else (coll.n - 1) / coll.n)
    return NcclEstimate(algo, proto, t, algbw, algbw * factor, tuple(table), view)


def compare_with_nccl(coll: Collective, time: float) -> str | None:
    """One line for reports: NCCL's predicted choice and time, and cclc's predicted speed-up.

    ``None`` where NCCL's tables have nothing to say (alltoall, broadcast, reduce).
    """
    est = nccl_estimate(coll)
    if est is None or not 0 < time < math.inf or not 0 < est.time < math.inf:
        return None
    from cclc.units import format_time

    ratio = est.time / time
    verdict = f"{ratio:.2f}x faster" if ratio >= 1 else f"{1 / ratio:.2f}x slower"
    return (f"NCCL today (its cost model): {est.name} {format_time(est.time)}; cclc's schedule "
            f"is predicted {verdict}")
