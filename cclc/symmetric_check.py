"""The verifier and the lockstep simulator of a :class:`~cclc.symmetric.SymmetricSchedule`,
without expanding it.

A symmetric schedule's state is symmetric too: what rank ``t`` holds is what rank 0 holds,
moved by ``t`` (:mod:`cclc.symmetric`). So the verifier interprets rank 0 alone. Every orbit
of ops has exactly one member that writes to rank 0 (translations act freely): representative
``i`` from ``s`` to ``d``, moved by ``-d``. That member reads rank ``s - d``, whose chunk ``x``
is rank 0's chunk ``x - (s - d)`` moved by ``s - d``; so in rank 0's frame op ``i`` reads rank
0's source chunk moved by ``-s``, moves the value it finds by ``s - d`` and writes it into rank
0's destination chunk moved by ``-d``. Two writes to one of rank 0's chunks in a step, a read
of an empty chunk, a wrong reduction and a wrong output are then exactly those of the expanded
schedule, at rank 0 and, moved, at every rank. Routes are checked on the representatives (a
path of usable links from the source to the destination that the topology's routing carries),
and
:meth:`~cclc.symmetric.TranslationGroup.of` checks that every translation maps usable links onto
usable links alike, so every image route is one too.

Values are data coordinates as in :mod:`cclc.semantics`. Copy collectives: element ``e`` of
rank ``r``'s input is ``r E + e`` (``E`` elements per input); a translation by ``t`` moves
``r`` to ``r + t`` and, where the input's blocks belong to ranks (AllToAll), block ``b`` to
``b + t``. AllReduce and ReduceScatter: a coordinate is a position in the result, whose block
moves to ``b + t``,
and a chunk also holds the set of ranks whose contributions it sums (one boolean per rank, for
rank 0's chunks only), moved to ``{r + t}``; a reduction must add the same data and no rank
twice. An op copies or reduces its source chunks one to one onto its destination chunks, which
must have the same sizes (the expanded verifier also accepts a chunk gathered from two adjacent
ones; the symmetric one refuses such a schedule, never accepts a wrong one).

The lockstep time is the one :func:`cclc.sim.simulate` gives the expanded schedule: a link's
bytes in a step are the sum over its orbit (every link of an orbit carries the same), so the
busiest link and the slowest op of a step are found among the representatives.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from cclc.collective import REDUCING_KINDS
from cclc.errors import ScheduleError
from cclc.ir import Buf, OpKind
from cclc.routing import carried_routes
from cclc.semantics import EMPTY
from cclc.sim import OverheadSteps, step_charges
from cclc.symmetric import RANK_INDEXED, SymmetricSchedule, TranslationGroup

__all__ = ["Journeys", "SymmetricLockstep", "busiest_per_step", "journeys", "link_loads",
           "link_orbits", "orbit_links", "simulate_lockstep", "step_bytes", "verify_symmetric"]

_BUF_WORD = {Buf.INPUT: "input", Buf.OUTPUT: "output", Buf.SCRATCH: "scratch"}


def _op_text(s: SymmetricSchedule, i: int) -> str:
    o = s.ops
    path = ",".join(map(str, s.routes.path(int(o.route[i])))) or "-"
    return (f"representative op #{i} (step {int(o.step[i])}: {int(o.src[i])}."
            f"{_BUF_WORD[Buf(int(o.src_buf[i]))]}[{int(o.src_off[i])}+{int(o.count[i])}] -> "
            f"{int(o.dst[i])}.{_BUF_WORD[Buf(int(o.dst_buf[i]))]}[{int(o.dst_off[i])}] via "
            f"{path})")


def _fail(s: SymmetricSchedule, i: int, what: str) -> None:
    raise ScheduleError(f"{_op_text(s, i)}: {what} (and so does every translate of it)")


def _static_bad(s: SymmetricSchedule) -> tuple[np.ndarray, str]:
    """Mask of representatives wrong on their own (ranges, sizes, routes) and a word why
    (of the first)."""
    o, n, topo = s.ops, s.n, s.topology
    nc = np.array([len(lay) for lay in s.layouts], dtype=np.int64)
    checks: list[tuple[np.ndarray, str]] = []
    bad = (o.step < 0) | (o.src < 0) | (o.src >= n) | (o.dst < 0) | (o.dst >= n) | (o.count < 1)
    bad |= (o.src_buf < 0) | (o.src_buf > 2) | (o.dst_buf < 0) | (o.dst_buf > 2)
    bad |= (o.src_off < 0) | (o.dst_off < 0) | (o.route < 0) | (o.route >= len(s.routes))
    checks.append((bad.copy(), "names a rank, buffer, step, count or route out of range"))
    sb, db = np.where(bad, 0, o.src_buf), np.where(bad, 0, o.dst_buf)
    bad |= (o.src_off.astype(np.int64) + o.count > nc[sb])
    bad |= (o.dst_off.astype(np.int64) + o.count > nc[db])
    checks.append((bad.copy(), "reads or writes past the end of a buffer"))
    for side, buf in (("src", sb), ("dst", db)):
        off = getattr(o, f"{side}_off").astype(np.int64)
        for b in RANK_INDEXED[s.collective.kind]:
            k = s.per_block(b) or 1
            bad |= ~bad & (buf == b) & ((off % k) + o.count > k)
    checks.append((bad.copy(), "crosses a block of a buffer whose blocks the group moves apart"))
    if s.collective.kind not in REDUCING_KINDS:
        bad |= ~bad & (o.kind != OpKind.COPY)
    checks.append((bad.copy(), "reduces in a copy collective"))
    # chunk by chunk: a source chunk and its destination chunk hold as many elements (ops
    # already wrong read as chunk 0 of the input, which every rank-indexed layout has)
    sb, db = np.where(bad, 0, o.src_buf), np.where(bad, 0, o.dst_buf)
    rows, j = _chunk_rows(np.where(bad, 1, o.count))
    src_el = _elems(s, sb[rows], np.where(bad, 0, o.src_off)[rows] + j)
    dst_el = _elems(s, db[rows], np.where(bad, 0, o.dst_off)[rows] + j)
    bad[rows[src_el != dst_el]] = True
    checks.append((bad.copy(), "copies a chunk onto a chunk of another size"))
    local = o.src == o.dst
    bad |= ~bad & (local != (o.route == 0))
    checks.append((bad.copy(), "is local with a route, or remote without one"))
    ok_route, first, last = _route_table(s)
    rt = np.where(bad, 0, o.route)
    bad |= ~bad & ~local & (~ok_route[rt] | (first[rt] != o.src) | (last[rt] != o.dst))
    checks.append((bad.copy(), "has a route that is not a path of usable links from its "
                               "source to its destination"))
    carried = carried_routes(topo, s.routes) if (~bad).any() else None
    if carried is not None:
        bad |= ~bad & ~local & ~carried[rt]
    checks.append((bad.copy(), "has a route the topology's routing does not carry"))
    if not bad.any():
        return bad, ""
    first_bad = int(np.flatnonzero(bad)[0])
    why = next(w for m, w in checks if m[first_bad])
    return bad, why


def _chunk_rows(count: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per chunk an op moves: the op's row and the chunk's place in the op's range."""
    count = np.asarray(count, dtype=np.int64)
    rows = np.repeat(np.arange(len(count)), count)
    first = np.cumsum(count) - count
    return rows, np.arange(len(rows)) - first[rows]


