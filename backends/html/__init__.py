"""The visualizer backend: one self-contained, offline HTML page for one or more schedules.

``render(panels) -> str`` draws several schedules side by side (a comparison), each with the
:class:`~backends.contract.Facts` (simulations and bounds) the caller already has;
:data:`BACKEND` renders ``<name>.html`` for ``cclc compile --emit html``, from the facts the
pipeline measured.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import jinja2
from markupsafe import Markup

from backends.contract import Backend, EmitOptions, Facts
from backends.html.data import prepare
from cclc.collective import Collective
from cclc.errors import CclError
from cclc.execution import ExecutionModel
from cclc.ir import Schedule

__all__ = ["BACKEND", "HtmlBackend", "render"]

_ENV = jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).parent),
                          undefined=jinja2.StrictUndefined, autoescape=True)


def render(panels: Sequence[tuple[Schedule, Facts]]) -> str:
    """The page for ``panels`` (one per schedule, side by side); every :class:`Facts` must
    carry ``bounds``, ``lockstep`` and ``event`` (:func:`cclc.pipeline.measure` makes them)."""
    data = []
    for s, facts in panels:
        if facts.bounds is None or facts.lockstep is None or facts.event is None:
            raise CclError(f"the page of '{s.collective.name}' needs its bounds and both "
                           "simulations")
        data.append(prepare(s, facts))
    title = " vs ".join(f"{d['name']} ({d['algorithm']}"
                        + (f"+{d['schedule']})" if d["schedule"] != "-" else ")") for d in data)
    # JSON inside <script>: '</' must not close the element
    payload = json.dumps({"schedules": data}, separators=(",", ":")).replace("</", "<\\/")
    return _ENV.get_template("page.html.j2").render(title=title, data_json=Markup(payload))


class HtmlBackend:
    """``<collective>.html``: the page of one compiled schedule."""

    name = "html"
    wants_simulation = True
    renders_symmetric = False
    own_nics = False
    #: a page runs nothing
    execution_model: ExecutionModel | None = None
    #: the two simulations it wants and the page: 3.7 us per op (CPU seconds rendering
    #: hgx16_leafspine's `shards`, `hierarchical`'s 262,272 ops)
    seconds_per_op = 3.7e-6

    def files(self, key: Collective, options: EmitOptions) -> tuple[str, ...]:
        return (f"{key.name}.html",)

    def render(self, subject: Schedule, options: EmitOptions, facts: Facts
               ) -> dict[str, str | bytes]:
        return {f"{subject.collective.name}.html": render([(subject, facts)])}

    def refusal(self, subject: Schedule, options: EmitOptions) -> str | None:
        """The page draws every verified schedule."""
        return None

    def build(self, folder: Path, key: Collective, options: EmitOptions) -> list[str]:
        return []


BACKEND: Backend[Collective, Schedule] = HtmlBackend()
