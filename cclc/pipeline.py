"""The compiler pipeline, from a ``.ccl`` file to the files it emits, stage by stage.

:func:`compile_program` is the whole pipeline in one function; ``cclc compile`` parses its
arguments, calls it and prints what it reports, and the tests and benchmarks call it (or
:func:`compile_source` on text) the same way. The stages, in order:

1. **resolve** -- pick the collectives asked for and look up every algorithm they name
   (:func:`cclc.plan.resolve`), so every mistake in the file or the flags is reported before
   anything is written or any long work starts;
2. **build** -- each candidate algorithm lowers the collective into a
   :class:`~cclc.ir.Schedule` (:mod:`cclc.algorithms`);
3. **route** -- the routing pass (:func:`cclc.fabric_routing.route_spines`) and the relay
   lowering (:func:`cclc.relay.lower_relays`), applied by the algorithm table to every build;
4. **verify** -- the symbolic verifier (:func:`cclc.verify.verify`) on every candidate: a
   schedule that fails is never chosen, and an explicitly named one stops its collective;
5. **measure** -- every candidate's time under the execution model of the first output that
   declares one (:attr:`backends.contract.Backend.execution_model`, :mod:`cclc.execution`)
   against the lower bounds (:mod:`cclc.bounds`); ``auto`` keeps the fastest that every
   output takes (:meth:`backends.contract.Backend.refusal`) (stages 2-5 for all candidates
   are :func:`cclc.plan.plan`);
6. **compare** -- what NCCL would take on the same machine
   (:func:`cclc.nccl_comparison.nccl_comparison`), computed once and handed to the outputs in
   their :class:`~backends.contract.Facts`;
7. **render and write** -- every backend renders its files (:mod:`backends.contract`) and this
   module writes them through :class:`~cclc.outdir.OutputDir`, which never overwrites a file
   cclc did not write; a backend with a build step builds after its sources are written.

The backends are reached by name at call time (:func:`backends.load`): this module and the CLI
are the only parts of ``cclc`` that touch them. Library code: nothing here prints or exits;
what happens is told to an :class:`Events` object.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from backends import load
from backends.contract import EmitOptions, Facts
from backends.write import write_backend, write_outputs
from cclc.algorithms import BuildContext
from cclc.bounds import bounds
from cclc.budget import Limits, available_memory
from cclc.collective import Collective, CollectiveKind, Hint
from cclc.errors import CclError, NotExpressible, ScheduleError
from cclc.execution import model_for, model_reason
from cclc.ir import Schedule
from cclc.outdir import OutputDir
from cclc.plan import Plan, Resolution, plan, resolve
from cclc.sim import simulate as run_sim
from cclc.units import format_time

if TYPE_CHECKING:
    from backends.contract import Backend
    from cclc.execution import ExecutionModel
    from cclc.nccl_comparison import NcclComparison
    from cclc.symmetric_plan import SymmetricPlan
    from dsl import Program

__all__ = [
    "Compiled",
    "Events",
    "Request",
    "compile_program",
    "compile_source",
    "measure",
    "topology_file",
    "write_backend",
    "write_outputs",
]


@dataclass(frozen=True)
class Request:
    """What to compile and emit: the outputs (``--emit``, in order), the collectives (``only``:
    all when empty), an algorithm forced on every collective (``algorithm``: ``"a"`` or
    ``"a+s"``), whether to evaluate every candidate (``explain``), whether to refuse a
    collective too big for the machine up front (``size_check``, :mod:`cclc.budget`), and the
    backends' options (``None``: the defaults)."""

    emit: tuple[str, ...] = ("json",)
    only: tuple[str, ...] = ()
    algorithm: str | None = None
    explain: bool = False
    size_check: bool = True
    options: EmitOptions | None = None
    #: replace files in the output folder that cclc did not write
    force: bool = False
    #: how messages name the source (``'FILE.ccl'``)
    source: str = "the file"
    #: seconds ``synth`` may spend on a collective that names no budget (``None``: its default)
    synth_budget: float | None = None
    #: bytes per rank the NCCL library's lane buffers may take (``None``: ``options``'s, else
    #: the nccl model's default, :data:`cclc.lane_cost.DEFAULT_LANE_MEMORY`); it travels in
    #: the model, which prices the lanes, and in the options, which the output's refusal and
    #: rendering read
    nccl_lane_memory: int | None = None


