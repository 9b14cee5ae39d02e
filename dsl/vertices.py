"""Vertices, ranks and faults named in a ``.ccl`` file: an endpoint (coordinates, a GPU of a
node, a switch) to its vertex of the topology, and the ``fault`` settings applied to it, each
refused with a message at the endpoint that is wrong (:mod:`dsl.elaborate` uses them)."""

from __future__ import annotations

import re
from collections.abc import Sequence

from cclc.errors import SemanticError, TopologyError
from cclc.topology import (
    Topology,
    with_faults,
)
from dsl import ast
from dsl.values import count_of

__all__ = ["apply_faults", "display_name", "rank_of"]


def display_name(name: str) -> str:
    """A model vertex name as the language writes it: ``node3.nic1`` -> ``node(3).nic(1)``."""
    return re.sub(r"([A-Za-z_]+)(\d+)\b", r"\1(\2)", name)


def _vertex(topo: Topology, endpoint: ast.Endpoint) -> int:
    """The vertex an endpoint names: a rank id, torus coordinates or a fabric path."""
    if isinstance(endpoint, ast.Number):
        rank = count_of(endpoint, "a rank id", minimum=0)
        if rank >= topo.n_ranks:
            raise SemanticError(f"rank {rank} does not exist: '{topo.name}' has ranks "
                                f"0..{topo.n_ranks - 1}", endpoint.span)
        return rank
    if isinstance(endpoint, ast.Coord):
        if topo.dims is None:
            raise SemanticError(f"'{topo.name}' is a {topo.kind}, not a torus: name its parts "
                                "like node(0).gpu(1), leaf(2) or spine(3)", endpoint.span)
        dims = topo.dims
        if len(endpoint.values) != len(dims):
            raise SemanticError(f"these coordinates have {len(endpoint.values)} components, but "
                                f"'{topo.name}' has {len(dims)} dimensions "
                                f"({'x'.join(map(str, dims))})", endpoint.span)
        coords = []
        for d, (number, size) in enumerate(zip(endpoint.values, dims, strict=True)):
            c = count_of(number, "a coordinate", minimum=0)
            if c >= size:
                raise SemanticError(f"coordinate {c} is outside dimension {d} of '{topo.name}' "
                                    f"(size {size}: 0..{size - 1})", number.span)
            coords.append(c)
        return topo.rank_at(coords)
    if topo.dims is not None:
        example = "(" + ",".join("0" for _ in topo.dims) + ")"
        raise SemanticError(f"'{topo.name}' is a {topo.kind_name}: name a rank by its "
                            f"coordinates, e.g. {example}, or by its number", endpoint.span)
    parts = []
    for part in endpoint.parts:
        if part.index is None:
            parts.append(part.name.text)
        else:
            parts.append(f"{part.name.text}{count_of(part.index, 'an index', minimum=0)}")
    try:
        return topo.vertex(".".join(parts))
    except TopologyError:
        raise SemanticError(_missing_vertex(topo, parts), endpoint.span) from None


def _missing_vertex(topo: Topology, parts: list[str]) -> str:
    """Which step of a fabric path does not exist, and what exists there instead."""
    names = topo.vertex_names
    for depth in range(1, len(parts) + 1):
        prefix = ".".join(parts[:depth])
        if not any(n == prefix or n.startswith(prefix + ".") for n in names):
            parent, missing = ".".join(parts[:depth - 1]), parts[depth - 1]
            break
    else:   # every step exists, but the path stops at a server, not at one of its parts
        parent, missing = ".".join(parts), None
    children: dict[str, list[int]] = {}
    for n in names:
        if parent and not n.startswith(parent + "."):
            continue
        step = n[len(parent) + 1:] if parent else n
        m = re.fullmatch(r"([A-Za-z_]+?)(\d*)", step.split(".")[0])
        if m:
            children.setdefault(m.group(1), []).append(int(m.group(2)) if m.group(2) else -1)
    have = {}
    for kind, indices in children.items():
        lo, hi = min(indices), max(indices)
        have[kind] = (kind if hi < 0 else f"{kind}({lo})" if lo == hi
                      else f"{kind}({lo})..{kind}({hi})")
    owner = f"'{topo.name}'" if not parent else display_name(parent)
    if missing is not None and max(children.get(missing, [-1])) >= 0:
        # `node(0).nic` where the node has nic(0)..: the word is right, its index is missing
        return f"'{missing}' needs an index: {owner} has {have[missing]}"
    have_text = ", ".join(have.values())
    if missing is None:
        return f"{owner} is not a single vertex: name one of its parts ({have_text})"
    return f"{owner} has no {display_name(missing)}: it has {have_text}"


def rank_of(topo: Topology, endpoint: ast.Endpoint) -> int:
    vertex = _vertex(topo, endpoint)
    if vertex >= topo.n_ranks:
        raise SemanticError(f"{display_name(topo.vertex_names[vertex])} is not a rank (a GPU or "
                            "torus chip)", endpoint.span)
    return vertex


