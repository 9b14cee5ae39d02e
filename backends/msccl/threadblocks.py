"""Stages 4 and 6 of the MSCCL lowering (:mod:`backends.msccl.lower`): the instructions in
threadblocks (one per send peer, receive peer and channel of a GPU; local copies and
reductions in their own), then the waits between threadblocks of one GPU as ``depid``/``deps``."""

from __future__ import annotations

from collections import defaultdict

from backends.msccl.instructions import Program
from backends.msccl.runtimes import Runtime
from backends.msccl.steps import Instr, Threadblock, assigned
from cclc.errors import ScheduleError
from cclc.ir import Buf

__all__ = ["LOCAL_SHARES", "dependencies", "threadblocks"]


#: shares of the step limit that a GPU's local threadblocks are filled to, tried in order
LOCAL_SHARES = (0.75, 0.5, 0.25)


def _keys_of(ins: Instr) -> list[tuple]:
    """The (rank, direction, peer, channel) streams an instruction belongs to."""
    keys = []
    if ins.send is not None:
        keys.append((ins.rank, "s", ins.send, ins.chan))
    if ins.recv is not None:
        keys.append((ins.rank, "r", ins.recv, ins.chan))
    return keys


class _Union:
    """Union-find over stream keys: the streams that share one threadblock."""

    def __init__(self) -> None:
        self.parent: dict[tuple, tuple] = {}

    def root(self, k: tuple) -> tuple:
        parent = self.parent
        parent.setdefault(k, k)
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    def join(self, a: tuple, b: tuple) -> None:
        """``b``'s set joins ``a``'s (under ``a``'s root)."""
        self.parent[self.root(b)] = self.root(a)


def _local_tb(ins: Instr, tbs: list[list[Threadblock]], pools: dict[int, list[Threadblock]],
              local_tb: dict[int, Threadblock], program: Program, quota: int, cap: int
              ) -> Threadblock:
    """The threadblock of a local copy or reduction: the one of the op it waits on if that
    has room, else a new one while the GPU has fewer than ``quota``, else the emptiest."""
    pool = pools[ins.rank]
    instrs = program.instrs
    preds = sorted((assigned(instrs[p].pos), local_tb[p]) for p in program.waits_for(ins.uid)
                   if p in local_tb and instrs[p].rank == ins.rank)
    tb = preds[-1][1] if preds and len(preds[-1][1].steps) < cap else None
    if tb is None and len(pool) < quota:
        tb = Threadblock(len(tbs[ins.rank]), None, None, 0)
        tbs[ins.rank].append(tb)
        pool.append(tb)
    if tb is None:
        tb = min(pool, key=lambda t: len(t.steps))
    return tb


def _stream_tb(ins: Instr, tbs: list[list[Threadblock]], tb_of_root: dict[tuple, Threadblock],
               union: _Union) -> Threadblock:
    """The threadblock of a message instruction: the one of its (joined) streams."""
    r = union.root(_keys_of(ins)[0])
    tb = tb_of_root.get(r)
    if tb is None:
        tb = tb_of_root[r] = Threadblock(len(tbs[ins.rank]), None, None, ins.chan)
        tbs[ins.rank].append(tb)
    for way, peer in (("send", ins.send), ("recv", ins.recv)):
        if peer is None:
            continue
        have = getattr(tb, way)
        if have not in (None, peer):
            verb = "send to" if way == "send" else "receive from"
            raise ScheduleError(f"internal: threadblock on GPU {ins.rank} would {verb} "
                                f"{have} and {peer}")
        setattr(tb, way, peer)
    return tb


