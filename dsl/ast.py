"""The syntax tree of a ``.ccl`` file: what the user wrote, with where they wrote it.

Nodes are frozen dataclasses; every node carries the :class:`~cclc.errors.Span` of its text so
that the elaborator can point an error at the exact token. Nothing here is checked beyond the
grammar: names are unresolved, numbers are unconverted, units are plain strings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from cclc.errors import Span

__all__ = [
    "Algorithm",
    "Argument",
    "Call",
    "CollectiveDef",
    "Coord",
    "Cores",
    "DTypeSetting",
    "Endpoint",
    "FaultGroup",
    "FaultLink",
    "FaultNic",
    "FaultRank",
    "FaultSwitch",
    "File",
    "Flag",
    "Group",
    "Leaves",
    "Link",
    "LinkPair",
    "Name",
    "Nic",
    "NodeDef",
    "Nodes",
    "Number",
    "Op",
    "Oversubscription",
    "Path",
    "PathPart",
    "Pods",
    "Ports",
    "Quantity",
    "Rails",
    "Root",
    "Routing",
    "Schedule",
    "Selector",
    "Setting",
    "Size",
    "Sizes",
    "Spines",
    "Statement",
    "String",
    "TopologyDef",
    "Wrap",
]


# ---- values -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Name:
    """An identifier, kept verbatim."""

    text: str
    span: Span


@dataclass(frozen=True, slots=True)
class Number:
    """A numeric literal; ``value`` is an ``int`` when ``text`` has no point or exponent."""

    value: int | float
    text: str
    span: Span


@dataclass(frozen=True, slots=True)
class String:
    """A double-quoted string; ``value`` is without the quotes."""

    value: str
    span: Span


@dataclass(frozen=True, slots=True)
class Quantity:
    """A number with an optional unit, e.g. ``56 GB/s``; ``unit`` is ``None`` when absent."""

    number: Number
    unit: Name | None
    span: Span


@dataclass(frozen=True, slots=True)
class Argument:
    """One argument of a call: positional (``key`` is ``None``) or ``key = value``."""

    key: Name | None
    value: Quantity | Name | String
    span: Span


@dataclass(frozen=True, slots=True)
class Call:
    """``name(arguments)``: a constructor (``torus(4, 4)``) or a hint (``pat(buffer = 4 MiB)``).

    A hint written without parentheses (``algorithm ring``) has no arguments.
    """

    name: Name
    arguments: tuple[Argument, ...]
    span: Span


@dataclass(frozen=True, slots=True)
class Coord:
    """Torus coordinates ``(x, y, z)``."""

    values: tuple[Number, ...]
    span: Span


@dataclass(frozen=True, slots=True)
class PathPart:
    """One step of a fabric path: ``leaf(2)``, ``nic(1)`` or a bare ``switch``."""

    name: Name
    index: Number | None
    span: Span


@dataclass(frozen=True, slots=True)
class Path:
    """A fabric vertex such as ``node(3).nic(1)``, ``leaf(2)`` or ``spine(5)``."""

    parts: tuple[PathPart, ...]
    span: Span


Endpoint = Number | Coord | Path
"""A vertex: a rank id, torus coordinates, or a fabric path."""


@dataclass(frozen=True, slots=True)
class LinkPair:
    """``a -- b`` (both directions, ``both`` true) or ``a -> b`` (one direction)."""

    a: Endpoint
    b: Endpoint
    both: bool
    span: Span


@dataclass(frozen=True, slots=True)
class Selector:
    """``.rail(i)``, ``.node(i)``, ``.leaders`` or ``.ranks[...]`` after a topology name."""

    name: Name
    index: Number | None
    ranks: tuple[Endpoint, ...] | None
    span: Span


@dataclass(frozen=True, slots=True)
class Group:
    """The ranks a collective runs on: a topology, optionally narrowed by a selector."""

    topology: Name
    selector: Selector | None
    span: Span


@dataclass(frozen=True, slots=True)
class Flag:
    """``on`` or ``off`` in a ``wrap`` list."""

    value: bool
    span: Span


# ---- settings (one line of a block) -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Setting:
    """Base of the statements inside a block; ``keyword`` is how the user spells it."""

    keyword: ClassVar[str] = ""
    span: Span

    @property
    def keyword_span(self) -> Span:
        """The span of the leading keyword, for errors about the setting as a whole."""
        return Span(self.span.file, self.span.line, self.span.col, self.span.line,
                    self.span.col + len(self.keyword.split()[0]))


@dataclass(frozen=True, slots=True)
class Wrap(Setting):
    """``wrap on, on, off``: whether each torus dimension wraps around."""

    keyword: ClassVar[str] = "wrap"
    flags: tuple[Flag, ...]


@dataclass(frozen=True, slots=True)
class Link(Setting):
    """``link BW, LAT`` for every dimension or link, or ``link dim D: BW, LAT`` for one."""

    keyword: ClassVar[str] = "link"
    dim: Number | None
    bandwidth: Quantity
    latency: Quantity


@dataclass(frozen=True, slots=True)
class FaultLink(Setting):
    """``fault link A -- B`` or ``fault link A -> B``."""

    keyword: ClassVar[str] = "fault link"
    pair: LinkPair


@dataclass(frozen=True, slots=True)
class FaultRank(Setting):
    """``fault rank R``: a failed rank, and with it all its links."""

    keyword: ClassVar[str] = "fault rank"
    rank: Endpoint


@dataclass(frozen=True, slots=True)
class FaultGroup(Setting):
    """``fault group NAME { A -- B; ... }``: links that fail together (an optical switch)."""

    keyword: ClassVar[str] = "fault group"
    name: Name
    links: tuple[LinkPair, ...]


@dataclass(frozen=True, slots=True)
class FaultSwitch(Setting):
    """``fault switch core(3)``: a failed switch, and with it all its links."""

    keyword: ClassVar[str] = "fault switch"
    device: Endpoint


@dataclass(frozen=True, slots=True)
class FaultNic(Setting):
    """``fault nic node(5).nic(2)``: a failed NIC, and with it all its links."""

    keyword: ClassVar[str] = "fault nic"
    device: Endpoint


@dataclass(frozen=True, slots=True)
class Nodes(Setting):
    """``nodes N x TYPE``: the servers of a fabric."""

    keyword: ClassVar[str] = "nodes"
    count: Number
    node_type: Name


@dataclass(frozen=True, slots=True)
class Rails(Setting):
    """``rails N``: rail planes of a leaf/spine fabric."""

    keyword: ClassVar[str] = "rails"
    count: Number


@dataclass(frozen=True, slots=True)
class Leaves(Setting):
    """``leaves N``: leaf switches of a leaf/spine fabric."""

    keyword: ClassVar[str] = "leaves"
    count: Number


@dataclass(frozen=True, slots=True)
class Spines(Setting):
    """``spines N``: spine switches of a leaf/spine fabric."""

    keyword: ClassVar[str] = "spines"
    count: Number


@dataclass(frozen=True, slots=True)
class Pods(Setting):
    """``pods N``: leaf/spine pods of a three-tier fabric, joined by core switches."""

    keyword: ClassVar[str] = "pods"
    count: Number


@dataclass(frozen=True, slots=True)
class Cores(Setting):
    """``cores N``: core switches of a three-tier fabric."""

    keyword: ClassVar[str] = "cores"
    count: Number


@dataclass(frozen=True, slots=True)
class Oversubscription(Setting):
    """``oversubscription R`` or ``oversubscription R, C``: leaf downlink over uplink bandwidth
    (2 means 2:1), and on a three-tier fabric the spine's over its core uplinks."""

    keyword: ClassVar[str] = "oversubscription"
    ratio: Number
    core_ratio: Number | None = None


