"""Orders of large integer arrays by ``np.sort`` instead of ``np.argsort``.

Without AVX-512, numpy's ``argsort`` of 33M 64-bit keys takes 17 s on the two-core machine
where ``sort`` of the same keys takes 2.5 s (numpy 2.4): ``argsort`` moves an index beside
every compared key. A key that leaves room for the index in its low bits can carry it through
a plain sort instead, and the order is read back from the sorted words. The route tables of a
4,096-rank alltoall (16.7M paths, deduplicated by hash at every pass that rewrites them) are
what this serves.
"""

from __future__ import annotations

import numpy as np

__all__ = ["equal_runs_order", "first_occurrence_ids", "lexsort_ints", "numbered_by_first",
           "stable_argsort"]


def _index_bits(n: int) -> int:
    """Bits that hold every index ``0 .. n - 1``."""
    return max(1, (n - 1).bit_length())


def stable_argsort(keys: np.ndarray) -> np.ndarray:
    """``np.argsort(keys, kind="stable")`` of a 1-D integer array, as int64.

    Where every key is non-negative and fits beside its index in 64 bits, each key is shifted
    up and its index put in the freed low bits: those words are distinct, so a plain sort of
    them is the stable order, and their low bits are the indices. Keys of a range under
    ``2**16`` are sorted as 16-bit offsets (numpy's radix sort); elsewhere numpy's own."""
    keys = np.asarray(keys)
    n = len(keys)
    if keys.ndim != 1 or keys.dtype.kind not in "iu":
        raise ValueError(f"stable_argsort takes a 1-D integer array, not {keys.dtype} with "
                         f"{keys.ndim} dimensions")
    if n < 2:
        return np.arange(n, dtype=np.int64)
    bits = _index_bits(n)
    low, top = int(keys.min()), int(keys.max())
    if top - low < 1 << 16:
        # keys of a small range (leaf pairs: 33K at 4,096 GPUs) as 16-bit offsets: numpy's
        # stable sort of 16-bit keys is a radix sort, 2.4x faster than the plain sort below
        # (signed keys widened first: int8 -128 .. 127 spans a range int8 cannot hold)
        wide = (keys - keys.dtype.type(low) if keys.dtype.kind == "u"
                else keys.astype(np.int64) - low)
        offsets = wide.astype(np.uint16)
        return np.argsort(offsets, kind="stable").astype(np.int64, copy=False)
    if low < 0 or top >= 1 << (64 - bits):
        return np.argsort(keys, kind="stable").astype(np.int64, copy=False)
    words = keys.astype(np.uint64) << np.uint64(bits)
    words |= np.arange(n, dtype=np.uint64)
    words.sort()
    words &= np.uint64((1 << bits) - 1)
    return words.view(np.int64)


def lexsort_ints(keys: tuple[np.ndarray, ...]) -> np.ndarray:
    """``np.lexsort(keys)`` (the last key first) of integer keys, as one stable sort of a
    combined key where the keys' ranges multiply below 2**62 (each key's values, or their
    ranks where wide; a constant key dropped): lexsort sorts once per key, 1.35 s for the
    16.7M flows of a 4,096-GPU alltoall step, the combined key 0.3 s."""
    combined = np.zeros(len(keys[0]), dtype=np.int64)
    span = 1
    for key in reversed(keys):
        low, top = (int(key.min()), int(key.max())) if len(key) else (0, 0)
        if low == top:
            continue
        if 0 <= low and top < 1 << 20:
            values, width = key.astype(np.int64), top + 1
        else:
            distinct, rank = np.unique(key, return_inverse=True)
            values, width = rank.reshape(-1).astype(np.int64), len(distinct)
        span *= width
        if span >= 1 << 62:
            return np.lexsort(keys)
        combined *= width
        combined += values
    return stable_argsort(combined)


def equal_runs_order(keys: np.ndarray) -> np.ndarray:
    """An order of the 1-D ``uint64`` array ``keys`` (hashes: any 64 bits) in which equal
    keys stand next to each other, each run in increasing index; runs in no promised order.

    The high ``64 - b`` bits of every key carry its index (``b`` bits) through a plain sort;
    keys that share those bits but differ below them (rare: a few thousand of 33M random
    keys) are put in order by the whole key within their run."""
    keys = np.asarray(keys, dtype=np.uint64)
    n = len(keys)
    if n < 2:
        return np.arange(n, dtype=np.int64)
    bits = np.uint64(_index_bits(n))
    mask = np.uint64((1 << int(bits)) - 1)
    words = (keys >> bits) << bits
    words |= np.arange(n, dtype=np.uint64)
    words.sort()
    # (the temporaries dropped as soon as they are read: at 33M keys each is 264 MB)
    prefix = words >> bits
    same_prefix = prefix[1:] == prefix[:-1]
    del prefix
    words &= mask
    order = words.view(np.int64)
    full = keys[order]
    mixed = same_prefix & (full[1:] != full[:-1])
    if mixed.any():
        # the runs of one prefix holding more than one key, sorted by (prefix run, key),
        # stably: each run stays where it is and its equal keys come together in index order
        run = np.cumsum(np.concatenate([[True], ~same_prefix]))
        bad_run = np.zeros(int(run[-1]) + 1, dtype=bool)
        bad_run[run[1:][mixed]] = True
        sel = np.flatnonzero(bad_run[run])
        order[sel] = order[sel[np.lexsort((full[sel], run[sel]))]]
    return order


def numbered_by_first(order: np.ndarray, new: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(id of every row, first row of every id)``: rows ``order`` (a permutation) come in
    runs of one key each, every run in increasing row, ``new[i]`` where a run starts; the runs
    are numbered in the order of their first rows. A first row's number is the count of first
    rows before it, so no sort is needed (the first rows are distinct)."""
    group = np.cumsum(new) - 1
    firsts = order[new]
    is_first = np.zeros(len(order), dtype=bool)
    is_first[firsts] = True
    rank = (np.cumsum(is_first) - 1)[firsts]
    ids = np.empty(len(order), dtype=np.int64)
    ids[order] = rank[group]
    return ids, np.flatnonzero(is_first)


def first_occurrence_ids(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct values of the 1-D integer array ``keys`` numbered in the order they first
    occur: ``(number of every entry, index of every number's first entry)``, what
    ``np.unique(keys, return_index=True, return_inverse=True)`` gives renumbered by first
    index. Strictly increasing keys (the routes of a table's ops, each its own) are their own
    numbering: no sort."""
    keys = np.asarray(keys)
    if len(keys) > 1 and bool((keys[1:] > keys[:-1]).all()):
        every = np.arange(len(keys), dtype=np.int64)
        return every, every
    order = stable_argsort(keys)
    k = keys[order]
    new = np.ones(len(k), dtype=bool)
    new[1:] = k[1:] != k[:-1]
    return numbered_by_first(order, new)
