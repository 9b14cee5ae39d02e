"""The layers hold: no import cycle among the modules of cclc, backends and dsl, no import from
a lower layer to a higher one (the layers of ``docs/dev/pipeline.md``), and no module imports
another module's ``_private`` name.

The import graph is read from the source with :mod:`ast`, imports at module level and inside
functions alike (an import inside a function still makes one module depend on the other; it
only hides the cycle from the interpreter). ``from package import name`` is an edge to the
submodule ``package.name`` when there is one, else to the package.
"""

from __future__ import annotations

import ast
import functools
import re
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("cclc", "backends", "dsl")
LAYERS_DOC = ROOT / "docs" / "dev" / "pipeline.md"

#: imports that still run up the layers, each with the part of issue 30 that removes it; an
#: entry no longer in the graph fails :func:`test_known_upward_imports_are_still_there`, so
#: the list only shrinks
KNOWN_UPWARD: set[tuple[str, str]] = set()


def _modules() -> dict[str, tuple[Path, bool]]:
    """Every module of the packages: dotted name -> (file, whether it is a package)."""
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts.pop()
            found[".".join(parts)] = (path, is_package)
    return found


def _known(name: str, modules) -> str | None:
    """The innermost module of ours that ``name`` (a dotted import target) lies in."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str, path: Path, is_package: bool, modules):
    """``(target module, imported name or None, line)`` for every import in ``path``."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, None, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                if submodule in modules:
                    yield submodule, None, node.lineno
                else:
                    yield source, alias.name, node.lineno


