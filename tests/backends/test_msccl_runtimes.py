"""The MSCCL runtimes' loader limits (data with their sources, checked on every emitted file by
counting the XML here, independently of the lowering), maxBytes and scratch, the root warning,
and the executor on XML written by msccl-tools, whose own checker's verdicts it must give."""

from __future__ import annotations

import csv
import pathlib
import re
import xml.etree.ElementTree as ET
from collections import defaultdict

import pytest
from backend_helpers import pairwise_alltoall, ring_allgather, ring_reducescatter
from hypothesis import given, settings
from hypothesis import strategies as st

from backends.common import EmitOptions
from backends.msccl import emit, render_xml
from backends.msccl.executor import TooLarge, XmlError, execute, main, memory_estimate
from backends.msccl.lower import (
    Instr,
    LimitError,
    Threadblock,
    _check_limits,
    _renumber_for_depids,
)
from backends.msccl.runtimes import LIMITS, RUNTIMES
from cclc.algorithms import algorithms_for
from cclc.collective import CollectiveKind, make_collective
from cclc.ir import Buf, ScheduleBuilder
from cclc.topology import torus

DATA = pathlib.Path(__file__).parents[1] / "data" / "msccl_tools"


def xml_limits(text: str) -> dict[str, int]:
    """What a loader would count in ``text``, per the worst GPU (see runtimes.py)."""
    root = ET.fromstring(text)
    gpus = root.findall("gpu")
    worst = dict(nodes=0, tbs=0, steps=0, chan_peers=0, depid=-1, cnt=0, chan=0)
    for g in gpus:
        tbs = g.findall("tb")
        steps = [s for tb in tbs for s in tb.findall("step")]
        worst["nodes"] = max(worst["nodes"], 1 + len(gpus) + len(tbs) + len(steps))
        worst["tbs"] = max(worst["tbs"], len(tbs))
        peers: dict[tuple[str, str], set[str]] = defaultdict(set)
        for tb in tbs:
            worst["steps"] = max(worst["steps"], len(tb.findall("step")))
            worst["chan"] = max(worst["chan"], int(tb.get("chan")))
            for way in ("send", "recv"):
                if tb.get(way) != "-1":
                    peers[(way, tb.get("chan"))].add(tb.get(way))
        worst["chan_peers"] = max([worst["chan_peers"]] + [len(p) for p in peers.values()])
        for s in steps:
            worst["depid"] = max(worst["depid"], int(s.get("depid")))
            worst["cnt"] = max(worst["cnt"], int(s.get("cnt")))
    return worst


def assert_loads(text: str, runtime: str) -> None:
    """``text`` is within every limit of ``runtime`` that its loader checks."""
    lim = {k: v.value for k, v in LIMITS[runtime].items()}
    got = xml_limits(text)
    assert got["nodes"] < lim["xml_nodes"], got
    assert got["tbs"] <= lim["tbs"], got
    assert got["steps"] <= lim["steps_per_tb"], got
    assert got["chan_peers"] <= lim["tbs_per_channel"], got
    assert got["depid"] <= lim["depid"], got
    assert got["cnt"] < lim["count"], got
    assert got["chan"] < lim["channels"], got


# -- the limits as data ---------------------------------------------------------------------------

def test_every_limit_names_its_source():
    names = set(LIMITS["msccl"])
    for key, limits in LIMITS.items():
        assert set(limits) == names
        for lim in limits.values():
            assert re.fullmatch(r"[0-9a-f]{40}", lim.commit)
            assert lim.repo in ("microsoft/msccl", "Azure/msccl-executor-nccl", "ROCm/rccl")
            assert lim.file.startswith(("src/", "makefiles/")) and lim.symbol
        rt = RUNTIMES[key]
        assert rt.max_tbs == limits["tbs"].value and rt.max_cnt == limits["count"].value - 1
    # the numbers the issue was about
    assert LIMITS["rccl"]["tbs"].value == 64
    assert all(LIMITS[k]["tbs_per_channel"].value == 32 for k in LIMITS)
    assert all(LIMITS[k]["depid"].value == 127 for k in LIMITS)
    assert all(LIMITS[k]["xml_nodes"].value == 4096 for k in LIMITS)


