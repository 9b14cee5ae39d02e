"""``cclc tune FILE.ccl -o DIR``: NCCL parameter tables by coordinate descent, as a plugin."""

from __future__ import annotations

import argparse
import sys

from backends import load as load_backend
from backends.contract import EmitOptions
from backends.write import write_backend
from cclc.collective import CollectiveKind
from cclc.commands.argtypes import int_at_least, path_named
from cclc.errors import CclError, SemanticError
from cclc.nccl_model import ARCHS, MAX_CHANNELS
from cclc.outdir import OutputDir

__all__ = ["TABLE_FILES", "add_parser", "run"]

HELP = """Tune NCCL's algorithm, protocol, channels, threads and chunk size for the collectives of
a .ccl file (AutoCCL's subspace-then-coordinate-descent search), and write:

  tuning.csv, tuning.json   the table: choice per (collective, size range, group), NCCL's
                            default beside it, and the evaluations each search used
  nccl.conf                 NCCL_CONF_FILE for what stock NCCL only takes process-wide
  nccl_tuner.conf           the table in the CSV format of NVIDIA's example tuner
  plugin.c, Makefile,       the tuner + profiler plugin carrying the table
  libnccl-tuner-cclc.so     (NCCL_TUNER_PLUGIN / NCCL_PROFILER_PLUGIN; see docs/tuning.md)

Each configuration is evaluated by --profiler: cclc's model of NCCL on the topology (the
default: a prediction, not a measurement), a CSV of measured results, or real nccl-tests runs.
Results are cached in DIR/tune-cache.json, so a rerun does not evaluate them again. A table
from the model chooses NCCL's algorithm and protocol only and keeps NCCL's own channels,
threads and chunk: only measurements may change those.

examples:
  cclc tune examples/hgx_node.ccl -o out/
  cclc tune examples/hgx16_leafspine.ccl -o out/ --sizes 64KiB:1GiB:x4
  cclc tune cluster.ccl -o out/ --collectives allreduce,allgather --sizes 1MiB,64MiB
  cclc tune cluster.ccl -o out/ \\
      --profiler 'nccl-tests:mpirun -np {nranks} ./{binary} -b {bytes} -e {bytes}'"""

_KINDS = {k.value: k for k in CollectiveKind if k is not CollectiveKind.ALLTOALL}

#: the files ``cclc tune`` writes beside the tuner backend's (``backends.tuner``): the cache
#: of evaluations, the table, and the two NCCL configuration files
TABLE_FILES = ("tune-cache.json", "tuning.csv", "tuning.json", "nccl.conf", "nccl_tuner.conf")


