"""``cclc catalog FILE --faults CLASS -o DIR``: schedules for the faults a machine can have."""

from __future__ import annotations

import argparse
import json
import sys

from backends import load
from backends.contract import EmitOptions
from cclc.catalog.faultsets import CLASSES
from cclc.commands.argtypes import path_named
from cclc.errors import CclError
from cclc.execution import model_for
from cclc.outdir import OutputDir
from cclc.progress import Progress
from cclc.units import format_time

__all__ = ["add_parser", "parse_classes", "run"]

HELP = """Compile, for every collective of a .ccl file, a catalog of schedules for the faults its
machine can have, so that a running job switches schedules instead of recompiling.

Fault classes (--faults, comma-separated):
  link        every single failed link (a cable: both directions of one connection)
  link-pairs  every two failed links (refused when there are too many pairs)
  rank        every single failed rank of the group (the group shrinks by one; not with
              --emit nccl: the library's communicator keeps its size)
  cable       on a leaf/spine fabric, every network cable
  nic         on a fabric with NICs, every NIC (all of its links)

The fault sets of a class are grouped into orbits of the machine's symmetries (a torus's
translations, reflections and permutations of alike dimensions; on a fabric, the powers of one
automorphism that moves every rank): one schedule is compiled per orbit, the one 'auto' would
choose for that fault set (verified), and every member of the orbit is served by it with its
ranks relabeled. The machine as the file declares it (its own faults included) is compiled
too: schedule 0, what the library runs until told of a fault.

Writes DIR/<collective>.catalog.json (classes, the schedules by orbit, and every member as
its fault set, schedule and rank permutation), each schedule once as
DIR/<collective>.catalog/schedule<k>.schedule.json, and with --emit nccl the NCCL library
(and its MPI build) of DIR/nccl-<collective>/ carrying every schedule and a call to switch
between them (cclc_<collective>_select_faults). Prints per collective the classes, the
schedules compiled, the time, and the worst and median % of the lower bound over all members
(each member's bound is its own machine's, equal by symmetry to its orbit representative's).

examples:
  cclc catalog examples/torus5x5.ccl --faults link -o out/
  cclc catalog examples/mesh4x4.ccl --faults link,link-pairs -o out/ --emit nccl
  cclc catalog examples/torus4x4_failed_rank.ccl --faults rank -o out/"""


