"""Syntax tree to model: resolve names, convert units, build topologies and collectives.

``elaborate`` walks the statements in file order; a name must be defined before it is used.
Every check that concerns what the user wrote (a unit, a count, a coordinate, a setting given
twice) is made here, against the token that is wrong. The model's own checks (``cclc.topology``,
``cclc.collective``) still run; an error they raise is placed at the statement, or at the part
of it that the error concerns, before it leaves this module.
"""

from __future__ import annotations

import difflib
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from cclc.collective import (
    REDUCING_KINDS,
    Collective,
    CollectiveKind,
    DType,
    Hint,
    ReduceOp,
    make_collective,
)
from cclc.errors import CclError, CollectiveError, SemanticError, Span, TopologyError
from cclc.nccl_topo import read_nccl_topology
from cclc.routing import FABRIC_ROUTINGS, TORUS_ROUTINGS
from cclc.topology import (
    NodeType,
    Topology,
    fat_tree,
    interconnect_named,
    leaf_spine,
    single_node,
    single_switch,
    torus,
)
from cclc.units import UNITS, parse_quantity
from dsl import ast
from dsl.values import (
    FAULT_SETTINGS,
    MAX_BYTES,
    MAX_RANKS,
    bandwidth_of,
    check_scale,
    choose,
    convert_quantity,
    count_of,
    latency_of,
    no_link_dims,
    one_setting,
    plain_number,
    positional_name,
    quantity_text,
    settings_block,
)
from dsl.vertices import apply_faults, display_name, rank_of

__all__ = ["MAX_BYTES", "MAX_RANKS", "Program", "elaborate"]


@dataclass(frozen=True, slots=True)
class Program:
    """Everything a ``.ccl`` file defines, by name (topologies, node types) or in file order."""

    topologies: dict[str, Topology]
    node_types: dict[str, NodeType]
    collectives: tuple[Collective, ...]


def elaborate(file: ast.File, base_dir: str | os.PathLike[str] = ".") -> Program:
    """Build the topologies, node types and collectives of a parsed file.

    ``base_dir`` is where relative file names in the source (``sizes "m.csv"``) are found:
    the directory of the ``.ccl`` file. Raises a :class:`CclError` subclass with a span.

    >>> from dsl.parser import parse
    >>> src = "topology t = torus(4) { link 50 GB/s, 1 us }\\n"
    >>> src += "collective c = allgather on t { size 1 MiB }"
    >>> elaborate(parse(src, "t.ccl")).collectives[0].group
    (0, 1, 2, 3)
    """
    scope = _Scope(file)
    collectives: list[Collective] = []
    for stmt in file.statements:
        scope.check_new(stmt.name)
        try:
            if isinstance(stmt, ast.NodeDef):
                scope.define(stmt.name, "node type", _node_type(stmt, Path(base_dir)))
            elif isinstance(stmt, ast.TopologyDef):
                scope.define(stmt.name, "topology", _topology(stmt, scope))
            else:
                collectives.append(_collective(stmt, scope, Path(base_dir)))
                scope.define(stmt.name, "collective", collectives[-1])
        except CclError as err:
            # the last resort: an error nobody placed points at its statement
            raise err.with_span(stmt.span) from None
    if not file.statements:
        # an empty file would check clean and compile into an empty folder: almost surely the
        # wrong file, or one not yet saved
        raise SemanticError("the file declares nothing: a .ccl file holds a topology "
                            "('topology NAME = torus(4, 4) { link 50 GB/s, 1 us }') and "
                            "collectives on it", Span(file.filename, 1, 1))
    return Program(topologies=scope.of_kind("topology"), node_types=scope.of_kind("node type"),
                   collectives=tuple(collectives))


# ---- names ---------------------------------------------------------------------------------------


_PLURAL = {"topology": "topologies", "node type": "node types", "collective": "collectives"}
_KIND_OF_DEF = {ast.TopologyDef: "topology", ast.NodeDef: "node type",
                ast.CollectiveDef: "collective"}


