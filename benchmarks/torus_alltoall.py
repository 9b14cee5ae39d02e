"""The torus AllToAll paper's synthetic study, re-run on cclc's schedules and simulator.

Tori 5x5, 5x5x5, 5x5x5x5 with 32 GB/s per link direction and 100 ns per hop; sizes 8 KiB ..
2 GiB per rank in steps of 4x; one failed link (both directions) in dimension 0 for the
fault-tolerant series; Pipeline with K=6 chunks. The eight series:

    Ring_Pipeline, Ring_DimRotation, HalfRing_Pipeline, HalfRing_DimRotation   (healthy torus)
    FoldedRing_Pipeline, FoldedRing_DimRotation, MATE, MATEe                   (one failed link)

For every size: the simulated time of each series and its speed-up over Ring_Pipeline on the
healthy torus. Speed-ups are averaged over sizes, then over tori (as the artifact's
``Synthetic_Speedup.py`` does) and printed beside the paper's averages. Also: % of the lower
bound at 128 MiB (the LP max-concurrent-flow bound where the torus is small enough, else the
best closed-form bound), and the same series on TPUv4-like 4x4x4 and 8x4x4 tori at 56 GB/s.

Times come from the lockstep simulation (:mod:`cclc.sim`: steps separated by barriers, a step
as long as its busiest link), the IR's own model; ``--routing`` chooses the tori's declared
routing (default ``source``: cut-through along any path a schedule names, the paper's model;
``none``: a GPU torus, every multi-hop move relayed by GPUs, :mod:`cclc.relay`). Each row also
carries the time under the ``nccl-lockstep`` model (``time_nccl``: lockstep plus 8.4 us per step,
the NCCL library as it ran before it became dataflow; the dataflow library's ``nccl`` model
lowers every schedule into lanes, too slow for every size here: benchmarks/dataflow_nccl.py
compares it with event mode for MATE and MATEe)
and, where event mode runs, under MSCCL's (``time_msccl``: dataflow plus its overheads); see
:mod:`cclc.execution`. MATE/MATEe are also simulated in event mode (``*_event``
columns), where an op starts as soon as its data and links are ready; that is the model the
paper's analytical backend uses for overlapping lanes of different lengths (see
docs/torus-alltoall.md). Sizes are rounded down to a multiple of the number of ranks (uint8
elements), so every rank sends the same number of bytes to every other.

    python benchmarks/torus_alltoall.py                   # everything (tens of minutes)
    python benchmarks/torus_alltoall.py --quick           # 5x5 and 5x5x5 only (~1 min)
    python benchmarks/torus_alltoall.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace

import numpy as np

from cclc.algorithms.torus_alltoall import build_for_sizes
from cclc.bounds import bounds
from cclc.collective import CollectiveKind, DType, make_collective
from cclc.execution import LOCKSTEP_NCCL_MODEL, MSCCL_MODEL, predict
from cclc.relay import lower_relays
from cclc.sim import simulate
from cclc.topology import torus, with_faults

SIZES = [8 * 1024 * 4 ** k for k in range(10)]          # 8 KiB .. 2 GiB
BOUND_SIZE = 128 * 2**20

#: series -> (algorithm, schedule, faulty torus?)
SERIES = {
    "Ring_Pipeline": ("ring", "pipeline", False),
    "Ring_DimRotation": ("ring", "dimrotation", False),
    "HalfRing_Pipeline": ("halfring", "pipeline", False),
    "HalfRing_DimRotation": ("halfring", "dimrotation", False),
    "FoldedRing_Pipeline": ("foldedring", "pipeline", True),
    "FoldedRing_DimRotation": ("foldedring", "dimrotation", True),
    "MATE": ("halfring", "mate", True),
    "MATEe": ("halfring", "matee", True),
}
#: the artifact's rho (odd/even formulas swapped in MATE's accelerating divisor), measured beside
#: the derived one: series -> (schedule, rho)
RHO_SERIES = {"MATE_rho_artifact": ("mate", "artifact"),
              "MATEe_rho_artifact": ("matee", "artifact")}
#: the paper's averages (reference section 4; FoldedRing_DimRotation is not reported)
PAPER = {"HalfRing_Pipeline": 1.56, "Ring_DimRotation": 1.45, "HalfRing_DimRotation": 2.28,
         "FoldedRing_Pipeline": 0.55, "MATE": 1.36, "MATEe": 1.37}
#: event-mode simulation of MATE/MATEe is skipped above this many ops (it grows faster than the
#: op count); --quick uses the smaller limit
EVENT_MAX_OPS = 1_000_000
QUICK_EVENT_MAX_OPS = 300_000


def _topologies(dims, bandwidth, routing="source"):
    healthy = torus("x".join(map(str, dims)), dims, bandwidth=bandwidth, latency=100e-9,
                    routing=routing)
    a = healthy.rank_at((0,) * len(dims))
    b = healthy.rank_at((1,) + (0,) * (len(dims) - 1))
    return healthy, with_faults(healthy, links=[(a, b), (b, a)])


def _collective(topo, size):
    n = topo.n_ranks
    return make_collective("a2a", CollectiveKind.ALLTOALL, topo, tuple(range(n)),
                           size=max(n, size // n * n), dtype=DType.UINT8)


def _bound(coll, use_lp: bool) -> tuple[float, str]:
    """The strongest lower bound: the LP where the torus is small enough, and the closed forms
    (hop-bytes, injection, cuts, latency) always."""
    b = bounds(coll, lp=use_lp)
    return b.best, b.name


def run_torus(dims, bandwidth, sizes, series, log, lp_max=150, event_max_ops=EVENT_MAX_OPS,
              routing="source"):
    """Rows (one per size and series) for one torus."""
    healthy, faulty = _topologies(dims, bandwidth, routing)
    rows = []
    for name in series:
        if name in RHO_SERIES:
            sch, rho = RHO_SERIES[name]
            alg, is_faulty, params = "halfring", True, {"rho": rho}
        else:
            alg, sch, is_faulty = SERIES[name]
            params = {"chunks": 6} if sch == "pipeline" else {}
        topo = faulty if is_faulty else healthy
        t0 = time.time()
        colls = [_collective(topo, s) for s in sizes]
        scheds = build_for_sizes(colls[0], [c.size for c in colls], alg, sch, **params)
        # the moves the declared routing cannot carry become relays (as every compile does)
        scheds = [lower_relays(x) for x in scheds]
        built = time.time() - t0
        n_ops = len(scheds[0].ops)
        # the bandwidth-only time (every latency 0) is linear in the bytes: simulate it once
        big = scheds[-1]
        flat = replace(big.collective.topology,
                       link_latency=np.zeros_like(big.collective.topology.link_latency))
        t_bw = simulate(big.replace(collective=replace(big.collective, topology=flat))).time
        for size, s in zip(sizes, scheds, strict=True):
            r = simulate(s)
            row = {"torus": topo.name, "series": name, "size": size, "bytes": s.collective.size,
                   "time": r.time, "ops": n_ops, "steps": s.n_steps, "routing": routing,
                   "time_bandwidth": t_bw * s.collective.size / big.collective.size,
                   "time_nccl": predict(s, LOCKSTEP_NCCL_MODEL).time}
            if "MATE" in name and n_ops <= event_max_ops:
                row["time_event"] = simulate(s, mode="event").time
                row["time_msccl"] = predict(s, MSCCL_MODEL).time
            if size == BOUND_SIZE or (BOUND_SIZE not in sizes and size == sizes[-1]):
                bound, bname = _bound(s.collective, use_lp=topo.n_ranks <= lp_max)
                row["bound"] = bound
                row["bound_name"] = bname
                row["pct_of_bound"] = 100.0 * bound / r.time
            rows.append(row)
        log(f"  {topo.name:>9} {name:<22} {n_ops:>9} ops  built {built:5.1f}s  "
            f"total {time.time() - t0:6.1f}s")
    base = {r["size"]: r["time"] for r in rows if r["series"] == "Ring_Pipeline"}
    base_bw = {r["size"]: r["time_bandwidth"] for r in rows if r["series"] == "Ring_Pipeline"}
    base_nccl = {r["size"]: r["time_nccl"] for r in rows if r["series"] == "Ring_Pipeline"}
    for r in rows:
        r["speedup"] = base[r["size"]] / r["time"]
        r["speedup_nccl"] = base_nccl[r["size"]] / r["time_nccl"]
        if "time_msccl" in r:
            # both sides as MSCCL would run them would need Ring_Pipeline in event mode too;
            # the baseline here is the NCCL library's Ring_Pipeline (what a user runs today)
            r["speedup_msccl_vs_nccl_baseline"] = base_nccl[r["size"]] / r["time_msccl"]
        r["speedup_bandwidth"] = base_bw[r["size"]] / r["time_bandwidth"]
        if "time_event" in r:
            r["speedup_event"] = base[r["size"]] / r["time_event"]
    return rows


def averages(rows, key="speedup"):
    """Mean over sizes per torus, then over tori: {series: value}."""
    per: dict[str, dict[str, list[float]]] = {}
    for r in rows:
        if key in r:
            per.setdefault(r["series"], {}).setdefault(r["torus"], []).append(r[key])
    return {s: sum(sum(v) / len(v) for v in t.values()) / len(t) for s, t in per.items()}


def _fmt_size(b: int) -> str:
    for unit, k in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if b >= k:
            return f"{b / k:g} {unit}"
    return f"{b} B"


def markdown(rows, tpu_rows, series) -> str:
    avg = averages(rows)
    avg_ev = averages(rows, "speedup_event")
    avg_bw = averages(rows, "speedup_bandwidth")
    avg_nccl = averages(rows, "speedup_nccl")
    tori = sorted({r["torus"] for r in rows}, key=len)
    routing = rows[0].get("routing", "source") if rows else "source"
    out = [f"Routing `{routing}`. Columns: per torus and average, the IR model (lockstep, no "
           "software cost); paper; IR model with latency 0; IR event mode (dataflow, no "
           "software cost); nccl-lockstep model (the NCCL library before it ran dataflow: lockstep "
           "+ 8.4 us per step, both sides).", "",
           "| series | " + " | ".join(tori) + " | average | paper | bandwidth only (latency 0) "
           "| event mode (tori where run) | nccl-lockstep model |",
           "|---|" + "---|" * (len(tori) + 5)]
    for s in series:
        cells = []
        for t in tori:
            v = [r["speedup"] for r in rows if r["series"] == s and r["torus"] == t]
            cells.append(f"{sum(v) / len(v):.2f}x" if v else "-")
        paper = f"{PAPER[s]:.2f}x" if s in PAPER else "-"
        ev = f"{avg_ev[s]:.2f}x" if s in avg_ev else "-"
        out.append(f"| {s} | " + " | ".join(cells) + f" | **{avg[s]:.2f}x** | {paper} | "
                   f"{avg_bw[s]:.2f}x | {ev} | {avg_nccl[s]:.2f}x |")
    out += ["", ("% of the lower bound at 128 MiB (LP max-concurrent-flow where computed, "
                 "else the best closed-form bound):"), "",
            "| series | " + " | ".join(tori) + " |", "|---|" + "---|" * len(tori)]
    for s in series:
        cells = []
        for t in tori:
            v = [r for r in rows if r["series"] == s and r["torus"] == t and "pct_of_bound" in r]
            cells.append(f"{v[0]['pct_of_bound']:.1f}% ({v[0]['bound_name']})" if v else "-")
        out.append(f"| {s} | " + " | ".join(cells) + " |")
    if tpu_rows:
        tt = sorted({r["torus"] for r in tpu_rows})
        out += ["", ("TPUv4-like tori, 56 GB/s, 100 ns (average speed-up over Ring_Pipeline; "
                     "% of bound at 128 MiB):"), "",
                "| series | " + " | ".join(tt) + " |", "|---|" + "---|" * len(tt)]
        for s in series:
            cells = []
            for t in tt:
                v = [r for r in tpu_rows if r["series"] == s and r["torus"] == t]
                if not v:
                    cells.append("-")
                    continue
                sp = sum(r["speedup"] for r in v) / len(v)
                pct = [r["pct_of_bound"] for r in v if "pct_of_bound" in r]
                cells.append(f"{sp:.2f}x" + (f", {pct[0]:.0f}%" if pct else ""))
            out.append(f"| {s} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="5x5 and 5x5x5 only, no TPU tori (~1 min)")
    ap.add_argument("--json", metavar="PATH", help="write the averages and every row")
    ap.add_argument("--no-4d", action="store_true", help="skip the 625-rank 5x5x5x5 torus")
    ap.add_argument("--routing", default="source", choices=("source", "none", "dimension_order",
                                                            "shortest"),
                    help="the tori's declared routing (default: source, the paper's model)")
    args = ap.parse_args(argv)

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    sizes = SIZES
    series = list(SERIES) + list(RHO_SERIES)
    tori = [(5, 5), (5, 5, 5)] + ([] if args.quick or args.no_4d else [(5, 5, 5, 5)])
    rows = []
    for dims in tori:
        rows += run_torus(dims, 32e9, sizes, series, log,
                          event_max_ops=QUICK_EVENT_MAX_OPS if args.quick else EVENT_MAX_OPS,
                          routing=args.routing)
    tpu_rows = []
    if not args.quick:
        for dims in [(4, 4, 4), (8, 4, 4)]:
            tpu_rows += run_torus(dims, 56e9, sizes, series, log, routing=args.routing)

    print(f"Speed-up over Ring_Pipeline (healthy), averaged over {len(sizes)} sizes "
          f"({_fmt_size(sizes[0])} .. {_fmt_size(sizes[-1])}), lockstep simulation:\n")
    print(markdown(rows, tpu_rows, series))
    print("\nPer size (lockstep time, speed-up):\n")
    print("| torus | size | " + " | ".join(series) + " |")
    print("|---|---|" + "---|" * len(series))
    for t in sorted({r["torus"] for r in rows + tpu_rows}, key=lambda x: (len(x), x)):
        for size in sizes:
            cells = []
            for s in series:
                v = [r for r in rows + tpu_rows if r["torus"] == t and r["size"] == size
                     and r["series"] == s]
                cells.append(f"{v[0]['time'] * 1e6:.4g} us ({v[0]['speedup']:.2f}x)" if v else "-")
            print(f"| {t} | {_fmt_size(size)} | " + " | ".join(cells) + " |")
    if args.json:
        from meta import run_meta  # benchmarks/meta.py, beside this script

        with open(args.json, "w") as fh:
            json.dump({"meta": run_meta(argv), "quick": args.quick,
                       "average_speedup": {k: v for k, v in averages(rows).items()
                                           if k in SERIES},
                       "average_speedup_rho_artifact": {k: v for k, v in averages(rows).items()
                                                        if k in RHO_SERIES},
                       "average_speedup_bandwidth_only": averages(rows, "speedup_bandwidth"),
                       "average_speedup_event": averages(rows, "speedup_event"),
                       "average_speedup_nccl_model": averages(rows, "speedup_nccl"),
                       "routing": args.routing,
                       "paper": PAPER, "tpu_average_speedup": averages(tpu_rows),
                       "rows": rows + tpu_rows}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
