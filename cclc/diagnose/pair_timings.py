"""Per-pair timings, the measured data: which pair moved how many bytes in how long.

Every reader produces a :class:`Timings` (:mod:`cclc.diagnose.timings` for the CSV and JSON
formats, :mod:`cclc.diagnose.nccl_tests` for nccl-tests output), and the diagnosis
(:mod:`cclc.diagnose.localize`) reads it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cclc.errors import CclError

__all__ = ["Timings", "TimingsError", "make_timings"]


class TimingsError(CclError):
    """A timings file that cannot be read as any of the formats."""


@dataclass(frozen=True, eq=False)
class Timings:
    """Measured pairs: ``src[k] -> dst[k]`` moved ``nbytes[k]`` in ``seconds[k]`` (``inf``: it
    never finished). One entry per distinct pair, ``src != dst``."""

    src: np.ndarray
    dst: np.ndarray
    nbytes: np.ndarray
    seconds: np.ndarray
    source: str = "<timings>"
    #: how the pairs were timed: ``True`` all at once, ``False`` one run at a time (nccl-tests
    #: runs), ``None`` not known (the caller decides)
    concurrent: bool | None = None

    def __len__(self) -> int:
        return len(self.src)

    @property
    def hung(self) -> np.ndarray:
        return ~np.isfinite(self.seconds)


def _ro(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


def make_timings(src, dst, nbytes, seconds, source: str = "<timings>",
                 concurrent: bool | None = None) -> Timings:
    """Merge repeated pairs (bytes and seconds add up; a hang stays a hang) and drop ``i -> i``."""
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    nbytes = np.asarray(nbytes, dtype=np.float64)
    seconds = np.asarray(seconds, dtype=np.float64)
    keep = src != dst
    src, dst, nbytes, seconds = src[keep], dst[keep], nbytes[keep], seconds[keep]
    pairs, inv = np.unique(np.stack([src, dst], axis=1).reshape(-1, 2), axis=0,
                           return_inverse=True)
    inv = inv.reshape(-1)
    tot_b = np.bincount(inv, weights=nbytes, minlength=len(pairs)).astype(np.float64)
    hung = np.bincount(inv, weights=~np.isfinite(seconds), minlength=len(pairs)) > 0
    tot_s = np.bincount(inv, weights=np.where(np.isfinite(seconds), seconds, 0.0),
                        minlength=len(pairs)).astype(np.float64)
    tot_s[hung] = np.inf
    return Timings(src=_ro(pairs[:, 0].copy()), dst=_ro(pairs[:, 1].copy()),
                   nbytes=_ro(tot_b), seconds=_ro(tot_s), source=source,
                   concurrent=concurrent)
