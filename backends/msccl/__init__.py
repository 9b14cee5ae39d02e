"""MSCCL-IR XML for microsoft/msccl, the msccl executor for NCCL, and RCCL.

:data:`BACKEND` renders ``<name>.<runtime>.xml`` and, beside it, ``<name>.<runtime>.report.md``: the
conditions under which the runtime would silently ignore the file, and how to load it
(``emit(schedule, outdir, options)`` writes both through the pipeline's writer). The lowering itself
is in :mod:`backends.msccl.lower`; the runtimes' spellings and limits in
:mod:`backends.msccl.runtimes`; an independent executor of the XML, used by the tests, in
:mod:`backends.msccl.executor`.
"""

from __future__ import annotations

import pathlib

from backends.common import (
    EmitOptions,
    RecentLowerings,
    c_identifier,
    entry_count,
    render_template,
)
from backends.contract import Backend, Contents, Facts
from backends.msccl.lower import Lowered, chunks_limit_message, counted_refusal, lower_to_fit
from backends.msccl.runtimes import Runtime, runtime_named
from backends.msccl.xml import xml_pieces
from backends.units import UnitFacts, buffer_units, units_refusal, writes_input
from backends.write import write_backend
from cclc.collective import Collective, CollectiveKind
from cclc.errors import NotExpressible, ScheduleError
from cclc.execution import MSCCL_MODEL, ExecutionModel
from cclc.ir import Buf, Schedule

__all__ = ["BACKEND", "MscclBackend", "emit", "render_xml"]


def _nchunksperloop(schedule: Schedule, units: tuple[int, int, int]) -> int:
    """The runtime checks i_chunks*mult == nchunksperloop (mult = nRanks for allgather input)
    and o_chunks*mult == nchunksperloop (mult = nRanks for reduce_scatter output)."""
    kind, n = schedule.collective.kind, schedule.n
    i_mult = n if kind is CollectiveKind.ALLGATHER else 1
    o_mult = n if kind is CollectiveKind.REDUCESCATTER else 1
    total = units[Buf.INPUT] * i_mult
    if units[Buf.OUTPUT] * o_mult != total:
        raise ScheduleError(f"input ({units[Buf.INPUT]} chunks) and output "
                            f"({units[Buf.OUTPUT]} chunks) do not describe one {kind.value} "
                            "buffer as MSCCL expects")
    return total


def _prepared(schedule: Schedule, options: EmitOptions
              ) -> tuple[list[tuple[str, object]], dict, Lowered, Runtime]:
    """The ``<algo>`` attributes, the facts the report needs, the lowering and the runtime."""
    rt = runtime_named(options.msccl_runtime)
    coll = schedule.collective
    if coll.kind not in rt.coll_names:
        raise NotExpressible(f"{rt.title} has no {coll.kind.value} collective")
    low, units, facts = _lowered(schedule, rt, options)
    nchunks = _nchunksperloop(schedule, buffer_units(units))
    name = _algo_name(coll, rt)
    min_bytes = options.min_bytes or 0
    max_bytes = _max_bytes(schedule, rt, options)
    if max_bytes != rt.unbounded_max_bytes and min_bytes > max_bytes:
        raise ScheduleError(f"minBytes ({min_bytes}) is above maxBytes ({max_bytes}); "
                            f"{rt.title} refuses such a file")
    algo: list[tuple[str, object]] = [
        ("name", name), ("proto", options.protocol), ("nchannels", low.nchannels),
        ("nchunksperloop", nchunks), ("ngpus", schedule.n),
        ("coll", rt.coll_names[coll.kind]), ("inplace", 0)]
    if rt.needs_outofplace:
        algo.append(("outofplace", 1))
    algo += [("minBytes", min_bytes), ("maxBytes", max_bytes)]
    if options.nthreads is not None:
        algo.append(("nthreads", options.nthreads))
    meta = {"name": name, "nchunks": nchunks, "unit": facts.unit, "exact": facts.exact,
            "falls_back": bool(entry_count(schedule) % facts.count_units),
            "min_bytes": min_bytes, "max_bytes": max_bytes,
            "writes_input": writes_input(units)}
    return algo, meta, low, rt


