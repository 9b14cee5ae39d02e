"""Build time of the torus AllToAll entries at scale: this tree and a baseline, side by side.

For every entry that serves a torus with one failed link (``mate``, ``matee``,
``foldedring+{pipeline,dimrotation}``, ``line+{pipeline,dimrotation}``) on 5x5x5 and 8x8x8
tori (the link (0,0,0)->(1,0,0) failed in both directions, 64 B per block), builds the
schedule with this tree's builder and with the builder of a baseline git revision (default:
the last single-module builder, before the torus AllToAll became a package), alternating the
two in fresh processes, and prints the best wall and CPU seconds of ``--repeat`` runs, the
process's peak memory, the ratio and whether both built the same schedule (a digest of every
ops column, the routes and the chunk layouts).

Only the builder is timed (``build_torus_alltoall``): not the relay pass, verification or
simulation. The machine is named in the output; ratios measured side by side are what to
compare across machines.

    python benchmarks/torus_build_scale.py                       # both tori, 3 runs each
    python benchmarks/torus_build_scale.py --dims 5x5x5 --repeat 5
    python benchmarks/torus_build_scale.py --baseline HEAD~3 --json out.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import resource
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: the last commit with the single-module builder (cclc/algorithms/torus_multidim.py)
BASELINE = "2fcf978"
ENTRIES = ("mate", "matee", "foldedring+pipeline", "foldedring+dimrotation", "line+pipeline",
           "line+dimrotation")
DIMS = ("5x5x5", "8x8x8")
BLOCK = 64


def _worker(dims_text: str, entry: str) -> dict:
    """Build one schedule in this process (whichever ``cclc`` is on the path) and measure it."""
    import numpy as np

    from cclc.collective import CollectiveKind, make_collective
    from cclc.topology import torus, with_faults
    try:
        from cclc.algorithms.torus_alltoall import build_torus_alltoall
    except ModuleNotFoundError:         # the baseline's single module
        from cclc.algorithms.torus_multidim import build_torus_alltoall  # type: ignore

    dims = tuple(int(x) for x in dims_text.split("x"))
    t = torus("t", dims, bandwidth=32e9, latency=100e-9)
    u, v = t.rank_at((0,) * len(dims)), t.rank_at((1,) + (0,) * (len(dims) - 1))
    t = with_faults(t, links=[(u, v), (v, u)])
    c = make_collective("a2a", CollectiveKind.ALLTOALL, t, t.live_ranks(),
                        size=t.n_ranks * t.n_ranks * BLOCK)
    algorithm, schedule = entry.split("+") if "+" in entry else ("halfring", entry)
    wall, cpu = time.perf_counter(), time.process_time()
    s = build_torus_alltoall(c, algorithm, schedule)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    digest = hashlib.sha256()
    for col in s.ops.columns().values():
        digest.update(np.ascontiguousarray(col).tobytes())
    for arr in (s.routes.offsets, s.routes.links, *s.layouts):
        digest.update(np.ascontiguousarray(arr).tobytes())
    digest.update(repr(s.params).encode())
    return {"wall": wall, "cpu": cpu, "ops": len(s.ops), "digest": digest.hexdigest()[:16],
            "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def _baseline_tree(rev: str, into: str) -> str:
    """The baseline's packages, unpacked from git into ``into``."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "cclc", "dsl", "backends"],
                             check=True, capture_output=True).stdout
    path = Path(into) / "tree"
    path.mkdir()
    with tempfile.TemporaryFile() as f:
        f.write(archive)
        f.seek(0)
        with tarfile.open(fileobj=f) as tar:
            tar.extractall(path, filter="data")
    return str(path)


def _run(tree: str, dims: str, entry: str) -> dict:
    env = {**os.environ, "PYTHONPATH": tree}
    out = subprocess.run([sys.executable, __file__, "--worker", dims, entry], env=env,
                         check=True, capture_output=True, text=True, cwd=tree).stdout
    return json.loads(out.strip().splitlines()[-1])


def _best(runs: list[dict]) -> dict:
    return {"wall": min(r["wall"] for r in runs), "cpu": min(r["cpu"] for r in runs),
            "maxrss_mb": max(r["maxrss_mb"] for r in runs), "ops": runs[0]["ops"],
            "digests": sorted({r["digest"] for r in runs})}


def _ratio(before: float, now: float) -> str:
    if now <= before:
        return f"{before / now:.2f}x faster"
    return f"{now / before:.2f}x slower"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", default=BASELINE, help="git revision to compare with")
    ap.add_argument("--dims", nargs="+", default=list(DIMS))
    ap.add_argument("--entries", nargs="+", default=list(ENTRIES))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(_worker(*args.worker)))
        return
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}; baseline {args.baseline}; best of "
          f"{args.repeat} runs, alternating", flush=True)
    print("| torus | entry | ops | baseline s (cpu) | now s (cpu) | wall | cpu | peak MB "
          "baseline / now | same schedule |")
    print("|---|---|---|---|---|---|---|---|---|")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        old_tree = _baseline_tree(args.baseline, tmp)
        for dims in args.dims:
            for entry in args.entries:
                old, new = [], []
                for _ in range(args.repeat):
                    old.append(_run(old_tree, dims, entry))
                    new.append(_run(str(ROOT), dims, entry))
                b, a = _best(old), _best(new)
                same = b["digests"] == a["digests"] and len(a["digests"]) == 1
                rows.append({"dims": dims, "entry": entry, "baseline": b, "now": a,
                             "same_schedule": same})
                print(f"| {dims} | {entry} | {a['ops']} | {b['wall']:.2f} ({b['cpu']:.2f}) | "
                      f"{a['wall']:.2f} ({a['cpu']:.2f}) | {_ratio(b['wall'], a['wall'])} | "
                      f"{_ratio(b['cpu'], a['cpu'])} | "
                      f"{b['maxrss_mb']:.0f} / {a['maxrss_mb']:.0f} | "
                      f"{'yes' if same else 'NO'} |", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    if not all(r["same_schedule"] for r in rows):
        sys.exit("the builders disagree on a schedule")


if __name__ == "__main__":
    main()
