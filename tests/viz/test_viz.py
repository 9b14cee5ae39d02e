"""The visualizer page: rendered in headless Chromium, checked as a user would see it."""

from pathlib import Path

import numpy as np
import pytest

import dsl
from backends.html import render
from cclc.algorithms import get
from cclc.pipeline import measure
from cclc.plan import plan
from cclc.serialize import save

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _schedule(example: str, name: str | None = None, algorithm: str | None = None):
    program = dsl.load(EXAMPLES / example)
    coll = next(c for c in program.collectives if name is None or c.name == name)
    if algorithm is not None:
        from dataclasses import replace

        from cclc.collective import Hint

        name_, _, sched = algorithm.partition("+")
        coll = replace(coll, algorithm=Hint(name_), schedule=Hint(sched or "auto"))
    return plan(coll).schedule


def _open(browser, tmp_path, schedules, name="page.html"):
    page = tmp_path / name
    page.write_text(render([(s, measure(s)) for s in schedules]), encoding="utf-8")
    browser.get_log("browser")  # drop earlier entries
    browser.get(page.as_uri())
    return page


def _errors(browser):
    return [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]


def _active_links(browser, panel=0):
    return browser.execute_script(
        f"return Array.from(document.querySelectorAll('#panel-{panel} .link.active'))"
        ".map(e => e.getAttribute('data-link'))")


def _move_slider(browser, value, panel=0):
    # what a user's drag does: set the value and fire the input event
    browser.execute_script(
        f"const s = document.querySelector('#panel-{panel} .step-slider'); s.value = {value};"
        "s.dispatchEvent(new Event('input'));")


@pytest.mark.slow
@pytest.mark.parametrize("example", ["torus5x5_fault.ccl", "hgx_node.ccl",
                                     "hgx16_leafspine.ccl", "tpuv4_4x4x4_ocs.ccl"])
def test_page_renders_every_rank_and_link(browser, tmp_path, example):
    s = _schedule(example)
    _open(browser, tmp_path, [s])
    assert _errors(browser) == []
    topo = s.topology
    n_ranks = browser.execute_script("return document.querySelectorAll('#panel-0 .rank').length")
    n_links = browser.execute_script("return document.querySelectorAll('#panel-0 .link').length")
    n_failed = browser.execute_script(
        "return document.querySelectorAll('#panel-0 .link.failed').length")
    assert n_ranks == topo.n_ranks
    assert n_links == topo.n_links
    assert n_failed == topo.n_failed_links


def test_slider_changes_highlighted_links(browser, tmp_path):
    s = _schedule("torus5x5_fault.ccl", algorithm="mate")
    assert s.n_steps >= 2
    _open(browser, tmp_path, [s])
    seen = []
    for step in range(min(s.n_steps, 4)):
        _move_slider(browser, step)
        seen.append(tuple(sorted(_active_links(browser))))
        # the page highlights exactly the links the schedule uses in that step
        ops = s.ops.step == step
        routes = s.ops.route[ops]
        used = set()
        for r in np.unique(routes).tolist():
            used.update(s.routes.path(r))
        assert set(map(int, seen[-1])) == used
    assert len(set(seen)) > 1
    label = browser.execute_script(
        "return document.querySelector('#panel-0 .step-label').textContent")
    assert label.startswith("step ")
    assert _errors(browser) == []


@pytest.mark.slow
def test_keyboard_steps_and_screenshot_not_blank(browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    s = _schedule("torus5x5.ccl")
    _open(browser, tmp_path, [s])
    body = browser.find_element(By.TAG_NAME, "body")
    body.send_keys(Keys.ARROW_RIGHT)
    value = browser.execute_script("return document.querySelector('#panel-0 .step-slider').value")
    assert int(value) == min(1, s.n_steps - 1)
    shot = tmp_path / "shot.png"
    assert browser.save_screenshot(str(shot))
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    # not blank: the screenshot holds many distinct colours
    assert _distinct_colours(browser, png) > 10
    assert _errors(browser) == []


def test_comparison_draws_two_panels(browser, tmp_path):
    a = _schedule("torus5x5_fault.ccl", algorithm="mate")
    b = _schedule("torus5x5_fault.ccl", algorithm="matee")
    _open(browser, tmp_path, [a, b])
    assert browser.execute_script("return document.querySelectorAll('.panel').length") == 2
    assert _errors(browser) == []


@pytest.mark.slow
def test_large_schedule_page_is_bounded(browser, tmp_path):
    """512 ranks: aggregated, bounded page size, still renders without errors."""
    from cclc.collective import CollectiveKind, make_collective
    from cclc.topology import torus

    topo = torus("big", (8, 8, 8), bandwidth=[50e9] * 3, latency=[1e-7] * 3)
    coll = make_collective("a2a", CollectiveKind.ALLTOALL, topo, topo.all_ranks(),
                           size=512 * 1024 * 4)
    s = get("direct").build(coll)
    page = _open(browser, tmp_path, [s], "big.html")
    assert page.stat().st_size < 12_000_000
    assert browser.execute_script("return document.querySelectorAll('.rank').length") == 512
    notes = browser.execute_script(
        "return Array.from(document.querySelectorAll('.note')).map(n => n.textContent)")
    assert any("Aggregated" in n for n in notes)
    assert _errors(browser) == []


@pytest.mark.slow
def test_viz_command_writes_page(tmp_path):
    from cclc.cli import main

    s = _schedule("torus5x5.ccl")
    path = tmp_path / "a.schedule.json"
    save(s, path)
    out = tmp_path / "a.html"
    assert main(["viz", str(path), "-o", str(out)]) == 0
    text = out.read_text()
    assert "<script" in text and "http://" not in text.replace("http://www.w3.org/2000/svg", "")
    # alltoall is outside NCCL's tables; an allreduce page states NCCL's predicted choice from
    # the one model of NCCL
    assert '"nccl":null' in text
    from cclc.nccl_model import nccl_estimate
    hgx = _schedule("hgx_node.ccl")
    est = nccl_estimate(hgx.collective)
    assert f'"nccl":{{"name":"{est.name}"' in render([(hgx, measure(hgx))])
    # replaces the page it wrote; never a file cclc did not write without --force
    assert main(["viz", str(path), "-o", str(out)]) == 0
    mine = out.with_name("mine.html")
    mine.write_text("the user's")
    assert main(["viz", str(path), "-o", str(mine)]) == 2 and mine.read_text() == "the user's"
    assert main(["viz", str(path), "-o", str(mine), "--force"]) == 0


def _distinct_colours(browser, png: bytes) -> int:
    """Distinct colours in a PNG, decoded by the browser itself on a canvas."""
    import base64

    url = "data:image/png;base64," + base64.b64encode(png).decode()
    return browser.execute_async_script(
        "const done = arguments[1]; const img = new Image();"
        "img.onload = () => { const c = document.createElement('canvas');"
        " c.width = img.width; c.height = img.height; const g = c.getContext('2d');"
        " g.drawImage(img, 0, 0); const px = g.getImageData(0, 0, c.width, c.height).data;"
        " const seen = new Set(); for (let i = 0; i < px.length; i += 4)"
        " seen.add((px[i] << 16) | (px[i + 1] << 8) | px[i + 2]); done(seen.size); };"
        "img.onerror = () => done(-1); img.src = arguments[0];", url)