def _max_bytes(schedule: Schedule, rt: Runtime, options: EmitOptions) -> int:
    """``maxBytes``: the user's (``--msccl-max-bytes``), else the compiled size, the size the
    schedule was chosen and simulated for. All three runtimes measure a call as the whole
    buffer (count x nRanks for allgather, reduce_scatter and alltoall), which is cclc's
    ``size``. microsoft/msccl takes calls with nBytes < maxBytes and allocates scratch for
    maxBytes at communicator init, so an unbounded window there costs memory (2^40 B asks
    for terabytes); the other two take nBytes <= maxBytes (0: no bound) and size scratch by
    each call."""
    if options.max_bytes is not None:
        if options.max_bytes < 0 or (options.max_bytes == 0 and rt.unbounded_max_bytes != 0):
            least = ">= 0" if rt.unbounded_max_bytes == 0 else "> 0"
            raise ScheduleError(f"maxBytes must be {least} for {rt.title}, not "
                                f"{options.max_bytes}")
        return options.max_bytes
    size = schedule.collective.size
    return size + 1 if rt.max_bytes_exclusive else size


def _scratch_line(schedule: Schedule, rt: Runtime, meta: dict, low: Lowered) -> str:
    """What scratch memory the runtime allocates for this file (per GPU)."""
    s_max = max(low.scratch, default=0)
    nck = meta["nchunks"]
    if s_max == 0:
        return "scratch: none (`s_chunks` is 0 on every GPU)"
    if rt.scratch_at_init:
        at = meta["max_bytes"] * s_max // nck
        return (f"scratch: {rt.title} allocates maxBytes x s_chunks / nchunksperloop = "
                f"{meta['max_bytes']} x {s_max} / {nck} = {_bytes(at)} on the "
                "busiest GPU when the communicator is created (src/init.cc), whether or not "
                "the file is ever used; set `--msccl-max-bytes` to bound it")
    at = schedule.collective.size * s_max // nck
    rounded = ", rounded up to a power of two" if rt.key == "rccl" else ""
    return (f"scratch: {rt.title} allocates nBytes x s_chunks / nchunksperloop at the first "
            f"call of a size{rounded}; at the compiled size {schedule.collective.size} x "
            f"{s_max} / {nck} = {_bytes(at)} on the busiest GPU")


def _bytes(n: int) -> str:
    return f"{n} B" if n < 1 << 20 else f"{n} B ({n / 2**20:.1f} MiB)"


def _root_warning(schedule: Schedule, rt: Runtime) -> str | None:
    coll = schedule.collective
    if coll.kind not in (CollectiveKind.REDUCE, CollectiveKind.BROADCAST):
        return None
    root = coll.root or 0
    return (f"root: this {rt.coll_names[coll.kind]} is compiled for root {root} (rank "
            f"{root} of the communicator). The file does not carry the root and {rt.title} "
            f"does not check the call's root: a call with any other root runs this file "
            f"anyway and silently computes a wrong result. Call it with root={root} only")


def render_xml(schedule: Schedule, options: EmitOptions | None = None) -> str:
    """The XML text for ``options.msccl_runtime`` (raises :class:`ScheduleError` if a runtime
    limit is exceeded)."""
    algo, _, low, _ = _prepared(schedule, options or EmitOptions())
    return "".join(xml_pieces(algo, low))


