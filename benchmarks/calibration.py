"""cclc's model of NCCL against published measurements: predicted vs published per point.

Reads ``cclc/data/nccl_published.csv`` (every row names its source: a URL and the
comment, table or figure), predicts each point with :mod:`cclc.nccl_model` through
:mod:`cclc.calibration` (the same functions that compile reports and ``cclc tune`` use) and
prints one line per point: the machine, the collective and size, the published value, the
prediction, the relative error and NCCL's algorithm/protocol in the model. Large-size points
marked ``yes`` must be within +-25% (tests/nccl_model/test_calibration.py); ``known-weak`` points
are outside for a documented reason; small-size points are reported only.

    python benchmarks/calibration.py
    python benchmarks/calibration.py --markdown      # the README table
"""

from __future__ import annotations

import argparse
import sys

from cclc.calibration import load_points, predict
from cclc.nccl_model import CALIBRATION_DATA, CALIBRATION_TOLERANCE
from cclc.tuning.space import FUNC_NAMES


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):g} {unit}"
    return f"{n} B"


def _collective(p) -> str:
    """The point's collective as the tuner names it (AllToAll: NCCL's grouped send/recv)."""
    return FUNC_NAMES[p.func] if p.func is not None else "AllToAll"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=str(CALIBRATION_DATA), help="calibration CSV")
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table")
    ap.add_argument("--json", metavar="PATH", help="also write every point as JSON")
    args = ap.parse_args(argv)
    rows = [predict(p) for p in load_points(args.data)]
    if args.markdown:
        print("| point | machine | collective | size | published | predicted | error | "
              "NCCL's choice (model) | check |")
        print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        p = r.point
        machine = (f"{p.nodes} x {p.gpus} {p.arch} {p.interconnect}"
                   + (f", {p.nics} x {p.nic_gbps:g} Gb/s" if p.nics else ""))
        unit = "GB/s busbw" if p.metric == "busbw" else "us"
        forced = f" ({p.algorithm.name.lower()} forced)" if p.algorithm is not None else ""
        coll = _collective(p) + forced
        if args.markdown:
            print(f"| {p.id} | {machine} | {coll} | {_size(p.size)} | {p.value:g} {unit} | "
                  f"{r.predicted:.1f} | {r.error * 100:+.0f}% | {r.choice} | {p.check} |")
        else:
            print(f"{p.id:<24} {machine:<40} {coll:<24} {_size(p.size):>7} "
                  f"{p.value:9.2f} {r.predicted:9.2f} {unit:<10} {r.error * 100:+6.1f}% "
                  f"{r.choice:<17} {p.check}")
    checked = [r for r in rows if r.point.scale == "large" and r.point.check == "yes"]
    drift = [r.point.id for r in checked if not r.within]
    print(f"\n{len(checked)} large-size points checked at +-{CALIBRATION_TOLERANCE:.0%}: "
          + ("all within" if not drift else "drifting: " + ", ".join(drift)))
    if args.json:
        _write_json(args.json, rows, argv)
    return 1 if drift else 0


def _write_json(path: str, rows, argv: list[str] | None) -> None:
    import json

    from meta import run_meta  # benchmarks/meta.py, beside this script

    points = []
    for r in rows:
        p = r.point
        points.append({
            "id": p.id, "nodes": p.nodes, "gpus": p.gpus, "arch": p.arch,
            "interconnect": p.interconnect, "nics": p.nics, "nic_gbps": p.nic_gbps,
            "collective": _collective(p),
            "forced": p.algorithm.name.lower() if p.algorithm is not None else None,
            "bytes": p.size, "metric": p.metric, "published": p.value,
            "predicted": r.predicted, "error": r.error, "choice": r.choice, "check": p.check,
            "scale": p.scale, "within": bool(r.within), "source": p.source})
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"meta": run_meta(argv), "tolerance": CALIBRATION_TOLERANCE,
                   "points": points}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
