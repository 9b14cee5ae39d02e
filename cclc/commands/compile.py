"""``cclc compile FILE -o DIR``: the arguments and the printing around :mod:`cclc.pipeline`."""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

import numpy as np

import backends
from backends.contract import EmitOptions
from backends.msccl.runtimes import RUNTIMES
from cclc.algorithms.nic_spread import spread_note
from cclc.commands.argtypes import path_named
from cclc.dataflow import lower_schedule
from cclc.errors import CclError, ScheduleError
from cclc.execution import NCCL_GROUP_OVERHEAD
from cclc.lane_cost import DEFAULT_LANE_MEMORY, choose_lanes, plan_entries, schedule_lane_cost
from cclc.pipeline import Compiled, Events, Request, compile_program
from cclc.plan import hint_key
from cclc.progress import Progress
from cclc.units import format_time

__all__ = ["add_parser", "format_candidates", "parse_emit", "run"]

HELP = """Compile every collective of a .ccl file into a verified schedule.

Writes topology-<name>.json (the elaborated topology) and <collective>.schedule.json per
collective into DIR, plus whatever the other emitters produce. Every schedule is verified before
anything is written for it; one that fails verification is never written (the command says why
and exits 1). An output a schedule cannot take (e.g. a runtime limit of MSCCL) is reported and
the other outputs are still written; the command then exits 1. With algorithm auto a
candidate that an output refuses for its chunks (MSCCL's equal chunks) ranks after every
candidate all outputs take (--explain says "refused by an output"). Files cclc did not write
are never overwritten without --force (cclc keeps a list of its files in
DIR/.cclc-manifest.json). A run locks DIR while it writes: a second compile or tune into DIR
meanwhile is refused at once (exit 2) and writes nothing.

Times are predicted under the execution model of the first code-emitting backend in --emit
(nccl: dataflow lanes with a per-group cost; nccl-onesided: each rank's ops in order with
a per-message signal cost; mscclpp: lockstep between peers with a signal round trip per step;
msccl: dataflow with a per-op cost; json only: the IR's plain lockstep) and the topology's
declared routing; every printed time names
its model, and a note says which output chose it (the same file may choose another algorithm
with another --emit). On an ECMP fabric the time with cclc's planned spines is printed beside
it, as a plan. With mscclpp in --emit, every op between servers is routed through its GPUs' own
NICs (MSCCL++'s port channels take no other path), for every output of the run.

examples:
  cclc compile examples/torus5x5.ccl -o out/
  cclc compile examples/torus5x5_fault.ccl -o out/ --explain
  cclc compile cluster.ccl -o out/ --only grads --algorithm ring --emit json,msccl"""


def _outputs() -> tuple[str, ...]:
    """The backends ``--emit`` takes, read when the flag is parsed: the table may have grown
    since this module was imported (a test's stand-in backend)."""
    return backends.SCHEDULE_BACKENDS


def _runtimes() -> list[str]:
    return list(RUNTIMES)


