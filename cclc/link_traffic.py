"""The bytes a collective's schedule puts on every link in every step, as plain arrays.

The algorithm entries' ``load`` rules (:attr:`cclc.algorithms.Algorithm.load`, e.g.
:mod:`cclc.algorithms.pair_traffic` and :mod:`cclc.algorithms.torus_alltoall.traffic`) produce
a :class:`Traffic`; the planner's lower bounds (:mod:`cclc.load_bounds`) consume it. It lives
below both so that neither imports the other for it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["CARRIED", "EARLY", "LATE", "Traffic", "traffic_rows"]


#: roles of a (step, link) load with respect to relay lowering (:mod:`cclc.relay`):
#: the op's route is carried by the routing (it stays in the step's last sub-step) ...
CARRIED = 0
#: ... relayed, and this link is in a segment before the chain's last one (a sub-step before
#: the step's last) ...
EARLY = 1
#: ... relayed, and the sub-step is not known (the last segment, or routing that cuts
#: routes into segments of several links)
LATE = 2


@dataclass(frozen=True)
class Traffic:
    """Bytes per (step, link, role): ``step``, ``link``, ``role`` and ``nbytes`` are arrays of
    one entry per contribution (entries may repeat a key; consumers sum them). Steps are the
    schedule's steps before relay lowering, which only ever splits a step into sub-steps."""

    step: np.ndarray
    link: np.ndarray
    role: np.ndarray
    nbytes: np.ndarray


def traffic_rows(steps, links, nbytes, roles=None) -> Traffic:
    """A :class:`Traffic` of ``links`` (an array) with ``steps``, ``nbytes`` and ``roles``
    given per row or once for all (broadcast); roles default to :data:`LATE`."""
    links = np.asarray(links, dtype=np.int64)
    return Traffic(np.broadcast_to(np.asarray(steps, dtype=np.int64), links.shape),
                   links,
                   np.broadcast_to(np.asarray(LATE if roles is None else roles, dtype=np.int8),
                                   links.shape),
                   np.asarray(nbytes, dtype=np.float64))
