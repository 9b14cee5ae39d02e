"""A GPU whose NIC failed, served by every live NIC of its server instead of one.

On a server of GPUs each with its own NIC (NCCL's PXN layout: the NIC hangs off its GPU's
PCIe switch, the other GPUs reach it over NVLink), a GPU whose NIC is gone can only leave the
server through another GPU's NIC. A fewest-hop route picks one such GPU for all of its
traffic, and that NIC then carries two GPUs' bytes: an algorithm whose every rank sends in
every step (recursive halving along rails) takes twice as long in every step, not 1/G longer
(46% of the bound where the healthy fabric gives 87%, a 1 GiB AllReduce on 16 HGX servers).

:class:`SpreadBuilder` cuts each cross-server op of such a GPU into one part per live NIC of
its server (``L`` of them), each part routed through its own NIC's GPU, so every live NIC
carries ``1 + 1/L`` of its share (8/7 of the healthy time on HGX servers, where no schedule
that has that server send as much as the others can do better). For the parts to be whole
chunks, the chunks those ops move (the algorithm says which) are each cut into
:attr:`NicSpread.factor` chunks and the algorithm's offsets and counts are mapped to match:
the builder does both, so an algorithm adds its ops as it would without the fault.

The parts' routes leave and enter servers only through the NIC of the GPU at either end or
of the relaying GPU (a search that passes no other GPU), and a part is cut only where every
part's route is a fewest-hop path (what ECMP carries, :mod:`cclc.routing`): both ends
without a NIC then use the same rail on both servers. Ops that cannot be cut keep their
route (the single relaying GPU). Nothing changes on a fabric where every GPU has its NIC.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from functools import reduce

import numpy as np

from cclc.collective import Collective
from cclc.ir import Schedule, ScheduleBuilder, even_split
from cclc.routing import hop_distance
from cclc.topology import Topology

__all__ = ["MAX_FACTOR", "NicSpread", "SpreadBuilder", "cut_unit", "refine", "spread_nics",
           "spread_note"]

#: the most chunks one chunk of the layout is cut into: the least common multiple of the live
#: NIC counts of the servers with a dead one (7 on HGX servers with one NIC gone; 7 and 6
#: together give 42); above it the largest count is used and the parts differ by a chunk
MAX_FACTOR = 64


def _nic_states(topo: Topology) -> tuple[np.ndarray, np.ndarray]:
    """Per rank: whether its GPU has a usable NIC of its own, and whether it had one and lost
    it (:meth:`~cclc.topology.Topology.gpu_nics`). A GPU of a server with fewer NICs than
    GPUs may have neither."""
    rank, _, usable = topo.gpu_nics()
    live = np.zeros(topo.n_ranks, dtype=bool)
    had = np.zeros(topo.n_ranks, dtype=bool)
    live[rank[usable]] = True
    had[rank] = True
    return live, had & ~live


def spread_nics(s: Schedule) -> dict[int, int]:
    """The ranks without a NIC of their own whose cross-server ops ``s`` routes through more
    than one NIC of their server, and how many NICs each (read from the routes, whatever
    built them)."""
    topo = s.topology
    if topo.kind != "fabric" or topo.node_of_rank is None:
        return {}
    group = np.asarray(s.collective.group, dtype=np.int64)
    lost = _nic_states(topo)[1][group]
    if not lost.any():
        return {}
    ops = s.ops
    node = topo.node_of_rank[group]
    nic_node = topo.nic_nodes()
    nics: dict[int, set[int]] = {}
    for end, mine in ((ops.src, topo.link_src), (ops.dst, topo.link_dst)):
        pick = np.flatnonzero(lost[end] & (node[ops.src] != node[ops.dst]) & (ops.route > 0))
        # each (member, route) once: at 4,096 ranks a member has thousands of ops
        for member, route in set(zip(end[pick].tolist(), ops.route[pick].tolist(),
                                     strict=True)):
            at = mine[list(s.routes.path(route))]
            own = at[nic_node[at] == node[member]]
            nics.setdefault(int(group[member]), set()).update(own.tolist())
    return {r: len(v) for r, v in sorted(nics.items()) if len(v) > 1}


def spread_note(s: Schedule) -> str | None:
    """What the report says of a schedule that spreads a member's traffic over its server's
    NICs (:func:`spread_nics`): the time counts each part on the NIC it was planned on, and
    no output pins a message's NIC."""
    spread = spread_nics(s)
    if not spread:
        return None
    ranks = ", ".join(str(r) for r in list(spread)[:4]) + (", ..." if len(spread) > 4 else "")
    return (f"rank{'s' if len(spread) > 1 else ''} {ranks} without a NIC of "
            f"{'their' if len(spread) > 1 else 'its'} own: cross-server traffic planned over "
            f"{max(spread.values())} NICs of the server; a plan, not what runs: NCCL and the "
            "runtimes on it pick a message's NIC themselves (PXN included), so the time above "
            "holds only where they spread it as planned")


