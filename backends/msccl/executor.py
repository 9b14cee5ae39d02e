"""An independent executor of MSCCL-IR XML, for tests: it catches lowering bugs.

It reads nothing but the XML (and the collective's reduction op and root, which the XML does
not carry) and runs it under the runtime's rules:

* ``inplace="1"`` aliases the output to the input as the runtimes define an in-place call
  (NCCL's ``sendbuff``/``recvbuff`` rule, the same in msccl-tools): allreduce, broadcast and
  reduce use one buffer; allgather's input is the rank's slice of the output; reduce_scatter's
  output is the rank's slice of the input. msccl-tools then writes the aliased side with 0
  chunks, so its size comes from ``nchunksperloop``;
* every threadblock (tb) runs its steps in order; a step with ``depid``/``deps`` waits until
  that tb of its GPU has finished that step, and the waited-on step must say ``hasdep="1"``;
* a send goes to the tb's ``send`` peer on the tb's channel, a receive takes the oldest message
  from its ``recv`` peer on that channel (FIFO per (sender, receiver, channel), no tags); a
  connection buffers at most ``capacity`` messages: 2 by default, as in the runtimes, whose
  connection has NCCL_STEPS (8) slots and whose step moves at most MSCCL_CHUNKSTEPS
  (NCCL_STEPS/2) of them (microsoft/msccl ``src/include/msccl.h``; the runtime caps ``cnt`` per
  loop so that a step fits);
* each chunk slot holds a symbolic value (the multiset of (origin GPU, origin chunk) it sums)
  and a number (exact integers in float64), so a misplaced chunk, a reduction applied twice and
  a wrong number all show.

Beyond the final check against the postcondition (computed here from the ``coll`` attribute,
not from cclc's verifier; a postcondition that checks no chunk at all is refused, since
every file would pass it), vector clocks find every pair of conflicting accesses to a slot that
are not ordered by program order, messages or dependencies: a missing dependency is an error
even when this particular interleaving happened to get it right. Deadlock (no tb can move) is
an error naming the blocked tbs.

The executor keeps a vector clock per threadblock and step, so its memory grows with
threadblocks x steps; a file whose estimate exceeds ``max_memory`` is refused up front
(:class:`TooLarge`) instead of running out of memory.

Run ``python -m backends.msccl.executor FILE.xml [--op sum] [--root 0]`` for a one-line verdict
(exit status 0 ok, 1 wrong, 2 too large to execute here).
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from collections import Counter, deque
from dataclasses import dataclass, field

import numpy as np

__all__ = ["Algo", "Step", "Tb", "TooLarge", "XmlError", "execute", "expected_outputs", "parse"]

_SEND = {"s", "rcs", "rrs", "rrcs"}
_RECV = {"r", "rcs", "rrc", "rrs", "rrcs"}
_REDUCE = {"rrc", "rrs", "rrcs", "re"}
_WRITES_DST = {"r", "rcs", "rrc", "rrcs", "cpy", "re"}
_TYPES = _SEND | _RECV | {"cpy", "re", "nop"}
_COLL = {"reduce_scatter": "reducescatter"}


class XmlError(Exception):
    """The XML is malformed, deadlocks, races, or computes the wrong result."""


class TooLarge(XmlError):
    """The XML is too large for this executor's memory budget (no verdict on it)."""


#: messages a connection buffers: NCCL_STEPS / MSCCL_CHUNKSTEPS
RUNTIME_CAPACITY = 2
#: default memory budget of :func:`execute`
MAX_MEMORY = 2 << 30


@dataclass(slots=True)
class Step:
    """One ``<step>``; the XML's -1 ("no data", "no dependency") is None here."""

    s: int
    type: str
    srcbuf: str
    srcoff: int | None
    dstbuf: str
    dstoff: int | None
    cnt: int
    depid: int | None
    deps: int | None
    hasdep: bool


@dataclass(slots=True)
class Tb:
    """One ``<tb>``; ``send``/``recv`` None where the XML says -1 (no such peer)."""

    id: int
    send: int | None
    recv: int | None
    chan: int
    steps: list[Step] = field(default_factory=list)


@dataclass(slots=True)
class Algo:
    attrs: dict[str, str]
    coll: str
    ngpus: int
    nchunksperloop: int
    chunks: list[dict[str, int]]      # per gpu: {"i": .., "o": .., "s": ..}, aliases resolved
    tbs: list[list[Tb]]
    inplace: bool = False


