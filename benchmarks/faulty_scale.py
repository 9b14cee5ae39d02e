"""Faulty tori: collectives stored by symmetry with exceptions; time, memory, % of bound.

For an AllToAll (16 MiB, links of 32 GB/s and 100 ns, the language's default routing `none`)
on an 8x8x8 and a 16x16x16 torus with one failed cable (both directions of the link between
(2,2,2) and (3,2,2)) and, on 16x16x16, a second one (between (9,11,5) and (9,12,5)):

* *exceptions*: builds the schedule as ``auto`` does
  (``cclc.algorithms.torus_reroute.excepted_alltoall``: the healthy torus's HalfRing +
  DimRotation less the journeys that cross a failed link, and a tail for them), verifies it
  (``cclc.symmetric_faults.verify_excepted``) and times it under the lockstep IR model
  (``simulate_excepted``), in a fresh process (peak resident memory from ``getrusage``);
* *expanded* (where it has at most ``--max-expanded`` ops): expands it
  (``expand_excepted``), runs the ordinary verifier and simulator, and checks that time and
  every link's bytes equal the exceptions side's;
* *compile* (4,096 ranks): ``cclc compile FILE --emit json`` as a command, under
  ``/usr/bin/time -f %M`` (peak resident memory of the whole command), its time and % of
  bound read from what it prints.

The bound is ``cclc.bounds.bounds(coll, lp=False).best`` (closed forms on the faulty torus).

The AllReduce, the AllGather and the ReduceScatter (16 MiB) on the same tori and failed cables
are measured the same way (*lines*: ``cclc.algorithms.torus_cut_allreduce.lined_allreduce``,
``lined_allgather`` and ``lined_reducescatter``, ring+dimrotation of the healthy torus in
symmetric form less the phases of the rings a failed link cuts, run there as lines in the same
steps;
``cclc.symmetric_lines.verify_lined`` and ``simulate_lined``; expanded on 8x8x8).
On 8x8x8, with the first failed cable and with a second one along another dimension (between
(5,3,6) and (5,4,6)), each *allreduce* row runs ``cclc compile --emit json --explain`` of it
(``auto`` builds every whole candidate and the form with lines, and keeps the fastest) and
records time, peak memory, the chosen schedule and every whole candidate's time and % of
bound, side by side.

    python benchmarks/faulty_scale.py --json benchmarks/results/faulty_scale.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from meta import run_meta  # noqa: E402  (benchmarks/ is not a package)
from symmetric_scale import measure_expanded  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SIZE = 16 << 20
#: (torus, failed cables as pairs of coordinates)
CASES = (("8x8x8", (((2, 2, 2), (3, 2, 2)),)),
         ("16x16x16", (((2, 2, 2), (3, 2, 2)),)),
         ("16x16x16", (((2, 2, 2), (3, 2, 2)), ((9, 11, 5), (9, 12, 5)))))
#: the AllReduce with lines: (torus, failed cables)
LINES_CASES = CASES
#: the AllReduce compiled whole and with lines, auto choosing: (torus, failed cables)
ALLREDUCE_CASES = (("8x8x8", (((2, 2, 2), (3, 2, 2)),)),
                   ("8x8x8", (((2, 2, 2), (3, 2, 2)), ((5, 3, 6), (5, 4, 6)))))
#: the largest expanded schedule run (cclc.budget.MAX_OPS)
MAX_EXPANDED = 20_000_000


def _source(dims_text: str, faults, kind: str = "alltoall") -> str:
    lines = [f"topology t = torus({dims_text.replace('x', ', ')}) {{",
             "    link 32 GB/s, 100 ns"]
    lines += [f"    fault link ({','.join(map(str, a))}) -- ({','.join(map(str, b))})"
              for a, b in faults]
    name = {"alltoall": "a2a", "allreduce": "ar", "allgather": "ag", "reducescatter": "rs"}[kind]
    lines += ["}", f"collective {name} = {kind} on t {{ size {SIZE >> 20} MiB }}", ""]
    return "\n".join(lines)


def _collective(dims_text: str, faults, kind: str = "alltoall"):
    from dsl import loads

    (coll,) = loads(_source(dims_text, faults, kind)).collectives
    return coll


def _worker(dims_text: str, faults_text: str, side: str) -> dict:
    """One side of one case, measured in this process (``side``: exceptions or expanded of
    the AllToAll, lines:KIND or lines-expanded:KIND of the collective KIND)."""
    from cclc.algorithms.torus_reroute import excepted_alltoall
    from cclc.bounds import bounds
    from cclc.symmetric_faults import expand_excepted, simulate_excepted, verify_excepted
    from cclc.symmetric_lines import simulate_lined, verify_lined
    from cclc.symmetric_plan import EXCEPTED

    side, _, kind = side.partition(":")
    lines = side.startswith("lines")
    coll = _collective(dims_text, json.loads(faults_text), kind if lines else "alltoall")
    out: dict = {}
    t0 = time.perf_counter()
    x = EXCEPTED[coll.kind][0](coll) if lines else excepted_alltoall(coll)
    out["build_s"] = time.perf_counter() - t0
    if side in ("lines", "exceptions"):
        t0 = time.perf_counter()
        (verify_lined if lines else verify_excepted)(x)
        out["verify_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        sim = (simulate_lined if lines else simulate_excepted)(x)
        out["simulate_s"] = time.perf_counter() - t0
        out["time_s"] = sim.time
        out["link_bytes_max"] = float(sim.link_bytes.max())
        out["bound_s"] = bounds(coll, lp=False).best
        out["ops"] = len(x.ops)
        out["masked_ops"] = x.masked_ops()
        out["expanded_ops"] = x.expanded_ops()
        if lines:
            out["masked_phases"] = len(set(x.masked_journey.tolist()))
            out["masked_ranks"] = len(set(x.masked_element.tolist()))
            out["line_ops"] = len(x.tail)
        else:
            out["tail_s"] = float(sim.step_time[x.base.ops.n_steps:].sum())
            out["masked_journeys"] = len(x.masked_element)
            out["tail_ops"] = len(x.tail)
            out["tail_steps"] = x.tail.n_steps
    else:
        t0 = time.perf_counter()
        full = expand_excepted(x)
        out["expand_s"] = time.perf_counter() - t0
        del x
        out.update(measure_expanded(full))
    out["maxrss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def _run(dims_text: str, faults, side: str) -> dict:
    done = subprocess.run([sys.executable, __file__, "--worker", dims_text, json.dumps(faults),
                           side], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _command(dims_text: str, faults, kind: str = "alltoall", extra: tuple[str, ...] = ()
             ) -> tuple[subprocess.CompletedProcess, float]:
    """``cclc compile --emit json`` (and ``extra``) of ``kind`` under ``/usr/bin/time -f
    %M``: the finished command and its wall seconds."""
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "faulty.ccl"
        src.write_text(_source(dims_text, faults, kind), encoding="utf-8")
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        t0 = time.perf_counter()
        done = subprocess.run(["/usr/bin/time", "-f", "maxrss_kb %M", sys.executable, "-m",
                               "cclc.cli", "compile", str(src), "--emit", "json", *extra,
                               "-o", str(Path(tmp) / "out")], capture_output=True, text=True,
                              env=env, cwd=ROOT)
        wall = time.perf_counter() - t0
    return done, wall


def _compile(dims_text: str, faults, kind: str = "alltoall") -> dict:
    """The compile of ``kind``: time, peak memory, and what it prints."""
    done, wall = _command(dims_text, faults, kind)
    if done.returncode != 0:
        raise SystemExit(f"cclc compile failed on {dims_text}:\n{done.stderr}")
    line = next(ln for ln in done.stdout.splitlines() if "% of bound" in ln)
    pct = float(_match(r"([\d.]+)% of bound", line).group(1))
    ms = _match(r" ([\d.]+) (ms|us),", line)
    took = float(ms.group(1)) * (1e-3 if ms.group(2) == "ms" else 1e-6)
    rss = int(_match(r"maxrss_kb (\d+)", done.stderr).group(1))
    return {"compile_s": wall, "maxrss_mb": rss / 1024, "pct_of_bound": pct,
            "time_s": took,
            "stored_with_exceptions": bool(re.search(r"stored by symmetry: .*, less ", line))}


def _match(pattern: str, text: str) -> re.Match[str]:
    found = re.search(pattern, text)
    if found is None:
        raise SystemExit(f"no {pattern!r} in what cclc printed:\n{text}")
    return found


def _row(dims_text: str, faults, max_expanded: int, kind: str = "alltoall") -> dict:
    """One torus and fault set: the form's side (the AllToAll with exceptions, the others
    with lines), its expansion where it fits, its compile on 4,096 ranks."""
    side = "exceptions" if kind == "alltoall" else "lines"
    form = _run(dims_text, faults, side if kind == "alltoall" else f"lines:{kind}")
    n = 1
    for d in dims_text.split("x"):
        n *= int(d)
    row = {"collective": kind, "dims": dims_text, "ranks": n, "size": SIZE,
           "failed_cables": [list(map(list, f)) for f in faults], side: form,
           "pct_of_bound": 100.0 * form["bound_s"] / form["time_s"], "expanded": None,
           "compile": None}
    if form["expanded_ops"] <= max_expanded:
        full = _run(dims_text, faults,
                    "expanded" if kind == "alltoall" else f"lines-expanded:{kind}")
        if abs(full["time_s"] / form["time_s"] - 1) > 1e-9 or \
                abs(full["link_bytes_max"] / form["link_bytes_max"] - 1) > 1e-9:
            raise SystemExit(f"{dims_text}: the expanded schedule's time or link bytes differ "
                             f"from the form's ({side})")
        row["expanded"] = full
    if n >= 4096:
        row["compile"] = _compile(dims_text, faults, kind)
    comp = row["compile"]
    what = (f"{form['masked_journeys']:,} journeys masked, tail of {form['tail_ops']:,} ops "
            f"in {form['tail_steps']} steps ({form['tail_s'] * 1e6:.1f} us)" if side ==
            "exceptions" else f"{form['masked_phases']} ring phases masked on "
            f"{form['masked_ranks']} ranks, lines of {form['line_ops']:,} ops")
    print(f"{kind} {dims_text}, {len(faults)} failed cable(s): {what}; "
          f"{form['time_s'] * 1e6:.1f} us, bound {form['bound_s'] * 1e6:.1f} us, "
          f"{row['pct_of_bound']:.1f}% of bound; build + verify + simulate "
          f"{form['build_s'] + form['verify_s'] + form['simulate_s']:.1f} s, "
          f"{form['maxrss_mb']:.0f} MB"
          + (f"; cclc compile {comp['compile_s']:.1f} s, {comp['maxrss_mb']:.0f} MB, "
             f"{comp['pct_of_bound']:.1f}%" if comp else ""), flush=True)
    return row


#: a candidate's row of ``--explain``: name, lower bound, time, % of bound, note
_CANDIDATE = re.compile(r"^  (?P<name>\S+)\s+\S+(?: \w?s)?\s+(?P<time>[\d.]+) (?P<unit>ms|us)"
                        r"\s+(?P<pct>[\d.]+)%")


def _allreduce(dims_text: str, faults) -> dict:
    """The AllReduce's compile under ``auto``: time, peak memory, the chosen schedule and
    every built candidate's time and % of bound."""
    done, wall = _command(dims_text, faults, "allreduce", ("--explain",))
    if done.returncode != 0:
        raise SystemExit(f"cclc compile of the allreduce on {dims_text} failed:\n{done.stderr}")
    chosen = _match(r"(?m)^ar: (\S+) ([\d.]+) (ms|us), ([\d.]+)% of bound", done.stdout)
    candidates = {}
    for line in done.stdout.splitlines():
        found = _CANDIDATE.match(line)
        if found:
            unit = 1e-3 if found.group("unit") == "ms" else 1e-6
            candidates[found.group("name")] = {"time_s": float(found.group("time")) * unit,
                                               "pct_of_bound": float(found.group("pct"))}
    rss = int(_match(r"maxrss_kb (\d+)", done.stderr).group(1))
    n = 1
    for d in dims_text.split("x"):
        n *= int(d)
    row = {"collective": "allreduce", "dims": dims_text, "ranks": n, "size": SIZE,
           "failed_cables": [list(map(list, f)) for f in faults], "compile_s": wall,
           "maxrss_mb": rss / 1024, "chosen": chosen.group(1),
           "pct_of_bound": float(chosen.group(4)), "candidates": candidates}
    others = ", ".join(f"{k} {v['pct_of_bound']:.1f}%" for k, v in candidates.items()
                       if k != row["chosen"])
    print(f"allreduce {dims_text}, {len(faults)} failed cable(s): {row['chosen']} "
          f"{row['pct_of_bound']:.1f}% of bound ({others}); cclc compile {wall:.1f} s, "
          f"{row['maxrss_mb']:.0f} MB", flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-expanded", type=int, default=MAX_EXPANDED,
                    help="run the expanded side only up to this many ops")
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(_worker(*args.worker)))
        return 0
    meta = run_meta(argv)
    rows = [_row(dims, faults, args.max_expanded) for dims, faults in CASES]
    lines = [_row(dims, faults, args.max_expanded, kind)
             for kind in ("allreduce", "allgather", "reducescatter")
             for dims, faults in LINES_CASES]
    allreduce = [_allreduce(dims, faults) for dims, faults in ALLREDUCE_CASES]
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": meta, "rows": rows, "lines": lines,
                                               "allreduce": allreduce},
                                              indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
