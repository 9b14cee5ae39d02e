"""Fault sets a machine can have, by class, grouped into orbits of the machine's symmetries.

A *fault set* is what fails at once: directed links (a cable is both directions of one
connection) and ranks. A class enumerates every fault set of one shape on a machine:

* ``link`` -- every single cable (both directions of one connection) among the usable links;
* ``link-pairs`` -- every two cables;
* ``rank`` -- every single rank of the collective's group;
* ``cable`` -- on a fabric, every network cable (InfiniBand or Ethernet links);
* ``nic`` -- on a fabric, every NIC (all of its links).

An automorphism ``g`` of the machine and collective (:mod:`cclc.synth.symmetry` on a torus:
translations, reflections and permutations of alike dimensions; the powers of
:func:`cclc.synth.fabric_symmetry.find_free_automorphism` on a fabric) maps a fault set ``F``
onto ``g(F)``, and a schedule for ``F`` onto a schedule for ``g(F)`` with every rank ``r``
relabeled ``g(r)`` (:mod:`cclc.catalog.relabel`): the fault sets of one orbit need one
compiled schedule. Every member records the element that maps its orbit's representative
onto it.

>>> from cclc.collective import CollectiveKind, make_collective
>>> from cclc.topology import torus
>>> t = torus("t", (4, 4))
>>> coll = make_collective("a", CollectiveKind.ALLTOALL, t, tuple(range(16)), size=16 * 64)
>>> orbits = fault_orbits(coll, "link")
>>> len(orbits.members), orbits.n_orbits      # 32 cables, alike by symmetry
(32, 1)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cclc.collective import Collective
from cclc.errors import CclError
from cclc.synth.fabric_symmetry import find_free_automorphism
from cclc.topology import LinkKind, Topology

__all__ = ["CLASSES", "MAX_MEMBERS", "FaultOrbits", "FaultSet", "Member", "cables",
           "fault_orbits", "fault_sets", "link_maps", "symmetry_maps"]

#: the classes :func:`fault_sets` knows, in the order ``--help`` lists them
CLASSES = ("link", "rank", "link-pairs", "cable", "nic")

#: the most fault sets one class may have: each orbit costs one compile (tens of seconds on a
#: 5x5x5 torus) and a large class has many orbits (two of 375 cables: 70 125 members)
MAX_MEMBERS = 5000


@dataclass(frozen=True, slots=True)
class FaultSet:
    """Directed links and ranks that fail together (each sorted, without repeats)."""

    links: tuple[int, ...] = ()
    ranks: tuple[int, ...] = ()

    def describe(self, topo: Topology) -> str:
        """``"0->1, 1->0"`` or ``"rank 5"``: for messages and reports."""
        parts = [topo.link_name(link) for link in self.links]
        parts += [f"rank {topo.vertex_names[r]}" for r in self.ranks]
        return ", ".join(parts) or "no fault"


@dataclass(frozen=True, eq=False)
class Member:
    """One fault set of a class: its orbit and the automorphism (a vertex map, ``vertex[v]``
    is the image of vertex ``v``) that maps the orbit's representative onto it."""

    faults: FaultSet
    orbit: int
    vertex: np.ndarray


@dataclass(frozen=True, eq=False)
class FaultOrbits:
    """Every member of one class and the representative (first member) of each orbit."""

    fault_class: str
    members: tuple[Member, ...]
    representatives: tuple[FaultSet, ...]
    group_order: int

    @property
    def n_orbits(self) -> int:
        return len(self.representatives)


def cables(topo: Topology, kinds: tuple[LinkKind, ...] | None = None) -> list[tuple[int, ...]]:
    """Every usable connection as its directed links (``(l,)`` or ``(l, reverse)``), by
    smallest link id; ``kinds`` keeps the links of those kinds only."""
    usable = ~topo.link_failed
    out: list[tuple[int, ...]] = []
    for link in np.flatnonzero(usable).tolist():
        if kinds is not None and LinkKind(int(topo.link_kind[link])) not in kinds:
            continue
        back = topo.link_id(int(topo.link_dst[link]), int(topo.link_src[link]))
        if back is not None and usable[back] and back < link:
            continue        # listed with its reverse
        out.append((link,) if back is None or not usable[back] else (link, back))
    return out


def _nics(topo: Topology) -> list[int]:
    """NIC vertices: a vertex that is not a rank, reached over PCIe and cabled to the network."""
    kind = topo.link_kind
    net = np.isin(kind, (LinkKind.IB, LinkKind.ETH))
    pcie_in = set(topo.link_dst[kind == LinkKind.PCIE].tolist())
    cabled = set(topo.link_src[net].tolist())
    return sorted(v for v in pcie_in & cabled if v >= topo.n_ranks)


