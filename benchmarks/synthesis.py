"""Synthesis against every template: % of the lower bound per case, side by side, in one run.

Cases (the tori at 32 GB/s per link direction, 100 ns, ``routing none`` as a GPU torus
declares it): the faulty tori of issue 14 (4x4x4 with two failed links in different rings, 6x6
with three, 3x3x3 with one, 5x5 with two in one ring, 5x5x5 with one), a mesh, a torus with a
failed rank, and the fabric examples (``examples/*.ccl``: an oversubscribed PCIe fabric with a
failed GPU, six single-GPU nodes on a switch, and with ``--full`` the 128-GPU leaf/spine fabric
with a failed cable).

For every case, kind and size the planner's table under the IR model (lockstep steps, no
software cost; the declared routing): every template that applies, ``direct`` and ``synth``,
each as % of the lower bound (:mod:`cclc.bounds`: the LP max-concurrent-flow bound up to 64
ranks for alltoall, 256 for the others, else the best closed form), and synth's status, solve
time (wall clock) and ``lp_fraction`` (its own LP's time / its time). Every kind goes through
``plan`` with algorithm ``synth`` (as a user's file would ask for it): AllToAll is synthesized
by :mod:`cclc.algorithms.synth_flows`, AllGather / ReduceScatter / AllReduce by
:mod:`cclc.algorithms.synth_trees`; either returns the fastest template instead (``status
fallback (name)``) when that one is faster, so the synth column is what a user gets. A row says
``slower than a template`` where it is not. ``--examples`` adds the example machines of
``benchmarks/synth_trees.py`` (its small ones; all of them with ``--full``).

    python benchmarks/synthesis.py                 # tori and the small fabrics (~10 min)
    python benchmarks/synthesis.py --quick         # 128 MiB only, no 5x5x5
    python benchmarks/synthesis.py --full          # also the 128-GPU fabric
    python benchmarks/synthesis.py --json out.json
    python benchmarks/synthesis.py --quick --examples --kinds allgather,reducescatter,allreduce
    python benchmarks/synthesis.py --kinds alltoall --cases 5x5x5   # one case
    python benchmarks/synthesis.py --auto --kinds alltoall --sizes 128  # what `auto` picks

With ``--auto`` each case is compiled as a user's ``algorithm auto`` would be (every
candidate, pruned by lower bounds, no synth budget): the pick, its % of the bound, the reason
when synth was left out, and the CPU and wall seconds of the whole choice. Besides the tori
above it runs 5x5x5 with two failed links in different rings.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from cclc.collective import CollectiveKind, Hint, make_collective
from cclc.errors import CclError
from cclc.plan import plan
from cclc.topology import torus, with_faults

ROOT = Path(__file__).resolve().parent.parent
MiB = 2**20
SIZES = [1 * MiB, 128 * MiB, 1024 * MiB]
KINDS = [CollectiveKind.ALLTOALL, CollectiveKind.ALLGATHER, CollectiveKind.REDUCESCATTER,
         CollectiveKind.ALLREDUCE]
BUDGET = 300.0


def _torus(dims, links=(), ranks=(), wrap=None):
    t = torus("t", dims, wrap=wrap, bandwidth=32e9, latency=1e-7, routing="none")
    at = t.rank_at
    pairs = [(at(a), at(b)) for a, b in links]
    return with_faults(t, links=pairs + [(b, a) for a, b in pairs],
                       ranks=[at(r) for r in ranks])


def _example(name: str, topology: str):
    from dsl import load

    return dict(load(ROOT / "examples" / name).topologies)[topology]


def _tree_examples(quick: bool) -> dict:
    """The example machines of the trees benchmark (``benchmarks/synth_trees.py``, its small
    ones with ``quick``) that this table does not already have, named by file:topology."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import synth_trees

    have = ("pcie_oversubscribed", "fabric6_single_gpu", "hgx16_leafspine")
    names = [e for e in (synth_trees.QUICK if quick else synth_trees.EXAMPLES)
             if e not in have]
    out = {}
    for label, topo in synth_trees.machines_of(names):
        out[label] = lambda topo=topo: topo
    return out