@dataclass(frozen=True, slots=True)
class Routing(Setting):
    """``routing none``: what the network carries by itself (see cclc.routing)."""

    keyword: ClassVar[str] = "routing"
    mode: Name


@dataclass(frozen=True, slots=True)
class Nic(Setting):
    """``nic N x BW``: NICs of a node type and the bandwidth of each."""

    keyword: ClassVar[str] = "nic"
    count: Number
    bandwidth: Quantity


@dataclass(frozen=True, slots=True)
class Ports(Setting):
    """``ports N``: switch ports of each NIC."""

    keyword: ClassVar[str] = "ports"
    count: Number


@dataclass(frozen=True, slots=True)
class Multicast(Setting):
    """``multicast``: the node's NVSwitch does NVLS multicast (loads that reduce and stores
    that reach every GPU of the node in one operation)."""

    keyword: ClassVar[str] = "multicast"


@dataclass(frozen=True, slots=True)
class Size(Setting):
    """``size Q``: the collective's size (see docs/language.md for what it counts)."""

    keyword: ClassVar[str] = "size"
    size: Quantity


@dataclass(frozen=True, slots=True)
class Sizes(Setting):
    """``sizes "file.csv"``: per-pair alltoall bytes, relative to the ``.ccl`` file."""

    keyword: ClassVar[str] = "sizes"
    path: String


@dataclass(frozen=True, slots=True)
class DTypeSetting(Setting):
    """``dtype NAME``: the element type."""

    keyword: ClassVar[str] = "dtype"
    dtype: Name


@dataclass(frozen=True, slots=True)
class Algorithm(Setting):
    """``algorithm NAME`` or ``algorithm NAME(key = value, ...)``."""

    keyword: ClassVar[str] = "algorithm"
    hint: Call


@dataclass(frozen=True, slots=True)
class Schedule(Setting):
    """``schedule NAME`` or ``schedule NAME(key = value, ...)``."""

    keyword: ClassVar[str] = "schedule"
    hint: Call


@dataclass(frozen=True, slots=True)
class Op(Setting):
    """``op NAME``: the reduction operator."""

    keyword: ClassVar[str] = "op"
    op: Name


@dataclass(frozen=True, slots=True)
class Root(Setting):
    """``root I``: the root's index within the group."""

    keyword: ClassVar[str] = "root"
    index: Number


# ---- top-level statements -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TopologyDef:
    """``topology NAME = CTOR(...) { settings }``."""

    name: Name
    constructor: Call
    settings: tuple[Setting, ...]
    span: Span


@dataclass(frozen=True, slots=True)
class NodeDef:
    """``node NAME = nvswitch(gpus = N) { settings }``."""

    name: Name
    constructor: Call
    settings: tuple[Setting, ...]
    span: Span


@dataclass(frozen=True, slots=True)
class CollectiveDef:
    """``collective NAME = KIND on GROUP { settings }``."""

    name: Name
    kind: Name
    group: Group
    settings: tuple[Setting, ...]
    span: Span


Statement = TopologyDef | NodeDef | CollectiveDef


@dataclass(frozen=True, slots=True)
class File:
    """A whole ``.ccl`` file: its statements in order."""

    filename: str
    statements: tuple[Statement, ...]