@functools.cache
def _graph():
    """The import edges between our modules, and the private names imported across them."""
    modules = _modules()
    edges: dict[str, set[str]] = {m: set() for m in modules}
    private = []
    for module, (path, is_package) in modules.items():
        for target, name, line in _imports(module, path, is_package, modules):
            ours = _known(target, modules)
            if ours is None or ours == module:
                continue
            edges[module].add(ours)
            if name is not None and name.startswith("_") and not name.startswith("__"):
                private.append(f"{path.relative_to(ROOT)}:{line}: {module} imports "
                               f"{ours}.{name}")
    return edges, private


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (``a -> b -> ... -> a``) per strongly connected component of more than one
    module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[v] = min(low[v], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    components.append(set(component))
    return [_cycle_in(sorted(c)[0], c, edges) for c in components]


def _cycle_in(start: str, component: set[str], edges) -> list[str]:
    """A shortest path from ``start`` back to itself inside ``component``."""
    parent = {start: None}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(edges[v] & component):
                if w == start:
                    path = [v]
                    while parent[path[-1]] is not None:
                        path.append(parent[path[-1]])
                    return [*reversed(path), start]
                if w not in parent:
                    parent[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no cycle through {start}")


def test_the_graph_sees_imports_inside_functions():
    edges, _ = _graph()
    # dsl.elaborate imports cclc.nccl_topo at module level; cclc.commands.tune imports
    # cclc.tuning.outputs inside a function
    assert "cclc.nccl_topo" in edges["dsl.elaborate"]
    assert "cclc.tuning.outputs" in edges["cclc.commands.tune"]


def test_cycles_are_found():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(edges) == [["a", "b", "c", "a"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    edges, _ = _graph()
    cycles = _cycles(edges)
    assert not cycles, "import cycles (move the shared piece to the module it belongs to):\n" + \
        "\n".join(" -> ".join(c) for c in cycles)


def test_no_private_names_imported_from_other_modules():
    _, private = _graph()
    assert not private, ("private names imported from another module (make the name public "
                         "where it is shared, or move it):\n" + "\n".join(private))


def _layers() -> list[tuple[str, list[str]]]:
    """The "Layers" list of ``docs/dev/pipeline.md``, bottom first: (name, module patterns).
    A pattern is a module, or ``package.*`` for a package and every module in it; only the
    names before an item's dash count."""
    text = LAYERS_DOC.read_text(encoding="utf-8")
    section = text.split("\n## Layers\n", 1)[1].split("\n## ", 1)[0]
    items = re.findall(r"^\d+\. \*\*(.+?)\*\*(.*?)(?=^\d+\. |\Z)", section, re.M | re.S)
    return [(name, re.findall(r"`((?:cclc|backends|dsl)[\w.]*?(?:\.\*)?)`",
                              body.split(" —", 1)[0]))
            for name, body in items]


def _layer_of(module: str, layers) -> int | None:
    """The index of the layer whose most specific pattern covers ``module``."""
    best, best_len = None, -1
    for i, (_, patterns) in enumerate(layers):
        for p in patterns:
            if p.endswith(".*"):
                base = p[:-2]
                hit = module == base or module.startswith(base + ".")
                length = len(base)
            else:
                hit = module == p
                length = len(p) + 1            # a module named exactly beats its package's .*
            if hit and length > best_len:
                best, best_len = i, length
    return best


def _upward(edges: dict[str, set[str]], layers) -> list[tuple[str, str]]:
    """Every import from a module to one in a higher layer."""
    return sorted((m, t) for m, targets in edges.items() for t in targets
                  if (_layer_of(t, layers) or 0) > (_layer_of(m, layers) or 0))


def test_the_layers_are_read_from_the_doc():
    layers = _layers()
    names = [name for name, _ in layers]
    assert names[0] == "core" and names[-1] == "commands", names
    assert all(patterns for _, patterns in layers), layers
    assert _layer_of("cclc.synth.trees", layers) == names.index("synthesis")
    assert _layer_of("cclc.pipeline", layers) == names.index("pipeline")


def test_an_upward_import_is_found():
    layers = [("low", ["a", "b.*"]), ("high", ["c"])]
    assert _upward({"b.x": {"c", "a"}, "c": {"b.y"}, "a": set()}, layers) == [("b.x", "c")]


def test_every_module_has_a_layer():
    layers = _layers()
    edges, _ = _graph()
    missing = sorted(m for m in edges if _layer_of(m, layers) is None)
    assert not missing, ("modules without a layer (give each a place in the Layers list of "
                         "docs/dev/pipeline.md):\n" + "\n".join(missing))


def test_every_layer_pattern_names_a_module():
    edges, _ = _graph()
    stale = [p for _, patterns in _layers() for p in patterns
             if _layer_of_pattern(p, edges) == 0]
    assert not stale, f"the Layers list of docs/dev/pipeline.md names no such module: {stale}"


def _layer_of_pattern(pattern: str, modules) -> int:
    """How many of ``modules`` the pattern covers."""
    return sum(_layer_of(m, [("", [pattern])]) is not None for m in modules)


def test_no_import_from_a_lower_layer_to_a_higher_one():
    layers = _layers()
    edges, _ = _graph()
    names = [name for name, _ in layers]
    up = [f"{m} ({names[_layer_of(m, layers) or 0]}) imports {t} "
          f"({names[_layer_of(t, layers) or 0]})"
          for m, t in _upward(edges, layers) if (m, t) not in KNOWN_UPWARD]
    assert not up, ("imports from a lower layer to a higher one (move the shared piece down, "
                    "or pass it in as an argument):\n" + "\n".join(up))


def test_known_upward_imports_are_still_there():
    edges, _ = _graph()
    gone = sorted(pair for pair in KNOWN_UPWARD if pair[1] not in edges.get(pair[0], set()))
    assert not gone, f"fixed, so remove them from KNOWN_UPWARD: {gone}"


def _function_imports_without_a_reason(path: Path) -> list[int]:
    """The lines of the imports inside functions of ``path`` that no comment explains: a
    comment on the import's lines, or on the line above the run of imports it belongs to."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found: list[ast.stmt] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, True)
            elif isinstance(child, (ast.Import, ast.ImportFrom)) and in_function:
                found.append(child)
            else:
                visit(child, in_function)

    visit(ast.parse("\n".join(lines), str(path)), False)
    import_lines = {i for node in found for i in range(node.lineno, (node.end_lineno or 0) + 1)}
    missing = []
    for node in found:
        if any("#" in lines[i - 1] for i in range(node.lineno, (node.end_lineno or 0) + 1)):
            continue
        above = node.lineno - 1                 # 1-based: the line above the import
        # up over the imports of the same run (and the blank lines that group them)
        while above in import_lines or (not lines[above - 1].strip() and above - 1 in import_lines):
            above -= 1
        if above < 1 or not lines[above - 1].strip().startswith("#"):
            missing.append(node.lineno)
    return missing


def test_the_function_import_check_needs_a_comment(tmp_path):
    source = tmp_path / "m.py"
    source.write_text(textwrap.dedent("""\
        import os


        def f():
            # why: one comment covers the run of imports, blank lines between groups too
            import json
            import re

            import ast
            return os, json, re, ast


        def g():
            x = 1
            import json
            return json, x


        def h():
            import json  # why
            return json
        """))
    assert _function_imports_without_a_reason(source) == [15]     # g's import


def test_every_import_inside_a_function_says_why():
    """An import belongs at the top of its module; one inside a function is there for a
    reason (it keeps an expensive or optional package off a path that does not need it, or
    ``cclc.cli``'s rule that every import happens inside ``main``'s handler), and a comment on
    it or above its run of imports says which, so the exception stays one."""
    missing = [f"{path.relative_to(ROOT)}:{line}"
               for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))
               for line in _function_imports_without_a_reason(path)]
    assert not missing, ("imports inside functions without a comment saying why (move them to "
                         "the top of the module, or say what they keep off which path):\n"
                         + "\n".join(missing))