def _int(el: ET.Element, name: str) -> int:
    v = el.get(name)
    if v is None:
        raise XmlError(f"<{el.tag}> lacks attribute '{name}'")
    try:
        return int(v)
    except ValueError:
        raise XmlError(f"<{el.tag}> attribute {name}='{v}' is not an integer") from None


def _opt(value: int | None) -> int | None:
    """The XML's -1 as None (a negative number other than -1 stays, for the checks)."""
    return None if value == -1 else value


def _unset(value: int | None) -> int | None:
    """An offset or dependency the runtimes ignore when negative, as None."""
    return None if value is None or value < 0 else value


def parse(text: str) -> Algo:
    """Parse and check the structure (dense ids, peers, one tb per (peer, channel), offsets)."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError as e:
        raise XmlError(f"not XML: {e}") from None
    if root.tag != "algo":
        raise XmlError(f"root element is <{root.tag}>, expected <algo>")
    ngpus = _int(root, "ngpus")
    coll = _COLL.get(root.get("coll", ""), root.get("coll", ""))
    algo = Algo(dict(root.attrib), coll, ngpus, _int(root, "nchunksperloop"), [], [],
                root.get("inplace", "0") == "1")
    gpus = root.findall("gpu")
    if [_int(g, "id") for g in gpus] != list(range(ngpus)):
        raise XmlError(f"expected gpus 0..{ngpus - 1} in order")
    for g in gpus:
        _parse_gpu(algo, g)
    for gid, tbs in enumerate(algo.tbs):
        _check_deps(gid, tbs)
    return algo


def _parse_gpu(algo: Algo, g: ET.Element) -> None:
    """Append one ``<gpu>``'s buffer sizes and threadblocks to ``algo``."""
    gid = _int(g, "id")
    sizes = {"i": _int(g, "i_chunks"), "o": _int(g, "o_chunks"), "s": _int(g, "s_chunks")}
    if algo.inplace:
        sizes = _aliased_sizes(algo, sizes, f"gpu {gid}")
    algo.chunks.append(sizes)
    tbs: list[Tb] = []
    keys: dict[str, set[tuple[int, int]]] = {"send": set(), "recv": set()}
    for t in g.findall("tb"):
        tb = _parse_tb(t, gid, algo.ngpus, keys)
        if tb.id != len(tbs):
            raise XmlError(f"gpu {gid}: threadblock {len(tbs)} is missing")
        for k, st in enumerate(t.findall("step")):
            tb.steps.append(_parse_step(st, f"gpu {gid} tb {tb.id} step {k}", k, tb, sizes))
        tbs.append(tb)
    algo.tbs.append(tbs)


def _parse_tb(t: ET.Element, gid: int, ngpus: int, keys: dict[str, set[tuple[int, int]]]
              ) -> Tb:
    """One ``<tb>`` without its steps; its peers checked (one tb per peer and channel)."""
    tb_id, chan = _int(t, "id"), _int(t, "chan")
    peers = {"send": _int(t, "send"), "recv": _int(t, "recv")}
    for what, peer in peers.items():
        if peer == gid or not -1 <= peer < ngpus:
            raise XmlError(f"gpu {gid} tb {tb_id}: bad {what} peer {peer}")
        if peer >= 0:
            if (peer, chan) in keys[what]:
                raise XmlError(f"gpu {gid}: two threadblocks {what} with peer {peer} on "
                               f"channel {chan}")
            keys[what].add((peer, chan))
    return Tb(tb_id, _opt(peers["send"]), _opt(peers["recv"]), chan)


def _parse_step(st: ET.Element, where: str, k: int, tb: Tb, sizes: dict[str, int]) -> Step:
    """One ``<step>`` (the ``k``-th of ``tb``), checked against its tb and the buffers."""
    step = Step(_int(st, "s"), st.get("type", ""), st.get("srcbuf", ""), _int(st, "srcoff"),
                st.get("dstbuf", ""), _int(st, "dstoff"), _int(st, "cnt"), _int(st, "depid"),
                _int(st, "deps"), _int(st, "hasdep") == 1)
    if step.s != k:
        raise XmlError(f"{where}: s={step.s}, expected {k}")
    if step.type not in _TYPES:
        raise XmlError(f"{where}: unknown type '{step.type}'")
    if step.type in _SEND and tb.send is None:
        raise XmlError(f"{where}: '{step.type}' in a tb without a send peer")
    if step.type in _RECV and tb.recv is None:
        raise XmlError(f"{where}: '{step.type}' in a tb without a recv peer")
    if step.type != "nop":
        _check_range(where, step, sizes)
    # checked as written; from here on, what the runtimes ignore is None
    step.srcoff, step.dstoff = _unset(step.srcoff), _unset(step.dstoff)
    step.depid, step.deps = _unset(step.depid), _opt(step.deps)
    return step


