"""MSCCL XML: golden files, the independent executor on every emitted file, hand-broken files,
runtime limits, and the fallback report."""

from __future__ import annotations

import re

import pytest
from backend_helpers import (
    check_golden,
    fabric_2x3,
    pairwise_alltoall,
    ring_allgather,
    ring_reducescatter,
    swap_allreduce,
    swap_alltoall,
    uneven_ring_allgather,
)

from backends.common import EmitOptions
from backends.msccl import emit, render_xml
from backends.msccl.executor import XmlError, execute, parse
from cclc.algorithms import algorithms_for
from cclc.collective import CollectiveKind, ReduceOp, make_collective
from cclc.errors import ScheduleError
from cclc.ir import Buf, ScheduleBuilder
from cclc.outdir import OutputDir
from cclc.topology import torus, with_faults

RUNTIMES = ("msccl", "msccl-executor", "rccl")
ORDERS = ("round-robin", "reverse", "random")


@pytest.mark.parametrize("make, runtime, golden", [
    (ring_allgather, "msccl", "ag_ring.msccl.xml"),
    (ring_reducescatter, "msccl-executor", "rs_ring.msccl-executor.xml"),
    (pairwise_alltoall, "rccl", "a2a.rccl.xml"),
    (swap_allreduce, "msccl", "ar_swap.msccl.xml"),
    (swap_alltoall, "msccl", "a2a_swap.msccl.xml"),
])
def test_golden_xml(make, runtime, golden):
    xml = render_xml(make(), EmitOptions(msccl_runtime=runtime))
    check_golden(golden, xml)
    execute(xml)


def test_golden_report(tmp_path):
    paths = emit(ring_reducescatter(), tmp_path, EmitOptions(msccl_runtime="rccl"))
    assert [p.name for p in paths] == ["rs_ring.rccl.xml", "rs_ring.rccl.report.md"]
    check_golden("rs_ring.rccl.report.md", paths[1].read_text())


def _small_collectives():
    """Every registered algorithm on a few small machines, for every collective it serves."""
    # t33f: a failed cable cuts a ring, which ring+dimrotation runs as a line
    machines = [torus("ring4", (4,)), torus("ring3", (3,)), torus("t23", (2, 3)), fabric_2x3(),
                with_faults(torus("t33f", (3, 3)), [(0, 1), (1, 0)])]
    for topo in machines:
        n = topo.n_ranks
        for kind in (CollectiveKind.ALLGATHER, CollectiveKind.ALLTOALL,
                     CollectiveKind.REDUCESCATTER, CollectiveKind.ALLREDUCE,
                     CollectiveKind.BROADCAST, CollectiveKind.REDUCE):
            rooted = kind in (CollectiveKind.BROADCAST, CollectiveKind.REDUCE)
            coll = make_collective(kind.value, kind, topo, tuple(range(n)), 4 * n * n * 4,
                                   root=n - 1 if rooted else None)
            for algo in algorithms_for(coll):
                if algo.applicable(coll) is None:
                    yield f"{topo.name}-{kind.value}-{algo.name}", algo.build(coll)


SCHEDULES = dict(_small_collectives())


@pytest.mark.slow
@pytest.mark.parametrize("key", sorted(SCHEDULES))
def test_executor_accepts_every_emitted_xml(key):
    s = SCHEDULES[key]
    for runtime in RUNTIMES:
        for fuse in (True, False):
            try:
                xml = render_xml(s, EmitOptions(msccl_runtime=runtime, fuse=fuse))
            except ScheduleError as err:
                # a limit of this runtime: the message must say which
                assert re.search(r"allows|has \d+ channels|no \w+ collective", err.message)
                continue
            for order in ORDERS:
                execute(xml, order=order, root=s.collective.root or 0)


def test_executor_checks_other_ops():
    s = ring_reducescatter(op=ReduceOp.MAX)
    execute(render_xml(s), op="max")
    execute(render_xml(s), op="prod")


def test_fusion_makes_chains():
    xml = render_xml(ring_allgather(), EmitOptions())
    assert xml.count('type="rcs"') == 4 * 2          # each block forwarded twice
    xml = render_xml(ring_reducescatter(), EmitOptions())
    assert 'type="rrcs"' in xml or 'type="rrs"' in xml
    unfused = render_xml(ring_allgather(), EmitOptions(fuse=False))
    assert "rcs" not in unfused
    execute(unfused)


# -- hand-broken XML is rejected -----------------------------------------------------------------

