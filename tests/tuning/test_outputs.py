"""Tables, conf file and example-tuner CSV of a tuning result."""

from __future__ import annotations

import csv
import io
import json
from itertools import pairwise

import pytest

from cclc.errors import SemanticError
from cclc.nccl_model import Func
from cclc.tuning import outputs
from cclc.tuning.profilers import ModelProfiler
from cclc.tuning.space import FUNC_NAMES
from cclc.tuning.table import TuneOptions, TuneTarget, parse_sizes, size_ranges, tune


def test_parse_sizes():
    assert parse_sizes("64KiB,1MiB") == (65536, 1048576)
    assert parse_sizes("4KiB:64KiB:x4") == (4096, 16384, 65536)
    assert parse_sizes("1MiB, 1024KiB, 8") == (8, 1048576)
    for bad in ("", "12 parsecs", "1MiB:1KiB", "1KiB:1MiB:x1", "0.5B"):
        with pytest.raises(SemanticError):
            parse_sizes(bad)


def test_size_ranges_tile_without_gaps():
    sizes = [1024, 4096, 65536]
    r = size_ranges(sizes)
    assert r[0][0] <= 1024 <= r[0][1] and r[1][0] <= 4096 <= r[1][1]
    assert all(a[1] + 1 == b[0] for a, b in pairwise(r))
    assert r[0][0] == 512 and r[-1][1] == 65536 * 4          # half a step beyond the ends
    assert size_ranges([1000]) == [(708, 1414)]


def _machine():
    from cclc.topology import NodeType, single_node
    from cclc.tuning.space import machine_of
    hgx = NodeType("hgx", "nvswitch", 8, 450e9, 1e-6, nics=8, nic_bandwidth=50e9)
    return machine_of(single_node("box", hgx))


@pytest.fixture(scope="module")
def result(request):
    m = _machine()
    targets = [TuneTarget("ar", Func.ALLREDUCE, m, parse_sizes("64KiB:1GiB:x16")),
               TuneTarget("ag", Func.ALLGATHER, m, (1 << 20,))]
    return tune(targets, ModelProfiler(), TuneOptions())


def test_table_csv_and_json(result):
    rows = list(csv.DictReader(io.StringIO(outputs.table_csv(result))))
    assert len(rows) == len(result.entries) == 5
    assert tuple(rows[0].keys()) == outputs.TABLE_COLUMNS
    for row, e in zip(rows, result.entries, strict=True):
        assert row["collective"] == FUNC_NAMES[e.func]
        assert float(row["busbw_gbps"]) >= float(row["nccl_busbw_gbps"]) * 0.97
        assert int(row["evaluations"]) < int(row["space_size"])
        # a model's evaluations are not measurements: the column counts what the cache lacked
        assert row["source"] == "model" and int(row["uncached"]) <= int(row["evaluations"])
    assert "measured" not in outputs.TABLE_COLUMNS
    doc = json.loads(outputs.table_json(result))
    assert doc["format"] == "cclc-tune-table" and len(doc["entries"]) == 5
    assert doc["nccl_version"] == "2.30"


def test_conf_is_what_nccl_reads(result):
    text = outputs.nccl_conf(result)
    # NCCL's reader: '#' lines are comments, NAME=value with the value up to the line end
    settings = dict(line.split("=", 1) for line in text.splitlines()
                    if line and not line.startswith("#"))
    assert settings == {s.name: s.value for s in result.settings}
    for name, value in settings.items():
        assert name.startswith("NCCL_") and value.strip() == value and value


def test_example_tuner_csv_format(result):
    lines = [ln for ln in outputs.example_tuner_csv(result).splitlines() if not ln.startswith("#")]
    rows = outputs.plugin_rows(result)
    assert len(lines) == len(rows) >= 2
    for line, r in zip(lines, rows, strict=True):
        f = line.split(",")
        assert len(f) == 8
        assert f[0] in ("broadcast", "reduce", "allgather", "reducescatter", "allreduce")
        assert f[3] in ("tree", "ring", "collnet_direct", "collnet_chain", "nvls", "nvls_tree",
                        "pat")
        assert f[4] in ("ll", "ll128", "simple")
        # a model's row says 64: NCCL clamps it to its own count (-1 would make the example
        # tuner of NCCL 2.22-2.28 force 1 channel)
        channels = r["channels"] if r["measured"] else 64
        assert (int(f[1]), int(f[2]), int(f[5]), int(f[6]), int(f[7])) == \
            (r["min_bytes"], r["max_bytes"], channels, r["n_nodes"], r["n_ranks"])


def test_plugin_rows_merge_equal_neighbours(result):
    rows = outputs.plugin_rows(result)
    assert len(rows) <= len(result.entries)
    keys = ("func", "n_ranks", "n_nodes", "algo", "proto", "channels", "chunk")
    for a, b in pairwise(rows):
        if all(a[k] == b[k] for k in ("func", "n_ranks", "n_nodes")):
            assert a["max_bytes"] < b["min_bytes"]
            assert any(a[k] != b[k] for k in keys) or a["max_bytes"] + 1 < b["min_bytes"]
    # every tuned size is covered by a row with its configuration
    for e in result.entries:
        hit = [r for r in rows
               if r["func"] == e.func and r["min_bytes"] <= e.nbytes <= r["max_bytes"]]
        assert len(hit) == 1 and hit[0]["algo"] == e.config.algo
        assert hit[0]["channels"] == (e.config.channels if e.source == "measured" else 0)


def test_model_rows_never_lower_nccl_resources(result):
    """--profiler model may choose the algorithm and protocol only: every entry runs NCCL's
    own channels and threads for its size, and nothing process-wide is set."""
    from cclc.nccl_model import nccl_resources
    from cclc.tuning.baseline import machine_model
    assert result.entries and not result.settings
    for e in result.entries:
        assert e.source == "model"
        nc, nt = nccl_resources(machine_model(_machine()), e.config.algo, e.config.proto,
                                e.nbytes)
        assert (e.config.channels, e.config.threads) == (nc, nt)
    assert all(r["measured"] == 0 and r["channels"] == 0 and r["chunk"] == 0
               for r in outputs.plugin_rows(result))


def test_measured_rows_keep_their_resources(tmp_path):
    from cclc.tuning.profilers import CsvProfiler
    path = tmp_path / "m.csv"
    path.write_text("collective,nbytes,algorithm,protocol,channels,busbw\n"
                    "allreduce,1048576,ring,ll128,4,90\n"
                    "allreduce,1048576,ring,ll128,24,60\n")
    r = tune([TuneTarget("ar", Func.ALLREDUCE, _machine(), (1 << 20,))], CsvProfiler(str(path)),
             TuneOptions(method="exhaustive"))
    (e,) = r.entries
    assert (e.source, e.config.channels) == ("measured", 4)
    (row,) = outputs.plugin_rows(r)
    assert (row["measured"], row["channels"]) == (1, 4)
