"""AllGather, ReduceScatter and AllReduce on every example topology: cclc vs NCCL's model.

For each topology defined in ``examples/*.ccl``, each of the three collectives on all live
ranks, and sizes 1 KiB .. 4 GiB in steps of 4x, every applicable algorithm is built for and
simulated under a backend's execution model (:mod:`cclc.execution`: ``--model nccl``, the
generated NCCL library, by default; ``msccl``; or ``ir``, the IR's steps with no software cost)
and the topology's declared routing. Each row prints the time, bus bandwidth
(nccl-tests definition) and % of the lower bound of every candidate (``bounds(coll).best`` of
:mod:`cclc.bounds`, LP included: the bound ``cclc compile``, ``cclc sim`` and ``cclc bounds``
report; the LP does not depend on the size and is solved once per topology and group),
``auto``'s choice (the fastest, the rule of :func:`cclc.plan.plan`),
NCCL's own choice and time from its cost model (:mod:`cclc.nccl_model`) and the speed-up of
``auto`` over it. On a leaf/spine fabric every candidate gets planned spines, is priced under
the fabric's declared routing (ECMP hashing by default), and the row also gives auto's time with
the planned spines (a plan no backend can impose yet, :mod:`cclc.fabric_routing`).

A size the group cannot split evenly is rounded to the nearest size it can (the ``bytes``
column). At the end a Markdown summary table (one line per topology and collective) is
printed, for the README.

    python benchmarks/collectives.py                 # everything (several minutes)
    python benchmarks/collectives.py --quick         # 3 sizes, smaller topologies (~1 min)
    python benchmarks/collectives.py --json out.json
    python benchmarks/collectives.py --size 1073741824   # one size only (e.g. a table column)
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import time

import dsl
from cclc.algorithms import BuildContext, algorithms_for
from cclc.bounds import bounds
from cclc.collective import CollectiveKind, DType, make_collective
from cclc.execution import IR_MODEL, MODELS, ExecutionModel, predict
from cclc.fabric_routing import has_spines, planned_routes
from cclc.nccl_comparison import speedup_text
from cclc.nccl_model import bus_factor, nccl_estimate

KINDS = (CollectiveKind.ALLGATHER, CollectiveKind.REDUCESCATTER, CollectiveKind.ALLREDUCE)
SIZES = [1024 * 4 ** k for k in range(12)]  # 1 KiB .. 4 GiB
QUICK_SIZES = [1024, 1 << 20, 1 << 30]
#: topologies left out of --quick (over 100 ranks)
QUICK_MAX_RANKS = 100
DTYPE = DType.FP32


def _fmt_size(b: int) -> str:
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= div:
            v = b / div
            return f"{v:g} {unit}" if v == int(v) else f"{v:.1f} {unit}"
    return f"{b} B"


def _even(kind: CollectiveKind, n: int, size: int) -> int:
    unit = DTYPE.itemsize * (1 if kind is CollectiveKind.ALLREDUCE else n)
    return max(unit, round(size / unit) * unit)


def _topologies(quick: bool):
    seen = []
    for path in sorted(glob.glob(os.path.join(os.path.dirname(__file__), "..", "examples",
                                              "*.ccl"))):
        program = dsl.load(path)
        for name, topo in program.topologies.items():
            if len(topo.live_ranks()) < 2:
                continue
            if quick and len(topo.live_ranks()) > QUICK_MAX_RANKS:
                continue
            seen.append((f"{os.path.basename(path)}:{name}", topo))
    return seen


def run_row(label: str, topo, kind: CollectiveKind, nominal: int,
            model: ExecutionModel = IR_MODEL) -> dict:
    group = topo.live_ranks()
    size = _even(kind, len(group), nominal)
    coll = make_collective(f"{kind.value}", kind, topo, group, size=size, dtype=DTYPE)
    bound = bounds(coll)
    cands = []
    best = None
    for algo in algorithms_for(coll):
        why = algo.applicable(coll)
        if why is not None:
            continue
        # built for the model it is priced under, as `cclc compile` builds it (a synthesis
        # packs and pipelines for that model's per-step costs)
        s = algo.build(coll, context=BuildContext(model=model))
        if has_spines(topo):
            # every cclc schedule gets planned spines (modules that build with shortest paths
            # would otherwise pile their cross-rail flows onto spine 0)
            s = planned_routes(s)
        pred = predict(s, model)
        busbw = (coll.size / pred.time) * bus_factor(kind, coll.n) if pred.time > 0 else 0.0
        c = {"algorithm": algo.name, "time_s": pred.time, "busbw_GBps": busbw / 1e9,
             "pct_of_bound": 100 * bound.best / pred.time if pred.time > 0 else None,
             "planned_time_s": pred.planned_time}
        cands.append(c)
        if best is None or pred.time < best[0]["time_s"]:
            best = (c, s)
    nccl = nccl_estimate(coll)
    row = {"topology": label, "collective": kind.value, "ranks": coll.n, "nominal": nominal,
           "model": model.name, "routing": topo.routing,
           "bytes": size, "bound_s": bound.best, "bound": bound.name, "candidates": cands,
           "auto": best[0]["algorithm"] if best else None,
           "auto_time_s": best[0]["time_s"] if best else None,
           "auto_pct_of_bound": best[0]["pct_of_bound"] if best else None,
           "nccl": nccl.name if nccl else None,
           "nccl_time_s": nccl.time_us * 1e-6 if nccl else None,
           "speedup_vs_nccl": (nccl.time_us * 1e-6 / best[0]["time_s"]) if nccl and best
           else None}
    if best and best[0]["planned_time_s"] is not None:
        row["auto_planned_time_s"] = best[0]["planned_time_s"]
    return row


def _print_row(row: dict) -> None:
    head = (f"{row['topology']:<34} {row['collective']:<13} {_fmt_size(row['bytes']):>9} "
            f"n={row['ranks']:<4}")
    print(head, flush=True)
    for c in sorted(row["candidates"], key=lambda c: c["time_s"]):
        mark = "*" if c["algorithm"] == row["auto"] else " "
        print(f"    {mark} {c['algorithm']:<20} {c['time_s'] * 1e6:12.2f} us "
              f"{c['busbw_GBps']:9.2f} GB/s  {c['pct_of_bound']:6.1f}% of bound")
    tail = f"      auto {row['auto']}"
    if row["nccl"]:
        tail += (f" | NCCL (predicted) {row['nccl']} {row['nccl_time_s'] * 1e6:.2f} us | "
                 f"cclc {speedup_text(row['nccl_time_s'], row['auto_time_s'])}")
    else:
        tail += " | NCCL model: not covered"
    if "auto_planned_time_s" in row:
        tail += f" | with planned spines (a plan) {row['auto_planned_time_s'] * 1e6:.2f} us"
    print(tail, flush=True)


def _speed_cell(at: dict[int, dict], size: int) -> str:
    """cclc's predicted time against NCCL's predicted time, said as faster or slower."""
    r = at.get(size)
    if r is None or r["nccl_time_s"] is None or r["auto_time_s"] is None:
        return "–"
    return speedup_text(r["nccl_time_s"], r["auto_time_s"])


def _cell(at: dict[int, dict], size: int, key: str, fmt: str) -> str:
    r = at.get(size)
    return fmt.format(r[key]) if r is not None and r[key] is not None else "–"


def summary(rows: list[dict]) -> str:
    """One Markdown line per (topology, collective)."""
    out = [("| topology | collective | ranks | auto's choice by size | % of bound 1 MiB | "
            "% of bound 1 GiB | vs NCCL (predicted) 1 MiB | vs NCCL (predicted) 1 GiB |"),
           "|---|---|---|---|---|---|---|---|"]
    keys = []
    for r in rows:
        k = (r["topology"], r["collective"])
        if k not in keys:
            keys.append(k)
    for k in keys:
        rs = [r for r in rows if (r["topology"], r["collective"]) == k]
        # winners as runs over the sizes: "bruck ≤16 KiB, biring"
        runs: list[tuple[str, int]] = []
        for r in rs:
            if runs and runs[-1][0] == r["auto"]:
                runs[-1] = (r["auto"], r["nominal"])
            else:
                runs.append((r["auto"], r["nominal"]))
        wins = ", ".join(f"{a} ≤{_fmt_size(s)}" if i < len(runs) - 1 else a
                         for i, (a, s) in enumerate(runs))
        at = {r["nominal"]: r for r in rs}
        out.append(f"| {k[0]} | {k[1]} | {rs[0]['ranks']} | {wins} | "
                   f"{_cell(at, 1 << 20, 'auto_pct_of_bound', '{:.0f}%')} | "
                   f"{_cell(at, 1 << 30, 'auto_pct_of_bound', '{:.0f}%')} | "
                   f"{_speed_cell(at, 1 << 20)} | {_speed_cell(at, 1 << 30)} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="3 sizes, topologies up to 100 ranks")
    ap.add_argument("--json", metavar="PATH", help="write every row as JSON")
    ap.add_argument("--model", choices=list(MODELS), default="nccl",
                    help="execution model of cclc's side (default: nccl, the generated library)")
    ap.add_argument("--size", type=int, action="append", metavar="BYTES",
                    help="only this nominal size (repeatable; default: 1 KiB ... 4 GiB)")
    args = ap.parse_args(argv)
    model = MODELS[args.model]
    print(f"cclc's times under the {model.label}; NCCL's from cclc's model of NCCL", flush=True)
    sizes = args.size or (QUICK_SIZES if args.quick else SIZES)
    start = time.perf_counter()
    rows = []
    for label, topo in _topologies(args.quick):
        for kind in KINDS:
            for size in sizes:
                row = run_row(label, topo, kind, size, model)
                _print_row(row)
                rows.append(row)
    print()
    table = summary(rows)
    print(table)
    print(f"\n{len(rows)} rows in {time.perf_counter() - start:.0f} s")
    if args.json:
        from meta import run_meta  # benchmarks/meta.py, beside this script

        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"meta": run_meta(argv), "model": model.label, "rows": rows,
                       "summary_markdown": table}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
