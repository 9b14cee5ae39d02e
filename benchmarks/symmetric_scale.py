"""The symmetric form beside the expanded schedule: time and memory to build, verify and simulate.

For a healthy torus AllToAll, AllReduce, AllGather and ReduceScatter (links of 32 GB/s and
100 ns, 16 MiB) on 4x4x4, 8x8x8 and 16x16x16 tori, and on tori of unequal sides (8x8x16,
16x16x32: a shorter ring's phases run in waves), builds the schedule in symmetric form
(``auto``'s builders, ``cclc.symmetric_plan.BUILDERS``: HalfRing + DimRotation, DimRotation
over rings), verifies it
(``cclc.symmetric_check.verify_symmetric``) and times it under the lockstep IR model
(``cclc.symmetric_check.simulate_lockstep``); then, where the expanded schedule has at most
``--max-expanded`` ops, expands it (``cclc.symmetric.expand``) and runs the ordinary verifier
and simulator on it; and runs the whole ``cclc compile`` (``auto``, ``--emit json``, through
``cclc.pipeline.compile_source``), which stores the schedule by symmetry where the size check
refuses it whole. Each runs in a fresh process, whose peak resident memory is reported;
the expanded side also checks that its time and every link's bytes equal the symmetric side's.
The bound is ``cclc.bounds.bounds(coll, lp=False).best`` (the closed forms: on a healthy torus
the LP adds nothing to the hop-bytes bound of an AllToAll).

    python benchmarks/symmetric_scale.py                       # all four, all three tori
    python benchmarks/symmetric_scale.py --collective allreduce --dims 4x4x4 --json out.json
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from meta import run_meta  # noqa: E402  (benchmarks/ is not a package)

DIMS = ("4x4x4", "8x8x8", "16x16x16", "8x8x16", "16x16x32")
KINDS = ("alltoall", "allreduce", "allgather", "reducescatter")
SIZE = 16 << 20
#: the largest expanded schedule run (cclc.budget.MAX_OPS: what cclc plans at the most)
MAX_EXPANDED = 20_000_000


def _collective(kind_text: str, dims_text: str):
    from cclc.collective import CollectiveKind, make_collective
    from cclc.topology import torus

    dims = tuple(int(x) for x in dims_text.split("x"))
    topo = torus("t", dims, bandwidth=32e9, latency=100e-9)
    return make_collective("c", CollectiveKind(kind_text), topo, tuple(range(topo.n_ranks)),
                           size=SIZE)


def measure_expanded(full) -> dict:
    """The ordinary verifier's and lockstep simulator's seconds on an expanded schedule, and
    the time and busiest link's bytes they find (what the symmetric side must equal)."""
    # imported in the child process that measures, as the workers do
    from cclc.sim import simulate
    from cclc.verify import verify

    out: dict = {}
    t0 = time.perf_counter()
    verify(full)
    out["verify_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    sim = simulate(full)
    out["simulate_s"] = time.perf_counter() - t0
    out["time_s"] = sim.time
    out["link_bytes_max"] = float(sim.link_bytes.max())
    return out


def _worker(kind_text: str, dims_text: str, side: str) -> dict:
    """One side of one collective on one torus, measured in this process."""
    from cclc.bounds import bounds
    from cclc.symmetric_check import simulate_lockstep, verify_symmetric
    from cclc.symmetric_plan import BUILDERS

    coll = _collective(kind_text, dims_text)
    out: dict = {}
    t0 = time.perf_counter()
    sym = BUILDERS[coll.kind](coll)
    out["build_s"] = time.perf_counter() - t0
    if side == "symmetric":
        t0 = time.perf_counter()
        verify_symmetric(sym)
        out["verify_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        sim = simulate_lockstep(sym)
        out["simulate_s"] = time.perf_counter() - t0
        out["time_s"] = sim.time
        out["link_bytes_max"] = float(sim.link_bytes.max())
        t0 = time.perf_counter()
        out["bound_s"] = bounds(coll, lp=False).best
        out["bounds_s"] = time.perf_counter() - t0
        out["ops"] = len(sym.ops)
    elif side == "compile":
        import tempfile

        from cclc.pipeline import Request, compile_source

        text = (f"topology t = torus({dims_text.replace('x', ', ')}) {{\n"
                "    link 32 GB/s, 100 ns\n}\n"
                f"collective c = {kind_text} on t {{ size {SIZE >> 20} MiB }}\n")
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            (done,) = compile_source(text, Path(tmp) / "out", Request(emit=("json",)))
            out["compile_s"] = time.perf_counter() - t0
        p = done.symmetric or done.plan
        out["stored_by_symmetry"] = done.symmetric is not None
        out["pct_of_bound"] = p.pct_of_bound if p is not None else None
    else:
        from cclc.symmetric import expand

        t0 = time.perf_counter()
        full = expand(sym)
        out["expand_s"] = time.perf_counter() - t0
        del sym
        out.update(measure_expanded(full))
        out["ops"] = len(full.ops)
    out["maxrss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def _run(kind_text: str, dims_text: str, side: str) -> dict:
    done = subprocess.run([sys.executable, __file__, "--worker", kind_text, dims_text, side],
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _row(kind_text: str, dims_text: str, max_expanded: int) -> dict:
    """Both forms of one collective on one torus, and the whole compile."""
    coll = _collective(kind_text, dims_text)
    sym = _run(kind_text, dims_text, "symmetric")
    expanded_ops = sym["ops"] * coll.n
    row = {"collective": kind_text, "dims": dims_text, "ranks": coll.n, "size": SIZE,
           "symmetric": sym, "expanded_ops": expanded_ops,
           "pct_of_bound": 100.0 * sym["bound_s"] / sym["time_s"], "expanded": None,
           "compile": _run(kind_text, dims_text, "compile")}
    if expanded_ops <= max_expanded:
        full = _run(kind_text, dims_text, "expanded")
        if abs(full["time_s"] / sym["time_s"] - 1) > 1e-9 or \
                abs(full["link_bytes_max"] / sym["link_bytes_max"] - 1) > 1e-9:
            raise SystemExit(f"{kind_text} on {dims_text}: the expanded schedule's time or "
                             "link bytes differ from the symmetric form's")
        row["expanded"] = full
    done, comp = row["expanded"], row["compile"]
    print(f"{kind_text} {dims_text}: {sym['ops']:,} representatives for {expanded_ops:,} ops; "
          f"symmetric {sym['build_s'] + sym['verify_s'] + sym['simulate_s']:.2f} s, "
          f"{sym['maxrss_mb']:.0f} MB; expanded "
          + (f"{done['expand_s'] + done['verify_s'] + done['simulate_s']:.1f} s, "
             f"{done['maxrss_mb']:.0f} MB" if done else "not run")
          + f"; {row['pct_of_bound']:.1f}% of bound; cclc compile {comp['compile_s']:.1f} s, "
          f"{comp['maxrss_mb']:.0f} MB", flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dims", action="append", help="e.g. 8x8x8 (repeatable; default: "
                    + ", ".join(DIMS) + ")")
    ap.add_argument("--max-expanded", type=int, default=MAX_EXPANDED,
                    help="run the expanded side only up to this many ops")
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--collective", action="append", choices=KINDS,
                    help="repeatable; default: " + ", ".join(KINDS))
    ap.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(_worker(*args.worker)))
        return 0
    rows = []
    for kind_text in args.collective or KINDS:
        for dims_text in args.dims or DIMS:
            rows.append(_row(kind_text, dims_text, args.max_expanded))
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": run_meta(argv), "rows": rows},
                                              indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