def add_parser(sub) -> None:
    p = sub.add_parser("tune", help="tune NCCL parameters and build a tuner plugin",
                       description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file", metavar="FILE.ccl", help="topologies and collectives to tune")
    p.add_argument("-o", "--output", required=True, metavar="DIR", type=path_named,
                   help="output folder")
    p.add_argument("--collectives", metavar="LIST",
                   help="tune these kinds on all ranks of every topology in the file instead "
                        f"of the file's collectives ({', '.join(_KINDS)})")
    p.add_argument("--sizes", metavar="LIST",
                   help="sizes to tune, e.g. 64KiB,1MiB or 4KiB:1GiB:x4 (default: each "
                        "collective's own size; with --collectives: 64KiB:1GiB:x4)")
    p.add_argument("--profiler", default="model", metavar="SPEC",
                   help="model | csv:PATH | nccl-tests:TEMPLATE (default: model)")
    p.add_argument("--search", default="cd", choices=("cd", "exhaustive", "random"),
                   help="search method (default: cd, AutoCCL's coordinate descent)")
    p.add_argument("--budget", type=int, metavar="N",
                   help="at most N evaluations per (collective, size)")
    p.add_argument("--nccl-version", default="2.30", metavar="X.Y",
                   help="NCCL release the table is for: decides PAT (2.23+), chunk tuning "
                        "(2.30+, tuner v6) (default: 2.30)")
    p.add_argument("--arch", default="hopper", choices=ARCHS,
                   help="GPU generation for NCCL's tables (default: hopper)")
    p.add_argument("--nccl-channels", type=int_at_least(1, MAX_CHANNELS), metavar="N",
                   help="channels NCCL sets up at init on this machine (NCCL_DEBUG=INFO shows "
                        "'N coll channels'; default: what cclc's model of NCCL's "
                        "topology search gives)")
    p.add_argument("--build", action=argparse.BooleanOptionalAction, default=True,
                   help="compile libnccl-tuner-cclc.so (default: --build)")
    p.add_argument("--force", action="store_true",
                   help="replace files in DIR that cclc did not write")
    p.set_defaults(run=run)


def load_program(path: str):
    """``dsl.load(path)``; a seam so the command can be tested on hand-built programs."""
    # the .ccl front end (lark, ~0.3 s to import) only when a .ccl file is read, not for cclc --help
    import dsl

    return dsl.load(path)


def run(args) -> int:
    # cclc.tuning, cclc.tuning.profilers, cclc.tuning.search, cclc.tuning.space, cclc.tuning.table
    # only when this runs, not for cclc --help
    from cclc.tuning import outputs
    from cclc.tuning.profilers import profiler_from_spec
    from cclc.tuning.search import MeasurementCache
    from cclc.tuning.space import NcclVersion
    from cclc.tuning.table import (
        TuneOptions,
        describe,
        parse_sizes,
        targets_from_collectives,
        targets_from_grid,
        tune,
    )

    program = load_program(args.file)
    version = NcclVersion.parse(args.nccl_version)
    if args.budget is not None and args.budget < 1:
        raise SemanticError("--budget must be at least 1")
    if args.collectives:
        kinds = []
        for name in (n.strip().lower() for n in args.collectives.split(",") if n.strip()):
            if name not in _KINDS:
                raise SemanticError(f"--collectives: '{name}' cannot be tuned in NCCL "
                                    f"(use {', '.join(_KINDS)})")
            kinds.append(_KINDS[name])
        grid = parse_sizes(args.sizes or "64KiB:1GiB:x4")
        targets, notes = targets_from_grid(program.topologies.values(), kinds, grid,
                                           arch=args.arch, nccl_channels=args.nccl_channels)
    else:
        sizes = parse_sizes(args.sizes) if args.sizes else None
        targets, notes = targets_from_collectives(program.collectives, sizes, arch=args.arch,
                                                  nccl_channels=args.nccl_channels)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    if not targets:
        raise SemanticError("nothing to tune: " + ("; ".join(notes) if notes else
                                                    "the file has no collectives"))
    out = OutputDir(args.output, force=args.force)
    tuner = load_backend("tuner")
    plugin_options = EmitOptions(build=args.build)
    # locked for the whole run: a second run into the folder is refused, not mixed in
    with out:
        # every file of the run, checked before the search starts: a file cclc did not write
        # is refused now, not after minutes of evaluations (the tuner's names do not depend
        # on its rows)
        out.refuse_foreign([*TABLE_FILES, *tuner.files((), plugin_options)])
        cache = MeasurementCache(str(out.path_for("tune-cache.json")))
        profiler = profiler_from_spec(args.profiler)
        options = TuneOptions(version=version, method=args.search, budget=args.budget)
        try:
            result = tune(targets, profiler, options, cache)
        finally:
            # what was evaluated stays cached, even when a later run failed
            if len(cache):
                out.write_text("tune-cache.json", cache.dumps())
        for note in result.notes:
            print(f"note: {note}", file=sys.stderr)
        written = [out.write_text("tuning.csv", outputs.table_csv(result)),
                   out.write_text("tuning.json", outputs.table_json(result)),
                   out.write_text("nccl.conf", outputs.nccl_conf(result)),
                   out.write_text("nccl_tuner.conf", outputs.example_tuner_csv(result))]
        try:
            rows = outputs.plugin_rows(result)
            written += [p.name for p in write_backend(tuner, rows, rows, out, plugin_options)]
        except CclError as err:
            print(f"error: {err.message}", file=sys.stderr)
            return 1
        for e in result.entries:
            print(describe(e))
        evaluations = sum(e.evaluations for e in result.entries)
        uncached = sum(e.measured for e in result.entries)
        print(f"{len(result.entries)} table entries; {evaluations} evaluations "
              f"({uncached} {profiler.evaluated}, the rest cached) with {args.search} on "
              f"{profiler.name}")
        for s in result.settings:
            print(f"process-wide: {s.name}={s.value} ({s.why})")
        print("wrote " + ", ".join(written) + f" to {out.path}")
        return 0