def add_parser(sub) -> None:
    p = sub.add_parser("catalog", help="compile schedules for every fault of a class",
                       description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file", metavar="FILE.ccl", help="the machine and collectives")
    p.add_argument("--faults", required=True, metavar="CLASSES",
                   help=f"comma-separated fault classes: {', '.join(CLASSES)}")
    p.add_argument("-o", "--output", required=True, metavar="DIR", type=path_named,
                   help="output folder (created if missing)")
    p.add_argument("--emit", default="json", choices=("json", "nccl"),
                   help="json: the catalog and its schedules; nccl: also the NCCL/MPI library "
                        "that carries them (default: json)")
    p.add_argument("--only", metavar="NAME", action="append",
                   help="catalog only this collective (repeatable)")
    p.add_argument("--build", action="store_true",
                   help="with --emit nccl, also build libcclc_<name>.so (nvcc, NCCL headers "
                        "from the nvidia-nccl-cu13 wheel or NCCL_HOME)")
    p.add_argument("--force", action="store_true",
                   help="replace files in DIR that cclc did not write")
    p.set_defaults(run=run)


def parse_classes(text: str) -> tuple[str, ...]:
    """The fault classes of ``--faults``; :class:`CclError` names an unknown one."""
    names = [n.strip() for n in text.split(",")]
    for n in names:
        if n not in CLASSES:
            raise CclError(f"--faults: unknown fault class '{n}'; known: {', '.join(CLASSES)}")
    return tuple(dict.fromkeys(names))


def _refusal(backend):
    """Why the requested output cannot take a schedule, as its backend says."""
    options = EmitOptions()
    return lambda s: backend.refusal(s, options)


def run(args) -> int:
    # the .ccl front end (lark, ~0.3 s to import) and cclc.catalog.build only when this command
    # runs, not for cclc --help
    import dsl
    from cclc.catalog.build import build_catalog

    classes = parse_classes(args.faults)
    if args.emit == "nccl" and "rank" in classes:
        raise CclError("--faults rank with --emit nccl: after a rank is lost the communicator "
                       "is rebuilt with fewer ranks (ncclCommShrink), which the library's "
                       "tables, made for the full group, cannot serve; use --emit json")
    program = dsl.load(args.file)
    collectives = [c for c in program.collectives if not args.only or c.name in args.only]
    for name in args.only or ():
        if name not in {c.name for c in program.collectives}:
            raise CclError(f"--only {name}: '{args.file}' has no collective '{name}'")
    if not collectives:
        raise CclError(f"'{args.file}' declares no collective to catalog")
    backend = load(args.emit)
    model = model_for([backend])
    progress = Progress(lambda line: print(line, file=sys.stderr, flush=True))
    status = 0
    with OutputDir(args.output, force=args.force) as out:
        for coll in collectives:
            # one schedule per orbit, each planned as auto plans it: alike enough for a pace
            with progress.stage(f"{coll.name}: catalog", pace=True) as st:
                catalog = build_catalog(coll, classes, model=model, refusal=_refusal(backend),
                                        on_step=lambda i, total, what: st.update(i, what,
                                                                                  total),
                                        emit_seconds_per_op=backend.seconds_per_op)
            status |= _write(catalog, out, args)
            _report(catalog)
    return status


def _write(catalog, out, args) -> int:
    # cclc.catalog.build, cclc.serialize only when this runs, not for cclc --help
    from cclc.catalog.build import catalog_document, schedule_file
    from cclc.serialize import document_pieces

    name = catalog.collective.name
    files = [f"{name}.catalog.json"] + [schedule_file(name, i)
                                        for i, e in enumerate(catalog.schedules) if e.plan]
    out.refuse_foreign(files)
    for i, entry in enumerate(catalog.schedules):
        if entry.plan is not None:
            out.write_text(schedule_file(name, i),
                           (*document_pieces(entry.plan.schedule), b"\n"))
    out.write_text(files[0], json.dumps(catalog_document(catalog), separators=(",", ":"),
                                     allow_nan=False) + "\n")
    for f in files:
        print(f"wrote {out.path / f}", file=sys.stderr)
    if args.emit == "nccl":
        # backends.nccl.catalog only when this runs, not for cclc --help
        from backends.nccl.catalog import write_catalog_library

        try:
            for f in write_catalog_library(catalog, out, EmitOptions(build=args.build)):
                print(f"wrote {out.path / f}", file=sys.stderr)
        except CclError as err:
            print(f"error: collective '{name}': no nccl output: {err.message}", file=sys.stderr)
            return 1
    return 0


def _report(catalog) -> None:
    s = catalog.summary()
    coll = catalog.collective
    print(f"{coll.name}: {coll.kind.value} on {coll.n} ranks of {coll.topology.name}")
    for o in catalog.classes:
        print(f"  class {o.fault_class}: {len(o.members)} fault sets in {o.n_orbits} orbits "
              f"({o.group_order} symmetries)")
    for i, e in enumerate(catalog.schedules):
        what = e.faults.describe(coll.topology)
        if e.plan is None:
            print(f"  schedule {i} ({what}): none: {e.error}")
            continue
        p = e.plan
        pct = f", {p.pct_of_bound:.1f}% of bound" if p.pct_of_bound is not None else ""
        t = format_time(p.time) if p.time is not None else "-"
        print(f"  schedule {i} ({what}): {p.name} {t}{pct} ({p.model.label}), compiled in "
              f"{e.seconds:.1f} s")
    worst = s["worst_pct_of_bound"]
    median = s["median_pct_of_bound"]
    pcts = (f"; over all members: worst {worst:.1f}%, median {median:.1f}% of bound "
            "(each member's bound equals its representative's, by symmetry)"
            if worst is not None else "")
    unserved = f"; {s['unserved']} fault sets unserved" if s["unserved"] else ""
    print(f"  {s['schedules_compiled']} schedules for {s['members']} fault sets in "
          f"{s['seconds']:.1f} s{pcts}{unserved}")
