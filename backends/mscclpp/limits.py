"""What MSCCL++'s executor accepts: every rule and fixed-size array its loader and kernel
impose on an execution plan, as data with the place it was read.

Read from microsoft/mscclpp at commit 1f5f065d7b13ab02df32c22568f38785d1eeec01 (2026-08-20):
the loader ``src/core/executor/execution_plan.cc``, the executor ``src/core/executor/executor.cc``,
the fixed sizes in ``src/core/include/execution_common.hpp`` and the kernel
``src/core/include/execution_kernel.hpp``. An array bound is not checked by the loader: an index
past it is undefined behaviour on the GPU, which is why the lowering keeps every plan inside
them and refuses, naming the limit, what it cannot split.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["COMMIT", "LIMITS", "REPOSITORY", "Limit", "OP_NAMES"]

REPOSITORY = "microsoft/mscclpp"
COMMIT = "1f5f065d7b13ab02df32c22568f38785d1eeec01"

_COMMON = "src/core/include/execution_common.hpp"
_PLAN = "src/core/executor/execution_plan.cc"
_EXECUTOR = "src/core/executor/executor.cc"


@dataclass(frozen=True, slots=True)
class Limit:
    """One number the executor enforces (or silently relies on), and where it was read."""

    value: int
    file: str
    symbol: str
    checked: bool
    """True when the executor refuses a plan past it with an error; False when a plan past it
    indexes a fixed-size array out of bounds."""

    def cite(self) -> str:
        return f"{self.symbol} in {REPOSITORY} {self.file} @ {COMMIT[:7]}"


#: limit name -> the limit
LIMITS: dict[str, Limit] = {
    # executor.cc refuses a threadblock with more ops (DeviceExecutionPlan::operations)
    "ops_per_tb": Limit(64, _COMMON, "MAX_OPERATION (checked in executor.cc "
                        "setupDeviceExecutionPlan)", True),
    # Channels::memoryChannels / portChannels / nvlsChannels are arrays of this size per
    # threadblock (one switch channel per multicast group and buffer)
    "channels_per_tb": Limit(16, _COMMON, "MAX_CHANNEL (Channels::memoryChannels, "
                             "portChannels, nvlsChannels)", False),
    # RemoteBuffers::memoryChannelBufferPtrs / portChannelBufferIds per threadblock
    "remote_buffers_per_tb": Limit(16, _COMMON, "MAX_CHANNEL (RemoteBuffers::"
                                   "memoryChannelBufferPtrs)", False),
    "channels_per_op": Limit(8, _COMMON, "MAX_CHANNEL_PER_OPERATION "
                             "(Operation::channelIndexes)", False),
    "local_buffers_per_op": Limit(2, _COMMON, "MAX_LOCAL_BUFFER_PER_OPERATION", False),
    "device_syncers": Limit(16, _COMMON, "MAX_DEVICE_SYNCERS (deviceSyncers[])", False),
    "semaphores_per_op": Limit(16, _COMMON, "MAX_DEVICE_SEMAPHORES "
                               "(Operation::deviceSemaphoreIds)", False),
    # with reuse_resources the executor shares one scratch buffer of this size and refuses a
    # plan needing more; without it, scratch is allocated per plan at the size it needs
    "default_scratch_bytes": Limit(1 << 27, _EXECUTOR, "defaultScratchBufferSize (checked in "
                                   "setupScratchBuffer when reuse_resources)", True),
    "predefined_scratch_bytes": Limit(1 << 26, _COMMON, "PREDFINED_SCRATCH_SIZE (scratch "
                                      "chunk size under reuse_resources)", False),
    # Operation::inputOffsets / outputOffsets / *BufferSizes are uint32_t byte counts
    "byte_offset": Limit((1 << 32) - 1, _COMMON, "Operation::inputOffsets (uint32_t)", False),
    # channelIndexes and BufferRef ids are uint8_t
    "channel_index": Limit(255, _COMMON, "Operation::channelIndexes (uint8_t)", False),
    "threads_per_block": Limit(1024, _PLAN, "num_threads_per_block (default 1024; CUDA's "
                               "largest block)", False),
    # checkMessageSize: sizes must be multiples of buffer_alignment x chunks
    "buffer_alignment": Limit(16, _PLAN, "buffer_alignment (default 16; the kernels move int4)",
                              True),
}

#: op names the loader accepts (execution_plan.cc getOpType); anything else is an error
OP_NAMES: tuple[str, ...] = (
    "nop", "barrier", "put", "pws", "pwsf", "get", "copy", "signal", "wait", "flush", "re",
    "res", "rre", "rres", "ppkt", "rppkt", "respkt", "cpkt", "upkt", "repkt", "recpkt",
    "recspkt", "glres", "gstore", "gstorepkt", "rlxsignal", "rlxwait", "pipeline",
    "sem_acquire", "sem_release")