@dataclass(frozen=True)
class Compiled:
    """One collective's outcome: its ``plan`` (``None`` when the schedule failed verification;
    ``error`` says why), the NCCL comparison line, the files written (names inside the output
    folder) and the outputs it could not take (``(backend, why)``)."""

    collective: Collective
    plan: Plan | None
    error: str | None = None
    nccl: str | None = None
    files: tuple[str, ...] = ()
    missing: tuple[tuple[str, str], ...] = ()
    #: outputs whose format has no form for this collective (``(backend, why)``)
    skipped: tuple[tuple[str, str], ...] = ()
    #: the plan stored by symmetry, where the whole schedule was too large (``plan`` is then
    #: ``None``: nothing failed)
    symmetric: SymmetricPlan | None = None

    @property
    def failed(self) -> bool:
        """Whether the collective's schedule failed verification (no plan of either form)."""
        return self.plan is None and self.symmetric is None


class Events:
    """What the pipeline tells its caller as it goes; every method does nothing here. The CLI
    overrides them to print."""

    @contextmanager
    def stage(self, what: str) -> Iterator[Any]:
        """A stage that may take long; the yielded object takes ``update(i, what, total)``."""
        yield _NoStage()

    def note(self, message: str) -> None:
        """Something the user should know that is not an error."""

    def priced(self, model: ExecutionModel, reason: str) -> None:
        """The outputs asked for chose ``model`` to price every candidate (``reason``: why,
        and what the model would be without them); told once, before any collective."""

    def start(self, coll: Collective) -> None:
        """The pipeline starts on ``coll``."""

    def planned(self, coll: Collective, plan: Plan, nccl: str | None) -> None:
        """``coll`` was planned, verified and measured (before anything is written for it)."""

    def planned_symmetric(self, coll: Collective, plan: SymmetricPlan,
                          whole: Plan | None = None) -> None:
        """``coll`` was planned stored by symmetry (``planned``'s counterpart); ``whole`` is
        the whole plan it was faster than, where one was planned too."""

    def failed(self, coll: Collective, message: str) -> None:
        """``coll``'s schedule failed verification: nothing is written for it."""

    def missing(self, coll: Collective, backend: str, message: str) -> None:
        """``backend`` could not take ``coll``'s schedule; the other outputs are written."""

    def skipped(self, coll: Collective, backend: str, message: str) -> None:
        """``backend``'s format has no form for ``coll`` at all (not a limit); the other
        outputs are written and the compile does not fail for it."""

    def wrote(self, name: str) -> None:
        """The pipeline wrote (or a build made) ``name`` in the output folder."""

    def done(self, coll: Collective) -> None:
        """The pipeline is done with ``coll``."""


class _NoStage:
    def update(self, done: int, detail: str = "", total: int | None = None) -> None:
        pass


def compile_source(text: str, output: str | os.PathLike | OutputDir,
                   request: Request = Request(),
                   events: Events | None = None, filename: str = "<string>"
                   ) -> tuple[Compiled, ...]:
    """:func:`compile_program` on the text of a ``.ccl`` file."""
    # the .ccl front end (lark, ~0.3 s to import) only when a .ccl file is read, not for cclc --help
    import dsl

    return compile_program(dsl.loads(text, filename), output, request, events)


