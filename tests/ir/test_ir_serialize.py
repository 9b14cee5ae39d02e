"""The schedule document: exact round trip, and clear errors for malformed documents."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
from ir_builders import K, build, coll, direct_alltoall

from cclc.collective import DType, Hint, ReduceOp, make_collective
from cclc.errors import CclError, ScheduleError, Span
from cclc.ir import Buf
from cclc.serialize import from_json, load, save, to_json
from cclc.topology import NodeType, leaf_spine, torus, with_faults
from cclc.verify import verify


def same(a, b):
    """Every field of two schedules is equal, arrays bit for bit (dtypes included)."""
    assert to_json(a) == to_json(b)
    ta, tb = a.topology, b.topology
    for k in ("link_src", "link_dst", "link_bandwidth", "link_latency", "link_kind",
              "link_failed"):
        x, y = getattr(ta, k), getattr(tb, k)
        assert x.dtype == y.dtype and x.tobytes() == y.tobytes(), k
    for k in ("name", "kind", "n_ranks", "vertex_names", "failed_ranks", "dims", "wrap",
              "n_nodes", "fault_groups"):
        assert getattr(ta, k) == getattr(tb, k), k
    for k in ("node_of_rank", "gpu_of_rank", "rail_of_rank"):
        x, y = getattr(ta, k), getattr(tb, k)
        assert (x is None and y is None) or np.array_equal(x, y), k
    ca, cb = a.collective, b.collective
    for k in ("name", "kind", "group", "size", "dtype", "op", "root", "algorithm", "schedule",
              "span"):
        assert getattr(ca, k) == getattr(cb, k), k
    assert (ca.pair_sizes is None) == (cb.pair_sizes is None)
    for x, y in zip(a.layouts, b.layouts, strict=True):
        assert x.shape == y.shape and np.array_equal(x, y)
    for k, v in a.ops.columns().items():
        w = getattr(b.ops, k)
        assert v.dtype == w.dtype and np.array_equal(v, w), k
    assert np.array_equal(a.routes.offsets, b.routes.offsets)
    assert np.array_equal(a.routes.links, b.routes.links)
    assert (a.algorithm, a.schedule, a.params) == (b.algorithm, b.schedule, b.params)


def test_round_trip_torus_with_faults_and_awkward_floats(tmp_path):
    t = torus("t", (3, 4), wrap=(True, False), bandwidth=(1e9 / 3, 32e9), latency=(1e-7, 0.1))
    t = with_faults(t, links=[(0, 1)], groups=[("ocs", [(4, 5), (5, 4)])])
    c = make_collective("a2a", K.ALLTOALL, t, tuple(range(12)), 12 * 8, dtype=DType.FP64,
                        algorithm=Hint("direct", (("chunks", 3), ("frac", 0.1))),
                        schedule=Hint("pipeline", (("k", "x"),)),
                        span=Span("f.ccl", 3, 5, 3, 9))
    s = direct_alltoall(c).replace(params=(("alpha", 2.5), ("n", 7), ("tag", "v")))
    same(s, from_json(json.loads(json.dumps(to_json(s)))))
    save(s, tmp_path / "s.json")
    back = load(tmp_path / "s.json")
    same(s, back)
    assert back.topology.link_bandwidth[0] == 1e9 / 3


def test_round_trip_fabric_nonuniform_and_rooted(tmp_path):
    node = NodeType("hgx", "nvswitch", 4, 450e9, 1e-6, nics=2, nic_bandwidth=50e9, nic_ports=2)
    t = leaf_spine("fab", 2, node, rails=2, leaves=None, spines=2, oversubscription=1.0,
                   bandwidth=50e9, latency=2e-6)
    pairs = (np.arange(64).reshape(8, 8) % 5) * 2
    c = make_collective("v", K.ALLTOALL, t, tuple(range(8)), dtype=DType.FP16,
                        pair_sizes=pairs)
    s = direct_alltoall(c)
    same(s, from_json(to_json(s)))
    r = build(make_collective("r", K.REDUCE, t, (1, 3, 5), 12, dtype=DType.INT32,
                              op=ReduceOp.MAX, root=2))
    back = from_json(json.loads(json.dumps(to_json(r))))
    same(r, back)
    verify(back)


def test_document_shape():
    s = build(coll(K.ALLGATHER))
    d = to_json(s)
    assert d["format"] == "cclc-schedule" and d["version"] == 1
    assert set(d) == {"format", "version", "algorithm", "schedule", "params", "topology",
                      "collective", "layouts", "routes", "ops"}
    assert list(d["ops"]) == ["step", "src", "dst", "route", "kind", "src_buf", "src_off",
                              "dst_buf", "dst_off", "count"]
    assert len({len(v) for v in d["ops"].values()}) == 1
    assert d["layouts"] == {"input": [2], "output": [2, 2, 2, 2], "scratch": []}


def _broken(mutate):
    d = to_json(build(coll(K.REDUCESCATTER)))
    d = copy.deepcopy(d)
    mutate(d)
    with pytest.raises(ScheduleError) as e:
        from_json(d)
    return e.value.message


def _set(path, value):
    def f(d):
        *head, last = path
        for k in head:
            d = d[k]
        d[last] = value
    return f


def _delete(path):
    def f(d):
        *head, last = path
        for k in head:
            d = d[k]
        del d[last]
    return f


@pytest.mark.parametrize("mutate, message", [
    (_set(["format"], "msccl"), ('not a cclc schedule document: expected "format": '
                                '"cclc-schedule"')),
    (_set(["version"], 2), ("schedule document version 2 is not supported; this cclc reads "
                           "version 1")),
    (_delete(["ops", "dst_off"]), "missing key 'ops.dst_off'"),
    (_delete(["topology", "links"]), "missing key 'topology.links'"),
    (_set(["ops", "count"], [1, 2]), ("'ops.count' has 2 entries, but 'ops.step' has 16: op "
                                     "columns must have equal lengths")),
    (_set(["ops", "kind", 3], 7), "'ops.kind[3]' is 7; it must be 0 (copy) or 1 (reduce)"),
    (_set(["ops", "src_buf", 0], 3), ("'ops.src_buf[0]' is 3; it must be 0 (input), 1 (output) "
                                     "or 2 (scratch)")),
    (_set(["ops", "src", 0], 1.5), ("'ops.src' must hold only ints, found numbers with a "
                                   "fraction")),
    (_set(["ops", "src"], "0,1"), "'ops.src' must be a list, not a string"),
    (_set(["collective", "dtype"], "fp8"), ("'collective.dtype' is 'fp8', which is not one of "
                                           "'fp64', 'fp32', 'fp16', 'bf16', 'int8', 'uint8', "
                                           "'int32', 'uint32', 'int64', 'uint64'")),
    (_set(["collective", "kind"], "gather"), ("'collective.kind' is 'gather', which is not one "
                                             "of 'alltoall', 'allgather', 'reducescatter', "
                                             "'allreduce', 'broadcast', 'reduce'")),
    (_set(["topology", "links", "kind", 0], "fiber"), ("'topology.links.kind' has 'fiber', which "
                                                      "is not one of ici, nvlink, pcie, ib, eth")),
    (_set(["topology", "links", "bandwidth"], [1.0]), ("'topology.links.bandwidth' has 1 "
                                                      "entries, but 'topology.links.src' has 8: "
                                                      "link columns must have equal lengths")),
    (_set(["collective", "size"], 7), ("'collective' is not a valid collective: size 7 B cannot "
                                      "be split evenly over 4 ranks x 4 B (fp32): it must be a "
                                      "multiple of 16 B")),
    (_set(["layouts", "output"], [[1, 2], [3]]), ("'layouts.output' has rows of different "
                                                 "lengths")),
    (_set(["routes", "offsets"], [0, 1]), "route table must start with the empty route 0"),
    (_set(["topology"], []), "'topology' must be a JSON object, not a list"),
    (_set(["collective", "group", 0], 9), ("'collective' is not a valid collective: rank 9 is "
                                          "not in topology 'ring'")),
])
def test_malformed_documents(mutate, message):
    assert _broken(mutate) == message


def test_load_errors(tmp_path):
    with pytest.raises(CclError, match=r"^cannot read .*nope\.json: No such file"):
        load(tmp_path / "nope.json")
    p = tmp_path / "bad.json"
    p.write_text('{"format": "cclc-schedule", ')
    with pytest.raises(ScheduleError, match=r"bad\.json is not valid JSON: line 1, column 29: "
                                            r"Expecting property name"):
        load(p)
    p.write_text('{"format": "cclc-schedule", "version": 1}')
    with pytest.raises(ScheduleError, match=r"bad\.json: missing key 'topology'$"):
        load(p)


def test_dropping_any_op_from_the_document_fails_verification():
    s = build(coll(K.ALLTOALL, torus("t", (3,))))
    d = to_json(s)
    for i in range(len(s.ops)):
        e = copy.deepcopy(d)
        for col in e["ops"].values():
            del col[i]
        with pytest.raises(ScheduleError, match=r"is empty at the end: no op writes it; it "
                           r"should hold rank \d's input elements"):
            verify(from_json(e))


def test_layout_kinds_survive():
    s = direct_alltoall(coll(K.ALLTOALL, torus("r", (2,)), pair_sizes=np.array([[4, 8],
                                                                             [0, 4]])))
    back = from_json(to_json(s))
    assert back.layouts[Buf.INPUT].ndim == 2 and back.layouts[Buf.SCRATCH].shape == (0,)


def test_the_documented_example_loads_and_verifies():
    import pathlib
    import re

    doc = pathlib.Path(__file__).parents[2] / "docs" / "schedule-format.md"
    block = re.search(r"```json\n(.*?)```", doc.read_text(), re.DOTALL).group(1)
    s = from_json(json.loads(block))
    verify(s)
    assert (s.collective.name, len(s.ops), s.n_steps) == ("ag", 4, 2)
    assert to_json(s) == json.loads(block)


@pytest.mark.parametrize("where", ["top", "nested"])
def test_a_key_given_twice_is_refused(tmp_path, where):
    # json.load keeps the last of two equal keys silently: the document would mean one thing
    # to cclc and another to a reader that keeps the first
    p = tmp_path / "dup.json"
    save(build(coll(K.ALLGATHER, torus("t", (3,)))), p)
    text = p.read_text()
    if where == "top":
        text = text.replace("{", '{"algorithm": "ring", ', 1)
        key = "algorithm"
    else:
        text = text.replace('"collective":{', '"collective":{"size":1,', 1).replace(
            '"collective": {', '"collective": {"size": 1, ', 1)
        key = "size"
    p.write_text(text)
    with pytest.raises(ScheduleError, match=rf"dup\.json: the key '{key}' appears twice in one "
                                            "object"):
        load(p)


def test_a_number_of_100000_digits_is_refused(tmp_path):
    p = tmp_path / "big.json"
    save(build(coll(K.ALLGATHER, torus("t", (3,)))), p)
    p.write_text(p.read_text().replace("{", '{"pad": ' + "9" * 100_000 + ", ", 1))
    with pytest.raises(ScheduleError, match=r"big\.json holds a number too large to be read"):
        load(p)


def test_save_goes_through_the_writer(tmp_path):
    """A schedule document is written like every file of cclc: listed in the folder's
    manifest, replaced when cclc wrote it, refused over the user's file without ``force``."""
    from cclc.outdir import OutputDir

    s = direct_alltoall(coll(K.ALLTOALL, torus("r", (2,))))
    path = tmp_path / "a.schedule.json"
    save(s, path)
    save(s, path)                                       # its own file: replaced
    assert OutputDir(tmp_path).files() == ("a.schedule.json",)
    mine = tmp_path / "mine.json"
    mine.write_text("{}")
    with pytest.raises(CclError, match="cclc did not write it"):
        save(s, mine)
    assert mine.read_text() == "{}"
    save(s, mine, force=True)
    assert load(mine).n_steps == s.n_steps


def test_round_trip_keeps_multicast(tmp_path):
    node = NodeType("hgx", "nvswitch", 4, 450e9, 1e-6, nics=2, nic_bandwidth=50e9,
                    multicast=True)
    t = leaf_spine("fab", 2, node, rails=2, leaves=None, spines=2, oversubscription=1.0,
                   bandwidth=50e9, latency=2e-6)
    s = direct_alltoall(make_collective("a", K.ALLTOALL, t, tuple(range(8)), 8 * 8 * 4))
    doc = to_json(s)
    assert doc["topology"]["multicast"] is True
    assert from_json(json.loads(json.dumps(doc))).topology.multicast
    # a machine without it writes no key: documents written before it stay as they were
    plain = leaf_spine("fab", 2, NodeType("hgx", "nvswitch", 4, 450e9, 1e-6, nics=2,
                                          nic_bandwidth=50e9),
                       rails=2, leaves=None, spines=2, oversubscription=1.0, bandwidth=50e9,
                       latency=2e-6)
    doc = to_json(direct_alltoall(make_collective("a", K.ALLTOALL, plain, tuple(range(8)),
                                                  8 * 8 * 4)))
    assert "multicast" not in doc["topology"]