class _Scope:
    """Top-level names: one namespace for topologies, node types and collectives."""

    def __init__(self, file: ast.File):
        self.defined: dict[str, tuple[str, object, ast.Name]] = {}
        self.declared: dict[str, tuple[str, ast.Name]] = {}
        for stmt in file.statements:
            self.declared.setdefault(stmt.name.text, (_KIND_OF_DEF[type(stmt)], stmt.name))

    def check_new(self, name: ast.Name) -> None:
        if name.text in self.defined:
            kind, _, first = self.defined[name.text]
            raise SemanticError(f"duplicate name '{name.text}': already defined as a {kind} on "
                                f"line {first.span.line}", name.span)

    def define(self, name: ast.Name, kind: str, value: object) -> None:
        self.defined[name.text] = (kind, value, name)

    def of_kind(self, kind: str) -> dict:
        return {n: value for n, (k, value, _) in self.defined.items() if k == kind}

    def lookup(self, name: ast.Name, kind: str):
        """The value of ``name``, which must be a ``kind`` defined above the use."""
        if name.text in self.defined:
            found, value, _ = self.defined[name.text]
            if found == kind:
                return value
            raise SemanticError(f"'{name.text}' is a {found}, not a {kind}", name.span)
        later = self.declared.get(name.text)
        if later is not None and later[0] == kind:
            raise SemanticError(f"{kind} '{name.text}' is used before its definition on line "
                                f"{later[1].span.line}; define it above this line", name.span)
        known = list(self.of_kind(kind))
        message = f"unknown {kind} '{name.text}'"
        close = difflib.get_close_matches(name.text, known, n=1)
        if close:
            message += f"; did you mean '{close[0]}'?"
        if known:
            message += f" ({_PLURAL[kind]} defined so far: {', '.join(known)})"
        else:
            message += f" (no {kind} is defined above this line)"
        raise SemanticError(message, name.span)


# ---- node types ----------------------------------------------------------------------------------


def _node_type(stmt: ast.NodeDef, base_dir: Path) -> NodeType:
    """``node NAME = nvswitch(gpus = 8) { link ...; nic ...; ports ... }``."""
    ctor = stmt.constructor
    interconnect = choose(("nvswitch", "pcie", "nccl_xml"), ctor.name, "node kind")
    if interconnect == "nccl_xml":
        return _nccl_xml_node(stmt, base_dir)
    args = ctor.arguments
    if len(args) != 1 or args[0].key is None or args[0].key.text != "gpus":
        raise SemanticError(f"{interconnect}(...) takes the number of GPUs, e.g. "
                            f"{interconnect}(gpus = 8)", ctor.span)
    gpus = count_of(plain_number(args[0].value, "gpus"), "gpus")
    block = settings_block(stmt.settings, (ast.Link, ast.Nic, ast.Ports, ast.Multicast),
                           "a node type")
    link = one_setting(block, ast.Link)
    if link is None:
        raise SemanticError(f"node type '{stmt.name.text}' needs a `link` setting: the "
                            "bandwidth and latency from a GPU to the others, e.g. "
                            "link 450 GB/s, 1 us", stmt.name.span)
    no_link_dims(link)
    nic, ports = one_setting(block, ast.Nic), one_setting(block, ast.Ports)
    if ports is not None and nic is None:
        raise SemanticError("'ports' counts the switch ports of each NIC, but this node type "
                            "has no `nic` setting", ports.keyword_span)
    multicast = one_setting(block, ast.Multicast)
    if multicast is not None and interconnect != "nvswitch":
        raise SemanticError("'multicast' says the node's NVSwitch does NVLS multicast; a "
                            f"{interconnect} node has no NVSwitch", multicast.keyword_span)
    return NodeType(
        name=stmt.name.text, interconnect=interconnect_named(interconnect), gpus=gpus,
        bandwidth=bandwidth_of(link.bandwidth), latency=latency_of(link.latency),
        nics=count_of(nic.count, "the number of NICs") if nic else 0,
        nic_bandwidth=bandwidth_of(nic.bandwidth) if nic else 0.0,
        nic_ports=count_of(ports.count, "ports") if ports else 1,
        multicast=multicast is not None)


