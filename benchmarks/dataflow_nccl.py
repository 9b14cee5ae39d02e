"""The dataflow NCCL library's model against event mode for the torus paper's MATE and MATEe.

For each torus and routing (the faulty tori of ``benchmarks/torus_alltoall.py``: link
(0,0)-(1,0) failed, 50 GB/s links, 100 ns per hop) it prints, per series, the IR's lockstep
time, event mode (the schedule's own dataflow time), the ``nccl`` execution model (the
dataflow library: lanes, groups, 8.4 us per group; :mod:`cclc.dataflow`), the same without the
launch cost, and the ``nccl-lockstep`` model (the library as it was). Usage::

    python benchmarks/dataflow_nccl.py [--size BYTES] [--tori 5x5,5x5x5] [--routings source,none]
"""

from __future__ import annotations

import argparse
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from torus_alltoall import _collective, _topologies  # noqa: E402

from cclc.algorithms.torus_alltoall import build_for_sizes  # noqa: E402
from cclc.dataflow import dataflow_time, lower_schedule  # noqa: E402
from cclc.execution import LOCKSTEP_NCCL_MODEL, NCCL_MODEL, predict  # noqa: E402
from cclc.relay import lower_relays  # noqa: E402
from cclc.sim import simulate  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=2 * 2**30, help="alltoall bytes (default 2 GiB)")
    ap.add_argument("--tori", default="5x5,5x5x5")
    ap.add_argument("--routings", default="source,none")
    args = ap.parse_args()
    nccl = NCCL_MODEL
    print("| torus | routing | series | ops | lanes | groups | lockstep (IR) | event | nccl model "
          "| model / event | nccl model, no launch cost | nccl-lockstep model |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for dims_s in args.tori.split(","):
        dims = tuple(int(x) for x in dims_s.split("x"))
        for routing in args.routings.split(","):
            _, faulty = _topologies(dims, 50e9, routing)
            for sch in ("mate", "matee"):
                c = _collective(faulty, args.size)
                s = lower_relays(build_for_sizes(c, [c.size], "halfring", sch)[0])
                plan = lower_schedule(s, op_overhead=nccl.op_overhead)
                event = simulate(s, mode="event").time
                model = predict(s, nccl).time
                bare = dataflow_time(s, 0.0, plan)
                lock = simulate(s).time
                old = predict(s, LOCKSTEP_NCCL_MODEL).time
                ratio = model / event
                print(f"| {dims_s} | {routing} | {'MATE' if sch == 'mate' else 'MATEe'} | "
                      f"{len(s.ops)} | {plan.n_lanes} | {len(set(plan.group.tolist()))} | "
                      f"{lock * 1e3:.2f} ms | {event * 1e3:.2f} ms | {model * 1e3:.2f} ms | "
                      f"{ratio:.3f}{' (slower)' if ratio > 1.02 else ''} | {bare * 1e3:.2f} ms | "
                      f"{old * 1e3:.2f} ms |", flush=True)


if __name__ == "__main__":
    main()
