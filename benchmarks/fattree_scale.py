"""How cclc compiles on a 4,096-GPU three-tier fabric (issue 32, item 3).

``benchmarks/machines/pods512_fattree.ccl``: 512 HGX servers in 8 pods, 2:1 at the core. For
each of its AllGather, ReduceScatter and AllReduce of 1 GiB (target: at most 60 s each), one
``cclc compile --only NAME --emit json`` per row in a child process, under ``auto`` and with
``--algorithm rail_halving``; each row records the exit status, wall and CPU time (user +
system, what the run costs whatever else the machine runs), peak resident memory, and from
the report the chosen schedule, its time, % of the bound and the NCCL comparison line, or the
refusal (the size check's estimate) when the compile is refused. The AllToAll of 1 GiB
(``tokens``: 16.7M pairs, each on its own route) is measured under ``auto`` and with
``--algorithm direct`` (rail_halving serves no alltoall).

``--fault`` adds a fault statement to the fabric (``nic node(0).nic(0)``: a GPU without its
NIC, served through the other NICs of its server) and measures the same rows on it.
``--machine`` measures another fabric file's collectives the same way (``--mode synth`` too:
the 128-GPU example with a failed NIC, where synth packs the machine with the NIC working
and relays that GPU's ops).

    python benchmarks/fattree_scale.py                      # every row (many minutes)
    python benchmarks/fattree_scale.py --only params        # one collective
    python benchmarks/fattree_scale.py --json benchmarks/results/fattree_scale.json
    python benchmarks/fattree_scale.py --fault "nic node(0).nic(0)" --only grads \
        --only params --only shards --json benchmarks/results/fattree_nic.json
    python benchmarks/fattree_scale.py --machine examples/hgx16_leafspine.ccl \
        --fault "nic node(0).nic(0)" --only grads --only shards --mode auto \
        --mode rail_halving --mode synth --json benchmarks/results/nic_fabric.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MACHINE = ROOT / "benchmarks" / "machines" / "pods512_fattree.ccl"
COLLECTIVES = ("params", "shards", "grads", "tokens")
MODES = ("auto", "rail_halving", "direct", "synth")
#: the modes of a collective, where not the first two of MODES
MODES_OF = {"tokens": ("auto", "direct")}
TARGET_SECONDS = 60.0

#: "grads: rail_halving 12.3 ms, 54.7% of bound, 139264 ops in 32 steps (...)"
_CHOSEN = re.compile(r"^(?P<name>\w+): (?P<algo>[\w+]+) (?P<time>[\d.]+ \w?s), "
                     r"(?P<pct>[\d.]+)% of bound(?: \([^)]*\))?, (?P<ops>[\d,]+) ops")


def _shown(path: Path) -> str:
    """``path`` relative to the repository where it is inside it (so records and messages name
    no local path), else as given."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def _machine(machine: Path, fault: str | None, folder: Path) -> str:
    """The machine file to compile: the shipped one relative to the repository (run from
    there, so messages name no local path), or a copy in ``folder`` with ``fault`` added to
    its fabric."""
    if fault is None:
        return _shown(machine)
    text = machine.read_text()
    head = re.search(r"^topology \w+ = fabric\(\w+\) \{\n", text, re.MULTILINE)
    if head is None:
        raise SystemExit(f"{machine.name} has no 'topology NAME = fabric(...) {{' line to add "
                         "the fault to")
    copy = folder / machine.name
    copy.write_text(text[:head.end()] + f"    fault {fault}\n" + text[head.end():])
    return str(copy)


