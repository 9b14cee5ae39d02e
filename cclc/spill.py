"""A schedule held in memory, or, when large, in a temporary file until it is needed again.

``auto`` (:func:`cclc.plan.plan`) keeps its fastest candidate so far while it builds the next
one; a best of millions of ops waits on disk meanwhile, so that one schedule of that size is
in memory at a time (two 5M-op schedules and their analyses took 3.8 GiB). It comes back bit
for bit.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from typing import IO

import numpy as np

from cclc.ir import OP_COLUMNS, Buf, Ops, Routes, Schedule

__all__ = ["KEEP_BEST_OPS", "HeldSchedule"]

#: the largest schedule (ops) :meth:`HeldSchedule.make_room` leaves in memory
KEEP_BEST_OPS = 1_000_000

_EMPTY_ROUTES = Routes(np.zeros(2, dtype=np.int64), np.zeros(0, dtype=np.int32))


@dataclass(frozen=True, eq=False)
class HeldSchedule:
    """A schedule in memory (``schedule``), or (``spilled``) its shell without ops, routes and
    layouts and the temporary file that holds their arrays."""

    schedule: Schedule | None
    spilled: tuple[Schedule, IO[bytes]] | None = None

    def make_room(self) -> HeldSchedule:
        """This schedule moved out of memory when it has over :data:`KEEP_BEST_OPS` ops."""
        s = self.schedule
        if s is None or len(s.ops) <= KEEP_BEST_OPS:
            return self
        f = tempfile.TemporaryFile()
        cols = s.ops.columns()
        # positional arrays: the three layouts, the routes' offsets and links, the op columns
        np.savez(f, *s.layouts, s.routes.offsets, s.routes.links,
                 *(cols[k] for k in OP_COLUMNS))
        # what stays: the schedule without ops, routes and layouts (a few small fields)
        shell = s.replace(ops=Ops.empty(), routes=_EMPTY_ROUTES,
                          layouts=tuple(np.zeros(0, dtype=np.int64) for _ in Buf))
        return HeldSchedule(None, (shell, f))

    def restored(self) -> Schedule:
        """The schedule, read back bit for bit if it was moved out of memory."""
        if self.schedule is not None:
            return self.schedule
        assert self.spilled is not None
        shell, f = self.spilled
        f.seek(0)
        with np.load(f) as z:
            cols = {k: z[f"arr_{5 + i}"] for i, k in enumerate(OP_COLUMNS)}
            layouts = (z["arr_0"], z["arr_1"], z["arr_2"])
            routes = Routes(z["arr_3"], z["arr_4"])
        f.close()
        return shell.replace(ops=Ops(**cols), routes=routes, layouts=layouts)
