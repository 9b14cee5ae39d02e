"""A C++/CUDA library that runs a schedule on stock NCCL, and the same code over MPI.

``emit(schedule, outdir, options)`` writes, in ``outdir/nccl-<name>/``:

* ``cclc_exec.h``: the table types shared by both builds;
* ``cclc_<name>_schedule.h``: the schedule as per-rank dataflow tables (plain arrays; see
  :mod:`backends.nccl.tables`);
* ``cclc_<name>.h`` / ``cclc_<name>.cu``: the NCCL entry point ``cclc_<name>(sendbuf, recvbuf,
  count, datatype, comm, stream)`` and CUDA reduction kernels;
* ``cclc_<name>_mpi.h`` / ``cclc_<name>_mpi.cc`` / ``cclc_<name>_mpi_main.cc``: the MPI entry
  point on host memory and a file-in/file-out test driver;
* ``cclc_<name>_perf.h`` / ``cclc_<name>_perf.cu`` / ``cclc_<name>_mpi_perf.cc``: nccl-tests-
  style drivers (sizes, time, algbw, busbw, #wrong; the runtime's own collective beside);
* ``Makefile``: ``make`` builds ``libcclc_<name>.so`` with nvcc (warnings are errors) against
  the NCCL of the ``nvidia-nccl-cu13`` wheel; ``make mpi`` builds the MPI driver; ``make perf``
  and ``make mpiperf`` the measurement drivers.

:data:`BACKEND` declares and renders them; with ``options.build`` its build step makes the library
(and with ``options.mpi`` the MPI driver too) after the pipeline wrote the sources.
"""

from __future__ import annotations

import pathlib
import textwrap

import numpy as np

from backends.common import (
    EmitOptions,
    c_identifier,
    count_convention,
    is_padded,
    padded_count,
    render_template,
)
from backends.contract import Backend, Facts
from backends.nccl.build import TARGET_FILES, BuildError, build, cuda_home, nccl_home
from backends.nccl.tables import DataflowTables, dataflow_tables, table_lane_cost
from backends.units import UnitFacts, buffer_units, to_units, units_refusal
from backends.write import write_backend
from cclc.collective import REDUCING_KINDS, Collective, CollectiveKind, DType
from cclc.dataflow import MAX_LANES
from cclc.errors import ScheduleError
from cclc.execution import NCCL_MODEL, NCCL_ONESIDED_MODEL, ExecutionModel
from cclc.ir import Schedule
from cclc.lane_cost import (
    DEFAULT_LANE_MEMORY,
    P2P_RECV_BYTES,
    P2P_SEND_BYTES,
    LaneChoice,
    LaneCost,
    choose_lanes,
    lane_floor_refusal,
)

__all__ = ["APIS", "BACKEND", "ONESIDED", "SECONDS_PER_OP", "NcclBackend", "emit",
           "lane_cost_lines",
           "render_sources", "source_names"]

_PKG = "backends.nccl"


