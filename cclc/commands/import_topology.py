"""``cclc import FILE.xml``: the ``.ccl`` node type an NCCL topology file describes.

(Named ``import_topology``, not after the command: ``import`` is a Python keyword, and a
module so named can only be loaded through :mod:`importlib`.)
"""

from __future__ import annotations

import argparse
import re
import sys

from cclc.nccl_topo import read_nccl_topology

__all__ = ["add_parser", "node_statement", "run"]

HELP = """Read an NCCL topology file (what NCCL_TOPO_DUMP_FILE writes, what NCCL_TOPO_FILE
reads) and print the .ccl node type it describes: GPUs, their NVLinks or PCIe links, the NICs
in rail order with the GPU each sits beside. Paste the statement into a .ccl file, or read the
file there directly with  node NAME = nccl_xml("FILE.xml").

example:
  NCCL_TOPO_DUMP_FILE=node.xml mpirun -np 8 ./all_reduce_perf -b 8 -e 8   # any NCCL run
  cclc import node.xml --name hgx"""


def add_parser(sub) -> None:
    p = sub.add_parser("import", help="print the node type of an NCCL topology XML file",
                       description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file", metavar="FILE.xml", help="the NCCL topology file")
    p.add_argument("--name", default="node", help="the node type's name (default: node)")
    p.set_defaults(run=run)


def run(args) -> int:
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", args.name):
        print(f"error: --name '{args.name}' is not a .ccl name (letters, digits and _, not "
              "starting with a digit)", file=sys.stderr)
        return 2
    print(node_statement(args.file, args.name))
    return 0


def _number(x: float) -> str:
    return f"{x:.6g}"


def node_statement(path: str, name: str) -> str:
    """The commented ``node NAME = ...`` statement for an NCCL topology file."""
    imported = read_nccl_topology(path, name)
    node = imported.node
    lines = [f"# from the NCCL topology {path}: {node.gpus} GPUs"]
    if node.interconnect == "nvswitch":
        links = sorted(set(imported.nvlinks_per_gpu))
        lines[0] += f", {'/'.join(map(str, links))} NVLinks each to NVSwitches"
    else:
        lines[0] += " on PCIe (no NVLink)"
    if node.nics:
        rails = ", ".join(f"{nic} (GPU {'/'.join(map(str, near)) or '-'})"
                          for nic, near in zip(imported.nic_names, imported.nic_gpus, strict=True))
        lines.append(f"# NICs in rail order (nearest GPUs): {rails}")
    lines.append(f"# the file has no latency: {_number(node.latency * 1e6)} us is cclc's "
                 f"default for a{'n NVSwitch' if node.interconnect == 'nvswitch' else ' PCIe'} "
                 "node")
    lines.append(f"node {name} = {node.interconnect}(gpus = {node.gpus}) {{")
    lines.append(f"    link {_number(node.bandwidth / 1e9)} GB/s, "
                 f"{_number(node.latency * 1e6)} us")
    if node.nics:
        lines.append(f"    nic  {node.nics} x {_number(node.nic_bandwidth * 8 / 1e9)} Gb/s")
    lines.append("}")
    return "\n".join(lines)
