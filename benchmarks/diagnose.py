"""Fault localization from simulated per-pair timings (issue 18; the C4D method).

For each machine and fault kind, faults are injected at random, the all-pairs probe is timed
by cclc's simulator (cclc.diagnose.inject: lockstep alpha-beta model, routes of the healthy
machine, log-normal timing noise), and ``cclc.diagnose.localize.diagnose`` (default options)
names suspects. Per (machine, fault kind, noise level):

- top-1: the first suspect is the injected part, or a part the timings cannot tell from it
  (one that slows exactly the same pairs, e.g. a GPU's PCIe link and its NIC's uplink), or
  for a cable one of its two directions (half speed often shows in one direction only);
- precision: reported suspects that are the injected part / all reported suspects;
- recall: trials where the injected part is among the suspects;
- for ``none`` (nothing injected): the trials in which anything was reported.

Fault kinds: ``link`` (one directed link at half speed), ``failed`` (a cable, both directions,
black-holes its pairs: they never finish), ``gpu`` (every link of a GPU at half speed), ``nic``
(every link of a NIC at half speed), ``cable`` (a leaf-spine cable, both directions, at half
speed). Only parts that carry at least one probe pair are drawn (a fault elsewhere cannot show
in these timings; the script prints how many links that excludes), and a drawn fault that
changes no pair's noise-free time by 10% (a half-speed link that stays below its pairs'
bottleneck) is counted apart, as invisible, not as a miss. On hgx16 no pair crosses a
spine (cross-rail pairs go over NVLink to the peer GPU's NIC, as NCCL's PXN does), so the
leaf-spine cables are drawn on a variant with two leaves per rail, where same-rail pairs
between the two halves of the cluster cross spines.

Targets (issue 18): top-1 >= 95% for a half-speed link at 5% noise on hgx16 and on a 5x5x5
torus; nothing reported when nothing was injected; diagnosis < 5 s for 128 ranks.

    python benchmarks/diagnose.py                 # 20 trials per cell
    python benchmarks/diagnose.py --quick         # 4 trials per cell
    python benchmarks/diagnose.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import zlib
from dataclasses import replace

import numpy as np

import dsl
from cclc.diagnose.inject import Fault, probe_timings
from cclc.diagnose.localize import diagnose
from cclc.diagnose.routes import pair_routes

NOISE = (0.0, 0.02, 0.05, 0.10, 0.20)
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples")


def _machines():
    hgx_text = open(os.path.join(ROOT, "hgx16_leafspine.ccl"), encoding="utf-8").read()
    hgx = next(iter(dsl.loads(hgx_text, "hgx16_leafspine.ccl").topologies.values()))
    two = hgx_text.replace("leaves 8 ", "leaves 16")
    hgx2 = next(iter(dsl.loads(two, "hgx16_2leaf.ccl").topologies.values()))
    cube = next(iter(dsl.load(os.path.join(ROOT, "torus5x5x5.ccl")).topologies.values()))
    return [("hgx16", hgx, ("none", "link", "failed", "gpu", "nic")),
            ("hgx16, 2 leaves/rail", hgx2, ("none", "cable")),
            ("torus 5x5x5", cube, ("none", "link", "failed", "gpu"))]


def _incident(topo, v) -> tuple[int, ...]:
    return tuple(np.flatnonzero((topo.link_src == v) | (topo.link_dst == v)).tolist())


def _draw(topo, kind: str, used: np.ndarray, rng) -> tuple[Fault | None, str | None]:
    """A random fault of ``kind`` on a part the probe crosses, and its name as diagnose
    names it (``kind name``)."""
    vn = topo.vertex_names
    src, dst = topo.link_src, topo.link_dst
    if kind == "none":
        return None, None
    if kind == "link":
        li = int(rng.choice(used))
        return Fault(kind, "", (li,)), f"link {vn[src[li]]}->{vn[dst[li]]}"
    if kind in ("failed", "cable"):
        while True:
            li = int(rng.choice(used))
            back = topo.link_id(int(dst[li]), int(src[li]))
            is_spine = vn[src[li]].startswith("leaf") and vn[dst[li]].startswith("spine")
            if back is not None and back in set(used.tolist()) and (kind == "failed"
                                                                   or is_spine):
                lo = min(li, back)
                name = f"cable {vn[src[lo]]}--{vn[dst[lo]]}"
                return Fault(kind, name, (li, back), failed=kind == "failed"), name
    if kind == "gpu":
        r = int(rng.integers(topo.n_ranks))
        return Fault(kind, vn[r], _incident(topo, r)), f"rank {vn[r]}"
    if kind == "nic":
        nics = [v for v in range(topo.n_ranks, topo.n_vertices) if ".nic" in vn[v]]
        v = int(rng.choice(nics))
        return Fault(kind, vn[v], _incident(topo, v)), f"nic {vn[v]}"
    raise ValueError(kind)


def _is(s, truth: str, links: tuple[int, ...]) -> bool:
    """The suspect is the injected part, one the timings cannot tell from it, or for a
    cable one of its two directions."""
    if f"{s.kind} {s.name}" == truth or truth in s.same_pairs:
        return True
    return truth.startswith("cable") and bool(s.links) and set(s.links) <= set(links)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="4 trials per cell")
    ap.add_argument("--trials", type=int, default=None)
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)
    trials = args.trials or (4 if args.quick else 20)
    rows = []
    print(f"{trials} trials per cell; noise = std of log(time)")
    print(f"{'machine':22s} {'fault':7s} " + " ".join(f"{f'{int(x * 100)}%':>16s}" for x in NOISE))
    print(f"{'':30s}" + " ".join(f"{'top1 prec rec':>16s}" for _ in NOISE))
    for label, topo, kinds in _machines():
        n = topo.n_ranks
        s, d = np.divmod(np.arange(n * n), n)
        dead = list(topo.failed_ranks)
        keep = (s != d) & ~np.isin(s, dead) & ~np.isin(d, dead)
        first = probe_timings(topo, ())
        t0 = time.perf_counter()
        # a fresh copy of the machine: routes and hypotheses are built inside this call
        cold = diagnose(replace(topo, _cache={}), first)
        cold_s = time.perf_counter() - t0
        used = np.unique(pair_routes(topo, s[keep], d[keep]).links)
        healthy = probe_timings(topo, ()).seconds
        print(f"{label}: {n} ranks, {topo.n_links} links, {cold.unobserved_links} carry no "
              f"probe pair; diagnosis from scratch {cold_s:.2f} s")
        for kind in kinds:
            cells = []
            hidden_per_cell = []
            for noise in NOISE:
                rng = np.random.default_rng(zlib.crc32(f"{label}|{kind}|{noise}".encode()))
                top1 = hits = reported = correct = hidden = 0
                elapsed = []
                for _ in range(trials):
                    fault, truth = _draw(topo, kind, used, rng)
                    if fault is not None:
                        # noise-free: does the fault change any pair by 10% at all?
                        clean = probe_timings(topo, (fault,)).seconds / healthy
                        if not (clean >= 1.1).any():
                            hidden += 1
                            continue
                    t = probe_timings(topo, (fault,) if fault else (), noise=noise,
                                      seed=int(rng.integers(1 << 30)))
                    t1 = time.perf_counter()
                    dg = diagnose(topo, t)
                    elapsed.append(time.perf_counter() - t1)
                    reported += len(dg.suspects)
                    if truth is None:
                        top1 += not dg.suspects
                        continue
                    top1 += bool(dg.suspects) and _is(dg.suspects[0], truth, fault.links)
                    good = sum(_is(x, truth, fault.links) for x in dg.suspects)
                    correct += good
                    hits += good > 0
                prec = correct / reported if reported else float("nan")
                seen = max(trials - hidden, 1)
                row = {"machine": label, "fault": kind, "noise": noise, "trials": trials,
                       "hidden": hidden, "top1": top1 / seen, "precision": prec,
                       "recall": hits / seen if kind != "none" else float("nan"),
                       "reported": reported, "diagnose_s_max": max(elapsed)}
                rows.append(row)
                hidden_per_cell.append(hidden)
                if kind == "none":
                    cells.append(f"{f'{reported} reported':>16s}")
                else:
                    cells.append(f"{row['top1'] * 100:5.0f} {prec * 100 if reported else 0:4.0f}"
                                 f" {row['recall'] * 100:4.0f}")
            note = f"  (left out, changing no pair by 10%: {'/'.join(map(str, hidden_per_cell))}" \
                f" of {trials})" if any(hidden_per_cell) else ""
            print(f"{label:22s} {kind:7s} " + " ".join(f"{c:>16s}" for c in cells) + note)
            sys.stdout.flush()
    slowest = max(r["diagnose_s_max"] for r in rows)
    print(f"slowest diagnosis (routes cached after the first): {slowest:.2f} s")
    if args.json:
        from meta import run_meta  # benchmarks/meta.py, beside this script

        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"meta": run_meta(argv), "trials": trials, "rows": rows}, f,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