def cases(full: bool, quick: bool, examples: bool = False) -> dict:
    out = {
        "4x4x4, 2 failed links in different rings": lambda: _torus(
            (4, 4, 4), [((0, 0, 0), (1, 0, 0)), ((2, 0, 1), (2, 1, 1))]),
        "6x6, 3 failed links": lambda: _torus(
            (6, 6), [((0, 0), (1, 0)), ((3, 2), (3, 3)), ((4, 5), (5, 5))]),
        "3x3x3, 1 failed link": lambda: _torus((3, 3, 3), [((0, 0, 0), (1, 0, 0))]),
        "5x5, 2 failed links in one ring": lambda: _torus(
            (5, 5), [((0, 2), (1, 2)), ((3, 2), (4, 2))]),
        "4x4, failed rank (1,1)": lambda: _torus((4, 4), ranks=[(1, 1)]),
        "4x6 mesh": lambda: _torus((4, 6), wrap=(False, False)),
        "pcie_oversubscribed (fabric, failed GPU)": lambda: _example(
            "pcie_oversubscribed.ccl", "cluster"),
        "fabric6_single_gpu (switch)": lambda: _example("fabric6_single_gpu.ccl", "sw"),
    }
    if not quick:
        out["5x5x5, 1 failed link"] = lambda: _torus((5, 5, 5), [((0, 0, 0), (1, 0, 0))])
    if full:
        out["hgx16_leafspine (128 GPUs, failed cable)"] = lambda: _example(
            "hgx16_leafspine.ccl", "cluster")
    if examples:
        out.update(_tree_examples(quick=not full))
    return out


