"""Progress lines for long stages: what is being done and how far along, only when it is slow.

A :class:`Progress` is made by the CLI with a sink (a function taking one line, e.g. writing to
stderr); library code receives it (or a plain callback) and never prints. A stage says nothing
unless it lasts longer than ``delay`` seconds; from then on a background thread reports its
latest state after ``every`` seconds, then at doubling intervals up to a minute
(``[12 s] grads: planning: 3 of 9 (33%), ring``), so a single
long step (one big schedule, one big file) still shows that work goes on, and the stage's end
is reported with its duration. A stage of alike items (a catalog's fault sets) also says how
long the rest takes at the pace so far. Quick runs print nothing, so outputs stay as they were.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from cclc.units import format_duration

__all__ = ["Progress", "Stage"]


class Stage:
    """One named stage; :meth:`update` records how far along it is (thread-safe)."""

    def __init__(self, what: str, total: int | None, clock: Callable[[], float],
                 pace: bool = False):
        self.what = what
        self.total = total
        #: whether the items are alike enough that the pace so far says when the rest ends
        self.pace = pace
        self.done = 0
        self.detail = ""
        self.clock = clock
        self.started = clock()
        self.shown = False
        self._lock = threading.Lock()

    def update(self, done: int, detail: str = "", total: int | None = None) -> None:
        """``done`` items of ``total`` are finished; ``detail`` names the current one."""
        with self._lock:
            self.done, self.detail = done, detail
            if total is not None:
                self.total = total

    def line(self) -> str:
        """The stage's state as one line: elapsed time, what, how far, the current item."""
        with self._lock:
            done, detail = self.done, self.detail
        elapsed = self.clock() - self.started
        far = ""
        if self.total:
            far = f": {done} of {self.total} ({100 * done // self.total}%)"
        item = f", {detail}" if detail else ""
        left = ""
        if self.pace and self.total and 0 < done < self.total:
            # two digits: a pace is a guess, not a measurement
            rest = format_duration(elapsed / done * (self.total - done), digits=2)
            left = f"; at this pace about {rest} left"
        return f"[{elapsed:.0f} s] {self.what}{far}{item}{left}"


class Progress:
    """Reports stages that take longer than ``delay`` seconds to ``sink``."""

    def __init__(self, sink: Callable[[str], None] | None, delay: float = 3.0,
                 every: float = 5.0, clock: Callable[[], float] = time.monotonic):
        self.sink = sink
        self.delay = delay
        self.every = every
        self.clock = clock

    @contextmanager
    def stage(self, what: str, total: int | None = None, pace: bool = False
              ) -> Iterator[Stage]:
        """Run a stage; a ticker thread reports it once it is slow (nothing when no sink).
        ``pace``: its items are alike, and its lines say how long the rest takes at the pace
        so far."""
        st = Stage(what, total, self.clock, pace)
        if self.sink is None:
            yield st
            return
        stop = threading.Event()
        ticker = threading.Thread(target=self._tick, args=(st, stop), daemon=True)
        ticker.start()
        try:
            yield st
        finally:
            stop.set()
            ticker.join()
            if st.shown:
                self.sink(f"{st.what}: finished in {self.clock() - st.started:.1f} s")

    def report(self, st: Stage) -> None:
        """Print ``st``'s state when it has run longer than ``delay``."""
        if self.sink is not None and self.clock() - st.started >= self.delay:
            st.shown = True
            self.sink(st.line())

    def _tick(self, st: Stage, stop: threading.Event) -> None:
        if stop.wait(self.delay):
            return
        wait = self.every
        while True:
            self.report(st)
            # a stage of minutes reports a few lines, not hundreds
            if stop.wait(wait):
                return
            wait = min(2 * wait, 60.0)
