"""How fast cclc compiles at hundreds of ranks: the targets of issue 17, and ratios side by side.

Absolute figures (each in a child process, so that its peak resident memory is its own):

* ``auto`` AllToAll on an 8x8x8 torus (50 GB/s, 100 ns links, 512 MiB per rank) with one
  failed link: ``cclc compile --emit json`` wall time, CPU time (user + system) and peak
  memory (target <= 10 s and <= 2 GB);
* ``examples/hgx16_leafspine.ccl`` with ``--emit json,msccl --explain`` (target <= 30 s with
  exit status 0 and every output written), wall and CPU time and peak memory, and the MSCCL
  lowering and XML of its ``shards`` schedule alone (CPU time);
* the LP bound (``cclc.bounds.bounds``) of AllToAll on 5x5x5 and 8x8x8 tori, healthy and with
  one failed link (target <= 60 s each);
* event-mode simulation of a schedule of about 5M ops (target <= 60 s);
* ``auto`` on a 5x5x5x5 torus (625 ranks, 50 GB/s, 100 ns links, link (2,2,2,2)-(3,2,2,2)
  failed): AllToAll of 536,870,000 B (512 MiB rounded down to a multiple of 625 ranks x 4 B)
  and AllReduce of 1 GiB, ``cclc compile --emit json`` (the IR model), and the AllToAll's
  planning under the ``nccl`` model (the model that runs :func:`cclc.dataflow.dataflow_time`;
  planning only: the ``nccl`` emitter's output for 4.9M ops is not part of this row).

Ratios, measured one after the other in the same run (so machine load affects both sides
alike): the columnar event simulator against the op-by-op loop it replaced, the columnar
relay lowering against its loop, the columnar dataflow lowering (the ``nccl`` model's plan)
against its loop, the columnar dataflow run (``cclc.dataflow._run``, what the ``nccl`` model
times) against its loop on the 625-rank MATE schedule, the ``nccl`` backend's per-rank
tables and their C text (a ring AllGather of 1.05M ops) against the op-by-op loop, and
``auto`` with and without pruning by lower bounds. The loops are the references the tests
keep (``tests/sim/event_reference.py``, ``tests/ir/relay_reference.py``,
``tests/sim/dataflow_reference.py``, ``tests/sim/dataflow_run_reference.py``,
``tests/backends/nccl_tables_reference.py``).

    python benchmarks/compile_scale.py                 # everything (several minutes)
    python benchmarks/compile_scale.py --quick         # skip the 8x8x8 LP bounds and 5M ops
    python benchmarks/compile_scale.py --markdown      # also print the README table
    python benchmarks/compile_scale.py --auto-only     # only the 8x8x8 auto compile
    python benchmarks/compile_scale.py --emit-only     # only the emitting rows (hgx16, tables)
    python benchmarks/compile_scale.py --ranks625      # only the 625-rank rows (10 minutes)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GiB = 2 ** 30

TORUS_8_FAULT = """\
topology torus = torus(8, 8, 8) {
    link  50 GB/s, 100 ns
    fault link (2,2,2) -- (3,2,2)
}
collective a2a = alltoall on torus { size 512 MiB }
"""


def machine() -> str:
    """The CPU model, core count and load: the figures mean nothing without them."""
    model = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return f"{model}, {os.cpu_count()} cores, load average {load:.1f} at start"


def _cpu_of_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _child(code: str, timeout: float) -> dict:
    """Run ``code`` in a fresh interpreter; it prints one JSON object last. Adds the child's
    wall time, CPU time (user + system: what the run costs whatever else the machine runs)
    and peak resident memory."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    cpu_before = _cpu_of_children()
    start = time.perf_counter()
    try:
        out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT,
                             capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"over {timeout:.0f} s", "seconds": timeout}
    seconds = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    peak = usage.ru_maxrss
    if out.returncode != 0:
        return {"error": (out.stderr.strip().splitlines() or ["failed"])[-1],
                "seconds": seconds}
    row = json.loads(out.stdout.strip().splitlines()[-1])
    row["seconds"] = seconds
    row["cpu_seconds"] = _cpu_of_children() - cpu_before
    # ru_maxrss of children is the largest child so far: exact when this one set it
    row["peak_bytes"] = peak * 1024 if peak > before else None
    return row


