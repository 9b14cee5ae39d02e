"""``cclc compile FILE -o DIR``: plan, verify and write every collective of a .ccl file."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import re
import sys
import time
from pathlib import Path

from cclc.collective import Collective, Hint
from cclc.errors import CclError, ScheduleError
from cclc.outdir import OutputDir
from cclc.progress import Progress
from cclc.units import format_time

__all__ = ["EMITTERS", "EmitOptions", "add_parser", "format_candidates", "run"]

HELP = """Compile every collective of a .ccl file into a verified schedule.

Writes topology-<name>.json (the elaborated topology) and <collective>.schedule.json per
collective into DIR, plus whatever the other emitters produce. Every schedule is verified before
anything is written for it; one that fails verification is never written (the command says why
and exits 1). An output a schedule cannot take (e.g. a runtime limit of MSCCL) is reported and
the other outputs are still written; the command then exits 1. Files cclc did not write are
never overwritten without --force (cclc keeps a list of its files in DIR/.cclc-manifest.json).

Times are predicted under the execution model of the first code-emitting backend in --emit
(nccl: dataflow lanes with a per-group cost; msccl: dataflow with a per-op cost; json
only: the IR's plain lockstep) and the topology's declared routing; every printed time names
its model. On an ECMP fabric the time with cclc's planned spines is printed beside it, as a
plan.

examples:
  cclc compile examples/torus5x5.ccl -o out/
  cclc compile examples/torus5x5_fault.ccl -o out/ --explain
  cclc compile cluster.ccl -o out/ --only grads --algorithm ring --emit json,msccl"""

#: emitter name -> module with ``emit(schedule, outdir, options) -> list[str]`` (``None``:
#: built in). Backends live outside cclc/ and are imported only when asked for.
EMITTERS: dict[str, str | None] = {
    "json": None,
    "msccl": "backends.msccl",
    "nccl": "backends.nccl",
    "html": "backends.html",
}


def add_parser(sub) -> None:
    p = sub.add_parser("compile", help="compile a .ccl file into verified schedules",
                       description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file", metavar="FILE.ccl", help="the file to compile")
    p.add_argument("-o", "--output", required=True, metavar="DIR",
                   help="output folder (created if missing)")
    p.add_argument("--emit", default="json", metavar="LIST",
                   help=f"comma-separated outputs: {', '.join(EMITTERS)} (default: json)")
    p.add_argument("--explain", action="store_true",
                   help="print every candidate algorithm with its simulated time and %% of the "
                        "lower bound, or why it does not apply")
    p.add_argument("--force", action="store_true",
                   help="replace files in DIR that cclc did not write")
    p.add_argument("--algorithm", metavar="NAME",
                   help="use this algorithm for every compiled collective (overrides the file; "
                        "'a+s' also sets the schedule; parameters such as chunks=6 are written "
                        "in the file, not here)")
    p.add_argument("--only", metavar="NAME", action="append",
                   help="compile only this collective (repeatable)")
    p.add_argument("--msccl-runtime", default="msccl",
                   choices=["msccl", "msccl-executor", "rccl"],
                   help="MSCCL XML dialect and limits for --emit msccl: microsoft/msccl, the "
                        "msccl executor for NCCL, or RCCL (default: msccl)")
    p.add_argument("--no-size-check", action="store_true",
                   help="plan even when the up-front estimate says the machine has too little "
                        "memory or time for it")
    p.add_argument("--msccl-max-bytes", type=_byte_count, metavar="BYTES",
                   help="MSCCL maxBytes: the largest call the XML serves (default: the compiled "
                        "size; microsoft/msccl allocates scratch for it at init; 0 means no "
                        "bound for msccl-executor and rccl)")
    p.add_argument("--build", action="store_true",
                   help="with --emit nccl, also build libcclc_<name>.so (nvcc, NCCL headers "
                        "from the nvidia-nccl-cu13 wheel or NCCL_HOME)")
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


def load_program(path: str):
    """``dsl.load(path)``; a seam so the command can be tested on hand-built programs."""
    import dsl

    return dsl.load(path)


def _progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def parse_emit(text: str) -> list[str]:
    """The emitter names of ``--emit``; :class:`CclError` names an unknown one."""
    names = [n.strip() for n in text.split(",")]
    if not any(names) or not all(names):
        raise CclError("--emit takes a comma-separated list of outputs without empty items, "
                       "from: " + ", ".join(EMITTERS))
    for n in names:
        if n not in EMITTERS:
            raise CclError(f"unknown emitter '{n}' in --emit; known: {', '.join(EMITTERS)}")
    return list(dict.fromkeys(names))


def _emitter(name: str):
    try:
        module = importlib.import_module(EMITTERS[name])
    except ImportError as err:
        raise CclError(f"emitter '{name}' is not available ({EMITTERS[name]} cannot be "
                       f"imported: {err})") from None
    emit = getattr(module, "emit", None)
    if emit is None:
        raise CclError(f"emitter '{name}' is not available ({EMITTERS[name]} has no emit())")
    return emit


@dataclasses.dataclass(frozen=True)
class EmitOptions:
    """What an emitter may want beyond the schedule: the source file, the planner's numbers,
    and whether it may replace files cclc did not write."""

    source: str
    force: bool
    time: float | None
    bound: float | None
    candidates: tuple = ()
    # read by name by backends.common.coerce_options
    msccl_runtime: str = "msccl"
    max_bytes: int | None = None
    build: bool = False


def _override(coll: Collective, name: str) -> Collective:
    algo, _, sched = name.partition("+")
    return dataclasses.replace(coll, algorithm=Hint(algo), schedule=Hint(sched or "auto"))


def _check_algorithm_flag(name: str) -> None:
    # parameters need the file's syntax (units, strings); the flag names an entry only
    if not name or "(" in name or " " in name or name.count("+") > 1:
        raise CclError(f"--algorithm {name!r}: the flag takes a name ('ring') or "
                       "'algorithm+schedule' ('halfring+dimrotation') without parameters; "
                       "write parameters in the file: algorithm pat(buffer = 4 MiB)")


def _resolve(coll: Collective, flag: str | None, resolve) -> list:
    """``resolve(coll)``; a name given by ``--algorithm`` is reported as a bad flag, not at a
    line of the file that does not contain it."""
    try:
        return resolve(coll)
    except CclError as err:
        if flag is None:
            raise
        raise CclError(f"--algorithm {flag}: {err.message}") from None


def _check_sizes(collectives: list[Collective], entries: dict) -> None:
    """Refuse, before writing anything, a collective the machine cannot plan (cclc.budget)."""
    from cclc.budget import available_memory, check_budget, estimate
    from cclc.plan import hint_params

    memory = available_memory()
    for coll in collectives:
        check_budget(estimate(coll, entries[coll.name], hint_params(coll)), memory)


def format_candidates(p, pinned_by: str | None = None) -> str:
    """The ``--explain`` table of a :class:`~cclc.plan.Plan` (times under its model);
    ``pinned_by`` says who named the algorithm ("the file", "--algorithm") when it was not
    chosen by speed."""
    rows = [("candidate", f"time ({p.model.name} model)", "% of bound", "note")]
    usable = {c.name for c in p.candidates if c.applicable}
    usable |= {name.split("+")[0] for name in usable}
    faster = [c.name for c in p.candidates if c.applicable and c.time is not None
              and p.time is not None and c.time < p.time * (1 - 1e-9)]
    for c in p.candidates:
        if c.applicable:
            t = format_time(c.time) if c.time is not None else "-"
            pct = f"{c.pct_of_bound:.1f}%" if c.pct_of_bound is not None else "-"
            note = ""
            if c.name == p.name:
                note = "chosen" if pinned_by is None else f"pinned by {pinned_by}"
                if pinned_by is not None and faster:
                    note += f" ({', '.join(faster)} faster)"
            if c.planned_time is not None:
                note = (note + "; " if note else "") + \
                    f"planned spines {format_time(c.planned_time)} (a plan)"
        else:
            t, pct, note = "-", "-", f"not applicable: {_suggest_usable(c.reason, usable)}"
        rows.append((c.name, t, pct, note))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = ["  " + "  ".join(r[i].ljust(widths[i]) for i in range(3)) + "  " + r[3]
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


def _check_schedule(p) -> None:
    """Verify the planned schedule unless the planner already did."""
    if p.verified:
        return
    from cclc.verify import verify

    verify(p.schedule)


def run(args) -> int:
    from cclc.execution import model_for
    from cclc.nccl_model import compare_with_nccl
    from cclc.plan import hint_key, plan, resolve
    from cclc.serialize import to_json
    from cclc.synth.report import synth_budget, synth_report

    emitters = parse_emit(args.emit)
    emit_funcs = {n: _emitter(n) for n in emitters if EMITTERS[n] is not None}
    program = load_program(args.file)
    collectives = list(program.collectives)
    if args.only:
        known = {c.name for c in collectives}
        for name in args.only:
            if name not in known:
                raise CclError(f"--only {name}: '{args.file}' has no collective '{name}'; it "
                               f"has: {', '.join(sorted(known)) or '(none)'}")
        collectives = [c for c in collectives if c.name in args.only]
    if args.algorithm:
        _check_algorithm_flag(args.algorithm)
        collectives = [_override(c, args.algorithm) for c in collectives]
    if not collectives:
        _progress(f"note: '{args.file}' declares no collective: only its topologies are "
                  "written (add 'collective NAME = KIND on TOPOLOGY { size ... }')")

    # every name in the file is checked before anything is written or any long work starts
    entries = {coll.name: _resolve(coll, args.algorithm, resolve) for coll in collectives}
    if not getattr(args, "no_size_check", False):
        _check_sizes(collectives, entries)
    progress = Progress(_progress)
    out = OutputDir(args.output, force=args.force)
    _refuse_foreign_files(out, program, collectives, emitters, args)
    used = {c.topology.name for c in collectives}
    for name, topo in dict(program.topologies).items():
        if args.only and name not in used:
            continue
        with progress.stage(f"writing topology-{name}.json"):
            written = out.write_text(f"topology-{name}.json", _topology_json(topo))
        _progress(f"wrote {_shown(out, written)}")

    failures = 0
    missing: list[str] = []
    for coll in collectives:
        started = time.perf_counter()
        _progress(f"compiling {coll.name}: {coll.kind.value} on {coll.n} ranks of "
                  f"{coll.topology.name}")
        try:
            with progress.stage(f"{coll.name}: planning") as st, \
                    synth_budget(getattr(args, "synth_budget", None)):
                p = plan(coll, explain=args.explain, model=model_for(emitters),
                         on_step=lambda i, total, what: st.update(i, what, total))
            with progress.stage(f"{coll.name}: verifying {p.name}"):
                _check_schedule(p)
        except ScheduleError as err:
            failures += 1
            print(f"error: collective '{coll.name}': the schedule failed verification, so "
                  f"nothing was written for it:\n{err.message}", file=sys.stderr)
            continue
        pct = f", {p.pct_of_bound:.1f}% of bound" if p.pct_of_bound is not None else ""
        t = f" {format_time(p.time)}" if p.time is not None else ""
        if args.explain:
            print(f"{coll.name}: {coll.kind.value} on {coll.n} ranks; candidates:")
            pinned_by = None
            if hint_key(coll) is not None:
                pinned_by = "--algorithm" if args.algorithm else "the file"
            print(format_candidates(p, pinned_by))
        print(f"{coll.name}: {p.name}{t}{pct}, {len(p.schedule.ops)} ops in "
              f"{p.schedule.n_steps} steps ({p.model.label}; routing {coll.topology.routing})")
        if p.schedule.algorithm == "synth":
            print(f"  {synth_report(p.schedule)}")
        if p.planned_time is not None:
            print(f"  with cclc's planned spines: {format_time(p.planned_time)}; a plan, not "
                  "what runs: realizing a spine per flow needs a routing mechanism no backend "
                  "has yet, so the time above is under ECMP hashing")
        baseline = (compare_with_nccl(coll, p.time, software_cost=p.model.charges_software)
                    if p.time is not None else None)
        if baseline:
            print(f"  {baseline}")
        files = []
        if "json" in emitters:
            with progress.stage(f"{coll.name}: writing {coll.name}.schedule.json"):
                doc = to_json(p.schedule)
                files.append(out.write_text(f"{coll.name}.schedule.json",
                                            json.dumps(doc, separators=(",", ":"),
                                                       allow_nan=False) + "\n"))
        options = EmitOptions(source=args.file, force=args.force, time=p.time, bound=p.bound,
                              candidates=p.candidates,
                              msccl_runtime=getattr(args, "msccl_runtime", "msccl"),
                              max_bytes=getattr(args, "msccl_max_bytes", None),
                              build=getattr(args, "build", False))
        for k, (name, emit) in enumerate(emit_funcs.items()):
            try:
                with progress.stage(f"{coll.name}: {name} output of {len(p.schedule.ops)} "
                                    f"ops ({k + 1} of {len(emit_funcs)} outputs)"):
                    files += [str(f) for f in emit(p.schedule, out, options)]
            except CclError as err:
                # one output the schedule cannot take (a runtime limit, a refused overwrite)
                # must not cost the user the others
                missing.append(f"{coll.name}: {name}")
                print(f"error: collective '{coll.name}': no {name} output: {err.message}",
                      file=sys.stderr)
        for f in files:
            _progress(f"wrote {_shown(out, f)}")
        _progress(f"  {coll.name} done in {time.perf_counter() - started:.1f} s")
    if failures:
        print(f"error: {failures} of {len(collectives)} collectives failed verification",
              file=sys.stderr)
    if missing:
        print(f"error: outputs not produced (the others were written): {', '.join(missing)}",
              file=sys.stderr)
    return 1 if failures or missing else 0


def _refuse_foreign_files(out: OutputDir, program, collectives, emitters, args) -> None:
    """Refuse before any work when a file this run will write exists and is not cclc's.

    The writes themselves refuse too; checking first keeps a refused run from leaving part of
    its output behind.
    """
    if args.force:
        return
    runtime = getattr(args, "msccl_runtime", "msccl")
    names = [f"topology-{t}.json" for t in program.topologies
             if not args.only or t in {c.topology.name for c in collectives}]
    for c in collectives:
        if "json" in emitters:
            names.append(f"{c.name}.schedule.json")
        if "html" in emitters:
            names.append(f"{c.name}.html")
        if "msccl" in emitters:
            names += [f"{c.name}.{runtime}.xml", f"{c.name}.{runtime}.report.md"]
    foreign = [n for n in names if out.path_for(n).exists() and not out.owns(n)]
    if foreign:
        raise CclError(f"refusing to overwrite {', '.join(map(repr, foreign))} in "
                       f"'{out.path}': cclc did not write them (use --force to replace them)")


def _shown(out: OutputDir, name: str) -> str:
    # emitters return names inside the folder or paths that already include it
    path = Path(name)
    if path.is_absolute() or path.parts[:len(out.path.parts)] == out.path.parts:
        return str(path)
    return str(out.path / path)


def _topology_json(topo) -> str:
    from cclc import serialize

    # the schedule document's topology encoder, so both files describe a machine alike
    encode = getattr(serialize, "topology_to_json", None) or serialize._topology_json
    doc = {"format": "cclc-topology", "version": 1, "topology": encode(topo)}
    return json.dumps(doc, separators=(",", ":"), allow_nan=False) + "\n"
