"""What a solved AllToAll flow is, whoever solved it: weighted paths per pair over the usable
links, within the packer's limits.

:mod:`cclc.synth.flows` (the path LP) and :mod:`cclc.synth.routed` (a routed flow cut into
paths, for LPs too large to solve) both produce a :class:`FlowSolution`;
:mod:`cclc.synth.alltoall` packs it into steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.sparse import csr_matrix

from cclc.collective import Collective

__all__ = ["LONG_SHARE", "MAX_PATHS", "MIN_SHARE", "FlowSolution", "group_connected",
           "pair_bytes", "usable_links"]

#: paths per pair handed to the packer, and the smallest share kept (of the pair's largest):
#: the packer's own limits (:mod:`cclc.synth.alltoall`), so that it drops nothing
MAX_PATHS = 4
MIN_SHARE = 0.05
#: a path longer than every path holding at least this share of its pair's largest is dropped
#: too (its share moved like the others'): stray long paths from the pricing rounds would set
#: the step count of the whole schedule
LONG_SHARE = 0.5


@dataclass(frozen=True, eq=False)
class FlowSolution:
    """The LP's weighted paths for every commodity (all ranks, translations applied).

    ``src``/``dst`` (group indices), ``weight`` (fraction of the pair's bytes) and ``path``
    (global link ids) per path; ``lp_time`` the LP optimum in seconds (a lower bound on any
    schedule over the usable links when ``status == "optimal"``); ``status`` "optimal" or
    "budget" (pricing stopped by the time budget: the paths are feasible, the time may not be
    the optimum) or "routed" (the paths of a routed flow, :mod:`cclc.synth.routed`, and
    ``lp_time`` a certified lower bound on the LP's optimum); ``rounds`` pricing rounds (routing
    passes); ``symmetry`` the order of the group solved over;
    ``solve_s``/``cpu_s`` the wall clock and CPU time (this process) of the solve.
    """

    src: np.ndarray
    dst: np.ndarray
    weight: np.ndarray
    path: tuple[tuple[int, ...], ...]
    lp_time: float
    status: str
    rounds: int
    symmetry: int
    solve_s: float
    cpu_s: float = 0.0


def usable_links(coll: Collective) -> np.ndarray:
    """Links a schedule of ``coll`` may use: healthy, and every rank they touch in the group."""
    topo = coll.topology
    is_rank = np.zeros(topo.n_vertices, dtype=bool)
    is_rank[:topo.n_ranks] = True
    member = np.zeros(topo.n_vertices, dtype=bool)
    member[list(coll.group)] = True
    ends_ok = lambda v: member[v] | ~is_rank[v]  # noqa: E731 - switches forward for anyone
    return ~topo.link_failed & ends_ok(topo.link_src) & ends_ok(topo.link_dst)


def group_connected(coll: Collective) -> bool:
    """Whether every rank of the group reaches every other over usable links (relaying only
    through members of the group and switches)."""
    # scipy.sparse (~0.2 s to import) only when this runs: importing the module needs no scipy
    from scipy.sparse.csgraph import connected_components

    topo = coll.topology
    ok = usable_links(coll)
    V = topo.n_vertices
    g = csr_matrix((np.ones(int(ok.sum())), (topo.link_src[ok], topo.link_dst[ok])),
                   shape=(V, V))
    _, label = connected_components(g, directed=True, connection="strong")
    return len(set(label[list(coll.group)].tolist())) == 1


def pair_bytes(coll: Collective) -> np.ndarray:
    """``(n, n)`` bytes rank ``s`` sends rank ``j`` (the diagonal stays local)."""
    n = coll.n
    if coll.pair_sizes is not None:
        return np.asarray(coll.pair_sizes, dtype=np.float64)
    return np.full((n, n), coll.size / n)