def _tb_with_two_sends(xml: str) -> tuple[str, str]:
    for tb in re.findall(r"<tb [^>]*>.*?</tb>", xml, flags=re.DOTALL):
        sends = re.findall(r'<step [^>]*type="s"[^>]*/>', tb)
        if len(sends) >= 2:
            return sends[0], sends[1]
    raise AssertionError("no threadblock with two sends")


def test_rejects_swapped_sends():
    xml = render_xml(ring_allgather(), EmitOptions(fuse=False))
    a, b = _tb_with_two_sends(xml)
    sa, sb = re.search(r's="(\d+)"', a).group(1), re.search(r's="(\d+)"', b).group(1)
    swapped = xml.replace(a, "\0A").replace(b, "\0B")
    swapped = swapped.replace("\0A", b.replace(f's="{sb}"', f's="{sa}"'))
    swapped = swapped.replace("\0B", a.replace(f's="{sa}"', f's="{sb}"'))
    assert swapped != xml
    # with send and receive streams paired in one tb, the later send may now run before the
    # receive that fills its chunk
    with pytest.raises(XmlError, match="output chunk|race|holds no data"):
        execute(swapped)


def test_rejects_missing_dependency():
    xml = render_xml(swap_allreduce(), EmitOptions())
    steps = re.findall(r'<step [^>]*depid="[0-9]+"[^>]*/>', xml)
    assert steps
    for step in steps:
        broken = xml.replace(step, re.sub(r'depid="\d+" deps="\d+"', 'depid="-1" deps="-1"',
                                          step), 1)
        with pytest.raises(XmlError, match="race"):
            execute(broken)


def test_rejects_wrong_offset():
    xml = render_xml(pairwise_alltoall(), EmitOptions())
    step = re.search(r'<step [^>]*type="r" [^>]*dstoff="(\d+)"[^>]*/>', xml)
    off = int(step.group(1))
    broken = xml.replace(step.group(0), step.group(0).replace(f'dstoff="{off}"',
                                                              f'dstoff="{(off + 1) % 3}"'), 1)
    with pytest.raises(XmlError, match="output chunk|race"):
        execute(broken)


_TWO_GPU = """<algo name="x" proto="Simple" nchannels="1" nchunksperloop="2" ngpus="2"
 coll="allgather" inplace="0">
{gpus}
</algo>"""


def _gpu(g: int, steps: str, extra: str = "") -> str:
    return (f'<gpu id="{g}" i_chunks="1" o_chunks="2" s_chunks="0">'
            f'<tb id="0" send="{1 - g}" recv="{1 - g}" chan="0">{steps}</tb>{extra}</gpu>')


def _st(s: int, typ: str, sb="i", so=0, db="o", do=0, cnt=1, depid=-1, deps=-1, hasdep=0):
    return (f'<step s="{s}" type="{typ}" srcbuf="{sb}" srcoff="{so}" dstbuf="{db}" '
            f'dstoff="{do}" cnt="{cnt}" depid="{depid}" deps="{deps}" hasdep="{hasdep}"/>')


def _allgather2(first_recv: bool) -> str:
    gpus = []
    for g in range(2):
        send = _st(0, "s", "i", 0, "o", g)
        recv = _st(1, "r", "i", 0, "o", 1 - g)
        if first_recv:
            send, recv = recv.replace('s="1"', 's="0"'), send.replace('s="0"', 's="1"')
        copy = ('<tb id="1" send="-1" recv="-1" chan="0">'
                + _st(0, "cpy", "i", 0, "o", g) + "</tb>")
        gpus.append(_gpu(g, send + recv, copy))
    return _TWO_GPU.format(gpus="\n".join(gpus))


def test_hand_written_allgather_runs_and_deadlock_is_found():
    outputs = execute(_allgather2(False))
    assert len(outputs) == 2 and (outputs[0] == outputs[1]).all()
    with pytest.raises(XmlError, match="deadlock"):
        execute(_allgather2(True))


def test_rejects_structural_faults():
    good = _allgather2(False)
    with pytest.raises(XmlError, match="lacks hasdep"):
        execute(good.replace('<step s="0" type="cpy" srcbuf="i" srcoff="0" dstbuf="o" dstoff="0"'
                             ' cnt="1" depid="-1" deps="-1" hasdep="0"/>',
                             _st(0, "nop", depid=0, deps=0) + _st(1, "cpy"), 1))
    with pytest.raises(XmlError, match="outside buffer"):
        execute(good.replace('dstoff="1" cnt="1"', 'dstoff="2" cnt="1"', 1))
    with pytest.raises(XmlError, match="threadblock 1 is missing|missing"):
        execute(good.replace('<tb id="1"', '<tb id="2"', 1))
    with pytest.raises(XmlError, match="holds no data|output chunk"):
        execute(good.replace('type="cpy"', 'type="nop"'))