def fault_sets(coll: Collective, fault_class: str) -> list[FaultSet]:
    """Every fault set of ``fault_class`` on ``coll``'s machine (links the file already failed
    are not counted again); :class:`CclError` for a class the machine does not have."""
    topo = coll.topology
    if fault_class == "link":
        return [FaultSet(tuple(sorted(c))) for c in cables(topo)]
    if fault_class == "link-pairs":
        each = cables(topo)
        count = len(each) * (len(each) - 1) // 2
        if count > MAX_MEMBERS:
            raise CclError(f"--faults link-pairs: {topo.name} has {len(each)} cables, so "
                           f"{count} pairs of failed cables, more than the {MAX_MEMBERS} a "
                           "catalog takes (each orbit is one compile); use --faults link")
        return [FaultSet(tuple(sorted(a + b))) for i, a in enumerate(each)
                for b in each[i + 1:]]
    if fault_class == "rank":
        return [FaultSet(ranks=(int(r),)) for r in coll.group]
    if fault_class == "cable":
        if topo.kind != "fabric":
            raise CclError(f"--faults cable is for fabrics: {topo.name} is a {topo.kind_name}, "
                           "whose cables are its links (use --faults link)")
        return [FaultSet(tuple(sorted(c))) for c in cables(topo, (LinkKind.IB, LinkKind.ETH))]
    if fault_class == "nic":
        nics = _nics(topo) if topo.kind == "fabric" else []
        if not nics:
            raise CclError(f"--faults nic: {topo.name} ({topo.kind_name}) has no NICs; NICs "
                           "exist on fabrics whose node type declares them (nic 8 x 400 Gb/s)")
        usable = ~topo.link_failed
        return [FaultSet(tuple(np.flatnonzero(usable & ((topo.link_src == v)
                                                         | (topo.link_dst == v))).tolist()))
                for v in nics]
    raise CclError(f"unknown fault class '{fault_class}'; known: {', '.join(CLASSES)}")


def symmetry_maps(coll: Collective) -> np.ndarray:
    """The automorphisms of ``coll`` on its machine as it is (its declared faults included),
    one vertex map per row, the identity first: the torus group of
    :func:`cclc.synth.symmetry.automorphisms`, or on a fabric the powers of one free
    automorphism; those that fix the root of a rooted collective."""
    # cclc.synth.symmetry only when this runs, not for cclc --help
    from cclc.synth.symmetry import automorphisms

    topo = coll.topology
    usable = ~topo.link_failed
    if topo.dims is not None:
        maps = automorphisms(coll, usable).vertex
    else:
        maps = np.arange(topo.n_vertices, dtype=np.int64)[None, :]
        perm = find_free_automorphism(topo, coll.group) if topo.kind == "fabric" else None
        if perm is not None:
            powers = [maps[0]]
            while True:
                nxt = perm[powers[-1]]
                if np.array_equal(nxt, maps[0]):
                    break
                powers.append(nxt)
            maps = np.stack(powers)
    if coll.root is not None:
        root = coll.group[coll.root]
        maps = maps[maps[:, root] == root]
    return np.ascontiguousarray(maps, dtype=np.int64)


def link_maps(topo: Topology, maps: np.ndarray) -> np.ndarray:
    """``out[g, l]``: the link that link ``l`` goes to under vertex map ``maps[g]`` (every
    map must be an automorphism of the links: :class:`CclError` otherwise)."""
    V = topo.n_vertices
    src, dst = topo.link_src.astype(np.int64), topo.link_dst.astype(np.int64)
    keys = src * V + dst
    order = np.argsort(keys, kind="stable")
    image = maps[:, src] * V + maps[:, dst]
    at = np.minimum(np.searchsorted(keys[order], image), len(keys) - 1)
    if not (keys[order][at] == image).all():
        raise CclError("internal error: a symmetry maps a link onto no link")
    return order[at]


def fault_orbits(coll: Collective, fault_class: str) -> FaultOrbits:
    """The fault sets of ``fault_class`` grouped into orbits of :func:`symmetry_maps`."""
    sets = fault_sets(coll, fault_class)
    if len(sets) > MAX_MEMBERS:
        raise CclError(f"--faults {fault_class}: {len(sets)} fault sets, more than the "
                       f"{MAX_MEMBERS} a catalog takes")
    maps = symmetry_maps(coll)
    lmap = link_maps(coll.topology, maps)
    index = {s: i for i, s in enumerate(sets)}
    found: list[Member | None] = [None] * len(sets)
    reps: list[FaultSet] = []
    for i, rep in enumerate(sets):
        if found[i] is not None:
            continue
        orbit = len(reps)
        reps.append(rep)
        links = np.sort(lmap[:, list(rep.links)], axis=1) if rep.links \
            else np.zeros((len(maps), 0), dtype=np.int64)
        ranks = np.sort(maps[:, list(rep.ranks)], axis=1) if rep.ranks \
            else np.zeros((len(maps), 0), dtype=np.int64)
        for g in range(len(maps)):
            j = index.get(FaultSet(tuple(links[g].tolist()), tuple(ranks[g].tolist())))
            if j is not None and found[j] is None:
                found[j] = Member(sets[j], orbit, maps[g])
    members = tuple(m for m in found if m is not None)
    return FaultOrbits(fault_class, members, tuple(reps), len(maps))
