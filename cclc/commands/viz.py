"""``cclc viz``: draw schedules as one self-contained HTML page."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cclc.commands.argtypes import path_named
from cclc.errors import CclError, ScheduleError
from cclc.ir import Schedule
from cclc.outdir import OutputDir
from cclc.pipeline import measure
from cclc.verify import verify

HELP = """Draw one or more schedules (JSON written by 'cclc compile') as a single offline HTML
page: the topology with link load per step (slider, play/pause, left/right keys), a timeline of
links x time from the event-driven simulator with the critical path, a per-rank buffer view
for small schedules, and the numbers (time, algbw, busbw, % of bound). Several schedules are
drawn side by side for comparison. A schedule stored by symmetry (what 'cclc compile' writes
for a large torus) is verified in that form and drawn expanded, where every rank's ops fit
cclc's size limit ('cclc sim --steps' times a larger one without expanding it).

example:
  cclc compile examples/torus5x5_fault.ccl -o out/
  cclc viz out/a2a.schedule.json -o a2a.html
  cclc viz mate.schedule.json matee.schedule.json -o compare.html"""


def add_parser(sub) -> None:
    p = sub.add_parser("viz", help="draw schedules as an offline HTML page", description=HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("schedules", nargs="+", metavar="SCHED.json", help="schedule files")
    p.add_argument("-o", "--output", required=True, metavar="OUT.html",
                   type=path_named, help="page to write")
    p.add_argument("--force", action="store_true",
                   help="overwrite OUT.html even if cclc did not write it")
    p.set_defaults(run=run)


def run(args) -> int:
    # backends.html, cclc.serialize only when this runs, not for cclc --help
    from backends.html import render
    from cclc.serialize import read_document

    out = Path(args.output)
    if out.exists() and not out.is_file():
        raise CclError(f"{out} exists and is not a regular file; cclc writes only over its own "
                       "kind of file, even with --force")
    # the page goes through the one writer, its folder locked for the run: a page cclc wrote
    # before may be replaced, any other file only with --force, refused before the long work
    with OutputDir(out.parent, force=args.force) as folder:
        folder.refuse_foreign([out.name])
        schedules = []
        for path in args.schedules:
            print(f"viz: reading {path}", file=sys.stderr)
            document = read_document(path)
            try:
                # a drawing of a wrong schedule would mislead
                if isinstance(document, Schedule):
                    verify(document)
                    schedule = document
                else:
                    schedule = _expanded(path, document)
            except ScheduleError as err:
                print(f"error: {path} fails verification, so it is not drawn:\n{err.message}",
                      file=sys.stderr)
                return 1
            schedules.append(schedule)
        print("viz: simulating and drawing", file=sys.stderr)
        page = render([(s, measure(s)) for s in schedules])
        folder.write_bytes(out.name, page.encode("utf-8"))
    print(f"wrote {out} ({len(page) / 1e6:.2f} MB)")
    return 0


def _expanded(path: str, form) -> Schedule:
    """The whole schedule of ``form`` (stored by symmetry), verified in its form first; a
    :class:`CclError` where every rank's ops are over the size limit that ``cclc compile``'s
    HTML output keeps to (:func:`backends.contract.symmetric_refusal`)."""
    # cclc.budget, cclc.symmetric_plan only when this runs, not for cclc --help
    from backends import load
    from backends.contract import symmetric_refusal
    from cclc.budget import MAX_OPS
    from cclc.symmetric_plan import describe_form, expand_form, verify_form

    stored = describe_form(form)
    if symmetric_refusal(load("html"), form, MAX_OPS) is not None:
        raise CclError(f"{path} is {stored}; drawing it needs every rank's ops: "
                       f"{form.expanded_ops():,}, over cclc's limit of {MAX_OPS:,}; "
                       f"'cclc sim --steps {path}' times it and prints every step without "
                       "expanding it")
    verify_form(form)
    print(f"viz: {path}: {stored}; verified in that form, drawn expanded "
          f"({form.expanded_ops():,} ops)", file=sys.stderr)
    return expand_form(form)
