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
    s: int
    type: str
    srcbuf: str
    srcoff: int
    dstbuf: str
    dstoff: int
    cnt: int
    depid: int
    deps: int
    hasdep: bool


@dataclass(slots=True)
class Tb:
    id: int
    send: int
    recv: int
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
        gid = _int(g, "id")
        sizes = {"i": _int(g, "i_chunks"), "o": _int(g, "o_chunks"), "s": _int(g, "s_chunks")}
        if algo.inplace:
            sizes = _aliased_sizes(algo, sizes, f"gpu {gid}")
        algo.chunks.append(sizes)
        tbs = []
        send_keys, recv_keys = set(), set()
        for t in g.findall("tb"):
            tb = Tb(_int(t, "id"), _int(t, "send"), _int(t, "recv"), _int(t, "chan"))
            if tb.id != len(tbs):
                raise XmlError(f"gpu {gid}: threadblock {len(tbs)} is missing")
            for peer, keys, what in ((tb.send, send_keys, "send"), (tb.recv, recv_keys, "recv")):
                if peer == gid or not -1 <= peer < ngpus:
                    raise XmlError(f"gpu {gid} tb {tb.id}: bad {what} peer {peer}")
                if peer >= 0:
                    if (peer, tb.chan) in keys:
                        raise XmlError(f"gpu {gid}: two threadblocks {what} with peer {peer} on "
                                       f"channel {tb.chan}")
                    keys.add((peer, tb.chan))
            for k, st in enumerate(t.findall("step")):
                step = Step(_int(st, "s"), st.get("type", ""), st.get("srcbuf", ""),
                            _int(st, "srcoff"), st.get("dstbuf", ""), _int(st, "dstoff"),
                            _int(st, "cnt"), _int(st, "depid"), _int(st, "deps"),
                            _int(st, "hasdep") == 1)
                where = f"gpu {gid} tb {tb.id} step {k}"
                if step.s != k:
                    raise XmlError(f"{where}: s={step.s}, expected {k}")
                if step.type not in _TYPES:
                    raise XmlError(f"{where}: unknown type '{step.type}'")
                if step.type in _SEND and tb.send < 0:
                    raise XmlError(f"{where}: '{step.type}' in a tb without a send peer")
                if step.type in _RECV and tb.recv < 0:
                    raise XmlError(f"{where}: '{step.type}' in a tb without a recv peer")
                if step.type != "nop":
                    _check_range(where, step, sizes)
                tb.steps.append(step)
            tbs.append(tb)
        algo.tbs.append(tbs)
    for gid, tbs in enumerate(algo.tbs):
        for tb in tbs:
            for step in tb.steps:
                if step.depid >= 0:
                    where = f"gpu {gid} tb {tb.id} step {step.s}"
                    if step.depid >= len(tbs) or not 0 <= step.deps < len(tbs[step.depid].steps):
                        raise XmlError(f"{where}: depends on missing step {step.depid}:{step.deps}")
                    if not tbs[step.depid].steps[step.deps].hasdep:
                        raise XmlError(f"{where}: depends on tb {step.depid} step {step.deps}, "
                                       "which lacks hasdep=1 (the runtime never signals it)")
    return algo


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
    out = []
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
    n = algo.ngpus
    inputs = _inputs(algo, seed)
    red = _OPS[op]
    bufs = [_buffers(algo, g, inputs) for g in range(n)]
    flat = [(g, tb) for g in range(n) for tb in algo.tbs[g]]
    index = {(g, tb.id): k for k, (g, tb) in enumerate(flat)}
    nt = len(flat)
    clock = np.zeros((nt, nt), dtype=np.int64)     # vector clock of each tb
    history: list[list[np.ndarray]] = [[] for _ in range(nt)]   # clock after each step
    pc = [0] * nt
    fifo: dict[tuple[int, int, int], deque] = {}
    rng = np.random.default_rng(seed)

    def where(k: int) -> str:
        g, tb = flat[k]
        return f"gpu {g} tb {tb.id} step {pc[k]} ({tb.steps[pc[k]].type})"

    def access(k: int, slots: list[_Slot], write: bool) -> None:
        me = clock[k]
        for slot in slots:
            prior = ([slot.write] if slot.write else []) + (slot.reads if write else [])
            for t, c in prior:
                if t != k and me[t] < c:
                    raise XmlError(f"race: {where(k)} {'writes' if write else 'reads'} a "
                                   f"chunk that {flat[t][0]}:{flat[t][1].id} also accesses "
                                   f"(step {c - 1}) with no dependency or message ordering "
                                   "the two")
            if write:
                slot.write, slot.reads = (k, int(me[k]) + 1), []
            else:
                slot.reads.append((k, int(me[k]) + 1))

    def combine(a: _Slot, sym: Counter | None, num: float, k: int) -> tuple[Counter, float]:
        if a.sym is None or sym is None:
            raise XmlError(f"{where(k)} reduces with a chunk that holds no data")
        if set(a.sym) & set(sym):
            raise XmlError(f"{where(k)} adds contributions {sorted(set(a.sym) & set(sym))} "
                           "twice")
        return a.sym + sym, float(red(a.num, num))

    def ready(k: int) -> bool:
        g, tb = flat[k]
        if pc[k] >= len(tb.steps):
            return False
        st = tb.steps[pc[k]]
        if st.depid >= 0 and len(history[index[(g, st.depid)]]) <= st.deps:
            return False
        if st.type in _RECV:
            q = fifo.get((tb.recv, g, tb.chan))
            if not q:
                return False
        if st.type in _SEND:
            q = fifo.get((g, tb.send, tb.chan))
            if q is not None and len(q) >= capacity:
                return False
        return True

    def run(k: int) -> None:
        g, tb = flat[k]
        st = tb.steps[pc[k]]
        me = clock[k]
        if st.depid >= 0:
            np.maximum(me, history[index[(g, st.depid)]][st.deps], out=me)
        b = bufs[g]
        src = b[st.srcbuf][st.srcoff:st.srcoff + st.cnt] if st.srcoff >= 0 else []
        dst = b[st.dstbuf][st.dstoff:st.dstoff + st.cnt] if st.dstoff >= 0 else []
        payload: list[tuple[Counter | None, float]] | None = None
        if st.type in _RECV:
            msg_clock, cnt, data = fifo[(tb.recv, g, tb.chan)].popleft()
            np.maximum(me, msg_clock, out=me)
            if cnt != st.cnt:
                raise XmlError(f"{where(k)} receives {st.cnt} chunks but the matching send "
                               f"from gpu {tb.recv} (channel {tb.chan}) sent {cnt}")
            payload = data
        if st.type == "s":
            access(k, src, False)
            payload = [(s.sym, s.num) for s in src]
        elif st.type in ("r", "rcs"):
            access(k, dst, True)
            for s, (sym, num) in zip(dst, payload):
                s.sym, s.num = sym, num
        elif st.type in ("rrc", "rrcs", "rrs"):
            access(k, src, False)
            res = [combine(s, sym, num, k) for s, (sym, num) in zip(src, payload)]
            if st.type != "rrs":
                access(k, dst, True)
                for s, (sym, num) in zip(dst, res):
                    s.sym, s.num = sym, num
            payload = res
        elif st.type == "cpy":
            access(k, src, False)
            vals = [(s.sym, s.num) for s in src]
            if any(sym is None for sym, _ in vals):
                raise XmlError(f"{where(k)} copies a chunk that holds no data")
            access(k, dst, True)
            for s, (sym, num) in zip(dst, vals):
                s.sym, s.num = sym, num
        elif st.type == "re":
            access(k, src, False)
            access(k, dst, False)
            res = [combine(d, s.sym, s.num, k) for s, d in zip(src, dst)]
            access(k, dst, True)
            for d, (sym, num) in zip(dst, res):
                d.sym, d.num = sym, num
        if st.type in _SEND:
            if any(sym is None for sym, _ in payload):
                raise XmlError(f"{where(k)} sends a chunk that holds no data")
            me[k] += 1            # the message carries this step's clock
            fifo.setdefault((g, tb.send, tb.chan), deque()).append((me.copy(), st.cnt, payload))
            me[k] -= 1
        me[k] += 1
        history[k].append(me.copy())
        pc[k] += 1

    ks = list(range(nt))
    while True:
        moved = False
        seq = ks[::-1] if order == "reverse" else (
            list(rng.permutation(nt)) if order == "random" else ks)
        for k in seq:
            while ready(k):
                run(k)
                moved = True
                if order == "random":
                    break
        if not moved:
            break
    blocked = [where(k) for k in range(nt) if pc[k] < len(flat[k][1].steps)]
    if blocked:
        raise XmlError("deadlock: no threadblock can move; blocked: " + "; ".join(blocked[:8])
                       + (f" (+{len(blocked) - 8} more)" if len(blocked) > 8 else ""))
    leftover = [key for key, q in fifo.items() if q]
    if leftover:
        s, d, c = leftover[0]
        raise XmlError(f"{len(fifo[leftover[0]])} message(s) from gpu {s} to gpu {d} on "
                       f"channel {c} are never received")
    result = []
    expected = expected_outputs(algo, inputs, op, root)
    if not any(sym for sym, _ in expected):
        raise XmlError(f"the {algo.coll} postcondition of this file checks no output chunk "
                       "(o_chunks is 0 and the file is not in-place): every schedule, even an "
                       "empty one, would pass it")
    for g, (sym, num) in enumerate(expected):
        out = bufs[g]["o"]
        if sym is not None:
            for u, (slot, want) in enumerate(zip(out, sym)):
                if slot.sym != want:
                    got = "nothing" if slot.sym is None else dict(slot.sym)
                    raise XmlError(f"gpu {g} output chunk {u} holds {got}, expected "
                                   f"{dict(want)}")
            got_num = np.array([s.num for s in out])
            if not np.array_equal(got_num, num):
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
