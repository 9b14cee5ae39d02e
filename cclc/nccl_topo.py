"""NCCL's topology XML (``NCCL_TOPO_DUMP_FILE`` / ``NCCL_TOPO_FILE``) to a :class:`NodeType`.

NCCL describes one server as ``<system>`` → ``<cpu>`` (one per NUMA node) → nested ``<pci>``
elements (PCIe switches and devices, with ``class``, ``link_speed`` and ``link_width``); a GPU
is a ``<gpu dev sm ...>`` inside its ``<pci>``, with ``<nvlink target count tclass>`` children;
a NIC is a ``<nic>`` whose ``<net name dev speed ...>`` children are its ports (speed in Mb/s).
Element and attribute names follow NCCL's src/graph/xml.cc and topo.cc.

cclc's node model is one switch (an NVSwitch or a PCIe switch) joining identical GPUs, plus
NICs that sit beside GPU ``i * gpus / nics``. ``node_type_from_xml`` reads what the file
says and maps it onto that model, refusing (with the file's line and column) what the model
cannot describe: GPU-to-GPU NVLink without an NVSwitch, GPUs of which only some have NVLink,
NICs whose PCIe affinity differs from the model's placement.
"""

from __future__ import annotations

import re
import xml.parsers.expat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from cclc.errors import Span, TopologyError
from cclc.nccl_model import NVLINK
from cclc.topology import NodeType

__all__ = ["DEFAULT_LATENCY", "ImportedNode", "node_type_from_xml", "read_nccl_topology"]

#: NCCL's XML carries no latencies: GPU-to-GPU latency of the imported node, the values of
#: cclc's examples (a `link` setting in the .ccl block overrides them)
DEFAULT_LATENCY = {"nvswitch": 1e-6, "pcie": 2e-6}

# NCCL's table of PCIe link speeds (topo.cc kvDictPciGen): the per-lane rate in 100 Mb/s, found
# by prefix; a link's bandwidth is rate * width / 80 GB/s (Gen4 x16 = 24 GB/s, Gen5 x16 = 48)
_PCI_GEN = (("2.5 GT/s", 15), ("5 GT/s", 30), ("5.0 GT/s", 30), ("8 GT/s", 60),
            ("8.0 GT/s", 60), ("16 GT/s", 120), ("16.0 GT/s", 120), ("32 GT/s", 240),
            ("32.0 GT/s", 240), ("64 GT/s", 480), ("64.0 GT/s", 480))

_NVSWITCH_CLASS = 0x068000


@dataclass(slots=True)
class _Element:
    """One XML element with its position (expat gives lines from 1 and columns from 0)."""

    tag: str
    attrs: dict[str, str]
    line: int
    col: int
    parent: _Element | None = None
    children: list[_Element] = field(default_factory=list)

    def walk(self):
        yield self
        for child in self.children:
            yield from child.walk()

    def ancestors(self):
        node = self.parent
        while node is not None:
            yield node
            node = node.parent


@dataclass(frozen=True, slots=True)
class ImportedNode:
    """What the file describes, beside the node type made of it.

    ``gpu_busids`` in model order (by ``dev``); ``nic_names`` in model order (NIC ``i`` is
    rail ``i``); ``nic_gpus[i]`` the GPUs nearest NIC ``i`` in the PCIe tree.
    """

    node: NodeType
    gpu_busids: tuple[str, ...]
    nvlinks_per_gpu: tuple[int, ...]
    nic_names: tuple[str, ...]
    nic_gpus: tuple[tuple[int, ...], ...]


def read_nccl_topology(path: str | Path, name: str, latency: float | None = None,
                       bandwidth: float | None = None) -> ImportedNode:
    """Read an NCCL topology file; see :func:`node_type_from_xml`."""
    p = Path(path)
    if p.exists() and not p.is_file():
        # a folder, a device such as /dev/zero, a pipe: never read without end
        raise TopologyError(f"cannot read '{path}': it is not a regular file")
    data = p.read_bytes()
    return node_type_from_xml(data, str(path), name, latency=latency, bandwidth=bandwidth)


