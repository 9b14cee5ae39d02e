"""Hierarchical collectives for NVLink nodes on a leaf/spine fabric.

The group is laid out as a grid ``nodes x GPUs``: GPU ``g`` of every node is on the same rail
(NIC index), so the node dimension's rings are the *rails* and never leave their leaf on a
rail-optimized fabric, and the GPU dimension's rings stay inside a node's NVSwitch.

* ReduceScatter: intra-node reduce-scatter (each GPU ends with ``1/G`` of the buffer summed over
  its node), then inter-node reduce-scatter per rail: only ``1/G`` of the data crosses the
  network, spread over all ``G`` NICs of the node.
* AllGather: the mirror, inter-node per rail first, then intra-node.
* AllReduce: intra-node reduce-scatter, inter-node reduce-scatter + all-gather per rail,
  intra-node all-gather.

Every phase is a ring in both directions (the ring engine of
:mod:`cclc.algorithms.torus_collectives`); inter-node flows get planned spine routes
(:mod:`cclc.fabric_routing`). The order of the phases is fixed (no rotation): putting the slow
network first would send ``G`` times more bytes over it.
"""

from __future__ import annotations

import numpy as np

from cclc.algorithms import Algorithm, register
from cclc.algorithms.torus_collectives import KINDS, Grid, Piece, grid_schedule
from cclc.collective import Collective
from cclc.errors import CollectiveError
from cclc.ir import Schedule

__all__ = ["node_grid"]


def node_grid(coll: Collective) -> tuple[np.ndarray | None, str | None]:
    """``members[h, g]``: group index of the ``g``-th GPU (by GPU id) of the ``h``-th node of the
    group (by first appearance), or the reason the group is not whole-node shaped."""
    topo = coll.topology
    if topo.kind != "fabric" or topo.node_of_rank is None:
        return None, (f"hierarchical needs NVLink nodes on a fabric; '{topo.name}' is a "
                      f"{topo.kind}")
    nodes: dict[int, list[tuple[int, int]]] = {}
    for i, r in enumerate(coll.group):
        nodes.setdefault(int(topo.node_of_rank[r]), []).append((int(topo.gpu_of_rank[r]), i))
    if len(nodes) < 2:
        return None, "hierarchical needs the group to span at least 2 nodes"
    sizes = {len(v) for v in nodes.values()}
    if len(sizes) != 1:
        return None, (f"hierarchical needs the same number of GPUs of every node in the group; "
                      f"this group has {sorted(sizes)} GPUs per node")
    if sizes == {1}:
        return None, "hierarchical needs at least 2 GPUs per node (one per node: use biring or pat)"
    members = np.array([[i for _, i in sorted(v)] for v in nodes.values()], dtype=np.int64)
    return members, None


def _applicable(coll: Collective, **params) -> str | None:
    if coll.kind not in KINDS:
        return f"hierarchical does not serve {coll.kind.value}"
    if params:
        return f"hierarchical takes no parameters (got {', '.join(sorted(params))})"
    return node_grid(coll)[1]


def _build(coll: Collective, **params) -> Schedule:
    members, why = node_grid(coll)
    if why:
        raise CollectiveError(f"hierarchical cannot serve collective '{coll.name}': {why}")
    # reduce-scatter order: GPUs (dim 1) then nodes (dim 0); the all-gather runs it reversed
    pieces = [Piece(1, (1, 0)), Piece(-1, (1, 0))]
    return grid_schedule(coll, Grid(members), pieces, "hierarchical")


register(Algorithm(
    name="hierarchical", collectives=KINDS, applicable=_applicable, build=_build,
    description="intra-node reduce-scatter, inter-node per rail, intra-node all-gather "
                "(rings in both directions)"))
