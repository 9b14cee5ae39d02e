"""Pipelining chunks down packed trees: the ops of AllGather, ReduceScatter and AllReduce.

Every root's block is cut into ``k * C`` chunks: tree ``j`` of the root carries chunks
``j*C .. j*C + C-1``, one per step, so every tree edge moves one chunk per step once the pipe is
full (list scheduling with a fixed order: chunk ``c`` leaves the root in step ``c``).

* AllGather (out-trees): the edge into a member at depth ``d`` moves chunk ``c`` in step
  ``c + d - 1``; the root sends from its input, everyone else forwards from its output.
* ReduceScatter (in-trees): member ``v`` sends its partial sum of chunk ``c`` to its parent
  in network step ``1 + c + H - depth(v)`` for a tree of height ``H``: all children of a
  member send in one step. The first child reduces into the member's partial sum; the others
  land in receive slots (scratch), which the member folds in by a binary tree of local
  reductions in the steps between two network steps (the IR allows one write per slot per
  step, so siblings reducing into one slot would otherwise wait for each other: a star of
  ``s`` leaves would fill in ``s`` steps instead of one). Inner members accumulate in scratch
  (seeded from their input by a local copy in step 0), the root in its output.
* Chunk sizes: equal by default; with ``units`` (whole units per chunk, see
  :mod:`cclc.synth.taper`) a block is cut into ``k * sum(units)`` equal units and chunk ``c``
  of a tree is ``units[c]`` of them (an op of ``count`` units): chunks that shrink down the
  pipeline drain it sooner. Receive slots then hold the largest chunk.
* AllReduce: ReduceScatter into each root's output block, then AllGather of that block down
  the out-trees; chunk ``c`` of a tree starts down the moment its reduction is complete, so
  the two phases overlap.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cclc.collective import Collective
from cclc.ir import Buf, OpKind, Schedule, ScheduleBuilder, even_split
from cclc.synth.hop_graph import HopGraph
from cclc.synth.trees import TreePacking

__all__ = ["Pieces", "allgather_ops", "allreduce_ops", "reduce_offsets", "reduce_plan",
           "reducescatter_ops", "tree_edges"]


def tree_edges(p: TreePacking) -> dict[str, np.ndarray]:
    """Every (root, tree, member) with member != root, with its parent, move and depth."""
    n, k, _ = p.parent.shape
    r, j, v = np.meshgrid(np.arange(n), np.arange(k), np.arange(n), indexing="ij")
    keep = (v != r).ravel()
    depth = p.depth().ravel()[keep]
    return dict(root=r.ravel()[keep], tree=j.ravel()[keep], member=v.ravel()[keep],
                parent=p.parent.ravel()[keep], move=p.edge.ravel()[keep], depth=depth)


def reduce_offsets(p: TreePacking) -> np.ndarray:
    """``o[r, j, v]``: the step offset at which ``v`` sends its partial sums up tree ``(r, j)``;
    the root's entry is the offset after which its sum is complete.

    ``o = H - depth`` for a tree of height ``H``: all children of a member send in the same
    step (into distinct receive slots, see :func:`_reduce_phase`), so the in-trees fill in
    their height, as the out-trees do.
    """
    depth = p.depth()
    return depth.max(axis=2, keepdims=True) - depth


def _chunk_layout(block_elems: np.ndarray, q: int) -> np.ndarray:
    return np.concatenate([even_split(int(e), q) for e in block_elems])


def _routes(b: ScheduleBuilder, g: HopGraph, moves: np.ndarray) -> np.ndarray:
    """Route ids in ``b`` for moves ``moves`` of ``g`` (each distinct move added once)."""
    used, inverse = np.unique(moves, return_inverse=True)
    lengths = g.offsets[used + 1] - g.offsets[used]
    offs = np.concatenate([[0], np.cumsum(lengths)])
    links = np.concatenate([g.links[g.offsets[h]:g.offsets[h + 1]] for h in used.tolist()])
    return b.add_routes(offs, links)[inverse.reshape(-1)]


@dataclass(frozen=True)
class Pieces:
    """How a tree's share of a block is cut: chunk ``c`` is ``count[c]`` consecutive units
    from unit ``first[c]`` on; ``per_tree`` units in all (equal chunks: one unit each)."""

    count: np.ndarray
    first: np.ndarray
    per_tree: int

    @classmethod
    def of(cls, chunks: int, units: np.ndarray | None = None) -> Pieces:
        """``chunks`` chunks of ``units[c]`` units each (one unit each without ``units``)."""
        count = np.ones(chunks, dtype=np.int64) if units is None else \
            np.asarray(units, dtype=np.int64)
        if len(count) != chunks or (count < 1).any():
            raise ValueError(f"units {count.tolist()} for {chunks} chunks")
        return cls(count, np.cumsum(count) - count, int(count.sum()))

    @property
    def tapered(self) -> bool:
        return self.per_tree > len(self.count)

    def slot(self, tree: np.ndarray, chunk: np.ndarray) -> np.ndarray:
        """The first unit of chunk ``chunk`` of tree ``tree`` within a root's block."""
        return tree * self.per_tree + self.first[chunk]


