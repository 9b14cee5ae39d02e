"""AllToAll synthesis at scale: solve time and quality on 5x5x5 (125 ranks) and 8x8x8 (512).

Cases: each torus healthy, with one failed link and with two failed links in different rings
(32 GB/s per link direction, 100 ns, ``routing none``, 128 MiB per rank). Per case, the row
``synth`` is ``algorithm synth`` as a user gets it (:func:`cclc.template_race.race_synthesis`):
the path LP over one commodity per orbit of the group :func:`cclc.synth.flows.choose_symmetry`
picks (``transl.``: the translations the faults leave intact; ``all``: every automorphism,
with reflections and permutations of alike dimensions), the packing into steps, and the race
against every template. With ``--compare`` a second row solves the LP over the other group and
packs it the same way (no template race).

Printed per row: the group and its order, the LP's solve time (wall clock and CPU time of this
process), the total wall clock and CPU time, the LP status and pricing rounds, and "% of LP":
the path LP's time (the max-concurrent-flow optimum over the usable links, a lower bound on
any schedule there) over the schedule's time in the IR's lockstep model (:mod:`cclc.sim`).

    python benchmarks/synth_scale.py                  # 125 and 512 ranks
    python benchmarks/synth_scale.py --quick          # 125 ranks only
    python benchmarks/synth_scale.py --quick --compare
    python benchmarks/synth_scale.py --json out.json
    python benchmarks/synth_scale.py --lp-only        # the LP and its paths only
    python benchmarks/synth_scale.py --route          # paths from a routed flow everywhere

With ``--lp-only``, "% of LP" is the LP's time over the busiest link's time under the paths
handed to the packer (at most four per pair), before any packing into steps.

``--phases`` runs the stages of the synthesis one by one and prints each one's CPU and wall
seconds as it ends (the path LP, the basic optimum, cutting the paths into pieces, the greedy
packing per step count with its % of the LP, writing the ops, the lockstep simulation), for
cases too large to finish::

    python benchmarks/synth_scale.py --phases --only "8x8x8 healthy"
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from cclc.algorithms import BuildContext, get
from cclc.collective import CollectiveKind, Hint, make_collective
from cclc.errors import CclError
from cclc.sim import simulate
from cclc.synth import flows as flows_mod
from cclc.synth.alltoall import synthesize_alltoall, write_schedule
from cclc.synth.flow_solution import pair_bytes, usable_links
from cclc.synth.flows import choose_symmetry, solve_flows
from cclc.synth.symmetry import translations
from cclc.template_race import race_synthesis
from cclc.topology import torus, with_faults
from cclc.verify import verify

MiB = 2**20
SIZE = 128 * MiB
BUDGET = 600.0


def _torus(dims, links=()):
    t = torus("t", dims, bandwidth=32e9, latency=1e-7, routing="none")
    at = t.rank_at
    pairs = [(at(a), at(b)) for a, b in links]
    return with_faults(t, links=pairs + [(b, a) for a, b in pairs])


def cases(quick: bool) -> dict:
    out = {}
    for k in ((5,) if quick else (5, 8)):
        dims = (k, k, k)
        one = [((0, 0, 0), (1, 0, 0))]
        two = one + [((2, 0, 1), (2, 1, 1))]
        out[f"{k}x{k}x{k} healthy"] = lambda dims=dims: _torus(dims)
        out[f"{k}x{k}x{k}, 1 failed link"] = lambda dims=dims, f=one: _torus(dims, f)
        out[f"{k}x{k}x{k}, 2 failed links"] = lambda dims=dims, f=two: _torus(dims, f)
    return out


def _collective(topo):
    group = topo.live_ranks()
    n = len(group)
    size = SIZE // (4 * n) * 4 * n
    return make_collective("a2a", CollectiveKind.ALLTOALL, topo, tuple(group), size=size,
                           algorithm=Hint("synth", (("budget", BUDGET),)))


def _clock() -> tuple[float, float]:
    return time.monotonic(), time.process_time()


def _group_name(coll, full: bool | None) -> str:
    sym = choose_symmetry(coll, usable_links(coll), full)
    return "transl." if sym.order == translations(coll, usable_links(coll)).order else "all"


def run_default(coll) -> dict:
    """``algorithm synth`` as a user gets it (the group chosen by size, the template race)."""
    w0, c0 = _clock()
    s = race_synthesis(coll, get("synth"), BuildContext(), {"budget": BUDGET})
    w1, c1 = _clock()
    p = dict(s.params)
    return {"mode": "synth", "group": _group_name(coll, None), "order": p.get("symmetry"),
            "lp_wall_s": p.get("lp_s"), "lp_cpu_s": p.get("lp_cpu_s"),
            "wall_s": w1 - w0, "cpu_s": c1 - c0, "status": p.get("status"),
            "rounds": p.get("rounds"), "pct_of_lp": 100 * p.get("lp_fraction", 0.0),
            "template": p.get("template")}


def run_group(coll, full: bool) -> dict:
    """The path LP over the given group, packed the same way, no template race."""
    w0, c0 = _clock()
    flows = solve_flows(coll, deadline=time.monotonic() + BUDGET, full_group=full)
    w1, c1 = _clock()
    synth = synthesize_alltoall(coll, flows, split=None,
                                deadline=time.monotonic() + BUDGET)
    schedule = write_schedule(coll, synth, ())
    t = float(simulate(schedule).time)
    w2, c2 = _clock()
    return {"mode": "LP+packing", "group": _group_name(coll, full), "order": flows.symmetry,
            "lp_wall_s": w1 - w0, "lp_cpu_s": c1 - c0, "wall_s": w2 - w0, "cpu_s": c2 - c0,
            "status": flows.status, "rounds": flows.rounds,
            "pct_of_lp": 100 * flows.lp_time / t, "template": None}


def run_lp_only(coll) -> dict:
    """The path LP (group chosen by size) and the paths cut to what the packer takes: the
    busiest link's time under those paths, as % of the LP (no packing into steps)."""
    w0, c0 = _clock()
    flows = solve_flows(coll, deadline=time.monotonic() + BUDGET)
    w1, c1 = _clock()
    topo = coll.topology
    demand = pair_bytes(coll)
    load = np.zeros(topo.n_links)
    for s, d, x, p in zip(flows.src.tolist(), flows.dst.tolist(), flows.weight.tolist(),
                          flows.path, strict=True):
        load[list(p)] += x * demand[s, d]
    routed = float((load / topo.link_bandwidth).max())
    group = "none" if flows.status == "routed" else _group_name(coll, None)
    return {"mode": "LP only", "group": group, "order": flows.symmetry,
            "lp_wall_s": w1 - w0, "lp_cpu_s": c1 - c0, "wall_s": None, "cpu_s": None,
            "status": flows.status, "rounds": flows.rounds,
            "pct_of_lp": 100 * flows.lp_time / routed, "template": None}