def _elems(s: SymmetricSchedule, buf: np.ndarray, chunk: np.ndarray) -> np.ndarray:
    out = np.zeros(len(buf), dtype=np.int64)
    for b in Buf:
        m = buf == b
        if m.any():
            out[m] = s.layouts[b][chunk[m]]
    return out


def _route_table(s: SymmetricSchedule) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per representative route: whether its links exist, are usable and chain; its first and
    last rank (-1 for the empty route)."""
    topo, routes = s.topology, s.routes
    links = routes.links.astype(np.int64)
    lengths = routes.lengths()
    exists = (links >= 0) & (links < topo.n_links)
    safe = np.where(exists, links, 0)
    good = exists & ~topo.link_failed[safe] if topo.n_links else exists
    starts = routes.offsets[:-1]
    follows = np.ones(len(links), dtype=bool)
    if len(links) > 1:
        follows[1:] = topo.link_src[safe[1:]] == topo.link_dst[safe[:-1]]
    follows[starts[lengths > 0]] = True
    route_of = np.repeat(np.arange(len(routes)), lengths)
    ok = lengths > 0
    ok[route_of[~(good & follows)]] = False
    first = np.full(len(routes), -1, dtype=np.int64)
    last = np.full(len(routes), -1, dtype=np.int64)
    nz = lengths > 0
    first[nz] = topo.link_src[safe[starts[nz]]]
    last[nz] = topo.link_dst[safe[routes.offsets[1:][nz] - 1]]
    return ok, first, last


def _move_values(s: SymmetricSchedule, g: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Data coordinates ``g`` (none empty) moved by elements ``t``."""
    group = s.group
    if s.collective.kind in REDUCING_KINDS:
        # a position in the result, in the block of the rank that block belongs to (the
        # input holds every block)
        B = int(s.layouts[Buf.INPUT].sum()) // s.n
        block, within = np.divmod(g, B)
        return group.act(block, t) * B + within
    E = int(s.layouts[Buf.INPUT].sum())
    rank, pos = np.divmod(g, E)
    if Buf.INPUT in RANK_INDEXED[s.collective.kind]:
        B = E // s.n
        block, within = np.divmod(pos, B)
        pos = group.act(block, t) * B + within
    return group.act(rank, t) * E + pos


