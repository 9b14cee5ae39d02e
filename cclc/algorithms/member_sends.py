"""Helpers of the entries' ``sends`` rules (:mod:`cclc.sends`): blocks and exchanges in the
shapes the builders use, described without building anything."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from cclc.collective import Collective
from cclc.sends import Sends, sends

__all__ = ["all_pairs", "block_bytes", "shift"]


def block_bytes(coll: Collective) -> int:
    """The bytes of one of ``n`` equal blocks of the buffer (the builders' ``count // n``)."""
    return (coll.count // coll.n) * coll.dtype.itemsize


def shift(n: int, by: int, nbytes, steps: int = 1) -> Sends:
    """Every member ``i`` sends ``nbytes`` to ``i + by (mod n)`` in each of ``steps`` steps."""
    ranks = np.arange(n)
    return sends(ranks, (ranks + by) % n, nbytes, steps)


def all_pairs(n: int, nbytes_of: Callable[[np.ndarray, np.ndarray], np.ndarray]
              ) -> tuple[Sends, ...]:
    """One step in which every member sends to every other ``nbytes_of(src, dst)`` bytes,
    given one shift at a time (``n - 1`` entries of ``n`` sends, not ``n^2`` at once)."""
    ranks = np.arange(n, dtype=np.int64)
    out = []
    for k in range(1, n):
        dst = (ranks + k) % n
        nbytes = np.broadcast_to(np.asarray(nbytes_of(ranks, dst), dtype=np.float64), (n,))
        out.append(Sends(ranks, dst, nbytes, 1, k > 1))
    return tuple(out)