class NicSpread:
    """Which group members lost their NIC (``dead``), the live-NIC members of each one's
    server it leaves through (``relays``), and the chunk ``factor`` that lets their ops be
    cut evenly. ``factor`` is 1 (nothing to do) where no member lost its NIC, its server has
    fewer than two live ones, or the collective's blocks (``block_elements``) are too small
    to cut."""

    def __init__(self, coll: Collective, block_elements: int):
        topo = coll.topology
        self.topology = topo
        self.group = np.asarray(coll.group, dtype=np.int64)
        self.relays: dict[int, np.ndarray] = {}
        self.factor = 1
        self._searches: dict[int, np.ndarray] = {}
        self._parts: dict[tuple[int, int], list[np.ndarray]] = {}
        node_of = topo.node_of_rank
        live = dead = np.zeros(coll.n, dtype=bool)
        if topo.kind == "fabric" and node_of is not None:
            live, dead = (a[self.group] for a in _nic_states(topo))
        self.node = (node_of[self.group].astype(np.int64) if dead.any() and node_of is not None
                     else np.zeros(coll.n, dtype=np.int64))
        for i in np.flatnonzero(dead).tolist():
            mates = np.flatnonzero((self.node == self.node[i]) & live)
            if len(mates) > 1:          # with one live NIC the fewest-hop route is the cut
                self.relays[i] = mates
        self.dead = np.zeros(coll.n, dtype=bool)
        self.dead[list(self.relays)] = True
        counts = sorted({len(r) for r in self.relays.values()})
        if counts:
            lcm = reduce(math.lcm, counts)
            factor = lcm if lcm <= MAX_FACTOR else counts[-1]
            self.factor = factor if block_elements >= factor else 1

    @property
    def active(self) -> bool:
        return self.factor > 1

    def kept_whole(self) -> NicSpread:
        """The same members and relays with nothing cut (``factor`` 1): every op keeps its
        fewest-hop route, through one relaying GPU."""
        whole = copy.copy(self)
        whole.factor = 1
        return whole

    def candidates(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """Per op ``src -> dst`` (group indices): whether it crosses servers with an end
        that lost its NIC (whether :meth:`parts` may cut it)."""
        if not self.active:
            return np.zeros(len(src), dtype=bool)
        return (self.node[src] != self.node[dst]) & (self.dead[src] | self.dead[dst])

    def parts(self, s: int, d: int) -> list[np.ndarray]:
        """The link ids of each part of ``s -> d`` (group indices), each through its own
        relays; empty where the op is kept whole (one relay, or a part's route would not be a
        fewest-hop path, which ECMP would not carry)."""
        key = (s, d)
        if key not in self._parts:
            paths = []
            for rs, rd in self._relay_pairs(s, d):
                stops = [s] + [r for r in (rs, rd) if r is not None] + [d]
                paths.append(np.concatenate([self._path(a, c)
                                             for a, c in zip(stops, stops[1:], strict=False)]))
            fewest = hop_distance(self.topology, self.group[[s]], self.group[[d]])[0]
            if len(paths) < 2 or any(len(p) != fewest for p in paths):
                paths = []
            self._parts[key] = paths
        return self._parts[key]

    def extra_ops(self, src: np.ndarray, dst: np.ndarray, times: np.ndarray) -> int:
        """How many ops cutting adds to ops ``src -> dst`` (group indices) that an algorithm
        issues ``times`` times each (for its op count)."""
        pick = np.flatnonzero(self.candidates(src, dst))
        return sum(int(times[k]) * max(len(self.parts(int(src[k]), int(dst[k]))) - 1, 0)
                   for k in pick.tolist())

    def _relay_pairs(self, s: int, d: int) -> list[tuple[int | None, int | None]]:
        """The relays of each part of ``s -> d``: (the source's, the destination's), ``None``
        where that end has its NIC."""
        rs, rd = self.relays.get(s), self.relays.get(d)
        if rs is not None and rd is not None:
            # both ends without a NIC: only the same rail on both servers is a fewest-hop path
            gpu = self.topology.gpu_of_rank
            assert gpu is not None
            on_d = {int(gpu[self.group[r]]): int(r) for r in rd.tolist()}
            return [(int(r), on_d[g]) for r in rs.tolist()
                    if (g := int(gpu[self.group[r]])) in on_d]
        if rs is not None:
            return [(int(r), None) for r in rs.tolist()]
        assert rd is not None
        return [(None, int(r)) for r in rd.tolist()]

    def _path(self, a: int, c: int) -> np.ndarray:
        """Link ids of a fewest-hop healthy path between group members ``a -> c`` that passes
        no other GPU (so it leaves and enters servers through the NICs of ``a`` and ``c``)."""
        topo = self.topology
        keys, links = topo.hop_links()
        v = topo.n_vertices
        start = int(self.group[a])
        if a not in self._searches:
            # scipy.sparse only when a NIC failed (importing this module needs no scipy)
            from scipy.sparse import csr_matrix
            from scipy.sparse.csgraph import dijkstra

            tail, head = keys // v, keys % v
            keep = (tail >= topo.n_ranks) | (tail == start)
            graph = csr_matrix((np.ones(int(keep.sum())), (tail[keep], head[keep])),
                               shape=(v, v))
            self._searches[a] = dijkstra(graph, indices=start, unweighted=True,
                                         return_predecessors=True)[1]
        pred = self._searches[a]
        hops = []
        at = int(self.group[c])
        while at != start:
            prev = int(pred[at])
            if prev < 0:
                raise AssertionError(f"no path from {topo.vertex_names[start]} to "
                                     f"{topo.vertex_names[at]} through NICs alone")
            hops.append(int(links[np.searchsorted(keys, prev * v + at)]))
            at = prev
        return np.array(hops[::-1], dtype=np.int64)


#: a cut chunk's parts differ by at most one unit in this many (a coarser unit would leave one
#: NIC more than 1/8 above its share of the dead NIC's bytes)
_UNITS_PER_PART = 8


def cut_unit(layouts: Sequence[np.ndarray], factor: int) -> int:
    """The element count that cut parts are made of: the largest divisor of every chunk's size
    that still gives each part :data:`_UNITS_PER_PART` of them. Runtimes that need equal
    chunks count a buffer in the gcd of all chunk sizes, so cutting a 4 MiB chunk of bf16
    into sevenths element by element would make them count it in single elements (two
    million units instead of 64)."""
    sizes = [int(x) for lay in layouts for x in np.unique(lay) if x > 0]
    common = math.gcd(*sizes) if sizes else 1
    smallest = min(sizes, default=1)
    need = _UNITS_PER_PART * factor
    for d in _divisors(common):
        if smallest * d // common >= need:
            return common // d
    return 1


def _divisors(n: int) -> list[int]:
    """The divisors of ``n``, ascending."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def refine(chunks: Sequence[int] | np.ndarray, factor: int, cut: np.ndarray | None = None,
           unit: int = 1) -> np.ndarray:
    """The chunks of a layout with those in ``cut`` (all by default) each cut into ``factor``
    near-equal chunks of whole ``unit`` elements (the last takes any remainder), in order."""
    chunks = np.asarray(chunks, dtype=np.int64)
    if factor == 1 or not len(chunks):
        return chunks
    cut = np.ones(len(chunks), dtype=bool) if cut is None else cut
    out: list[int] = []
    for c, k in zip(chunks.tolist(), cut.tolist(), strict=True):
        if not k:
            out.append(c)
            continue
        parts = even_split(c // unit, factor) * unit
        parts[-1] += c - int(parts.sum())
        out.extend(parts.tolist())
    return np.array(out, dtype=np.int64)


class SpreadBuilder(ScheduleBuilder):
    """A :class:`~cclc.ir.ScheduleBuilder` that takes layouts, offsets and counts in the
    algorithm's chunks and cuts each chunk of ``cut`` into ``spread.factor`` chunks of the
    real layout, then cuts each cross-server op of a member without a NIC into one op per
    relay (:class:`NicSpread`). ``cut`` has a mask per buffer (input, output, scratch):
    ``None`` for every chunk, a mask of the layout's chunks, or for a one-chunk buffer a mask
    of the ranks (``(n, 1)``), whose uncut ranks keep the chunk whole and pad it with empty
    ones (every rank of a layout has as many chunks). The chunks an op moves must be cut
    alike on both sides (the algorithm cuts the chunks its NIC-less members move, in every
    buffer they pass through). Without a dead NIC it is a plain builder."""

    def __init__(self, coll: Collective, spread: NicSpread, input: Sequence[int] | np.ndarray,
                 output: Sequence[int] | np.ndarray, scratch: Sequence[int] | np.ndarray = (),
                 cut: tuple[np.ndarray | None, ...] = (None, None, None)):
        f = spread.factor
        layouts = [np.asarray(lay, dtype=np.int64) for lay in (input, output, scratch)]
        masks = [np.ones(len(lay), dtype=bool) if m is None else np.asarray(m, dtype=bool)
                 for lay, m in zip(layouts, cut, strict=True)]
        unit = cut_unit(layouts, f) if f > 1 else 1
        refined = []
        #: per buffer: the refined index of every chunk boundary of the algorithm's layout,
        #: ``(chunks + 1,)``, or per rank ``(n, 2)`` for a buffer cut by rank
        self._starts: list[np.ndarray] = []
        for lay, m in zip(layouts, masks, strict=True):
            if m.ndim == 2 and f > 1:
                whole = np.zeros(f, dtype=np.int64)
                whole[0] = lay[0]
                refined.append(np.where(m, refine(lay, f, None, unit)[None, :], whole[None, :]))
                self._starts.append(np.stack([np.zeros(len(m), dtype=np.int64),
                                              np.where(m[:, 0], f, 1)], axis=1))
            else:
                refined.append(refine(lay, f, m.reshape(-1) if m.ndim == 2 else m, unit))
                self._starts.append(np.concatenate([[0], np.cumsum(np.where(m, f, 1))]))
        super().__init__(coll, *refined)
        self.spread = spread

    def add(self, *, step, src, dst, route=0, count=1, src_buf, src_off, dst_buf, dst_off,
            **cols) -> None:
        if self.spread.factor == 1:
            super().add(step=step, src=src, dst=dst, route=route, count=count, src_buf=src_buf,
                        src_off=src_off, dst_buf=dst_buf, dst_off=dst_off, **cols)
            return
        names = ("step", "src", "dst", "route", "count", "src_buf", "src_off", "dst_buf",
                 "dst_off", *cols)
        values = (step, src, dst, route, count, src_buf, src_off, dst_buf, dst_off,
                  *cols.values())
        arrays = np.broadcast_arrays(*(np.asarray(x) for x in values))
        op = {k: a.reshape(-1).astype(np.int64) for k, a in zip(names, arrays, strict=True)}
        counts = []
        for side in ("src", "dst"):
            buf, off = op[f"{side}_buf"], op[f"{side}_off"]
            first, end = np.empty_like(off), np.empty_like(off)
            for b, starts in enumerate(self._starts):
                m = buf == b
                if starts.ndim == 2:
                    rank = op[side][m]
                    first[m] = starts[rank, off[m]]
                    end[m] = starts[rank, off[m] + op["count"][m]]
                else:
                    first[m], end[m] = starts[off[m]], starts[off[m] + op["count"][m]]
            op[f"{side}_off"] = first
            counts.append(end - first)
        if not np.array_equal(counts[0], counts[1]):
            raise AssertionError("an op moves chunks cut differently on its two sides")
        op["count"] = counts[0]
        # only the ops of members without a NIC are looked at (a handful of the n per call)
        parts: dict[int, list[np.ndarray]] = {}
        for k in np.flatnonzero(self.spread.candidates(op["src"], op["dst"])).tolist():
            p = self.spread.parts(int(op["src"][k]), int(op["dst"][k]))
            # an op over uncut chunks has too few to share out: it keeps its route
            if len(p) >= 2 and len(p) <= op["count"][k]:
                parts[k] = p
        whole = np.ones(len(op["src"]), dtype=bool)
        whole[list(parts)] = False
        super().add(**{k: a[whole] for k, a in op.items()})
        for k in parts:
            sizes = even_split(int(op["count"][k]), len(parts[k]))
            first = np.concatenate([[0], np.cumsum(sizes)[:-1]])
            row = {name: a[k] for name, a in op.items()}
            row.update(route=np.array([self.route(p.tolist()) for p in parts[k]]), count=sizes,
                       src_off=row["src_off"] + first, dst_off=row["dst_off"] + first)
            super().add(**row)