def auto_8x8x8(tmp: Path, timeout: float) -> dict:
    src = tmp / "torus8_fault.ccl"
    src.write_text(TORUS_8_FAULT)
    return _child(f"""
        import json, sys
        from cclc.cli import main
        code = main(["compile", {str(src)!r}, "-o", {str(tmp / "out8")!r}, "--emit", "json",
                     "--force"])
        print(json.dumps({{"exit": code}}))
        """, timeout)


def torus625_text(kind: str) -> str:
    size = "1 GiB" if kind == "allreduce" else "536870000 B"
    return ("topology torus = torus(5, 5, 5, 5) {\n    link  50 GB/s, 100 ns\n"
            "    fault link (2,2,2,2) -- (3,2,2,2)\n}\n"
            f"collective c = {kind} on torus {{ size {size} }}\n")


def auto_625(tmp: Path, kind: str, timeout: float) -> dict:
    """``cclc compile --emit json`` of the 625-rank ``kind``: the IR model's ``auto``."""
    src = tmp / f"torus625_{kind}.ccl"
    src.write_text(torus625_text(kind))
    return _child(f"""
        import json, sys
        from cclc.cli import main
        code = main(["compile", {str(src)!r}, "-o", {str(tmp / ("out625" + kind))!r},
                     "--emit", "json", "--force"])
        print(json.dumps({{"exit": code}}))
        """, timeout)


def plan_625_nccl(tmp: Path, timeout: float) -> dict:
    """``auto``'s planning of the 625-rank AllToAll under the ``nccl`` model (what ``cclc
    compile --emit json,nccl`` does before it emits): every candidate its load bound cannot
    prune is built, verified and timed by the dataflow run."""
    src = tmp / "torus625_nccl.ccl"
    src.write_text(torus625_text("alltoall"))
    return _child(f"""
        import json
        import dsl
        from cclc.execution import NCCL_MODEL
        from cclc.plan import plan
        c = dsl.load({str(src)!r}).collectives[0]
        p = plan(c, model=NCCL_MODEL)
        print(json.dumps({{"chosen": p.name, "time": p.time,
                          "built": sum(r.time is not None for r in p.candidates),
                          "pruned": sum(r.pruned is not None for r in p.candidates)}}))
        """, timeout)


def hgx16_msccl(tmp: Path, timeout: float) -> dict:
    """The README's command, ``cclc compile examples/hgx16_leafspine.ccl --emit json,msccl
    --explain``: its exit status and the outputs it did not write (the target counts only
    with exit 0 and every output of every collective written)."""
    out = tmp / "hgx"
    return _child(f"""
        import contextlib, io, json, pathlib
        import dsl
        from cclc.cli import main
        with contextlib.redirect_stdout(io.StringIO()):
            code = main(["compile", "examples/hgx16_leafspine.ccl", "-o", {str(out)!r},
                         "--emit", "json,msccl", "--explain", "--force"])
        names = [c.name for c in dsl.load("examples/hgx16_leafspine.ccl").collectives]
        want = [f"{{n}}.schedule.json" for n in names] + [f"{{n}}.msccl.xml" for n in names]
        missing = [w for w in want if not (pathlib.Path({str(out)!r}) / w).is_file()]
        print(json.dumps({{"exit": code, "missing": missing}}))
        """, timeout)


def hgx16_shards_lowering(timeout: float) -> dict:
    """The MSCCL lowering and XML of hgx16's ``shards`` (the ReduceScatter that ``auto``
    compiles to ``hierarchical``, 262k ops) alone, in CPU seconds."""
    return _child("""
        import json, time
        import dsl
        from backends.msccl import render_xml
        from cclc.algorithms import get
        prog = dsl.load("examples/hgx16_leafspine.ccl")
        c = next(c for c in prog.collectives if c.name == "shards")
        s = get("hierarchical").build(c)
        start = time.process_time()
        xml = render_xml(s)
        print(json.dumps({"ops": len(s.ops), "lower_cpu": time.process_time() - start,
                          "xml_bytes": len(xml)}))
        """, timeout)


