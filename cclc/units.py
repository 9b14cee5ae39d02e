"""Physical units of the language, converted to SI base units (bytes, bytes/s, seconds)."""

from __future__ import annotations

from typing import Literal

from cclc.errors import SemanticError

__all__ = ["UNITS", "MIN_BANDWIDTH", "MAX_BANDWIDTH", "MAX_LATENCY", "parse_quantity",
           "format_bytes", "format_time", "format_bandwidth", "format_duration"]

Kind = Literal["size", "bandwidth", "time"]

_SIZE = {"B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12,
         "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
_BANDWIDTH = {"B/s": 1, "KB/s": 1e3, "MB/s": 1e6, "GB/s": 1e9, "TB/s": 1e12,
              "Kb/s": 1e3 / 8, "Mb/s": 1e6 / 8, "Gb/s": 1e9 / 8, "Tb/s": 1e12 / 8}
_TIME = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}

UNITS: dict[Kind, dict[str, float]] = {"size": _SIZE, "bandwidth": _BANDWIDTH, "time": _TIME}

# Links outside these ranges are typing mistakes, and their times overflow to inf or lose all
# precision in the simulator and the bounds (1e-300 B/s gives "inf% of bound").
MIN_BANDWIDTH = 1.0      #: bytes/s
MAX_BANDWIDTH = 1e15     #: bytes/s (1 PB/s, a thousand times an NVLink 5 port)
MAX_LATENCY = 1.0        #: seconds


def _kind_of(unit: str) -> str | None:
    for kind, table in UNITS.items():
        if unit in table:
            return kind
    return None


def parse_quantity(value: float, unit: str, kind: Kind) -> float:
    """``value unit`` in SI base units; raises :class:`SemanticError` for a wrong or unknown unit.

    >>> parse_quantity(400, "Gb/s", "bandwidth")
    50000000000.0
    """
    table = UNITS[kind]
    if unit in table:
        return float(value) * table[unit]
    other = _kind_of(unit)
    examples = ", ".join(list(table)[:6])
    if other is None:
        raise SemanticError(f"unknown unit '{unit}'; a {kind} takes one of {examples}, ...")
    raise SemanticError(f"'{unit}' is a {other} unit, but a {kind} is expected here "
                        f"(one of {examples}, ...)")


def format_bytes(n: float) -> str:
    """Human-readable binary size: ``format_bytes(3 * 2**20) == '3 MiB'``."""
    for unit in ("GiB", "MiB", "KiB"):
        scale = _SIZE[unit]
        if n >= scale:
            v = n / scale
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.3g} {unit}"
    return f"{n:.0f} B"


def format_time(t: float) -> str:
    """Human-readable time with 4 significant digits."""
    for unit in ("s", "ms", "us"):
        if t >= _TIME[unit]:
            return f"{t / _TIME[unit]:.4g} {unit}"
    return f"{t / _TIME['ns']:.4g} ns"


def format_bandwidth(bps: float) -> str:
    """Bandwidth in GB/s (decimal), as nccl-tests prints it."""
    return f"{bps / 1e9:.4g} GB/s"


def format_duration(seconds: float, digits: int = 3) -> str:
    """A long wait in words, ``digits`` significant digits: ``"2.5 hours"``, ``"1 minute"``,
    ``"40 s"``."""
    for unit, size in (("days", 86400.0), ("hours", 3600.0), ("minutes", 60.0)):
        if seconds >= size:
            count = f"{seconds / size:.{digits}g}"
            return f"{count} {unit[:-1] if count == '1' else unit}"
    return f"{seconds:.{digits}g} s"
