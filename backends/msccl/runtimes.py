"""The three MSCCL runtimes: their XML spellings, required attributes, limits and loading.

Every number a runtime enforces is a :class:`Limit` in :data:`LIMITS`, with the repository,
commit, file and symbol it was read from, so a reader can check it and a newer runtime can be
re-read. The loaders were read at:

* microsoft/msccl (NCCL 2.12 fork) at b23e9cd5dd63f82ee1c5aae7e0a2042079be903a;
* Azure/msccl-executor-nccl at c6f6b36d1a4c7ae44916fcc5c8e32c95cce2ae54;
* ROCm/rccl at 0cbce2a7571c907554199fad7e905f16ec0a565c.

All three parse the file with a small fixed-size XML reader that keeps only the calling rank's
``<gpu>`` subtree (plus one node per ``<gpu>``), so the node limit is per rank.
"""

from __future__ import annotations

from dataclasses import dataclass

from cclc.collective import CollectiveKind
from cclc.errors import ScheduleError

__all__ = ["LIMITS", "RUNTIMES", "Limit", "Runtime", "runtime_named"]

_MS = ("microsoft/msccl", "b23e9cd5dd63f82ee1c5aae7e0a2042079be903a")
_EX = ("Azure/msccl-executor-nccl", "c6f6b36d1a4c7ae44916fcc5c8e32c95cce2ae54")
_RC = ("ROCm/rccl", "0cbce2a7571c907554199fad7e905f16ec0a565c")


@dataclass(frozen=True, slots=True)
class Limit:
    """One number a runtime's loader enforces, and where it was read."""

    value: int
    repo: str
    commit: str
    file: str
    symbol: str

    def cite(self) -> str:
        return f"{self.symbol} in {self.repo} {self.file} @ {self.commit[:7]}"


def _lim(src: tuple[str, str], value: int, file: str, symbol: str) -> Limit:
    return Limit(value, src[0], src[1], file, symbol)