def lp_bound(side: int, fault: bool, timeout: float) -> dict:
    return _child(f"""
        import json, time
        from cclc.bounds import bounds
        from cclc.collective import CollectiveKind, make_collective
        from cclc.topology import torus, with_faults
        t = torus("t", ({side}, {side}, {side}), bandwidth=50e9, latency=1e-7)
        if {fault}:
            a, b = t.rank_at((2, 2, 2)), t.rank_at((3, 2, 2))
            t = with_faults(t, links=[(a, b), (b, a)])
        n = t.n_ranks
        c = make_collective("a", CollectiveKind.ALLTOALL, t, t.all_ranks(), size=n * n * 64)
        start = time.perf_counter()
        b = bounds(c)
        print(json.dumps({{"lp_seconds": time.perf_counter() - start,
                           "has_lp": b.get("lp") is not None, "best": b.name}}))
        """, timeout)


def event_5m(timeout: float) -> dict:
    # a ring allgather on a 2240-rank ring: 2240 x 2239 = 5.0M single-hop ops, 2239 steps
    return _child("""
        import json, time
        from cclc.algorithms import get
        from cclc.collective import CollectiveKind, make_collective
        from cclc.sim import simulate
        from cclc.topology import torus
        t = torus("r", (2240,), bandwidth=50e9, latency=1e-7)
        c = make_collective("ag", CollectiveKind.ALLGATHER, t, t.all_ranks(), size=2240 * 64)
        start = time.perf_counter()
        s = get("ring").build(c)
        built = time.perf_counter() - start
        start = time.perf_counter()
        r = simulate(s, mode="event")
        print(json.dumps({"ops": len(s.ops), "build_seconds": built,
                          "event_seconds": time.perf_counter() - start, "time": r.time}))
        """, timeout)


def side_by_side() -> list[dict]:
    """New against old implementations on the same inputs, in this process."""
    sys.path[:0] = [str(ROOT / "tests" / "sim"), str(ROOT / "tests" / "ir")]
    from event_reference import reference_event
    from relay_reference import reference_lower_relays

    import cclc.algorithms as registry
    from cclc.algorithms import get
    from cclc.collective import CollectiveKind, make_collective
    from cclc.plan import plan
    from cclc.relay import lower_relays
    from cclc.sim import _event, _local_time, prepare
    from cclc.topology import torus, with_faults

    def faulty(dims):
        # a GPU torus (routing none, the language's default): multi-hop moves are relayed
        t = torus("t", dims, bandwidth=50e9, latency=1e-7, routing="none")
        a, b = t.rank_at((1,) * len(dims)), t.rank_at((2,) + (1,) * (len(dims) - 1))
        return with_faults(t, links=[(a, b), (b, a)])

    def timed(fn):
        start = time.perf_counter()
        out = fn()
        return time.perf_counter() - start, out

    rows = []
    t6 = faulty((6, 6, 6))
    c6 = make_collective("a", CollectiveKind.ALLTOALL, t6, t6.all_ranks(), size=216 * 4096)
    orig = registry.lower_relays
    registry.lower_relays = lambda s: s      # the registry's builds end with the relay pass
    try:
        raw = get("direct").build(c6)
    finally:
        registry.lower_relays = orig
    new_s, new = timed(lambda: lower_relays(raw))
    old_s, _ = timed(lambda: reference_lower_relays(raw))
    rows.append({"what": f"relay lowering, direct alltoall 6x6x6 one failed link "
                         f"({len(raw.ops):,} -> {len(new.ops):,} ops)",
                 "new": new_s, "old": old_s})

    p = prepare(new)
    local = _local_time(new, p, None)
    new_s, _ = timed(lambda: _event(new, p, local))
    old_s, _ = timed(lambda: reference_event(new, p, local))
    rows.append({"what": f"event simulation of that schedule ({len(new.ops):,} ops)",
                 "new": new_s, "old": old_s})

    new_s, old_s, n_items = _dataflow_side_by_side()
    rows.append({"what": f"dataflow lowering (the nccl model's plan), MATE 5x5x5 source-routed "
                         f"torus, one failed link ({n_items:,} items)",
                 "new": new_s, "old": old_s})

    rows.append(_dataflow_run_side_by_side())
    rows.append(_nccl_tables_side_by_side())

    t4 = faulty((4, 4, 4))
    c4 = make_collective("a", CollectiveKind.ALLTOALL, t4, t4.all_ranks(), size=64 * 64 * 1024)
    new_s, pruned = timed(lambda: plan(c4))
    old_s, full = timed(lambda: plan(c4, prune=False))
    assert pruned.name == full.name and pruned.time == full.time
    n_pruned = sum(r.pruned is not None for r in pruned.candidates)
    rows.append({"what": f"auto, alltoall 4x4x4 one failed link ({n_pruned} of "
                         f"{sum(r.applicable for r in full.candidates)} candidates pruned, "
                         f"same choice: {pruned.name})",
                 "new": new_s, "old": old_s})
    return rows


