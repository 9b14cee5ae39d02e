"""``cclc diagnose TIMINGS --topology FILE.ccl``: name the part that makes pairs slow."""

from __future__ import annotations

import argparse
import math
from contextlib import ExitStack
from pathlib import Path

from cclc.commands.argtypes import path_named
from cclc.diagnose.localize import (
    MIN_BASELINE,
    MIN_EVIDENCE,
    PATCH_CONFIDENCE,
    DiagnoseOptions,
    diagnose,
)
from cclc.errors import CclError
from cclc.outdir import OutputDir

__all__ = ["add_parser", "run"]

HELP = f"""Read per-pair timings measured on a machine, map every pair onto the links its traffic
crosses (the topology's routing: shortest healthy paths on tori, ECMP spines on leaf/spine
fabrics), find the pairs that are robustly slower than their peers (median/MAD per group of
alike routes) and the link, cable, NIC, switch or GPU whose pairs are the slow ones (a hot row
is a slow sender, a hot column a slow receiver, pairs sharing one link a bad link). Prints each
suspect with a confidence and its evidence, and the 'fault' statements that make the next
'cclc compile' route around it.

Timings (the format is recognised from the content):
  src,dst,bytes,seconds       header, then one row per transfer (rank ids; 'inf' = never finished)
  an n x n matrix             seconds of i -> j in row i, column j (diagonal ignored)
  JSON "cclc-peer-timings"    per-rank send/recv records, as cclc's NCCL plugin writes them
                              with CCLC_PEER_TIMINGS=PREFIX (one file per rank: pass them all)
  nccl-tests output           sendrecv_perf runs, one file per run (2 ranks: one pair; n ranks:
                              the shift r -> r+1, all given the run's time); hosts become nodes
                              in the order of --hosts FILE, or of first appearance

By default the pairs are taken as timed while all ran at once (one alltoall), so a slow link
only shows in the pairs it becomes the bottleneck of; --pairwise when each pair was timed alone.

What the evidence must show before a part is named: a baseline of {MIN_BASELINE} or more pairs that
finished, and {MIN_EVIDENCE} or more slow or hung pairs that the part explains; a weaker candidate
is reported as "not enough evidence" with the pairs to measure next. Confidence = (the
suspect's share among all hypotheses) x (1 - p), p the one-sided Mann-Whitney p-value of "its
pairs are no slower than the others" (with n pairs of its own among n + m it is at least
1/C(n+m, n): few pairs, little confidence). Fault statements are printed, and written by
--faults and --patch, only for suspects with confidence >= --min-confidence ({PATCH_CONFIDENCE:g}).
No pair finished, every pair off the topology's model alike (the whole machine or the model,
not one part), hangs that no part explains: each gets a statement of its own.

Exit status: 0 when nothing wrong is found, 1 when a suspect is named or the timings show a
problem (hangs, every pair off the model), 2 on bad input.

examples:
  cclc diagnose examples/probe_torus5x5.csv --topology examples/torus5x5.ccl
  cclc diagnose probe.csv --topology examples/torus5x5.ccl --patch fixed.ccl
  cclc diagnose peers.*.rank*.json --topology cluster.ccl
  cclc diagnose sendrecv.*.log --topology cluster.ccl --hosts hosts.txt
  cclc diagnose peers.*.rank*.json --topology cluster.ccl --fault-set
  cclc compile fixed.ccl -o out/"""


