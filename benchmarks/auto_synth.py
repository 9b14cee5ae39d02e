"""What ``auto`` reaches against ``algorithm synth`` on the 128-GPU fabric example (issue 32).

For ``grads`` of ``examples/hgx16_leafspine.ccl`` (AllReduce of 1 GiB on 128 GPUs), plans it
with ``algorithm auto`` and with ``algorithm synth`` (:func:`cclc.plan.plan`, each in a child
process so that its time and peak memory are its own) under the execution models of
``--emit json`` (the IR's lockstep model) and of ``--emit json,msccl`` (the msccl model, with
the outputs' render cost per op that ``auto``'s synthesis candidate budgets for), and records
per row: the chosen algorithm, its ops and pipeline depth, the outputs whose limits refuse it
(``Backend.refusal``: ``cclc compile`` writes no such file), its predicted time and % of the
lower bound (``cclc.bounds``, the bound ``cclc compile`` prints), and the planning's wall and
CPU seconds and peak memory. Then compiles the whole example for ``--emit json,msccl``
(:func:`cclc.pipeline.compile_program`, what ``cclc compile`` runs, in a child process): its
wall and CPU seconds, peak memory and each collective's choice. Times of schedules are
predictions of the named model, not measurements on hardware; compile times are this
machine's.

    python benchmarks/auto_synth.py --json benchmarks/results/auto_synth.json
    python benchmarks/auto_synth.py --models ir          # the --emit json rows only
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

from meta import run_meta

ROOT = Path(__file__).resolve().parent.parent

#: what each model's rows emit: the outputs whose cost per op the planner is told
OUTPUTS = {"ir": ("json",), "msccl": ("json", "msccl")}


def plan_row(algorithm: str, outputs: tuple[str, ...], timeout: float = 1800) -> dict:
    """Plan ``grads`` with ``algorithm`` for ``outputs`` in a child process: its row."""
    code = textwrap.dedent(f"""
        import json, resource, time
        import dsl
        from backends import load
        from cclc.collective import Hint, make_collective
        from cclc.execution import model_for
        from cclc.plan import plan
        (g,) = [c for c in dsl.load("examples/hgx16_leafspine.ccl").collectives
                if c.name == "grads"]
        g = make_collective(g.name, g.kind, g.topology, g.group, size=g.size, dtype=g.dtype,
                            op=g.op, algorithm=Hint({algorithm!r}))
        backends = [load(name) for name in {outputs!r}]
        t0, c0 = time.perf_counter(), time.process_time()
        p = plan(g, model=model_for(backends),
                 emit_seconds_per_op=sum(b.seconds_per_op for b in backends))
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        params = dict(p.schedule.params)
        # what `cclc compile` would not write: an algorithm named explicitly is planned even
        # where an output's limits refuse it (auto never chooses such a schedule)
        from backends.contract import EmitOptions
        refused = [b.name for b in backends
                   if b.refusal(p.schedule, EmitOptions()) is not None]
        print(json.dumps({{"chosen": p.name, "ops": len(p.schedule.ops), "refused_by": refused,
                          "chunks": params.get("chunks"), "time_s": p.time,
                          "bound_s": p.bound, "pct_of_bound": p.pct_of_bound,
                          "model": p.model.name, "plan_wall_s": wall, "plan_cpu_s": cpu,
                          "peak_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                          * 1024}}))
        """)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr else "failed"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def compile_row(outputs: tuple[str, ...], timeout: float = 1800) -> dict:
    """:func:`~cclc.pipeline.compile_program` of the whole example for ``outputs`` in a
    child process (into a
    temporary folder): its wall and CPU seconds, peak memory and each collective's choice."""
    code = textwrap.dedent(f"""
        import json, resource, tempfile, time
        import dsl
        from cclc.pipeline import Request, compile_program
        with tempfile.TemporaryDirectory() as out:
            t0, c0 = time.perf_counter(), time.process_time()
            done = compile_program(dsl.load("examples/hgx16_leafspine.ccl"), out,
                                   Request(emit={outputs!r}))
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        print(json.dumps({{"emit": ",".join({outputs!r}), "wall_s": wall, "cpu_s": cpu,
                          "peak_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                          * 1024,
                          "chosen": {{c.collective.name: c.plan.name for c in done
                                     if c.plan is not None}},
                          "failed": [c.collective.name for c in done if c.plan is None]}}))
        """)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr else "failed"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="ir,msccl",
                    help="comma-separated: ir (--emit json), msccl (--emit json,msccl)")
    ap.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    args = ap.parse_args(argv)
    meta = run_meta(argv)                  # the load average before the runs
    rows = []
    for model in args.models.split(","):
        if model not in OUTPUTS:
            ap.error(f"unknown model '{model}'; known: {', '.join(OUTPUTS)}")
        for algorithm in ("auto", "synth"):
            row = {"emit": ",".join(OUTPUTS[model]), "algorithm": algorithm,
                   **plan_row(algorithm, OUTPUTS[model])}
            rows.append(row)
            print(json.dumps(row), flush=True)
    whole = compile_row(OUTPUTS["msccl"])
    print(json.dumps(whole), flush=True)
    if args.json:
        doc = {"meta": meta,
               "collective": "examples/hgx16_leafspine.ccl: grads (AllReduce, 1 GiB, 128 GPUs)",
               "rows": rows, "whole_compile": whole,
               "peak_self_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
        Path(args.json).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
