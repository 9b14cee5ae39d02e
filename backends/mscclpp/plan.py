"""The execution plan document: a :class:`~backends.mscclpp.lower.LoweredPlan` in the JSON that
MSCCL++'s loader reads (microsoft/mscclpp ``src/core/executor/execution_plan.cc`` at the commit
of :mod:`backends.mscclpp.limits`).

Channel and buffer ids are positions: a GPU's ``channels`` list its peers per channel type, and
a channel id is the peer's position among that type's peers; a threadblock's ``channels``
name the GPU's channel ids it uses and an op's ``channel_ids`` are positions in the
threadblock's list; ``remote_buffers`` are numbered in order and an op's ``buffer_id`` is a
position in its threadblock's ``remote_buffer_refs`` for the op's channel type. Switch
(NVLS multicast) channels are one per multicast group and buffer that any rank's ``gstore``
uses, declared alike on every member of the group (MSCCL++ connects them with a collective call
over the group, ``connectNvlsCollective``); an op's ``switch_channel_id`` is a position in its
threadblock's switch channels.
"""

from __future__ import annotations

from backends.mscclpp.limits import LIMITS
from backends.mscclpp.lower import BUF_LETTER, Instr, LoweredPlan, Region
from cclc.ir import Buf

__all__ = ["plan_document"]

_CHANNEL_TYPES = ("memory", "port")
#: ops that write a peer's buffer (their dst_buff names a remote buffer)
_REMOTE_WRITES = ("put", "pwsf", "ppkt")


def plan_document(low: LoweredPlan, *, name: str, collective: str, min_bytes: int,
                  max_bytes: int, threads: int) -> dict:
    """The plan as a JSON-ready dict."""
    n = len(low.threadblocks)
    switches = sorted({(op.peers, op.dst[0].buf) for tbs in low.threadblocks for tb in tbs
                       for op in tb if op.channel == "switch"})
    gpus = [_gpu(low, r, [sw for sw in switches if r in sw[0]]) for r in range(n)]
    return {
        "name": name,
        "collective": collective,
        "protocol": low.protocol,
        "inplace": low.inplace,
        "reuse_resources": False,
        "gpus": gpus,
        "num_threads_per_block": threads,
        "use_double_scratch_buffer": False,
        "buffer_alignment": LIMITS["buffer_alignment"].value,
        "min_message_size": min_bytes,
        "max_message_size": max_bytes,
    }


def _gpu(low: LoweredPlan, rank: int, switches: list) -> dict:
    peers = {t: sorted(p for (a, p), kind in low.channels.items() if a == rank and kind == t)
             for t in _CHANNEL_TYPES}
    channel_id = {(t, p): i for t in _CHANNEL_TYPES for i, p in enumerate(peers[t])}
    channel_id.update({("switch", sw): i for i, sw in enumerate(switches)})
    buffers: dict[tuple[str, int, int], int] = {}
    for tb in low.threadblocks[rank]:
        for op in tb:
            if op.name in _REMOTE_WRITES:
                buffers.setdefault(_buffer_key(op), len(buffers))
    tbs = [_threadblock(k, tb, channel_id, buffers) for k, tb in enumerate(low.threadblocks[rank])]
    return {
        "id": rank,
        "input_chunks": low.input_chunks,
        "output_chunks": low.output_chunks,
        "scratch_chunks": low.scratch_chunks[rank],
        "threadblocks": tbs,
        "channels": [{"channel_type": t, "connected_to": peers[t]} for t in _CHANNEL_TYPES
                     if peers[t]] + [
            {"channel_type": "switch", "buffer_type": BUF_LETTER[buf],
             "rank_groups": [{"size": len(group), "ranks": list(group)}]}
            for group, buf in switches],
        "remote_buffers": [{"rank": p, "type": BUF_LETTER[Buf(buf)],
                            "access_channel_types": [t]} for (t, p, buf) in buffers],
        "semaphores": [{"init_value": 0} for _ in range(len(low.threadblocks[rank]) - 1)],
    }


def _threadblock(tb_id: int, ops: tuple[Instr, ...], channel_id: dict, buffers: dict) -> dict:
    chans: dict[str, list[int]] = {t: [] for t in (*_CHANNEL_TYPES, "switch")}
    refs: dict[str, list[int]] = {t: [] for t in _CHANNEL_TYPES}
    for op in ops:
        keys = ([(op.peers, op.dst[0].buf)] if op.channel == "switch" else op.peers)
        for p in keys:
            cid = channel_id[(op.channel, p)]
            if cid not in chans[_channel(op)]:
                chans[_channel(op)].append(cid)
        if op.name in _REMOTE_WRITES:
            bid = buffers[_buffer_key(op)]
            if bid not in refs[_channel(op)]:
                refs[_channel(op)].append(bid)
    local_channel = {t: {g: i for i, g in enumerate(chans[t])} for t in chans}
    local_buffer = {t: {g: i for i, g in enumerate(refs[t])} for t in _CHANNEL_TYPES}
    out_ops = [_op(op, channel_id, buffers, local_channel, local_buffer) for op in ops]
    return {
        "id": tb_id,
        "ops": out_ops,
        "channels": [{"channel_type": t, "channel_ids": chans[t]} for t in chans if chans[t]],
        "remote_buffer_refs": [{"access_channel_type": t, "remote_buffer_ids": refs[t]}
                               for t in _CHANNEL_TYPES if refs[t]],
    }


def _channel(op: Instr) -> str:
    if op.channel is None:
        raise ValueError(f"MSCCL++ op '{op.name}' names peers but no channel type")
    return op.channel


def _buffer_key(op: Instr) -> tuple[str, int, int]:
    """A put's remote buffer: channel type, peer, buffer."""
    return (_channel(op), op.peers[0], int(op.dst[0].buf))


def _local(region: Region) -> dict:
    return {"type": BUF_LETTER[region.buf], "index": region.index, "size": region.size}


def _op(op: Instr, channel_id: dict, buffers: dict, local_channel: dict, local_buffer: dict
        ) -> dict:
    d: dict = {"name": op.name}
    if op.name in ("copy", "re", "upkt", "repkt"):
        d["src_buff"] = [_local(r) for r in op.src]
        d["dst_buff"] = [_local(r) for r in op.dst]
        if op.name in ("re", "repkt"):
            d["reduce_op"] = "sum"
    elif op.name in _REMOTE_WRITES:
        peer = op.peers[0]
        bid = buffers[_buffer_key(op)]
        d["src_buff"] = [_local(op.src[0])]
        d["dst_buff"] = [{"buffer_id": local_buffer[op.channel][bid], "index": op.dst[0].index,
                          "size": op.dst[0].size}]
        d["channel_ids"] = [local_channel[op.channel][channel_id[(op.channel, peer)]]]
        d["channel_type"] = op.channel
    elif op.name in ("signal", "wait"):
        d["channel_ids"] = [local_channel[op.channel][channel_id[(op.channel, p)]]
                            for p in op.peers]
        d["channel_type"] = op.channel
    elif op.name == "gstore":
        sid = channel_id[("switch", (op.peers, op.dst[0].buf))]
        d["src_buff"] = [_local(op.src[0])]
        d["dst_buff"] = [{"switch_channel_id": local_channel["switch"][sid],
                          "index": op.dst[0].index, "size": op.dst[0].size}]
        d["channel_type"] = "switch"
    elif op.name in ("sem_acquire", "sem_release"):
        d["semaphore_ids"] = list(op.semaphores)
    elif op.name != "nop":
        raise ValueError(f"no JSON rule for MSCCL++ op '{op.name}'")
    return d
