"""``cclc sim FILE``: time a schedule document and compare it with the lower bounds."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from backends import load as load_backend
from backends.contract import EmitOptions
from cclc.algorithms.nic_spread import spread_note
from cclc.bounds import Bounds, bounds
from cclc.collective import Collective
from cclc.errors import CclError, ScheduleError
from cclc.execution import IR_MODEL, predict
from cclc.nccl_model import bus_factor
from cclc.progress import Progress
from cclc.sim import busiest_links, simulate
from cclc.verify import verify

if TYPE_CHECKING:
    from cclc.ir import Schedule
    from cclc.symmetric import ExceptedSchedule, SymmetricSchedule
    from cclc.topology import Topology

__all__ = ["add_parser", "run"]

HELP = """Simulate a schedule document (the JSON that 'cclc compile' writes) on its topology with
the alpha-beta cost model: every link costs latency + bytes / bandwidth, messages that cross a
link in the same step share it, a route's bytes stream through its hops at once (cut-through).

  lockstep  steps run one after another; a step lasts as long as its slowest op
            (route latency + busy time of the busiest link on its route)
  event     no barriers: an op starts when the ops that wrote its input chunks (and the
            readers of the chunks it overwrites) have finished and its links are free, so
            pipelining across steps shows

Prints the time, the algorithm and bus bandwidths (nccl-tests definitions), the strongest
lower bound and "% of bound" (bound / time; 100% is optimal), and the busiest links; with
--steps a table of every step.

A schedule stored by symmetry (what 'cclc compile' writes for a large torus: one
representative op per orbit of its translations) is verified and timed in its own form,
never expanded, in lockstep only.

examples:
  cclc sim out/a2a.schedule.json
  cclc sim --mode event --steps out/a2a.schedule.json
  cclc sim --links 10 --no-lp out/grads.schedule.json
  cclc sim --backend nccl out/a2a.schedule.json      # also the time as the NCCL library runs it
  cclc sim --backend mscclpp out/grads.schedule.json # ... and as MSCCL++ runs it, or why not"""


def add_parser(sub) -> None:
    p = sub.add_parser("sim", help="simulate a schedule and compare it with the lower bound",
                       description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file", metavar="FILE.schedule.json", help="the schedule document")
    p.add_argument("--mode", choices=("lockstep", "event"), default="lockstep",
                   help="cost model (default: lockstep)")
    p.add_argument("--backend", action="append",
                   choices=("nccl", "nccl-onesided", "msccl", "mscclpp"), default=[],
                   help="also print the time under this backend's execution model (lockstep "
                        "or dataflow, with its software overhead; repeatable), and why that "
                        "output would refuse the schedule, if it would")
    p.add_argument("--steps", action="store_true", help="print the per-step breakdown")
    p.add_argument("--links", type=int, default=5, metavar="N",
                   help="how many of the busiest links to list (default: 5)")
    p.add_argument("--no-lp", action="store_true",
                   help="skip the LP bounds, lp and routes (closed-form bounds only; faster "
                        "on big groups)")
    p.set_defaults(run=run)


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.3f} us"


def _gbps(bw: float) -> str:
    return f"{bw / 1e9:.3f} GB/s"


def run(args) -> int:
    # cclc.serialize, cclc.symmetric only when this runs, not for cclc --help
    from cclc.serialize import read_document
    from cclc.symmetric import ExceptedSchedule, SymmetricSchedule

    if args.links < 0:
        raise CclError(f"--links must be >= 0, got {args.links}")
    progress = Progress(lambda line: print(line, file=sys.stderr, flush=True))
    with progress.stage(f"reading {args.file}"):
        # a bad file raises CclError: the CLI exits 2
        schedule = read_document(args.file)
    if isinstance(schedule, SymmetricSchedule | ExceptedSchedule):
        return _run_form(args, schedule, progress)
    if not _verified(args, progress, f"{len(schedule.ops)} ops", lambda: verify(schedule)):
        return 1
    coll = schedule.collective
    topo = schedule.topology
    with progress.stage(f"simulating {len(schedule.ops)} ops ({args.mode})"):
        result = simulate(schedule, mode=args.mode)
    bound = _bounds(args, progress, coll)
    _print_head(schedule, str(len(schedule.ops)), result.n_steps, args.mode, result.time)
    backends = [load_backend(name) for name in args.backend]
    preds = [predict(schedule, b.execution_model or IR_MODEL) for b in backends]
    for name, b, pred in zip(args.backend, backends, preds, strict=True):
        print(f"  as {name:<8} {_us(pred.time)} ({pred.model.label}; routing {topo.routing})")
        if pred.planned_time is not None:
            print(f"  {'':<11} {_us(pred.planned_time)} with cclc's planned spines: a plan "
                  "that needs a routing mechanism")
        # a time of what that output would not write is no time of what runs: say so
        why = b.refusal(schedule, EmitOptions())
        if why is not None:
            print(f"  {'':<11} but --emit {name} refuses this schedule: {why}")
    if (spread := spread_note(schedule)) is not None:
        print(f"  {spread}")
    _print_rates_and_bound(coll, result.time, bound, preds[0].time if preds else None)
    _print_links(topo, result.link_bytes, result.link_busy, result.time, args.links)
    if args.steps:
        _print_steps(topo, result.step_start, result.step_time, result.step_bytes,
                     result.step_busiest_link)
    return 0


