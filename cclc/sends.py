"""What an algorithm's steps send between members, without routes.

An algorithm entry's ``sends`` rule (:attr:`cclc.algorithms.Algorithm.sends`) describes its
schedule before it is built as a sequence of :class:`Sends`: which group members send how many
bytes to which, in how many consecutive steps alike. Nothing here says over which links: the
bound computed from it (:mod:`cclc.send_bounds`) holds whatever routes the routing picks (ECMP's
hash on a fabric with spines, a relay, a detour), which a link-traffic rule
(:mod:`cclc.link_traffic`) cannot.

The description may be coarser than the schedule, never finer: each entry (with the entries
that join it) stands for ``steps`` steps of the schedule or more, or for one step cut in
several; its bytes are at most what those steps send. Local ops (``src == dst``) and steps that
send nothing between members are left out (they cost nothing in the models that count bytes).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Sends", "sends"]


@dataclass(frozen=True, eq=False)
class Sends:
    """The sends of each of ``steps`` consecutive steps that are all alike: member ``src[i]``
    sends ``nbytes[i]`` bytes to member ``dst[i]`` (group indices). ``joins_previous``: these
    sends are in the same steps as the previous entry's (a step too large to list at once, e.g.
    every pair of a direct exchange, is given as one entry per shift); ``steps`` must then be
    the previous entry's."""

    src: np.ndarray
    dst: np.ndarray
    nbytes: np.ndarray
    steps: int = 1
    joins_previous: bool = False


def sends(src, dst, nbytes, steps: int = 1, joins_previous: bool = False) -> Sends:
    """A :class:`Sends` from arrays or scalars (broadcast to one another)."""
    s, d, b = np.broadcast_arrays(np.asarray(src, dtype=np.int64),
                                  np.asarray(dst, dtype=np.int64),
                                  np.asarray(nbytes, dtype=np.float64))
    return Sends(np.ascontiguousarray(s), np.ascontiguousarray(d), np.ascontiguousarray(b),
                 int(steps), joins_previous)
