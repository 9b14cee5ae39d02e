"""A lower bound on a schedule's time from what its members send, whatever the routes.

A candidate's link-traffic bound (:mod:`cclc.load_bounds`) needs the routes its ops take; on a
fabric with spines the time is priced with ECMP's hash, not the algorithm's routes, so no such
bound holds there. This one needs only who sends how many bytes to whom in which steps (an
entry's ``sends`` rule, :mod:`cclc.sends`), and cuts that every route must cross:

* a **member** ``v``: every op ``v`` sends leaves over one of ``v``'s healthy out-links (a
  relayed op's first segment too), every op it receives arrives over an in-link;
* a **node** ``S`` (where the topology has nodes): the vertices of ``S``'s members and the
  switches and NICs whose rank neighbours are all in ``S``; every op from a member of ``S`` to
  a member outside crosses a healthy link out of that set (and into it the other way).

For a cut ``C`` carrying ``B`` bytes of a step, its busiest link ``l`` is busy at least
``B / bandwidth(C)`` (the cut's links together), and the op that ends last on ``l`` pays at
least ``latency(l)``; so under the lockstep models (:mod:`cclc.sim`: a step lasts as long as
its slowest op, latency of its route plus the busiest link on it) every step costs at least::

    max over cuts C of  B(C) / bandwidth(C) + min latency of C's links

and the steps add up (relay lowering only cuts a step into sub-steps, each paying the same at
least for its part), plus the model's cost per step and per call. Every other model serves a
link's bytes one after another (:mod:`cclc.load_bounds`), so there the whole schedule's bytes
over a cut bound the time the same way, plus the per-call cost. Both are true lower bounds
(``tests/plan/test_send_bounds.py`` checks them against the simulated schedules on fabrics,
switches and tori under every model).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from cclc.collective import Collective
from cclc.execution import ExecutionModel
from cclc.sends import Sends
from cclc.topology import Topology

__all__ = ["Cuts", "SendBound", "cuts_of", "send_bound"]


@dataclass(frozen=True, eq=False)
class Cuts:
    """The cuts of a group: per member its out- and in-links' total bandwidth and least
    latency (0 and ``inf`` where it has none); ``node`` the node index of every member
    (``None`` without nodes) and per node the same four figures for its boundary."""

    out_bw: np.ndarray
    out_lat: np.ndarray
    in_bw: np.ndarray
    in_lat: np.ndarray
    node: np.ndarray | None = None
    node_out_bw: np.ndarray | None = None
    node_out_lat: np.ndarray | None = None
    node_in_bw: np.ndarray | None = None
    node_in_lat: np.ndarray | None = None


@dataclass(frozen=True, slots=True)
class SendBound:
    """``seconds``: a lower bound on the time under the model it was computed for; ``cut``
    names the cut that sets it (``"member"`` or ``"node"``)."""

    seconds: float
    cut: str


def _per_vertex(index: np.ndarray, bandwidth: np.ndarray, latency: np.ndarray, size: int
                ) -> tuple[np.ndarray, np.ndarray]:
    bw = np.bincount(index, weights=bandwidth, minlength=size)
    lat = np.full(size, np.inf)
    np.minimum.at(lat, index, latency)
    return bw, lat


def _node_of_vertex(topo: Topology) -> np.ndarray:
    """The node of every vertex: a rank's own; a switch's or NIC's where every rank it links
    to is in one node (else -1)."""
    assert topo.node_of_rank is not None
    n_r = topo.n_ranks
    lo = np.full(topo.n_vertices, np.iinfo(np.int64).max)
    hi = np.full(topo.n_vertices, -1)
    for a, b in ((topo.link_src, topo.link_dst), (topo.link_dst, topo.link_src)):
        edge = (a >= n_r) & (b < n_r)
        np.minimum.at(lo, a[edge], topo.node_of_rank[b[edge]])
        np.maximum.at(hi, a[edge], topo.node_of_rank[b[edge]])
    node = np.where(lo == hi, hi, -1)
    node[:n_r] = topo.node_of_rank
    return node


def cuts_of(coll: Collective) -> Cuts:
    """The member and node cuts of ``coll``'s group on its topology's healthy links."""
    topo = coll.topology
    group = np.asarray(coll.group, dtype=np.int64)
    ok = ~topo.link_failed
    src, dst = topo.link_src[ok], topo.link_dst[ok]
    bw, lat = topo.link_bandwidth[ok], topo.link_latency[ok]
    nv = topo.n_vertices
    out_bw, out_lat = _per_vertex(src, bw, lat, nv)
    in_bw, in_lat = _per_vertex(dst, bw, lat, nv)
    cuts = Cuts(out_bw[group], out_lat[group], in_bw[group], in_lat[group])
    if topo.node_of_rank is None or topo.n_nodes < 2:
        return cuts
    vnode = _node_of_vertex(topo)
    crossing = vnode[src] != vnode[dst]
    leaving = crossing & (vnode[src] >= 0)
    entering = crossing & (vnode[dst] >= 0)
    n_nodes = int(topo.n_nodes)
    nob, nol = _per_vertex(vnode[src[leaving]], bw[leaving], lat[leaving], n_nodes)
    nib, nil = _per_vertex(vnode[dst[entering]], bw[entering], lat[entering], n_nodes)
    return Cuts(cuts.out_bw, cuts.out_lat, cuts.in_bw, cuts.in_lat, vnode[group], nob, nol,
                nib, nil)


def _cut_cost(nbytes: np.ndarray, bw: np.ndarray, lat: np.ndarray) -> float:
    """max over the cuts carrying bytes of bytes / bandwidth + least latency (a cut without
    a healthy link carries nothing a schedule could send: it is left out)."""
    live = (nbytes > 0) & (bw > 0)
    if not live.any():
        return 0.0
    return float((nbytes[live] / bw[live] + lat[live]).max())


class _Tally:
    """Bytes across every cut, summed over the sends of one step."""

    def __init__(self, cuts: Cuts):
        self.cuts = cuts
        n = len(cuts.out_bw)
        self.out = np.zeros(n)
        self.into = np.zeros(n)
        k = 0 if cuts.node_out_bw is None else len(cuts.node_out_bw)
        self.node_out = np.zeros(k)
        self.node_in = np.zeros(k)

    def add(self, s: Sends, times: float = 1.0) -> None:
        remote = (s.src != s.dst) & (s.nbytes > 0)
        src, dst, w = s.src[remote], s.dst[remote], s.nbytes[remote] * times
        n = len(self.out)
        self.out += np.bincount(src, weights=w, minlength=n)
        self.into += np.bincount(dst, weights=w, minlength=n)
        node = self.cuts.node
        if node is not None:
            cross = node[src] != node[dst]
            k = len(self.node_out)
            self.node_out += np.bincount(node[src[cross]], weights=w[cross], minlength=k)
            self.node_in += np.bincount(node[dst[cross]], weights=w[cross], minlength=k)

    def cost(self) -> tuple[float, str]:
        c = self.cuts
        member = max(_cut_cost(self.out, c.out_bw, c.out_lat),
                     _cut_cost(self.into, c.in_bw, c.in_lat))
        if c.node_out_bw is None:
            return member, "member"
        assert c.node_out_lat is not None and c.node_in_bw is not None \
            and c.node_in_lat is not None
        node = max(_cut_cost(self.node_out, c.node_out_bw, c.node_out_lat),
                   _cut_cost(self.node_in, c.node_in_bw, c.node_in_lat))
        return (node, "node") if node > member else (member, "member")


def _steps(entries: Sequence[Sends]) -> list[list[Sends]]:
    """The entries grouped by step: each group's first entry does not join the previous."""
    groups: list[list[Sends]] = []
    for s in entries:
        if s.joins_previous and groups:
            if s.steps != groups[-1][0].steps:
                raise ValueError("sends that join the previous entry must have its steps")
            groups[-1].append(s)
        else:
            groups.append([s])
    return groups