def _nccl_xml_node(stmt: ast.NodeDef, base_dir: Path) -> NodeType:
    """``node NAME = nccl_xml("node.xml") { link ...; ports ... }``: NCCL's topology file.

    The file gives GPUs, their NVLink or PCIe links, NICs and speeds; a `link` setting
    overrides the GPU link (the file has no latency), `ports` splits each NIC.
    """
    ctor = stmt.constructor
    args = ctor.arguments
    if len(args) != 1 or args[0].key is not None or not isinstance(args[0].value, ast.String):
        raise SemanticError('nccl_xml(...) takes the name of an NCCL topology file (written by '
                            'NCCL_TOPO_DUMP_FILE), e.g. nccl_xml("node.xml")', ctor.span)
    path = args[0].value
    block = settings_block(stmt.settings, (ast.Link, ast.Ports),
                           "a node type from an NCCL file",
                           {ast.Nic: "the NICs and their speeds come from the NCCL file"})
    link, ports = one_setting(block, ast.Link), one_setting(block, ast.Ports)
    no_link_dims(link)
    try:
        imported = read_nccl_topology(
            base_dir / path.value, stmt.name.text,
            latency=latency_of(link.latency) if link else None,
            bandwidth=bandwidth_of(link.bandwidth) if link else None)
    except OSError as err:
        raise SemanticError(f"cannot read the NCCL topology file '{path.value}': "
                            f"{err.strerror or err}", path.span) from None
    node = imported.node
    if ports is not None:
        if node.nics == 0:
            raise SemanticError(f"'ports' counts the switch ports of each NIC, but "
                                f"'{path.value}' has no NIC", ports.keyword_span)
        node = replace(node, nic_ports=count_of(ports.count, "ports"))
    return node


# ---- topologies ----------------------------------------------------------------------------------


def _topology(stmt: ast.TopologyDef, scope: _Scope) -> Topology:
    """Dispatch on the constructor: torus, mesh, node or fabric."""
    ctor = stmt.constructor
    kind = choose(tuple(_TOPOLOGY_BUILDERS), ctor.name, "topology kind")
    topo = _TOPOLOGY_BUILDERS[kind](stmt, scope)
    return apply_faults(topo, [s for s in stmt.settings if isinstance(s, FAULT_SETTINGS)])