def _check_deps(gid: int, tbs: list[Tb]) -> None:
    """Every dependency names an existing step, which signals it (``hasdep``)."""
    for tb in tbs:
        for step in tb.steps:
            if step.depid is None:
                continue
            where = f"gpu {gid} tb {tb.id} step {step.s}"
            deps = -1 if step.deps is None else step.deps
            if step.depid >= len(tbs) or not 0 <= deps < len(tbs[step.depid].steps):
                raise XmlError(f"{where}: depends on missing step {step.depid}:{deps}")
            if not tbs[step.depid].steps[deps].hasdep:
                raise XmlError(f"{where}: depends on tb {step.depid} step {deps}, "
                               "which lacks hasdep=1 (the runtime never signals it)")


def _aliased_sizes(algo: Algo, sizes: dict[str, int], where: str) -> dict[str, int]:
    """Buffer sizes of an in-place file: the aliased side may be written as 0 chunks."""
    n, total = algo.ngpus, algo.nchunksperloop
    if algo.coll in ("allgather", "reducescatter") and total % n:
        raise XmlError(f"{where}: nchunksperloop={total} is not a multiple of ngpus={n}")
    big, small = {"allgather": ("o", "i"), "reducescatter": ("i", "o")}.get(algo.coll,
                                                                           ("i", "o"))
    want = {big: total, small: total // n if algo.coll in ("allgather", "reducescatter")
            else total}
    for buf, size in want.items():
        if sizes[buf] not in (0, size):
            raise XmlError(f"{where}: in-place {algo.coll} needs {buf}_chunks={size} (or 0, "
                           f"aliased), not {sizes[buf]}")
    return {**sizes, **want}


def _check_range(where: str, step: Step, sizes: dict[str, int]) -> None:
    if step.cnt <= 0:
        raise XmlError(f"{where}: cnt={step.cnt}")
    for buf, off, used in ((step.srcbuf, step.srcoff, step.type in ("s", "cpy", "re")
                            or step.type in _REDUCE),
                           (step.dstbuf, step.dstoff, step.type in _WRITES_DST)):
        if not used:
            continue
        if buf not in sizes:
            raise XmlError(f"{where}: unknown buffer '{buf}'")
        off = -1 if off is None else off      # (raw values here: None never reaches it)
        if not 0 <= off or off + step.cnt > sizes[buf]:
            raise XmlError(f"{where}: chunks {off}..{off + step.cnt - 1} outside buffer '{buf}' "
                           f"of {sizes[buf]} chunks")


_OPS = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}


