"""How the schedule IR scales: a direct alltoall on 8x8x8 and on 16x16x16 tori.

Builds, verifies and simulates (lockstep) a direct alltoall on an 8x8x8 torus (512 ranks,
262k ops), then builds one on 16x16x16 (4096 ranks, 16.7M ops), printing the seconds and
the peak memory of each phase. Targets on a 2-core machine: 8x8x8 verify + simulate under
5 s; 16x16x16 build under 60 s and 8 GiB.

Peak memory per phase is what numpy and Python allocated during that phase (tracemalloc);
the process's high-water mark (``maxrss``) is printed at the end.

    python benchmarks/ir_scale.py            # both sizes
    python benchmarks/ir_scale.py --small    # 8x8x8 only
    python benchmarks/ir_scale.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
import tracemalloc

from cclc.algorithms import get
from cclc.collective import CollectiveKind, make_collective
from cclc.topology import torus

GiB = 2 ** 30


def _phase(rows: list[dict], label: str, fn):
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    start = time.perf_counter()
    result = fn()
    seconds = time.perf_counter() - start
    peak = tracemalloc.get_traced_memory()[1] - base
    rows.append({"phase": label, "seconds": seconds, "peak_bytes": peak})
    print(f"{label:<34} {seconds:8.2f} s   peak {peak / GiB:6.2f} GiB", flush=True)
    return result


def _alltoall(side: int):
    topo = torus(f"t{side}", (side, side, side), bandwidth=50e9, latency=1e-7)
    n = topo.n_ranks
    # 4 fp32 elements per pair: the op count, not the payload, is what scales
    return make_collective("a2a", CollectiveKind.ALLTOALL, topo, topo.all_ranks(),
                           size=16 * n)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--small", action="store_true", help="only the 8x8x8 torus")
    parser.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    args = parser.parse_args(argv)

    from cclc.sim import simulate
    from cclc.verify import verify

    direct = get("direct")
    rows: list[dict] = []
    tracemalloc.start()
    coll = _alltoall(8)
    s = _phase(rows, "8x8x8 direct alltoall: build", lambda: direct.build(coll))
    print(f"  {len(s.ops):,} ops, {len(s.routes.links):,} route links")
    _phase(rows, "8x8x8 direct alltoall: verify", lambda: verify(s))
    sim = _phase(rows, "8x8x8 direct alltoall: simulate", lambda: simulate(s))
    print(f"  simulated time {sim.time * 1e6:.2f} us")
    del s, sim
    if not args.small:
        big = _alltoall(16)
        s = _phase(rows, "16x16x16 direct alltoall: build", lambda: direct.build(big))
        print(f"  {len(s.ops):,} ops, {len(s.routes.links):,} route links")
        del s
    tracemalloc.stop()
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    print(f"process peak resident memory: {maxrss / GiB:.2f} GiB")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"rows": rows, "maxrss_bytes": maxrss}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
