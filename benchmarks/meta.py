"""Where a benchmark ran: the command, the machine, the date and the commit of cclc.

Every benchmark that writes ``--json`` puts :func:`run_meta` under the key ``"meta"``, so a
table generated from it (``benchmarks/report.py``) can say which command, machine and code it
came from.
"""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
import sys
from pathlib import Path

__all__ = ["run_meta"]

ROOT = Path(__file__).resolve().parents[1]


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _commit() -> str | None:
    """The commit checked out, with ``+changes`` where cclc's tracked files differ from it
    (the code that ran is then not that commit's)."""
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", str(ROOT), "diff", "--quiet", "HEAD", "--",
                                "cclc", "backends", "dsl", "benchmarks/*.py"],
                               capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0 or not out.stdout.strip():
        return None
    return out.stdout.strip() + ("+changes" if dirty.returncode == 1 else "")


def run_meta(argv: list[str] | None = None) -> dict:
    """The command line (relative to the repository), machine, UTC date and cclc commit."""
    args = sys.argv[1:] if argv is None else argv
    script = Path(sys.argv[0]).resolve()
    try:
        script_name = str(script.relative_to(ROOT))
    except ValueError:
        script_name = script.name
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return {
        "command": " ".join(["python", script_name, *args]),
        "machine": f"{_cpu_model()}, {os.cpu_count()} cores, load average {load:.1f} at start",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
        "commit": _commit(),
        "python": platform.python_version(),
    }