def add_parser(sub) -> None:
    p = sub.add_parser("compile", help="compile a .ccl file into verified schedules",
                       description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file", metavar="FILE.ccl", help="the file to compile")
    p.add_argument("-o", "--output", required=True, metavar="DIR",
                   type=path_named,
                   help="output folder (created if missing)")
    p.add_argument("--emit", default="json", metavar="LIST",
                   help=f"comma-separated outputs: {', '.join(_outputs())} (default: json)")
    p.add_argument("--explain", action="store_true",
                   help="print every candidate algorithm with its lower bound, simulated time "
                        "and %% of the lower bound, or why it was pruned or does not apply")
    p.add_argument("--force", action="store_true",
                   help="replace files in DIR that cclc did not write")
    p.add_argument("--algorithm", metavar="NAME",
                   help="use this algorithm for every compiled collective (overrides the file; "
                        "'a+s' also sets the schedule; parameters such as chunks=6 are written "
                        "in the file, not here)")
    p.add_argument("--only", metavar="NAME", action="append",
                   help="compile only this collective (repeatable)")
    p.add_argument("--msccl-runtime", default="msccl", choices=_runtimes(),
                   help="MSCCL XML dialect and limits for --emit msccl: microsoft/msccl, the "
                        "msccl executor for NCCL, or RCCL (default: msccl)")
    p.add_argument("--no-size-check", action="store_true",
                   help="plan even when the up-front estimate says a schedule is too large "
                        "(over 20M ops) or the machine has too little memory or time for it")
    p.add_argument("--msccl-max-bytes", type=_byte_count, metavar="BYTES",
                   help="MSCCL maxBytes: the largest call the XML serves (default: the compiled "
                        "size; microsoft/msccl allocates scratch for it at init; 0 means no "
                        "bound for msccl-executor and rccl)")
    p.add_argument("--build", action="store_true",
                   help="with --emit nccl or nccl-onesided, also build libcclc_<name>.so "
                        "(nvcc, NCCL headers "
                        "from the nvidia-nccl-cu13 wheel or NCCL_HOME)")
    p.add_argument("--nccl-lane-memory", type=_memory_size, metavar="SIZE",
                   help="with --emit nccl, the most device memory per rank NCCL's buffers for "
                        "the library's lane communicators may take (an estimate from NCCL's "
                        "source); fewer lanes and fewer CTAs per lane fit a smaller budget "
                        "(bytes, or with a K, M, G or T suffix (binary); default 2G)")
    p.add_argument("--synth-budget", type=_seconds, metavar="SECONDS",
                   help="time budget of algorithm synth for every collective (auto included; "
                        "lifts synth's rank limit under auto); past it synth falls back to the "
                        "best template")
    p.set_defaults(run=run)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected seconds > 0, not '{text}'")
    return value


def _byte_count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a byte count (an integer >= 0), not "
                                         f"'{text}'")
    return value


_SUFFIXES = {"": 1, "K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30, "T": 2 ** 40}


def _memory_size(text: str) -> int:
    """A byte count > 0, optionally with a binary K/M/G/T suffix (``512M``, ``2G``)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*", text, flags=re.IGNORECASE)
    value = int(float(m.group(1)) * _SUFFIXES[m.group(2).upper()]) if m else 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a memory size > 0 such as 2G, 512M or "
                                         f"1073741824 (bytes), not '{text}'")
    return value


def load_program(path: str):
    """``dsl.load(path)``; a seam so the command can be tested on hand-built programs."""
    # the .ccl front end (lark, ~0.3 s to import) only when a .ccl file is read, not for cclc --help
    import dsl

    return dsl.load(path)


def _progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def parse_emit(text: str) -> list[str]:
    """The output names of ``--emit``; :class:`CclError` names an unknown one."""
    known = _outputs()
    names = [n.strip() for n in text.split(",")]
    if not any(names) or not all(names):
        raise CclError("--emit takes a comma-separated list of outputs without empty items, "
                       "from: " + ", ".join(known))
    for n in names:
        if n not in known:
            raise CclError(f"unknown emitter '{n}' in --emit; known: {', '.join(known)}")
    return list(dict.fromkeys(names))


def format_candidates(p, pinned_by: str | None = None, outdone_by: str | None = None) -> str:
    """The ``--explain`` table of a :class:`~cclc.plan.Plan` (times under its model);
    ``pinned_by`` says who named the algorithm ("the file", "--algorithm") when it was not
    chosen by speed; ``outdone_by`` names the schedule stored by symmetry that was kept
    instead of the plan's fastest whole candidate."""
    rows = [("candidate", "lower bound", f"time ({p.model.name} model)", "% of bound", "note")]
    usable = {c.name for c in p.candidates if c.applicable}
    usable |= {name.split("+")[0] for name in usable}
    faster = [c.name for c in p.candidates if c.applicable and c.time is not None
              and p.time is not None and c.time < p.time * (1 - 1e-9)]
    for c in p.candidates:
        if c.applicable:
            t = format_time(c.time) if c.time is not None else "-"
            pct = f"{c.pct_of_bound:.1f}%" if c.pct_of_bound is not None else "-"
            note = ""
            if c.name == p.name and outdone_by is not None:
                note = f"the fastest whole candidate; {outdone_by} (stored by symmetry) is faster"
            elif c.name == p.name:
                note = "chosen" if pinned_by is None else f"pinned by {pinned_by}"
                if pinned_by is not None and faster:
                    note += f" ({', '.join(faster)} faster)"
            if c.planned_time is not None:
                note = (note + "; " if note else "") + \
                    f"planned spines {format_time(c.planned_time)} (a plan)"
            if c.pruned is not None:
                note = f"pruned: {c.pruned}"
            if c.refused is not None:
                note = f"refused by an output: {c.refused}"
        else:
            t, pct, note = "-", "-", f"not applicable: {_suggest_usable(c.reason, usable)}"
        est = format_time(c.estimate) if c.estimate is not None else "-"
        rows.append((c.name, est, t, pct, note))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  " + "  ".join(r[i].ljust(widths[i]) for i in range(4)) + "  " + r[4]
             for r in rows]
    return "\n".join(line.rstrip() for line in lines)