#: sends tallied at once: joined entries (a direct exchange's shifts) are concatenated up to
#: this many, so a step of ``n^2`` pairs costs a few large bincounts, not ``n`` small ones
_BATCH = 1 << 20


def _batches(group: list[Sends]) -> list[Sends]:
    """The entries of one step, concatenated into batches of about :data:`_BATCH` sends."""
    runs: list[list[Sends]] = [[]]
    size = 0
    for s in group:
        if runs[-1] and size + len(s.src) > _BATCH:
            runs.append([])
            size = 0
        runs[-1].append(s)
        size += len(s.src)
    return [run[0] if len(run) == 1 else
            Sends(np.concatenate([p.src for p in run]), np.concatenate([p.dst for p in run]),
                  np.concatenate([p.nbytes for p in run]), run[0].steps)
            for run in runs if run]


def send_bound(coll: Collective, entries: Sequence[Sends], model: ExecutionModel
               ) -> SendBound:
    """The lower bound of a schedule of ``coll`` that sends ``entries`` (see the module
    docstring), under execution ``model``."""
    cuts = cuts_of(coll)
    lockstep = model.mode == "lockstep"
    whole = _Tally(cuts)
    total, n_steps = 0.0, 0
    cut, largest = "member", 0.0        # the cut of the step group that costs the most
    for group in _steps(entries):
        steps = group[0].steps
        if steps < 1:
            continue
        step = _Tally(cuts)
        for batch in _batches(group):
            # lockstep: each step's cuts; otherwise the whole schedule's bytes
            (step.add(batch) if lockstep else whole.add(batch, steps))
        if not lockstep:
            continue
        cost, which = step.cost()
        if cost > 0:
            total += steps * cost
            n_steps += steps
            if steps * cost > largest:
                cut, largest = which, steps * cost
    if lockstep:
        return SendBound(total + model.step_overhead * n_steps + model.call_overhead, cut)
    cost, cut = whole.cost()
    return SendBound(cost + model.call_overhead, cut)
