"""Pipelining chunks down packed trees: the ops of AllGather, ReduceScatter and AllReduce.

Every root's block is cut into ``k * C`` chunks: tree ``j`` of the root carries chunks
``j*C .. j*C + C-1``, one per step, so every tree edge moves one chunk per step once the pipe is
full (list scheduling with a fixed order: chunk ``c`` leaves the root in step ``c``).

* AllGather (out-trees): the edge into a member at depth ``d`` moves chunk ``c`` in step
  ``c + d - 1``; the root sends from its input, everyone else forwards from its output.
* ReduceScatter (in-trees): member ``v`` adds its partial sum of chunk ``c`` into its parent
  in step ``1 + c + o(v)``. Offsets ``o`` grow towards the root and siblings get distinct
  offsets, so no two ops reduce into one slot in one step (the IR's rule) and a member sends
  only after all its children have added in. Inner members accumulate in scratch (seeded
  from their input by a local copy in step 0), the root in its output.
* AllReduce: ReduceScatter into each root's output block, then AllGather of that block down
  the out-trees; chunk ``c`` of a tree starts down the moment its reduction is complete, so
  the two phases overlap.
"""

from __future__ import annotations

import numpy as np

from cclc.algorithms.common import even_split
from cclc.collective import Collective
from cclc.ir import Buf, OpKind, Schedule, ScheduleBuilder
from cclc.synth.trees import HopGraph, TreePacking

__all__ = ["allgather_ops", "allreduce_ops", "reduce_offsets", "reducescatter_ops",
           "tree_edges"]


def tree_edges(p: TreePacking) -> dict[str, np.ndarray]:
    """Every (root, tree, member) with member != root, with its parent, move and depth."""
    n, k, _ = p.parent.shape
    r, j, v = np.meshgrid(np.arange(n), np.arange(k), np.arange(n), indexing="ij")
    keep = (v != r).ravel()
    depth = p.depth().ravel()[keep]
    return dict(root=r.ravel()[keep], tree=j.ravel()[keep], member=v.ravel()[keep],
                parent=p.parent.ravel()[keep], move=p.edge.ravel()[keep], depth=depth)


def reduce_offsets(p: TreePacking) -> np.ndarray:
    """``o[r, j, v]``: the step offset at which ``v`` sends its partial sums up tree ``(r, j)``
    (module docstring); the root's entry is one more than its last child's."""
    n, k, _ = p.parent.shape
    off = np.zeros((n, k, n), dtype=np.int64)
    depth = p.depth()
    for r in range(n):
        for j in range(k):
            par = p.parent[r, j]
            need = np.zeros(n, dtype=np.int64)
            children: list[list[int]] = [[] for _ in range(n)]
            for v in np.argsort(-depth[r, j], kind="stable").tolist():
                kids = sorted(children[v], key=lambda u: need[u])
                last = -1
                for u in kids:
                    last = max(int(need[u]), last + 1)
                    off[r, j, u] = last
                need[v] = last + 1
                if v != r:
                    children[int(par[v])].append(v)
            off[r, j, r] = need[r]
    return off


def _chunk_layout(block_elems: np.ndarray, q: int) -> np.ndarray:
    return np.concatenate([even_split(int(e), q) for e in block_elems])


def _routes(b: ScheduleBuilder, g: HopGraph, moves: np.ndarray) -> np.ndarray:
    """Route ids in ``b`` for moves ``moves`` of ``g`` (each distinct move added once)."""
    used, inverse = np.unique(moves, return_inverse=True)
    lengths = g.offsets[used + 1] - g.offsets[used]
    offs = np.concatenate([[0], np.cumsum(lengths)])
    links = np.concatenate([g.links[g.offsets[h]:g.offsets[h + 1]] for h in used.tolist()])
    return b.add_routes(offs, links)[inverse.reshape(-1)]