def _dataflow_side_by_side() -> tuple[float, float, int]:
    """:func:`cclc.dataflow.lower` against the loop it replaced (``tests/sim``), both given
    the same MATE schedule; they must give the same plan."""
    from dataflow_reference import lower_reference

    from cclc.algorithms.torus_alltoall import build_for_sizes
    from cclc.collective import CollectiveKind, DType, make_collective
    from cclc.dataflow import lower
    from cclc.ir import Buf
    from cclc.relay import lower_relays
    from cclc.sim import dest_counts
    from cclc.topology import torus, with_faults

    t = torus("t", (5, 5, 5), bandwidth=50e9, latency=1e-7, routing="source")
    a, b = t.rank_at((2, 2, 2)), t.rank_at((3, 2, 2))
    t = with_faults(t, links=[(a, b), (b, a)])
    c = make_collective("a", CollectiveKind.ALLTOALL, t, t.all_ranks(), size=125 * 2 ** 22,
                        dtype=DType.UINT8)
    s = lower_relays(build_for_sizes(c, [c.size], "halfring", "mate")[0])
    o = s.ops
    args = (s.n, o.step, o.src, o.dst, o.route, o.kind, o.src_buf, o.src_off, o.dst_buf,
            o.dst_off, o.count, dest_counts(s), tuple(s.n_chunks(b) for b in Buf))
    start = time.perf_counter()
    new = lower(*args)
    mid = time.perf_counter()
    old = lower_reference(*args)
    end = time.perf_counter()
    assert new.items == old.items and new.staging == old.staging
    return mid - start, end - mid, len(new.items)


def _dataflow_run_side_by_side() -> dict:
    """The columnar dataflow run against the loop it replaced (``tests/sim``), both placing
    the plan of the 625-rank MATE schedule (``auto``'s choice there) at the ``nccl`` model's
    overhead; they must give the same time, lanes and groups. CPU seconds of this process."""
    sys.path[:0] = [str(ROOT / "tests" / "sim")]
    from dataflow_run_reference import reference_run

    import dsl
    from cclc.algorithms import get
    from cclc.dataflow import _run, lower
    from cclc.execution import NCCL_GROUP_OVERHEAD
    from cclc.ir import Buf
    from cclc.sim import dest_counts

    c = dsl.loads(torus625_text("alltoall")).collectives[0]
    s = get("mate").build(c)
    o = s.ops
    start = time.process_time()
    plan = lower(s.n, o.step, o.src, o.dst, o.route, o.kind, o.src_buf, o.src_off, o.dst_buf,
                 o.dst_off, o.count, dest_counts(s), tuple(s.n_chunks(b) for b in Buf))
    lowered = time.process_time() - start
    start = time.process_time()
    new = _run(s, plan, NCCL_GROUP_OVERHEAD, place=True)
    mid = time.process_time()
    old = reference_run(s, plan, NCCL_GROUP_OVERHEAD, place=True)
    end = time.process_time()
    assert new[0] == old[0] and (new[1] == old[1]).all() and (new[2] == old[2]).all()
    return {"what": f"dataflow run (the nccl model's time, placing lanes and groups), MATE "
                    f"on the 625-rank torus, one failed link ({len(o):,} items; their plan, "
                    f"not timed here, took {lowered:.1f} s of CPU)",
            "new": mid - start, "old": end - mid}