def _conditions(schedule: Schedule, rt: Runtime, meta: dict, options: EmitOptions) -> list[str]:
    coll = schedule.collective
    item = coll.dtype.itemsize
    upper = ("no upper bound" if meta["max_bytes"] == rt.unbounded_max_bytes
             else f"below {meta['max_bytes']} B" if rt.max_bytes_exclusive
             else f"at most {meta['max_bytes']} B")
    reducing = coll.kind.value in ("allreduce", "reducescatter", "reduce")
    lines = [
        (f"collective: `{rt.coll_names[coll.kind]}` only (an `ncclAllReduce` call does not "
         "use an allgather file, and so on)"),
        f"group size: the communicator has exactly {schedule.n} ranks (`ngpus`)",
        (f"size window: the call's byte count is at least {meta['min_bytes']} B and {upper} "
         "(`minBytes`/`maxBytes`)"),
        (f"count divisibility: the buffer's element count is a multiple of "
         f"{meta['nchunksperloop']} (`nchunksperloop`); at {coll.dtype.value} "
         f"({item} B) that is {meta['nchunksperloop'] * item} B granularity"),
        ("in-place: only out-of-place calls (`sendbuff != recvbuff`); this file has "
         "`inplace=\"0\"`, in-place calls fall back"),
        ("reduction op: sum, prod, min or max (the file does not fix the op; `ncclAvg` and "
         "custom premultiplied ops fall back)") if reducing else
        "reduction op: not used by this collective",
    ]
    if rt.key == "msccl":
        lines += [("`NCCL_ALGO` must allow MSCCL (e.g. `NCCL_ALGO=MSCCL,RING,TREE`); with "
                   "`NCCL_ALGO=TREE` the file is ignored"),
                  ("not inside a group with other collectives (async mode with more than one "
                   "op falls back)"),
                  ("at most 4 files are loaded (`MSCCL_MAX_NUM_ALGOS`); extra ones are "
                   "ignored with a warning")]
    else:
        force = ", and `RCCL_MSCCL_FORCE_ENABLE=1` outside MI300X" if rt.key == "rccl" else ""
        lines += [f"MSCCL must be enabled (`MSCCL_ENABLE=1`{force})", "one GPU per process"]
    return lines


def _algo_name(coll: Collective, rt: Runtime) -> str:
    return c_identifier(coll.name)[:rt.max_name]


def _base(coll: Collective, options: EmitOptions) -> str:
    rt = runtime_named(options.msccl_runtime)
    return f"{_algo_name(coll, rt)}.{rt.key}"


class MscclBackend:
    """MSCCL-IR XML and its report for ``options.msccl_runtime``."""

    name = "msccl"
    wants_simulation = False
    renders_symmetric = False
    own_nics = False
    execution_model: ExecutionModel | None = MSCCL_MODEL
    #: the lowering and the XML: 96 us per op (CPU seconds rendering hgx16_leafspine's
    #: `shards`, `hierarchical`'s 262,272 ops, on the two-core machine beside other work)
    seconds_per_op = 96e-6

    def files(self, key: Collective, options: EmitOptions) -> tuple[str, ...]:
        base = _base(key, options)
        return (f"{base}.xml", f"{base}.report.md")

    def render(self, subject: Schedule, options: EmitOptions, facts: Facts
               ) -> dict[str, Contents]:
        return _render(subject, options)

    def build(self, folder: pathlib.Path, key: Collective, options: EmitOptions) -> list[str]:
        return []

    def refusal(self, subject: Schedule, options: EmitOptions) -> str | None:
        """Why :meth:`render` would refuse ``subject``, found without lowering it: the
        runtime's equal-chunk rule, then the limits that counting the schedule in units shows
        (:func:`backends.msccl.lower.counted_refusal`); None when those fit (limits found only
        while lowering are reported when it renders)."""
        rt = runtime_named(options.msccl_runtime)
        if subject.collective.kind not in rt.coll_names:
            return f"{rt.title} has no {subject.collective.kind.value} collective"
        try:
            why = units_refusal(subject, rt.max_chunks)
            why = (chunks_limit_message(why, rt) if why is not None
                   else counted_refusal(subject, rt))
            if why is None:
                # the limits only the lowering finds (threadblock waits, the runtimes' int8
                # dependency ids): lowered whatever its size, and kept for the render that
                # follows when this candidate wins
                _lowered(subject, rt, options)
        except ScheduleError as err:        # a form MSCCL does not have (no alltoallv)
            return err.message
        return why


