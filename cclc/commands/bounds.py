"""``cclc bounds FILE.ccl``: every lower bound of every collective in a program."""

from __future__ import annotations

import argparse
import functools
import sys

from cclc.bounds import bounds
from cclc.progress import Progress

__all__ = ["add_parser", "run"]

HELP = """Print the lower bounds on the time of every collective of a .ccl file, on its
topology with its faults, and which one is strongest. Every bound counts only the links
a schedule of the group can use: healthy, and on a route the declared routing carries
between two members (GPUs outside the group relay nothing):

  hop_bytes  bytes x the fewest links they must cross / total healthy link bandwidth
  injection  what the worst rank must send (receive) / its healthy link bandwidth;
             allreduce across N nodes also 2(N-1) S / the nodes' total NIC bandwidth
  cut        data that must cross a cut (torus bisection, a node, a leaf pod) / its capacity
  latency    the latency of the farthest pair that must communicate
  lp         the max-concurrent-flow LP over those links, reduced on a torus by the
             symmetries its faults leave intact (one commodity family per orbit; exact).
             Alltoall: solved exactly up to 10000 flow variables; above, PDLP solves it and
             the bound is the certified lower value of its solution (weak duality from its
             link prices), with the gap to a feasible flow printed; above 400000 the
             best certificate of hop counts, the best cut and a routing's link prices,
             with the gap to the routed flow printed; skipped, as the output says, above
             60000 flow variables (--lp-max-variables raises it: 8x8x8 with one failed
             link is 120 families x 3071 links, about a minute; with four 512 x 3068,
             routed, about half a minute). The others: skipped above 1024 max-flow LPs
             or 500000 links; allreduce: one joint LP of its reduce-scatter and allgather
             flows sharing each link, replaced by the larger of the two phase LPs above
             10000 flow variables (--lp-max-variables sets that limit too)
  routes     a group smaller than the machine: the LP of one flow per pair of members
             along the routes between them, each member sending and receiving what it
             must, all sharing each link (a link only one pair's routes reach carries only
             that pair's bytes); skipped, as the output says, above 300000 flow variables

"% of bound" in 'cclc sim' is the strongest bound over the simulated time.

Allgather and reducescatter across the nodes of a machine made of nodes also get a bound
that holds only in the IR's lockstep model (barriers between steps), printed where it is
above the best: every step that crosses into (out of) a node pays a route's latency, and
what enters a node reaches its other GPUs a step later (an LP over the steps per node).

examples:
  cclc bounds examples/torus5x5.ccl
  cclc bounds --no-lp examples/hgx16_leafspine.ccl
  cclc bounds --lp-max-variables 2000000 big_torus.ccl"""


def add_parser(sub) -> None:
    p = sub.add_parser("bounds", help="print the lower bounds of every collective in a file",
                       description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file", metavar="FILE.ccl", help="the program")
    p.add_argument("--no-lp", action="store_true",
                   help="closed-form bounds only (no lp, no routes)")
    p.add_argument("--lp-max-variables", type=_positive, metavar="N",
                   help="solve the alltoall LP (the joint allreduce LP) up to N flow "
                        "variables (default 60000; allreduce 10000)")
    p.set_defaults(run=run)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got '{text}'")
    return value


def run(args) -> int:
    # the .ccl front end (lark, ~0.3 s to import) and cclc.lockstep_bound only when this command
    # runs, not for cclc --help
    import dsl
    from cclc.lockstep_bound import lockstep_bound

    program = dsl.load(args.file)       # errors carry spans: the CLI renders them
    progress = Progress(lambda line: print(line, file=sys.stderr, flush=True))
    for i, coll in enumerate(program.collectives):
        if i:
            print()
        with progress.stage(f"{coll.name}: computing the lower bounds of {coll.n} ranks") as st:
            b = bounds(coll, lp=not args.no_lp, lp_max_variables=args.lp_max_variables,
                       on_stage=functools.partial(st.update, 0))
        print(f"{coll.name}: {coll.kind.value} of {coll.size} B on {coll.n} ranks of "
              f"'{coll.topology.name}'")
        width = max(len(x.name) for x in b.items)
        for x in b.items:
            mark = "*" if x is b.best_bound else " "
            print(f" {mark} {x.name:<{width}} {x.seconds * 1e6:>14.3f} us  {x.description}")
        for note in b.notes:
            print(f"   note: {note}")
        print(f"   best: {b.name}, {b.best * 1e6:.3f} us")
        lockstep = lockstep_bound(coll)
        if lockstep is not None and lockstep.seconds > b.best:
            print(f"   in the lockstep model: {lockstep.seconds * 1e6:.3f} us (the best is "
                  f"{100 * b.best / lockstep.seconds:.1f}% of it), {lockstep.description}")
    if not program.collectives:
        print(f"{args.file}: no collectives")
    return 0