def node_type_from_xml(data: bytes | str, file: str, name: str, latency: float | None = None,
                       bandwidth: float | None = None) -> ImportedNode:
    """The node type an NCCL topology XML describes.

    ``file`` names the file in error spans; ``latency``/``bandwidth`` override the GPU link's
    values (NCCL's file has no latency). Raises :class:`TopologyError` placed in the file.

    >>> xml = '''<system version="1"><cpu numaid="0">
    ...   <pci busid="0000:01:00.0" class="0x030200" link_speed="16.0 GT/s PCIe" link_width="16">
    ...     <gpu dev="0" sm="80"/></pci>
    ...   <pci busid="0000:02:00.0" class="0x030200" link_speed="16.0 GT/s PCIe" link_width="16">
    ...     <gpu dev="1" sm="80"/></pci></cpu></system>'''
    >>> node = node_type_from_xml(xml, "t.xml", "box").node
    >>> node.interconnect, node.gpus, node.bandwidth
    ('pcie', 2, 24000000000.0)
    """
    root = _parse(data, file)

    def fail(message: str, where: _Element | None = None) -> TopologyError:
        at = where or root
        return TopologyError(message, Span(file, at.line, at.col + 1))

    if root.tag != "system":
        raise fail(f"not an NCCL topology file: the root element is <{root.tag}>; NCCL's "
                   "topology files (NCCL_TOPO_DUMP_FILE) start with <system version=\"1\">")
    gpus = _gpus(root, fail)
    nvlinks = _nvlinks(gpus, fail)
    interconnect: Literal["nvswitch", "pcie"] = \
        "nvswitch" if all(n > 0 for n in nvlinks) else "pcie"
    gpu_bandwidth = _gpu_bandwidth(gpus, nvlinks, interconnect, fail)
    nets, speeds, nearest = _nics(root, gpus, interconnect, fail)

    node = NodeType(
        name=name, interconnect=interconnect, gpus=len(gpus),
        bandwidth=gpu_bandwidth if bandwidth is None else bandwidth,
        latency=DEFAULT_LATENCY[interconnect] if latency is None else latency,
        nics=len(nets), nic_bandwidth=min(speeds) * 1e6 / 8 if nets else 0.0)
    return ImportedNode(
        node=node, gpu_busids=tuple(_pci(g).attrs.get("busid", "?") for g in gpus),
        nvlinks_per_gpu=tuple(nvlinks),
        nic_names=tuple(n.attrs.get("name", f"net{i}") for i, n in enumerate(nets)),
        nic_gpus=tuple(nearest))


def _gpus(root: _Element, fail) -> list[_Element]:
    """The <gpu> elements by ``dev``, each checked to sit inside its <pci>."""
    gpus = sorted((e for e in root.walk() if e.tag == "gpu"),
                  key=lambda e: _int(e, "dev", fail))
    if not gpus:
        raise fail("the NCCL topology has no <gpu> element: cclc builds a node from its GPUs")
    devs = [_int(g, "dev", fail) for g in gpus]
    if len(set(devs)) != len(devs):
        dup = next(g for g, d in zip(gpus, devs, strict=True) if devs.count(d) > 1)
        raise fail(f"two GPUs have dev=\"{dup.attrs['dev']}\"", dup)
    for g in gpus:
        if g.parent is None or g.parent.tag != "pci":
            raise fail("a <gpu> must sit inside its <pci> element", g)
    return gpus


def _nvlinks(gpus: list[_Element], fail) -> list[int]:
    """NVLinks of every GPU to NVSwitches: every GPU has some, or none does."""
    nvlinks = []
    for g in gpus:
        count = 0
        for link in (c for c in g.children if c.tag == "nvlink"):
            tclass = _hex(link, "tclass", fail)
            if tclass != _NVSWITCH_CLASS:
                raise fail(f"an NVLink to a device of class {link.attrs['tclass']} (not an "
                           "NVSwitch, class 0x068000): cclc's node model joins GPUs through "
                           "one switch, so direct GPU-to-GPU NVLink cannot be described", link)
            count += _int(link, "count", fail)
        nvlinks.append(count)
    with_nvlink = [n > 0 for n in nvlinks]
    if any(with_nvlink) and not all(with_nvlink):
        lone = gpus[with_nvlink.index(False)]
        raise fail(f"GPU dev {lone.attrs['dev']} has no NVLink to an NVSwitch while other GPUs "
                   "have: cclc's node model needs every GPU on the same switch", lone)
    return nvlinks


def _pci(gpu: _Element) -> _Element:
    """The <pci> element a <gpu> sits in (:func:`_gpus` refuses a file where one does not)."""
    if gpu.parent is None:
        raise AssertionError(f"<gpu> at line {gpu.line} has no parent")
    return gpu.parent


def _gpu_bandwidth(gpus: list[_Element], nvlinks: list[int], interconnect: str, fail) -> float:
    """The slowest GPU's link: its NVLinks at the rate of its ``sm``, or its PCIe link."""
    if interconnect != "nvswitch":
        return min(_pci_bandwidth(_pci(g), fail) for g in gpus)
    rates = []
    for g, n in zip(gpus, nvlinks, strict=True):
        sm = _int(g, "sm", fail)
        rate = NVLINK.get(sm)
        if rate is None:
            raise fail(f"no NVLink rate is known for sm=\"{sm}\" (known: "
                       f"{', '.join(map(str, NVLINK))}); give the bandwidth with "
                       "a `link` setting", g)
        rates.append(n * rate.hardware)
    return min(rates)