def _nccl_tables_side_by_side(ranks: int = 1025) -> dict:
    """The ``nccl`` backend's per-rank tables and their C text (columns) against the op-by-op
    loop they replaced (``tests/backends``), both from one dataflow plan, which is not timed:
    a ring AllGather on ``ranks`` ranks, ``ranks x (ranks - 1)`` ops. They must print the
    same text."""
    sys.path[:0] = [str(ROOT / "tests" / "backends")]
    from nccl_tables_reference import reference_entries, reference_rows

    from backends.nccl import table_text
    from backends.nccl.tables import tables_of_plan, unit_plan
    from backends.units import to_units
    from cclc.algorithms import get
    from cclc.collective import CollectiveKind, make_collective
    from cclc.topology import torus

    t = torus("r", (ranks,), bandwidth=50e9, latency=1e-7)
    c = make_collective("ag", CollectiveKind.ALLGATHER, t, t.all_ranks(), size=ranks * 64)
    s = get("ring").build(c)
    units, facts = to_units(s, split=True, pad=True)
    plan = unit_plan(s, units)
    start = time.perf_counter()
    new = table_text(tables_of_plan(plan, units, facts))
    mid = time.perf_counter()
    old = reference_rows(reference_entries(plan, units))
    end = time.perf_counter()
    assert new == old
    return {"what": f"nccl backend's per-rank tables and C text, ring allgather on {ranks} "
                    f"ranks ({len(s.ops):,} ops, {len(new[0]) - 1:,} entries)",
            "new": mid - start, "old": end - mid}


def _fmt(row: dict, key: str = "seconds") -> str:
    if "error" in row:
        return f"failed: {row['error']}"
    return f"{row[key]:.1f} s"


def _targets(results: dict, quick: bool, emit_only: bool = False) -> None:
    """The absolute figures, each in a child process (``emit_only``: only hgx16's)."""
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        if not emit_only:
            row = auto_8x8x8(tmp, 1800)
            peak = row.get("peak_bytes")
            cpu = (f" ({row['cpu_seconds']:.1f} s of CPU, user + system)"
                   if "cpu_seconds" in row else "")
            results["targets"].append({
                "target": "auto alltoall, 8x8x8 torus, one failed link, --emit json: "
                          "<= 10 s, <= 2 GB",
                "figure": _fmt(row) + cpu + (f", {peak / GiB:.2f} GiB peak" if peak else ""),
                "met": "error" not in row and row["seconds"] <= 10 and peak is not None
                and peak <= 2e9})
            print(results["targets"][-1], flush=True)
        row = hgx16_msccl(tmp, 1800)
        peak = row.get("peak_bytes")
        fig = _fmt(row) + ("" if "error" in row else
                           f" wall, {row['cpu_seconds']:.1f} s CPU (user + system)"
                           + (f", {peak / GiB:.2f} GiB peak" if peak else "")
                           + f", exit {row['exit']}"
                           + (f", missing {', '.join(row['missing'])}" if row["missing"]
                              else ", every output written"))
        results["targets"].append({"target": "examples/hgx16_leafspine.ccl --emit json,msccl: "
                                             "<= 30 s",
                                   "figure": fig,
                                   "met": "error" not in row and row["seconds"] <= 30
                                   and row["exit"] == 0 and not row["missing"]})
        print(results["targets"][-1], flush=True)
        row = hgx16_shards_lowering(1800)
        fig = _fmt(row) if "error" in row else (
            f"{row['lower_cpu']:.1f} s CPU for {row['ops']:,} ops "
            f"({row['xml_bytes'] / 2**20:.0f} MiB of XML)")
        results["targets"].append({"target": "of which: MSCCL lowering + XML of shards",
                                   "figure": fig, "met": "-"})
        print(results["targets"][-1], flush=True)
    if emit_only:
        return
    for side in (5,) if quick else (5, 8):
        for fault in (False, True):
            row = lp_bound(side, fault, 600)
            ok = "error" not in row and row.get("has_lp")
            what = f"{side}x{side}x{side}{' one failed link' if fault else ''}"
            fig = (_fmt(row, "lp_seconds") + ("" if row.get("has_lp") else
                                              f" (no LP bound: best is {row['best']})")
                   if "error" not in row else _fmt(row))
            results["targets"].append({"target": f"LP bound, alltoall {what}: <= 60 s",
                                       "figure": fig,
                                       "met": bool(ok) and row["lp_seconds"] <= 60})
            print(results["targets"][-1], flush=True)
    if not quick:
        row = event_5m(900)
        fig = _fmt(row) if "error" in row else (f"{row['event_seconds']:.1f} s for "
                                                f"{row['ops']:,} ops (build "
                                                f"{row['build_seconds']:.1f} s)")
        results["targets"].append({"target": "event-mode simulation of 5M ops: <= 60 s",
                                   "figure": fig,
                                   "met": "error" not in row and row["event_seconds"] <= 60})
        print(results["targets"][-1], flush=True)


