"""Progress lines: silent for quick stages, what and how far along for slow ones."""

from __future__ import annotations

from cclc.cli import main
from cclc.progress import Progress


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_quick_stage_prints_nothing():
    lines: list[str] = []
    clock = FakeClock()
    progress = Progress(lines.append, delay=3.0, clock=clock)
    with progress.stage("a: planning", total=4) as st:
        st.update(1, "ring")
        clock.now = 2.9
        progress.report(st)
    assert lines == []


def test_a_slow_stage_says_what_and_how_far_then_when_it_ended():
    lines: list[str] = []
    clock = FakeClock()
    progress = Progress(lines.append, delay=3.0, clock=clock)
    with progress.stage("grads: planning") as st:
        st.update(3, "biring", total=9)
        clock.now = 12.0
        progress.report(st)
        clock.now = 20.5
    assert lines == ["[12 s] grads: planning: 3 of 9 (33%), biring",
                     "grads: planning: finished in 20.5 s"]


def test_no_sink_no_thread_no_output():
    with Progress(None).stage("x", total=2) as st:
        st.update(2)
    assert st.line().startswith("[")


def test_compile_keeps_stdout_and_stderr_quiet_for_a_quick_file(tmp_path, capsys):
    src = tmp_path / "s.ccl"
    src.write_text("topology t = torus(4) { link 32 GB/s, 100 ns }\n"
                   "collective a = allgather on t { size 1 MiB }\n")
    assert main(["compile", str(src), "-o", str(tmp_path / "out")]) == 0
    captured = capsys.readouterr()
    assert "[" not in captured.err and "finished in" not in captured.err
    assert captured.out.startswith("a: ")


def test_a_stage_of_alike_items_says_how_long_the_rest_takes_at_its_pace():
    # a catalog of 88 fault sets at 30 s each runs for most of an hour: the line says so
    lines: list[str] = []
    clock = FakeClock()
    progress = Progress(lines.append, delay=3.0, clock=clock)
    with progress.stage("grads: catalog", pace=True) as st:
        st.update(0, "no fault", total=88)
        clock.now = 20.0
        progress.report(st)                 # nothing done yet: no pace to go by
        st.update(2, "node0.gpu1")
        clock.now = 60.0
        progress.report(st)
        st.update(7, "node0.gpu6")
        clock.now = 100.0
        progress.report(st)
    assert lines[0] == "[20 s] grads: catalog: 0 of 88 (0%), no fault"
    assert lines[1] == ("[60 s] grads: catalog: 2 of 88 (2%), node0.gpu1; at this pace about "
                        "43 minutes left")
    # 100 / 7 x 81 s: two digits, a guess is not a measurement
    assert lines[2].endswith("at this pace about 19 minutes left")
