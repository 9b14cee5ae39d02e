"""A schedule for one fault set, moved onto another fault set of its orbit by relabeling.

If an automorphism ``g`` of the machine maps fault set ``F`` onto ``g(F)``, the schedule of
``F`` with every rank ``q`` replaced by ``g(q)``, every link ``l`` by ``g(l)`` and every
block that belongs to a rank (alltoall's input and output blocks, allgather's output blocks,
reducescatter's input blocks) moved to the block of the image rank, is a schedule of
``g(F)``: the same moves, on links that the automorphism keeps healthy. Blocks that belong to
no rank (allreduce's vector, broadcast's and reduce's, whose root ``g`` fixes) stay where
they are.

A runtime applies the relabeling to its tables: rank ``g(q)`` runs rank ``q``'s entries with
every peer ``p`` replaced by ``g(p)`` and every block ``b`` of a rank's buffer by ``g(b)``.
That is one lookup per entry when no entry's range crosses a block boundary:
:func:`split_at_blocks` cuts the ranges that do (the same moves, in more ops).
"""

from __future__ import annotations

import numpy as np

from cclc.collective import Collective, CollectiveKind
from cclc.errors import ScheduleError
from cclc.ir import Buf, Ops, Routes, Schedule
from cclc.semantics import contract

__all__ = ["RANK_BUFFERS", "block_chunks", "group_map", "relabel", "split_at_blocks"]

#: the buffers whose blocks belong to ranks (block ``b`` is rank ``b``'s), per collective kind
RANK_BUFFERS: dict[CollectiveKind, tuple[Buf, ...]] = {
    CollectiveKind.ALLTOALL: (Buf.INPUT, Buf.OUTPUT),
    CollectiveKind.ALLGATHER: (Buf.OUTPUT,),
    CollectiveKind.REDUCESCATTER: (Buf.INPUT,),
    CollectiveKind.ALLREDUCE: (),
    CollectiveKind.BROADCAST: (),
    CollectiveKind.REDUCE: (),
}


def block_chunks(schedule: Schedule, buf: Buf) -> np.ndarray:
    """``(n, chunks)``: the block (0..n-1) of every chunk of every rank's rank-indexed buffer
    ``buf`` (``n`` for the empty chunks that end a shorter row)."""
    c = contract(schedule.collective)
    blocks = c.input_blocks if buf is Buf.INPUT else c.output_blocks
    starts = schedule.chunk_starts(buf)[:, :-1]
    # blocks follow each other in group order (semantics.contract), so a chunk's block is the
    # number of block ends at or before its start
    ends = np.cumsum(blocks, axis=1)
    out = np.empty(starts.shape, dtype=np.int64)
    for q in range(schedule.n):
        out[q] = np.searchsorted(ends[q], starts[q], side="right")
    return out


def split_at_blocks(schedule: Schedule) -> Schedule:
    """``schedule`` with every op cut where its source or destination range crosses from one
    rank's block into the next (of the buffers :data:`RANK_BUFFERS` names); the same moves."""
    indexed = RANK_BUFFERS[schedule.collective.kind]
    if not indexed or schedule.n < 2:
        return schedule
    ops = schedule.ops
    block_of = {buf: block_chunks(schedule, buf) for buf in indexed}
    count = ops.count.astype(np.int64)
    crosses = np.zeros(len(ops), dtype=bool)
    sides = ((ops.src_buf, ops.src_off, ops.src), (ops.dst_buf, ops.dst_off, ops.dst))
    for buf, chunk_block in block_of.items():
        for side_buf, off, side_rank in sides:
            m = (side_buf == buf) & (count > 1)
            o, rank = off[m].astype(np.int64), side_rank[m]
            crosses[np.flatnonzero(m)] |= (chunk_block[rank, o]
                                           != chunk_block[rank, o + count[m] - 1])
    if not crosses.any():
        return schedule
    # one row per chunk of the crossing ops, then runs of chunks in one block on both sides
    cut = np.flatnonzero(crosses)
    reps = count[cut]
    row = np.repeat(cut, reps)
    k = np.arange(len(row)) - np.repeat(np.cumsum(reps) - reps, reps)
    key = np.zeros((len(row), 2), dtype=np.int64)
    for side, (side_buf, off, rank) in enumerate(sides):
        chunk = off[row].astype(np.int64) + k
        for buf, chunk_block in block_of.items():
            m = side_buf[row] == buf
            key[m, side] = chunk_block[rank[row][m], chunk[m]]
    new_piece = np.ones(len(row), dtype=bool)
    new_piece[1:] = (row[1:] != row[:-1]) | (key[1:] != key[:-1]).any(axis=1)
    first = np.flatnonzero(new_piece)
    lengths = np.diff(np.append(first, len(row)))
    piece_row, piece_k = row[first], k[first]
    cols = {name: getattr(ops, name)[piece_row] for name in ("step", "src", "dst", "route",
                                                            "kind", "src_buf", "dst_buf")}
    pieces = Ops(src_off=ops.src_off[piece_row] + piece_k, dst_off=ops.dst_off[piece_row]
                 + piece_k, count=lengths, **cols)
    split = schedule.replace(ops=_merge(ops, crosses, pieces, piece_row))
    src_elems = split.op_elems()
    dst_elems = np.zeros(len(split.ops), dtype=np.int64)
    for buf in Buf:
        m = split.ops.dst_buf == buf
        dst_elems[m] = split.range_elems(buf, split.ops.dst[m], split.ops.dst_off[m],
                                         split.ops.count[m])
    if not np.array_equal(src_elems, dst_elems):
        raise ScheduleError("an op's source and destination chunks differ in size where it "
                            "crosses a block: it cannot be cut at the block boundary")
    return split