def _run_form(args, schedule: SymmetricSchedule | ExceptedSchedule, progress: Progress) -> int:
    """``run`` on a schedule stored by symmetry: verified and timed by its form's own
    verifier and lockstep simulator (:mod:`cclc.symmetric_plan`), never expanded."""
    # cclc.symmetric_plan only when this runs, not for cclc --help
    from cclc.symmetric_plan import describe_form, simulate_form, verify_form

    whole = f"{schedule.expanded_ops():,} ops"
    if args.mode != "lockstep" or args.backend:
        asked = (f"--mode {args.mode}" if args.mode != "lockstep"
                 else f"--backend {args.backend[0]}")
        print(f"{args.file}: {asked} needs every op of the whole schedule, and this one is "
              f"stored by symmetry ({whole}): its form is timed in lockstep only (the IR "
              "model); run without it", file=sys.stderr)
        return 2
    ops = f"{len(schedule.ops):,} representative ops"
    if not _verified(args, progress, ops, lambda: verify_form(schedule)):
        return 1
    topo = schedule.topology
    with progress.stage(f"simulating {ops} (lockstep)"):
        result = simulate_form(schedule, IR_MODEL)
    bound = _bounds(args, progress, schedule.collective)
    _print_head(schedule, f"{ops} for {whole} ({describe_form(schedule)})",
                len(result.step_time), "lockstep", result.time)
    _print_rates_and_bound(schedule.collective, result.time, bound, None)
    _print_links(topo, result.link_bytes, result.link_bytes / topo.link_bandwidth,
                 result.time, args.links)
    if args.steps:
        # lockstep: a step starts when the one before it ends
        start = np.concatenate([[0.0], np.cumsum(result.step_time)[:-1]])
        _print_steps(topo, start, result.step_time, result.step_bytes,
                     result.step_busiest_link)
    return 0


def _verified(args, progress: Progress, ops: str, check: Callable[[], None]) -> bool:
    """Whether ``check`` (the verifier) passes; says why not (timing a schedule that does not
    do its job would report meaningless numbers)."""
    try:
        with progress.stage(f"verifying {ops}"):
            check()
    except ScheduleError as err:
        print(f"error: {args.file} fails verification, so it is not simulated:\n{err.message}",
              file=sys.stderr)
        return False
    return True


def _bounds(args, progress: Progress, coll: Collective) -> Bounds:
    with progress.stage(f"computing the lower bounds of {coll.n} ranks"):
        return bounds(coll, lp=not args.no_lp)


def _print_head(schedule: Schedule | SymmetricSchedule | ExceptedSchedule, ops: str,
                steps: int, mode: str, time: float) -> None:
    coll = schedule.collective
    print(f"{coll.name}: {coll.kind.value} of {coll.size} B on {coll.n} ranks of "
          f"'{coll.topology.name}', algorithm {schedule.algorithm}, schedule "
          f"{schedule.schedule}")
    print(f"  ops {ops}, steps {steps}, mode {mode}")
    print(f"  time        {_us(time)} ({mode}, no software cost, the routes as written)")


def _print_rates_and_bound(coll: Collective, time: float, bound: Bounds,
                           backend_time: float | None) -> None:
    """The rates, the strongest bound and % of it, the comparison with NCCL and the bounds'
    notes (``backend_time``: the first ``--backend``'s time, which charges software cost)."""
    # cclc.nccl_comparison only when this runs, not for cclc --help
    from cclc.nccl_comparison import compare_with_nccl

    moves = time > 0
    # nothing crosses a link (a one-rank group): rates and ratios have no meaning
    algbw = coll.size / time if moves else 0.0
    print(f"  algbw       {_gbps(algbw) if moves else '-'}")
    print(f"  busbw       {_gbps(algbw * bus_factor(coll.kind, coll.n)) if moves else '-'}")
    best = bound.best_bound
    print(f"  bound       {_us(best.seconds)} ({best.name}: {best.description})")
    pct = f"{100.0 * best.seconds / time:.1f}%" if moves else "- (nothing to move)"
    print(f"  % of bound  {pct}")
    if backend_time is not None:    # like for like
        baseline = compare_with_nccl(coll, backend_time)
    else:
        baseline = compare_with_nccl(coll, time, software_cost=False)
    if baseline:
        print(f"  {baseline}")
    for note in bound.notes:
        print(f"  note: {note}")


def _print_steps(topo: Topology, start: np.ndarray, time: np.ndarray, moved: np.ndarray,
                 busiest: tuple[int | None, ...]) -> None:
    """The ``--steps`` table: every step's start, time, bytes and busiest link."""
    print("  step        start          time         bytes  busiest link")
    for s, link in enumerate(busiest):
        name = "-" if link is None else topo.link_name(link)
        print(f"  {s:>4} {start[s] * 1e6:>12.3f} {time[s] * 1e6:>13.3f} {moved[s]:>13.0f}  "
              f"{name}")
    print("  (times in us)")


def _print_links(topo: Topology, link_bytes: np.ndarray, link_busy: np.ndarray, time: float,
                 k: int) -> None:
    """The ``k`` busiest links (busiest first, unused ones left out) with their bytes, busy
    time and share of the schedule's time."""
    links = busiest_links(link_busy, k)
    if len(links):
        print("  busiest links:")
        for link in links.tolist():
            util = link_busy[link] / time if time > 0 else 0.0
            print(f"    {topo.link_name(link):<32} {link_bytes[link]:>14.0f} B  "
                  f"busy {_us(link_busy[link]):>14}  {100 * util:5.1f}%")
