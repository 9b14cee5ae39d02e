"""Synthesis against both bounds on a machine of servers: the bandwidth bound every execution
model shares and, where the model runs lockstep steps, the lockstep bound (issue 32, item 5).

For AllGather, ReduceScatter and AllReduce over every GPU of ``examples/hgx16_leafspine.ccl``
(16 HGX servers, 128 GPUs) at 128 MiB, plans each collective as a user's ``algorithm synth``
would be planned for the runtime of each execution model (:mod:`cclc.execution`): ``ir`` (the
IR's lockstep steps, ``--emit json``), ``mscclpp`` (lockstep, a signal round trip per step
between ranks), ``nccl`` and ``msccl`` (dataflow). Each row is the plan's verified schedule
(synthesized, or a template where the template race found one faster, as ``algorithm synth``
returns it), its predicted time under that model, % of the best bound of :mod:`cclc.bounds`
(bandwidth and latency, LP included: what every model shares) and, under the lockstep models, %
of the lockstep bound of :mod:`cclc.lockstep_bound` (what no lockstep schedule beats; a
dataflow runtime does not wait for a step's slowest op, so it is not held to it).

    python benchmarks/lockstep_limits.py                       # 128 MiB, every kind and model
    python benchmarks/lockstep_limits.py --kinds allreduce --models ir
    python benchmarks/lockstep_limits.py --size 1024 --json out.json
    python benchmarks/lockstep_limits.py --kinds allreduce --models ir --gap

Every lockstep row also says where its time goes (:func:`step_breakdown`, the IR's lockstep
model without software cost): ``time = bottleneck + excess + latency``, the whole-run busy
time of the busiest link, what the steps' busiest links add to it (steps that one link does
not set: a pipeline's fill and drain, imbalance), and the route latency of the op that sets
each step. With ``--gap``, rows of synth's trees under the ``ir`` model also get the floors
of their pipeline (:func:`pipeline_floors`): the least lockstep time of synth's packings
over pipeline depths, with chunk sizes free (the taper's LP, before rounding to whole units)
and with every level moving its own share per step (buffered: :func:`stage_flow_time`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

import dsl
from cclc.algorithms.tree_costs import block_bytes
from cclc.algorithms.tree_search import synthesize_trees
from cclc.bounds import vertex_nodes
from cclc.collective import Collective, CollectiveKind, Hint, make_collective
from cclc.execution import MODELS
from cclc.ir import Schedule
from cclc.lockstep_bound import lockstep_bound
from cclc.plan import plan
from cclc.sim import prepare, simulate
from cclc.synth.phase_time import edge_levels
from cclc.synth.taper import LinkLoads, link_loads
from cclc.synth.tree_time import edge_starts

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ("hgx16_leafspine.ccl", "cluster")
KINDS = (CollectiveKind.ALLGATHER, CollectiveKind.REDUCESCATTER, CollectiveKind.ALLREDUCE)
PLAN_MODELS = ("ir", "mscclpp", "nccl", "msccl")


def step_breakdown(schedule: Schedule) -> dict:
    """Where the IR lockstep time of ``schedule`` goes (no software cost): ``time_s`` =
    ``bottleneck_s`` (the busiest link's busy time over the whole run) + ``excess_s`` (what
    the steps' busiest links add to it) + ``latency_s`` (per step, the route latency of the
    op that sets it); ``steps`` that take time, ``network_steps`` among them (some op crosses
    between nodes; ``None`` on a machine not made of nodes)."""
    r = simulate(schedule)
    p = prepare(schedule)
    step = schedule.ops.step.astype(np.int64)
    setter = np.asarray(r.critical_path, dtype=np.int64)   # the op that sets each step
    latency = float(p.route_latency[setter].sum()) if len(setter) else 0.0
    bottleneck = float(r.link_busy.max()) if len(r.link_busy) else 0.0
    topo = schedule.topology
    network = None
    if topo.node_of_rank is not None:
        vnode = vertex_nodes(topo)
        crossing = vnode[topo.link_src] != vnode[topo.link_dst]
        ops = np.unique(p.pair_op[crossing[p.pair_link]])
        network = int(len(np.unique(step[ops])))
    return {"time_s": float(r.time), "bottleneck_s": bottleneck,
            "excess_s": float(r.time) - latency - bottleneck, "latency_s": latency,
            "steps": int((r.step_time > 0).sum()), "network_steps": network}


def stage_flow_time(loads: LinkLoads, chunks: int, tree_bytes: float, alpha: float = 0.0,
                    buffered: bool = True) -> float:
    """The least lockstep time (seconds) of a tree pipeline of ``chunks`` steps per level.

    ``loads``: :func:`cclc.synth.taper.link_loads` with ``latency`` of the tree edges and
    their first steps; the edges that start in step ``s`` are level ``s``, active in steps
    ``s .. s + chunks - 1`` (as in synth's pipelines, which charge those steps the latency of
    the level's moves). Level ``s`` moves ``y[s, t]`` of every tree's ``tree_bytes`` in step
    ``t``, at most what the level before it has moved by step ``t - 1``; each step lasts
    ``alpha`` plus the most over ``loads``' rows of latency plus busy time. Without
    ``buffered``, every level moves chunk ``c`` in step ``s + c`` (``y[s, s + c] = w[c]``):
    the taper's LP (:func:`cclc.synth.taper.tapered_units` before its rounding). Buffered, a
    level may move ahead of the one after it, so the value is at most the unbuffered one.
    """
    # OR-Tools (0.1-0.4 s to import) only when this model is solved
    from ortools.linear_solver import pywraplp

    assert loads.latency is not None and loads.starts is not None, "link_loads(latency=True)"
    rates = loads.rates * tree_bytes * 1e6              # microseconds: a well-scaled LP
    levels = np.flatnonzero(loads.active).tolist()
    solver = pywraplp.Solver.CreateSolver("GLOP")
    y = {(s, t): solver.NumVar(0.0, 1.0, f"y{s}_{t}") for s in levels
         for t in range(s, s + chunks)}
    for s in levels:
        solver.Add(solver.Sum([y[s, t] for t in range(s, s + chunks)]) == 1.0)
    for before, s in zip(levels, levels[1:], strict=False):
        for t in range(s, s + chunks):
            moved = [y[before, u] for u in range(before, min(t, before + chunks))]
            solver.Add(solver.Sum([y[s, u] for u in range(s, t + 1)]) <= solver.Sum(moved))
            if not buffered:
                solver.Add(y[s, t] == y[levels[0], t - s + levels[0]])
    total = []
    for t in range(levels[0], levels[-1] + chunks):
        d = solver.NumVar(0.0, solver.infinity(), f"d{t}")
        total.append(d)
        for row in range(rates.shape[0]):
            on = [s for s in levels if loads.starts[row, s] and s <= t < s + chunks]
            if on:
                solver.Add(d >= (float(loads.latency[row]) + alpha) * 1e6 + solver.Sum(
                    [float(rates[row, s]) * y[s, t] for s in levels if (s, t) in y]))
    solver.Minimize(solver.Sum(total))
    if solver.Solve() != pywraplp.Solver.OPTIMAL:
        raise RuntimeError(f"the pipeline LP of {chunks} chunks found no optimum")
    return solver.Objective().Value() / 1e6


def tree_loads(coll: Collective) -> tuple[LinkLoads, float]:
    """The link loads of synth's packing for ``coll`` (synthesized again: the planner's
    schedule does not keep it) and the bytes of one tree."""
    syn = synthesize_trees(coll)
    assert syn is not None, "no packing within the default budget"
    packing = syn.ag or syn.rs
    assert packing is not None
    if syn.ag is not None and syn.rs is not None:
        start, move = edge_starts(syn.rs, syn.ag)
    else:
        start, move = edge_levels(packing, syn.ag is None)
    loads = link_loads(syn.graph, start, move, prune=True, latency=True)
    return loads, block_bytes(coll) / packing.k


def pipeline_floors(coll: Collective, depths: range = range(2, 25)) -> dict:
    """The least lockstep time of synth's packings for ``coll`` over pipeline ``depths``
    (chunks per tree): ``chunk_floor_s`` with chunk sizes free, ``buffered_floor_s`` with
    every level's share per step free (:func:`stage_flow_time`), each with its depth, from
    :func:`tree_loads`."""
    loads, tree_bytes = tree_loads(coll)
    out: dict = {}
    for key, buffered in (("chunk", False), ("buffered", True)):
        timed = {c: stage_flow_time(loads, c, tree_bytes, buffered=buffered) for c in depths}
        best = min(timed, key=lambda c: timed[c])
        out[f"{key}_floor_s"], out[f"{key}_floor_chunks"] = timed[best], best
    return out


def run_case(topo, kind: CollectiveKind, nominal: int, model: str, gap: bool = False) -> dict:
    """One row: ``kind`` of about ``nominal`` bytes over every live rank of ``topo``, planned
    with ``algorithm synth`` under ``model``; with ``gap``, the floors of synth's pipeline
    (:func:`pipeline_floors`) where the row is synth's trees under the ``ir`` model."""
    group = topo.live_ranks()
    unit = 4 * len(group)                      # whole fp32 elements in every rank's block
    size = max(unit, round(nominal / unit) * unit)
    coll = make_collective(kind.value, kind, topo, group, size=size, algorithm=Hint("synth"))
    t0 = time.monotonic()
    p = plan(coll, model=MODELS[model])
    seconds = time.monotonic() - t0
    params = dict(p.schedule.params)
    lockstep = lockstep_bound(coll)
    row: dict[str, object] = {
            "collective": kind.value, "ranks": len(group), "bytes": size, "model": model,
            "mode": MODELS[model].mode, "schedule": p.name,
            "status": params.get("status"), "template": params.get("template"),
            "chunks": params.get("chunks"), "time_s": p.time, "bound_s": p.bound,
            "bound": p.bounds.name if p.bounds is not None else None,
            "pct_of_bound": p.pct_of_bound,
            "lockstep_bound_s": lockstep.seconds if lockstep is not None else None,
            "pct_of_lockstep_bound": p.pct_of_lockstep_bound,
            "ops": len(p.schedule.ops), "steps": p.schedule.n_steps, "plan_s": seconds}
    if MODELS[model].mode == "lockstep":
        row["breakdown"] = step_breakdown(p.schedule)
    if gap and model == "ir" and p.name == "synth" and params.get("status") != "fallback":
        row["floors"] = pipeline_floors(coll)
    return row