def test_rejects_double_reduction():
    xml = render_xml(ring_reducescatter(), EmitOptions(fuse=False))
    # reduce the same received partial sum twice: turn the final copy into a reduction
    broken = xml.replace('type="cpy" srcbuf="s"', 'type="re" srcbuf="s"', 1)
    with pytest.raises(XmlError, match="no data|twice"):
        execute(broken)


# -- limits --------------------------------------------------------------------------------------

def _many_sends(n_msgs: int, per_msg: int = 1):
    topo = torus("pair", (2,))
    coll = make_collective("many", CollectiveKind.ALLGATHER, topo, (0, 1),
                           2 * n_msgs * per_msg * 4)
    b = ScheduleBuilder(coll, input=[per_msg] * n_msgs, output=[per_msg] * (2 * n_msgs))
    for r in range(2):
        route = b.route(topo.shortest_path_links(r, 1 - r))
        b.add(step=0, src=r, dst=r, src_buf=Buf.INPUT, src_off=0, dst_buf=Buf.OUTPUT,
              dst_off=r * n_msgs, count=n_msgs)
        for k in range(n_msgs):
            b.add(step=k, src=r, dst=1 - r, route=route, src_buf=Buf.INPUT, src_off=k,
                  dst_buf=Buf.OUTPUT, dst_off=r * n_msgs + k)
    return b.build("hand")


def test_long_ops_are_cut_below_the_cnt_limit():
    # an op of 80 chunks exceeds MSCCL_MAX_COUNT (cnt < 72): it becomes consecutive pieces
    xml = render_xml(_many_sends(80))
    counts = [int(c) for c in re.findall(r'cnt="(\d+)"', xml)]
    assert max(counts) == 71 and 80 - 71 in counts
    execute(xml)


def test_too_many_chunks_is_a_clear_error():
    topo = torus("pair", (2,))
    coll = make_collective("fine", CollectiveKind.ALLGATHER, topo, (0, 1), 2 * 40000 * 4)
    b = ScheduleBuilder(coll, input=[1] * 40000, output=[40000, 40000])
    for r in range(2):
        b.add(step=0, src=r, dst=r, src_buf=Buf.INPUT, src_off=0, dst_buf=Buf.OUTPUT,
              dst_off=r, count=40000)
    with pytest.raises(ScheduleError, match=r"gcd .* \(1, 40000 elements\).*80000 chunks per "
                                            r"buffer, more than .* \(32767, .*int16_t"):
        render_xml(b.build("hand"))


def test_steps_per_threadblock_limit_differs_by_runtime():
    s = _many_sends(70)
    # on one channel the 70 messages need one threadblock of 70 steps
    with pytest.raises(ScheduleError, match="70 steps; .*allows 64 per threadblock"):
        render_xml(s, EmitOptions(msccl_runtime="msccl-executor", nchannels=1))
    execute(render_xml(s, EmitOptions(msccl_runtime="msccl", nchannels=1)))   # 256 there
    # free to choose, the lowering spreads them over more channels
    xml = render_xml(s, EmitOptions(msccl_runtime="msccl-executor"))
    assert int(re.search(r'nchannels="(\d+)"', xml).group(1)) > 1
    execute(xml)


def test_channel_limit_option():
    s = ring_allgather()
    xml = render_xml(s, EmitOptions(nchannels=1))
    assert 'nchannels="1"' in xml
    execute(xml)


# -- spellings and report ------------------------------------------------------------------------

def test_runtime_spellings():
    s = ring_reducescatter()
    head = {rt: render_xml(s, EmitOptions(msccl_runtime=rt)).splitlines()[0] for rt in RUNTIMES}
    assert 'coll="reduce_scatter"' in head["msccl"] and "outofplace" not in head["msccl"]
    assert 'coll="reducescatter"' in head["msccl-executor"]
    assert 'outofplace="1"' in head["msccl-executor"]
    # maxBytes is the compiled size (24 B); microsoft/msccl's bound is exclusive
    assert 'maxBytes="24"' in head["rccl"] and 'maxBytes="25"' in head["msccl"]
    for rt in RUNTIMES:
        a = parse(render_xml(s, EmitOptions(msccl_runtime=rt)))
        assert a.coll == "reducescatter" and a.nchunksperloop == 3 and a.ngpus == 3