# -- the lowering fits them -----------------------------------------------------------------------

@pytest.mark.parametrize("runtime", ["msccl", "msccl-executor"])
def test_direct_alltoall_spreads_peers_over_channels(runtime):
    # 40 ranks: 39 peers each, more than 32 on one channel
    s = pairwise_alltoall(n=40, elems=1)
    xml = render_xml(s, EmitOptions(msccl_runtime=runtime))
    assert_loads(xml, runtime)
    assert xml_limits(xml)["chan"] >= 1       # it needed a second channel
    execute(xml)


def test_rccl_refuses_more_peers_than_threadblocks():
    s = pairwise_alltoall(n=70, elems=1)
    with pytest.raises(LimitError, match=r"69 peers.*allows 64 threadblocks.*"
                                         r"MSCCL_MAX_NUM_THREAD_BLOCKS in ROCm/rccl"):
        render_xml(s, EmitOptions(msccl_runtime="rccl"))


def test_user_channel_limit_below_the_peer_spread_is_refused():
    s = pairwise_alltoall(n=40, elems=1)
    with pytest.raises(LimitError, match=r"39 peers.*needs 2 channels, more than 1"):
        render_xml(s, EmitOptions(nchannels=1))


def _tbs(n: int, waits: dict[int, int]) -> list[Threadblock]:
    """``n`` threadblocks on one GPU; ``waits[a] = b``: tb a's first step waits on tb b."""
    tbs = []
    for t in range(n):
        ins = Instr(0, "nop", Buf.INPUT, None, Buf.OUTPUT, None, 0, (), tb=t, index=0)
        if t in waits:
            ins.depid, ins.deps = waits[t], 0
        tbs.append(Threadblock(t, None, None, 0, [ins]))
    return tbs


@given(st.dictionaries(st.integers(0, 199), st.integers(0, 199), max_size=60))
@settings(max_examples=60, deadline=None)
def test_depids_are_renumbered_below_128(waits):
    tbs = _tbs(200, waits)
    before = {id(tb): (tb.steps[0].depid, tb.steps[0].deps) for tb in tbs}
    target = {id(tbs[a]): id(tbs[b]) for a, b in waits.items()}
    rank = [tbs[:]]
    _renumber_for_depids(rank, RUNTIMES["msccl"])
    by_id = {tb.id: tb for tb in rank[0]}
    assert sorted(by_id) == list(range(200))
    for tb in rank[0]:
        ins = tb.steps[0]
        assert ins.tb == tb.id
        if before[id(tb)][0] is not None:
            # the same threadblock is waited on, under its new id, which fits an int8
            assert id(by_id[ins.depid]) == target[id(tb)] and ins.depid <= 127


def test_more_than_128_waited_threadblocks_are_refused():
    tbs = _tbs(300, {t: t + 1 for t in range(0, 280, 2)})   # 140 distinct waited-on tbs
    rank = [tbs]
    _renumber_for_depids(rank, RUNTIMES["msccl-executor"])
    with pytest.raises(LimitError, match=r"int8.*dependentBid"):
        _check_limits(rank, RUNTIMES["msccl-executor"], 2)


def test_xml_node_limit_is_per_rank_and_named():
    tbs = [Threadblock(t, -1, -1, 0, [Instr(0, "cpy", Buf.INPUT, 0, Buf.OUTPUT, 0, 1, ())
                                      for _ in range(250)]) for t in range(16)]
    # 1 <algo> + 79 <gpu> + 16 <tb> + 4000 <step> = 4096 nodes: one too many
    with pytest.raises(LimitError, match=r"4096 XML nodes.*at most 4095.*MAX_NODES"):
        _check_limits([tbs], RUNTIMES["msccl"], 79)
    _check_limits([tbs], RUNTIMES["msccl"], 78)


