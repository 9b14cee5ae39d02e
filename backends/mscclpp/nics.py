"""Which NIC MSCCL++ sends a rank's port channels through, and the schedules whose routes take
another.

MSCCL++'s executor connects every port channel of rank ``r`` to a peer on another server
through one InfiniBand device, ``IBs[r % nranksPerNode]`` (``executor.cc``,
``Executor::Impl::setupConnections``, at the commit of :mod:`backends.mscclpp.limits`): device
``r % nranksPerNode`` in the order the host lists them, or as ``MSCCLPP_HCA_DEVICES`` names
them (``ib.cc``, ``getIBDeviceName``), and the peer's end is the peer's own device. It takes
two ranks to share a server when ``r // nranksPerNode`` is equal (``useIB``). The data leaves
the GPU's memory straight through that device: no other GPU relays it, as NCCL's PXN does
(over NVLink to a GPU on the destination's rail, then that GPU's NIC).

A schedule's cross-server op runs in MSCCL++ as the IR prices it only where its route does
the same: it leaves through NIC ``r % k`` of its server (``k`` members per server, NIC ``i``
of a server read as its ``i``-th IB device), arrives through the destination's NIC ``r' %
k``, and passes through no GPU between them. Elsewhere MSCCL++ would take another path than
the one verified and timed, and where a GPU's NIC failed it would send through the failed
NIC: :func:`nic_refusal` says why, and the output refuses the schedule. With this output in
``--emit`` the planner builds such routes where it can (:mod:`cclc.own_nics`, and relays of a
GPU without its NIC through a server mate), so what is refused is what no route fixes.
"""

from __future__ import annotations

import numpy as np

from backends.mscclpp.limits import COMMIT, REPOSITORY
from cclc.errors import TopologyError
from cclc.ir import Schedule, csr_take
from cclc.routing import through_ranks

__all__ = ["nic_refusal"]

def nic_refusal(schedule: Schedule) -> str | None:
    """Why MSCCL++ would not send ``schedule``'s ops between servers over the routes it
    verified and timed (see the module docstring), or ``None``: always ``None`` off a fabric
    of servers, or where no op crosses servers."""
    topo = schedule.topology
    if topo.kind != "fabric" or topo.node_of_rank is None:
        return None
    group = np.asarray(schedule.collective.group, dtype=np.int64)
    server = topo.node_of_rank[group]
    ops = schedule.ops
    cross = np.flatnonzero(server[ops.src] != server[ops.dst])
    if not len(cross):
        return None
    where = f"executor.cc setupConnections, {REPOSITORY} {COMMIT[:7]}"
    # members per server, contiguous in the group's order, as r // nranksPerNode assumes
    starts = np.flatnonzero(np.diff(server, prepend=-1) != 0)
    sizes = np.diff(np.append(starts, len(group)))
    k = int(sizes[0])
    apart = len(np.unique(server[starts])) != len(starts)
    if (sizes != k).any() or apart:
        counts = ", ".join(str(n) for n in sorted(set(sizes.tolist())))
        return (f"MSCCL++ takes ranks r and r' to share a server when r // nranksPerNode = "
                f"r' // nranksPerNode ({where}), which needs as many members on every server, "
                "each server's members one after another in the group; "
                + ("a server's members are apart in this group" if apart
                   else f"this group has servers of {counts} members"))
    names = topo.vertex_names
    index = np.arange(len(group)) % k
    device = np.array([_nic(topo, int(server[a]), int(index[a])) for a in range(len(group))],
                      dtype=np.int64)
    ends = np.unique(np.concatenate([ops.src[cross], ops.dst[cross]]))
    if (device[ends] < 0).any():
        bare = int(ends[device[ends] < 0][0])
        return (f"MSCCL++ sends rank {bare}'s port channels through IB device {index[bare]} of "
                f"its server ({where}: IBs[rank % nranksPerNode], {k} members per server), and "
                f"{names[group[bare]].split('.')[0]} has no nic{index[bare]}")
    routes, first_op = np.unique(ops.route[cross], return_index=True)
    off, links = csr_take(schedule.routes.offsets, schedule.routes.links, routes)
    heads = topo.link_dst[links]
    nic = topo.nic_nodes()[heads] >= 0
    row = np.repeat(np.arange(len(routes)), np.diff(off))
    # the first and the last NIC of each route, and whether a GPU relays it on the way
    first_nic = np.full(len(routes), -1, dtype=np.int64)
    last_nic = np.full(len(routes), -1, dtype=np.int64)
    at = np.flatnonzero(nic)
    first_nic[row[at][::-1]] = heads[at][::-1]
    last_nic[row[at]] = heads[at]
    relayed = through_ranks(topo, off, links)
    op = cross[first_op]
    a, b = ops.src[op].astype(np.int64), ops.dst[op].astype(np.int64)
    bad = np.flatnonzero(relayed | (first_nic != device[a]) | (last_nic != device[b]))
    if not len(bad):
        return None
    j = int(bad[0])
    src, dst = int(a[j]), int(b[j])
    failed = [names[v] for v in (device[src], device[dst])
              if topo.link_failed[(topo.link_src == v) | (topo.link_dst == v)].all()]
    how = (f"through {names[first_nic[j]]} and {names[last_nic[j]]}" if first_nic[j] >= 0
           else "through no NIC")
    if relayed[j]:
        how += ", relayed by another GPU on the way (as NCCL's PXN does)"
    return (f"MSCCL++ sends each rank's port channels through one IB device of its server, "
            f"device r % nranksPerNode for rank r ({where}), with no GPU relaying them: "
            f"rank {src}'s op to rank {dst} would leave through {names[device[src]]} and "
            f"arrive through {names[device[dst]]}"
            + (f" ({' and '.join(failed)} failed)" if failed else "")
            + f", where the schedule routes it {how}")


def _nic(topo, server: int, index: int) -> int:
    """NIC ``index`` of ``server`` (the fabric builders name it ``node{server}.nic{index}``),
    -1 where the server has none."""
    try:
        return topo.vertex(f"node{server}.nic{index}")
    except TopologyError:
        return -1