def _build_torus(stmt: ast.TopologyDef, scope: _Scope) -> Topology:
    """``torus(4, 4, 4)`` and ``mesh(4, 4)``: dims, wrap and per-dimension links."""
    ctor = stmt.constructor
    is_mesh = ctor.name.text == "mesh"
    where = "a mesh" if is_mesh else "a torus"
    hints: dict[type, str] | None = {
        ast.Wrap: "a mesh never wraps around; to choose wrap-around per dimension, write "
                  "torus(...) with `wrap`"} if is_mesh else None
    allowed = ((ast.Link, ast.Routing, *FAULT_SETTINGS) if is_mesh
               else (ast.Wrap, ast.Link, ast.Routing, *FAULT_SETTINGS))
    block = settings_block(stmt.settings, allowed, where, hints)
    if not ctor.arguments:
        raise SemanticError(f"{ctor.name.text}(...) needs at least one dimension size, e.g. "
                            f"{ctor.name.text}(4, 4)", ctor.span)
    dims = []
    for arg in ctor.arguments:
        if arg.key is not None:
            raise SemanticError(f"{ctor.name.text}(...) takes only dimension sizes, e.g. "
                                f"{ctor.name.text}(4, 4, 4)", arg.key.span)
        dims.append(count_of(plain_number(arg.value, "a dimension size"), "a dimension size"))
    shape = "x".join(map(str, dims))
    check_scale(stmt.name, "ranks", math.prod(dims))

    wrap_setting = one_setting(block, ast.Wrap)
    wrap = [not is_mesh] * len(dims)
    if wrap_setting is not None:
        if len(wrap_setting.flags) != len(dims):
            raise SemanticError(f"wrap lists {len(wrap_setting.flags)} values, but "
                                f"'{stmt.name.text}' has {len(dims)} dimensions ({shape})",
                                wrap_setting.span)
        wrap = [flag.value for flag in wrap_setting.flags]

    every: ast.Link | None = None
    per_dim: dict[int, ast.Link] = {}
    for link in block.get(ast.Link, []):
        if link.dim is None:
            every = link
            continue
        d = count_of(link.dim, "a dimension number", minimum=0)
        if d >= len(dims):
            raise SemanticError(f"'{stmt.name.text}' has no dimension {d}: its dimensions are "
                                f"0..{len(dims) - 1}", link.dim.span)
        per_dim[d] = link
    links = [per_dim.get(d, every) for d in range(len(dims))]
    if every is None and None in links:
        missing = links.index(None)
        if not per_dim:
            raise SemanticError(f"topology '{stmt.name.text}' needs a `link` setting, e.g. "
                                "link 50 GB/s, 100 ns", stmt.name.span)
        raise SemanticError(f"dimension {missing} of '{stmt.name.text}' has no link: add "
                            f"`link dim {missing}: ...` or a `link` for all dimensions",
                            stmt.name.span)
    given = [link for link in links if link is not None]      # all of them (checked above)
    bandwidths = [bandwidth_of(link.bandwidth) for link in given]
    latencies = [latency_of(link.latency) for link in given]
    routing = _routing(block, TORUS_ROUTINGS)
    try:
        return torus(stmt.name.text, dims, wrap, bandwidths, latencies, routing=routing)
    except TopologyError as err:
        raise err.with_span(ctor.span) from None


def _build_node(stmt: ast.TopologyDef, scope: _Scope) -> Topology:
    """``node(hgx)``: one server on its own."""
    settings_block(stmt.settings, FAULT_SETTINGS, "a single-node topology")
    node = scope.lookup(positional_name(stmt.constructor, "node type", "node(hgx)"), "node type")
    try:
        return single_node(stmt.name.text, node)
    except TopologyError as err:
        raise err.with_span(stmt.constructor.span) from None


#: the settings of each fabric style, beyond the faults
_FABRIC_SETTINGS = {
    "switch": ((ast.Nodes, ast.Link, ast.Routing), "a switch fabric"),
    "leaf_spine": ((ast.Nodes, ast.Rails, ast.Leaves, ast.Spines, ast.Oversubscription,
                    ast.Link, ast.Routing), "a leaf/spine fabric"),
    "fat_tree": ((ast.Nodes, ast.Pods, ast.Rails, ast.Leaves, ast.Spines, ast.Cores,
                  ast.Oversubscription, ast.Link, ast.Routing), "a three-tier fabric"),
}