def compile_program(program: Program, output: str | os.PathLike | OutputDir,
                    request: Request = Request(), events: Events | None = None
                    ) -> tuple[Compiled, ...]:
    """Compile every collective of ``program`` that ``request`` asks for into the folder
    ``output`` (created after the names are checked; ``request.force`` applies to a path),
    holding the folder's lock (:class:`~cclc.outdir.OutputDir`) from the foreign-file check to
    the last file written.

    Raises :class:`~cclc.errors.CclError` for what stops the whole run before anything is
    written (a bad name, a file cclc would have to overwrite); a collective whose schedule
    fails verification, or an output a schedule cannot take, is reported in its
    :class:`Compiled` and the rest goes on.
    """
    events = events or Events()
    options = request.options or EmitOptions()
    # one lane budget for the model that prices the lanes and for the NCCL output, whose
    # refusal asks it before anything is rendered
    lane_memory = request.nccl_lane_memory if request.nccl_lane_memory is not None \
        else options.nccl_lane_memory
    options = dataclasses.replace(options, nccl_lane_memory=lane_memory)
    backends = [load(name) for name in request.emit]
    # the outputs decide the execution model that prices the candidates (each runtime pays
    # software costs of its own); a lane budget for a model without lanes is refused first
    model = _with_lane_memory(model_for(backends), lane_memory)

    # 1. resolve: the collectives asked for, each checked against the algorithm table
    if not program.topologies:
        # node types alone compile into nothing: refused before the folder is made
        raise CclError(f"{request.source} declares no topology, so there is nothing to compile "
                       "(add 'topology NAME = torus(4, 4) { link 50 GB/s, 1 us }')")
    collectives = _select(program, request)
    if not collectives:
        events.note(f"{request.source} declares no collective: only its topologies are "
                    "written (add 'collective NAME = KIND on TOPOLOGY { size ... }')")
    resolved = [_resolve(coll, request) for coll in collectives]
    # the collectives too large to plan whole that auto plans stored by symmetry instead, and
    # those it plans both ways
    symmetric, both = (_check_sizes(resolved, model, backends, events) if request.size_check
                       else (frozenset(), frozenset()))

    # the folder stays locked until every file of this run is written: a second run into it
    # is refused at once instead of mixing its files with this one's
    out = output if isinstance(output, OutputDir) else OutputDir(output, force=request.force)
    with out:
        # refuse before any work a file this run would write that cclc did not write: the
        # topologies, and every file each backend declares for each collective
        topologies = _topologies(program, collectives, request)
        out.refuse_foreign([topology_file(name) for name in topologies]
                           + [f for c in collectives for b in backends
                              for f in b.files(c, options)])
        for name, topo in topologies.items():
            with events.stage(f"writing {topology_file(name)}"):
                events.wrote(out.write_text(topology_file(name), _topology_text(topo)))

        # the same file may choose differently under another output's model: say so
        reason = model_reason(backends)
        if reason is not None and collectives:
            events.priced(model, reason)
        results = []
        for coll, resolution in zip(collectives, resolved, strict=True):
            events.start(coll)
            if coll.name in symmetric:
                results.append(_compile_symmetric(coll, model, backends, out, options, events))
                continue
            try:
                # 2-5. build, route, verify and measure every candidate; keep the fastest
                p = _plan(resolution, request, model, _refusal(backends, options),
                          sum(b.seconds_per_op for b in backends), events,
                          any(b.own_nics for b in backends))
            except ScheduleError as err:
                events.failed(coll, err.message)
                results.append(Compiled(coll, None, err.message))
                continue
            sym = _faster_symmetric(coll, p, model, events) if coll.name in both else None
            if sym is not None:
                results.append(_compile_symmetric(coll, model, backends, out, options, events,
                                                  sym, p))
                continue
            # 6. compare with what NCCL would take on the same machine
            comparison = _compare(coll, p)
            nccl = None if comparison is None else comparison.line
            events.planned(coll, p, nccl)
            # 7. render and write every output (the facts the renderers show are measured once)
            facts = measure(p.schedule, p, simulate=any(b.wants_simulation for b in backends),
                            nccl=comparison)
            files, missing, skipped = _write_whole(coll, p, facts, backends, out, options,
                                                   events)
            results.append(Compiled(coll, p, None, nccl, files, missing, skipped))
        return tuple(results)


def _write_whole(coll: Collective, p: Plan, facts: Facts,
                 backends: Sequence[Backend[Any, Any]], out: OutputDir, options: EmitOptions,
                 events: Events) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...],
                                          tuple[tuple[str, str], ...]]:
    """Every output of the whole plan ``p``: see :func:`_write_each`."""
    def write(k: int, backend: Backend[Any, Any]) -> list[str]:
        with events.stage(f"{coll.name}: {backend.name} output of {len(p.schedule.ops)} ops "
                          f"({k + 1} of {len(backends)} outputs)"):
            return write_outputs(backend, coll, p.schedule, out, options, facts)

    return _write_each(coll, backends, write, events)


def _write_each(coll: Collective, backends: Sequence[Backend[Any, Any]],
                write: Callable[[int, Backend[Any, Any]], list[str]], events: Events
                ) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...],
                           tuple[tuple[str, str], ...]]:
    """``write(k, backend)`` for every backend: the files written, the outputs missing
    (backend, why) and those skipped (backend, why), each told to ``events``."""
    files: list[str] = []
    missing: list[tuple[str, str]] = []
    skipped: list[tuple[str, str]] = []
    for k, backend in enumerate(backends):
        try:
            files += write(k, backend)
        except NotExpressible as err:
            # the format has no form for this collective: no schedule would do
            skipped.append((backend.name, err.message))
            events.skipped(coll, backend.name, err.message)
        except CclError as err:
            # one output the schedule cannot take (a runtime limit, a failed build) must not
            # cost the user the others
            missing.append((backend.name, err.message))
            events.missing(coll, backend.name, err.message)
    for name in files:
        events.wrote(name)
    events.done(coll)
    return tuple(files), tuple(missing), tuple(skipped)