def _targets_625(results: dict) -> None:
    """The 625-rank rows, each in a child process."""
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        for kind, what in (("alltoall", "AllToAll (536,870,000 B)"),
                           ("allreduce", "AllReduce (1 GiB)")):
            row = auto_625(tmp, kind, 1800)
            results["targets"].append({
                "target": f"`auto` {what}, 5x5x5x5 GPU torus (625 ranks), one failed link, "
                          "`--emit json`",
                "figure": _usage(row), "met": "-"})
            print(results["targets"][-1], flush=True)
        row = plan_625_nccl(tmp, 1800)
        fig = _usage(row) + ("" if "error" in row else
                             f"; chose {row['chosen']} ({row['time'] * 1e3:.2f} ms), "
                             f"{row['built']} built, {row['pruned']} pruned")
        results["targets"].append({
            "target": "`auto` AllToAll (536,870,000 B), 5x5x5x5 GPU torus, one failed link, "
                      "planning under the `nccl` model (dataflow run)",
            "figure": fig, "met": "-"})
        print(results["targets"][-1], flush=True)


def _usage(row: dict) -> str:
    """Wall, CPU and peak memory of a child's row."""
    if "error" in row:
        return _fmt(row)
    peak = row.get("peak_bytes")
    return (f"{row['seconds']:.1f} s wall, {row['cpu_seconds']:.1f} s of CPU"
            + (f", {peak / GiB:.2f} GiB peak" if peak else ""))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="skip the 8x8x8 LP bounds and the 5M-op simulation")
    parser.add_argument("--markdown", action="store_true", help="print the README table")
    parser.add_argument("--ratios-only", action="store_true",
                        help="only the side-by-side ratios (a minute or two)")
    parser.add_argument("--emit-only", action="store_true",
                        help="only the emitting rows: hgx16 with --emit json,msccl, its "
                             "lowering, and the nccl tables side by side")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--auto-only", action="store_true",
                        help="only the 8x8x8 auto compile (a minute)")
    parser.add_argument("--ranks625", action="store_true",
                        help="only the 625-rank rows: auto and the dataflow run side by side")
    args = parser.parse_args(argv)

    where = machine()
    print(f"machine: {where}", flush=True)
    results: dict = {"machine": where, "targets": [], "ratios": []}
    if args.auto_only:
        with tempfile.TemporaryDirectory() as tmp_name:
            row = auto_8x8x8(Path(tmp_name), 1800)
        print(json.dumps(row), flush=True)
        return 0 if "error" not in row else 1
    if args.ranks625:
        _targets_625(results)
    elif not args.ratios_only:
        _targets(results, args.quick, args.emit_only)
    ratios = [_nccl_tables_side_by_side()] if args.emit_only else \
        [_dataflow_run_side_by_side()] if args.ranks625 else side_by_side()
    for row in ratios:
        ratio = row["old"] / row["new"] if row["new"] > 0 else float("inf")
        row["ratio"] = ratio
        results["ratios"].append(row)
        word = "faster" if ratio >= 1 else "slower"
        print(f"{row['what']}: {row['new']:.2f} s vs {row['old']:.2f} s before "
              f"({ratio:.1f}x {word})", flush=True)
    if args.markdown:
        print(f"\nMachine: {where}.\n")
        print("| target | measured | met |\n|---|---|---|")
        for t in results["targets"]:
            met = t["met"] if isinstance(t["met"], str) else "yes" if t["met"] else "no"
            print(f"| {t['target']} | {t['figure']} | {met} |")
        print("\n| side by side (same run) | now | before | ratio |\n|---|---|---|---|")
        for r in results["ratios"]:
            word = "faster" if r["ratio"] >= 1 else "slower"
            print(f"| {r['what']} | {r['new']:.2f} s | {r['old']:.2f} s | "
                  f"{r['ratio']:.1f}x {word} |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