def _size(size: int, n: int) -> int:
    unit = 4 * n
    return max(unit, size // unit * unit)


def run_case(topo, kind: CollectiveKind, size: int) -> dict:
    group = topo.live_ranks()
    coll = make_collective("c", kind, topo, tuple(group), size=_size(size, len(group)),
                           algorithm=Hint("synth", (("budget", BUDGET),)))
    t0 = time.monotonic()
    try:
        p = plan(coll, explain=True)
    except CclError as err:
        # no synth entry for this kind (yet): the templates alone
        auto = make_collective("c", kind, topo, tuple(group), size=coll.size)
        p = plan(auto, explain=True)
        row = {"synth": None, "synth_note": err.message.split(";")[0]}
    else:
        params = dict(p.schedule.params)
        row = {"synth": p.pct_of_bound, "status": params.get("status"),
               "solve_s": params.get("solve_s"), "lp_fraction": params.get("lp_fraction"),
               "template": params.get("template")}
    row["wall_s"] = time.monotonic() - t0
    row["size"] = coll.size
    row["n"] = coll.n
    row["bound_s"] = p.bound
    row["candidates"] = {c.name: c.pct_of_bound for c in p.candidates
                         if c.pct_of_bound is not None and c.name != "synth"}
    return row


def run_auto(topo, kind: CollectiveKind, size: int) -> dict:
    """``plan`` of the collective with ``algorithm auto``: the pick and what it cost."""
    group = topo.live_ranks()
    coll = make_collective("c", kind, topo, tuple(group), size=_size(size, len(group)))
    w0, c0 = time.monotonic(), time.process_time()
    p = plan(coll)
    rows = {c.name: c for c in p.candidates}
    synth = rows.get("synth")
    return {"pick": p.name, "pct": p.pct_of_bound, "n": coll.n, "size": coll.size,
            "cpu_s": time.process_time() - c0, "wall_s": time.monotonic() - w0,
            "synth_reason": None if synth is None else (synth.reason or synth.pruned)}


def main_auto(args, sizes, kinds) -> int:
    print("auto: the pick and its % of the lower bound (cclc.bounds), IR model; seconds of "
          "CPU / wall for the whole choice")
    every = cases(args.full, args.quick, args.examples)
    every["5x5x5, 2 failed links in different rings"] = lambda: _torus(
        (5, 5, 5), [((0, 0, 0), (1, 0, 0)), ((2, 0, 1), (2, 1, 1))])
    results = []
    for name, make in every.items():
        if args.cases not in name:
            continue
        topo = make()
        for kind in kinds:
            for size in sizes:
                row = run_auto(topo, kind, size)
                row.update(case=name, kind=kind.value, nominal=size)
                results.append(row)
                why = f"  (synth: {row['synth_reason']})" if row["synth_reason"] else ""
                print(f"{name:44} {kind.value:13} {size // MiB:>6}Mi  {row['pick']:>24} "
                      f"{_pct(row['pct']):>7}  {row['cpu_s']:6.1f} / {row['wall_s']:6.1f} s"
                      f"{why}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=float))
    return 0


def _pct(x) -> str:
    return "-" if x is None else f"{x:.1f}%"


def _print_row(row: dict) -> None:
    """One line of the table: direct, the best template and synth, each % of the bound;
    ``slower`` where synth's schedule is slower than a template."""
    cands = row["candidates"]
    templates = {k: v for k, v in cands.items() if k != "direct"}
    best = max(templates.items(), key=lambda kv: kv[1]) if templates else None
    best_s = f"{best[0]} {_pct(best[1])}" if best else "-"
    solve = "-" if row.get("solve_s") is None else f"{row['solve_s']:.1f}s"
    frac = "-" if not row.get("lp_fraction") else f"{100 * row['lp_fraction']:.1f}%"
    status = row.get("status") or row.get("synth_note") or "-"
    if row.get("template"):
        status += f" ({row['template']})"
    top = max(cands.values(), default=None)
    slower = ("  slower than a template" if row["synth"] is not None and top is not None
              and row["synth"] < top * (1 - 1e-9) else "")
    print(f"{row['case']:44} {row['kind']:13} {row['nominal'] // MiB:>6}Mi  "
          f"{_pct(cands.get('direct')):>7} {best_s:>30} {_pct(row['synth']):>7}  "
          f"{status:26} {solve:>7} {frac:>7}{slower}", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="128 MiB only, no 5x5x5")
    ap.add_argument("--full", action="store_true", help="also the 128-GPU fabric")
    ap.add_argument("--examples", action="store_true",
                    help="also the example machines of benchmarks/synth_trees.py (its small "
                         "ones; every one with --full)")
    ap.add_argument("--kinds", default="alltoall,allgather,reducescatter,allreduce")
    ap.add_argument("--cases", metavar="TEXT", default="",
                    help="only the cases whose name contains TEXT (e.g. 5x5x5)")
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--auto", action="store_true",
                    help="what algorithm auto picks per case, and its time")
    ap.add_argument("--sizes", metavar="MIB", default="",
                    help="comma-separated sizes per rank in MiB (default 1,128,1024)")
    args = ap.parse_args(argv)
    sizes = [128 * MiB] if args.quick else SIZES
    if args.sizes:
        sizes = [int(x) * MiB for x in args.sizes.split(",")]
    kinds = [CollectiveKind(k) for k in args.kinds.split(",")]
    if args.auto:
        return main_auto(args, sizes, kinds)
    results = []
    print("% of the lower bound (cclc.bounds), IR model (lockstep, no software cost), "
          "routing as declared; synth status, solve time, synth's LP rate / its time")
    print(f"{'case':44} {'kind':13} {'size':>8}  {'direct':>7} {'best template':>30} "
          f"{'synth':>7}  {'status':26} {'solve':>7} {'LP frac':>7}")
    for name, make in cases(args.full, args.quick, args.examples).items():
        if args.cases not in name:
            continue
        topo = make()
        for kind in kinds:
            for size in sizes:
                row = run_case(topo, kind, size)
                row.update(case=name, kind=kind.value, nominal=size)
                results.append(row)
                _print_row(row)
    print("\nevery template, % of bound (same runs):")
    for row in results:
        cells = ", ".join(f"{k} {_pct(v)}" for k, v in sorted(row["candidates"].items(),
                                                              key=lambda kv: -kv[1]))
        print(f"  {row['case']} / {row['kind']} / {row['nominal'] // MiB} MiB: {cells}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