# -- the stages --------------------------------------------------------------------------------

def _with_lane_memory(model: ExecutionModel, lane_memory: int | None) -> ExecutionModel:
    """``model`` with the lane memory budget asked for; refused when ``model`` is not the
    dataflow library's (its lanes would not be priced with the budget)."""
    if lane_memory is None:
        return model
    if model.lane_memory is None:
        raise CclError("--nccl-lane-memory needs nccl as the first code-emitting output of "
                       f"--emit (the candidates are priced under the {model.name} model, "
                       "which has no lanes)")
    return dataclasses.replace(model, lane_memory=lane_memory)


def _select(program: Program, request: Request) -> list[Collective]:
    collectives = list(program.collectives)
    if request.only:
        known = {c.name for c in collectives}
        for name in request.only:
            if name not in known:
                raise CclError(f"--only {name}: {request.source} has no collective '{name}'; "
                               f"it has: {', '.join(sorted(known)) or '(none)'}")
        collectives = [c for c in collectives if c.name in request.only]
    if request.algorithm:
        _check_algorithm_flag(request.algorithm)
        collectives = [_override(c, request.algorithm) for c in collectives]
    return collectives


def _override(coll: Collective, name: str) -> Collective:
    algo, _, sched = name.partition("+")
    return dataclasses.replace(coll, algorithm=Hint(algo), schedule=Hint(sched or "auto"))


def _check_algorithm_flag(name: str) -> None:
    # parameters need the file's syntax (units, strings); the flag names an entry only
    if not name or "(" in name or " " in name or name.count("+") > 1:
        raise CclError(f"--algorithm {name!r}: the flag takes a name ('ring') or "
                       "'algorithm+schedule' ('halfring+dimrotation') without parameters; "
                       "write parameters in the file: algorithm pat(buffer = 4 MiB)")


def _resolve(coll: Collective, request: Request) -> Resolution:
    """:func:`cclc.plan.resolve`, once per collective; a name given by ``--algorithm`` is
    reported as a bad flag, not at a line of the file that does not contain it."""
    try:
        return resolve(coll, BuildContext(synth_budget=request.synth_budget))
    except CclError as err:
        if request.algorithm is None:
            raise
        raise CclError(f"--algorithm {request.algorithm}: {err.message}") from None


def _check_sizes(resolved: Sequence[Resolution], model: ExecutionModel,
                 backends: Sequence[Backend[Any, Any]], events: Events
                 ) -> tuple[frozenset[str], frozenset[str]]:
    """Refuse, before writing anything, a collective the machine cannot plan (cclc.budget).
    Returns the names of those ``auto`` plans stored by symmetry instead (cclc.symmetric_plan:
    the ones it can whose estimate is over ``SYMMETRIC_FROM_OPS`` and whose form fits,
    ``form_refusal``), and of those it also plans
    stored by symmetry, to keep whichever form is faster: the smaller ones it can, where the
    candidates are timed under the lockstep model the form is timed under and every output
    takes the form as it is."""
    # cclc.budget, cclc.symmetric_plan only when this runs, not for cclc --help
    from cclc.budget import check_budget, estimate_size, fitting_entries
    from cclc.symmetric_plan import (
        SYMMETRIC_FROM_OPS,
        form_refusal,
        symmetric_model,
        symmetric_reason,
    )

    memory = available_memory()

    def form_reason(r: Resolution) -> str | None:
        # the form has a size check of its own: a long ring or a reduction over 10^5 ranks
        # is too large stored by symmetry too
        return symmetric_reason(r) or form_refusal(r.collective, memory)

    symmetric = set()
    both = set()
    comparable = symmetric_model(model) == model and all(b.renders_symmetric
                                                         for b in backends)
    for r in resolved:
        # every entry serving the collective is a possible way out of a refusal
        est = estimate_size(r.collective, r.entries, r.params, r.serving)
        if est.ops > SYMMETRIC_FROM_OPS:
            why = form_reason(r)
        else:
            why = "small enough"
            if comparable and form_reason(r) is None:
                both.add(r.collective.name)
        if why is None:
            priced = symmetric_model(model)
            events.note(f"{r.collective.name}: its {est.largest} schedule alone has at least "
                        f"{est.ops:.3g} ops; planned stored by symmetry instead (one "
                        "representative op per orbit of the torus's translations)"
                        + (_exceptions_note(r.collective)
                           if r.collective.topology.n_failed_links else "")
                        + ("" if priced == model else f", timed under the {priced.name} "
                           "model: the form has no dataflow simulation"))
            symmetric.add(r.collective.name)
            continue
        try:
            check_budget(est, memory)
        except CclError as err:
            fit = () if r.explicit else fitting_entries(r.collective, r.entries, r.params,
                                                        memory)
            if not fit:
                raise CclError(f"{err.message}; nor can it be stored by symmetry: {why}"
                               ) from None
            # auto: the candidates that fit are planned, the others skipped with their reason
            events.note(f"{r.collective.name}: its {est.largest} schedule alone has at least "
                        f"{est.ops:.3g} ops, over the size limit; auto skips the candidates "
                        f"that do not fit and plans among those that do (among them "
                        f"{', '.join(fit)})")
    return frozenset(symmetric), frozenset(both)


