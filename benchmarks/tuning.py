"""Coordinate descent vs exhaustive search on the model profiler (AutoCCL's claim, our model).

For every example topology (``examples/*.ccl`` that describe GPU nodes), every collective
NCCL can tune (the file's own, on their groups) and sizes 64 KiB .. 4 GiB in steps of 16x,
the script runs exhaustive search and coordinate descent (cclc.tuning.search, default options)
on :class:`cclc.tuning.profilers.ModelProfiler` and prints per case:

- the best bus bandwidth each found and CD's fraction of the exhaustive optimum,
- the evaluations each used and CD's share of the exhaustive count,
- NCCL's default choice (its cost-model argmin and size heuristic: cclc.nccl_model, placed in
  the space by cclc.tuning.baseline), its predicted busbw and the predicted gain of the tuned
  configuration over it.

The target (issue 7): CD reaches >= 98% of the exhaustive optimum with <= 10% of its
evaluations. Gains are predictions of the model, not measurements.

    python benchmarks/tuning.py                    # NCCL 2.30 space (chunk tunable)
    python benchmarks/tuning.py --nccl-version 2.28 --json out.json
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import time

import dsl
from cclc.errors import CclError
from cclc.tuning.baseline import nccl_default
from cclc.tuning.profilers import Case, ModelProfiler
from cclc.tuning.search import search
from cclc.tuning.space import ALGO_NAMES, FUNC_NAMES, PROTO_NAMES, NcclVersion, space_for
from cclc.tuning.table import targets_from_collectives

SIZES = [65536 * 16 ** k for k in range(5)]        # 64 KiB .. 4 GiB (nccl-tests size)


def _label(c) -> str:
    return f"{ALGO_NAMES[c.algo]}/{PROTO_NAMES[c.proto]} nc={c.channels}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nccl-version", default="2.30")
    ap.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    args = ap.parse_args(argv)
    version = NcclVersion.parse(args.nccl_version)
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples")
    profiler = ModelProfiler()
    rows = []
    print(f"NCCL {version}, model profiler; sizes {SIZES[0]}..{SIZES[-1]} B x16")
    print(f"{'case':44s} {'bytes':>10s} {'exh GB/s':>9s} {'cd GB/s':>9s} {'frac':>6s} "
          f"{'exh ev':>7s} {'cd ev':>6s} {'ev %':>6s} {'NCCL default':22s} {'gain':>6s}")
    t0 = time.time()
    for path in sorted(glob.glob(os.path.join(root, "*.ccl"))):
        try:
            program = dsl.load(path)
        except CclError as err:
            print(f"# skipped {os.path.basename(path)}: {err.message}", file=sys.stderr)
            continue
        targets, _ = targets_from_collectives(program.collectives, SIZES)
        for target in targets:
            space = space_for(target.func, target.machine, version)
            for nbytes in SIZES:
                case = Case(target.func, nbytes, target.machine)
                ex = search(space, case, profiler, "exhaustive")
                cd = search(space, case, profiler, "cd")
                default = nccl_default(space, nbytes)
                dbw = profiler.measure(case, [default])[0] or float("nan")
                row = {"file": os.path.basename(path), "target": target.name,
                       "collective": FUNC_NAMES[target.func], "nranks": target.machine.n_ranks,
                       "nnodes": target.machine.n_nodes, "bytes": nbytes,
                       "exhaustive_busbw": ex.busbw, "cd_busbw": cd.busbw,
                       "fraction": cd.busbw / ex.busbw, "exhaustive_evaluations": ex.evaluations,
                       "cd_evaluations": cd.evaluations,
                       "evaluation_share": cd.evaluations / ex.evaluations,
                       "nccl_default": _label(default), "nccl_busbw": dbw,
                       "gain": cd.busbw / dbw, "cd_choice": _label(cd.best)}
                rows.append(row)
                name = f"{row['file'][:-4]}:{target.name} {row['collective']} n={row['nranks']}"
                print(f"{name:44s} {nbytes:>10d} {ex.busbw:9.2f} {cd.busbw:9.2f} "
                      f"{row['fraction']:6.3f} {ex.evaluations:7d} {cd.evaluations:6d} "
                      f"{100 * row['evaluation_share']:5.2f}% {row['nccl_default']:22s} "
                      f"{row['gain']:5.2f}x")
    if not rows:
        print("no example topology with GPU nodes found", file=sys.stderr)
        return 1
    worst_frac = min(r["fraction"] for r in rows)
    worst_share = max(r["evaluation_share"] for r in rows)
    met = sum(r["fraction"] >= 0.98 and r["evaluation_share"] <= 0.10 for r in rows)
    gains = sorted(r["gain"] for r in rows)
    geo = 1.0
    for g in gains:
        geo *= g
    geo **= 1 / len(gains)
    print(f"\n{len(rows)} cases in {time.time() - t0:.1f} s: CD reached >= 98% of the "
          f"exhaustive optimum with <= 10% of its evaluations in {met}/{len(rows)}; worst "
          f"fraction {worst_frac:.3f}, largest evaluation share {100 * worst_share:.2f}%")
    print(f"predicted gain over NCCL's default: geometric mean {geo:.2f}x, median "
          f"{gains[len(gains) // 2]:.2f}x, range {gains[0]:.2f}x .. {gains[-1]:.2f}x")
    if args.json:
        from meta import run_meta  # benchmarks/meta.py, beside this script

        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"meta": run_meta(argv), "nccl_version": str(version),
                       "rows": rows}, f, indent=1)
    return 0 if met == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
