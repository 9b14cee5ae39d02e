"""The schedule document: ``<collective>.schedule.json`` (format: docs/schedule-format.md).

The IR itself, written by :func:`cclc.serialize.to_json`; ``cclc verify``, ``sim`` and ``viz``
read it back.
"""

from __future__ import annotations

import json
from pathlib import Path

from backends.contract import Backend, EmitOptions, Facts
from cclc.collective import Collective
from cclc.ir import Schedule
from cclc.serialize import to_json

__all__ = ["BACKEND", "JsonBackend"]


class JsonBackend:
    """The verified schedule as a versioned JSON document."""

    name = "json"
    wants_simulation = False

    def files(self, key: Collective, options: EmitOptions) -> tuple[str, ...]:
        return (f"{key.name}.schedule.json",)

    def render(self, subject: Schedule, options: EmitOptions, facts: Facts
               ) -> dict[str, str | bytes]:
        text = json.dumps(to_json(subject), separators=(",", ":"), allow_nan=False) + "\n"
        return {f"{subject.collective.name}.schedule.json": text}

    def build(self, folder: Path, key: Collective, options: EmitOptions) -> list[str]:
        return []


BACKEND: Backend[Collective, Schedule] = JsonBackend()
