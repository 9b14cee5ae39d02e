"""Suspects as ``.ccl`` ``fault`` statements, and a ``.ccl`` file patched with them.

A slow link or cable becomes ``fault link A -> B`` / ``A -- B``; a slow NIC or switch a
``fault group`` of all its cables; a slow GPU (sender, receiver or both) ``fault rank R``: it
is isolated, as C4D isolates a faulty node, and the collectives over the whole topology run on
the others. Compiling the patched file routes every schedule around the suspects.

:func:`fault_set` gives the same suspects as the libraries of ``cclc catalog`` take them: the
directed link ids (``CCLC_FAULTS``, ``cclc_<name>_select_faults``), so a running job switches
to the schedule for them without recompiling.
"""

from __future__ import annotations

import re

from cclc.diagnose.localize import Suspect
from cclc.errors import CclError
from cclc.topology import Topology

__all__ = ["fault_set", "fault_statements", "patch_source"]


def ccl_name(topo: Topology, v: int) -> str:
    """Vertex ``v`` as a ``.ccl`` file names it: ``(2,3)`` on a torus, ``node(3).nic(1)``."""
    name = topo.vertex_names[v]
    if topo.kind == "torus":
        return name
    return re.sub(r"([a-z]+)(\d+)", r"\1(\2)", name)


def _cables(topo: Topology, links: tuple[int, ...]) -> list[str]:
    """Link pairs ``A -- B`` where both directions are in ``links``, else ``A -> B``."""
    todo = set(links)
    out = []
    for li in sorted(links):
        if li not in todo:
            continue
        u, v = int(topo.link_src[li]), int(topo.link_dst[li])
        back = topo.link_id(v, u)
        todo.discard(li)
        if back is not None and back in todo:
            todo.discard(back)
            out.append(f"{ccl_name(topo, u)} -- {ccl_name(topo, v)}")
        else:
            out.append(f"{ccl_name(topo, u)} -> {ccl_name(topo, v)}")
    return out


def fault_statements(topo: Topology, suspects: tuple[Suspect, ...]) -> list[str]:
    """One ``fault`` statement per suspect, with a comment naming the evidence."""
    lines = []
    for s in suspects:
        why = (f"# cclc diagnose: {s.kind} {s.name}, confidence {s.confidence:.2f}, "
               f"{s.slow} of {s.pairs} pairs slow, median {_x(s.slowdown)}")
        lines.append(why)
        if s.rank is not None:
            lines.append(f"fault rank {ccl_name(topo, s.rank)}")
            continue
        live = tuple(li for li in s.links if not topo.link_failed[li])
        cables = _cables(topo, live)
        if len(cables) == 1:
            lines.append(f"fault link {cables[0]}")
        elif cables:
            group = re.sub(r"[^A-Za-z0-9_]", "_", f"suspect_{s.name}")
            lines.append(f"fault group {group} {{ {'; '.join(cables)} }}")
    return lines


def fault_set(topo: Topology, suspects: tuple[Suspect, ...]
              ) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The directed link ids of the suspects' healthy links, sorted (the form a catalog
    library selects by), and the suspected ranks, which a link fault set cannot name (the
    communicator must be rebuilt without them)."""
    links = sorted({int(li) for s in suspects if s.rank is None for li in s.links
                    if not topo.link_failed[li]})
    ranks = sorted({int(s.rank) for s in suspects if s.rank is not None})
    return tuple(links), tuple(ranks)


def _x(slowdown: float) -> str:
    return "hung" if slowdown == float("inf") else f"{slowdown:.2f}x"


def patch_source(text: str, filename: str, topology: str, statements: list[str]) -> str:
    """``text`` with ``statements`` added at the end of the block of topology ``topology``."""
    # the .ccl front end (lark, ~0.3 s to import) only when a .ccl file is read, not for cclc --help
    from dsl.parser import parse

    tree = parse(text, filename)
    defs = [s for s in tree.statements
            if type(s).__name__ == "TopologyDef" and s.name.text == topology]
    if not defs:
        raise CclError(f"{filename} defines no topology '{topology}'")
    span = defs[0].span
    lines = text.splitlines(keepends=True)
    end_line, end_col = span.end_line, span.end_col
    if end_line is None or end_col is None:
        raise CclError(f"cannot find the end of topology '{topology}' in {filename}")
    line = lines[end_line - 1]
    brace = line.rfind("}", 0, end_col)
    if brace < 0:
        raise CclError(f"topology '{topology}' in {filename} has no {{ ... }} block to add "
                       "faults to")
    indent = "    "
    added = "".join(f"{indent}{s}\n" for s in statements)
    before, after = line[:brace], line[brace:]
    # the closing brace alone on its line: insert above it; after settings: break the line
    patched = (before.rstrip() + "\n" + added + after) if before.strip() else \
        (added + before + after)
    lines[end_line - 1] = patched
    return "".join(lines)