def _exceptions_note(coll: Collective) -> str:
    """What a form stored by symmetry does about ``coll``'s failed links, for the note."""
    if coll.kind is not CollectiveKind.ALLTOALL:
        return ", with the phases of the rings its failed links cut run there as lines"
    return ", with exceptions for the journeys that cross its failed links"


def _faster_symmetric(coll: Collective, whole: Plan, model: ExecutionModel, events: Events
                      ) -> SymmetricPlan | None:
    """``coll`` planned stored by symmetry, where that is faster than ``whole`` (the best
    whole candidate, timed under the same lockstep model), else ``None``; said either way."""
    # cclc.symmetric_plan only when this runs, not for cclc --help
    from cclc.symmetric_plan import plan_symmetric

    try:
        with events.stage(f"{coll.name}: planning stored by symmetry as well") as st:
            # the whole plan's bounds are bounds(coll): not computed a second time
            sym = plan_symmetric(coll, model, on_stage=lambda what: st.update(0, what),
                                 known=whole.bounds)
    except ScheduleError as err:
        events.note(f"{coll.name}: the form stored by symmetry failed ({err.message}); the "
                    "whole schedule is kept")
        return None
    if whole.time is None or sym.time < whole.time:
        than = "" if whole.time is None else f", {format_time(whole.time)}"
        # where the two print alike, by how much (4.6 ns of 600 us on the 8x4x4 example)
        by = ("" if whole.time is None or format_time(whole.time) != format_time(sym.time)
              else f" by {format_time(whole.time - sym.time)}")
        events.note(f"{coll.name}: stored by symmetry ({sym.name}, {format_time(sym.time)}) "
                    f"is faster than the best whole candidate ({whole.name}{than}){by}: kept")
        return sym
    events.note(f"{coll.name}: the best whole candidate ({whole.name}) is no slower than the "
                f"form stored by symmetry ({sym.name}, {format_time(sym.time)}): kept")
    return None


def _compile_symmetric(coll: Collective, model: ExecutionModel,
                       backends: Sequence[Backend[Any, Any]], out: OutputDir,
                       options: EmitOptions, events: Events,
                       planned: SymmetricPlan | None = None, whole: Plan | None = None
                       ) -> Compiled:
    """Plan ``coll`` stored by symmetry (unless ``planned`` already is, faster than the whole
    plan ``whole``) and write every output that takes it: the form itself where the backend
    renders it, else the expanded schedule where it fits the size limit; any other output is
    reported missing with the reason."""
    # cclc.budget, cclc.symmetric* only when this runs, not for cclc --help
    from backends.contract import symmetric_refusal
    from cclc.budget import MAX_OPS
    from cclc.symmetric_plan import expand_form, plan_symmetric

    p = planned
    if p is None:
        try:
            with events.stage(f"{coll.name}: planning stored by symmetry") as st:
                p = plan_symmetric(coll, model, on_stage=lambda what: st.update(0, what))
        except ScheduleError as err:
            events.failed(coll, err.message)
            return Compiled(coll, None, err.message)
    events.planned_symmetric(coll, p, whole)
    facts = Facts(bounds=p.bounds, time=p.time, model=p.model)
    sym = p

    def write(k: int, backend: Backend[Any, Any]) -> list[str]:
        why = symmetric_refusal(backend, sym.schedule, MAX_OPS)
        if why is not None:
            raise CclError(why)
        if backend.renders_symmetric:
            return write_outputs(backend, coll, sym.schedule, out, options, facts)
        expanded = expand_form(sym.schedule)
        why = backend.refusal(expanded, options)
        if why is not None:
            raise CclError(why)
        return write_outputs(backend, coll, expanded, out, options,
                             measure(expanded, simulate=backend.wants_simulation))

    files, missing, skipped = _write_each(coll, backends, write, events)
    return Compiled(coll, None, None, None, files, missing, skipped, symmetric=p)