#: the candidate ``auto`` asked about and then chose is lowered once
_LOWERINGS: RecentLowerings[tuple[Lowered, Schedule, UnitFacts]] = RecentLowerings()


def _lowered(schedule: Schedule, rt: Runtime, options: EmitOptions
             ) -> tuple[Lowered, Schedule, UnitFacts]:
    return _LOWERINGS.get(
        schedule, (rt.key, options.fuse, options.nchannels),
        lambda: lower_to_fit(schedule, rt, fuse=options.fuse, nchannels=options.nchannels))


BACKEND: Backend[Collective, Schedule] = MscclBackend()


def emit(schedule: Schedule, outdir, options: EmitOptions | None = None) -> list[pathlib.Path]:
    """Write ``<name>.<runtime>.xml`` and ``<name>.<runtime>.report.md`` for
    ``options.msccl_runtime`` into ``outdir`` (a folder or an :class:`~cclc.outdir.OutputDir`)
    through the pipeline's writer; return their paths."""
    return write_backend(BACKEND, schedule.collective, schedule, outdir, options)


def _render(schedule: Schedule, options: EmitOptions) -> dict[str, Contents]:
    algo, meta, low, rt = _prepared(schedule, options)
    base = _base(schedule.collective, options)
    xml_name = f"{base}.xml"
    coll = schedule.collective
    notes = []
    if meta["writes_input"]:
        notes.append("the schedule writes its input buffer; the XML first copies the input "
                     "into scratch so that `sendbuff` is left untouched")
    if not meta["exact"]:
        nck = meta["nchunks"]
        item = coll.dtype.itemsize
        here = ("THIS compiled size is not a multiple of "
                f"{nck} elements and falls back to the runtime's default algorithms"
                if meta["falls_back"] else
                "at the compiled size the runtime cuts equal chunks, not the schedule's "
                "uneven ones (each chunk moves as the schedule says)")
        notes.append(
            f"the schedule cuts its buffers into near-equal chunks (an even split such as "
            f"floor(i * count / K)) at the compiled {coll.size} B; MSCCL chunks are equal, "
            f"so the XML describes this schedule with equal chunks: {here}; calls whose "
            f"buffer is a multiple of {nck} {coll.dtype.value} elements ({nck * item} B) run "
            "it")
    meta["nchunksperloop"] = meta["nchunks"]
    report = render_template(
        "backends.msccl", "report.md.j2", algo_name=meta["name"], runtime_title=rt.title,
        xml_file=xml_name, coll=rt.coll_names[coll.kind], ngpus=schedule.n,
        proto=options.protocol, nchannels=low.nchannels,
        max_tbs=max(len(t) for t in low.tbs),
        max_steps=max((len(tb.steps) for t in low.tbs for tb in t), default=0),
        limit_steps=rt.max_steps_per_tb, n_fused=low.n_fused, schedule_name=coll.name,
        algorithm=f"{schedule.algorithm}+{schedule.schedule}" if schedule.schedule != "-"
        else schedule.algorithm,
        nchunksperloop=meta["nchunks"], compiled_bytes=coll.size,
        chunk_elems=_compiled_chunk_elems(schedule, meta), dtype=coll.dtype.value,
        conditions=_conditions(schedule, rt, meta, options),
        load=[line.format(xml=xml_name) for line in rt.load_env], notes=notes,
        scratch=_scratch_line(schedule, rt, meta, low), root_warning=_root_warning(schedule, rt))
    # the XML is rendered lazily, one <gpu> at a time: the pipeline writes it as it is
    # produced, so a large schedule's file is never held whole in memory
    return {xml_name: xml_pieces(algo, low), f"{base}.report.md": report}


def _compiled_chunk_elems(schedule: Schedule, meta: dict) -> str:
    if meta["exact"]:
        return str(int(meta["unit"]))
    # near-equal units are not whole at the compiled size
    return f"{meta['unit']} to {meta['unit'] + 1} (not equal, see the note below)"
