"""Compile a catalog: one verified schedule per orbit of fault sets, and its document.

:func:`build_catalog` plans the healthy machine and the representative of every orbit the
classes asked for (:func:`cclc.catalog.faultsets.fault_orbits`) with :func:`cclc.plan.plan`,
the planner ``auto`` runs (every schedule it returns passed the verifier); every member of an
orbit is served by its representative's schedule relabeled (:mod:`cclc.catalog.relabel`).
A member's lower bound is its representative's: an automorphism maps the machine with one
fault set onto the machine with the other, and every bound of :mod:`cclc.bounds` is a function
of the machine alone, so the % of bound of a member is its representative's.

:func:`catalog_document` is the catalog file (format ``cclc-catalog``, version 1): the
schedules by orbit, each stored once (their documents are separate files), and the members as
(fault set, orbit within its class, schedule, rank permutation ``perm``: member rank
``perm[q]`` runs what rank ``q`` runs in the stored schedule).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from cclc.catalog.faultsets import FaultOrbits, FaultSet, fault_orbits
from cclc.catalog.relabel import group_map, relabel, split_at_blocks
from cclc.collective import Collective, CollectiveKind, make_collective
from cclc.errors import CclError
from cclc.execution import IR_MODEL, ExecutionModel
from cclc.ir import Schedule
from cclc.plan import Plan, plan
from cclc.topology import with_faults

__all__ = ["FORMAT", "VERSION", "Catalog", "Compiled", "build_catalog", "catalog_document",
           "faulted", "member_schedule", "perm_of", "schedule_file"]

FORMAT = "cclc-catalog"
VERSION = 1

#: kinds whose size grows with the group (a rank's block stays): a lost rank shrinks them
_PER_RANK_SIZE = (CollectiveKind.ALLTOALL, CollectiveKind.ALLGATHER,
                  CollectiveKind.REDUCESCATTER)


@dataclass(frozen=True, eq=False)
class Compiled:
    """One schedule of the catalog: the fault set it was compiled for (the representative of
    its orbit; no fault for the healthy machine), its plan, or why none serves it."""

    faults: FaultSet
    collective: Collective | None
    plan: Plan | None
    error: str | None
    seconds: float


@dataclass(frozen=True, eq=False)
class Catalog:
    """The healthy machine's schedule (``schedules[0]``), one per orbit of every class (the
    orbits of ``classes[c]`` are ``schedules[first[c] + k]``), and the time it all took."""

    collective: Collective
    classes: tuple[FaultOrbits, ...]
    schedules: tuple[Compiled, ...]
    first: tuple[int, ...]
    seconds: float

    def schedule_of(self, class_index: int, orbit: int) -> int:
        """The index in :attr:`schedules` that serves ``orbit`` of ``classes[class_index]``."""
        return self.first[class_index] + orbit

    def member_pcts(self) -> list[float]:
        """% of bound of every served member (its representative's, by symmetry)."""
        out = []
        for c, orbits in enumerate(self.classes):
            for m in orbits.members:
                p = self.schedules[self.schedule_of(c, m.orbit)].plan
                if p is not None and p.pct_of_bound is not None:
                    out.append(p.pct_of_bound)
        return out

    def summary(self) -> dict:
        """Classes, members, schedules compiled, time, worst and median % of bound."""
        pcts = self.member_pcts()
        return {
            "classes": [o.fault_class for o in self.classes],
            "members": sum(len(o.members) for o in self.classes),
            "orbits": sum(o.n_orbits for o in self.classes),
            "schedules_compiled": len(self.schedules),
            "unserved": sum(self.schedules[self.schedule_of(c, m.orbit)].plan is None
                            for c, o in enumerate(self.classes) for m in o.members),
            "seconds": round(self.seconds, 3),
            "worst_pct_of_bound": round(min(pcts), 3) if pcts else None,
            "median_pct_of_bound": round(statistics.median(pcts), 3) if pcts else None,
        }


def faulted(coll: Collective, faults: FaultSet) -> Collective:
    """``coll`` on its machine with ``faults`` failed; a failed rank leaves the group, and an
    alltoall, allgather or reducescatter keeps each rank's block (the size shrinks by one
    block). :class:`CclError` when the root fails."""
    topo = coll.topology
    pairs = [(int(topo.link_src[link]), int(topo.link_dst[link])) for link in faults.links]
    broken = with_faults(topo, links=pairs, ranks=faults.ranks)
    if not faults.ranks:
        return make_collective(coll.name, coll.kind, broken, coll.group, size=coll.size,
                               dtype=coll.dtype, op=coll.op, root=coll.root,
                               algorithm=coll.algorithm, schedule=coll.schedule,
                               pair_sizes=coll.pair_sizes, span=coll.span)
    if coll.pair_sizes is not None:
        raise CclError(f"collective '{coll.name}' has per-pair sizes: a lost rank leaves no "
                       "size matrix for the others")
    group = tuple(r for r in coll.group if r not in faults.ranks)
    root = None
    if coll.root is not None:
        if coll.group[coll.root] in faults.ranks:
            raise CclError(f"the root of '{coll.name}' fails")
        root = group.index(coll.group[coll.root])
    size = coll.size // coll.n * len(group) if coll.kind in _PER_RANK_SIZE else coll.size
    return make_collective(coll.name, coll.kind, broken, group, size=size, dtype=coll.dtype,
                           op=coll.op, root=root, algorithm=coll.algorithm,
                           schedule=coll.schedule, span=coll.span)


def build_catalog(coll: Collective, classes: tuple[str, ...],
                  model: ExecutionModel = IR_MODEL,
                  refusal: Callable[[Schedule], str | None] | None = None,
                  on_step: Callable[[int, int, str], None] | None = None,
                  emit_seconds_per_op: float = 0.0) -> Catalog:
    """The catalog of ``coll`` for the fault ``classes`` (names of
    :data:`cclc.catalog.faultsets.CLASSES`), every schedule planned under ``model``
    (``refusal`` and ``emit_seconds_per_op``: as :func:`cclc.plan.plan` takes them).
    ``on_step(i, total, what)`` is told before each compile. :class:`CclError` for a class
    the machine does not have."""
    started = time.perf_counter()
    if coll.pair_sizes is not None:
        raise CclError(f"collective '{coll.name}' has per-pair sizes; a catalog moves whole "
                       "rank blocks, which needs every pair alike")
    found = tuple(fault_orbits(coll, c) for c in dict.fromkeys(classes))
    todo = [FaultSet()] + [rep for o in found for rep in o.representatives]
    first, at = [], 1
    for o in found:
        first.append(at)
        at += o.n_orbits
    step = on_step or (lambda i, total, what: None)
    compiled = []
    for i, faults in enumerate(todo):
        step(i, len(todo), f"{faults.describe(coll.topology)}")
        t0 = time.perf_counter()
        try:
            target = faulted(coll, faults)
            p = plan(target, model=model, refusal=refusal,
                     emit_seconds_per_op=emit_seconds_per_op)
            compiled.append(Compiled(faults, target, p, None, time.perf_counter() - t0))
        except CclError as err:
            # a fault set no schedule serves (a disconnected group, a lost root): the library
            # answers it with an error, the others are still served
            compiled.append(Compiled(faults, None, None, err.message, time.perf_counter() - t0))
    return Catalog(coll, found, tuple(compiled), tuple(first), time.perf_counter() - started)


def member_schedule(catalog: Catalog, class_index: int, member: int) -> Schedule:
    """The schedule that serves one member: its orbit's schedule relabeled (for checks; the
    runtimes relabel their tables instead). :class:`CclError` when none serves it."""
    m = catalog.classes[class_index].members[member]
    entry = catalog.schedules[catalog.schedule_of(class_index, m.orbit)]
    if entry.plan is None:
        raise CclError(f"no schedule serves {m.faults.describe(catalog.collective.topology)}: "
                       f"{entry.error}")
    return relabel(split_at_blocks(entry.plan.schedule), faulted(catalog.collective, m.faults),
                   m.vertex)


def schedule_file(name: str, index: int) -> str:
    """The file (in the output folder) of schedule ``index`` of the catalog of ``name``."""
    return f"{name}.catalog/schedule{index}.schedule.json"


def catalog_document(catalog: Catalog) -> dict:
    """The catalog file's content (see the module docstring)."""
    coll = catalog.collective
    schedules = []
    for i, entry in enumerate(catalog.schedules):
        row: dict = {"id": i, "faults": _faults_json(entry.faults),
                     "seconds": round(entry.seconds, 3)}
        if entry.plan is None:
            row["error"] = entry.error
        else:
            p = entry.plan
            row.update({"file": schedule_file(coll.name, i), "algorithm": p.name,
                        "time": p.time, "model": p.model.name, "bound": p.bound,
                        "pct_of_bound": p.pct_of_bound, "ops": len(p.schedule.ops)})
        schedules.append(row)
    members = []
    for c, orbits in enumerate(catalog.classes):
        for k, m in enumerate(orbits.members):
            index = catalog.schedule_of(c, m.orbit)
            row = {"class": orbits.fault_class, "faults": _faults_json(m.faults),
                   "orbit": m.orbit, "schedule": index}
            if catalog.schedules[index].collective is not None:
                row["perm"] = perm_of(catalog, c, k).tolist()
            members.append(row)
    return {
        "format": FORMAT, "version": VERSION, "collective": coll.name,
        "kind": coll.kind.value, "topology": coll.topology.name, "ranks": coll.n,
        "classes": [{"class": o.fault_class, "members": len(o.members),
                     "orbits": o.n_orbits, "symmetries": o.group_order}
                    for o in catalog.classes],
        "summary": catalog.summary(),
        "bound_note": "each member's bound equals its orbit representative's: an automorphism "
                      "maps one machine onto the other",
        "schedules": schedules,
        "members": members,
    }


def _faults_json(faults: FaultSet) -> dict:
    return {"links": list(faults.links), "ranks": list(faults.ranks)}


def perm_of(catalog: Catalog, class_index: int, member: int) -> np.ndarray:
    """Member ``member``'s rank permutation (see the module docstring)."""
    m = catalog.classes[class_index].members[member]
    entry = catalog.schedules[catalog.schedule_of(class_index, m.orbit)]
    if entry.collective is None:
        raise CclError("no schedule serves this member")
    return group_map(entry.collective, faulted(catalog.collective, m.faults), m.vertex)