def _run(name: str, mode: str, timeout: float, fault: str | None = None,
         machine: Path = MACHINE) -> dict:
    """One compile in a child process, measured."""
    cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_before = cpu.ru_utime + cpu.ru_stime
    row: dict = {"collective": name, "mode": mode}
    with tempfile.TemporaryDirectory() as tmp:
        file = _machine(machine, fault, Path(tmp))
        args = [sys.executable, "-m", "cclc.cli", "compile", file, "--only", name,
                "--emit", "json"]
        if mode != "auto":
            args += ["--algorithm", mode]
        # GNU time reports this child's own peak (ru_maxrss of children is the largest so far)
        peak_file = Path(tmp) / "peak"
        args = ["/usr/bin/time", "-o", str(peak_file), "-f", "%M"] + args
        start = time.perf_counter()
        try:
            out = subprocess.run(args + ["-o", str(Path(tmp) / "out")], cwd=ROOT,
                                 capture_output=True, text=True, timeout=timeout,
                                 env=dict(os.environ, PYTHONPATH=str(ROOT)))
        except subprocess.TimeoutExpired:
            row.update(status=None, seconds=timeout, error=f"over {timeout:.0f} s")
            return row
        row["seconds"] = round(time.perf_counter() - start, 1)
        peak = peak_file.read_text().split() if peak_file.exists() else []
        row["peak_bytes"] = int(peak[-1]) * 1024 if peak and peak[-1].isdigit() else None
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    row["cpu_seconds"] = round(usage.ru_utime + usage.ru_stime - cpu_before, 1)
    row["status"] = out.returncode
    for line in out.stdout.splitlines() + out.stderr.splitlines():
        if line.startswith("Command exited with non-zero status"):
            continue
        m = _CHOSEN.match(line.strip())
        if m:
            row.update(algorithm=m["algo"], time=m["time"], pct_of_bound=float(m["pct"]),
                       ops=int(m["ops"].replace(",", "")))
        if line.strip().startswith("NCCL today"):
            row["nccl"] = line.strip()
    if out.returncode != 0:
        lines = [x for x in out.stderr.strip().splitlines()
                 if not x.startswith("Command exited with non-zero status")]
        # the message, not the caret line under the source it points at
        errors = [x for x in lines if "error:" in x]
        row["error"] = (errors or lines or ["failed"])[-1].replace(tmp + "/", "")
    row["within_target"] = out.returncode == 0 and row["seconds"] <= TARGET_SECONDS
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--machine", type=Path, default=MACHINE,
                    help="the fabric file (default: benchmarks/machines/pods512_fattree.ccl)")
    ap.add_argument("--only", action="append", metavar="NAME",
                    help=f"these collectives (default: {', '.join(COLLECTIVES)} of the default "
                         "machine, every one of another)")
    ap.add_argument("--mode", choices=MODES, action="append", help="these modes")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per row")
    ap.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    ap.add_argument("--fault", metavar="STATEMENT",
                    help="a fault added to the fabric, as after 'fault' in the language "
                         "(e.g. \"nic node(0).nic(0)\")")
    args = ap.parse_args(argv)
    machine = (args.machine if args.machine.is_absolute() else Path.cwd() / args.machine)
    machine = machine.resolve()
    names = re.findall(r"^collective (\w+) =", machine.read_text(), re.MULTILINE)
    unknown = sorted(set(args.only or ()) - set(names))
    if unknown:
        ap.error(f"{machine.name} has no collective {', '.join(unknown)} (it has "
                 f"{', '.join(names)})")
    default = COLLECTIVES if machine == MACHINE else tuple(names)
    from meta import run_meta  # benchmarks/meta.py, beside this script

    results: dict = {"meta": run_meta(argv), "file": _shown(machine),
                     "target_seconds": TARGET_SECONDS, "rows": []}
    if args.fault:
        results["fault"] = args.fault
    rows = []
    if args.json and Path(args.json).exists():
        # rows of other collectives and modes measured before are kept
        rows = json.loads(Path(args.json).read_text())["rows"]
    for name in args.only or default:
        for mode in args.mode or MODES_OF.get(name, MODES[:2]):
            row = _run(name, mode, args.timeout, args.fault, machine)
            rows = [r for r in rows if (r["collective"], r["mode"]) != (name, mode)] + [row]
            print(json.dumps(row), flush=True)
            if args.json:
                results["rows"] = rows
                Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
