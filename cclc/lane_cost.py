"""What the NCCL library's lanes cost on each rank, and how many it makes under a memory budget.

The generated NCCL library (:mod:`cclc.dataflow`) runs every message lane on a communicator of
its own, made with ``ncclCommSplit`` on the first call, a CUDA stream per lane and a CUDA event
per table entry. A split communicator that does not share its parent's resources (the library
does not: see ``docs/backends.md``, "Sharing resources between lanes") allocates its own
buffers for every peer it sends to or receives from, on every channel it uses for that peer.
The figures below are NCCL's, read in NVIDIA/nccl at tag v2.30.7-1 (commit
73cf112295c33aee2b895f329f592f2a9b4b0f97):

* per protocol, one buffer per connection and channel (``computeBuffSizes`` in
  ``src/init.cc``): LL ``DEFAULT_LL_BUFFSIZE`` = ``NCCL_LL_LINES_PER_THREAD`` (8) x
  ``NCCL_LL_MAX_NTHREADS`` (512) x ``NCCL_STEPS`` (8) x ``sizeof(union ncclLLFifoLine)`` (16
  bytes) = 512 KiB; LL128 ``DEFAULT_LL128_BUFFSIZE`` = ``NCCL_LL128_ELEMS_PER_THREAD`` (120) x
  ``NCCL_LL128_MAX_NTHREADS`` (640) x ``NCCL_STEPS`` x 8 bytes = 4,915,200 bytes; Simple
  ``DEFAULT_BUFFSIZE`` = 4 MiB (``NCCL_BUFFSIZE``); the constants are in
  ``src/include/device.h``;
* the P2P transport (GPUs of one node, ``p2pSendSetup`` and ``p2pRecvSetup`` in
  ``src/transport/p2p.cc``) allocates, per connection and channel, at the sender a
  ``struct ncclSendMem`` (``MEM_ALIGN`` = 4096 bytes, ``src/include/comm.h``) plus, with P2P
  read (NVLink between Ampere or newer GPUs, ``p2pGetInfo``), the Simple buffer; at the
  receiver a ``struct ncclRecvMem`` (4096 bytes) plus the other protocols' buffers; each side
  rounded up to ``CUDA_IPC_MIN`` = 2 MiB. With P2P read that is 6 MiB at the sender and 6 MiB
  at the receiver (without it 2 MiB and 10 MiB: the same 12 MiB a connection);
* channels per peer (``ncclTopoComputeP2pChannels`` and ``ncclTopoComputeP2pChannelsPerPeer``
  in ``src/graph/paths.cc``): ``p2pnChannelsPerPeer`` is the smaller of the topology's count
  (at least 2 for NVLink and PCIe peers) rounded up to a power of two, and ``p2pnChannels``,
  at most the communicator's channels, which ``maxCTAs`` caps. The library gives every lane
  ``lane_ctas`` CTAs (a power of two, lanes x CTAs <= 32 so that all lanes can hold their SMs
  at once), so a connection uses at most ``lane_ctas`` channels;
* the network transport shares its point-to-point buffers per communicator
  (``NCCL_NET_SHARED_BUFFERS``, ``sharedNetBuffersInit`` in ``src/transport/net.cc``:
  ``p2pnChannels`` x ``NCCL_SHARED_STEPS`` (16) x ``p2pChunkSize`` (128 KiB,
  ``NCCL_P2P_NET_CHUNKSIZE``) per direction), which is not counted here: the estimate prices
  every peer as a P2P peer, an upper bound for a lane's remote peers whenever it uses at most
  ``lane_ctas`` x 3 channels per connection, as it does;
* NCCL connects a peer on a channel when the first ``ncclSend``/``ncclRecv`` to it runs
  (``ncclTransportP2pSetup`` from ``src/enqueue.cc``), so the first call pays every
  connection's setup, after the ``ncclCommSplit`` of every lane (each a collective over all
  ranks of the caller's communicator).

Memory per rank is therefore: for every (peer, lane) the rank sends to, ``channels`` x 6 MiB,
and for every (peer, lane) it receives from, ``channels`` x 6 MiB (P2P read). These are NCCL's
buffers only; each communicator also has small device structures and a 1 MiB host work FIFO
(``NCCL_WORK_FIFO_BYTES_DEFAULT`` in ``src/init.cc``) and a proxy thread, not counted.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cclc.dataflow import MAX_LANES, DataflowPlan, lane_colouring, lower_schedule
from cclc.errors import ScheduleError
from cclc.ir import Schedule

__all__ = ["CUDA_IPC_MIN", "DEFAULT_LANE_MEMORY", "LANE_CTA_LIMIT", "LL128_BUFFSIZE",
           "LL_BUFFSIZE", "P2P_RECV_BYTES", "P2P_SEND_BYTES", "SIMPLE_BUFFSIZE", "LaneChoice",
           "LaneCost", "choose_lanes", "lane_cost", "lane_floor_refusal", "plan_entries",
           "schedule_lane_cost"]

#: NCCL's default per-protocol buffers of one connection on one channel (src/init.cc)
LL_BUFFSIZE = 8 * 512 * 8 * 16
LL128_BUFFSIZE = 120 * 640 * 8 * 8
SIMPLE_BUFFSIZE = 1 << 22
#: the P2P transport rounds each side of a connection up to this (src/include/comm.h)
CUDA_IPC_MIN = 2 * 1024 * 1024
#: sizeof(struct ncclSendMem) and sizeof(struct ncclRecvMem): MEM_ALIGN (src/include/comm.h)
_CONN_HEADER = 4096


def _round_up(value: int, to: int) -> int:
    return -(-value // to) * to


#: bytes one P2P connection allocates per channel on the sending and on the receiving GPU,
#: with P2P read (p2pSendSetup / p2pRecvSetup, src/transport/p2p.cc)
P2P_SEND_BYTES = _round_up(_CONN_HEADER + SIMPLE_BUFFSIZE, CUDA_IPC_MIN)
P2P_RECV_BYTES = _round_up(_CONN_HEADER + LL_BUFFSIZE + LL128_BUFFSIZE, CUDA_IPC_MIN)

#: lanes x CTAs per lane stay within this many CTAs (the library's rule: every lane's kernels,
#: which wait for their peers while holding their SMs, must fit on the GPU at once)
LANE_CTA_LIMIT = 32

#: the default memory budget of one rank's lane buffers: 2 GiB, about 1.5% of an H200's
#: 141 GB; an alltoall over 128 ranks (127 peers each way, one channel) needs about 1.5 GiB
DEFAULT_LANE_MEMORY = 2 * 1024 ** 3


@dataclass(frozen=True, slots=True)
class LaneCost:
    """What the library makes and allocates on the most loaded rank (each figure its own
    maximum over the ranks).

    ``lanes``: message lanes, each a communicator split from the caller's (``communicators``,
    the same number); ``lane_ctas``: the CTAs (and so at most the channels) each lane's
    communicator uses per peer; ``sends``/``recvs``: the (peer, lane) connections a rank sends
    on and receives on; ``device_bytes``: NCCL's connection buffers on the rank (the module
    docstring's formula); ``connection_setups``: connections x channels the first call sets
    up; ``streams`` and ``events``: CUDA streams and events the library creates."""

    lanes: int
    communicators: int
    lane_ctas: int
    sends: int
    recvs: int
    device_bytes: int
    connection_setups: int
    streams: int
    events: int

    def describe(self) -> str:
        """One line for the compile report."""
        mib = self.device_bytes / 2 ** 20
        return (f"{self.lanes} lanes ({self.communicators} communicators split from the "
                f"caller's, {self.lane_ctas} CTA{'s' if self.lane_ctas != 1 else ''} each), "
                f"{self.sends} send and {self.recvs} receive connections, {mib:.0f} MiB of "
                f"NCCL buffers (estimate), {self.streams} streams and {self.events} events "
                f"per rank at most")


@dataclass(frozen=True, slots=True)
class LaneChoice:
    """The largest lane count (``max_lanes``) and CTAs per lane (``lane_ctas``) whose
    estimated buffers fit ``budget`` bytes per rank (more lanes first: they are what lets a
    rank's peers proceed at once; then more CTAs, which only add bandwidth per connection)."""

    max_lanes: int
    lane_ctas: int
    budget: int
    device_bytes: int


def _connections(n: int, src: np.ndarray, dst: np.ndarray, lane: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Per rank, the distinct (peer, lane) it sends on and receives on."""
    net = src != dst
    if not net.any():
        return np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
    width = int(lane[net].max()) + 1
    key = np.unique((src[net] * n + dst[net]) * width + lane[net])
    pair = key // width
    return (np.bincount(pair // n, minlength=n).astype(np.int64),
            np.bincount(pair % n, minlength=n).astype(np.int64))


def _bytes(sends: np.ndarray, recvs: np.ndarray, lane_ctas: int) -> int:
    per_rank = lane_ctas * (sends * P2P_SEND_BYTES + recvs * P2P_RECV_BYTES)
    return int(per_rank.max()) if len(per_rank) else 0


def _ctas_for(lanes: int) -> int:
    """The most CTAs per lane, a power of two, with ``lanes`` x CTAs <= LANE_CTA_LIMIT."""
    ctas = max(1, LANE_CTA_LIMIT // max(lanes, 1))
    return 1 << (ctas.bit_length() - 1)


def choose_lanes(s: Schedule, budget: int = DEFAULT_LANE_MEMORY) -> LaneChoice:
    """Lanes and CTAs per lane of the library for ``s`` under ``budget`` bytes per rank.

    Fewer CTAs shrink every connection's channels; fewer lanes only merge connections (a
    pair whose messages take two routes has a lane per route) and save communicators. When
    even one lane with one CTA does not fit, :class:`~cclc.errors.ScheduleError` says what the
    schedule needs.

    >>> from cclc.collective import CollectiveKind, make_collective
    >>> from cclc.plan import plan
    >>> from cclc.topology import torus
    >>> ring = torus("ring", (4,))
    >>> s = plan(make_collective("ag", CollectiveKind.ALLGATHER, ring, (0, 1, 2, 3),
    ...                          1 << 20)).schedule
    >>> c = choose_lanes(s)
    >>> (c.max_lanes, c.lane_ctas, c.device_bytes // 2 ** 20)
    (32, 8, 192)
    >>> choose_lanes(s, 100 * 2 ** 20).lane_ctas
    4
    """
    why = lane_floor_refusal(s, budget)
    if why is not None:
        raise ScheduleError(why)
    o = s.ops
    src, dst = o.src.astype(np.int64), o.dst.astype(np.int64)
    route = o.route.astype(np.int64)
    needed = None
    cap = MAX_LANES
    while cap >= 1:
        lane = lane_colouring(s.n, src, dst, route, cap)
        lanes = int(lane.max()) + 1 if len(lane) and lane.max() >= 0 else 0
        sends, recvs = _connections(s.n, src, dst, lane)
        ctas = _ctas_for(lanes)
        while ctas >= 1:
            used = _bytes(sends, recvs, ctas)
            if used <= budget:
                # the colouring with this cap is the one lower() makes with max_lanes=cap
                return LaneChoice(cap, ctas, budget, used)
            ctas //= 2
        needed = used if needed is None else min(needed, used)
        # fewer lanes than the colouring used before: each step down merges some connections
        cap = min(cap, lanes) - 1
    raise ScheduleError(_too_small(needed or 0, budget))


def lane_floor_refusal(s: Schedule, budget: int = DEFAULT_LANE_MEMORY) -> str | None:
    """Why no lane count fits ``s`` in ``budget`` bytes per rank, or None: every pair of
    ranks that exchanges messages keeps at least one connection with one CTA, and below that
    nothing is tried (:func:`choose_lanes` raises this). A count of pairs, so cheap enough to
    ask before a schedule is priced under the nccl model: the 4,096-GPU fat tree's direct
    AllToAll (4,095 peers a rank, 48 GiB of connection buffers) was otherwise lowered into
    lanes for over half an hour, for an output that then refused it."""
    if budget <= 0:
        raise ScheduleError(f"the NCCL lane memory budget must be > 0 bytes, not {budget}")
    # kept on the schedule: the planner asks before pricing, then the pricing's lane choice,
    # the output's refusal and its rendering ask again (a sort of every op's pair each time)
    if "lane_floor" not in s._cache:
        o = s.ops
        src, dst = o.src.astype(np.int64), o.dst.astype(np.int64)
        s._cache["lane_floor"] = _bytes(
            *_connections(s.n, src, dst, np.zeros(len(src), dtype=np.int64)), 1)
    floor = s._cache["lane_floor"]
    return _too_small(floor, budget) if floor > budget else None


def _too_small(needed: int, budget: int) -> str:
    return (f"the NCCL library needs at least {_mib(needed)} per rank for its connection "
            f"buffers ({P2P_SEND_BYTES // 2 ** 20} MiB per connection sent on, "
            f"{P2P_RECV_BYTES // 2 ** 20} MiB per connection received on, one channel each: "
            f"NCCL 2.30's P2P transport), more than the budget of {_mib(budget)}; raise "
            "--nccl-lane-memory")


def _mib(value: int) -> str:
    return f"{value / 2 ** 20:.0f} MiB"


def lane_cost(n: int, src, dst, lane, n_lanes: int, n_local: int, entries, lane_ctas: int
              ) -> LaneCost:
    """The cost of a plan: ``src``/``dst``/``lane`` per op (a lane per network op),
    ``n_lanes`` message lanes, ``n_local`` local lanes per rank, ``entries`` the number of
    table entries of each rank (one event each) and ``lane_ctas`` CTAs per lane."""
    src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
    sends, recvs = _connections(n, src, dst, np.asarray(lane, dtype=np.int64))
    entries = np.asarray(entries, dtype=np.int64)
    streams = n_lanes + n_local
    return LaneCost(
        lanes=n_lanes, communicators=n_lanes, lane_ctas=lane_ctas,
        sends=int(sends.max()) if n else 0, recvs=int(recvs.max()) if n else 0,
        device_bytes=_bytes(sends, recvs, lane_ctas),
        connection_setups=int(((sends + recvs) * lane_ctas).max()) if n else 0,
        streams=streams,
        # an event per entry, one for the caller's stream and one per lane (see nccl.cu.j2)
        events=int(entries.max()) + 1 + streams if len(entries) else 1 + streams)


def schedule_lane_cost(s: Schedule, choice: LaneChoice, op_overhead: float) -> LaneCost:
    """The cost of the library for ``s`` with ``choice``'s lanes, from the plan in the
    schedule's own chunks (lowered with the library's ``op_overhead`` per group, as the
    backend does): the same lanes and local lanes as the emitted tables, and an entry per
    snapshot and local op at its rank and per message at both of its ranks."""
    plan = lower_schedule(s, op_overhead=op_overhead, max_lanes=choice.max_lanes)
    o = s.ops
    src, dst = o.src.astype(np.int64), o.dst.astype(np.int64)
    return lane_cost(s.n, src, dst, plan.lane, plan.n_lanes, plan.n_local,
                     plan_entries(s, plan), choice.lane_ctas)


def plan_entries(s: Schedule, plan: DataflowPlan) -> np.ndarray:
    """Per rank, the table entries ``plan`` gives it: one per snapshot and local op at its
    rank, one per message at each of its two ranks."""
    o = s.ops
    src, dst = o.src.astype(np.int64), o.dst.astype(np.int64)
    cols = plan.columns
    if cols is None:            # a plan without columns has its items as tuples
        item_op = np.array([it.op for it in plan.items], dtype=np.int64)
        snap = np.array([it.snap for it in plan.items], dtype=bool)
    else:
        item_op, snap = cols.op, cols.snap
    a, b = src[item_op], dst[item_op]
    message = ~snap & (a != b)
    return np.bincount(a, minlength=s.n) + np.bincount(b[message], minlength=s.n)