def _build_fabric(stmt: ast.TopologyDef, scope: _Scope) -> Topology:
    """``fabric(switch)``, ``fabric(leaf_spine)`` and ``fabric(fat_tree)``: nodes joined by a
    network."""
    ctor = stmt.constructor
    style = choose(tuple(_FABRIC_SETTINGS), positional_name(ctor, "fabric style",
                                                            "fabric(leaf_spine)"),
                   "fabric style")
    allowed, where = _FABRIC_SETTINGS[style]
    block = settings_block(stmt.settings, (*allowed, *FAULT_SETTINGS), where)
    nodes, link = one_setting(block, ast.Nodes), one_setting(block, ast.Link)
    if nodes is None:
        raise SemanticError(f"fabric '{stmt.name.text}' needs a `nodes` setting, e.g. "
                            "nodes 16 x hgx", stmt.name.span)
    if link is None:
        raise SemanticError(f"fabric '{stmt.name.text}' needs a `link` setting: the speed and "
                            "latency of its cables, e.g. link 400 Gb/s, 2 us", stmt.name.span)
    no_link_dims(link)
    n_nodes = count_of(nodes.count, "the number of nodes")
    node: NodeType = scope.lookup(nodes.node_type, "node type")
    if node.nics < 1:
        raise SemanticError(f"node type '{node.name}' has no NICs, so it cannot join a fabric: "
                            "add a `nic` setting to it, e.g. nic 1 x 400 Gb/s",
                            nodes.node_type.span)
    check_scale(stmt.name, "ranks", n_nodes * node.gpus)
    check_scale(stmt.name, "NIC ports", n_nodes * node.nics * node.nic_ports)
    bandwidth, latency = bandwidth_of(link.bandwidth), latency_of(link.latency)
    routing = _routing(block, FABRIC_ROUTINGS)
    try:
        if style == "switch":
            return replace(single_switch(stmt.name.text, n_nodes, node, bandwidth, latency),
                           routing=routing, _cache={})
        rails, leaves, spines, ratio = _pod_shape(stmt, block, node, style)
        if style == "leaf_spine":
            return replace(leaf_spine(stmt.name.text, n_nodes, node, rails, leaves, spines,
                                      ratio[0], bandwidth, latency), routing=routing, _cache={})
        pods, cores = _pods_and_cores(stmt, block, n_nodes, spines)
        return replace(fat_tree(stmt.name.text, n_nodes, node, pods, rails, leaves, spines, cores,
                                ratio, bandwidth, latency), routing=routing, _cache={})
    except TopologyError as err:
        raise err.with_span(ctor.span) from None


def _pod_shape(stmt: ast.TopologyDef, block: dict[type, list], node: NodeType, style: str
               ) -> tuple[int, int, int, tuple[float, float]]:
    """Rails, leaves, spines and oversubscription ratios (leaf -> spine, spine -> core) of a
    leaf/spine fabric or of each pod of a three-tier one (leaves and spines per pod)."""
    rails_setting = one_setting(block, ast.Rails)
    rails = node.nics
    if rails_setting is not None:
        rails = count_of(rails_setting.count, "rails")
        if rails > node.nics:
            raise SemanticError(f"{rails} rails need {rails} NICs per node, but node type "
                                f"'{node.name}' has {node.nics}", rails_setting.count.span)
    planes = rails * node.nic_ports
    leaves_setting = one_setting(block, ast.Leaves)
    leaves = planes
    if leaves_setting is not None:
        leaves = count_of(leaves_setting.count, "leaves")
        if leaves % planes:
            ports = f"{node.nic_ports} port{'s' if node.nic_ports > 1 else ''}"
            raise SemanticError(f"{leaves} leaves cannot be split evenly over {planes} "
                                f"planes ({rails} rails x {ports} per NIC)",
                                leaves_setting.count.span)
    spines_setting = one_setting(block, ast.Spines)
    spines = count_of(spines_setting.count, "spines") if spines_setting else leaves
    check_scale(stmt.name, "leaf-spine links", leaves * spines)
    setting = one_setting(block, ast.Oversubscription)
    ratios = [1.0, 1.0]
    if setting is not None:
        given = [setting.ratio] + ([setting.core_ratio] if setting.core_ratio else [])
        if style == "leaf_spine" and len(given) == 2:
            raise SemanticError("a leaf/spine fabric has one tier of uplinks: give one ratio "
                                "(a second, spine -> core, needs fabric(fat_tree))",
                                setting.core_ratio.span)
        for i, number in enumerate(given):
            ratios[i] = number.value
            if not number.value > 0:
                raise SemanticError(f"oversubscription must be > 0 (2 means 2:1), got "
                                    f"{number.text}", number.span)
    return rails, leaves, spines, (ratios[0], ratios[1])


