"""The lockstep time of one pipelined tree phase (AllGather or ReduceScatter), from its packing.

:func:`cclc.synth.tree_schedule.allgather_ops` sends chunk ``c`` over the edge into a member
at depth ``d`` in step ``c + d - 1``; :func:`cclc.synth.tree_schedule.reducescatter_ops` sends
a member's partial sum of chunk ``c`` in network step ``1 + c + H - d`` of a tree of height
``H``. So, as for AllReduce in :mod:`cclc.synth.tree_time`, the bytes on link ``l`` in step
``t`` are a chunk times the edge uses of ``l`` whose start lies in ``(t - C, t]``, and the IR's
lockstep model charges every step its busiest link plus a latency. The closed form ``(C + H -
1) (alpha + beta / C)`` charges every fill and drain step a whole step's load; when the levels
of the trees load different links (or the same links evenly), a step of the fill costs less,
and one chunk per tree (no pipeline) can be the fastest.
"""

from __future__ import annotations

import numpy as np

from cclc.synth.hop_graph import HopGraph
from cclc.synth.tree_schedule import reduce_offsets, tree_edges
from cclc.synth.tree_time import lockstep_time_of_starts
from cclc.synth.trees import TreePacking

__all__ = ["edge_levels", "phase_lockstep_time"]


def edge_levels(p: TreePacking, reduce: bool) -> tuple[np.ndarray, np.ndarray]:
    """``(level, move)`` of every tree edge: the step, counted from the phase's first, in
    which it carries chunk 0."""
    e = tree_edges(p)
    if reduce:
        off = reduce_offsets(p)
        return off[e["root"], e["tree"], e["member"]], e["move"]
    return e["depth"] - 1, e["move"]


def phase_lockstep_time(g: HopGraph, p: TreePacking, block: float, chunks: int, alpha: float,
                        reduce: bool) -> float:
    """Seconds of one phase of packing ``p`` (in-trees when ``reduce``) with ``chunks`` chunks
    per tree and blocks of ``block`` bytes, every step charged ``alpha`` plus its busiest link.

    Chunk sizes are taken equal (``block / (k * chunks)``; the schedule's differ by at most one
    element) and ``alpha`` is charged whole to every step that moves data.
    """
    start, move = edge_levels(p, reduce)
    return lockstep_time_of_starts(g, start, move, p.k, block, chunks, alpha)
