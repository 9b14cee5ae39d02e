"""The NCCL library (and its MPI build) of a fault catalog: every schedule, and the switch.

``cclc catalog ... --emit nccl`` writes ``nccl-<name>/`` as ``cclc compile --emit nccl`` does
for the machine as compiled (schedule 0), plus:

* ``cclc_<name>_s<k>_tables.h``: the dataflow tables of schedule ``k`` of the catalog;
* ``cclc_<name>_catalog.h``: every schedule's tables, the members (fault set as connections,
  schedule, rank permutation) and the selection: ``cclc_<name>_select_faults(comm, links, n)``
  (``cclc_<name>_mpi_select_faults`` in the MPI build) and ``CCLC_FAULTS`` at the first call;
* ``cclc_<name>_catalog_check.cc``: ``make catalogcheck`` builds a tool that prints what a
  fault set selects (every rank's messages) and how long selecting takes, without MPI or GPU.

Every schedule is cut at rank blocks first (:func:`cclc.catalog.relabel.split_at_blocks`), so
that relabeling an entry is a lookup per offset: a rank block is a fixed number of units in
every schedule's tables (``kBlockUnits``).

:data:`BACKEND` follows :class:`backends.contract.Backend` with the catalog as key and subject
(its files depend on the number of schedules).
"""

from __future__ import annotations

import pathlib

import numpy as np

from backends.common import EmitOptions, c_identifier, render_template
from backends.contract import Backend, Facts
from backends.nccl import (
    SECONDS_PER_OP,
    NcclBackend,
    lane_cost_lines,
    render_sources,
    table_text,
)
from backends.nccl.tables import dataflow_tables, table_lane_cost
from backends.units import buffer_units, to_units
from backends.write import write_backend
from cclc.catalog.build import Catalog, perm_of
from cclc.catalog.faultsets import cables
from cclc.catalog.relabel import RANK_BUFFERS, split_at_blocks
from cclc.collective import REDUCING_KINDS
from cclc.errors import CclError
from cclc.execution import NCCL_MODEL, ExecutionModel
from cclc.lane_cost import DEFAULT_LANE_MEMORY, choose_lanes

__all__ = ["BACKEND", "CatalogNcclBackend", "catalog_sources", "write_catalog_library"]

_PKG = "backends.nccl"


def _lines(values: list[int], per_line: int = 16) -> list[str]:
    """C initializer lines of ``per_line`` values (one 0 when empty: C++ arrays are never
    empty)."""
    values = values or [0]
    return [", ".join(map(str, values[i:i + per_line])) + ","
            for i in range(0, len(values), per_line)]


def _block_units(units, kind) -> list[int]:
    """Units of one rank's block in each buffer of a unit schedule (0: not rank-indexed)."""
    n = units.n
    widths = buffer_units(units)
    out = [0, 0, 0]
    for buf in RANK_BUFFERS[kind] if n > 1 else ():
        if widths[buf] % n:
            raise CclError(f"the {buf.name.lower()} buffer's units do not split into {n} "
                           "rank blocks: the library cannot relabel them")
        out[buf] = widths[buf] // n
    return out


def catalog_sources(catalog: Catalog, options: EmitOptions | None = None) -> dict[str, str]:
    """File name (inside ``nccl-<name>/``) -> text of the catalog library's sources."""
    options = options or EmitOptions()
    coll = catalog.collective
    ident = c_identifier(coll.name)
    if any(f.ranks for o in catalog.classes for m in o.members for f in (m.faults,)):
        raise CclError("a catalog with lost ranks: the library's communicator keeps its "
                       f"{coll.n} ranks, so it cannot serve them")
    head = catalog.schedules[0]
    if head.plan is None:
        raise CclError(f"the machine as compiled has no schedule: {head.error}")
    extra = [k for k, e in enumerate(catalog.schedules) if k and e.plan is not None]
    names = [f"cclc_{ident}_catalog.h"] + [f"cclc_{ident}_s{k}_tables.h" for k in extra]
    out = render_sources(split_at_blocks(head.plan.schedule), options, catalog=tuple(names))
    out[f"cclc_{ident}_catalog_check.cc"] = render_template(_PKG, "catalog_check.cc.j2",
                                                            name=coll.name, ident=ident)
    block_units = [_block_units(to_units(split_at_blocks(head.plan.schedule), split=True,
                                         pad=True)[0], coll.kind)]
    for k in range(1, len(catalog.schedules)):
        entry = catalog.schedules[k]
        if entry.plan is None:
            block_units.append([0, 0, 0])
            continue
        cut = split_at_blocks(entry.plan.schedule)
        units, facts = to_units(cut, split=True, pad=True)
        # each schedule's lanes under the same budget as the compiled one's (the library
        # makes its lane communicators anew when it switches)
        choice = choose_lanes(cut, DEFAULT_LANE_MEMORY)
        tables = dataflow_tables(cut, units, facts, max_lanes=choice.max_lanes)
        block_units.append(_block_units(tables.units, coll.kind))
        sub = f"{ident}_s{k}"
        rows, first, dep_lines = table_text(tables)
        out[f"cclc_{sub}_tables.h"] = render_template(
            _PKG, "schedule.h.j2", name=f"{coll.name} (catalog schedule {k})", ident=sub,
            ident_upper=sub.upper(), kind=coll.kind.value, n=coll.n, size=coll.size,
            dtype=coll.dtype.value, algorithm=entry.plan.name, entries=rows, first=first,
            deps=dep_lines, n_lanes=tables.n_lanes, n_local=tables.n_local,
            count_units=facts.count_units, split=facts.split,
            units=", ".join(map(str, buffer_units(tables.units))),
            staging_units=tables.staging_units, input_copy=int(tables.input_copy),
            reducing=int(coll.kind in REDUCING_KINDS), lane_ctas=choice.lane_ctas,
            cost=lane_cost_lines(table_lane_cost(tables, choice.lane_ctas), choice))
    out[f"cclc_{ident}_catalog.h"] = _catalog_header(catalog, ident, block_units)
    return out