def test_report_names_fallbacks_and_loading(tmp_path):
    for rt, env in [("msccl", "MSCCL_XML_FILES"), ("msccl-executor", "MSCCL_ALGO_DIR"),
                    ("rccl", "RCCL_MSCCL_FORCE_ENABLE")]:
        xml, report = emit(swap_allreduce(), tmp_path, EmitOptions(msccl_runtime=rt))
        text = report.read_text()
        assert env in text and xml.name in text
        for word in ("size window", "count divisibility", "in-place", "reduction op",
                     "group size", "multiple of 2"):
            assert word in text, (rt, word)
        assert "copies the input into scratch" in text


def test_emit_into_output_dir_with_cli_options(tmp_path):
    out = OutputDir(tmp_path / "out")
    paths = emit(ring_allgather(), out, EmitOptions(msccl_runtime="rccl"))
    assert all(p.exists() for p in paths)
    assert set(out.files()) == {"ag_ring.rccl.xml", "ag_ring.rccl.report.md"}


def test_the_backend_renders_the_xml_in_pieces_the_pipeline_writes(tmp_path):
    from backends.contract import Facts
    from backends.msccl import BACKEND

    s = ring_allgather()
    options = EmitOptions(msccl_runtime="msccl-executor")
    rendered = BACKEND.render(s, options, Facts())
    xml = rendered["ag_ring.msccl-executor.xml"]
    assert not isinstance(xml, (str, bytes))      # produced as it is written, one <gpu> a piece
    (path, _) = emit(s, tmp_path, options)
    assert path.read_bytes() == render_xml(s, options).encode("utf-8")


def test_executor_command_line(tmp_path, capsys):
    from backends.msccl.executor import main as run_executor

    xml, _ = emit(ring_reducescatter(), tmp_path)
    assert run_executor([str(xml)]) == 0
    broken = tmp_path / "broken.xml"
    broken.write_text(xml.read_text().replace('type="rrs"', 'type="rcs"', 1))
    assert run_executor([str(broken), "--op", "max"]) == 1
    assert "FAIL" in capsys.readouterr().err


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_uneven_chunks_use_near_equal_units(runtime, tmp_path):
    s = uneven_ring_allgather(n=3, elems=100_000, pieces=3)
    xml = render_xml(s, EmitOptions(msccl_runtime=runtime))
    assert 'nchunksperloop="9"' in xml and 'i_chunks="3"' in xml and 'o_chunks="9"' in xml
    execute(xml)
    paths = emit(s, tmp_path, EmitOptions(msccl_runtime=runtime))
    report = paths[1].read_text()
    # 300000 elements are not a multiple of 9: this very size falls back
    assert "THIS compiled size is not a multiple of 9 elements" in report
    assert "33333 to 33334" in report


def test_uneven_chunks_that_divide_the_count_run_at_the_compiled_size(tmp_path):
    # 200000 elements cut 99999 + 100001: two near-equal units, and 2 divides the count, so
    # the runtime uses the file at this size too (with equal chunks)
    s = uneven_ring_allgather(n=3, cut=[99_999, 100_001])
    xml = render_xml(s, EmitOptions())
    assert 'nchunksperloop="6"' in xml
    execute(xml)
    report = emit(s, tmp_path, EmitOptions())[1].read_text()
    assert "THIS compiled size" not in report
    assert "at the compiled size the runtime cuts equal chunks" in report


def test_send_and_receive_streams_share_threadblocks():
    from backends.msccl.lower import lower
    from backends.msccl.runtimes import RUNTIMES
    from backends.units import to_units

    us, _ = to_units(pairwise_alltoall(n=5))
    paired = lower(us, RUNTIMES["msccl"])
    apart = lower(us, RUNTIMES["msccl"], pair=False)
    # per GPU: one tb of local copies, then 4 paired (send, recv) tbs instead of 4 + 4
    assert [len(t) for t in paired.tbs] == [5] * 5
    assert [len(t) for t in apart.tbs] == [9] * 5
    for tbs in paired.tbs:
        remote = [tb for tb in tbs if tb.send is not None or tb.recv is not None]
        assert all(tb.send is not None and tb.recv is not None for tb in remote)
        # one tb per connection and direction: FIFO order per (peer, channel) is kept
        assert len({(tb.send, tb.chan) for tb in remote}) == len(remote)
        assert len({(tb.recv, tb.chan) for tb in remote}) == len(remote)
    execute(render_xml(pairwise_alltoall(n=5), EmitOptions()))