def add_parser(sub) -> None:
    p = sub.add_parser("diagnose", help="find the failed link or slow GPU from measured timings",
                       description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("timings", metavar="TIMINGS", nargs="+",
                   help="the measured timings (several files are combined: e.g. the plugin's "
                        "one JSON file per rank)")
    p.add_argument("--topology", required=True, metavar="FILE.ccl",
                   help="the .ccl file describing the machine that was measured")
    p.add_argument("--name", metavar="TOPOLOGY",
                   help="which topology of the file (needed when it defines several)")
    p.add_argument("--hosts", metavar="FILE",
                   help="nccl-tests output: the hosts in node order, one per line (default: "
                        "the order in which they first appear in the files)")
    p.add_argument("--faults", metavar="FILE", type=path_named,
                   help="write the fault statements to FILE")
    p.add_argument("--patch", metavar="OUT.ccl", type=path_named,
                   help="write the .ccl file with the fault statements added to its topology")
    p.add_argument("--force", action="store_true",
                   help="let --faults and --patch replace a file cclc did not write")
    p.add_argument("--fault-set", action="store_true",
                   help="print the suspects as the fault set a 'cclc catalog' library takes: "
                        "CCLC_FAULTS=<directed link ids> (also the links argument of "
                        "cclc_<name>_select_faults)")
    p.add_argument("--pairwise", action="store_true",
                   help="the pairs were timed one at a time, not all at once")
    p.add_argument("--min-score", type=float, default=8.0, metavar="SIGMAS",
                   help="evidence a suspect needs, in standard deviations (default 8)")
    p.add_argument("--min-slowdown", type=float, default=1.1, metavar="X",
                   help="median slowdown of its pairs a suspect needs (default 1.1)")
    p.add_argument("--min-confidence", type=float, default=PATCH_CONFIDENCE, metavar="P",
                   help="confidence a suspect needs for its fault statement to be printed and "
                        f"written by --faults/--patch (default {PATCH_CONFIDENCE:g})")
    p.set_defaults(run=run)


def run(args) -> int:
    # the .ccl front end (lark, ~0.3 s to import) and cclc.diagnose.timings only when this
    # command runs, not for cclc --help
    import dsl
    from cclc.diagnose.timings import read_timings_files

    program = dsl.load(args.topology)
    topos = program.topologies
    if args.name is not None:
        if args.name not in topos:
            raise CclError(f"{args.topology} has no topology '{args.name}' (it has: "
                           f"{', '.join(topos) or 'none'})")
        topo = topos[args.name]
    elif len(topos) == 1:
        topo = next(iter(topos.values()))
    else:
        raise CclError(f"{args.topology} defines {len(topos)} topologies "
                       f"({', '.join(topos) or 'none'}): choose one with --name")
    if args.min_score <= 0 or not args.min_slowdown >= 1.0 or not 0 < args.min_confidence <= 1:
        raise CclError("--min-score must be > 0, --min-slowdown >= 1 and --min-confidence in "
                       "(0, 1]")
    timings = read_timings_files(args.timings, topo, args.hosts)
    # the file knows how it was timed (nccl-tests runs: one at a time); --pairwise overrides
    concurrent = not args.pairwise and timings.concurrent is not False
    opts = DiagnoseOptions(min_score=args.min_score, min_slowdown=args.min_slowdown,
                           concurrent=concurrent, min_confidence=args.min_confidence)
    d = diagnose(topo, timings, opts)
    print(f"{timings.source}: {d.n_pairs} pairs on '{topo.name}' ({topo.n_ranks} ranks): "
          f"{d.slow_pairs} slow (z > 3), {d.hung_pairs} never finished")
    if timings.concurrent is False and not args.pairwise:
        print("note: nccl-tests runs are timed one at a time: diagnosing as with --pairwise")
    for note in d.notes:
        print(f"note: {note}")
    if d.unobserved_links:
        print(f"note: {d.unobserved_links} healthy links carry no measured pair; a fault on "
              "them cannot show in these timings")
    for i, s in enumerate(d.suspects, 1):
        _print_suspect(i, s)
    for f in d.findings:
        print(f"{'finding' if f.problem else 'note'}: {f.message}")
        if f.measure_next:
            print(f"  measure next: {', '.join(f.measure_next)}")
    if not d.suspects:
        msg = "no fault found" if not d.problem else "no part named"
        if d.best_rejected is not None:
            (kind_name, _), score, med = d.best_rejected
            msg += (f": the strongest candidate, {kind_name}, scores {score:.1f} (needs "
                    f"{opts.min_score:g}) with median slowdown {med:.2f}x (needs "
                    f"{opts.min_slowdown:g}x)")
        print(msg)
    _write_statements(args, topo, d)
    if args.fault_set:
        _print_fault_set(topo, d)
    return 1 if d.problem else 0


def _print_fault_set(topo, d) -> None:
    """The confident suspects as a catalog library's fault set (one line to paste)."""
    # cclc.diagnose.faults only when this runs, not for cclc --help
    from cclc.diagnose.faults import fault_set

    links, ranks = fault_set(topo, d.confident)
    if links:
        names = ", ".join(topo.link_name(li) for li in links)
        print(f"fault set for a catalog library ({names}):")
    elif not ranks:
        print("fault set for a catalog library: none (the machine as compiled)")
    print(f"CCLC_FAULTS={','.join(map(str, links))}")
    if ranks:
        print(f"note: suspected ranks {', '.join(topo.vertex_names[r] for r in ranks)} are "
              "not in a link fault set: rebuild the communicator without them "
              "(ncclCommShrink) and use a library compiled for the remaining ranks")


def _print_suspect(i: int, s) -> None:
    slow = "hung" if math.isinf(s.slowdown) else f"{s.slowdown:.2f}x"
    print(f"suspect {i}: {s.kind} {s.name}  confidence {s.confidence:.2f}")
    print(f"  evidence: {s.slow} of the {s.pairs} pairs it would slow are slow"
          f"{f' ({s.hung} never finished)' if s.hung else ''}, median {slow}; it explains "
          f"{s.explained} of {s.slow_total} unexplained slow pairs; score {s.score:.1f}, "
          f"Mann-Whitney p = {s.p_value:.2g}")
    if s.same_pairs:
        shown = ", ".join(s.same_pairs[:4]) + (" ..." if len(s.same_pairs) > 4 else "")
        print(f"  the timings cannot tell it from: {shown}")


def _write_statements(args, topo, d) -> None:
    """The fault statements of the suspects that reach the confidence, printed and written."""
    # the .ccl front end (lark, ~0.3 s to import) and cclc.diagnose.faults only when this runs,
    # not for cclc --help
    import dsl
    from cclc.diagnose.faults import fault_statements, patch_source

    targets = [x for x in (args.faults, args.patch) if x]
    if not d.suspects:
        if targets:
            print(f"no fault statement: nothing written to {', '.join(targets)}")
        return
    if not d.confident:
        print(f"no fault statement: no suspect reaches confidence {d.min_confidence:g} "
              "(--min-confidence)" + (f"; nothing written to {', '.join(targets)}"
                                      if targets else ""))
        return
    statements = fault_statements(topo, d.confident)
    print(f"fault statements (suspects with confidence >= {d.min_confidence:g}; add them to "
          "the topology, or use --patch):")
    for line in statements:
        print(f"  {line}")
    contents = {}
    if args.faults:
        contents[args.faults] = "\n".join(statements) + "\n"
    if args.patch:
        text = dsl.read_source(args.topology)      # as dsl.load read it: spans match
        contents[args.patch] = patch_source(text, args.topology, topo.name, statements)
    # through the one writer (atomic, listed in the folder's manifest, under its lock); both
    # files are checked before either is written, so a refusal leaves neither behind; one
    # OutputDir per folder, as a folder's lock is taken once
    where = {target: (Path(target).parent.resolve(), Path(target).name) for target in contents}
    folders = {parent: OutputDir(parent, force=args.force) for parent, _ in where.values()}
    with ExitStack() as held:
        for folder in folders.values():
            held.enter_context(folder)
        for parent, name in where.values():
            folders[parent].refuse_foreign([name])
        for target, text in contents.items():
            parent, name = where[target]
            folders[parent].write_text(name, text)
            print(f"wrote {target}")