def _directed_links(topo: Topology, pair: ast.LinkPair) -> list[tuple[int, int]]:
    """The directed links ``a -- b`` or ``a -> b`` names, each checked to exist."""
    u, v = _vertex(topo, pair.a), _vertex(topo, pair.b)
    if u == v:
        raise SemanticError(f"both ends of this link are {display_name(topo.vertex_names[u])}",
                            pair.span)
    directed = [(u, v), (v, u)] if pair.both else [(u, v)]
    for a, b in directed:
        if topo.link_id(a, b) is None:
            raise TopologyError(f"there is no link {display_name(topo.vertex_names[a])} -> "
                                f"{display_name(topo.vertex_names[b])} in '{topo.name}': "
                                f"{_why_no_link(topo, a, b)}", pair.span)
    return directed


def _why_no_link(topo: Topology, a: int, b: int) -> str:
    if topo.dims is None:
        return "they are not directly connected"
    ca, cb = topo.coords(a), topo.coords(b)
    differ = [d for d in range(len(ca)) if ca[d] != cb[d]]
    if len(differ) == 1:
        d = differ[0]
        if abs(ca[d] - cb[d]) == topo.grid_dims[d] - 1 and not topo.grid_wrap[d]:
            return f"dimension {d} does not wrap around"
    return "they are not neighbours"


def apply_faults(topo: Topology,
                 faults: Sequence[ast.FaultLink | ast.FaultRank | ast.FaultGroup
                                  | ast.FaultSwitch | ast.FaultNic]) -> Topology:
    """``topo`` with the failed links, ranks, switches, NICs and fault groups of its block."""
    if not faults:
        return topo
    links: list[tuple[int, int]] = []
    ranks: list[int] = []
    devices: list[int] = []
    groups: list[tuple[str, list[tuple[int, int]]]] = []
    group_lines: dict[str, int] = {}
    # a repeated line is a copy-paste slip that would otherwise pass without a word
    failed_on: dict[tuple[int, int] | int, int] = {}
    for fault in faults:
        if isinstance(fault, ast.FaultLink):
            directed = _directed_links(topo, fault.pair)
            _once(failed_on, directed, "link", fault.pair.span)
            links += directed
        elif isinstance(fault, ast.FaultRank):
            rank = rank_of(topo, fault.rank)
            _once(failed_on, [rank], "rank", fault.rank.span)
            ranks.append(rank)
        elif isinstance(fault, ast.FaultSwitch | ast.FaultNic):
            device = _device(topo, fault)
            _once(failed_on, [device], fault.keyword.split()[1], fault.device.span)
            devices.append(device)
        else:
            name = fault.name.text
            if name in group_lines:
                raise SemanticError(f"duplicate fault group '{name}': already defined on line "
                                    f"{group_lines[name]}", fault.name.span)
            group_lines[name] = fault.name.span.line
            if not fault.links:
                raise SemanticError(f"fault group '{name}' lists no links", fault.name.span)
            groups.append((name, [d for pair in fault.links for d in _directed_links(topo, pair)]))
    return with_faults(topo, links, ranks, groups, devices)


#: how the builders of :mod:`cclc.topology` name switches and NICs (``leaf3``,
#: ``node0.nvswitch``, ``node5.nic2``)
_DEVICE_NAME = {"switch": re.compile(r"(leaf|spine|core)\d+|switch|node\d+\.(nvswitch|pcie)"),
                "nic": re.compile(r"node\d+\.nic\d+")}


def _device(topo: Topology, fault: ast.FaultSwitch | ast.FaultNic) -> int:
    """The switch or NIC a ``fault switch`` / ``fault nic`` names, checked to be one."""
    what = fault.keyword.split()[1]
    if topo.dims is not None:
        raise SemanticError(f"'{topo.name}' is a {topo.kind_name}: it has no {what}es to fail "
                            "(fail its links or ranks instead)" if what == "switch" else
                            f"'{topo.name}' is a {topo.kind_name}: it has no NICs to fail "
                            "(fail its links or ranks instead)", fault.device.span)
    vertex = _vertex(topo, fault.device)
    name = topo.vertex_names[vertex]
    if not _DEVICE_NAME[what].fullmatch(name):
        example = "leaf(0), spine(1) or core(2)" if what == "switch" else "node(0).nic(1)"
        raise SemanticError(f"{display_name(name)} is not a {'NIC' if what == 'nic' else what}"
                            f": name one like {example}", fault.device.span)
    return vertex


def _once(failed_on: dict, items: list, what: str, span) -> None:
    """Record ``items`` as failed at ``span``; a :class:`SemanticError` if one already is."""
    for item in items:
        if item in failed_on:
            raise SemanticError(f"duplicate fault: this {what} already failed on line "
                                f"{failed_on[item]}", span)
    for item in items:
        failed_on[item] = span.line