_SUGGESTION = re.compile(r"use ([\w+]+(?: or [\w+]+)*)")


def _suggest_usable(reason: str, usable: set[str]) -> str:
    """``reason`` with its "use A or B" advice cut to the candidates that apply here."""
    def keep(m: re.Match) -> str:
        names = m.group(1).split(" or ")
        kept = [n for n in names if n in usable]
        if kept:
            return "use " + " or ".join(kept)
        return " and ".join(names) + (" does" if len(names) == 1 else " do") + \
            " not apply here either"
    return _SUGGESTION.sub(keep, reason)


class _Printer(Events):
    """The pipeline's events as the command's output: results on stdout, progress on stderr."""

    def __init__(self, args):
        self.args = args
        self.folder = Path(args.output)
        self.progress = Progress(_progress)
        self.started = 0.0

    def stage(self, what: str):
        return self.progress.stage(what)

    def note(self, message: str) -> None:
        _progress(f"note: {message}")

    def priced(self, model, reason: str) -> None:
        print(f"note: {reason}")

    def start(self, coll) -> None:
        self.started = time.perf_counter()
        _progress(f"compiling {coll.name}: {coll.kind.value} on {coll.n} ranks of "
                  f"{coll.topology.name}")

    def planned(self, coll, p, nccl: str | None) -> None:
        # cclc.synth.report only when this runs, not for cclc --help
        from cclc.synth.report import synth_report

        pct = f", {p.pct_of_bound:.1f}% of bound" if p.pct_of_bound is not None else ""
        if p.pct_of_lockstep_bound is not None:
            # beside the bound every model shares: the one no lockstep schedule beats
            pct += f" ({p.pct_of_lockstep_bound:.1f}% of the lockstep bound)"
        t = f" {format_time(p.time)}" if p.time is not None else ""
        if self.args.explain:
            print(f"{coll.name}: {coll.kind.value} on {coll.n} ranks; candidates:")
            pinned_by = None
            if hint_key(coll) is not None:
                pinned_by = "--algorithm" if self.args.algorithm else "the file"
            print(format_candidates(p, pinned_by))
        print(f"{coll.name}: {p.name}{t}{pct}, {len(p.schedule.ops)} ops in "
              f"{p.schedule.n_steps} steps ({p.model.label}; routing {coll.topology.routing})")
        if p.schedule.algorithm == "synth":

            print(f"  {synth_report(p.schedule)}")
        if p.planned_time is not None:
            print(f"  with cclc's planned spines: {format_time(p.planned_time)}; a plan, not "
                  "what runs: realizing a spine per flow needs a routing mechanism no backend "
                  "has yet, so the time above is under ECMP hashing")
        if (spread := spread_note(p.schedule)) is not None:
            print(f"  {spread}")
        if nccl:
            print(f"  {nccl}")
        emitted = parse_emit(self.args.emit)
        if "nccl" in emitted:
            print(f"  {_lane_report(p)}")
        if "nccl-onesided" in emitted:
            print(f"  {_onesided_report(p)}")

    def planned_symmetric(self, coll, p, whole=None) -> None:
        # cclc.symmetric_plan only when this runs, not for cclc --help
        from cclc.symmetric_plan import describe_form, form_steps

        pct = f", {p.pct_of_bound:.1f}% of bound" if p.pct_of_bound is not None else ""
        if self.args.explain and whole is not None:
            print(f"{coll.name}: {coll.kind.value} on {coll.n} ranks; whole candidates:")
            print(format_candidates(whole, outdone_by=p.name))
            print(f"  and stored by symmetry: {p.name} {format_time(p.time)}{pct}: chosen")
        s = p.schedule
        print(f"{coll.name}: {p.name} {format_time(p.time)}{pct}, {len(s.ops):,} "
              f"representative ops for {s.expanded_ops():,} ops in {form_steps(s)} steps, "
              f"{describe_form(s)} ({p.model.label}; routing {coll.topology.routing})")

    def failed(self, coll, message: str) -> None:
        print(f"error: collective '{coll.name}': the schedule failed verification, so "
              f"nothing was written for it:\n{message}", file=sys.stderr)

    def missing(self, coll, backend: str, message: str) -> None:
        print(f"error: collective '{coll.name}': no {backend} output: {message}",
              file=sys.stderr)

    def skipped(self, coll, backend: str, message: str) -> None:
        print(f"note: collective '{coll.name}': no {backend} output, its format cannot express "
              f"this collective: {message}", file=sys.stderr)

    def wrote(self, name: str) -> None:
        _progress(f"wrote {self.folder / name}")

    def done(self, coll) -> None:
        _progress(f"  {coll.name} done in {time.perf_counter() - self.started:.1f} s")


