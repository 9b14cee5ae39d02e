"""The checked values of a ``.ccl`` file: numbers with their units, counts, names chosen from a
list, and the settings of a block, each refused with a message at the token that is wrong
(:mod:`dsl.elaborate` builds the model from them)."""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable, Sequence

from cclc.errors import SemanticError
from cclc.units import MAX_BANDWIDTH, MAX_LATENCY, MIN_BANDWIDTH, Kind, parse_quantity
from dsl import ast

__all__ = ["FAULT_SETTINGS", "MAX_BYTES", "MAX_RANKS", "bandwidth_of", "check_scale",
           "choose", "convert_quantity", "count_of", "latency_of", "no_link_dims",
           "one_setting", "plain_number", "positional_name", "quantity_text",
           "settings_block", "value_text"]

# Far beyond any machine cclc is meant for, and small enough that a typo (an extra zero or
# three) is an error message instead of an out-of-memory crash while building the model.
MAX_RANKS = 1 << 20
MAX_BYTES = 1 << 50     # 1024 TiB: keeps byte counts exact in int64 and float64 arithmetic


def choose(options: Sequence[str], name: ast.Name, what: str) -> str:
    """``name`` if it is one of ``options``, else an error suggesting the closest."""
    if name.text in options:
        return name.text
    message = f"unknown {what} '{name.text}'"
    close = difflib.get_close_matches(name.text, options, n=1)
    if close:
        message += f"; did you mean '{close[0]}'?"
    raise SemanticError(f"{message} (expected one of {', '.join(options)})", name.span)


_UNIT_EXAMPLES = {"size": "MiB or GB", "bandwidth": "GB/s or Gb/s", "time": "ns or us"}


def convert_quantity(q: ast.Quantity, kind: Kind) -> float:
    """``q`` in SI units of ``kind`` (bytes, bytes/s, seconds)."""
    if q.unit is None:
        raise SemanticError(f"missing unit after {q.number.text}: a {kind} needs a unit such as "
                            f"{_UNIT_EXAMPLES[kind]}", q.number.span)
    try:
        value = parse_quantity(q.number.value, q.unit.text, kind)
    except SemanticError as err:
        raise err.with_span(q.unit.span) from None
    if not math.isfinite(value):
        raise SemanticError(f"{q.number.text} is too large", q.number.span)
    return value


def quantity_text(q: ast.Quantity) -> str:
    return q.number.text + (f" {q.unit.text}" if q.unit else "")


def bandwidth_of(q: ast.Quantity) -> float:
    value = convert_quantity(q, "bandwidth")
    if not value > 0:
        raise SemanticError(f"a bandwidth must be > 0, got {quantity_text(q)}", q.span)
    if not MIN_BANDWIDTH <= value <= MAX_BANDWIDTH:
        raise SemanticError(f"a bandwidth must be between 1 B/s and 1 PB/s, got {quantity_text(q)}",
                            q.span)
    return value


def latency_of(q: ast.Quantity) -> float:
    value = convert_quantity(q, "time")
    if value < 0:
        raise SemanticError(f"a latency must be >= 0, got {quantity_text(q)}", q.span)
    if value > MAX_LATENCY:
        raise SemanticError(f"a latency must be at most 1 s, got {quantity_text(q)}", q.span)
    return value


def count_of(n: ast.Number, what: str, minimum: int = 1) -> int:
    """``n`` as a whole number of at least ``minimum`` (and at most :data:`MAX_RANKS`)."""
    if not isinstance(n.value, int) or n.value < minimum:
        raise SemanticError(f"{what} must be a whole number >= {minimum}, got {n.text}", n.span)
    if n.value > MAX_RANKS:
        raise SemanticError(f"{what} of {n.text} is too large (at most {MAX_RANKS})", n.span)
    return n.value


def check_scale(name: ast.Name, what: str, count: int) -> None:
    """A topology whose ``what`` (ranks, NIC ports, leaf-spine links) would be too many."""
    if count > MAX_RANKS:
        raise SemanticError(f"'{name.text}' would have {count} {what}; cclc handles at most "
                            f"{MAX_RANKS}", name.span)


def plain_number(value: ast.Quantity | ast.Name | ast.String, what: str) -> ast.Number:
    """The number of a constructor argument that must be a plain number."""
    if not isinstance(value, ast.Quantity):
        raise SemanticError(f"{what} must be a number, got '{value_text(value)}'", value.span)
    if value.unit is not None:
        raise SemanticError(f"{what} is a plain number, without a unit", value.unit.span)
    return value.number


def value_text(value: ast.Quantity | ast.Name | ast.String) -> str:
    if isinstance(value, ast.Quantity):
        return quantity_text(value)
    return value.text if isinstance(value, ast.Name) else f'"{value.value}"'


FAULT_SETTINGS = (ast.FaultLink, ast.FaultRank, ast.FaultGroup, ast.FaultSwitch,
                  ast.FaultNic)     # the only repeatable settings


def settings_block(settings: Iterable[ast.Setting], allowed: Sequence[type[ast.Setting]],
                   where: str, hints: dict[type, str] | None = None) -> dict[type, list]:
    """The settings of a block by type, after checking each is allowed and given once."""
    out: dict[type, list] = {}
    first: dict[object, ast.Setting] = {}
    for s in settings:
        if type(s) not in allowed:
            if hints and type(s) in hints:
                raise SemanticError(hints[type(s)], s.keyword_span)
            takes = ", ".join(dict.fromkeys(cls.keyword.split()[0] for cls in allowed))
            raise SemanticError(f"'{s.keyword.split()[0]}' is not a setting of {where} "
                                f"(it takes {takes})", s.keyword_span)
        if not isinstance(s, FAULT_SETTINGS):
            key: object = type(s)
            label = s.keyword
            if isinstance(s, ast.Link) and s.dim is not None:
                key, label = (ast.Link, s.dim.value), f"link dim {s.dim.text}"
            if key in first:
                raise SemanticError(f"duplicate setting '{label}': already given on line "
                                    f"{first[key].span.line}", s.keyword_span)
            first[key] = s
        out.setdefault(type(s), []).append(s)
    return out


def one_setting(block: dict[type, list], cls: type):
    return block.get(cls, [None])[0]


def positional_name(call: ast.Call, what: str, example: str) -> ast.Name:
    """The single name argument of ``node(hgx)`` or ``fabric(switch)``."""
    args = call.arguments
    if len(args) != 1 or args[0].key is not None or not isinstance(args[0].value, ast.Name):
        raise SemanticError(f"{call.name.text}(...) takes one {what}, e.g. {example}", call.span)
    return args[0].value


def no_link_dims(link: ast.Link | None) -> None:
    if link is not None and link.dim is not None:
        raise SemanticError("'link dim' is only for tori and meshes; give one `link` here",
                            link.dim.span)