def render_sources(schedule: Schedule, options: EmitOptions | None = None,
                   lane_memory: int = DEFAULT_LANE_MEMORY, api: str = "lanes",
                   catalog: tuple[str, ...] = ()) -> dict[str, str]:
    """File name -> text of every generated source (nothing is written).

    ``api`` ``"lanes"``: the lanes are chosen under ``lane_memory`` bytes of NCCL buffers per
    rank (:func:`cclc.lane_cost.choose_lanes`; :class:`~cclc.errors.ScheduleError` when even
    one lane does not fit). ``"onesided"``: the same tables run on NCCL's one-sided API (and
    MPI's) on the caller's communicator alone; the lanes only order the tables. ``catalog``:
    the catalog's extra headers (:mod:`backends.nccl.catalog`), which the entry points then
    include to run the schedule selected for a fault set (lanes form only)."""
    if api not in APIS:
        raise ScheduleError(f"unknown NCCL library form '{api}': choose one of "
                            + ", ".join(APIS))
    if catalog and api != "lanes":
        raise ScheduleError("a fault catalog is carried by the lanes form of the NCCL library "
                            f"only, not the {api} form")
    options = options or EmitOptions()
    coll = schedule.collective
    ident = c_identifier(coll.name)
    choice = choose_lanes(schedule, lane_memory) if api == "lanes" else None
    tables = dataflow_tables(schedule, *to_units(schedule, split=True, pad=True),
                             max_lanes=choice.max_lanes if choice else MAX_LANES)
    cost = lane_cost_lines(table_lane_cost(tables, choice.lane_ctas), choice) if choice else \
        _onesided_lines(tables)
    us, unit_counts = tables.facts, buffer_units(tables.units)
    padded = is_padded(schedule)
    meaning = count_convention(coll.kind)
    pad_note: list[str] = []
    if padded:
        # a non-uniform alltoall: one count cannot say what each pair sends
        meaning = "elements of the largest buffer of any rank (see below)"
        pad_note = textwrap.wrap(
            f"Non-uniform alltoall: with u = count / {us.count_units} elements, every rank's "
            f"sendbuf holds {unit_counts[0]} u and recvbuf {unit_counts[1]} u elements; rank i's "
            "block for (from) member j lies where the .ccl size matrix puts it (blocks in "
            "group order, packed from the start, sizes scaled by count / compiled count) and "
            "the rest of each buffer is padding, never read or written.", 92)
    rows, first, dep_lines = table_text(tables)
    algorithm = schedule.algorithm + (f"+{schedule.schedule}" if schedule.schedule != "-" else "")
    reducing = coll.kind in REDUCING_KINDS
    common = {"name": coll.name, "ident": ident, "ident_upper": ident.upper(),
              "kind": coll.kind.value, "n": coll.n, "count_units": us.count_units,
              "count_meaning": meaning, "op": coll.op.value,
              "split": us.split, "catalog": bool(catalog),
              "catalog_headers": "".join(f" {h}" for h in catalog)}
    try:
        home = nccl_home(options)
    except BuildError:  # the wheel is optional: the Makefile still takes NCCL_HOME=...
        home = "/path/to/nccl"
    return {
        "cclc_exec.h": render_template(_PKG, "cclc_exec.h.j2"),
        f"cclc_{ident}_schedule.h": render_template(
            _PKG, "schedule.h.j2", **common, size=coll.size, dtype=coll.dtype.value,
            algorithm=algorithm, entries=rows, first=first,
            deps=dep_lines, n_lanes=tables.n_lanes, n_local=tables.n_local,
            units=", ".join(map(str, unit_counts)), staging_units=tables.staging_units,
            input_copy=int(tables.input_copy), reducing=int(reducing),
            lane_ctas=choice.lane_ctas if choice else 1, cost=cost),
        f"cclc_{ident}.h": render_template(
            _PKG, "api.h.j2", **common, pad_note=pad_note,
            reduce_note=(f" and for data types the {coll.op.value} reduction does not support"
                         if reducing else ""), onesided=api == "onesided"),
        f"cclc_{ident}.cu": render_template(_PKG, _FORMS[api][0], **common),
        f"cclc_{ident}_mpi.h": render_template(_PKG, "mpi.h.j2", **common),
        f"cclc_{ident}_mpi.cc": render_template(_PKG, _FORMS[api][1], **common),
        f"cclc_{ident}_mpi_main.cc": render_template(
            _PKG, "mpi_main.cc.j2", **common, in_units=unit_counts[0],
            out_units=unit_counts[1]),
        **_perf_sources(schedule, common, us, unit_counts, algorithm),
        "Makefile": render_template(_PKG, "Makefile.j2", **common, nccl_home=home,
                                    cuda_home=cuda_home(), cuda_arch=options.cuda_arch,
                                    onesided=api == "onesided"),
        **({"cclc_onesided.h": render_template(_PKG, "cclc_onesided.h.j2")}
           if api == "onesided" else {}),
    }


#: the library's forms: its NCCL source's and its MPI source's templates
_FORMS = {"lanes": ("nccl.cu.j2", "mpi.cc.j2"),
          "onesided": ("onesided.cu.j2", "mpi_onesided.cc.j2")}
#: the forms, by the name :func:`render_sources` takes
APIS = tuple(_FORMS)


def _onesided_lines(tables: DataflowTables) -> list[str]:
    """The header's account of what the one-sided form makes and allocates on each rank."""
    rank_entries = np.diff(tables.first)
    return textwrap.wrap(
        "One-sided form: no communicator besides the caller's, no stream besides the "
        "caller's, no CUDA event; on each rank one symmetric window per call size (input, "
        "output, scratch and staging), and at most "
        f"{int(rank_entries.max()) if len(rank_entries) else 0} entries run one after "
        "another, each message a credit signal, a put and a data signal.", 92)


def lane_cost_lines(cost: LaneCost, choice: LaneChoice) -> list[str]:
    """The header's account of what the library makes and allocates on each rank."""
    mib = 2 ** 20
    return textwrap.wrap(
        f"On each rank (the most loaded one) the first call makes {cost.communicators} "
        f"communicators with ncclCommSplit (one per lane, {cost.lane_ctas} CTAs each), "
        f"{cost.streams} CUDA streams and {cost.events} CUDA events, and NCCL connects "
        f"{cost.sends} (peer, lane) pairs it sends to and {cost.recvs} it receives from, "
        f"{cost.connection_setups} connection setups in all; NCCL 2.30's P2P buffers for them: "
        f"about {cost.device_bytes / mib:.0f} MiB (estimate: {P2P_SEND_BYTES // mib} MiB per "
        f"channel sent on, {P2P_RECV_BYTES // mib} MiB per channel received on), under the "
        f"budget of {choice.budget / mib:.0f} MiB.", 92)