def _nics(root: _Element, gpus: list[_Element], interconnect: str, fail
          ) -> tuple[list[_Element], list[int], list]:
    """Every <net> (one port NCCL can use; the model calls each one a NIC) in the model's
    order, their speeds (Mb/s) and the GPUs nearest each in the PCIe tree."""
    nets = [e for e in root.walk() if e.tag == "net"]
    for nic in (e for e in root.walk() if e.tag == "nic"):
        if not any(c.tag == "net" for c in nic.children):
            raise fail("a <nic> without a <net> element: NCCL writes each port as <net "
                       "name=... speed=...> inside <nic>", nic)
    speeds = [_int(n, "speed", fail) for n in nets]
    for n, s in zip(nets, speeds, strict=True):
        if s <= 0:
            raise fail(f"NIC speed must be > 0 Mb/s, got speed=\"{n.attrs['speed']}\"", n)
    gpu_index = {id(g): i for i, g in enumerate(gpus)}
    nearest = [_nearest_gpus(n, gpu_index) for n in nets]
    order = sorted(range(len(nets)),
                   key=lambda i: (min(nearest[i], default=len(gpus)),
                                  _int(nets[i], "dev", fail) if "dev" in nets[i].attrs else i))
    nets = [nets[i] for i in order]
    nearest = [nearest[i] for i in order]
    speeds = [speeds[i] for i in order]
    if interconnect == "nvswitch":
        for i, (net, near) in enumerate(zip(nets, nearest, strict=True)):
            placed = i * len(gpus) // len(nets)
            if near and placed not in near:
                raise fail(f"NIC {net.attrs.get('name', i)} is nearest GPU(s) "
                           f"{', '.join(map(str, near))} in the PCIe tree, but cclc's node model "
                           f"puts NIC {i} of {len(nets)} beside GPU {placed} "
                           f"(NIC i beside GPU i * {len(gpus)} / {len(nets)})", net)
    return nets, speeds, nearest


def _binary(data: bytes | str) -> bool:
    """Whether ``data`` looks like a binary file rather than XML text: NUL bytes, or bytes
    that are not UTF-8 where no XML declaration names another encoding."""
    if isinstance(data, str):
        return "\0" in data
    if b"\0" in data:
        return True
    if data.lstrip().startswith(b"<?xml") and b"encoding" in data.split(b"?>", 1)[0]:
        return False
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def _parse(data: bytes | str, file: str) -> _Element:
    """A tree of :class:`_Element` with positions; XML errors become a TopologyError."""
    parser = xml.parsers.expat.ParserCreate()
    stack: list[_Element] = []
    roots: list[_Element] = []

    def start(tag: str, attrs: dict[str, str]) -> None:
        parent = stack[-1] if stack else None
        elem = _Element(tag, attrs, parser.CurrentLineNumber, parser.CurrentColumnNumber, parent)
        (parent.children if parent else roots).append(elem)
        stack.append(elem)

    parser.StartElementHandler = start
    parser.EndElementHandler = lambda tag: stack.pop()
    try:
        parser.Parse(data, True)
    except xml.parsers.expat.ExpatError as err:
        message = xml.parsers.expat.ErrorString(err.code)
        if _binary(data):
            raise TopologyError("not an NCCL topology file: a binary file, expected the XML "
                                "text that NCCL_TOPO_DUMP_FILE writes",
                                Span(file, err.lineno, err.offset + 1)) from None
        raise TopologyError(f"not an NCCL topology file: XML error: {message}",
                            Span(file, err.lineno, err.offset + 1)) from None
    return roots[0]


def _int(elem: _Element, attr: str, fail) -> int:
    text = elem.attrs.get(attr)
    if text is None:
        raise fail(f"<{elem.tag}> needs a {attr}=\"...\" attribute", elem)
    try:
        return int(text, 0)
    except ValueError:
        raise fail(f"{attr}=\"{text}\" of <{elem.tag}> is not a whole number", elem) from None


def _hex(elem: _Element, attr: str, fail) -> int:
    text = elem.attrs.get(attr)
    if text is None or not re.fullmatch(r"0x[0-9a-fA-F]+", text):
        raise fail(f"<{elem.tag}> needs a {attr}=\"0x...\" attribute (a PCI class)", elem)
    return int(text, 16)


def _pci_bandwidth(pci: _Element, fail) -> float:
    """NCCL's bandwidth of a PCIe link in bytes/s: per-lane rate x width / 80 GB/s."""
    speed = pci.attrs.get("link_speed")
    if speed is None or "link_width" not in pci.attrs:
        raise fail("the GPU's <pci> needs link_speed and link_width (e.g. link_speed=\"16.0 GT/s "
                   "PCIe\" link_width=\"16\") for a node without NVLink", pci)
    rate = next((r for prefix, r in sorted(_PCI_GEN, key=lambda p: -len(p[0]))
                 if speed.startswith(prefix)), None)
    if rate is None:
        raise fail(f"unknown PCIe link_speed \"{speed}\" (NCCL writes e.g. \"16.0 GT/s PCIe\")",
                   pci)
    width = _int(pci, "link_width", fail)
    if width <= 0:
        raise fail(f"link_width must be > 0, got \"{pci.attrs['link_width']}\"", pci)
    return rate * width / 80 * 1e9


def _nearest_gpus(net: _Element, gpu_index: dict[int, int]) -> tuple[int, ...]:
    """The GPUs in the smallest PCIe subtree above ``net`` that holds any."""
    for above in net.ancestors():
        found = sorted(gpu_index[id(e)] for e in above.walk() if id(e) in gpu_index)
        if found:
            return tuple(found)
    return ()