def _catalog_header(catalog: Catalog, ident: str, block_units: list[list[int]]) -> str:
    coll = catalog.collective
    topo = coll.topology
    connection = np.full(topo.n_links, -1, dtype=np.int64)
    for c in cables(topo):
        connection[list(c)] = min(c)
    schedules: list[int] = []
    key_first: list[int] = [0]
    keys: list[int] = []
    perms: list[int] = []
    for ci, orbits in enumerate(catalog.classes):
        for k, m in enumerate(orbits.members):
            index = catalog.schedule_of(ci, m.orbit)
            served = catalog.schedules[index].plan is not None
            schedules.append(index if served else -1)
            keys += sorted({int(connection[link]) for link in m.faults.links})
            key_first.append(len(keys))
            perms += perm_of(catalog, ci, k).tolist() if served else list(range(coll.n))
    plans = [f"&cclc_{ident}_plan"] + [
        f"&cclc_{ident}_s{k}_plan" if e.plan is not None else "nullptr"
        for k, e in enumerate(catalog.schedules) if k]
    return render_template(
        _PKG, "catalog.h.j2", name=coll.name, ident=ident, ident_upper=ident.upper(),
        kind=coll.kind.value, n=coll.n, topology=topo.name,
        n_schedules=len(catalog.schedules), n_members=len(schedules),
        classes=", ".join(o.fault_class for o in catalog.classes) or "no class",
        extra=[k for k, e in enumerate(catalog.schedules) if k and e.plan is not None],
        plans=plans, block_units=[", ".join(map(str, b)) for b in block_units],
        n_links=topo.n_links, connection=_lines(connection.tolist()),
        member_schedule=", ".join(map(str, schedules or [0])),
        key_first=", ".join(map(str, key_first)), keys=_lines(keys), perms=_lines(perms))


class CatalogNcclBackend:
    """The catalog's library in ``nccl-<name>/``: the key and subject are the catalog."""

    name = "nccl"
    wants_simulation = False
    renders_symmetric = False
    own_nics = False
    #: every schedule of the catalog was planned and priced as the library's
    execution_model: ExecutionModel | None = NCCL_MODEL
    #: the tables of every schedule, as the library's (:data:`backends.nccl.SECONDS_PER_OP`)
    seconds_per_op = SECONDS_PER_OP["lanes"]

    def refusal(self, subject: Catalog, options: EmitOptions) -> str | None:
        """The library takes every catalog the command lets through (lost ranks are refused
        before planning, by ``cclc catalog``)."""
        return None

    def files(self, key: Catalog, options: EmitOptions) -> tuple[str, ...]:
        ident = c_identifier(key.collective.name)
        extra = [f"cclc_{ident}_catalog.h", f"cclc_{ident}_catalog_check.cc"] + [
            f"cclc_{ident}_s{k}_tables.h" for k, e in enumerate(key.schedules)
            if k and e.plan is not None]
        return NcclBackend().files(key.collective, options) + tuple(
            f"nccl-{ident}/{name}" for name in extra)

    def render(self, subject: Catalog, options: EmitOptions, facts: Facts
               ) -> dict[str, str | bytes]:
        sub = f"nccl-{c_identifier(subject.collective.name)}"
        return {f"{sub}/{name}": text
                for name, text in catalog_sources(subject, options).items()}

    def build(self, folder: pathlib.Path, key: Catalog, options: EmitOptions) -> list[str]:
        return NcclBackend().build(folder, key.collective, options)


BACKEND: Backend[Catalog, Catalog] = CatalogNcclBackend()


def write_catalog_library(catalog: Catalog, out, options: EmitOptions | None = None
                          ) -> list[str]:
    """Write (and with ``options.build``/``mpi`` build) the catalog's library into the
    :class:`~cclc.outdir.OutputDir` ``out``; returns the names written."""
    options = options or EmitOptions()
    paths = write_backend(BACKEND, catalog, catalog, out, options)
    return [str(pathlib.Path(p).relative_to(out.path)) for p in paths]