def table_text(tables: DataflowTables) -> tuple[list[str], str, list[str]]:
    """The C table's entry rows (with each entry's first edge last), the per-rank first
    entries and the edge lines (16 a line), printed from the columns: one format per row."""
    n_rows = len(tables.rows)
    full = np.concatenate([tables.rows, tables.dep_first[:-1, None]], axis=1)
    fmt = ", ".join(["%d"] * full.shape[1])
    rows = [fmt % tuple(r) for r in full.tolist()]
    n_deps = int(tables.dep_first[-1]) if n_rows else 0
    # a sentinel row ends the last entry's edges; no rank's range reaches it
    rows.append(f"-1, 0, 0, 0, 0, 0, 0, 0, 0, -1, -1, 0, 1, 0, {n_deps}")
    deps = tables.deps.tolist() + [0]          # the 0 keeps the array non-empty
    line = " ".join(["%d,"] * 16)
    dep_lines = [line % tuple(deps[i:i + 16]) if i + 16 <= len(deps) else
                 " ".join(f"{d}," for d in deps[i:]) for i in range(0, len(deps), 16)]
    return rows, ", ".join(map(str, tables.first.tolist())), dep_lines


#: ncclDataType_t's numbers, which both builds take
_NCCL_TYPE = {DType.INT8: 0, DType.UINT8: 1, DType.INT32: 2, DType.UINT32: 3, DType.INT64: 4,
              DType.UINT64: 5, DType.FP16: 6, DType.FP32: 7, DType.FP64: 8, DType.BF16: 9}
#: the runtimes' own collective that the perf drivers time beside cclc's
_NATIVE = {CollectiveKind.ALLTOALL: ("AllToAll (grouped ncclSend/ncclRecv)", "Alltoallv"),
           CollectiveKind.ALLGATHER: ("AllGather", "Allgather"),
           CollectiveKind.REDUCESCATTER: ("ReduceScatter", "Reduce_scatter_block"),
           CollectiveKind.ALLREDUCE: ("AllReduce", "Allreduce"),
           CollectiveKind.BROADCAST: ("Broadcast", "Bcast"),
           CollectiveKind.REDUCE: ("Reduce", "Reduce")}


