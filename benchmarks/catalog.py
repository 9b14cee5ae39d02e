"""A fault catalog for a 5x5x5 torus: every single failed link, served without recompiling.

``cclc.catalog.build.build_catalog`` on ``examples/torus5x5x5.ccl``'s AllToAll (125 MiB per
rank) with the ``link`` class: every cable (both directions of one connection: 375 cables,
750 directed links) fails in turn. Reported: the fault sets and orbits, the schedules compiled
(the healthy machine's and one per orbit), the catalog's compile time (wall and CPU: the
machine is shared), the worst and median % of the lower bound over all members (each member's
bound equals its representative's: an automorphism of the torus maps one faulty machine onto
the other), a spot check of one member
per dimension (its orbit schedule relabeled, verified, and none of its routes on the failed
cable), and from the NCCL library's catalog (``--emit nccl`` sources, its check tool built with
g++): the time to select a fault set (the slowest rank's match and relabeling, each rank's
fastest of three; and the very first selection, with the tables not yet in memory) and the size
of the catalog's tables against one schedule's.

Times are planned under the IR's lockstep model (``cclc catalog``'s default, ``--emit json``),
the lower bound is ``cclc.bounds.bounds(coll).best``. Targets (issue 33): at most 3 schedules,
at most 2 minutes on this 2-core machine, every member at least 95% of its bound, selection
under 1 ms, the catalog's tables under 10x one schedule's.

    python benchmarks/catalog.py                        # 5x5x5 (a few minutes)
    python benchmarks/catalog.py --ccl examples/torus5x5.ccl --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import dsl
from cclc.catalog.build import build_catalog, member_schedule
from cclc.verify import verify

ROOT = Path(__file__).resolve().parents[1]


def _spot_check(catalog) -> list[dict]:
    """One member per dimension: relabeled, verified, its routes off the failed cable."""
    topo = catalog.collective.topology
    seen, rows = set(), []
    for k, m in enumerate(catalog.classes[0].members):
        link = m.faults.links[0]
        a, b = topo.coords(int(topo.link_src[link])), topo.coords(int(topo.link_dst[link]))
        dim = next(d for d in range(len(a)) if a[d] != b[d])
        if dim in seen:
            continue
        seen.add(dim)
        t0 = time.perf_counter()
        s = member_schedule(catalog, 0, k)
        verify(s)
        avoids = not np.isin(s.routes.links, list(m.faults.links)).any()
        rows.append({"dimension": dim, "faults": list(m.faults.links), "verified": True,
                     "avoids_failed_links": bool(avoids),
                     "seconds": round(time.perf_counter() - t0, 2)})
    return rows


def _library(catalog) -> dict:
    """Selection time and table sizes from the NCCL library's catalog and its check tool."""
    from backends.nccl.catalog import write_catalog_library
    from cclc.outdir import OutputDir

    name = catalog.collective.name
    with tempfile.TemporaryDirectory() as tmp:
        with OutputDir(tmp) as out:
            write_catalog_library(catalog, out)
        lib = Path(tmp) / f"nccl-{name}"
        subprocess.run(["make", "-C", str(lib), "catalogcheck"], check=True,
                       capture_output=True, timeout=1800)
        tool = lib / f"cclc_{name}_catalog_check"
        member = catalog.classes[0].members[len(catalog.classes[0].members) // 2]
        times, firsts = [], []
        for links in (list(member.faults.links), list(member.faults.links[:1])):
            out = subprocess.run([str(tool), *map(str, links)], capture_output=True,
                                 text=True, check=True, timeout=600).stdout
            words = out.split("\n", 1)[0].split()
            times.append(float(words[1]))
            firsts.append(float(words[3]))
        one = (lib / f"cclc_{name}_schedule.h").stat().st_size
        tables = sum(p.stat().st_size for p in lib.glob(f"cclc_{name}_s*_tables.h"))
        header = (lib / f"cclc_{name}_catalog.h").stat().st_size
    return {"select_us_max": max(times), "select_us_first": max(firsts),
            "schedule_tables_bytes": one,
            "catalog_bytes": one + tables + header,
            "catalog_over_one_schedule": round((one + tables + header) / one, 2)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ccl", default="examples/torus5x5x5.ccl")
    ap.add_argument("--collective", default="a2a")
    ap.add_argument("--faults", default="link")
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)
    program = dsl.load(str(ROOT / args.ccl) if not os.path.isabs(args.ccl) else args.ccl)
    coll = next(c for c in program.collectives if c.name == args.collective)

    def step(i, total, what):
        print(f"  [{i + 1}/{total}] compiling for {what}", file=sys.stderr, flush=True)

    cpu = time.process_time()
    catalog = build_catalog(coll, tuple(args.faults.split(",")), on_step=step)
    # the machine is shared: its other load lengthens the wall time, not the CPU time
    cpu = time.process_time() - cpu
    summary = catalog.summary()
    schedules = [{"faults": list(e.faults.links), "algorithm": e.plan.name if e.plan else None,
                  "pct_of_bound": e.plan.pct_of_bound if e.plan else None,
                  "seconds": round(e.seconds, 1)} for e in catalog.schedules]
    print(f"{coll.name} on {coll.topology.name} ({coll.n} ranks), classes {summary['classes']}:"
          f" {summary['members']} fault sets in {summary['orbits']} orbits, "
          f"{summary['schedules_compiled']} schedules compiled in {summary['seconds']:.1f} s "
          f"({cpu:.1f} s of CPU); "
          f"worst {summary['worst_pct_of_bound']:.2f}%, median "
          f"{summary['median_pct_of_bound']:.2f}% of bound over the members")
    for s in schedules:
        print(f"  {s['faults'] or 'healthy'}: {s['algorithm']} {s['pct_of_bound']:.1f}% "
              f"of bound, {s['seconds']} s")
    checks = _spot_check(catalog)
    for c in checks:
        print(f"  member failing dimension {c['dimension']}: verified, avoids its cable: "
              f"{c['avoids_failed_links']}")
    library = _library(catalog)
    print(f"  selection: {library['select_us_max']:.1f} us (slowest rank), the very first "
          f"{library['select_us_first']:.1f} us; catalog tables "
          f"{library['catalog_over_one_schedule']}x one schedule's")
    if args.json:
        from meta import run_meta  # benchmarks/meta.py, beside this script

        doc = {"meta": run_meta(argv), "topology": coll.topology.name, "ranks": coll.n,
               "collective": coll.kind.value, "size": coll.size, "model": "ir",
               "directed_links": 2 * summary["members"], **summary,
               "cpu_seconds": round(cpu, 1), "schedules": schedules,
               "spot_checks": checks, **library}
        Path(args.json).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