def _inputs(algo: Algo, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    # small integers keep sums and products exact in float64
    return [rng.integers(1, 4, size=algo.chunks[g]["i"]).astype(np.float64)
            for g in range(algo.ngpus)]


def expected_outputs(algo: Algo, inputs: list[np.ndarray], op: str = "sum",
                     root: int = 0) -> list[tuple[list | None, np.ndarray | None]]:
    """Per GPU: the expected symbolic output (a list of Counters of (gpu, chunk) or None where
    unspecified) and numbers, from the collective's definition."""
    n, coll = algo.ngpus, algo.coll
    ic = algo.chunks[0]["i"]
    oc = algo.chunks[0]["o"]
    red = _OPS[op]
    out: list[tuple[list | None, np.ndarray | None]] = []
    for g in range(n):
        if coll == "allgather":
            sym = [Counter({(b, u): 1}) for b in range(n) for u in range(ic)]
            num = np.concatenate(inputs)
        elif coll == "alltoall":
            blk = ic // n
            sym = [Counter({(i, g * blk + u): 1}) for i in range(n) for u in range(blk)]
            num = np.concatenate([inputs[i][g * blk:(g + 1) * blk] for i in range(n)])
        elif coll == "reducescatter":
            sym = [Counter({(i, g * oc + u): 1 for i in range(n)}) for u in range(oc)]
            num = red.reduce([x[g * oc:(g + 1) * oc] for x in inputs])
        elif coll == "allreduce":
            sym = [Counter({(i, u): 1 for i in range(n)}) for u in range(oc)]
            num = red.reduce(inputs)
        elif coll == "broadcast":
            sym = [Counter({(root, u): 1}) for u in range(oc)]
            num = inputs[root].copy()
        elif coll == "reduce":
            if g != root:
                out.append((None, None))
                continue
            sym = [Counter({(i, u): 1 for i in range(n)}) for u in range(oc)]
            num = red.reduce(inputs)
        else:
            raise XmlError(f"no postcondition for collective '{algo.coll}'")
        if len(sym) != oc:
            raise XmlError(f"gpu {g}: o_chunks={oc} does not fit a {coll} of {n} GPUs with "
                           f"i_chunks={ic}")
        out.append((sym, num))
    return out


@dataclass
class _Slot:
    sym: Counter | None
    num: float
    write: tuple[int, int] | None = None          # (tb index, clock value) of the last write
    reads: list[tuple[int, int]] = field(default_factory=list)
    write_at: str = ""


def memory_estimate(text: str) -> int:
    """Bytes the vector clocks of :func:`execute` need for ``text`` (counted without parsing:
    one clock of every tb per tb, per executed step and per message in flight)."""
    n_tbs = text.count("<tb ")
    n_steps = text.count("<step ")
    return 8 * n_tbs * (n_tbs + 2 * n_steps)


def _buffers(algo: Algo, g: int, inputs: list[np.ndarray]) -> dict[str, list[_Slot]]:
    sizes = algo.chunks[g]
    i = [_Slot(Counter({(g, u): 1}), float(inputs[g][u])) for u in range(sizes["i"])]
    o = [_Slot(None, np.nan) for _ in range(sizes["o"])]
    s = [_Slot(None, np.nan) for _ in range(sizes["s"])]
    if algo.inplace:
        # the same slot objects under both names, so a write through one is seen by the other
        if algo.coll == "allgather":
            o[g * sizes["i"]:(g + 1) * sizes["i"]] = i
        elif algo.coll == "reducescatter":
            o = i[g * sizes["o"]:(g + 1) * sizes["o"]]
        else:
            o = i
    return {"i": i, "o": o, "s": s}


def execute(text: str, op: str = "sum", root: int = 0, seed: int = 0,
            capacity: int = RUNTIME_CAPACITY, order: str = "round-robin",
            max_memory: int = MAX_MEMORY) -> list[np.ndarray]:
    """Run the XML; raise :class:`XmlError` on any fault; return each GPU's output numbers.

    ``order`` picks which ready tb moves next: ``round-robin``, ``reverse`` or ``random``
    (seeded); the result must not depend on it. ``capacity``: messages a connection buffers.
    Raises :class:`TooLarge` before any work if :func:`memory_estimate` exceeds
    ``max_memory``.
    """
    need = memory_estimate(text)
    if need > max_memory:
        raise TooLarge(f"too large to execute: {text.count('<tb ')} threadblocks and "
                       f"{text.count('<step ')} steps need about {need / 2**30:.1f} GiB of "
                       f"vector clocks, above the {max_memory / 2**30:.1f} GiB budget "
                       "(--max-memory); no verdict")
    algo = parse(text)
    inputs = _inputs(algo, seed)
    machine = _Machine(algo, inputs, _OPS[op], capacity)
    machine.run_all(order, np.random.default_rng(seed))
    machine.check_finished()
    return _check_outputs(algo, machine.bufs, expected_outputs(algo, inputs, op, root))


Payload = list[tuple[Counter | None, float]]


class _Machine:
    """Every threadblock of every GPU with its vector clock, program counter and buffers,
    and the connections' FIFOs; :meth:`step` runs one step of one tb."""

    def __init__(self, algo: Algo, inputs: list[np.ndarray], red, capacity: int):
        n = algo.ngpus
        self.red, self.capacity = red, capacity
        self.bufs = [_buffers(algo, g, inputs) for g in range(n)]
        self.flat = [(g, tb) for g in range(n) for tb in algo.tbs[g]]
        self.index = {(g, tb.id): k for k, (g, tb) in enumerate(self.flat)}
        nt = len(self.flat)
        self.clock = np.zeros((nt, nt), dtype=np.int64)     # vector clock of each tb
        self.history: list[list[np.ndarray]] = [[] for _ in range(nt)]   # after each step
        self.pc = [0] * nt
        # (sender, receiver, channel) -> messages in flight (peers are set: parse checked)
        self.fifo: dict[tuple[int | None, int | None, int], deque] = {}

    def where(self, k: int) -> str:
        g, tb = self.flat[k]
        return f"gpu {g} tb {tb.id} step {self.pc[k]} ({tb.steps[self.pc[k]].type})"

    def access(self, k: int, slots: list[_Slot], write: bool) -> None:
        """Record tb ``k``'s access to ``slots``; a race if an earlier conflicting access is
        not ordered before it."""
        me = self.clock[k]
        for slot in slots:
            prior = ([slot.write] if slot.write else []) + (slot.reads if write else [])
            for t, c in prior:
                if t != k and me[t] < c:
                    g, tb = self.flat[t]
                    raise XmlError(f"race: {self.where(k)} {'writes' if write else 'reads'} "
                                   f"a chunk that {g}:{tb.id} also accesses (step {c - 1}) "
                                   "with no dependency or message ordering the two")
            if write:
                slot.write, slot.reads = (k, int(me[k]) + 1), []
            else:
                slot.reads.append((k, int(me[k]) + 1))

    def combine(self, a: _Slot, sym: Counter | None, num: float, k: int
                ) -> tuple[Counter, float]:
        if a.sym is None or sym is None:
            raise XmlError(f"{self.where(k)} reduces with a chunk that holds no data")
        if set(a.sym) & set(sym):
            raise XmlError(f"{self.where(k)} adds contributions "
                           f"{sorted(set(a.sym) & set(sym))} twice")
        return a.sym + sym, float(self.red(a.num, num))

    def ready(self, k: int) -> bool:
        g, tb = self.flat[k]
        if self.pc[k] >= len(tb.steps):
            return False
        st = tb.steps[self.pc[k]]
        if st.depid is not None and \
                len(self.history[self.index[(g, st.depid)]]) <= (st.deps or 0):
            return False
        if st.type in _RECV and not self.fifo.get((tb.recv, g, tb.chan)):
            return False
        if st.type in _SEND:
            q = self.fifo.get((g, tb.send, tb.chan))
            if q is not None and len(q) >= self.capacity:
                return False
        return True

    def step(self, k: int) -> None:
        """Run tb ``k``'s next step (it must be :meth:`ready`)."""
        g, tb = self.flat[k]
        st = tb.steps[self.pc[k]]
        me = self.clock[k]
        if st.depid is not None:
            np.maximum(me, self.history[self.index[(g, st.depid)]][st.deps or 0], out=me)
        b = self.bufs[g]
        src = b[st.srcbuf][st.srcoff:st.srcoff + st.cnt] if st.srcoff is not None else []
        dst = b[st.dstbuf][st.dstoff:st.dstoff + st.cnt] if st.dstoff is not None else []
        payload: Payload | None = None
        if st.type in _RECV:
            msg_clock, cnt, payload = self.fifo[(tb.recv, g, tb.chan)].popleft()
            np.maximum(me, msg_clock, out=me)
            if cnt != st.cnt:
                raise XmlError(f"{self.where(k)} receives {st.cnt} chunks but the matching "
                               f"send from gpu {tb.recv} (channel {tb.chan}) sent {cnt}")
        payload = _RULES.get(st.type, _nop)(self, k, st.type, src, dst, payload)
        if st.type in _SEND:
            assert payload is not None
            if any(sym is None for sym, _ in payload):
                raise XmlError(f"{self.where(k)} sends a chunk that holds no data")
            me[k] += 1            # the message carries this step's clock
            self.fifo.setdefault((g, tb.send, tb.chan), deque()).append(
                (me.copy(), st.cnt, payload))
            me[k] -= 1
        me[k] += 1
        self.history[k].append(me.copy())
        self.pc[k] += 1

    def run_all(self, order: str, rng: np.random.Generator) -> None:
        """Move ready tbs, in ``order``, until none can."""
        nt = len(self.flat)
        ks = list(range(nt))
        while True:
            moved = False
            seq = ks[::-1] if order == "reverse" else (
                list(rng.permutation(nt)) if order == "random" else ks)
            for k in seq:
                while self.ready(k):
                    self.step(k)
                    moved = True
                    if order == "random":
                        break
            if not moved:
                break

    def check_finished(self) -> None:
        """Every tb ran every step and every message was received."""
        blocked = [self.where(k) for k in range(len(self.flat))
                   if self.pc[k] < len(self.flat[k][1].steps)]
        if blocked:
            raise XmlError("deadlock: no threadblock can move; blocked: "
                           + "; ".join(blocked[:8])
                           + (f" (+{len(blocked) - 8} more)" if len(blocked) > 8 else ""))
        leftover = [key for key, q in self.fifo.items() if q]
        if leftover:
            s, d, c = leftover[0]
            raise XmlError(f"{len(self.fifo[leftover[0]])} message(s) from gpu {s} to gpu {d} "
                           f"on channel {c} are never received")


def _store(slots: list[_Slot], values) -> None:
    for slot, (sym, num) in zip(slots, values, strict=False):
        slot.sym, slot.num = sym, num


def _send(m: _Machine, k: int, typ: str, src, dst, payload) -> Payload:
    m.access(k, src, False)
    return [(s.sym, s.num) for s in src]


def _receive(m: _Machine, k: int, typ: str, src, dst, payload) -> Payload:
    m.access(k, dst, True)
    _store(dst, payload)
    return payload


def _receive_reduce(m: _Machine, k: int, typ: str, src, dst, payload) -> Payload:
    m.access(k, src, False)
    res: Payload = [m.combine(s, sym, num, k)
                    for s, (sym, num) in zip(src, payload, strict=False)]
    if typ != "rrs":
        m.access(k, dst, True)
        _store(dst, res)
    return res


def _copy(m: _Machine, k: int, typ: str, src, dst, payload) -> Payload | None:
    m.access(k, src, False)
    vals = [(s.sym, s.num) for s in src]
    if any(sym is None for sym, _ in vals):
        raise XmlError(f"{m.where(k)} copies a chunk that holds no data")
    m.access(k, dst, True)
    _store(dst, vals)
    return payload


def _reduce(m: _Machine, k: int, typ: str, src, dst, payload) -> Payload | None:
    m.access(k, src, False)
    m.access(k, dst, False)
    res = [m.combine(d, s.sym, s.num, k) for s, d in zip(src, dst, strict=False)]
    m.access(k, dst, True)
    _store(dst, res)
    return payload


def _nop(m: _Machine, k: int, typ: str, src, dst, payload) -> Payload | None:
    return payload


#: what each step type does to its slots; it returns what a send step sends
_RULES = {"s": _send, "r": _receive, "rcs": _receive, "rrc": _receive_reduce,
          "rrcs": _receive_reduce, "rrs": _receive_reduce, "cpy": _copy, "re": _reduce,
          "nop": _nop}


def _check_outputs(algo: Algo, bufs: list[dict[str, list[_Slot]]],
                   expected: list[tuple[list | None, np.ndarray | None]]) -> list[np.ndarray]:
    """Each GPU's output numbers, after checking them against the postcondition."""
    if not any(sym for sym, _ in expected):
        raise XmlError(f"the {algo.coll} postcondition of this file checks no output chunk "
                       "(o_chunks is 0 and the file is not in-place): every schedule, even an "
                       "empty one, would pass it")
    result = []
    for g, (sym, num) in enumerate(expected):
        out = bufs[g]["o"]
        if sym is not None:
            for u, (slot, want) in enumerate(zip(out, sym, strict=False)):
                if slot.sym != want:
                    got = "nothing" if slot.sym is None else dict(slot.sym)
                    raise XmlError(f"gpu {g} output chunk {u} holds {got}, expected "
                                   f"{dict(want)}")
            got_num = np.array([s.num for s in out])
            if num is None or not np.array_equal(got_num, num):
                raise XmlError(f"gpu {g} output numbers {got_num} differ from {num}")
        result.append(np.array([s.num for s in out]))
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Execute MSCCL-IR XML and check its result.")
    p.add_argument("xml")
    p.add_argument("--op", default="sum", choices=sorted(_OPS))
    p.add_argument("--root", type=int, default=0)
    p.add_argument("--capacity", type=int, default=RUNTIME_CAPACITY,
                   help="messages a connection buffers (default: %(default)s, as the runtimes)")
    p.add_argument("--max-memory", type=float, default=MAX_MEMORY / 2**30, metavar="GIB",
                   help="refuse files whose vector clocks need more (default: %(default)s)")
    args = p.parse_args(argv)
    with open(args.xml, encoding="utf-8") as f:
        text = f.read()
    try:
        execute(text, op=args.op, root=args.root, capacity=args.capacity,
                max_memory=int(args.max_memory * 2**30))
    except TooLarge as e:
        print(f"{args.xml}: REFUSED: {e}", file=sys.stderr)
        return 2
    except XmlError as e:
        print(f"{args.xml}: FAIL: {e}", file=sys.stderr)
        return 1
    print(f"{args.xml}: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
