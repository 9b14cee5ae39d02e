"""The lockstep time of a pipelined tree AllReduce, from its packings, without building ops.

:func:`cclc.synth.tree_schedule.allreduce_ops` sends chunk ``c`` over each tree edge in the
network step ``c + s`` for a fixed start ``s`` per edge: ``1 + o`` for an in-tree edge whose
member sends at reduce offset ``o``, ``H + d`` for an out-tree edge into depth ``d`` of a root
whose in-tree has height ``H``. So the bytes on link ``l`` in step ``t`` are a chunk times the
number of edge uses of ``l`` with a start in ``(t - C, t]``: a sliding window over a
per-link histogram of starts. The IR's lockstep model charges each step its busiest link plus
a latency (see :mod:`cclc.sim`); this sums that over the steps. It replaces the closed form
``(C - 1) * (alpha + beta / C) + sum_phases H * (alpha + b / C)``, which charges every fill and
drain step a phase's full load although the pipe only fills a level per step.
"""

from __future__ import annotations

import numpy as np

from cclc.synth.hop_graph import HopGraph
from cclc.synth.taper import link_loads, pipeline_time
from cclc.synth.tree_schedule import reduce_offsets, tree_edges
from cclc.synth.trees import TreePacking

__all__ = ["allreduce_lockstep_time", "edge_starts"]


def edge_starts(rs: TreePacking, ag: TreePacking) -> tuple[np.ndarray, np.ndarray]:
    """``(start, move)`` of every in-tree edge then every out-tree edge: the network step in
    which it carries chunk 0, and its move."""
    off = reduce_offsets(rs)
    er, ea = tree_edges(rs), tree_edges(ag)
    s_rs = 1 + off[er["root"], er["tree"], er["member"]]
    s_ag = off[ea["root"], ea["tree"], ea["root"]] + ea["depth"]
    return np.concatenate([s_rs, s_ag]), np.concatenate([er["move"], ea["move"]])


def allreduce_lockstep_time(g: HopGraph, rs: TreePacking, ag: TreePacking, block: float,
                            chunks: int, alpha: float) -> float:
    """Seconds of the AllReduce of packings ``rs``/``ag`` with ``chunks`` chunks per tree
    (blocks of ``block`` bytes), each network step charged ``alpha`` plus its busiest link.

    Chunk sizes are taken equal (``block / (k * chunks)``; the schedule's differ by at most
    one element) and ``alpha`` is charged whole to every step that moves data.
    """
    start, move = edge_starts(rs, ag)
    return lockstep_time_of_starts(g, start, move, ag.k, block, chunks, alpha)


def lockstep_time_of_starts(g: HopGraph, start: np.ndarray, move: np.ndarray, k: int, block: float,
                            chunks: int, alpha: float) -> float:
    """Seconds of a lockstep pipeline in which edge ``move[i]`` of ``g`` carries chunk ``c`` in
    step ``c + start[i]``, ``k`` trees per root and ``chunks`` equal chunks per tree: each
    link's load per step is a sliding window over the histogram of its edges' starts."""
    loads = link_loads(g, start, move)
    return pipeline_time(loads, np.full(chunks, 1.0 / chunks), block / k, alpha)
