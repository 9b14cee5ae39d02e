"""How long code generation takes, and what the MSCCL lowering produces, per schedule size.

For torus alltoall/allgather/allreduce schedules of growing size (registry algorithms), prints
the ops, the MSCCL lowering time and result (threadblocks on the busiest GPU, most steps in a
threadblock, channels, fused instructions, or the limit that stopped it) for microsoft/msccl,
and the time to render the NCCL/MPI sources.

    python benchmarks/codegen.py            # tori up to 4x4x4
    python benchmarks/codegen.py --quick    # up to 3x3x3
"""

from __future__ import annotations

import argparse
import time

from backends.msccl.lower import lower_to_fit
from backends.msccl.runtimes import RUNTIMES
from backends.nccl import render_sources
from cclc.algorithms import get
from cclc.collective import CollectiveKind, make_collective
from cclc.errors import ScheduleError
from cclc.topology import torus

CASES = [("alltoall", "halfring+dimrotation"), ("alltoall", "direct"),
         ("allgather", "ring+dimrotation"), ("allreduce", "ring+dimrotation")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    dims_list = [(3, 3), (4, 4), (3, 3, 3)] + ([] if args.quick else [(4, 4, 4)])
    print(f"{'torus':>8} {'collective':>10} {'algorithm':>22} {'ops':>7} {'xml s':>6} "
          f"{'tbs':>4} {'steps':>5} {'ch':>3} {'fused':>6} {'c++ s':>6}  note")
    for dims in dims_list:
        topo = torus("t", dims)
        n = topo.n_ranks
        for kind_name, algo_name in CASES:
            kind = CollectiveKind(kind_name)
            coll = make_collective(kind_name, kind, topo, tuple(range(n)), n * n * 64 * 4)
            algo = get(algo_name)
            if algo is None or algo.applicable(coll) is not None:
                continue
            s = algo.build(coll)
            t0 = time.perf_counter()
            note, tbs, steps, chans, fused = "", "-", "-", "-", "-"
            try:
                low, _, _ = lower_to_fit(s, RUNTIMES["msccl"])
                tbs = max(len(t) for t in low.tbs)
                steps = max(len(tb.steps) for t in low.tbs for tb in t)
                chans, fused = low.nchannels, low.n_fused
            except ScheduleError as err:
                note = err.message[:60]
            t_xml = time.perf_counter() - t0
            t0 = time.perf_counter()
            render_sources(s)
            t_cpp = time.perf_counter() - t0
            name = "x".join(map(str, dims))
            print(f"{name:>8} {kind_name:>10} {algo_name:>22} {len(s.ops):>7} {t_xml:>6.2f} "
                  f"{tbs!s:>4} {steps!s:>5} {chans!s:>3} {fused!s:>6} {t_cpp:>6.2f}  {note}")


if __name__ == "__main__":
    main()