def _perf_sources(schedule: Schedule, common: dict, us: UnitFacts,
                  unit_counts: tuple[int, int, int], algorithm: str) -> dict[str, str]:
    """The nccl-tests-style drivers (``make perf`` and ``make mpiperf``) and their header."""
    coll = schedule.collective
    ident = common["ident"]
    reducing = coll.kind in REDUCING_KINDS
    pair_units = [0]
    padded = is_padded(schedule)
    if padded:
        # blocks in units of count / count_units: elements * count_units / compiled count
        assert coll.pair_sizes is not None          # a padded alltoall has per-pair sizes
        compiled = padded_count(schedule)
        elems = coll.pair_sizes // coll.dtype.itemsize
        pair_units = [int(x) * us.count_units // compiled for x in elems.ravel()]
        assert all(int(x) * us.count_units % compiled == 0 for x in elems.ravel())
    nccl_name, mpi_name = _NATIVE[coll.kind]
    values = {**common, "perf_kind": coll.kind.name,
              "root": coll.root if coll.kind in (CollectiveKind.BROADCAST,
                                                 CollectiveKind.REDUCE) else -1,
              "perf_op": coll.op.name if reducing else "kNoOp",
              "perf_op_name": coll.op.value if reducing else "none",
              "dtype_code": _NCCL_TYPE[coll.dtype], "in_units": unit_counts[0],
              "out_units": unit_counts[1], "padded": "true" if padded else "false",
              "pair_units": ", ".join(map(str, pair_units)), "algorithm": algorithm,
              "nccl_collective": nccl_name, "mpi_collective": mpi_name}
    return {f"cclc_{ident}_perf.h": render_template(_PKG, "perf.h.j2", **values),
            f"cclc_{ident}_perf.cu": render_template(_PKG, "perf.cu.j2", **values),
            f"cclc_{ident}_mpi_perf.cc": render_template(_PKG, "mpi_perf.cc.j2", **values)}


def source_names(ident: str, api: str = "lanes") -> tuple[str, ...]:
    """The files :func:`render_sources` renders for the C identifier ``ident``."""
    return (*(("cclc_onesided.h",) if api == "onesided" else ()),
            "cclc_exec.h", f"cclc_{ident}_schedule.h", f"cclc_{ident}.h", f"cclc_{ident}.cu",
            f"cclc_{ident}_mpi.h", f"cclc_{ident}_mpi.cc", f"cclc_{ident}_mpi_main.cc",
            f"cclc_{ident}_perf.h", f"cclc_{ident}_perf.cu", f"cclc_{ident}_mpi_perf.cc",
            "Makefile")


def _targets(options: EmitOptions) -> list[str]:
    return (["all"] if options.build else []) + (["mpi"] if options.mpi else [])


#: what rendering a schedule's tables and sources costs per op, by library form: lanes 40 us,
#: one-sided 33 us (CPU seconds rendering hgx16_leafspine's `shards`, `hierarchical`'s 262,272
#: ops, on the two-core machine beside other work)
SECONDS_PER_OP = {"lanes": 40e-6, "onesided": 33e-6}


class NcclBackend:
    """The C++/CUDA library (and its MPI variant) in ``<name>-<collective>/``: ``nccl``, the
    lanes form, or ``nccl-onesided``, the one-sided form (``api``, one of :data:`APIS`).
    ``name`` is what ``--emit`` takes and the prefix of the output folder."""

    wants_simulation = False
    renders_symmetric = False
    own_nics = False
    execution_model: ExecutionModel | None = NCCL_MODEL

    def __init__(self, api: str = "lanes") -> None:
        if api not in APIS:
            raise ScheduleError(f"unknown NCCL library form '{api}': choose one of "
                                + ", ".join(APIS))
        self.api = api
        self.name = "nccl" if api == "lanes" else f"nccl-{api}"
        self.execution_model = NCCL_MODEL if api == "lanes" else NCCL_ONESIDED_MODEL
        self.seconds_per_op = SECONDS_PER_OP[api]

    def files(self, key: Collective, options: EmitOptions) -> tuple[str, ...]:
        ident = c_identifier(key.name)
        built = [TARGET_FILES[t].format(ident=ident) for t in _targets(options)]
        return tuple(f"{self.name}-{ident}/{name}"
                     for name in (*source_names(ident, self.api), *built))

    def render(self, subject: Schedule, options: EmitOptions, facts: Facts
               ) -> dict[str, str | bytes]:
        sub = f"{self.name}-{c_identifier(subject.collective.name)}"
        budget = self._budget(options, facts)
        return {f"{sub}/{name}": text
                for name, text in render_sources(subject, options, budget, self.api).items()}

    def refusal(self, subject: Schedule, options: EmitOptions) -> str | None:
        """The library has no limit on steps, threadblocks or chunks that a schedule could
        exceed; its tables, counted in equal units, can be more than cclc builds
        (:func:`~backends.units.units_refusal`), and the lanes form cannot hold the
        connections of a schedule whose pairs of ranks alone need more NCCL buffers than the
        lane budget (``options.nccl_lane_memory``;
        :func:`~cclc.lane_cost.lane_floor_refusal`), which :meth:`render` would find."""
        why = units_refusal(subject)
        if why is None and self.api == "lanes":
            why = lane_floor_refusal(subject, self._budget(options))
        return why

    @staticmethod
    def _budget(options: EmitOptions, facts: Facts | None = None) -> int:
        """The lane budget asked for, else the one the planner priced the lanes with (when
        it priced with the nccl model), else the default."""
        if options.nccl_lane_memory is not None:
            return options.nccl_lane_memory
        if facts is not None and facts.model is not None and facts.model.lane_memory is not None:
            return facts.model.lane_memory
        return DEFAULT_LANE_MEMORY

    def build(self, folder: pathlib.Path, key: Collective, options: EmitOptions) -> list[str]:
        targets = _targets(options)
        if not targets:
            return []
        sub = f"{self.name}-{c_identifier(key.name)}"
        return [f"{sub}/{path.name}" for path in build(folder / sub, targets, options)]


BACKEND: Backend[Collective, Schedule] = NcclBackend()


ONESIDED: Backend[Collective, Schedule] = NcclBackend("onesided")


def emit(schedule: Schedule, outdir, options: EmitOptions | None = None, api: str = "lanes"
         ) -> list[pathlib.Path]:
    """Write the sources into ``outdir/nccl-<name>/`` (``api`` ``"onesided"``:
    ``outdir/nccl-onesided-<name>/``) through the pipeline's writer (and build them if
    ``options.build``); return the paths, the built files last."""
    backend = ONESIDED if api == "onesided" else BACKEND
    return write_backend(backend, schedule.collective, schedule, outdir, options)