#: runtime key -> limit name -> the limit. Names: ``steps_per_tb`` (steps of one threadblock),
#: ``tbs`` (threadblocks of one GPU), ``tbs_per_channel`` (distinct send peers, and distinct
#: receive peers, of one GPU on one channel), ``channels``, ``count`` (a step's ``cnt`` must be
#: below it), ``offset`` (largest chunk offset, int16), ``xml_nodes`` (parsed nodes per rank),
#: ``depid`` (largest threadblock id a dependency can name, int8), ``name`` (algorithm name).
LIMITS: dict[str, dict[str, Limit]] = {
    "msccl": {
        "steps_per_tb": _lim(_MS, 256, "src/include/msccl.h", "MSCCL_MAX_NUM_STEPS"),
        "tbs": _lim(_MS, 216, "src/include/msccl.h", "MSCCL_MAX_NUM_THREAD_BLOCKS"),
        "tbs_per_channel": _lim(_MS, 32, "src/include/msccl.h",
                                "MSCCL_MAX_NUM_THREAD_BLOCKS_PER_CHANNEL (checked in "
                                "src/graph/topo.cc)"),
        "channels": _lim(_MS, 32, "src/include/devcomm.h", "MAXCHANNELS"),
        "count": _lim(_MS, 72, "src/include/msccl.h", "MSCCL_MAX_COUNT"),
        "offset": _lim(_MS, 32767, "src/include/msccl.h", "mscclTransfer.srcoffset (int16_t)"),
        "xml_nodes": _lim(_MS, 4096, "src/graph/xml.h", "MAX_NODES (xmlLoadSub in "
                          "src/graph/xml.cc)"),
        "depid": _lim(_MS, 127, "src/include/msccl.h", "mscclThreadBlock.dependentBid (int8_t)"),
        "name": _lim(_MS, 63, "src/include/msccl.h", "MSCCL_MAX_ALGO_NAME"),
    },
    "msccl-executor": {
        "steps_per_tb": _lim(_EX, 64, "makefiles/common.mk", "MSCCL_MAX_NUM_STEPS (build "
                             "variable, default)"),
        "tbs": _lim(_EX, 1024, "src/include/msccl/msccl_struct.h",
                    "MSCCL_MAX_NUM_THREAD_BLOCKS (32 x MAXCHANNELS)"),
        "tbs_per_channel": _lim(_EX, 32, "src/include/msccl/msccl_struct.h",
                                "MSCCL_MAX_NUM_THREAD_BLOCKS_PER_CHANNEL (checked in "
                                "src/misc/msccl/msccl_parser.cc)"),
        "channels": _lim(_EX, 32, "src/include/device.h", "MAXCHANNELS"),
        "count": _lim(_EX, 72, "src/include/msccl/msccl_struct.h", "MSCCL_MAX_COUNT"),
        "offset": _lim(_EX, 32767, "src/include/msccl/msccl_struct.h",
                       "mscclTransmission.srcOffset (int16_t)"),
        "xml_nodes": _lim(_EX, 4096, "src/include/msccl/msccl_parser.h", "MAX_NODES"),
        "depid": _lim(_EX, 127, "src/include/msccl/msccl_struct.h",
                      "mscclThreadBlock.dependentBid (int8_t)"),
        "name": _lim(_EX, 255, "src/include/msccl/msccl_parser.h", "MAX_STR_LEN"),
    },
    "rccl": {
        "steps_per_tb": _lim(_RC, 64, "src/include/msccl/msccl_struct.h",
                             "MSCCL_MAX_NUM_STEPS"),
        "tbs": _lim(_RC, 64, "src/include/msccl/msccl_struct.h", "MSCCL_MAX_NUM_THREAD_BLOCKS"),
        "tbs_per_channel": _lim(_RC, 32, "src/include/msccl/msccl_struct.h",
                                "MSCCL_MAX_NUM_THREAD_BLOCKS_PER_CHANNEL (checked in "
                                "src/misc/msccl/msccl_parser.cc)"),
        # RCCL's MAXCHANNELS (src/include/device.h) is 128; cclc stays at 32 like the others
        "channels": _lim(_RC, 32, "src/include/device.h", "MAXCHANNELS (128; cclc uses 32)"),
        "count": _lim(_RC, 72, "src/include/msccl/msccl_struct.h", "MSCCL_MAX_COUNT"),
        "offset": _lim(_RC, 32767, "src/include/msccl/msccl_struct.h",
                       "mscclTransmission.srcOffset (int16_t)"),
        "xml_nodes": _lim(_RC, 4096, "src/include/msccl/msccl_parser.h", "MAX_NODES"),
        "depid": _lim(_RC, 127, "src/include/msccl/msccl_struct.h",
                      "mscclThreadBlock.dependentBid (int8_t)"),
        "name": _lim(_RC, 255, "src/include/msccl/msccl_parser.h", "MAX_STR_LEN"),
    },
}


@dataclass(frozen=True, slots=True)
class Runtime:
    """Spellings and limits of one MSCCL runtime (the limits come from :data:`LIMITS`)."""

    key: str
    title: str
    coll_names: dict[CollectiveKind, str]
    needs_outofplace: bool       # writes the outofplace attribute (and both byte bounds)
    max_bytes_exclusive: bool    # the size window is minBytes <= nBytes < maxBytes
    unbounded_max_bytes: int | None   # the maxBytes that means "no upper bound" (None: none)
    scratch_at_init: bool        # scratch = maxBytes x s_chunks / nchunksperloop at init
    load_env: tuple[str, ...]    # how a user loads the file, one line each

    def limit(self, name: str) -> Limit:
        return LIMITS[self.key][name]

    @property
    def max_steps_per_tb(self) -> int:
        return self.limit("steps_per_tb").value

    @property
    def max_tbs(self) -> int:
        return self.limit("tbs").value

    @property
    def max_tbs_per_channel(self) -> int:
        return self.limit("tbs_per_channel").value

    @property
    def max_channels(self) -> int:
        return self.limit("channels").value

    @property
    def max_cnt(self) -> int:
        """Largest ``cnt`` of a step (the loaders require cnt < MSCCL_MAX_COUNT)."""
        return self.limit("count").value - 1

    @property
    def max_chunks(self) -> int:
        return self.limit("offset").value

    @property
    def max_xml_nodes(self) -> int:
        return self.limit("xml_nodes").value

    @property
    def max_depid(self) -> int:
        return self.limit("depid").value

    @property
    def max_name(self) -> int:
        return self.limit("name").value