def _merge(ops: Ops, replaced: np.ndarray, pieces: Ops, origin: np.ndarray) -> Ops:
    """``ops`` with the rows ``replaced`` taken out and ``pieces`` (cut from the ops
    ``origin``, in order) put where their op was."""
    kept = ops.take(~replaced)
    position = np.concatenate([np.flatnonzero(~replaced), origin])
    order = np.argsort(position, kind="stable")
    cols = {name: np.concatenate([a, b])[order]
            for (name, a), b in zip(kept.columns().items(), pieces.columns().values(),
                                    strict=True)}
    return Ops(**cols)


def group_map(source: Collective, target: Collective, vertex: np.ndarray) -> np.ndarray:
    """``out[q]``: the index in ``target``'s group of the image under ``vertex`` of member
    ``q`` of ``source``'s group (a permutation when the map serves the pair)."""
    index = np.full(target.topology.n_vertices, -1, dtype=np.int64)
    index[np.asarray(target.group, dtype=np.int64)] = np.arange(target.n)
    out = index[np.asarray(vertex, dtype=np.int64)[np.asarray(source.group, dtype=np.int64)]]
    if (out < 0).any() or len(np.unique(out)) != len(out) or source.n != target.n:
        raise ScheduleError("the symmetry does not map the group onto the target's group")
    return out


def relabel(schedule: Schedule, target: Collective, vertex: np.ndarray) -> Schedule:
    """``schedule`` moved onto ``target`` (the same collective on the image machine) by the
    vertex map ``vertex`` (see the module docstring); ops must not cross rank blocks
    (:func:`split_at_blocks`)."""
    ranks = group_map(schedule.collective, target, vertex)
    ops = schedule.ops
    cols = ops.columns()
    cols["src"], cols["dst"] = ranks[ops.src], ranks[ops.dst]
    layouts = [lay if lay.ndim == 1 else _rows(lay, ranks) for lay in schedule.layouts]
    for buf in RANK_BUFFERS[schedule.collective.kind] if schedule.n > 1 else ():
        layouts[buf], new_index = _moved_blocks(schedule, buf, ranks)
        for side in ("src", "dst"):
            m = cols[f"{side}_buf"] == buf
            rank = getattr(ops, side)[m]
            off = getattr(ops, f"{side}_off")[m].astype(np.int64)
            start, last = new_index[rank, off], new_index[rank, off + ops.count[m] - 1]
            if (last - start != ops.count[m] - 1).any():
                raise ScheduleError("an op crosses a rank's block: split it at the block "
                                    "boundaries first (split_at_blocks)")
            moved = cols[f"{side}_off"].astype(np.int64).copy()
            moved[m] = start
            cols[f"{side}_off"] = moved
    topo = target.topology
    V = topo.n_vertices
    src, dst = topo.link_src.astype(np.int64), topo.link_dst.astype(np.int64)
    keys = src * V + dst
    order = np.argsort(keys)
    links = schedule.routes.links.astype(np.int64)
    image = vertex[src[links]] * V + vertex[dst[links]]
    at = np.minimum(np.searchsorted(keys[order], image), max(len(keys) - 1, 0))
    if len(links) and not (keys[order][at] == image).all():
        raise ScheduleError("the symmetry maps a route's link onto no link of the target")
    routes = Routes(schedule.routes.offsets, order[at] if len(links) else links)
    return schedule.replace(collective=target, ops=Ops(**cols), routes=routes,
                            layouts=tuple(layouts))


def _moved_blocks(schedule: Schedule, buf: Buf, ranks: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
    """The layout of ``buf`` after the relabeling ``ranks`` and, per old rank and chunk, the
    chunk's index in its new rank's row: rank ``ranks[q]``'s block ``ranks[b]`` is cut as
    rank ``q``'s block ``b`` was (1-D again when every row is cut alike)."""
    n = schedule.n
    elems = schedule.chunk_elems(buf)
    block = block_chunks(schedule, buf)
    # new order of each old row: by the new block of each chunk (trailing empties last), the
    # chunks of one block in their order
    new_block = np.where(block < n, ranks[np.minimum(block, n - 1)], n)
    order = np.argsort(new_block, axis=1, kind="stable")
    new_index = np.empty_like(order)
    np.put_along_axis(new_index, order, np.arange(order.shape[1])[None, :], axis=1)
    layout = np.empty_like(elems)
    layout[ranks] = np.take_along_axis(elems, order, axis=1)
    new_index_by_old_rank = new_index
    if (layout == layout[0]).all():
        return layout[0].copy(), new_index_by_old_rank
    return layout, new_index_by_old_rank


def _rows(layout: np.ndarray, ranks: np.ndarray) -> np.ndarray:
    """A per-rank layout with row ``q`` moved to row ``ranks[q]``."""
    out = np.empty_like(layout)
    out[ranks] = layout
    return out
