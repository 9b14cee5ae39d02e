"""How long the LP bound takes at scale: 5x5x5 and 8x8x8 tori, healthy and with faults, and the
example fabrics.

Each row solves :func:`cclc.bounds.bounds` from scratch (a fresh topology, so nothing is
cached) for one collective on every live rank, with the alltoall LP allowed up to
``--lp-max-variables`` (default 2000000, above the 60000 that ``cclc compile`` allows: the
row says "no" under "default" when compile skips that LP; the other collectives get
compile's defaults), and prints the wall time, the
commodity families and links of the LP after the symmetry reduction, how the alltoall LP was
solved ("exact": HiGHS; "PDLP": the certified lower value of PDLP's solution, with the gap to
the feasible flow repaired from it; "routed", above 400 000 variables: the best certificate of
hop counts, the best cut and a routing's link prices, with the gap to the routed flow), the
LP bound and the strongest closed-form bound, with the machine named (CPU model, cores, load).

    python benchmarks/bounds_scale.py              # tori and fabrics (about 5 minutes)
    python benchmarks/bounds_scale.py --quick      # 5x5x5 only
    python benchmarks/bounds_scale.py --json out.json

:func:`rows` returns the same figures for another benchmark to print.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from dataclasses import replace

from compile_scale import machine  # one description of the machine for both benchmarks

import dsl
from cclc.bounds import (
    LP_EXACT_MAX_VARIABLES,
    LP_MAX_VARIABLES,
    LP_PDLP_MAX_VARIABLES,
    bounds,
    lp_size,
)
from cclc.collective import CollectiveKind, DType, make_collective
from cclc.topology import Topology, torus, with_faults

K = CollectiveKind
EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "examples")


def _faulty(t: Topology, links: list[tuple[int, int]]) -> Topology:
    return with_faults(t, links=links)


def cases(quick: bool) -> list[tuple[str, Topology, CollectiveKind]]:
    """(label, topology, collective): the tori of issue 17's targets, then the fabrics."""
    out = []
    for dims in [(5, 5, 5)] if quick else [(5, 5, 5), (8, 8, 8)]:
        t = torus("x".join(map(str, dims)), dims, bandwidth=50e9, latency=1e-7)
        n = t.n_ranks
        # one failed link; then several: both directions of one link and two more elsewhere
        several = [(0, 1), (1, 0), (n // 2, n // 2 + 1), (n - 1, n - 2)]
        for label, topo in (("healthy", t), ("1 failed link", _faulty(t, [(0, 1)])),
                            ("4 failed links", _faulty(t, several))):
            for kind in (K.ALLTOALL, K.ALLREDUCE):
                out.append((f"{t.name} {label}", topo, kind))
    if not quick:
        for name in ("hgx16_leafspine", "tpuv4_8x4x4", "torus5x5_fault"):
            program = dsl.load(os.path.join(EXAMPLES, f"{name}.ccl"))
            for topo in program.topologies.values():
                for kind in (K.ALLTOALL, K.ALLREDUCE):
                    out.append((f"examples/{name}.ccl", topo, kind))
    return out


def measure(label: str, topo: Topology, kind: CollectiveKind,
            max_variables: int = 2_000_000) -> dict:
    """Solve the bounds of ``kind`` on every live rank of ``topo`` from scratch."""
    topo = replace(topo, _cache={})           # nothing kept from an earlier row
    group = topo.live_ranks()
    size = len(group) * (1 << 20)
    coll = make_collective(kind.value, kind, topo, group, size=size, dtype=DType.FP32)
    start = time.perf_counter()
    # the limit is the alltoall LP's; other collectives get compile's defaults (the same
    # option would also lift the joint allreduce LP's limit, which HiGHS needs minutes for)
    b = bounds(coll, lp_max_variables=max_variables if kind is K.ALLTOALL else None)
    seconds = time.perf_counter() - start
    families, links = lp_size(coll)           # after: the symmetry search is in the time
    lp = b.get("lp")
    closed = max((x for x in b.items if x.name != "lp"), key=lambda x: x.seconds)
    by_default = kind is not K.ALLTOALL or families * links <= LP_MAX_VARIABLES
    method = "-"
    if lp is not None and kind is K.ALLTOALL:
        method = ("routed" if families * links > LP_PDLP_MAX_VARIABLES
                  else "PDLP" if families * links > LP_EXACT_MAX_VARIABLES else "exact")
    gap = re.search(r"feasible flow ([0-9.e+-]+)% above", lp.description) if lp else None
    return {"case": label, "collective": kind.value, "ranks": coll.n, "families": families,
            "links": links, "by_default": by_default, "bounds_s": seconds, "method": method,
            "gap_pct": float(gap.group(1)) if gap else None,
            "lp_us": lp.seconds * 1e6 if lp else None,
            "lp": lp.description if lp else None, "closed_form": closed.name,
            "closed_form_us": closed.seconds * 1e6, "notes": list(b.notes)}


def rows(quick: bool = False, max_variables: int = 2_000_000) -> list[dict]:
    return [measure(*c, max_variables=max_variables) for c in cases(quick)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="the 5x5x5 torus only")
    ap.add_argument("--json", metavar="PATH", help="write every row as JSON")
    ap.add_argument("--lp-max-variables", type=int, default=2_000_000, metavar="N",
                    help="solve the alltoall LP up to N flow variables (default 2000000)")
    args = ap.parse_args(argv)
    print(f"machine: {machine()}", flush=True)
    print(f"{'case':<34} {'collective':<10} {'ranks':>5} {'families x links':>17} "
          f"{'default':>7} {'time':>8} {'method':>6} {'gap':>8} {'LP bound':>12} "
          f"{'best closed form':>26}", flush=True)
    out = []
    for c in cases(args.quick):
        r = measure(*c, max_variables=args.lp_max_variables)
        out.append(r)
        lp = f"{r['lp_us']:10.2f} us" if r["lp_us"] is not None else "   (skipped)"
        print(f"{r['case']:<34} {r['collective']:<10} {r['ranks']:>5} "
              f"{r['families']:>8} x {r['links']:<6} {'yes' if r['by_default'] else 'no':>7} "
              f"{r['bounds_s']:7.1f}s {r['method']:>6} "
              f"{'' if r['gap_pct'] is None else format(r['gap_pct'], '.2g') + '%':>8} {lp} "
              f"{r['closed_form']:>12} {r['closed_form_us']:10.2f} us", flush=True)
        for note in r["notes"]:
            print(f"    note: {note}", flush=True)
    print(f"machine at the end: {machine()}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"machine": machine(), "rows": out}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