def _move_sets(s: SymmetricSchedule, sets: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Contributor sets (one row of ``n`` booleans each) moved by ``t`` (one per row): rank
    ``r`` becomes ``r + t``. The rows are grouped by element (a step's ops move by a few)."""
    shape = s.group.shape
    out = np.empty_like(sets)
    for e in np.unique(t).tolist():
        m = t == e
        shift = tuple(int(x) for x in s.group.coords(np.array([e]))[:, 0])
        cube = sets[m].reshape(-1, *shape)
        out[m] = np.roll(cube, shift, axis=tuple(range(1, len(shape) + 1))).reshape(
            int(m.sum()), -1)
    return out


def _frame(s: SymmetricSchedule, buf: np.ndarray, chunk: np.ndarray, t: np.ndarray
           ) -> np.ndarray:
    """Chunks ``chunk`` of buffers ``buf`` moved by ``t`` (rank-indexed buffers only)."""
    out = chunk.astype(np.int64).copy()
    for b in RANK_INDEXED[s.collective.kind]:
        m = buf == b
        if m.any():
            out[m] = s.group.chunk_image(chunk[m], s.per_block(b) or 1, t[m])
    return out


def verify_symmetric(s: SymmetricSchedule) -> None:
    """Raise :class:`ScheduleError` unless the expanded schedule of ``s`` computes its
    collective (see the module docstring for how, and for the one-to-one chunk copies it
    asks for); checks that the group is a symmetry of the collective's machine first."""
    _interpret(s, None)


@dataclass(frozen=True, eq=False)
class Journeys:
    """The journeys of a verified symmetric copy schedule (:func:`journeys`).

    ``root`` gives every representative op its journey: the smallest representative of the
    set of ops linked by "reads what the other last wrote" (in the expanded schedule, the op
    moved by ``t`` is linked only to ops moved by the same ``t``). ``output_writer`` gives
    every chunk of rank 0's output the representative ``j`` whose translate by ``-dst[j]``
    writes it last (-1: never written); chunk ``x`` moved by ``t`` is then last written by
    ``j`` moved by ``t - dst[j]``.
    """

    root: np.ndarray
    output_writer: np.ndarray


def journeys(s: SymmetricSchedule) -> Journeys:
    """Verify ``s`` (as :func:`verify_symmetric`) and find its journeys, checking that every
    op of the expanded schedule reads only what ops of its own element wrote, or an input no
    op wrote: then removing every op of some journeys (translated) changes no value the
    others read, which is what masking journeys (:mod:`cclc.symmetric_faults`) relies on.
    :class:`ScheduleError` when an op reads what a translate of another element wrote."""
    edges: list[tuple[np.ndarray, np.ndarray]] = []
    writer = _interpret(s, edges)
    n_rep = len(s.ops)
    a = np.concatenate([e[0] for e in edges]) if edges else np.zeros(0, dtype=np.int64)
    b = np.concatenate([e[1] for e in edges]) if edges else np.zeros(0, dtype=np.int64)
    graph = coo_matrix((np.ones(len(a)), (a, b)), shape=(n_rep, n_rep))
    _, label = connected_components(graph, directed=False)
    first = np.full(int(label.max(initial=-1)) + 1, n_rep, dtype=np.int64)
    np.minimum.at(first, label, np.arange(n_rep))
    return Journeys(root=first[label], output_writer=writer)


def _interpret(s: SymmetricSchedule, edges: list | None) -> np.ndarray:
    """Run rank 0's frame (see the module docstring); with ``edges``, also record for every
    chunk read its last writer (appended as (reader, writer) representatives) and return the
    last writer of every chunk of rank 0's output."""
    if TranslationGroup.of(s.collective) != s.group:
        raise ScheduleError(f"the schedule's group of sides {s.group.shape} is not the "
                            f"translation group of '{s.topology.name}'")
    o = s.ops
    static_bad, why = _static_bad(s)
    first_static = None
    if static_bad.any():
        # the first in step order (then op order), as the expanded verifier reports it
        bad = np.flatnonzero(static_bad)
        first_static = int(bad[np.lexsort((bad, o.step[bad]))[0]])
    base = np.concatenate([[0], np.cumsum([len(lay) for lay in s.layouts])]).astype(np.int64)
    val = np.full(int(base[-1]), EMPTY, dtype=np.int64)
    in_lay = s.layouts[Buf.INPUT]
    val[:len(in_lay)] = np.concatenate([[0], np.cumsum(in_lay)[:-1]])    # rank 0's input
    # reducing: the ranks whose contributions each of rank 0's chunks sums (its input: its own)
    sets = None
    if s.collective.kind in REDUCING_KINDS:
        sets = np.zeros((len(val), s.n), dtype=bool)
        sets[:len(in_lay), 0] = True
    stamp = np.full(len(val), -1, dtype=np.int64)
    # with edges: per chunk of rank 0, the representative whose translate wrote it last
    writer = np.full(len(val), -1, dtype=np.int64) if edges is not None else None
    order = np.argsort(o.step, kind="stable")
    cuts = np.flatnonzero(np.diff(o.step[order])) + 1
    for idx in np.split(order, cuts) if len(order) else ():
        step = int(o.step[idx[0]])
        if first_static is not None and step >= int(o.step[first_static]):
            _fail(s, first_static, why)
        _run_step(s, idx, base, val, sets, stamp)
        if writer is not None and edges is not None:
            _link_writers(s, idx, base, writer, edges)
    if first_static is not None:
        _fail(s, first_static, why)
    _check_output(s, val[base[Buf.OUTPUT]:base[Buf.OUTPUT + 1]],
                  None if sets is None else sets[base[Buf.OUTPUT]:base[Buf.OUTPUT + 1]])
    if writer is None:
        return np.zeros(0, dtype=np.int64)
    return writer[base[Buf.OUTPUT]:base[Buf.OUTPUT + 1]].copy()


def _step_chunks(s: SymmetricSchedule, idx: np.ndarray, base: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per chunk the ops ``idx`` move, in rank 0's frame: the op, its source and destination
    rank, and the slots of rank 0 it reads (the member of its orbit that sends from rank 0)
    and writes (the member that sends to rank 0)."""
    o, g = s.ops, s.group
    rows, j = _chunk_rows(o.count[idx])
    op = idx[rows]
    src, dst = o.src[op].astype(np.int64), o.dst[op].astype(np.int64)
    read = base[o.src_buf[op]] + _frame(s, o.src_buf[op], o.src_off[op] + j, g.inverse(src))
    write = base[o.dst_buf[op]] + _frame(s, o.dst_buf[op], o.dst_off[op] + j, g.inverse(dst))
    return op, src, dst, read, write


def _link_writers(s: SymmetricSchedule, idx: np.ndarray, base: np.ndarray, writer: np.ndarray,
                  edges: list) -> None:
    """After a verified step ``idx``: record each op's readers' last writers (which must be
    translates by the same element) and make the step's ops the writers of what they wrote."""
    o = s.ops
    op, src, dst, read, write = _step_chunks(s, idx, base)
    w = writer[read]
    had = w >= 0
    # rank 0's chunk was written by rep w moved by -dst[w]; op moved by -src reads it: the
    # same element exactly when dst[w] == src
    other = had & (o.dst[np.maximum(w, 0)] != src)
    if other.any():
        k = int(np.flatnonzero(other)[0])
        _fail(s, int(op[k]), f"reads what a translate of {_op_text(s, int(w[k]))} by another "
                             "element wrote: its journey is not one element's")
    edges.append((op[had].astype(np.int64), w[had].astype(np.int64)))
    writer[write] = op


def _run_step(s: SymmetricSchedule, idx: np.ndarray, base: np.ndarray, val: np.ndarray,
              sets: np.ndarray | None, stamp: np.ndarray) -> None:
    """The ops ``idx`` of one step in rank 0's frame: all read, then all write."""
    o, g = s.ops, s.group
    op, src, dst, read, write = _step_chunks(s, idx, base)
    got = val[read]
    empty = got == EMPTY
    if empty.any():
        _fail(s, int(op[np.flatnonzero(empty)[0]]), "reads a chunk that is empty then")
    # two writes to one chunk of rank 0 in one step: the last stamp wins, the others see it
    stamp[write] = np.arange(len(write))
    clash = stamp[write] != np.arange(len(write))
    if clash.any():
        k = int(np.flatnonzero(clash)[0])
        _fail(s, int(op[k]), f"writes a chunk that {_op_text(s, int(op[stamp[write[k]]]))}"
                             " (or a translate of it) also writes in the same step")
    moved = g.act(src, g.inverse(dst))
    value = _move_values(s, got, moved)
    brought = None if sets is None else _move_sets(s, sets[read], moved)
    reduce = o.kind[op] == OpKind.REDUCE
    if reduce.any():
        assert sets is not None and brought is not None      # reductions: _static_bad
        old = val[write[reduce]]
        at = np.flatnonzero(reduce)
        bad = (old == EMPTY) | (old != value[reduce])
        if bad.any():
            _fail(s, int(op[at[np.flatnonzero(bad)[0]]]),
                  "reduces into a chunk that is empty or holds other data")
        twice = (sets[write[reduce]] & brought[reduce]).any(axis=1)
        if twice.any():
            _fail(s, int(op[at[np.flatnonzero(twice)[0]]]),
                  "adds a rank's contribution that the chunk already holds")
        brought[reduce] |= sets[write[reduce]]
    val[write] = value
    if sets is not None and brought is not None:
        sets[write] = brought


def _check_output(s: SymmetricSchedule, got: np.ndarray, sets: np.ndarray | None) -> None:
    """Rank 0's output chunk ``j`` of block ``b`` must start with rank ``b``'s data at the same
    place of its block for rank 0 (AllToAll) or of its input (AllGather), or with result
    element ``b B + j``'s place summed over every rank (AllReduce; a ReduceScatter's output
    is block 0 alone)."""
    lay = s.layouts[Buf.OUTPUT]
    # a ReduceScatter's output is rank 0's block alone
    k = s.per_block(Buf.OUTPUT) or len(lay)
    block, within = np.divmod(np.arange(len(lay)), k)
    start_in_block = np.concatenate([[0], np.cumsum(lay[:k])[:-1]])[within]
    if sets is not None:
        want = block * int(lay[:k].sum()) + start_in_block
    else:
        want = block * int(s.layouts[Buf.INPUT].sum()) + start_in_block
    bad = (lay > 0) & (got != want)
    if sets is not None:
        bad |= (lay > 0) & ~sets.all(axis=1)
    if bad.any():
        c = int(np.flatnonzero(bad)[0])
        held = "nothing" if got[c] == EMPTY else f"data coordinate {int(got[c])}"
        if sets is not None and got[c] == want[c]:
            held += f" summed over {int(sets[c].sum())} of the {s.n} ranks"
        raise ScheduleError(f"rank 0's output chunk {c} (block {int(block[c])}) holds {held} "
                            f"at the end; it should hold {int(want[c])}"
                            + (" summed over every rank" if sets is not None else
                               f" (rank {int(block[c])}'s data)")
                            + ", and likewise at every translate")


def link_orbits(s: SymmetricSchedule) -> np.ndarray:
    """Per link of the topology: the link of its orbit that leaves rank 0 (its image under
    the translation that moves its source to rank 0)."""
    topo = s.topology
    links = np.arange(topo.n_links)
    return s.group.link_image(topo, links, s.group.inverse(topo.link_src.astype(np.int64)))


def _pairs(s: SymmetricSchedule) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(op, link, link orbit) for every link of every representative's route, and op
    bytes."""
    o, routes = s.ops, s.routes
    lengths = routes.lengths()[o.route]
    pair_op = np.repeat(np.arange(len(o)), lengths)
    first = np.cumsum(lengths) - lengths
    within = np.arange(int(lengths.sum())) - first[pair_op]
    pair_link = routes.links[routes.offsets[:-1][o.route][pair_op] + within].astype(np.int64)
    elems = np.zeros(len(o), dtype=np.int64)
    rows, j = _chunk_rows(o.count)
    np.add.at(elems, rows, _elems(s, o.src_buf[rows], o.src_off[rows] + j))
    op_bytes = (elems * s.collective.dtype.itemsize).astype(np.float64)
    return pair_op, pair_link, link_orbits(s)[pair_link], op_bytes


def link_loads(s: SymmetricSchedule) -> np.ndarray:
    """Bytes every link of the topology carries in the expanded schedule: the sum over the
    representatives' route links of its orbit."""
    pair_op, _, pair_orbit, op_bytes = _pairs(s)
    per_orbit = np.bincount(pair_orbit, weights=op_bytes[pair_op],
                            minlength=s.topology.n_links)
    orbits = link_orbits(s)
    return np.where(orbits >= 0, per_orbit[np.maximum(orbits, 0)], 0.0)


@dataclass(frozen=True, eq=False)
class SymmetricLockstep:
    """The lockstep simulation of a symmetric schedule: total time, per-step times, bytes and
    busiest link, and the bytes of every link (as :class:`cclc.sim.SimResult` has them for
    the expanded one)."""

    time: float
    step_time: np.ndarray
    link_bytes: np.ndarray
    step_bytes: np.ndarray
    step_busiest_link: tuple[int | None, ...]


def step_bytes(s: SymmetricSchedule, op_bytes: np.ndarray, n_steps: int) -> np.ndarray:
    """Bytes the expanded schedule's ops between two ranks move in every step: each
    representative's bytes once per element of the group (translations act freely)."""
    o = s.ops
    remote = s.routes.lengths()[o.route] > 0
    per_rep = np.bincount(o.step[remote].astype(np.int64), weights=op_bytes[remote],
                          minlength=n_steps)
    return per_rep * s.group.order


def orbit_links(s: SymmetricSchedule) -> tuple[np.ndarray, np.ndarray]:
    """The links of every orbit, orbit by orbit (by :func:`link_orbits`' id) and in id order
    within one, and each orbit's first position in that list (index by orbit id)."""
    orbit = link_orbits(s)
    links = np.flatnonzero(orbit >= 0)
    by_orbit = links[np.argsort(orbit[links], kind="stable")]
    first = np.searchsorted(orbit[by_orbit], np.arange(s.topology.n_links))
    return by_orbit, first


def busiest_per_step(n_steps: int, cell_step: np.ndarray, cell_busy: np.ndarray,
                     cell_link: np.ndarray) -> tuple[int | None, ...]:
    """Every step's busiest link among (step, link) cells with their busy times: the most
    busy, ties to the lowest link id (:func:`cclc.sim.simulate`'s choice); ``None`` for a
    step without a cell."""
    out: list[int | None] = [None] * n_steps
    if len(cell_step):
        order = np.lexsort((cell_link, -cell_busy, cell_step))
        firsts = order[np.flatnonzero(np.diff(cell_step[order], prepend=-1) != 0)]
        for i in firsts.tolist():
            out[int(cell_step[i])] = int(cell_link[i])
    return tuple(out)


def simulate_lockstep(s: SymmetricSchedule, step_overhead: float = 0.0,
                      overhead_steps: OverheadSteps = "every") -> SymmetricLockstep:
    """The lockstep time of the expanded schedule under :mod:`cclc.sim`'s model (local ops
    free, ``step_overhead`` before every step, or before the steps with an op between two
    ranks alone: ``overhead_steps``, :func:`cclc.sim.step_charges`), from the
    representatives: a step's busiest (step, link) cell is found by orbit and its slowest op
    among the representatives; a step has an op between two ranks exactly when a
    representative does (the images of an op move both of its ranks)."""
    topo = s.topology
    o = s.ops
    pair_op, pair_link, pair_orbit, op_bytes = _pairs(s)
    n_steps = int(o.step.max()) + 1 if len(o) else 0
    step = o.step.astype(np.int64)
    key = step[pair_op] * topo.n_links + pair_orbit
    keys, inverse = np.unique(key, return_inverse=True)
    busy = np.bincount(inverse.reshape(-1), weights=op_bytes[pair_op], minlength=len(keys))
    busy = busy / topo.link_bandwidth[keys % topo.n_links]
    op_time = np.zeros(len(o))
    if len(pair_op):
        worst = np.zeros(len(o))
        np.maximum.at(worst, pair_op, busy[inverse.reshape(-1)])
        latency = np.bincount(pair_op, weights=topo.link_latency[pair_link], minlength=len(o))
        remote = s.routes.lengths()[o.route] > 0
        op_time[remote] = latency[remote] + worst[remote]
    step_time = np.zeros(n_steps)
    np.maximum.at(step_time, step, op_time)
    charges = step_charges(step, o.src != o.dst, n_steps, step_overhead, overhead_steps)
    total = float((step_time + charges).sum()) if n_steps else 0.0
    # every link of an orbit is as busy as the orbit's cell: its lowest id stands for it
    by_orbit, first = orbit_links(s)
    busiest = busiest_per_step(n_steps, keys // topo.n_links, busy,
                               by_orbit[first[keys % topo.n_links]])
    return SymmetricLockstep(time=total, step_time=step_time, link_bytes=link_loads(s),
                             step_bytes=step_bytes(s, op_bytes, n_steps),
                             step_busiest_link=busiest)