def _chunked_allgather(k: int):
    """Allgather on 2 ranks, each input cut into ``k`` one-element chunks, every chunk copied
    and sent alone: k sends, k receives and k copies per rank."""
    topo = torus("pair", (2,))
    coll = make_collective("ag", CollectiveKind.ALLGATHER, topo, (0, 1), 2 * k * 4)
    b = ScheduleBuilder(coll, input=[1] * k, output=[1] * (2 * k))
    for r in range(2):
        for c in range(k):
            b.add(step=c, src=r, dst=r, src_buf=Buf.INPUT, src_off=c, dst_buf=Buf.OUTPUT,
                  dst_off=r * k + c)
            b.add(step=c, src=r, dst=1 - r, route=b.route(topo.shortest_path_links(r, 1 - r)),
                  src_buf=Buf.INPUT, src_off=c, dst_buf=Buf.OUTPUT, dst_off=r * k + c)
    return b.build("chunked")


def test_many_chunks_are_refused_before_the_lowering():
    # 2050 messages + 2050 copies per rank: refused by counting, before any threadblock
    with pytest.raises(LimitError, match="at least 4100 <step> nodes.*XML nodes per rank"):
        render_xml(_chunked_allgather(2050), EmitOptions(msccl_runtime="rccl"))


# -- maxBytes, scratch, root ----------------------------------------------------------------------

def _attr(xml: str, name: str) -> int:
    return int(re.search(rf'{name}="(\d+)"', xml).group(1))


@pytest.mark.parametrize("runtime", sorted(RUNTIMES))
def test_max_bytes_is_the_compiled_size(runtime, tmp_path):
    s = ring_reducescatter()
    size = s.collective.size
    xml = render_xml(s, EmitOptions(msccl_runtime=runtime))
    # microsoft/msccl serves nBytes < maxBytes, the others nBytes <= maxBytes
    assert _attr(xml, "maxBytes") == size + (runtime == "msccl")
    assert _attr(render_xml(s, EmitOptions(msccl_runtime=runtime, max_bytes=1 << 20)),
                 "maxBytes") == 1 << 20
    _, report = emit(s, tmp_path, EmitOptions(msccl_runtime=runtime, max_bytes=1 << 20))
    text = report.read_text()
    s_chunks = max(_attr(g, "s_chunks") for g in re.findall(r"<gpu [^>]*>", xml))
    nck = _attr(xml, "nchunksperloop")
    if runtime == "msccl":
        assert f"= {(1 << 20) * s_chunks // nck} B" in text and "communicator is created" in text
    else:
        assert f"= {size * s_chunks // nck} B" in text and "first call" in text


def test_max_bytes_zero_means_no_bound_only_where_the_runtime_says_so():
    s = ring_reducescatter()
    assert _attr(render_xml(s, EmitOptions(msccl_runtime="rccl", max_bytes=0)),
                 "maxBytes") == 0
    with pytest.raises(Exception, match="maxBytes must be > 0"):
        render_xml(s, EmitOptions(msccl_runtime="msccl", max_bytes=0))
    with pytest.raises(Exception, match="minBytes .* above maxBytes"):
        render_xml(s, EmitOptions(msccl_runtime="rccl", min_bytes=100, max_bytes=50))


@pytest.mark.parametrize("kind", [CollectiveKind.BROADCAST, CollectiveKind.REDUCE])
def test_report_names_the_root(kind, tmp_path):
    topo = torus("ring4", (4,))
    coll = make_collective("c", kind, topo, (0, 1, 2, 3), 64, root=2)
    algo = next(a for a in algorithms_for(coll) if a.applicable(coll) is None)
    for runtime in RUNTIMES:
        _, report = emit(algo.build(coll), tmp_path, EmitOptions(msccl_runtime=runtime))
        text = report.read_text()
        assert "compiled for root 2" in text and "silently computes a wrong result" in text


def test_report_has_no_root_line_without_a_root(tmp_path):
    _, report = emit(ring_allgather(), tmp_path, EmitOptions())
    assert "root" not in report.read_text()


# -- the executor on msccl-tools' XML -------------------------------------------------------------

VERDICTS = list(csv.DictReader((DATA / "verdicts.csv").open()))


@pytest.mark.parametrize("row", VERDICTS, ids=lambda r: r["file"])
def test_executor_agrees_with_the_msccl_tools_checker(row):
    text = (DATA / row["file"]).read_text()
    if row["checker"] == "pass":
        execute(text)
        execute(text, order="random", seed=3)
    else:
        with pytest.raises(XmlError):
            execute(text)