def _pods_and_cores(stmt: ast.TopologyDef, block: dict[type, list], n_nodes: int,
                    spines: int) -> tuple[int, int]:
    """The ``pods`` (nodes split evenly) and ``cores`` (split evenly over a pod's spines) of
    a three-tier fabric, each checked at its number."""
    pods_setting, cores_setting = one_setting(block, ast.Pods), one_setting(block, ast.Cores)
    if pods_setting is None:
        raise SemanticError(f"fabric '{stmt.name.text}' needs a `pods` setting: how many "
                            "leaf/spine pods the core joins, e.g. pods 8", stmt.name.span)
    pods = count_of(pods_setting.count, "pods")
    if n_nodes % pods:
        raise SemanticError(f"{n_nodes} nodes cannot be split evenly over {pods} pods",
                            pods_setting.count.span)
    cores = spines
    if cores_setting is not None:
        cores = count_of(cores_setting.count, "cores")
        if cores % spines:
            raise SemanticError(f"{cores} cores cannot be split evenly over the {spines} "
                                "spines of a pod (spine j of every pod links to core group j)",
                                cores_setting.count.span)
    check_scale(stmt.name, "spine-core links", pods * cores)
    return pods, cores


def _routing(block: dict[type, list], allowed: Sequence[str]) -> str:
    """The declared routing, or the first of ``allowed`` (the kind's default)."""
    setting = one_setting(block, ast.Routing)
    return allowed[0] if setting is None else choose(allowed, setting.mode, "routing")


_TOPOLOGY_BUILDERS = {"torus": _build_torus, "mesh": _build_torus, "node": _build_node,
                      "fabric": _build_fabric}


# ---- collectives ---------------------------------------------------------------------------------


_ROOTED = (CollectiveKind.BROADCAST, CollectiveKind.REDUCE)
_KINDS = tuple(k.value for k in CollectiveKind)


