"""What MSCCL++'s plan loader checks and how it lays a threadblock out, for the independent
executor (:mod:`backends.mscclpp.executor`).

Read from microsoft/mscclpp at 1f5f065d7b13ab02df32c22568f38785d1eeec01:
``src/core/executor/execution_plan.cc`` (``getOpType``, ``parseChannels``,
``setupOperations``, ``setupOperation``), ``src/core/executor/executor.cc``
(``setupDeviceExecutionPlan``, ``setupNvlsChannels``), ``src/core/include/execution_common.hpp``
(the fixed-size arrays) and ``src/core/include/execution_kernel.hpp`` (``handlePipeline``).
A ``pipeline`` op is stored with its inner ops right after it (they count towards
``MAX_OPERATION``) and runs them ``nIterations`` times, iteration ``i`` on bytes
``[i * unit_size, i * unit_size + unit_size)`` of every region; a loaded threadblock is
therefore a flat list of ``(op, window)`` steps, ``window`` the iteration's ``(offset, unit)``
or None outside a pipeline.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["CallSizes", "LOADER_OPS", "MAX_CHANNEL", "MAX_CHANNEL_PER_OPERATION", "MAX_ITERATIONS",
           "MAX_OPERATION", "MODELLED_OPS", "PlanError", "SwitchGroup", "Unsupported",
           "expected_outputs", "load_channels", "load_ops", "switch_channels"]

#: op names the loader accepts (execution_plan.cc getOpType)
LOADER_OPS = frozenset(
    "nop barrier put pws pwsf get copy signal wait flush re res rre rres ppkt rppkt respkt "
    "cpkt upkt repkt recpkt recspkt glres gstore gstorepkt rlxsignal rlxwait pipeline "
    "sem_acquire sem_release".split())
#: the ops the executor runs
MODELLED_OPS = frozenset("nop barrier put pws pwsf get copy signal wait flush re res rre rres "
                         "rlxsignal rlxwait sem_acquire sem_release ppkt upkt repkt glres gstore "
                         "pipeline".split())
#: LL packet ops read no pipeline offset (handlePutPackets, handleUnpackPackets take none)
_PACKET_OPS = frozenset("ppkt rppkt respkt cpkt upkt repkt recpkt recspkt gstorepkt".split())
MAX_OPERATION = 64
MAX_CHANNEL = 16
MAX_CHANNEL_PER_OPERATION = 8
#: handlePipeline copies ``op.nIterations`` into a ``uint16_t``: more iterations wrap
MAX_ITERATIONS = (1 << 16) - 1

#: a switch (NVLS multicast) channel: the group's ranks and the buffer type it maps
SwitchGroup = tuple[tuple[int, ...], str]


class PlanError(Exception):
    """The plan is refused by MSCCL++, races, deadlocks, or computes the wrong result."""


class Unsupported(PlanError):
    """The plan uses ops this executor does not model (most packet ops)."""


def switch_channels(gpus: list[dict]) -> list[list[SwitchGroup]]:
    """Each GPU's switch channels in order (one per rank group, as ``parseChannels`` makes
    them), checked: a GPU belongs to every group it declares, and every member of a group
    declares it too with the same buffer type, as often (``connectNvlsCollective`` is a
    collective call over the group's ranks: a member that does not make it hangs the others)."""
    out: list[list[SwitchGroup]] = []
    for r, g in enumerate(gpus):
        mine: list[SwitchGroup] = []
        for ch in g.get("channels", []):
            if ch["channel_type"] != "switch":
                continue
            if ch.get("buffer_type") not in ("i", "o", "s"):
                raise PlanError(f"gpu {r}: switch channel with buffer_type "
                                f"{ch.get('buffer_type')!r} ('Invalid buffer type')")
            for group in ch["rank_groups"]:
                ranks = tuple(int(x) for x in group["ranks"])
                if r not in ranks:
                    raise PlanError(f"gpu {r} declares a switch channel over ranks {list(ranks)}"
                                    " that it is not one of")
                mine.append((ranks, ch["buffer_type"]))
        out.append(mine)
    for r, mine in enumerate(out):
        for group in set(mine):
            for m in group[0]:
                if not 0 <= m < len(out):
                    raise PlanError(f"gpu {r}: switch channel rank {m} does not exist")
                if out[m].count(group) != mine.count(group):
                    raise PlanError(
                        f"gpu {r} declares {mine.count(group)} switch channel(s) over ranks "
                        f"{list(group[0])} ('{group[1]}') and gpu {m} declares "
                        f"{out[m].count(group)}: connectNvlsCollective is collective over the "
                        "group, so the executor's set-up would hang")
    return out


def load_ops(name: str, ops: list[dict], upper_chunk_bytes: int) -> list[tuple[dict, tuple | None]]:
    """A threadblock's ops as the kernel steps through them: pipelines unrolled into their
    iterations (``upper_chunk_bytes``: ``getUpperBoundChunkSize`` at the call's size); checks
    what the loader and executor refuse and what would overrun a fixed-size array."""
    stored = 0
    for op in ops:
        _check_op(name, op)
        stored += 1
        if op["name"] == "pipeline":
            for inner in op["ops"]:
                _check_op(name, inner)
                if inner["name"] == "pipeline":
                    raise PlanError(f"{name}: a pipeline inside a pipeline (setupOperations "
                                    "stores one level of inner ops)")
                if inner["name"] in _PACKET_OPS:
                    raise PlanError(f"{name}: '{inner['name']}' inside a pipeline: packet ops "
                                    "take no iteration offset, so every iteration would redo "
                                    "the whole op")
            stored += len(op["ops"])
    if stored > MAX_OPERATION:
        raise PlanError(f"{name} has {stored} ops (pipelines' inner ops included), more than "
                        f"MAX_OPERATION ({MAX_OPERATION}); the executor refuses the plan")
    steps: list[tuple[dict, tuple | None]] = []
    for op in ops:
        if op["name"] != "pipeline":
            steps.append((op, None))
            continue
        unit = int(op["iter_context"]["unit_size"])
        if unit <= 0 or unit % 4:
            raise Unsupported(f"{name}: pipeline unit_size {unit} is not a positive multiple "
                              "of the 4-byte elements the executor moves")
        total = int(op["iter_context"]["num_chunks"]) * upper_chunk_bytes
        iterations = -(-total // unit)
        if iterations > MAX_ITERATIONS:
            raise PlanError(f"{name}: a pipeline of {iterations} iterations (unit_size {unit} "
                            f"over {total} bytes); handlePipeline counts them in a uint16_t, "
                            f"so more than {MAX_ITERATIONS} wrap")
        for i in range(iterations):
            steps += [(inner, (i * unit, unit)) for inner in op["ops"]]
    return steps


def _check_op(name: str, op: dict) -> None:
    if op["name"] not in LOADER_OPS:
        raise PlanError(f"{name}: op '{op['name']}' is not one the loader knows "
                        "('Invalid operation type')")
    if op["name"] not in MODELLED_OPS:
        raise Unsupported(f"{name}: op '{op['name']}' is not modelled")
    if len(op.get("channel_ids", ())) > MAX_CHANNEL_PER_OPERATION:
        raise PlanError(f"{name}: an op names {len(op['channel_ids'])} channels, more "
                        f"than MAX_CHANNEL_PER_OPERATION ({MAX_CHANNEL_PER_OPERATION})")


def load_channels(name: str, tb: dict, peers: dict[str, list[int]], n_switch: int,
                  rbufs: list) -> tuple[dict[str, list[int]], dict[str, list]]:
    """A threadblock's channels (type -> the GPU's channel ids, by the threadblock's index)
    and remote buffers (type -> (rank, buffer type) by buffer_id), checked as the loader and
    executor check them (or as their fixed-size arrays require)."""
    chans: dict[str, list[int]] = {"memory": [], "port": [], "switch": []}
    for ch in tb.get("channels", []):
        t = ch["channel_type"]
        if t not in chans:
            raise PlanError(f"{name}: channel type '{t}' ('Invalid channel type')")
        count = n_switch if t == "switch" else len(peers[t])
        for cid in ch["channel_ids"]:
            if not 0 <= cid < count:
                raise PlanError(f"{name}: {t} channel {cid} does not exist")
            chans[t].append(int(cid))
        if len(chans[t]) > MAX_CHANNEL:
            raise PlanError(f"{name} uses {len(chans[t])} {t} channels, more than "
                            f"MAX_CHANNEL ({MAX_CHANNEL})")
    refs: dict[str, list] = {"memory": [], "port": []}
    for ref in tb.get("remote_buffer_refs", []):
        t = ref["access_channel_type"]
        for bid in ref["remote_buffer_ids"]:
            if t not in rbufs[bid][2]:
                raise PlanError(f"{name}: remote buffer {bid} is not accessible through "
                                f"{t} channels")
            refs[t].append(rbufs[bid][:2])
        if len(refs[t]) > MAX_CHANNEL:
            raise PlanError(f"{name} refers to {len(refs[t])} remote buffers, more than "
                            f"MAX_CHANNEL ({MAX_CHANNEL})")
    return chans, refs


@dataclass(frozen=True, slots=True)
class CallSizes:
    """A call's buffer sizes as the loader derives them (``getSizeAndChunks``,
    ``checkMessageSize``, ``getUpperBoundChunkSize``): ``chunk_bytes`` per chunk of the buffer
    whose chunks the plan counts."""

    align: int
    in_bytes: int
    out_bytes: int
    size_per_rank: int
    n_chunks: int
    upper_chunk: int

    @classmethod
    def of(cls, plan: dict, chunk_bytes: int) -> CallSizes:
        g0 = plan["gpus"][0]
        ic, oc = int(g0["input_chunks"]), int(g0["output_chunks"])
        coll, n = plan["collective"], len(plan["gpus"])
        align = int(plan.get("buffer_alignment", 16))
        if ic == 0 and oc == 0:
            raise PlanError("input_chunks and output_chunks are both 0 (the loader throws)")
        per = {"allgather": (1, n), "reducescatter": (n, 1)}.get(coll, (1, 1))
        if coll not in ("allreduce", "allgather", "reducescatter", "alltoall"):
            raise Unsupported(f"collective '{coll}' has no postcondition here")
        if ic:
            in_bytes = chunk_bytes * ic
            out_bytes = in_bytes * per[1] // per[0]
        else:
            out_bytes = chunk_bytes * oc
            in_bytes = out_bytes * per[0] // per[1]
        if ic and oc and in_bytes // ic != out_bytes // oc:
            raise PlanError(f"input_chunks {ic} and output_chunks {oc} do not describe one "
                            f"{coll} (the loader's getSizeAndChunks throws)")
        for what, size, c in (("input", in_bytes, ic), ("output", out_bytes, oc)):
            if size % align or (c and (size // align) % c):
                raise PlanError(f"{what} size {size} is not a multiple of buffer_alignment x "
                                f"{what}_chunks (checkMessageSize)")
        size = out_bytes if coll == "allgather" else in_bytes
        lo = int(plan.get("min_message_size", 0))
        hi = int(plan.get("max_message_size", 2**64 - 1))
        # a plan is size-generic (every chunk scales alike), so it runs here at small chunks;
        # its window must still hold a size the loader accepts
        granule = size // (chunk_bytes // align)
        if -(-lo // granule) * granule > hi:
            raise PlanError(f"no size in [{lo}, {hi}] is a multiple of {granule} B "
                            "(buffer_alignment x chunks): the loader refuses every call")
        per_rank, chunks = (in_bytes, ic) if ic else (out_bytes, oc)
        upper = -(-(per_rank // align) // chunks) * align
        return cls(align, in_bytes, out_bytes, per_rank, chunks, upper)

    def calc(self, size: int, index: int, slices: int) -> int:
        """Byte offset of slice ``index`` of ``slices`` of ``size`` bytes (``calcOffset``)."""
        nelems = size // self.align
        return (index * (nelems // slices) + min(index, nelems % slices)) * self.align


def expected_outputs(coll: str, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Each rank's output buffer after ``coll`` on ``inputs`` (numpy)."""
    n = len(inputs)
    if coll == "allreduce":
        total = np.sum(inputs, axis=0)
        return [total] * n
    if coll == "allgather":
        return [np.concatenate(inputs)] * n
    if coll == "reducescatter":
        total = np.sum(inputs, axis=0)
        return list(np.split(total, n))
    if coll == "alltoall":
        blocks = [np.split(x, n) for x in inputs]
        return [np.concatenate([blocks[q][r] for q in range(n)]) for r in range(n)]
    raise Unsupported(f"collective '{coll}'")