def _lane_report(p) -> str:
    """What the NCCL library's lanes make and allocate on each rank (see cclc.lane_cost)."""
    budget = p.model.lane_memory if p.model.lane_memory is not None else DEFAULT_LANE_MEMORY
    try:
        choice = choose_lanes(p.schedule, budget)
    except ScheduleError as err:
        return f"nccl library: {err.message}"
    cost = schedule_lane_cost(p.schedule, choice, NCCL_GROUP_OVERHEAD)
    return f"nccl library: {cost.describe()} (budget {budget / 2 ** 20:.0f} MiB)"


def _onesided_report(p) -> str:
    """What the one-sided NCCL library makes on each rank: no lanes (see cclc.execution)."""
    s = p.schedule
    entries = plan_entries(s, lower_schedule(s, op_overhead=NCCL_GROUP_OVERHEAD))
    net = s.ops.src != s.ops.dst
    messages = (np.bincount(s.ops.src[net], minlength=s.n)
                + np.bincount(s.ops.dst[net], minlength=s.n))
    return ("nccl-onesided library: the caller's communicator only (no lane communicators, "
            "streams or events), one registered window per rank and call size; at most "
            f"{int(entries.max())} entries per rank run in order, {int(messages.max())} of "
            "them messages (a credit, a put and a signal each)")


def _options(args):
    return EmitOptions(msccl_runtime=getattr(args, "msccl_runtime", "msccl"),
                       max_bytes=getattr(args, "msccl_max_bytes", None),
                       build=getattr(args, "build", False))


def run(args) -> int:
    emit = parse_emit(args.emit)
    request = Request(emit=tuple(emit), only=tuple(args.only or ()), algorithm=args.algorithm,
                      explain=args.explain, size_check=not getattr(args, "no_size_check", False),
                      options=_options(args), force=args.force, source=f"'{args.file}'",
                      synth_budget=getattr(args, "synth_budget", None),
                      nccl_lane_memory=getattr(args, "nccl_lane_memory", None))
    program = load_program(args.file)
    results = compile_program(program, args.output, request, _Printer(args))
    return _summary(results)


def _summary(results: tuple[Compiled, ...]) -> int:
    failures = sum(r.failed for r in results)
    missing = [f"{r.collective.name}: {name}" for r in results for name, _ in r.missing]
    if failures:
        print(f"error: {failures} of {len(results)} collectives failed verification",
              file=sys.stderr)
    if missing:
        print(f"error: outputs not produced (the others were written): {', '.join(missing)}",
              file=sys.stderr)
    return 1 if failures or missing else 0
