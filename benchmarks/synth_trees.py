"""Synthesized tree schedules against every template and the lower bound (issue 14, trees).

For AllGather, ReduceScatter and AllReduce on the examples and on faulty tori that are not
among them, prints per case: the best lower bound of ``cclc.bounds`` (LP included where it runs),
``synth``'s predicted time and % of that bound (the synthesized schedule itself, ``race=0``:
``algorithm synth`` returns the template instead where the template is faster), the best
template's, and synth's solver status and solve time. Times are predictions of the lockstep
IR model (``cclc.execution.IR_MODEL``: the schedule's steps with barriers, alpha-beta links, no
software cost) under each topology's declared routing; none is a measurement on hardware.

    python benchmarks/synth_trees.py                 # 1 GiB and 128 MiB, every case
    python benchmarks/synth_trees.py --quick         # 128 MiB, the small cases
    python benchmarks/synth_trees.py --only mesh4x4 --kinds allreduce --sizes 1024,128
    python benchmarks/synth_trees.py --only 5x5x5 --kinds allreduce --budget 300
    python benchmarks/synth_trees.py --only hgx16 --kinds allgather --sizes 128 \
        --no-templates --chunks 4,8,16,32,64 --models ir,event,msccl --equal-chunks

``--chunks`` builds synth with each given pipeline depth instead of its own choice
(``--equal-chunks``: with chunks of one size, no tapered pipeline), and
``--models`` prints synth's % of the bound under each named execution model (``ir``, ``msccl``,
``nccl`` of :mod:`cclc.execution`, and ``event``: the event-driven simulator without any
software cost, the dataflow limit of a schedule). AllGather and ReduceScatter rows on
machines made of nodes add synth's % of the lockstep bound (:mod:`cclc.lockstep_bound`)
where it is above the bandwidth bound: what no schedule in the IR's lockstep model beats.

``--budget`` sets synth's time budget (30 s by default), as ``cclc compile --synth-budget``
does: on a machine shared with other jobs a larger one keeps the load from cutting the
packing short (the budget is wall-clock seconds, and the packers stop by themselves when no
round improves).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import dsl
from cclc.algorithms import BuildContext, algorithms_for, get
from cclc.bounds import bounds
from cclc.collective import CollectiveKind, Hint, make_collective
from cclc.execution import IR_MODEL, ExecutionModel, predict
from cclc.execution import MODELS as EXECUTION_MODELS
from cclc.lockstep_bound import lockstep_bound
from cclc.topology import torus, with_faults

KINDS = (CollectiveKind.ALLGATHER, CollectiveKind.REDUCESCATTER, CollectiveKind.ALLREDUCE)
EXAMPLES = ["torus4x4_failed_rank", "torus5x5_fault", "mesh4x4", "torus5x5x5",
            "tpuv4_4x4x4_ocs", "hgx_node", "fabric6_single_gpu", "pcie_oversubscribed",
            "hgx16_leafspine", "tpuv4_8x4x4"]
#: the models --models can name
MODELS = {**EXECUTION_MODELS,
          "event": ExecutionModel("event", "event", description="event mode, no software cost")}
QUICK = ["torus4x4_failed_rank", "torus5x5_fault", "mesh4x4", "hgx_node", "fabric6_single_gpu"]


def _faulty(name: str, dims, cuts) -> tuple[str, object]:
    """A torus of 32 GB/s links with both directions of each ``(coords, dim)`` link failed."""
    t = torus(name, dims, bandwidth=32e9, latency=1e-7)
    pairs = []
    for coords, dim in cuts:
        a = t.rank_at(coords)
        nxt = list(coords)
        nxt[dim] = (nxt[dim] + 1) % dims[dim]
        b = t.rank_at(nxt)
        pairs += [(a, b), (b, a)]
    return name, with_faults(t, pairs)


def _tori():
    """The faulty tori of the issue's text (not among the examples)."""
    return [
        _faulty("4x4x4 two faults", (4, 4, 4), [((0, 0, 0), 0), ((1, 2, 3), 1)]),
        _faulty("6x6 three faults", (6, 6), [((0, 0), 0), ((2, 3), 1), ((4, 5), 0)]),
        _faulty("3x3x3 one fault", (3, 3, 3), [((0, 0, 0), 0)]),
        _faulty("5x5 two in one ring", (5, 5), [((0, 0), 0), ((3, 0), 0)]),
        _faulty("5x5x5 two faults", (5, 5, 5), [((0, 0, 0), 0), ((2, 3, 4), 2)]),
    ]


def machines_of(names):
    """``(file:topology, topology)`` of every topology of the named examples."""
    here = os.path.join(os.path.dirname(__file__), "..", "examples")
    for name in names:
        program = dsl.load(os.path.join(here, f"{name}.ccl"))
        for tname, topo in program.topologies.items():
            yield f"{name}:{tname}", topo


def _machines(quick: bool):
    yield from machines_of(QUICK if quick else EXAMPLES)
    if not quick:
        yield from _tori()


