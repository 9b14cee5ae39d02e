"""A reduction's contributor sets by number, made a slice of contributor ranks at a time.

The verifier (:mod:`cclc.verify`) follows which ranks' contributions every chunk slot sums. Held
as ``n`` bits per slot, the sets of a 4,096-rank ReduceScatter take 16 GiB. A run of the values
alone numbers them instead (:class:`SetLog`): set ``r < n`` is ``{r}``, set ``n`` the empty set,
a copy moves a number and every reducing pair makes a new set, the union of two earlier ones.
The bits of the sets are then made a slice of contributor ranks at a time
(:func:`make_unions`): contributions move bit by bit independently (a union ORs them, and a
contribution added twice, a split joining different sets or an output missing a rank is
wrong exactly when it is wrong in some slice), so the slices together decide what the whole
sets would, each within :data:`SLICE_BYTES`.
"""

from __future__ import annotations

import numpy as np

__all__ = ["SLICE_BYTES", "SetLog", "all_of", "gather_sets", "initial_sets", "make_unions",
           "slice_reach"]

#: the most bytes of contributor sets held at once: beyond, the sets are numbered and made a
#: slice of contributor ranks at a time (a 4,096-rank ReduceScatter's sets whole are 16 GiB)
SLICE_BYTES = 2 << 30

#: unions per block when a slice makes them (bounds the temporaries of a step)
_BLOCK = 1 << 21


def all_of(contrib: range) -> np.ndarray:
    """The words of a contributor set holding every rank of ``contrib`` (bit
    ``r - contrib.start``)."""
    k = len(contrib)
    words = np.zeros((k + 63) // 64, dtype=np.uint64)
    words[:k // 64] = ~np.uint64(0)
    if k % 64:
        words[k // 64] = (np.uint64(1) << np.uint64(k % 64)) - np.uint64(1)
    return words


class SetLog:
    """The contributor sets of a run without bits, by number: set ``r < n`` is ``{r}``, set
    ``n`` the empty set, and every reducing pair makes a new set, the union of two earlier
    ones, numbered in order; per step, the unions it makes (``a[t][i] | b[t][i]`` becomes set
    ``start[t] + i``, first made by the step's op ``op[t][i]``) and the pairs of sets that a
    split or merge requires to be equal (``same[t]``: rows of set, set, op)."""

    def __init__(self, n: int):
        self.n = n
        self.size = n + 1
        self.start: list[int] = []
        self.a: list[np.ndarray] = []
        self.b: list[np.ndarray] = []
        self.op: list[np.ndarray] = []
        self.same: list[np.ndarray] = []

    def add_step(self, a: np.ndarray, b: np.ndarray, op: np.ndarray,
                 same: list[tuple[int, int, int]]) -> np.ndarray:
        """Record one step's unions (of sets ``a`` and ``b``, by the step's ops ``op``, in op
        order) and equal pairs; the numbers of the sets they make. Unions of the same two
        sets make one set, recorded once with the first op that makes it: a reduction
        repeats them for every chunk of a share (a 4,096-rank rail_halving AllReduce's 16.8M
        reducing chunks make 775k sets), and a union is wrong exactly when its first op's
        is."""
        m = np.int64(self.size)
        key = a.astype(np.int64) * m + b.astype(np.int64)
        uniq, first, inverse = np.unique(key, return_index=True, return_inverse=True)
        self.start.append(self.size)
        self.a.append(uniq // m)
        self.b.append(uniq % m)
        self.op.append(op[first].astype(np.int32))
        self.same.append(np.array(same, dtype=np.int64).reshape(-1, 3))
        self.size += len(uniq)
        return self.start[-1] + inverse.reshape(-1).astype(np.int64)


def initial_sets(log: SetLog, contrib: range) -> np.ndarray:
    """The table of every set's bits for ranks ``contrib`` (bit ``r - contrib.start``),
    before any union: set ``r`` holds ``r``."""
    table = np.zeros((log.size, (len(contrib) + 63) // 64), dtype=np.uint64)
    local = np.arange(len(contrib))
    table[np.arange(contrib.start, contrib.stop), local // 64] = \
        np.left_shift(np.uint64(1), (local % 64).astype(np.uint64))
    return table


def slice_reach(log: SetLog, slices: list[range]) -> np.ndarray:
    """Per set, the slices with a contributor in it (bit ``i``: slice ``i``): a slice makes
    only the unions that reach it (in a slice of a few nodes, a fraction of them); the
    others are empty there."""
    k = len(slices)
    reach = np.zeros((log.size, (k + 63) // 64), dtype=np.uint64)
    for i, contrib in enumerate(slices):
        reach[contrib.start:contrib.stop, i // 64] = np.uint64(1) << np.uint64(i % 64)
    for start, a, b in zip(log.start, log.a, log.b, strict=True):
        reach[start:start + len(a)] = reach[a] | reach[b]
    return reach


def make_unions(log: SetLog, table: np.ndarray, first: tuple[int, int] | None,
                reach: np.ndarray | None = None, i: int = 0, last: int | None = None
                ) -> tuple[int, int] | None:
    """Make the unions of the steps before ``first`` (and of its step, where the error is an
    op's; or of the first ``last`` steps) on ``table``, a slice's sets
    (:func:`initial_sets`); the first (step, op) whose sets are wrong there, or None.
    ``reach`` (:func:`slice_reach`): make only the unions that reach slice ``i``."""
    if last is None:
        last = len(log.start) if first is None else first[0] + (first[1] >= 0)
    w = table.shape[1]
    # a set's words as one opaque row: numpy gathers and scatters whole rows of a 1-D array
    # several times faster than rows of a 2-D one
    rows = table.view(np.dtype((np.void, 8 * w))).reshape(-1)
    bit = np.uint64(1) << np.uint64(i % 64)
    for t in range(last):
        start, a, b, op, same = log.start[t], log.a[t], log.b[t], log.op[t], log.same[t]
        wrong = []
        if len(same):
            differ = (table[same[:, 0]] != table[same[:, 1]]).any(axis=1)
            if differ.any():
                wrong.append(int(same[differ, 2].min()))
        made = np.arange(start, start + len(a))
        if reach is not None:
            live = np.flatnonzero(reach[made, i // 64] & bit)
            a, b, op, made = a[live], b[live], op[live], made[live]
        for lo in range(0, len(a), _BLOCK):
            x = rows[a[lo:lo + _BLOCK]].view(np.uint64).reshape(-1, w)
            y = rows[b[lo:lo + _BLOCK]].view(np.uint64).reshape(-1, w)
            both = x & y
            if both.any():      # the unions are in no op order: the least op of them all
                wrong.append(int(op[lo:lo + _BLOCK][both.any(axis=1)].min()))
            x |= y
            rows[made[lo:lo + _BLOCK]] = x.view(rows.dtype).reshape(-1)
        if wrong:
            return t, min(wrong)
    return None


def gather_sets(log: SetLog, slices: list[range], steps: int, sets: np.ndarray) -> np.ndarray:
    """The whole bits of ``sets`` (made in the first ``steps`` steps or before), as words of
    64 ranks, gathered slice by slice."""
    whole = np.zeros((len(sets), 64 * ((log.n + 63) // 64)), dtype=np.uint8)
    for contrib in slices:
        table = initial_sets(log, contrib)
        make_unions(log, table, None, last=steps)
        flags = np.unpackbits(table[sets].astype("<u8").view(np.uint8), axis=1,
                              bitorder="little")
        whole[:, contrib.start:contrib.stop] = flags[:, :len(contrib)]
    return np.packbits(whole, axis=1, bitorder="little").view("<u8").astype(np.uint64)
