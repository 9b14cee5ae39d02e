"""The visualizer backend: one self-contained, offline HTML page for one or more schedules.

``render(schedules) -> str`` draws several schedules side by side (a comparison);
``emit(schedule, outdir, options)`` writes ``<name>.html`` for ``cclc compile --emit html``.
"""

from __future__ import annotations

import json
from pathlib import Path

import jinja2
from markupsafe import Markup

from backends.html.data import prepare
from cclc.bounds import bounds
from cclc.ir import Schedule
from cclc.sim import simulate

__all__ = ["render", "emit"]

_ENV = jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).parent),
                          undefined=jinja2.StrictUndefined, autoescape=True)


def render(schedules: list[Schedule]) -> str:
    """The page for ``schedules`` (one panel each, side by side)."""
    data = []
    for s in schedules:
        bound = bounds(s.collective)
        data.append(prepare(s, simulate(s, mode="lockstep"), simulate(s, mode="event"), bound))
    title = " vs ".join(f"{d['name']} ({d['algorithm']}"
                        + (f"+{d['schedule']})" if d["schedule"] != "-" else ")") for d in data)
    # JSON inside <script>: '</' must not close the element
    payload = json.dumps({"schedules": data}, separators=(",", ":")).replace("</", "<\\/")
    return _ENV.get_template("page.html.j2").render(title=title, data_json=Markup(payload))


def emit(schedule: Schedule, outdir: Path, options=None) -> list[Path]:
    """Write ``<collective>.html`` into ``outdir``; returns the path written."""
    from cclc.outdir import OutputDir

    path = Path(outdir) / f"{schedule.collective.name}.html"
    OutputDir(Path(outdir), force=getattr(options, "force", False)).write_text(path.name,
                                                                            render([schedule]))
    return [path]