def run_phases(coll) -> None:
    """The synthesis stage by stage (greedy packing only, no template race), printed as each
    stage ends."""
    from cclc.synth import alltoall as synth_a2a
    from cclc.synth.orbit_pack import pack_orbits, piece_orbits
    from cclc.synth.pack import pack_pieces, pieces_of
    from cclc.synth.piece_table import hop_table
    from cclc.synth.vertex import basic_orbit_paths, basic_paths

    last = list(_clock())

    def done(what: str) -> None:
        w, c = _clock()
        print(f"  {what}: {c - last[1]:.1f} s CPU, {w - last[0]:.1f} s wall", flush=True)
        last[:] = [w, c]

    flows = solve_flows(coll, deadline=time.monotonic() + BUDGET)
    done(f"path LP ({flows.status}, {len(flows.path)} paths)")
    sym = synth_a2a.orbit_group(coll, len(flows.path))
    if sym is not None:
        flows = basic_orbit_paths(coll, flows, sym, time_limit=synth_a2a.BASIC_TIME_LIMIT)
        done(f"basic optimum over path orbits ({len(flows.path)} paths)")
    elif len(flows.path) <= synth_a2a.BASIC_MAX_PATHS:
        flows = basic_paths(coll, flows, time_limit=synth_a2a.BASIC_TIME_LIMIT)
        done(f"basic optimum ({len(flows.path)} paths)")
    split = (synth_a2a.default_split(len(flows.path)) if sym is None
             else synth_a2a.orbit_split(len(flows.path)))
    cut, width = pieces_of(coll, flows.src, flows.dst, flows.weight, flows.path,
                           synth_a2a.MAX_PATHS, synth_a2a.MIN_WEIGHT, split)
    done(f"pieces ({len(cut)}, {split} per path)")
    longest = max(len(p.hops) for p in cut)
    if sym is not None:
        table = hop_table(coll.topology, cut)
        orbits = piece_orbits(coll, cut, sym, usable_links(coll), table)
        done(f"piece orbits ({len(orbits.reps)}, group of {sym.order})")
    best = None
    for steps in (synth_a2a.step_candidates(longest, coll.n) if sym is None
                  else synth_a2a.orbit_steps(longest)):
        packing = (pack_pieces(coll, cut, steps, 0.0, 2 if coll.n <= 64 else 0)
                   if sym is None else pack_orbits(coll, cut, orbits, steps, 0.0, table,
                                                   synth_a2a.ORBIT_PASSES))
        done(f"packing into {steps} steps ({100 * flows.lp_time / packing.time:.1f}% of LP)")
        if best is None or packing.time < best.time:
            best = packing
    schedule = synth_a2a.write_schedule(coll, synth_a2a.SynthAllToAll(cut, width, best), ())
    done(f"writing the ops ({len(schedule.ops)})")
    verify(schedule)
    done("verifier")
    t = float(simulate(schedule).time)
    done(f"simulation ({100 * flows.lp_time / t:.1f}% of LP)")