def _collective(stmt: ast.CollectiveDef, scope: _Scope, base_dir: Path) -> Collective:
    """``collective NAME = KIND on GROUP { size ...; dtype ...; ... }``."""
    kind = CollectiveKind(choose(_KINDS, stmt.kind, "collective kind"))
    topo, group = _group(stmt.group, scope)
    allowed: list[type] = [ast.Size, ast.DTypeSetting, ast.Algorithm, ast.Schedule]
    if kind is CollectiveKind.ALLTOALL:
        allowed.append(ast.Sizes)
    if kind in REDUCING_KINDS:
        allowed.append(ast.Op)
    if kind in _ROOTED:
        allowed.append(ast.Root)
    what = f"'{stmt.name.text}' is {'an' if kind.value[0] in 'a' else 'a'} {kind.value}"
    hints = {
        ast.Sizes: f"'sizes' (a per-pair size matrix) is only for alltoall; {what}",
        ast.Op: f"'op' is only for reducing collectives (reducescatter, allreduce, reduce); "
                f"{what}",
        ast.Root: f"'root' is only for broadcast and reduce; {what}",
    }
    block = settings_block(stmt.settings, allowed, f"a {kind.value}", hints)
    size_setting, sizes_setting = one_setting(block, ast.Size), one_setting(block, ast.Sizes)
    if size_setting is not None and sizes_setting is not None:
        later = max(size_setting, sizes_setting, key=lambda s: (s.span.line, s.span.col))
        raise SemanticError("give either 'size' or 'sizes', not both", later.keyword_span)
    if size_setting is None and sizes_setting is None:
        alternative = ' or a size matrix, sizes "m.csv"' if kind is CollectiveKind.ALLTOALL else ""
        raise SemanticError(f"collective '{stmt.name.text}' needs a size, e.g. size 16 MiB"
                            f"{alternative}", stmt.name.span)
    size = pair_sizes = None
    if size_setting is not None:
        size_bytes = convert_quantity(size_setting.size, "size")
        if size_bytes != math.floor(size_bytes):
            raise SemanticError(f"{quantity_text(size_setting.size)} is not a whole number of "
                                "bytes", size_setting.size.span)
        if size_bytes > MAX_BYTES:
            raise SemanticError(f"{quantity_text(size_setting.size)} is too large (at most "
                                "1024 TiB)", size_setting.size.span)
        size = int(size_bytes)
    else:
        pair_sizes = _read_matrix(sizes_setting.path, base_dir)
    dtype_setting, op_setting = one_setting(block, ast.DTypeSetting), one_setting(block, ast.Op)
    root_setting = one_setting(block, ast.Root)
    algorithm, schedule = one_setting(block, ast.Algorithm), one_setting(block, ast.Schedule)
    root = count_of(root_setting.index, "root", minimum=0) if root_setting else None
    try:
        return make_collective(
            stmt.name.text, kind, topo, group, size=size,
            dtype=DType(choose(tuple(d.value for d in DType), dtype_setting.dtype, "dtype"))
            if dtype_setting else DType.FP32,
            op=ReduceOp(choose(tuple(o.value for o in ReduceOp), op_setting.op, "op"))
            if op_setting else ReduceOp.SUM,
            root=root,
            algorithm=_hint(algorithm.hint) if algorithm else Hint(),
            schedule=_hint(schedule.hint) if schedule else Hint(),
            pair_sizes=pair_sizes, span=stmt.span)
    except CollectiveError as err:
        # make_collective checks the group, then the sizes, then the root
        if not group or not topo.is_connected(group):
            span = stmt.group.span
        elif root is not None and root >= len(group):
            span = root_setting.index.span
        elif sizes_setting is not None:
            span = sizes_setting.path.span
        else:
            span = size_setting.size.span
        raise err.with_span(span) from None


_SELECTORS = ("rail", "node", "leaders", "ranks")


def _group(group: ast.Group, scope: _Scope) -> tuple[Topology, tuple[int, ...]]:
    """The topology and the ranks (in group order) that ``on GROUP`` names."""
    topo: Topology = scope.lookup(group.topology, "topology")
    sel = group.selector
    if sel is None:
        ranks = topo.live_ranks()
    else:
        name = sel.name.text
        if name not in _SELECTORS:
            close = difflib.get_close_matches(name, _SELECTORS, n=1)
            hint = f"; did you mean '.{close[0]}'?" if close else ""
            raise SemanticError(f"unknown group selector '.{name}'{hint} (selectors: .rail(i), "
                                ".node(i), .leaders, .ranks[...])", sel.name.span)
        if name in ("rail", "node"):
            if sel.index is None:
                raise SemanticError(f"'.{name}' needs an index, e.g. {topo.name}.{name}(0)",
                                    sel.span)
            try:
                ranks = getattr(topo, name)(count_of(sel.index, f"a {name} index", minimum=0))
            except TopologyError as err:
                raise err.with_span(sel.name.span if topo.node_of_rank is None
                                    else sel.index.span) from None
        elif name == "leaders":
            if sel.index is not None or sel.ranks is not None:
                raise SemanticError("'.leaders' takes no index: it is one rank per node",
                                    sel.span)
            try:
                ranks = topo.leaders()
            except TopologyError as err:
                raise err.with_span(sel.name.span) from None
        else:
            if sel.ranks is None:
                raise SemanticError(f"'.ranks' needs a list, e.g. {topo.name}.ranks[0, 1, 2]",
                                    sel.span)
            ranks = _rank_list(topo, sel.ranks)
    if not ranks:
        raise CollectiveError("this group has no live ranks", group.span)
    return topo, tuple(ranks)


