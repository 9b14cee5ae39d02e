"""``cclc verify FILE``: check that a schedule document computes its collective."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from cclc.commands.argtypes import int_at_least
from cclc.errors import ScheduleError
from cclc.progress import Progress
from cclc.verify import verify

if TYPE_CHECKING:
    from cclc.symmetric import ExceptedSchedule, SymmetricSchedule

__all__ = ["add_parser", "run"]

HELP = """Read a schedule document (the JSON that 'cclc compile' writes) and run the symbolic
verifier on it: every op reads data that is there, no two ops write one chunk in a step,
reductions add each rank's contribution exactly once, every route is a healthy path from the
source rank to the destination rank, and at the end every output holds what the collective
promises. With --numeric the schedule also runs on real numpy data, for every dtype and
reduction op, and is compared with numpy.

Prints one line on success; on failure the reason (with the ops around the faulty one) goes to
stderr and the exit status is 1. An unreadable or malformed file exits with status 2.

A schedule stored by symmetry (one representative op per orbit of a torus's translations,
what 'cclc compile' writes where the whole schedule is too large) is verified in that form:
rank 0's view of every orbit, the routes of the representatives and the group
(docs/performance.md); on a torus with failed links also that the journeys left out are
those that cross them and that the tail delivers theirs (an AllToAll), or that the ring
phases left out are those of the rings they cut and that the lines in their steps leave what
is read later as those phases did (an AllReduce, AllGather or ReduceScatter). --numeric needs
the whole schedule and refuses it.

examples:
  cclc verify out/a2a.schedule.json
  cclc verify --numeric out/grads.schedule.json"""


def add_parser(sub) -> None:
    p = sub.add_parser("verify", help="verify a schedule document", description=HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file", metavar="FILE.schedule.json", help="the schedule document")
    p.add_argument("--numeric", action="store_true",
                   help="also run the schedule on real data for every dtype and op")
    p.add_argument("--seed", type=int_at_least(0), default=0,
                   help="random seed of the numeric data (a non-negative integer)")
    p.set_defaults(run=run)


def run(args) -> int:
    # cclc.numeric, cclc.serialize only when this runs, not for cclc --help
    from cclc.numeric import check_numeric
    from cclc.serialize import read_document
    from cclc.symmetric import ExceptedSchedule, SymmetricSchedule

    progress = Progress(lambda line: print(line, file=sys.stderr, flush=True))
    with progress.stage(f"reading {args.file}"):
        schedule = read_document(args.file)     # a bad file raises CclError: the CLI exits 2
    if isinstance(schedule, SymmetricSchedule | ExceptedSchedule):
        return _run_symmetric(args, schedule, progress)
    name = schedule.collective.name
    try:
        with progress.stage(f"verifying {len(schedule.ops)} ops"):
            verify(schedule)
        if args.numeric:
            with progress.stage(f"running {len(schedule.ops)} ops on numeric data"):
                check_numeric(schedule, seed=args.seed)
    except ScheduleError as err:
        print(f"{args.file}: verification failed: {err.message}", file=sys.stderr)
        return 1
    checked = "verified and checked numerically" if args.numeric else "verified"
    print(f"ok: {name}: {len(schedule.ops)} ops, {schedule.n_steps} steps, {checked}")
    return 0


def _run_symmetric(args, schedule: SymmetricSchedule | ExceptedSchedule, progress: Progress
                   ) -> int:
    # cclc.symmetric*, only when this runs, not for cclc --help
    from cclc.symmetric_plan import describe_form, verify_form

    name = schedule.collective.name
    if args.numeric:
        print(f"{args.file}: --numeric runs every op of the whole schedule, and this one is "
              f"stored by symmetry ({schedule.expanded_ops():,} ops); verify it without "
              "--numeric", file=sys.stderr)
        return 2
    try:
        with progress.stage(f"verifying {len(schedule.ops)} representative ops"):
            verify_form(schedule)
    except ScheduleError as err:
        print(f"{args.file}: verification failed: {err.message}", file=sys.stderr)
        return 1
    print(f"ok: {name}: {len(schedule.ops)} representative ops for "
          f"{schedule.expanded_ops()} ops ({describe_form(schedule)}), verified")
    return 0
