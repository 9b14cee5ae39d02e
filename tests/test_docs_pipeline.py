"""``docs/dev/pipeline.md`` stays true: every function, class or module it names exists.

Names are written ``module:attribute`` (``cclc.plan:plan``, ``backends.msccl:BACKEND.render``),
dotted (``cclc.relay.lower_relays``), or as a file path with an optional attribute
(``cclc/plan.py:resolve``); each is imported and looked up.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "dev" / "pipeline.md"

_PACKAGE = r"(?:cclc|backends|dsl)"
#: ``module:attr.attr`` or ``module.attr`` (no angle-bracket placeholders)
_DOTTED = re.compile(rf"(?<![\w/.<]){_PACKAGE}(?:\.\w+)*(?::\w+(?:\.\w+)*)?(?![\w<])")
#: ``cclc/plan.py`` or ``cclc/plan.py:resolve``; ``backends/`` alone is a folder
_PATH = re.compile(rf"(?<![\w/]){_PACKAGE}(?:/\w+)*(?:/|\.py(?::\w+(?:\.\w+)*)?|\.lark)")


def _names() -> list[str]:
    text = DOC.read_text(encoding="utf-8")
    return sorted({m.group(0) for m in _DOTTED.finditer(text)}
                  | {m.group(0) for m in _PATH.finditer(text)})


def _resolve(name: str) -> object:
    """The object ``name`` denotes; raises when it does not exist."""
    if "/" in name:
        path, _, attr = name.partition(":")
        if not (ROOT / path).exists():
            raise FileNotFoundError(path)
        if not path.endswith(".py"):
            return ROOT / path
        name = path[:-3].replace("/", ".").removesuffix(".__init__") + (f":{attr}" if attr
                                                                         else "")
    module, _, attr = name.partition(":")
    if not attr:
        # dotted: the longest prefix that imports, the rest attributes
        parts = module.split(".")
        for cut in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:cut]))
            except ModuleNotFoundError:
                continue
            for part in parts[cut:]:
                obj = getattr(obj, part)
            return obj
        raise ModuleNotFoundError(module)
    obj = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def test_the_doc_names_functions():
    names = _names()
    # the walk through one collective names the pipeline's stages by module:function
    assert {"cclc.pipeline:compile_program", "cclc.plan:plan", "cclc.verify:verify",
            "dsl.parser:parse", "backends.msccl.lower:lower_to_fit"} <= set(names)


@pytest.mark.parametrize("name", _names())
def test_named_function_exists(name):
    try:
        _resolve(name)
    except (ImportError, AttributeError, FileNotFoundError) as err:
        pytest.fail(f"docs/dev/pipeline.md names {name}, which does not exist ({err!r})")


def test_a_missing_name_is_caught():
    with pytest.raises(AttributeError):
        _resolve("cclc.plan:no_such_function")
    with pytest.raises(FileNotFoundError):
        _resolve("cclc/no_such_module.py:plan")