def _topologies(program: Program, collectives: Sequence[Collective], request: Request) -> dict:
    # with --only, the topologies of the chosen collectives; else every one of the file
    used = {c.topology.name for c in collectives}
    return {name: topo for name, topo in dict(program.topologies).items()
            if not request.only or name in used}


def topology_file(name: str) -> str:
    """The file a topology is written to."""
    return f"topology-{name}.json"


def _topology_text(topo) -> str:
    # cclc.serialize only when this runs, not for cclc --help
    from cclc.serialize import topology_document

    return json.dumps(topology_document(topo), separators=(",", ":"), allow_nan=False) + "\n"


def _plan(resolution: Resolution, request: Request, model: ExecutionModel,
          refusal: Callable[[Schedule], str | None], emit_seconds_per_op: float,
          events: Events, own_nics: bool) -> Plan:
    coll = resolution.collective
    limits = Limits(available_memory()) if request.size_check else None
    with events.stage(f"{coll.name}: planning") as st:
        # the outputs' cost per op bounds the ops of `auto`'s synthesis candidate: the
        # schedule kept is written to every one of them
        return plan(coll, explain=request.explain, model=model,
                    on_step=lambda i, total, what: st.update(i, what, total),
                    refusal=refusal, synth_budget=request.synth_budget,
                    resolution=resolution, emit_seconds_per_op=emit_seconds_per_op,
                    limits=limits, own_nics=own_nics)


def _refusal(backends: Sequence[Backend[Any, Any]], options: EmitOptions
             ) -> Callable[[Schedule], str | None]:
    """Why the requested outputs cannot take a schedule (the first that says), or None: every
    output's :meth:`~backends.contract.Backend.refusal` is asked, so ``auto`` does not choose a
    schedule an output refuses when another one can be written."""
    def refusal(schedule: Schedule) -> str | None:
        for backend in backends:
            why = backend.refusal(schedule, options)
            if why is not None:
                return why
        return None
    return refusal


def _compare(coll: Collective, p: Plan) -> NcclComparison | None:
    # cclc.nccl_comparison only when this runs, not for cclc --help
    from cclc.nccl_comparison import nccl_comparison

    if p.time is None:
        return None
    return nccl_comparison(coll, p.time, software_cost=p.model.charges_software)


def measure(schedule: Schedule, p: Plan | None = None, simulate: bool = True,
            nccl: NcclComparison | None = None) -> Facts:
    """The :class:`~backends.contract.Facts` of ``schedule``: its bounds, time and execution
    model (the plan's, when given: what the compile reports, so no output recomputes them
    differently), with ``simulate`` its lockstep and event-driven simulations, and the
    comparison with NCCL: ``nccl`` (the pipeline's, of the plan's time) or, for a schedule
    without a plan (``cclc viz``), that of its lockstep time."""
    # cclc.nccl_comparison only when this runs, not for cclc --help
    from cclc.nccl_comparison import nccl_comparison

    found = p.bounds if p is not None and p.bounds is not None else bounds(schedule.collective)
    lockstep = run_sim(schedule, mode="lockstep") if simulate else None
    if nccl is None and (p is None or p.time is None) and lockstep is not None:
        # the time a page shows for a schedule without a plan: the lockstep simulation's,
        # which charges no software cost
        nccl = nccl_comparison(schedule.collective, lockstep.time, software_cost=False)
    return Facts(bounds=found, lockstep=lockstep,
                 event=run_sim(schedule, mode="event") if simulate else None,
                 time=p.time if p is not None else None,
                 model=p.model if p is not None else None,
                 candidates=p.candidates if p is not None else (), nccl=nccl)