def threadblocks(program: Program, order: list[int], rt: Runtime, n: int, pair: bool,
                 local_share: float = LOCAL_SHARES[0]) -> list[list[Threadblock]]:
    """Stage 4: one tb per (send peer, recv peer, channel) of each GPU, joined by fused
    steps (and, with ``pair``, send-only with receive-only streams); local ops in as few
    local tbs as ``local_share`` of the step limit allows (room for nops), an op in the tb
    of the op it waits on, so that chains stay in one tb. Steps in the global order."""
    instrs = program.instrs
    union = _Union()
    for ins in instrs:
        ks = _keys_of(ins)
        for k in ks[1:]:
            union.join(ks[0], k)
    if pair:
        _pair_streams(instrs, union, rt)
    tbs: list[list[Threadblock]] = [[] for _ in range(n)]
    tb_of_root: dict[tuple, Threadblock] = {}
    n_local: dict[int, int] = defaultdict(int)
    for ins in instrs:
        if ins.send is None and ins.recv is None:
            n_local[ins.rank] += 1
    cap = max(1, int(rt.max_steps_per_tb * local_share))
    pools: dict[int, list[Threadblock]] = defaultdict(list)
    local_tb: dict[int, Threadblock] = {}
    for j in order:
        ins = instrs[j]
        if ins.send is None and ins.recv is None:
            tb = _local_tb(ins, tbs, pools, local_tb, program,
                           -(-n_local[ins.rank] // cap), cap)
            local_tb[j] = tb
        else:
            tb = _stream_tb(ins, tbs, tb_of_root, union)
        tb.steps.append(ins)
    _sort_tbs(tbs)
    return tbs


def _waits(tb: Threadblock, program: Program) -> None:
    """A tb's waits on other tbs of its GPU: the last one wanted before each step becomes its
    ``depid``/``deps``, the others ``nop`` steps before it; waits an earlier one implies are
    dropped. ``deps`` still counts steps without the nops."""
    instrs = program.instrs
    steps: list[Instr] = []
    waited: dict[int, int] = {}
    for ins in tb.steps:
        need: dict[int, int] = {}
        for p in (instrs[j] for j in program.waits_for(ins.uid)):
            t, s = assigned(p.tb), assigned(p.index)
            if t != ins.tb and (t not in need or need[t] < s):
                need[t] = s
        need = {t: s for t, s in need.items() if t not in waited or waited[t] < s}
        waits = sorted(need.items())
        for t, s in waits[:-1]:
            steps.append(Instr(ins.rank, "nop", Buf.INPUT, None, Buf.OUTPUT, None, 0, ins.key,
                               tb=tb.id, chan=tb.chan, depid=t, deps=s))
        for t, s in waits[-1:]:
            ins.depid, ins.deps = t, s
        waited.update(need)
        steps.append(ins)
    tb.steps = steps


def dependencies(tbs: list[list[Threadblock]], program: Program) -> None:
    """Stage 6: hazards between tbs of one GPU become ``depid``/``deps`` and ``nop`` steps;
    steps are renumbered and every ``deps`` points at its step's final index."""
    for rank_tbs in tbs:
        for tb in rank_tbs:
            _waits(tb, program)
        # renumber, then map deps from pre-nop indices to final ones
        old_to_new: dict[tuple[int, int | None], int] = {}
        for tb in rank_tbs:
            for idx, ins in enumerate(tb.steps):
                if ins.type != "nop":
                    old_to_new[(tb.id, ins.index)] = idx
        for tb in rank_tbs:
            for idx, ins in enumerate(tb.steps):
                ins.index = idx
        for tb in rank_tbs:
            for ins in tb.steps:
                if ins.depid is not None:
                    ins.deps = old_to_new[(ins.depid, ins.deps)]
                    rank_tbs[ins.depid].steps[ins.deps].hasdep = True


def _pair_streams(instrs: list[Instr], union: _Union, rt: Runtime) -> None:
    """Join a GPU's send-only and receive-only streams of one channel into shared tbs.

    An MSCCL tb has one send peer and one receive peer, so a tb that only sends (or only
    receives) wastes half of one; msccl-tools pairs them too. Joining keeps every connection's
    sends (and receives) in one tb, so FIFO order per (peer, channel) is unchanged, and the
    joined tb runs its steps in the global order like every other tb, so the deadlock argument
    (the smallest unfinished instruction can always run) still holds. A pair whose steps would
    leave too little room for nops under the runtime's step limit stays apart.
    """
    size: dict[tuple, int] = defaultdict(int)
    ways: dict[tuple, set[str]] = defaultdict(set)
    for ins in instrs:
        ks = _keys_of(ins)
        if not ks:
            continue
        r = union.root(ks[0])
        size[r] += 1
        for k in ks:
            ways[r].add(k[1])
    # per (rank, channel): streams that only send and streams that only receive
    sends: dict[tuple[int, int], list[tuple]] = defaultdict(list)
    recvs: dict[tuple[int, int], list[tuple]] = defaultdict(list)
    for r, w in ways.items():
        if w == {"s"}:
            sends[(r[0], r[3])].append(r)
        elif w == {"r"}:
            recvs[(r[0], r[3])].append(r)
    cap = max(1, rt.max_steps_per_tb * 3 // 4)
    for key, ss in sends.items():
        rs = recvs.get(key)
        if not rs:
            continue
        # the longest streams pair with the shortest that still fit; ties by peer, so the
        # result does not depend on dict order
        ss.sort(key=lambda k: (-size[k], k[2]))
        rs.sort(key=lambda k: (size[k], k[2]))
        used = [False] * len(rs)
        for s_key in ss:
            for j, r_key in enumerate(rs):
                if not used[j] and size[s_key] + size[r_key] <= cap:
                    used[j] = True
                    union.join(s_key, r_key)
                    break


def _peer_key(peer: int | None) -> int:
    """A peer for sorting: none before GPU 0, as msccl-tools' -1 sorts."""
    return -1 if peer is None else peer


def _sort_tbs(tbs: list[list[Threadblock]]) -> None:
    """Steps of each tb in the global order; tb ids sorted by (send, recv, chan) so tbs that
    use the same link sit together, as msccl-tools does."""
    for rank_tbs in tbs:
        rank_tbs.sort(key=lambda tb: (_peer_key(tb.send), _peer_key(tb.recv), tb.chan))
        for new_id, tb in enumerate(rank_tbs):
            tb.id = new_id
            tb.steps.sort(key=lambda ins: assigned(ins.pos))
            for idx, ins in enumerate(tb.steps):
                ins.tb, ins.index = new_id, idx
