"""The size check's estimate of a form stored by symmetry beside what planning the form costs.

``cclc compile`` refuses, within seconds, a collective whose form stored by symmetry would be
too large (``cclc.symmetric_plan.form_refusal``): the estimate (``form_estimate``) counts the
builder's representative ops, steps and rank-0 chunk slots in closed form
(``cclc.algorithms.torus_symmetric.form_size``) and prices them with constants measured once
(``SECONDS_PER_OP``, ``STEP_SECONDS``, ``SET_SECONDS``, ``BYTES_PER_OP``,
``FORM_SLOT_BYTES``). It is meant as a floor: a form refused is one that would need at least
that much. For forms of every kind on tori of 4,096 to 32,768 ranks (links of 32 GB/s and
100 ns, 16 MiB; a long ring, a 2-D and a 3-D torus; one with a failed cable, whose estimate
counts its healthy base), each in a fresh process, this records the estimate and what building
(``cclc.symmetric_plan.build_symmetric``), verifying and timing the form under the lockstep IR
model (``cclc.symmetric_plan.verify_form`` and ``simulate_form``: the form's own verifier
and simulator, the exceptions' or the lines' with a failed cable) take: seconds, and peak
resident memory above the process's after its imports. Each row's ratio measured / estimate
is at least 1 where the estimate is a floor; the run says so where it is not.

    python benchmarks/form_estimate.py --json benchmarks/results/form_estimate.json
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from faulty_scale import SIZE, _source  # noqa: E402  (benchmarks/ is not a package)
from meta import run_meta  # noqa: E402

#: (collective, torus, failed cable or None)
CASES = (("allgather", "2x16384", None),
         ("reducescatter", "2x4096", None),
         ("allreduce", "2x4096", None),
         ("alltoall", "64x64", None),
         ("allgather", "64x64", None),
         ("alltoall", "16x16x16", None),
         ("allgather", "16x16x16", None),
         ("reducescatter", "16x16x16", None),
         ("allreduce", "16x16x16", None),
         ("allreduce", "16x16x32", None),
         ("allreduce", "16x16x16", ((2, 2, 2), (3, 2, 2))),
         ("alltoall", "16x16x16", ((2, 2, 2), (3, 2, 2))))


def _rss_bytes() -> int:
    """This process's resident memory now (Linux)."""
    pages = int(Path("/proc/self/statm").read_text(encoding="utf-8").split()[1])
    return pages * resource.getpagesize()


def _worker(kind: str, dims_text: str, cable_text: str) -> dict:
    """The estimate and the measurement of one form, in this process."""
    from cclc.execution import IR_MODEL
    from cclc.symmetric import ExceptedSchedule
    from cclc.symmetric_plan import build_symmetric, form_estimate, simulate_form, verify_form
    from dsl import loads

    cable = json.loads(cable_text)
    (coll,) = loads(_source(dims_text, () if cable is None else (cable,), kind)).collectives
    est = form_estimate(coll)
    base = _rss_bytes()
    out: dict = {"estimate_ops": est.ops, "estimate_s": est.seconds,
                 "estimate_bytes": est.memory}
    t0 = time.perf_counter()
    form = build_symmetric(coll)
    out["build_s"] = time.perf_counter() - t0
    out["ops"] = (len(form.base.ops) + len(form.tail) if isinstance(form, ExceptedSchedule)
                  else len(form.ops))
    t0 = time.perf_counter()
    verify_form(form)
    out["verify_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    simulate_form(form, IR_MODEL)
    out["simulate_s"] = time.perf_counter() - t0
    out["measured_s"] = out["build_s"] + out["verify_s"] + out["simulate_s"]
    # ru_maxrss: kilobytes on Linux
    out["measured_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
    return out


def _row(kind: str, dims_text: str, cable) -> dict:
    done = subprocess.run([sys.executable, __file__, "--worker", kind, dims_text,
                           json.dumps(cable)], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{kind} on {dims_text}: the worker failed:\n{done.stderr}")
    got = json.loads(done.stdout.strip().splitlines()[-1])
    ranks = math.prod(int(side) for side in dims_text.split("x"))
    row = {"collective": kind, "dims": dims_text, "ranks": ranks, "size": SIZE,
           "failed_cable": cable, **got,
           "time_ratio": got["measured_s"] / got["estimate_s"],
           "memory_ratio": got["measured_bytes"] / got["estimate_bytes"]}
    floor = row["time_ratio"] >= 1 and row["memory_ratio"] >= 1
    print(f"{kind} {dims_text}{' (1 failed cable)' if cable else ''}: estimate "
          f"{got['estimate_s']:.2f} s, {got['estimate_bytes'] / 2**20:.0f} MiB; measured "
          f"{got['measured_s']:.2f} s, {got['measured_bytes'] / 2**20:.0f} MiB"
          + ("" if floor else "  <- the estimate is above the measurement"), flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(_worker(*args.worker)))
        return 0
    rows = [_row(kind, dims_text, cable) for kind, dims_text, cable in CASES]
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": run_meta(argv), "rows": rows},
                                              indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