_COLL = {CollectiveKind.ALLTOALL: "alltoall", CollectiveKind.ALLGATHER: "allgather",
         CollectiveKind.ALLREDUCE: "allreduce", CollectiveKind.BROADCAST: "broadcast",
         CollectiveKind.REDUCE: "reduce"}

RUNTIMES: dict[str, Runtime] = {
    "msccl": Runtime(
        key="msccl", title="microsoft/msccl (NCCL 2.12 fork with NCCL_ALGO_MSCCL)",
        coll_names={**_COLL, CollectiveKind.REDUCESCATTER: "reduce_scatter"},
        needs_outofplace=False, max_bytes_exclusive=True, unbounded_max_bytes=None,
        scratch_at_init=True,
        load_env=("export MSCCL_XML_FILES=/path/{xml}   # colon-separated, at most 4 files",
                  "export NCCL_ALGO=MSCCL,RING,TREE       # MSCCL must be allowed by NCCL_ALGO",
                  ("# or MSCCL_CONFIG=cfg.xml with <msccl_algos><load path=... minbytes=... "
                   "maxbytes=... proto=.../></msccl_algos>"),
                  "# success is logged at NCCL_DEBUG=INFO as 'Connected N MSCCL algorithms'")),
    "msccl-executor": Runtime(
        key="msccl-executor", title="Azure/msccl-executor-nccl",
        coll_names={**_COLL, CollectiveKind.REDUCESCATTER: "reducescatter"},
        needs_outofplace=True, max_bytes_exclusive=False, unbounded_max_bytes=0,
        scratch_at_init=False,
        load_env=("mkdir -p algos && cp {xml} algos/",
                  "export MSCCL_ALGO_DIR=$PWD/algos     # every file in it is loaded at init",
                  "export MSCCL_ENABLE=1                 # the default",
                  ("# one GPU per process only (\"MSCCL doesn't support multiple GPUs in one "
                   "process\")"),
                  "# MSCCL_MAX_NUM_STEPS is a build variable of the executor (default 64)")),
    "rccl": Runtime(
        key="rccl", title="ROCm RCCL built-in MSCCL",
        coll_names={**_COLL, CollectiveKind.REDUCESCATTER: "reducescatter"},
        needs_outofplace=True, max_bytes_exclusive=False, unbounded_max_bytes=0,
        scratch_at_init=False,
        load_env=("mkdir -p algos && cp {xml} algos/",
                  "export MSCCL_ALGO_DIR=$PWD/algos",
                  "export RCCL_MSCCL_ENABLE=1            # the default",
                  "export RCCL_MSCCL_FORCE_ENABLE=1      # needed on platforms other than MI300X",
                  "# maxBytes=0 in the file means no upper bound")),
}


def runtime_named(key: str) -> Runtime:
    """The runtime ``key`` names (``EmitOptions.msccl_runtime``); :class:`ScheduleError`
    naming the known ones otherwise."""
    runtime = RUNTIMES.get(key)
    if runtime is None:
        raise ScheduleError(f"unknown MSCCL runtime '{key}': choose one of "
                            + ", ".join(RUNTIMES))
    return runtime