def _rank_list(topo: Topology, endpoints: Sequence[ast.Endpoint]) -> tuple[int, ...]:
    ranks: dict[int, ast.Endpoint] = {}
    for endpoint in endpoints:
        rank = rank_of(topo, endpoint)
        name = display_name(topo.vertex_names[rank])
        if rank in ranks:
            raise SemanticError(f"rank {name} is listed twice (first at column "
                                f"{ranks[rank].span.col})", endpoint.span)
        if rank in topo.failed_ranks:
            raise SemanticError(f"rank {name} has failed (a `fault rank` of '{topo.name}')",
                                endpoint.span)
        ranks[rank] = endpoint
    return tuple(ranks)


def _hint(call: ast.Call) -> Hint:
    """``pat`` or ``pipeline(chunks = 6)`` as a :class:`Hint`; values with units become SI."""
    params: dict[str, int | float | str] = {}
    spans: dict[str, Span] = {}
    for arg in call.arguments:
        if arg.key is None:
            raise SemanticError(f"parameters of '{call.name.text}' are written name = value, "
                                "e.g. pipeline(chunks = 6)", arg.span)
        if arg.key.text in params:
            raise SemanticError(f"parameter '{arg.key.text}' is given twice", arg.key.span)
        params[arg.key.text] = _param_value(arg.value)
        spans[arg.key.text] = arg.span
    return Hint(call.name.text, tuple(params.items()), call.span, tuple(spans.items()))


def _param_value(value: ast.Quantity | ast.Name | ast.String) -> int | float | str:
    if isinstance(value, ast.Name):
        return value.text
    if isinstance(value, ast.String):
        return value.value
    if value.unit is None:
        return value.number.value
    kind = next((k for k, table in UNITS.items() if value.unit.text in table), None)
    if kind is None:
        raise SemanticError(f"unknown unit '{value.unit.text}': a parameter is a plain number, "
                            "a size (B, KiB, MiB, GB, ...), a bandwidth (GB/s, Gb/s, ...) or a "
                            "time (ns, us, ms, s)", value.unit.span)
    converted = parse_quantity(value.number.value, value.unit.text, kind)
    return int(converted) if kind == "size" and converted == int(converted) else converted


def _read_matrix(path: ast.String, base_dir: Path) -> np.ndarray:
    """The alltoall size matrix of a CSV file: bytes, row = sender, column = receiver."""
    file = base_dir / path.value
    try:
        text = file.read_text(encoding="utf-8-sig")     # spreadsheets often write a BOM
    except (OSError, UnicodeDecodeError) as err:
        reason = err.strerror if isinstance(err, OSError) else "it is not UTF-8 text"
        raise SemanticError(f"cannot read the size matrix '{path.value}': {reason}",
                            path.span) from None
    rows: list[list[int]] = []
    for line_no, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        row = []
        for col_no, cell in enumerate((c.strip() for c in line.split(",")), 1):
            where = f"'{path.value}' line {line_no}, column {col_no}"
            try:
                value = float(cell)
            except ValueError:
                raise SemanticError(f"{where}: '{cell}' is not a number of bytes",
                                    path.span) from None
            if not math.isfinite(value) or value != math.floor(value):
                raise SemanticError(f"{where}: {cell} is not a whole number of bytes", path.span)
            if value < 0:
                raise SemanticError(f"{where}: {cell} is negative", path.span)
            if value > MAX_BYTES:
                raise SemanticError(f"{where}: {cell} is too large (at most 1024 TiB)", path.span)
            row.append(int(value))
        if rows and len(row) != len(rows[0]):
            raise SemanticError(f"'{path.value}' line {line_no} has {len(row)} entries, but the "
                                f"first row has {len(rows[0])}", path.span)
        rows.append(row)
    if not rows:
        raise SemanticError(f"the size matrix '{path.value}' is empty", path.span)
    return np.array(rows, dtype=np.int64)

