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

Pipelining (``hierarchical(chunks = K)``): the data is cut into ``K`` groups, group ``k``
starting ``k`` first-phase lengths after group 0, so that one group's NVLink phase runs while
another's network phase does (the GPU's NVLink port and its NIC are different links). More
groups hide more of the intra-node time but add ``(K-1)`` phase lengths of latency. Without the
parameter the builder prices ``K`` = 1, 2, 4, 8 with the cost function the algorithm table
hands it (:data:`cclc.algorithms.CostFn`) and keeps the fastest.
"""

from __future__ import annotations

import numpy as np

from cclc.algorithms import Algorithm, CostFn, register
from cclc.algorithms.common import bad_int_param, chunks_reason, hint_int
from cclc.algorithms.torus_collectives import KINDS, Grid, Piece, grid_schedule
from cclc.collective import Collective, CollectiveKind
from cclc.errors import CollectiveError
from cclc.ir import Schedule

#: pipeline depths tried when the user does not set ``chunks``
AUTO_CHUNKS = (1, 2, 4, 8)

__all__ = ["node_grid"]


def node_grid(coll: Collective) -> tuple[np.ndarray | None, str | None]:
    """``members[h, g]``: group index of the ``g``-th GPU (by GPU id) of the ``h``-th node of the
    group (by first appearance), or the reason the group is not whole-node shaped."""
    topo = coll.topology
    if topo.kind != "fabric" or topo.node_of_rank is None or topo.gpu_of_rank is None:
        return None, (f"hierarchical needs multi-GPU nodes (NVLink or PCIe) on a fabric; "
                      f"'{topo.name}' is a {topo.kind_name}")
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
    extra = set(params) - {"chunks"}
    if extra:
        return f"hierarchical takes only the parameter chunks (got {', '.join(sorted(extra))})"
    return (bad_int_param(params, "chunks")
            or chunks_reason(coll, params, _block_elements(coll), "each rank's block")
            or node_grid(coll)[1])


def _block_elements(coll: Collective) -> int:
    """The elements of one rank's block, which the pipeline groups cut (as
    :func:`~cclc.algorithms.torus_collectives.grid_schedule` does)."""
    if coll.kind is CollectiveKind.ALLREDUCE:
        return max(coll.count // coll.n, 1)
    return coll.count // coll.n


def _ops(coll: Collective, **params) -> int:
    """Every piece (two per pipeline group, no more than a block has elements) brings every
    rank the other ``n - 1`` ranks' parts, one op each; without ``chunks`` the shallowest
    pipeline tried (the builder may keep it)."""
    chunks = hint_int(params, "chunks", None) or AUTO_CHUNKS[0]
    return min(2 * chunks, _block_elements(coll)) * coll.n * (coll.n - 1)


def _pieces(coll: Collective, members: np.ndarray, chunks: int) -> list[Piece]:
    """Two directions per pipeline group; group ``k`` waits ``k`` first-phase lengths."""
    nodes, gpus = members.shape
    # reduce-scatter order: GPUs (dim 1) then nodes (dim 0); the all-gather runs it reversed,
    # so an allgather starts with the network phase
    first = nodes - 1 if coll.kind is CollectiveKind.ALLGATHER else gpus - 1
    return [Piece(d, (1, 0), delay=k * first) for k in range(chunks) for d in (1, -1)]


def _build(coll: Collective, *, cost: CostFn, **params) -> Schedule:
    members, why = node_grid(coll)
    if members is None:
        raise CollectiveError(f"hierarchical cannot serve collective '{coll.name}': {why}")
    chunks = hint_int(params, "chunks", None)
    grid = Grid(members)
    if chunks is not None:
        return grid_schedule(coll, grid, _pieces(coll, members, chunks), "hierarchical",
                             params=(("chunks", chunks),))
    best: tuple[float, Schedule] | None = None
    for k in AUTO_CHUNKS:
        s = grid_schedule(coll, grid, _pieces(coll, members, k), "hierarchical",
                          params=(("chunks", k),))
        t = cost(s)
        if best is None or t < best[0]:
            best = (t, s)
    assert best is not None
    return best[1]


register(Algorithm(
    name="hierarchical", collectives=KINDS, applicable=_applicable, build=_build, tunes=True,
    ops=_ops,
    description="intra-node reduce-scatter, inter-node per rail, intra-node all-gather "
                "(rings in both directions, pipelined in chunks=K groups)"))
