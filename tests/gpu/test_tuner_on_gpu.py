"""The tuner plugin loaded into NCCL on a real GPU: NCCL's own log (NCCL_DEBUG_SUBSYS=TUNING)
must show the plugin keeping its rows and NCCL running the algorithm and protocol each row
forces, at a size where NCCL's default differs."""

from __future__ import annotations

import re

import pytest
from test_perf_on_gpu import _hgx, run_perf

from backends import tuner as tuner_backend
from cclc.collective import CollectiveKind

ALGOS = ["Tree", "Ring", "CollNetDirect", "CollNetChain", "NVLS", "NVLSTree", "PAT"]
PROTOS = ["LL", "LL128", "Simple"]
ALLREDUCE = 4   # ncclFunc_t


def _choices(log: str) -> set[tuple[str, str]]:
    """(algorithm, protocol) of every collective NCCL logged, in its three log formats:
    "Best tuning, algorithm, Ring, protocol, LL" and "Bytes -> Algo 1 proto 0" (before 2.28),
    "Bytes -> Algo RING proto SIMPLE" (2.28)."""
    def name(word: str, names: list[str]) -> str:
        if word.isdigit():
            return names[int(word)]
        return next(n for n in names if n.lower() == word.replace("_", "").lower())

    found = {(a, p) for a, p in re.findall(r"Best tuning, algorithm, (\w+), protocol, (\w+)", log)}
    found |= {(name(a, ALGOS), name(p, PROTOS))
              for a, p in re.findall(r"Bytes -> Algo (\w+) proto (\w+)", log)}
    return found


@pytest.mark.parametrize("size, algo, proto", [("4K", 1, 2), ("4M", 1, 0)],
                         ids=["small-forced-simple", "large-forced-ll"])
def test_nccl_runs_what_the_plugin_forces(tmp_path, size, algo, proto):
    rows = [dict(func=ALLREDUCE, n_ranks=8, n_nodes=-1, min_bytes=0, max_bytes=1 << 40,
                 algo=algo, proto=proto, channels=2, chunk=0, measured=1)]
    tuner_backend.emit(rows, tmp_path / "tuner")
    plugin = tmp_path / "tuner" / tuner_backend.LIBRARY
    logs = tmp_path / "logs"
    logs.mkdir()
    run_perf(_hgx(CollectiveKind.ALLREDUCE), tmp_path / "lib", "-b", size, "-e", size, "-n",
             "2", "-w", "1", env={"NCCL_TUNER_PLUGIN": str(plugin), "NCCL_DEBUG": "INFO",
                                  "NCCL_DEBUG_SUBSYS": "TUNING",
                                  "NCCL_DEBUG_FILE": f"{logs}/nccl.%h.%p.log"})
    log = "\n".join(p.read_text(errors="replace") for p in logs.iterdir())
    assert re.search(r"cclc tuner: 1 table rows for this communicator", log), log[-3000:]
    assert _choices(log) == {(ALGOS[algo], PROTOS[proto])}, log[-3000:]
