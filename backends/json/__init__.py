"""The schedule document: ``<collective>.schedule.json`` (format: docs/schedule-format.md).

A schedule stored by symmetry is written in that form (its representatives and the group).

The IR itself, written by :func:`cclc.serialize.document_pieces` (the document of
:func:`cclc.serialize.to_json`, its large integer arrays formatted by numpy and written as they
come); ``cclc verify``, ``sim`` and ``viz`` read it back.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from backends.contract import Backend, Contents, EmitOptions, Facts
from cclc.collective import Collective
from cclc.execution import ExecutionModel
from cclc.ir import Schedule
from cclc.serialize import document_pieces, symmetric_document_pieces
from cclc.symmetric import ExceptedSchedule, SymmetricSchedule

__all__ = ["BACKEND", "JsonBackend"]


class JsonBackend:
    """The verified schedule as a versioned JSON document."""

    name = "json"
    wants_simulation = False
    renders_symmetric = True
    own_nics = False
    #: a document runs nothing
    execution_model: ExecutionModel | None = None
    #: nothing beyond the planner's own per-op cost, which was measured with the document
    #: written (cclc.algorithms.tree_budget; the document alone: 0.5 us per op, CPU seconds
    #: rendering hgx16_leafspine's `shards`, `hierarchical`'s 262,272 ops)
    seconds_per_op = 0.0

    def files(self, key: Collective, options: EmitOptions) -> tuple[str, ...]:
        return (f"{key.name}.schedule.json",)

    def render(self, subject: Schedule | SymmetricSchedule | ExceptedSchedule,
               options: EmitOptions, facts: Facts) -> dict[str, Contents]:
        def pieces() -> Iterator[bytes]:
            if isinstance(subject, SymmetricSchedule | ExceptedSchedule):
                yield from symmetric_document_pieces(subject)
            else:
                yield from document_pieces(subject)
            yield b"\n"

        return {f"{subject.collective.name}.schedule.json": pieces()}

    def refusal(self, subject: Schedule | SymmetricSchedule | ExceptedSchedule,
                options: EmitOptions) -> str | None:
        """The document has a form for every verified schedule, whole or stored by
        symmetry."""
        return None

    def build(self, folder: Path, key: Collective, options: EmitOptions) -> list[str]:
        return []


BACKEND: Backend[Collective, Schedule | SymmetricSchedule | ExceptedSchedule] = JsonBackend()