def run_case(label: str, topo, kind: CollectiveKind, nominal: int,
             templates: bool = True, chunks: int | None = None, models=(),
             taper: bool = True, budget: float | None = None) -> dict:
    """One row: bound, synth and the best template at ``nominal`` bytes; synth with
    ``chunks`` chunks per tree when given (equal ones unless ``taper``) and ``budget``
    seconds (``None``: its default), and its time under each of ``models``."""
    group = topo.live_ranks()
    n = len(group)
    unit = 4 * n
    size = max(unit, round(nominal / unit) * unit)
    # named as the user would name it (under `auto` synth pipelines fewer chunks)
    coll = make_collective(kind.value, kind, topo, group, size=size, algorithm=Hint("synth"))
    bound = bounds(coll)
    t0 = time.monotonic()
    # the synthesized schedule itself
    s = get("synth").build(coll, context=BuildContext(synth_budget=budget), taper=int(taper),
                           **({} if chunks is None else {"chunks": chunks}))
    build_s = time.monotonic() - t0
    synth_t = predict(s, IR_MODEL).time
    row = {"case": label, "kind": kind.value, "n": n, "bytes": size, "bound_s": bound.best,
           "bound": bound.name, "synth_s": synth_t, "ops": len(s.ops), "build_s": build_s,
           **{k: v for k, v in s.params}, "template": None, "template_s": None,
           "models": {m: predict(s, MODELS[m]).time for m in models}}
    lockstep = lockstep_bound(coll)
    if lockstep is not None and lockstep.seconds > bound.best:
        row["lockstep_bound_s"] = lockstep.seconds
    if templates:
        for algo in algorithms_for(coll):
            if algo.name == "synth" or algo.applicable(coll) is not None:
                continue
            t = predict(algo.build(coll), IR_MODEL).time
            if row["template_s"] is None or t < row["template_s"]:
                row["template"], row["template_s"] = algo.name, t
    return row


def _print(row: dict) -> None:
    def pct(t):
        return f"{100 * row['bound_s'] / t:6.1f}%" if t else "     -"

    tmpl = (f"{row['template']:<22} {pct(row['template_s'])}" if row["template"]
            else f"{'-':<22}      -")
    slower = " SLOWER than the template" if row["template_s"] and \
        row["synth_s"] > row["template_s"] * (1 + 1e-9) else ""
    print(f"{row['case']:<34} {row['kind']:<13} n={row['n']:<4} {row['bytes'] >> 20:>5} MiB  "
          f"bound {row['bound']:<10} synth {pct(row['synth_s'])} ({row['status']}, solve "
          f"{row['solve_s']:.1f} s, {row['ops']} ops, {row['chunks']} chunks"
          f"{' tapered, ' + str(row['units']) + ' units per tree' if 'units' in row else ''})"
          f"  best template "
          f"{tmpl}{slower}"
          + (f"  {100 * row['lockstep_bound_s'] / row['synth_s']:.1f}% of the lockstep bound"
             if "lockstep_bound_s" in row else "")
          + "".join(f"  {m} {pct(t).strip()}" for m, t in row["models"].items()),
          flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="128 MiB on the small examples")
    ap.add_argument("--no-templates", action="store_true", help="skip the template column")
    ap.add_argument("--only", default="", help="only cases whose name contains this text")
    ap.add_argument("--sizes", default="", help="comma-separated sizes in MiB")
    ap.add_argument("--budget", type=float, default=None,
                    help="synth's time budget in seconds (default: its own, 30)")
    ap.add_argument("--kinds", default="",
                    help="comma-separated collectives (allgather, reducescatter, allreduce)")
    ap.add_argument("--chunks", default="",
                    help="comma-separated pipeline depths to build synth with (default: its own)")
    ap.add_argument("--equal-chunks", action="store_true",
                    help="no tapered pipelines (synth's taper = 0): chunks of one size")
    ap.add_argument("--models", default="",
                    help=f"comma-separated execution models to predict synth under too "
                         f"({', '.join(MODELS)})")
    args = ap.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    for m in models:
        if m not in MODELS:
            ap.error(f"unknown model '{m}': use one of {', '.join(MODELS)}")
    depths = [int(x) for x in args.chunks.split(",")] if args.chunks else [None]
    sizes = [128 << 20] if args.quick else [1 << 30, 128 << 20]
    if args.sizes:
        sizes = [int(float(x) * (1 << 20)) for x in args.sizes.split(",")]
    print("predicted by the ir model: lockstep steps, no software cost; % of the best "
          "lower bound of cclc.bounds")
    kinds = [CollectiveKind(x) for x in args.kinds.split(",")] if args.kinds else KINDS
    for label, topo in _machines(args.quick):
        if args.only not in label:
            continue
        for kind in kinds:
            for size in sizes:
                for chunks in depths:
                    _print(run_case(label, topo, kind, size, not args.no_templates,
                                    chunks, models, not args.equal_chunks, args.budget or None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
