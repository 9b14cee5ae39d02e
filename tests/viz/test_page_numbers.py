"""The page of ``cclc compile --emit html`` states the time and % of bound the compile printed:
the plan's own numbers, under the execution model that priced the choice."""

from __future__ import annotations

import json
import re

import pytest

from cclc.cli import main

FAULTY = """\
topology t = torus(3, 3) {
    link 32 GB/s, 100 ns
    fault link (1,1) -- (2,1)
}
collective a2a = alltoall on t { size 9 MiB }
"""


def _page_data(path) -> dict:
    text = path.read_text(encoding="utf-8")
    payload = re.search(r'<script id="cclc-data" type="application/json">(.*?)</script>',
                        text, flags=re.DOTALL).group(1)
    return json.loads(payload)["schedules"][0]


@pytest.mark.parametrize("emit", ["json,msccl,html", "json,html", "nccl,html"])
def test_page_states_what_the_compile_printed(tmp_path, capsys, emit):
    src = tmp_path / "f.ccl"
    src.write_text(FAULTY, encoding="utf-8")
    out = tmp_path / "out"
    assert main(["compile", str(src), "-o", str(out), "--emit", emit]) == 0
    printed = capsys.readouterr().out
    line = re.search(r"^a2a: \S+ (\S+ \S+), ([\d.]+%) of bound, .*\((\w[\w-]* model: [^;]*);",
                     printed, flags=re.MULTILINE)
    assert line, printed
    time_text, pct_text, model = line.groups()
    page = (out / "a2a.html").read_text(encoding="utf-8")
    assert f'"time_text":"{time_text}"' in page
    assert f'"pct_text":"{pct_text}"' in page
    assert f'"model":"{model}"' in page
    data = _page_data(out / "a2a.html")
    assert (data["time_text"], data["pct_text"], data["model"]) == (time_text, pct_text, model)
    if "msccl" in emit or "nccl" in emit:
        # the model charges software: its time is not the plain lockstep simulation's
        assert data["lockstep_time_text"] != time_text
