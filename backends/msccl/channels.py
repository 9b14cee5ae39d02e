"""Stage 3 of the MSCCL lowering (:mod:`backends.msccl.lower`): every message of a chain shares
a channel; concurrent messages on one pair get distinct channels, within the runtime's limits."""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass
from itertools import pairwise

from backends.msccl.runtimes import Runtime
from backends.msccl.steps import LimitError, Op

__all__ = ["Channels", "assign_channels"]


@dataclass(frozen=True, slots=True)
class Channels:
    """The messages in the chains they travel in (fused hops share one), each chain's
    channel (``chan_of``, per message), and how many channels the lowering could use."""

    placed: tuple[tuple[int, ...], ...]
    chan_of: dict[int, int]
    limit: int


def _channel_limits(ops: list[Op], rt: Runtime, nchannels: int | None) -> tuple[int, int]:
    """The channels a lowering may use, and the channels a GPU's peers must be spread over."""
    allowed = min(rt.max_channels, nchannels or rt.max_channels)
    # each peer of a GPU costs a threadblock per channel (a send stream and a receive stream
    # share one, see _pair_streams): keep the busiest GPU within the threadblock limit
    # (leaving a few for local ops)
    peers: dict[tuple[int, str], set[int]] = defaultdict(set)
    for op in ops:
        if op.src != op.dst:
            peers[(op.src, "s")].add(op.dst)
            peers[(op.dst, "r")].add(op.src)
    most = max((len(p) for p in peers.values()), default=1)
    # ... but a channel holds at most max_tbs_per_channel send peers (and receive peers) of a
    # GPU, so a GPU with many peers needs that many channels whatever the threadblock budget
    spread = -(-most // rt.max_tbs_per_channel)
    if spread > allowed:
        raise LimitError(
            f"a GPU exchanges with {most} peers; {rt.title} keeps at most "
            f"{rt.max_tbs_per_channel} send and {rt.max_tbs_per_channel} receive peers per "
            f"channel ({rt.limit('tbs_per_channel').cite()}), so it needs {spread} channels, "
            f"more than {allowed}")
    return max(spread, min(allowed, (rt.max_tbs - 4) // most)), spread


class _ChannelPlan:
    """The state of :func:`assign_channels` while it places chains one by one."""

    def __init__(self, ops: list[Op], rt: Runtime, limit: int, spread: int, n: int):
        self.ops, self.rt, self.limit, self.spread, self.n = ops, rt, limit, spread, n
        # (rank, "s"/"r", channel) -> the peers it sends to / receives from on that channel
        self.chan_peers: dict[tuple[int, str, int], set[int]] = defaultdict(set)
        self.busy: set[tuple[int, int, int, int]] = set()
        # (rank, chan, recv peer) -> send peer of a fused step, and the reverse
        self.partner_recv: dict[tuple[int, int, int], int] = {}
        self.partner_send: dict[tuple[int, int, int], int] = {}
        self.chan_of: dict[int, int] = {}
        # steps each (rank, direction, peer, channel) threadblock would get: a channel that
        # is full is skipped, so long schedules spread over more channels, not one long tb
        self.load: dict[tuple[int, str, int, int], int] = defaultdict(int)
        self.cap = max(1, rt.max_steps_per_tb // 2)     # the rest is room for nops
        self.most = rt.max_tbs_per_channel
        self.orders: dict[int, list[int]] = {}

    def order(self, src: int, dst: int) -> list[int]:
        """Channels to try for a message, in order."""
        # when peers must be spread, start at a channel picked by the offset dst - src: in a
        # direct alltoall each sender then puts n/spread consecutive offsets on a channel and
        # each receiver gets the same offsets there, so both sides fit (a first-fit search
        # from channel 0 fills a sender's channels in an order its receivers cannot match)
        first = 0 if self.spread == 1 else (dst - src) % self.n * self.spread // self.n
        order = self.orders.get(first)
        if order is None:
            order = self.orders[first] = [(first + i) % self.limit for i in range(self.limit)]
        return order

    def peer_fits(self, src: int, dst: int, c: int) -> bool:
        out, inn = self.chan_peers[(src, "s", c)], self.chan_peers[(dst, "r", c)]
        most = self.most
        return (dst in out or len(out) < most) and (src in inn or len(inn) < most)

    def tb_load(self, rank: int, way: str, peer: int, c: int) -> int:
        # a fused step ties a recv peer to a send peer: both directions share one tb
        if way == "s":
            other = self.partner_send.get((rank, c, peer))
            return self.load[(rank, "s", peer, c)] + (self.load[(rank, "r", other, c)]
                                                      if other is not None else 0)
        other = self.partner_recv.get((rank, c, peer))
        return self.load[(rank, "r", peer, c)] + (self.load[(rank, "s", other, c)]
                                                  if other is not None else 0)

    def fits(self, chain: tuple[int, ...], c: int, t: int) -> bool:
        ops = self.ops
        for k in chain:
            src, dst = ops[k].src, ops[k].dst
            if (src, dst, t, c) in self.busy or not self.peer_fits(src, dst, c):
                return False
            if (self.tb_load(src, "s", dst, c) >= self.cap
                    or self.tb_load(dst, "r", src, c) >= self.cap):
                return False
        for a, b in pairwise(chain):
            x, pa, pb = ops[a].dst, ops[a].src, ops[b].dst
            if (self.partner_recv.get((x, c, pa), pb) != pb
                    or self.partner_send.get((x, c, pb), pa) != pa):
                return False
        return True

    def least_loaded(self, src: int, dst: int, t: int) -> int:
        """When every channel is taken or full: the least loaded one that still has room for
        the pair (the global order still keeps it deadlock-free, or says why not)."""
        room = [cc for cc in self.order(src, dst) if self.peer_fits(src, dst, cc)]
        if not room:
            raise LimitError(
                f"GPU {src} -> GPU {dst}: every one of the {self.limit} channels already "
                f"holds {self.rt.max_tbs_per_channel} peers of one of them "
                f"({self.rt.limit('tbs_per_channel').cite()}); use more channels")
        free = [cc for cc in room if (src, dst, t, cc) not in self.busy] or room
        return min(free, key=lambda cc: self.load[(src, "s", dst, cc)])

    def place(self, chain: tuple[int, ...], c: int, t: int) -> None:
        ops = self.ops
        for k in chain:
            src, dst = ops[k].src, ops[k].dst
            self.chan_peers[(src, "s", c)].add(dst)
            self.chan_peers[(dst, "r", c)].add(src)
            self.busy.add((src, dst, t, c))
            self.load[(src, "s", dst, c)] += 1
            self.load[(dst, "r", src, c)] += 1
            self.chan_of[k] = c
        for a, b in pairwise(chain):
            x, pa, pb = ops[a].dst, ops[a].src, ops[b].dst
            self.partner_recv[(x, c, pa)] = pb
            self.partner_send[(x, c, pb)] = pa


def assign_channels(ops: list[Op], chains: list[tuple[int, ...]], rt: Runtime,
                    nchannels: int | None, n: int) -> Channels:
    """Stage 3 (see the module docstring): a channel for every chain, in IR order."""
    limit, spread = _channel_limits(ops, rt, nchannels)
    plan = _ChannelPlan(ops, rt, limit, spread, n)
    work = deque(chains)
    placed: list[tuple[int, ...]] = []
    while work:
        chain = work.popleft()
        t = ops[chain[0]].step
        src, dst = ops[chain[0]].src, ops[chain[0]].dst
        busy = plan.busy
        # a channel this pair already uses in this step cannot take the chain's first hop
        c = next((c for c in plan.order(src, dst)
                  if (src, dst, t, c) not in busy and plan.fits(chain, c, t)), None)
        if c is None and len(chain) > 1:
            # no channel keeps the fused tbs consistent: send the hops separately
            work.extendleft((k,) for k in reversed(chain))
            continue
        if c is None:
            c = plan.least_loaded(src, dst, t)
        plan.place(chain, c, t)
        placed.append(chain)
    return Channels(tuple(placed), plan.chan_of, limit)