def _print(row: dict) -> None:
    lockstep = (f"{row['pct_of_lockstep_bound']:5.1f}% of the lockstep bound"
                if row["pct_of_lockstep_bound"] is not None else
                "(dataflow: no lockstep bound holds)")
    print(f"{row['collective']:<13} {row['model']:<8} {row['schedule']:<14} "
          f"{row['time_s'] * 1e6:8.1f} us  {row['pct_of_bound']:5.1f}% of bound "
          f"({row['bound']})  {lockstep}  {row['ops']} ops, {row['steps']} steps, "
          f"planned in {row['plan_s']:.0f} s", flush=True)
    if "breakdown" in row:
        b = row["breakdown"]
        print(f"    IR lockstep time {b['time_s'] * 1e6:.1f} us = busiest link "
              f"{b['bottleneck_s'] * 1e6:.1f} + other links setting steps "
              f"{b['excess_s'] * 1e6:.1f} + latency "
              f"{b['latency_s'] * 1e6:.1f} us over {b['steps']} steps "
              f"({b['network_steps']} between nodes)", flush=True)
    if "floors" in row:
        f = row["floors"]
        print(f"    synth's trees at best: {f['chunk_floor_s'] * 1e6:.1f} us with free chunk "
              f"sizes ({f['chunk_floor_chunks']} chunks), {f['buffered_floor_s'] * 1e6:.1f} us "
              f"buffered ({f['buffered_floor_chunks']})", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=float, default=128, help="size in MiB (default 128)")
    ap.add_argument("--kinds", default="",
                    help="comma-separated collectives (allgather, reducescatter, allreduce)")
    ap.add_argument("--models", default="",
                    help=f"comma-separated execution models ({', '.join(PLAN_MODELS)})")
    ap.add_argument("--json", metavar="PATH", help="write the rows here")
    ap.add_argument("--gap", action="store_true",
                    help="also the floors of synth's tree pipelines (ir model rows)")
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
            rows.append(run_case(topo, kind, int(args.size * (1 << 20)), model, args.gap))
            _print(rows[-1])
    if args.json:
        from meta import run_meta  # benchmarks/meta.py, beside this script

        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"meta": run_meta(argv), "example": f"{file}:{name}", "rows": rows},
                      f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
