"""Synthesis against both bounds on a machine of servers: the bandwidth bound every execution
model shares and, where the model runs lockstep steps, the lockstep bound (issue 32, item 5).

For AllGather, ReduceScatter and AllReduce over every GPU of ``examples/hgx16_leafspine.ccl``
(16 HGX servers, 128 GPUs) at 128 MiB, plans each collective as a user's ``algorithm synth``
would be planned for the runtime of each execution model (:mod:`cclc.execution`): ``ir``
(the IR's lockstep steps, ``--emit json``), ``mscclpp`` (lockstep with a signal per step),
``nccl`` and ``msccl`` (dataflow). Each row is the plan's verified schedule (synthesized, or a
template where the template race found one faster, as ``algorithm synth`` returns it), its
predicted time under that model, % of the best bound of :mod:`cclc.bounds` (bandwidth and
latency, LP included: what every model shares) and, under the lockstep models, % of the
lockstep bound of :mod:`cclc.lockstep_bound` (what no lockstep schedule beats; a dataflow
runtime does not wait for a step's slowest op, so it is not held to it).

    python benchmarks/lockstep_limits.py                       # 128 MiB, every kind and model
    python benchmarks/lockstep_limits.py --kinds allreduce --models ir
    python benchmarks/lockstep_limits.py --size 1024 --json out.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import dsl
from cclc.collective import CollectiveKind, Hint, make_collective
from cclc.execution import MODELS
from cclc.lockstep_bound import lockstep_bound
from cclc.plan import plan

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ("hgx16_leafspine.ccl", "cluster")
KINDS = (CollectiveKind.ALLGATHER, CollectiveKind.REDUCESCATTER, CollectiveKind.ALLREDUCE)
PLAN_MODELS = ("ir", "mscclpp", "nccl", "msccl")


def run_case(topo, kind: CollectiveKind, nominal: int, model: str) -> dict:
    """One row: ``kind`` of about ``nominal`` bytes over every live rank of ``topo``, planned
    with ``algorithm synth`` under ``model``."""
    group = topo.live_ranks()
    unit = 4 * len(group)                      # whole fp32 elements in every rank's block
    size = max(unit, round(nominal / unit) * unit)
    coll = make_collective(kind.value, kind, topo, group, size=size, algorithm=Hint("synth"))
    t0 = time.monotonic()
    p = plan(coll, model=MODELS[model])
    seconds = time.monotonic() - t0
    params = dict(p.schedule.params)
    lockstep = lockstep_bound(coll)
    return {"collective": kind.value, "ranks": len(group), "bytes": size, "model": model,
            "mode": MODELS[model].mode, "schedule": p.name,
            "status": params.get("status"), "template": params.get("template"),
            "chunks": params.get("chunks"), "time_s": p.time, "bound_s": p.bound,
            "bound": p.bounds.name if p.bounds is not None else None,
            "pct_of_bound": p.pct_of_bound,
            "lockstep_bound_s": lockstep.seconds if lockstep is not None else None,
            "pct_of_lockstep_bound": p.pct_of_lockstep_bound,
            "ops": len(p.schedule.ops), "steps": p.schedule.n_steps, "plan_s": seconds}


def _print(row: dict) -> None:
    lockstep = (f"{row['pct_of_lockstep_bound']:5.1f}% of the lockstep bound"
                if row["pct_of_lockstep_bound"] is not None else
                "(dataflow: no lockstep bound holds)")
    print(f"{row['collective']:<13} {row['model']:<8} {row['schedule']:<14} "
          f"{row['time_s'] * 1e6:8.1f} us  {row['pct_of_bound']:5.1f}% of bound "
          f"({row['bound']})  {lockstep}  {row['ops']} ops, {row['steps']} steps, "
          f"planned in {row['plan_s']:.0f} s", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=float, default=128, help="size in MiB (default 128)")
    ap.add_argument("--kinds", default="",
                    help="comma-separated collectives (allgather, reducescatter, allreduce)")
    ap.add_argument("--models", default="",
                    help=f"comma-separated execution models ({', '.join(PLAN_MODELS)})")
    ap.add_argument("--json", metavar="PATH", help="write the rows here")
    args = ap.parse_args(argv)
    kinds = [CollectiveKind(k) for k in args.kinds.split(",") if k] or list(KINDS)
    models = [m for m in args.models.split(",") if m] or list(PLAN_MODELS)
    for m in models:
        if m not in MODELS:
            ap.error(f"unknown model '{m}': use one of {', '.join(PLAN_MODELS)}")
    file, name = EXAMPLE
    topo = dsl.load(ROOT / "examples" / file).topologies[name]
    rows = []
    for kind in kinds:
        for model in models:
            rows.append(run_case(topo, kind, int(args.size * (1 << 20)), model))
            _print(rows[-1])
    if args.json:
        from meta import run_meta  # benchmarks/meta.py, beside this script

        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"meta": run_meta(argv), "example": f"{file}:{name}", "rows": rows},
                      f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