def _s(x) -> str:
    return "-" if x is None else f"{x:.1f}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="125 ranks only")
    ap.add_argument("--compare", action="store_true", help="also the LP over the other group")
    ap.add_argument("--lp-only", action="store_true",
                    help="only the path LP and its paths (%% of LP: the busiest link's time)")
    ap.add_argument("--phases", action="store_true",
                    help="the stages one by one, each one's time printed as it ends")
    ap.add_argument("--only", help="run only the cases whose name contains this")
    ap.add_argument("--route", action="store_true",
                    help="paths from a routed flow (cclc.synth.routed) at every size, not "
                         "only above the path LP's limit (cclc.synth.flows.ROUTE_ABOVE)")
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args(argv)
    if args.route:
        flows_mod.ROUTE_ABOVE = 0
    print("AllToAll synth, 128 MiB per rank; seconds wall / CPU (this process); % of LP = "
          "path LP time / schedule time (IR lockstep model)")
    if not args.phases:
        print(f"{'case':24} {'row':10} {'group':>12} {'LP wall':>8} {'LP cpu':>7} "
              f"{'wall':>7} {'cpu':>7} {'status':9} {'rounds':>6} {'% of LP':>8}")
    rows = []
    for name, make in cases(args.quick).items():
        if args.only and args.only not in name:
            continue
        coll = _collective(make())
        if args.phases:
            print(f"{name} ({coll.n} ranks):", flush=True)
            run_phases(coll)
            continue
        runs = [run_lp_only] if args.lp_only else [run_default]
        if args.compare and not args.lp_only:
            other = _group_name(coll, None) == "transl."
            runs.append(lambda c, full=other: run_group(c, full))
        for run in runs:
            try:
                row = run(coll)
            except CclError as err:
                row = {"mode": "-", "error": err.message}
            row.update(case=name, n=coll.n)
            rows.append(row)
            if "error" in row:
                print(f"{name:24} error: {row['error']}", flush=True)
                continue
            status = row["status"] + (f" ({row['template']})" if row["template"] else "")
            group = f"{row['group']} {row['order']}"
            print(f"{name:24} {row['mode']:10} {group:>12} {_s(row['lp_wall_s']):>8} "
                  f"{_s(row['lp_cpu_s']):>7} {_s(row['wall_s']):>7} {_s(row['cpu_s']):>7} "
                  f"{status:9} {row['rounds']:>6} {row['pct_of_lp']:>7.1f}%", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