def test_the_data_covers_in_place_files_and_failures():
    inplace = [r for r in VERDICTS if 'inplace="1"' in (DATA / r["file"]).read_text()]
    colls = {re.search(r'coll="(\w+)"', (DATA / r["file"]).read_text()).group(1)
             for r in inplace}
    assert {"allgather", "allreduce", "reduce_scatter"} <= colls
    assert {r["checker"] for r in VERDICTS} == {"pass", "fail"}


def test_one_message_of_buffering_is_too_little_for_msccl_tools_rings():
    # the runtime buffers two messages per connection; with one this correct ring deadlocks
    text = (DATA / "simple_allreduce_ring_4.xml").read_text()
    with pytest.raises(XmlError, match="deadlock"):
        execute(text, capacity=1)
    execute(text, capacity=2)


def test_in_place_reduce_scatter_without_steps_fails():
    text = (DATA / "own_rs_ring_inplace.xml").read_text()
    assert 'o_chunks="0"' in text
    empty = re.sub(r'<tb [^>]*>.*?</tb>', "", text, flags=re.S)
    with pytest.raises(XmlError, match="output chunk"):
        execute(empty)


def test_a_postcondition_that_checks_nothing_is_refused():
    text = (DATA / "own_rs_ring_inplace.xml").read_text().replace('inplace="1"', 'inplace="0"')
    empty = re.sub(r'<tb [^>]*>.*?</tb>', "", text, flags=re.S)
    with pytest.raises(XmlError, match="checks no output chunk"):
        execute(empty)


def test_large_files_are_refused_cleanly(tmp_path, capsys):
    text = (DATA / "allgather_ring_8_ch2.xml").read_text()
    need = memory_estimate(text)
    with pytest.raises(TooLarge, match="no verdict"):
        execute(text, max_memory=need - 1)
    execute(text, max_memory=need)
    path = tmp_path / "a.xml"
    path.write_text(text)
    assert main([str(path), "--max-memory", str((need - 1) / 2**30)]) == 2
    assert "REFUSED" in capsys.readouterr().err


# -- the command line -----------------------------------------------------------------------------

CCL = """
topology ring = torus(4) { link 32 GB/s, 100 ns }
collective ag = allgather on ring { size 64 KiB; algorithm ring }
"""


def test_cli_max_bytes(tmp_path, capsys):
    from cclc.cli import main

    src = tmp_path / "ag.ccl"
    src.write_text(CCL)
    out = tmp_path / "out"
    assert main(["compile", str(src), "-o", str(out), "--emit", "msccl",
                 "--msccl-runtime", "rccl", "--msccl-max-bytes", "1048576"]) == 0
    assert 'maxBytes="1048576"' in (out / "ag.rccl.xml").read_text()
    assert main(["compile", str(src), "-o", str(out), "--emit", "msccl"]) == 0
    assert f'maxBytes="{64 * 1024 + 1}"' in (out / "ag.msccl.xml").read_text()
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main(["compile", str(src), "-o", str(out), "--msccl-max-bytes", "lots"])
    assert exc.value.code == 2
    assert "expected a byte count" in capsys.readouterr().err


def test_threadblock_overflow_lowers_again_with_fewer_channels(monkeypatch):
    import backends.msccl.lower as msccl
    from backends.msccl.lower import DepidLimitError, ThreadblockLimitError

    real = msccl.lower
    asked = []

    def lower(us, rt, **kw):
        # pretend the first two lowerings (8 channels, then fewer) need too many threadblocks
        asked.append(kw["nchannels"])
        if len(asked) == 1:
            err = DepidLimitError("waits on threadblock 130", 160)
            err.channels = 8
            raise err
        if len(asked) == 2:
            err = ThreadblockLimitError("needs 300 threadblocks", 300)
            err.channels = 6
            raise err
        return real(us, rt, **kw)

    monkeypatch.setattr(msccl, "lower", lower)
    xml = render_xml(pairwise_alltoall(n=4), EmitOptions())
    # 8 channels x 128 / 160 threadblocks = 6; then 6 x 216 / 300 = 4
    assert asked == [None, 6, 4]
    execute(xml)
