"""Renderings of a tuning result: the readable table (CSV, JSON), the NCCL_CONF_FILE, the
CSV of NVIDIA's example tuner, and the rows the generated C plugin carries.

Each function returns text (or plain rows); writing files is the caller's business.
"""

from __future__ import annotations

import csv
import io
import json

from cclc.nccl_model import MAX_CHANNELS
from cclc.tuning.space import ALGO_NAMES, FUNC_NAMES, PROTO_NAMES
from cclc.tuning.table import TableEntry, TuneResult

__all__ = [
    "TABLE_COLUMNS",
    "example_tuner_csv",
    "nccl_conf",
    "plugin_rows",
    "table_csv",
    "table_json",
]

TABLE_COLUMNS = ("target", "collective", "nranks", "nnodes", "nbytes", "min_bytes", "max_bytes",
                 "algorithm", "protocol", "transport", "channels", "threads", "chunk",
                 "busbw_gbps", "nccl_algorithm", "nccl_protocol", "nccl_channels",
                 "nccl_busbw_gbps", "gain", "evaluations", "uncached", "space_size", "source")


def _row(e: TableEntry) -> dict:
    c, d = e.config, e.default
    return {"target": e.target, "collective": FUNC_NAMES[e.func], "nranks": e.n_ranks,
            "nnodes": e.n_nodes, "nbytes": e.nbytes, "min_bytes": e.min_bytes,
            "max_bytes": e.max_bytes, "algorithm": ALGO_NAMES[c.algo],
            "protocol": PROTO_NAMES[c.proto], "transport": c.transport, "channels": c.channels,
            "threads": c.threads, "chunk": c.chunk, "busbw_gbps": round(e.busbw, 4),
            "nccl_algorithm": ALGO_NAMES[d.algo], "nccl_protocol": PROTO_NAMES[d.proto],
            "nccl_channels": d.channels,
            "nccl_busbw_gbps": None if e.default_busbw is None else round(e.default_busbw, 4),
            "gain": None if e.gain is None else round(e.gain, 4),
            "evaluations": e.evaluations, "uncached": e.measured, "space_size": e.space_size,
            "source": e.source}


def table_csv(result: TuneResult) -> str:
    """One row per tuned (target, size), with NCCL's default beside it."""
    out = io.StringIO()
    w = csv.DictWriter(out, fieldnames=TABLE_COLUMNS, lineterminator="\n")
    w.writeheader()
    for e in result.entries:
        w.writerow({k: ("" if v is None else v) for k, v in _row(e).items()})
    return out.getvalue()


def table_json(result: TuneResult) -> str:
    doc = {"format": "cclc-tune-table", "version": 1, "nccl_version": str(result.version),
           "profiler": result.profiler, "method": result.method,
           "settings": [{"name": s.name, "value": s.value, "why": s.why}
                        for s in result.settings],
           "notes": list(result.notes), "entries": [_row(e) for e in result.entries]}
    return json.dumps(doc, indent=1) + "\n"


def nccl_conf(result: TuneResult) -> str:
    """NCCL_CONF_FILE text: ``NAME=value`` lines; NCCL reads the value verbatim up to the end
    of the line, so the reasons go on comment lines of their own."""
    lines = ["# NCCL settings that stock NCCL only takes process-wide, from `cclc tune`.",
             "# Load with NCCL_CONF_FILE=<this file>; a variable set in the environment wins.",
             "# The per-collective choices (algorithm, protocol, channels, chunk) live in the",
             "# tuner plugin libnccl-tuner-cclc.so (NCCL_TUNER_PLUGIN)."]
    if not result.settings:
        lines.append("# (NCCL's defaults were best: nothing to set)")
    for s in result.settings:
        lines.append(f"# {s.why}")
        lines.append(f"{s.name}={s.value}")
    return "\n".join(lines) + "\n"


def plugin_rows(result: TuneResult) -> list[dict]:
    """Table rows for the C plugin: adjacent size ranges with the same choice merged.

    Keys: func, n_ranks, n_nodes, min_bytes, max_bytes, algo, proto, channels, chunk,
    measured (ints). A row from a model (``measured`` 0) carries no channels and no chunk:
    it may only pick the algorithm and protocol, and the plugin refuses to apply resources
    from it.
    """
    rows: list[dict] = []
    ordered = sorted(result.entries, key=lambda e: (e.n_ranks, e.n_nodes, int(e.func),
                                                    e.min_bytes))
    for e in ordered:
        measured = e.source == "measured"
        row = {"func": int(e.func), "n_ranks": e.n_ranks, "n_nodes": e.n_nodes,
               "min_bytes": e.min_bytes, "max_bytes": e.max_bytes, "algo": int(e.config.algo),
               "proto": int(e.config.proto),
               "channels": e.config.channels if measured else 0,
               "chunk": e.config.chunk if result.version.chunk_tunable and measured else 0,
               "measured": int(measured)}
        last = rows[-1] if rows else None
        same = ("func", "n_ranks", "n_nodes", "algo", "proto", "channels", "chunk", "measured")
        if (last is not None and all(last[k] == row[k] for k in same)
                and last["max_bytes"] + 1 >= row["min_bytes"]):
            last["max_bytes"] = max(last["max_bytes"], row["max_bytes"])
            continue
        rows.append(row)
    return rows


_EXAMPLE_ALGO = ("tree", "ring", "collnet_direct", "collnet_chain", "nvls", "nvls_tree", "pat")
_EXAMPLE_PROTO = ("ll", "ll128", "simple")


def example_tuner_csv(result: TuneResult) -> str:
    """The table in the format of NVIDIA's example tuner (NCCL_TUNER_CONFIG_FILE):
    ``collective_type,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks``."""
    lines = ["# collective_type,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks",
             "# from `cclc tune`; first matching line wins",
             "# rows from a model say 64 channels: NCCL clamps that to the communicator's own",
             "# count, never below it (the example tuner of NCCL 2.22-2.28 would force 1 channel",
             "# on a row saying -1)"]
    for r in plugin_rows(result):
        channels = r["channels"] if r["measured"] else MAX_CHANNELS
        lines.append(f"{FUNC_NAMES[r['func']].lower()},{r['min_bytes']},{r['max_bytes']},"
                     f"{_EXAMPLE_ALGO[r['algo']]},{_EXAMPLE_PROTO[r['proto']]},"
                     f"{channels},{r['n_nodes']},{r['n_ranks']}")
    return "\n".join(lines) + "\n"