def _expand(e: dict[str, np.ndarray], chunks: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Repeat every tree edge once per chunk; returns the edges and the chunk index."""
    rep = {key: np.repeat(val, chunks) for key, val in e.items()}
    return rep, np.tile(np.arange(chunks), len(e["root"]))


def allgather_ops(coll: Collective, g: HopGraph, p: TreePacking, chunks: int,
                  params: tuple, units: np.ndarray | None = None) -> Schedule:
    """The AllGather schedule of packing ``p`` with ``chunks`` chunks per tree (of ``units``
    units each, see :class:`Pieces`)."""
    n, k = coll.n, p.k
    pieces = Pieces.of(chunks, units)
    q = k * pieces.per_tree
    lay = even_split(coll.count // n, q)
    b = ScheduleBuilder(coll, input=lay, output=np.tile(lay, n))
    ranks = np.arange(n)
    b.add(step=0, src=ranks, dst=ranks, src_buf=Buf.INPUT, src_off=0, dst_buf=Buf.OUTPUT,
          dst_off=ranks * q, count=q)
    e, c = _expand(tree_edges(p), chunks)
    slot = pieces.slot(e["tree"], c)
    from_root = e["parent"] == e["root"]
    b.add(step=c + e["depth"] - 1, src=e["parent"], dst=e["member"],
          route=_routes(b, g, e["move"]),
          src_buf=np.where(from_root, Buf.INPUT, Buf.OUTPUT),
          src_off=np.where(from_root, slot, e["root"] * q + slot), dst_buf=Buf.OUTPUT,
          dst_off=e["root"] * q + slot, count=pieces.count[c])
    return b.build("synth", params=params)


def _siblings(e: dict[str, np.ndarray], n: int, k: int) -> np.ndarray:
    """Each tree edge's index among the children of its parent in its tree (by member)."""
    key = (e["root"] * k + e["tree"]) * n + e["parent"]
    order = np.lexsort((e["member"], key))
    sk = key[order]
    first = np.ones(len(sk), dtype=bool)
    first[1:] = sk[1:] != sk[:-1]
    start = np.maximum.accumulate(np.where(first, np.arange(len(sk)), 0))
    sib = np.empty(len(sk), dtype=np.int64)
    sib[order] = np.arange(len(sk)) - start
    return sib


def _lowbit_round(sib: np.ndarray) -> np.ndarray:
    """The local round (1-based) in which receive position ``sib >= 1`` is folded into
    position ``sib - lowbit(sib)``: a binary tree of local reductions."""
    low = sib & -sib
    return np.log2(np.maximum(low, 1)).astype(np.int64) + 1


def reduce_plan(p: TreePacking, chunk_elems: np.ndarray, scratch_base: int,
                pieces: Pieces | None = None) -> tuple[int, np.ndarray, np.ndarray]:
    """The receive slots of the in-trees of ``p``.

    ``chunk_elems[r, u]``: elements of unit ``u`` of root ``r``'s block (equal chunks: a unit
    is a chunk). Returns ``(rounds, recv_sizes, recv_slot)``: local rounds after each network
    step (0 when no member has two children in a tree), the element counts of the receive
    units appended to scratch from unit ``scratch_base`` on, and per tree edge (the order of
    :func:`tree_edges`) and chunk of its tree ``recv_slot[edge, c]``: the first scratch unit
    the edge's copy lands in (-1 for the first child, which reduces into its parent directly).

    Slots are numbered per receiving member, so the scratch a rank declares is what it
    uses: numbered across the members, every rank declared every member's slots (hgx16's
    AllReduce: 871,040 scratch chunks per rank where the busiest used 6,367, and the
    verifier's tables of every slot were gigabytes of memory touched a slot at a time).
    """
    n, k, _ = p.parent.shape
    e = tree_edges(p)
    sib = _siblings(e, n, k)
    rounds = int(_lowbit_round(sib[sib > 0]).max(initial=0))
    extra = sib > 0
    if pieces is not None and pieces.tapered:
        # equal units (the taper needs them): one slot of the largest chunk per (root, tree,
        # sibling), which every chunk of the tree reuses from its first unit
        chunks, width = len(pieces.count), int(pieces.count.max())
        recv = np.full((len(sib), chunks), -1, dtype=np.int64)
        if not extra.any():
            return rounds, np.zeros(0, dtype=np.int64), recv
        local = _per_member(e["parent"][extra], np.arange(int(extra.sum())))
        recv[extra] = scratch_base + width * local[:, None]
        return rounds, np.full(width * (int(local.max()) + 1), chunk_elems.flat[0]), recv
    chunks = chunk_elems.shape[1] // k
    slots = e["tree"][:, None] * chunks + np.arange(chunks)[None, :]
    size = chunk_elems[e["root"][:, None], slots]
    recv = np.full(size.shape, -1, dtype=np.int64)
    if not extra.any():
        return rounds, np.zeros(0, dtype=np.int64), recv
    # one receive slot per (member, root, tree, sibling, chunk size): a slot is emptied by
    # the local rounds right after the step that fills it, so the chunks of a tree share it;
    # the slots of one size lie together, as many as the member with the most needs
    sizes, size_id = np.unique(size[extra], return_inverse=True)
    shape = size[extra].shape
    rows = np.broadcast_to(((e["root"] * k + e["tree"]) * n + sib)[extra, None], shape)
    member = np.broadcast_to(e["parent"][extra, None], shape)
    group = member.ravel() * len(sizes) + size_id.ravel()
    local = _per_member(group, rows.ravel())
    most = np.zeros(len(sizes), dtype=np.int64)
    np.maximum.at(most, group % len(sizes), local + 1)
    start = scratch_base + np.concatenate([[0], np.cumsum(most)[:-1]])
    recv[extra] = (start[group % len(sizes)] + local).reshape(shape)
    return rounds, np.repeat(sizes, most), recv


def _per_member(group: np.ndarray, key: np.ndarray) -> np.ndarray:
    """Per entry: the index of its ``key`` among the distinct keys of its ``group``, in key
    order (equal keys of a group get the same index)."""
    span = int(key.max()) + 1
    uniq, inverse = np.unique(group.astype(np.int64) * span + key, return_inverse=True)
    g = uniq // span
    return (np.arange(len(uniq)) - np.searchsorted(g, g))[inverse.reshape(-1)]


def _reduce_phase(b: ScheduleBuilder, g: HopGraph, p: TreePacking, pieces: Pieces, root_off,
                  rounds: int, recv: np.ndarray) -> np.ndarray:
    """Add the in-tree ops (seed copies in step 0, then the sends up the trees and the local
    folds of the receive slots) to ``b``.

    ``root_off(root, slot)``: the output unit a root accumulates unit ``slot`` of its block
    in. Network step ``t`` is IR step ``t * (rounds + 1)``; the ``rounds`` steps after it hold
    only local reductions. The first child of a member reduces into the member's partial sum
    over the network; its other children copy into receive slots in the same step, which
    the member folds in by a binary tree of local reductions before it sends on: no sibling
    waits for another (the IR allows one write per slot per step).
    Returns the reduce offsets.
    """
    n, k = p.parent.shape[:2]
    chunks, per_tree = len(pieces.count), pieces.per_tree
    q = k * per_tree
    stride = rounds + 1
    off = reduce_offsets(p)
    e = tree_edges(p)
    sib = _siblings(e, n, k)
    inner = np.zeros((n, k, n), dtype=bool)
    inner[e["root"], e["tree"], e["parent"]] = True
    r, j, v = np.nonzero(inner)
    nonroot = v != r
    r, j, v = r[nonroot], j[nonroot], v[nonroot]
    b.add(step=0, src=v, dst=v, src_buf=Buf.INPUT, src_off=r * q + j * per_tree,
          dst_buf=Buf.SCRATCH, dst_off=r * q + j * per_tree, count=per_tree)
    sib = np.repeat(sib, chunks)
    e, c = _expand(e, chunks)
    recv = recv.reshape(-1)
    slot = pieces.slot(e["tree"], c)
    cnt = pieces.count[c]
    to_root = e["parent"] == e["root"]
    has_kids = inner[e["root"], e["tree"], e["member"]]
    acc_buf = np.where(to_root, Buf.OUTPUT, Buf.SCRATCH)
    acc_off = np.where(to_root, root_off(e["root"], slot), e["root"] * q + slot)
    net = 1 + c + off[e["root"], e["tree"], e["member"]]
    first = sib == 0
    b.add(step=net * stride, src=e["member"], dst=e["parent"],
          route=_routes(b, g, e["move"]), kind=np.where(first, OpKind.REDUCE, OpKind.COPY),
          src_buf=np.where(has_kids, Buf.SCRATCH, Buf.INPUT), src_off=e["root"] * q + slot,
          dst_buf=np.where(first, acc_buf, Buf.SCRATCH), dst_off=np.where(first, acc_off, recv),
          count=cnt)
    # fold receive position s into position s - lowbit(s) (position 0 is the partial sum)
    x = np.flatnonzero(~first)
    if len(x):
        s = sib[x]
        target = s - (s & -s)
        # the edge of the same parent, tree and chunk at position `target`: edges of one
        # parent are contiguous per chunk after the sort in _siblings, so look it up by key
        key = ((e["root"] * k + e["tree"]) * n + e["parent"]) * chunks + c
        pos_key = key * (n + 1) + sib
        order = np.argsort(pos_key)
        where = order[np.searchsorted(pos_key, key[x] * (n + 1) + target, sorter=order)]
        to_acc = target == 0
        b.add(step=net[x] * stride + _lowbit_round(s), src=e["parent"][x], dst=e["parent"][x],
              kind=OpKind.REDUCE, src_buf=Buf.SCRATCH, src_off=recv[x],
              dst_buf=np.where(to_acc, acc_buf[x], Buf.SCRATCH),
              dst_off=np.where(to_acc, acc_off[x], recv[where]), count=cnt[x])
    return off


def _scratch_and_plan(p: TreePacking, chunk_elems: np.ndarray, base: np.ndarray,
                      pieces: Pieces):
    rounds, sizes, recv = reduce_plan(p, chunk_elems, len(base), pieces)
    return np.concatenate([base, sizes]).astype(np.int64), rounds, recv


def reducescatter_ops(coll: Collective, g: HopGraph, p: TreePacking, chunks: int,
                      params: tuple, units: np.ndarray | None = None) -> Schedule:
    """The ReduceScatter schedule of in-tree packing ``p`` (trees of the reversed moves)."""
    n, k = coll.n, p.k
    pieces = Pieces.of(chunks, units)
    q = k * pieces.per_tree
    lay = even_split(coll.count // n, q)
    scratch, rounds, recv = _scratch_and_plan(p, np.tile(lay, (n, 1)), np.tile(lay, n),
                                              pieces)
    b = ScheduleBuilder(coll, input=np.tile(lay, n), output=lay, scratch=scratch)
    ranks = np.arange(n)
    b.add(step=0, src=ranks, dst=ranks, src_buf=Buf.INPUT, src_off=ranks * q,
          dst_buf=Buf.OUTPUT, dst_off=0, count=q)
    _reduce_phase(b, g, p, pieces, lambda root, slot: slot, rounds, recv)
    return b.build("synth", params=params)


def allreduce_ops(coll: Collective, g: HopGraph, rs: TreePacking, ag: TreePacking,
                  chunks: int, params: tuple, units: np.ndarray | None = None) -> Schedule:
    """ReduceScatter over ``rs`` into each root's output block, then AllGather over ``ag``
    (same ``k``), overlapped chunk by chunk."""
    n, k = coll.n, ag.k
    pieces = Pieces.of(chunks, units)
    q = k * pieces.per_tree
    lay = _chunk_layout(even_split(coll.count, n), q)
    scratch, rounds, recv = _scratch_and_plan(rs, lay.reshape(n, q), lay, pieces)
    b = ScheduleBuilder(coll, input=lay, output=lay, scratch=scratch)
    ranks = np.arange(n)
    b.add(step=0, src=ranks, dst=ranks, src_buf=Buf.INPUT, src_off=ranks * q,
          dst_buf=Buf.OUTPUT, dst_off=ranks * q, count=q)
    off = _reduce_phase(b, g, rs, pieces, lambda root, slot: root * q + slot, rounds, recv)
    e, c = _expand(tree_edges(ag), chunks)
    slot = pieces.slot(e["tree"], c)
    done = off[e["root"], e["tree"], e["root"]]          # last reduce into the root: c + done
    b.add(step=(c + done + e["depth"]) * (rounds + 1), src=e["parent"], dst=e["member"],
          route=_routes(b, g, e["move"]), src_buf=Buf.OUTPUT, src_off=e["root"] * q + slot,
          dst_buf=Buf.OUTPUT, dst_off=e["root"] * q + slot, count=pieces.count[c])
    return b.build("synth", params=params)
