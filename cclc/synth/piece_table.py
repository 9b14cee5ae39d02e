"""Pieces, and pieces as columns: one row per hop of every piece, for the work done once per hop
at scale (the lockstep time of a packing, writing the ops).

At 512 ranks a packing has about a million pieces and six million hops: a Python loop per hop
takes minutes where numpy over columns takes seconds. Pieces of one path share its hops, so the
path's arrays are built once (one dictionary lookup per piece) and repeated per piece.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from cclc.topology import Topology

__all__ = ["HopTable", "Piece", "hop_table"]


@dataclass(frozen=True, slots=True)
class Piece:
    """One path's share of a pair: ``elems`` elements from group index ``src`` to ``dst``,
    ``slot`` its index among the pair's pieces, ``hops`` the carried link runs in order and
    ``via`` the group index of the rank each hop lands on."""

    src: int
    dst: int
    slot: int
    elems: int
    hops: tuple[tuple[int, ...], ...]
    via: tuple[int, ...]
    unit: int = 1


def _ranges(counts: np.ndarray) -> np.ndarray:
    """``0..c-1`` for every ``c`` of ``counts``, concatenated."""
    counts = np.asarray(counts, dtype=np.int64)
    ends = np.cumsum(counts)
    return np.arange(int(ends[-1]) if len(ends) else 0) - np.repeat(ends - counts, counts)


@dataclass(frozen=True, eq=False)
class HopTable:
    """Every hop of every piece, in piece order then hop order.

    Per hop: ``piece`` its piece, ``k`` its index on the piece's path, ``last`` whether it
    lands at the piece's destination, ``lands`` the group index of the rank it lands on,
    ``latency`` the sum of its links' latencies, ``route`` the index of its link run among the
    distinct runs ``runs`` (tuples of link ids). Per link entry of a hop: ``entry_hop`` its hop
    and ``entry_link`` its link. Per piece: ``src``, ``dst``, ``slot``, ``elems``.
    """

    piece: np.ndarray
    k: np.ndarray
    last: np.ndarray
    lands: np.ndarray
    latency: np.ndarray
    route: np.ndarray
    runs: list[tuple[int, ...]]
    entry_hop: np.ndarray
    entry_link: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    slot: np.ndarray
    elems: np.ndarray


def hop_table(topo: Topology, pieces: list[Piece]) -> HopTable:
    """The :class:`HopTable` of ``pieces``."""
    path_id: dict = {}
    pid = np.empty(len(pieces), dtype=np.int64)
    src = np.empty(len(pieces), dtype=np.int64)
    dst = np.empty(len(pieces), dtype=np.int64)
    slot = np.empty(len(pieces), dtype=np.int64)
    elems = np.empty(len(pieces), dtype=np.int64)
    paths: list[Piece] = []
    for i, p in enumerate(pieces):
        j = path_id.get(p.hops)
        if j is None:
            j = path_id[p.hops] = len(paths)
            paths.append(p)
        pid[i] = j
        src[i], dst[i], slot[i], elems[i] = p.src, p.dst, p.slot, p.elems
    # the distinct paths' hops (a few thousand to a million), then their link runs
    run_id: dict[tuple[int, ...], int] = {}
    runs: list[tuple[int, ...]] = []
    path_hops = np.array([len(p.hops) for p in paths], dtype=np.int64)
    hop_run = []
    hop_lands = []
    for p in paths:
        for hop, v in zip(p.hops, p.via, strict=True):
            r = run_id.get(hop)
            if r is None:
                r = run_id[hop] = len(runs)
                runs.append(hop)
            hop_run.append(r)
            hop_lands.append(v)
    hop_run_a = np.array(hop_run, dtype=np.int64)
    hop_lands_a = np.array(hop_lands, dtype=np.int64)
    run_len = np.array([len(r) for r in runs], dtype=np.int64)
    run_links = np.fromiter((e for r in runs for e in r), dtype=np.int64,
                            count=int(run_len.sum()))
    run_off = np.concatenate([[0], np.cumsum(run_len)])
    run_lat = np.add.reduceat(topo.link_latency[run_links], run_off[:-1]) if runs else \
        np.zeros(0)
    path_off = np.concatenate([[0], np.cumsum(path_hops)])
    # per piece hop
    nh = path_hops[pid]
    piece = np.repeat(np.arange(len(pieces)), nh)
    k = _ranges(nh)
    ph = path_off[pid][piece] + k                    # the hop among the distinct paths' hops
    route = hop_run_a[ph]
    # per link entry
    nl = run_len[route]
    entry_hop = np.repeat(np.arange(len(route)), nl)
    entry_link = run_links[run_off[route][entry_hop] + _ranges(nl)]
    return HopTable(piece=piece, k=k, last=k == nh[piece] - 1, lands=hop_lands_a[ph],
                    latency=run_lat[route], route=route, runs=runs, entry_hop=entry_hop,
                    entry_link=entry_link, src=src, dst=dst, slot=slot, elems=elems)