def _expand(e: dict[str, np.ndarray], chunks: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Repeat every tree edge once per chunk; returns the edges and the chunk index."""
    rep = {key: np.repeat(val, chunks) for key, val in e.items()}
    return rep, np.tile(np.arange(chunks), len(e["root"]))


def allgather_ops(coll: Collective, g: HopGraph, p: TreePacking, chunks: int,
                  params: tuple) -> Schedule:
    """The AllGather schedule of packing ``p`` with ``chunks`` chunks per tree."""
    n, k = coll.n, p.k
    q = k * chunks
    lay = even_split(coll.count // n, q)
    b = ScheduleBuilder(coll, input=lay, output=np.tile(lay, n))
    ranks = np.arange(n)
    b.add(step=0, src=ranks, dst=ranks, src_buf=Buf.INPUT, src_off=0, dst_buf=Buf.OUTPUT,
          dst_off=ranks * q, count=q)
    e, c = _expand(tree_edges(p), chunks)
    slot = e["tree"] * chunks + c
    from_root = e["parent"] == e["root"]
    b.add(step=c + e["depth"] - 1, src=e["parent"], dst=e["member"],
          route=_routes(b, g, e["move"]),
          src_buf=np.where(from_root, Buf.INPUT, Buf.OUTPUT),
          src_off=np.where(from_root, slot, e["root"] * q + slot), dst_buf=Buf.OUTPUT,
          dst_off=e["root"] * q + slot)
    return b.build("synth", params=params)


def _reduce_phase(b: ScheduleBuilder, g: HopGraph, p: TreePacking, chunks: int,
                  root_off) -> np.ndarray:
    """Add the in-tree ops (seed copies in step 0, reduces from step 1) to ``b``.

    ``root_off(root, slot)``: the output chunk a root accumulates slot ``slot`` of its block in.
    Returns the reduce offsets.
    """
    n, k = p.parent.shape[:2]
    q = k * chunks
    off = reduce_offsets(p)
    e = tree_edges(p)
    inner = np.zeros((n, k, n), dtype=bool)
    inner[e["root"], e["tree"], e["parent"]] = True
    r, j, v = np.nonzero(inner)
    nonroot = v != r
    r, j, v = r[nonroot], j[nonroot], v[nonroot]
    b.add(step=0, src=v, dst=v, src_buf=Buf.INPUT, src_off=r * q + j * chunks,
          dst_buf=Buf.SCRATCH, dst_off=r * q + j * chunks, count=chunks)
    e, c = _expand(e, chunks)
    slot = e["tree"] * chunks + c
    to_root = e["parent"] == e["root"]
    has_kids = inner[e["root"], e["tree"], e["member"]]
    b.add(step=1 + c + off[e["root"], e["tree"], e["member"]], src=e["member"],
          dst=e["parent"], route=_routes(b, g, e["move"]), kind=OpKind.REDUCE,
          src_buf=np.where(has_kids, Buf.SCRATCH, Buf.INPUT), src_off=e["root"] * q + slot,
          dst_buf=np.where(to_root, Buf.OUTPUT, Buf.SCRATCH),
          dst_off=np.where(to_root, root_off(e["root"], slot), e["root"] * q + slot))
    return off


def reducescatter_ops(coll: Collective, g: HopGraph, p: TreePacking, chunks: int,
                      params: tuple) -> Schedule:
    """The ReduceScatter schedule of in-tree packing ``p`` (trees of the reversed moves)."""
    n, k = coll.n, p.k
    q = k * chunks
    lay = even_split(coll.count // n, q)
    b = ScheduleBuilder(coll, input=np.tile(lay, n), output=lay, scratch=np.tile(lay, n))
    ranks = np.arange(n)
    b.add(step=0, src=ranks, dst=ranks, src_buf=Buf.INPUT, src_off=ranks * q,
          dst_buf=Buf.OUTPUT, dst_off=0, count=q)
    _reduce_phase(b, g, p, chunks, lambda root, slot: slot)
    return b.build("synth", params=params)


def allreduce_ops(coll: Collective, g: HopGraph, rs: TreePacking, ag: TreePacking,
                  chunks: int, params: tuple) -> Schedule:
    """ReduceScatter over ``rs`` into each root's output block, then AllGather over ``ag``
    (same ``k``), overlapped chunk by chunk."""
    n, k = coll.n, ag.k
    q = k * chunks
    lay = _chunk_layout(even_split(coll.count, n), q)
    b = ScheduleBuilder(coll, input=lay, output=lay, scratch=lay)
    ranks = np.arange(n)
    b.add(step=0, src=ranks, dst=ranks, src_buf=Buf.INPUT, src_off=ranks * q,
          dst_buf=Buf.OUTPUT, dst_off=ranks * q, count=q)
    off = _reduce_phase(b, g, rs, chunks, lambda root, slot: root * q + slot)
    e, c = _expand(tree_edges(ag), chunks)
    slot = e["tree"] * chunks + c
    done = off[e["root"], e["tree"], e["root"]]          # last reduce into the root: c + done
    b.add(step=c + done + e["depth"], src=e["parent"], dst=e["member"],
          route=_routes(b, g, e["move"]), src_buf=Buf.OUTPUT, src_off=e["root"] * q + slot,
          dst_buf=Buf.OUTPUT, dst_off=e["root"] * q + slot)
    return b.build("synth", params=params)
