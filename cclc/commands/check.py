"""``cclc check FILE``: parse and elaborate a .ccl file and summarize what it describes."""

from __future__ import annotations

import argparse

from cclc.collective import Collective
from cclc.topology import Topology
from cclc.units import format_bytes

__all__ = ["add_parser", "describe_collective", "describe_group", "describe_topology", "run"]

HELP = """Read a .ccl file, report any error at its file:line:col, and print what it describes:
per topology the ranks, switches (vertices that are not ranks), directed links, failed links,
failed ranks and fault groups; per collective its kind, group, size, dtype and the algorithm
and schedule hints.

example:
  cclc check examples/torus5x5_fault.ccl"""


def add_parser(sub) -> None:
    p = sub.add_parser("check", help="check a .ccl file and summarize it", description=HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file", metavar="FILE.ccl", help="the file to check")
    p.set_defaults(run=run)


def load_program(path: str):
    """``dsl.load(path)``; a seam so the command can be tested on hand-built programs."""
    # the .ccl front end (lark, ~0.3 s to import) only when a .ccl file is read, not for cclc --help
    import dsl

    return dsl.load(path)


def run(args) -> int:
    program = load_program(args.file)
    topologies = dict(program.topologies)
    collectives = tuple(program.collectives)
    print(f"{args.file}: {_plural(len(topologies), 'topology', 'topologies')}, "
          f"{_plural(len(collectives), 'collective')}")
    for topo in topologies.values():
        print(describe_topology(topo))
    for coll in collectives:
        print(describe_collective(coll))
    return 0


def _plural(n: int, word: str, many: str | None = None) -> str:
    return f"{n} {word if n == 1 else (many or word + 's')}"


def describe_topology(topo: Topology) -> str:
    """A few lines: shape, counts of ranks/switches/links, and the faults."""
    if topo.dims is not None:
        kind = f"{topo.kind_name} {'x'.join(map(str, topo.dims))}"
    elif topo.kind == "fabric":
        kind = f"fabric of {_plural(topo.n_nodes, 'node')}"
    else:
        kind = topo.kind
    switches = topo.n_vertices - topo.n_ranks
    lines = [(f"topology {topo.name}: {kind}, {_plural(topo.n_ranks, 'rank')}, "
             f"{_plural(switches, 'switch', 'switches')}, "
             f"{_plural(topo.n_links, 'directed link')}, "
             f"{_plural(topo.n_failed_links, 'failed link')}")]
    if topo.failed_ranks:
        names = ", ".join(topo.vertex_names[r] for r in sorted(topo.failed_ranks))
        lines.append(f"  failed ranks: {names}")
    for gname, links in topo.fault_groups:
        lines.append(f"  fault group {gname}: {_plural(len(links), 'directed link')}")
    # links that failed on their own (not through a failed rank or a group) are listed by name
    failed = set(map(int, topo.link_failed.nonzero()[0]))
    for _, links in topo.fault_groups:
        failed -= set(links)
    dead = topo.failed_ranks
    solo = [link for link in sorted(failed)
            if int(topo.link_src[link]) not in dead and int(topo.link_dst[link]) not in dead]
    if solo:
        shown = ", ".join(topo.link_name(link) for link in solo[:8])
        more = f" (and {len(solo) - 8} more)" if len(solo) > 8 else ""
        lines.append(f"  failed links: {shown}{more}")
    return "\n".join(lines)


def describe_group(coll: Collective) -> str:
    """The group in words: ``all``, ``node(i)``, ``rail(i)``, ``leaders`` or a rank list."""
    topo = coll.topology
    group = tuple(coll.group)
    if set(group) == set(topo.live_ranks()):
        return "all"
    if topo.node_of_rank is not None:
        for i in range(topo.n_nodes):
            if group == topo.node(i):
                return f"node({i})"
        # rail(0) and the leaders (GPU 0 of every node) are one group: name both
        names = []
        if topo.rail_of_rank is not None:
            names = [f"rail({i})" for i in range(int(topo.rail_of_rank.max(initial=-1)) + 1)
                     if group == topo.rail(i)]
        if group == topo.leaders():
            names.append("leaders")
        if names:
            return " = ".join(names)
    names = [topo.vertex_names[r] for r in group]
    return " ".join(names[:6]) + (f" ... {names[-1]}" if len(names) > 6 else "")


def describe_collective(coll: Collective) -> str:
    """One line: name, kind, topology, group, size, dtype, hints."""
    size = ("per-pair sizes, up to " + format_bytes(coll.size) + " per rank"
            if coll.pair_sizes is not None else format_bytes(coll.size))
    extra = ""
    if coll.root is not None:
        extra = f", root {coll.topology.vertex_names[coll.group[coll.root]]}"
    if coll.kind.value in ("reducescatter", "allreduce", "reduce"):
        extra += f", op {coll.op.value}"
    return (f"collective {coll.name}: {coll.kind.value} on {coll.topology.name}, group "
            f"{describe_group(coll)} ({_plural(coll.n, 'rank')}), size {size}, "
            f"{coll.dtype.value}{extra}, algorithm {coll.algorithm}, schedule {coll.schedule}")
