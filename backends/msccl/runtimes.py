"""The three MSCCL runtimes: their XML spellings, required attributes, limits and loading.

Facts from the runtimes' sources (microsoft/msccl ``src/include/msccl.h`` and ``topo.cc``;
Azure/msccl-executor-nccl ``msccl_struct.h``, ``msccl_parser.cc``, ``makefiles/common.mk``;
ROCm/rccl ``src/misc/msccl``). Where a source gives no number for RCCL, the executor's
(stricter) value is used, since RCCL's MSCCL is derived from it.
"""

from __future__ import annotations

from dataclasses import dataclass

from cclc.collective import CollectiveKind

__all__ = ["RUNTIMES", "Runtime"]


@dataclass(frozen=True, slots=True)
class Runtime:
    """Spellings and limits of one MSCCL runtime."""

    key: str
    title: str
    coll_names: dict[CollectiveKind, str]
    max_steps_per_tb: int
    max_tbs: int
    max_channels: int
    max_cnt: int                 # cnt must be < MSCCL_MAX_COUNT (72)
    max_chunks: int              # offsets are stored as int16
    max_name: int
    needs_outofplace: bool       # writes the outofplace attribute (and both byte bounds)
    unlimited_max_bytes: int     # what maxBytes to write when the user sets no upper bound
    load_env: tuple[str, ...]    # how a user loads the file, one line each


_COLL = {CollectiveKind.ALLTOALL: "alltoall", CollectiveKind.ALLGATHER: "allgather",
         CollectiveKind.ALLREDUCE: "allreduce", CollectiveKind.BROADCAST: "broadcast",
         CollectiveKind.REDUCE: "reduce"}

RUNTIMES: dict[str, Runtime] = {
    "msccl": Runtime(
        key="msccl", title="microsoft/msccl (NCCL 2.12 fork with NCCL_ALGO_MSCCL)",
        coll_names={**_COLL, CollectiveKind.REDUCESCATTER: "reduce_scatter"},
        max_steps_per_tb=256, max_tbs=216, max_channels=32, max_cnt=71, max_chunks=32767,
        max_name=63, needs_outofplace=False, unlimited_max_bytes=1 << 40,
        load_env=("export MSCCL_XML_FILES=/path/{xml}   # colon-separated, at most 4 files",
                  "export NCCL_ALGO=MSCCL,RING,TREE       # MSCCL must be allowed by NCCL_ALGO",
                  ("# or MSCCL_CONFIG=cfg.xml with <msccl_algos><load path=... minbytes=... "
                   "maxbytes=... proto=.../></msccl_algos>"),
                  "# success is logged at NCCL_DEBUG=INFO as 'Connected N MSCCL algorithms'")),
    "msccl-executor": Runtime(
        key="msccl-executor", title="Azure/msccl-executor-nccl",
        coll_names={**_COLL, CollectiveKind.REDUCESCATTER: "reducescatter"},
        max_steps_per_tb=64, max_tbs=32 * 32, max_channels=32, max_cnt=71, max_chunks=32767,
        max_name=63, needs_outofplace=True, unlimited_max_bytes=1 << 40,
        load_env=("mkdir -p algos && cp {xml} algos/",
                  "export MSCCL_ALGO_DIR=$PWD/algos     # every file in it is loaded at init",
                  "export MSCCL_ENABLE=1                 # the default",
                  ("# one GPU per process only (\"MSCCL doesn't support multiple GPUs in one "
                   "process\")"),
                  "# MSCCL_MAX_NUM_STEPS is a build variable of the executor (default 64)")),
    "rccl": Runtime(
        key="rccl", title="ROCm RCCL built-in MSCCL",
        coll_names={**_COLL, CollectiveKind.REDUCESCATTER: "reducescatter"},
        max_steps_per_tb=64, max_tbs=32 * 32, max_channels=32, max_cnt=71, max_chunks=32767,
        max_name=63, needs_outofplace=True, unlimited_max_bytes=0,
        load_env=("mkdir -p algos && cp {xml} algos/",
                  "export MSCCL_ALGO_DIR=$PWD/algos",
                  "export RCCL_MSCCL_ENABLE=1            # the default",
                  "export RCCL_MSCCL_FORCE_ENABLE=1      # needed on platforms other than MI300X",
                  "# maxBytes=0 in the file means no upper bound")),
}
