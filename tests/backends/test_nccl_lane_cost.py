"""What the NCCL library's lanes cost (cclc.lane_cost): NCCL's buffer sizes recomputed here from
the formulas in NVIDIA/nccl v2.30.7-1, the estimate against a count made by hand from the
emitted tables, the budget's choices, and the compile report."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys

import numpy as np
import pytest
from backend_helpers import pairwise_alltoall, random_allgather, ring_reducescatter
from hypothesis import given, settings
from hypothesis import strategies as st

from backends.contract import EmitOptions
from backends.nccl import BACKEND, ONESIDED, render_sources
from backends.nccl.tables import COLUMNS, DataflowRole, dataflow_tables, table_lane_cost
from backends.units import to_units
from cclc import plan as plan_module
from cclc.collective import CollectiveKind, Hint, make_collective
from cclc.dataflow import lower_schedule
from cclc.errors import CclError, ScheduleError
from cclc.execution import NCCL_GROUP_OVERHEAD, NCCL_MODEL, model_lanes, unpriced_reason
from cclc.lane_cost import (
    P2P_RECV_BYTES,
    P2P_SEND_BYTES,
    choose_lanes,
    lane_floor_refusal,
    schedule_lane_cost,
)
from cclc.plan import plan
from cclc.topology import torus

MIB = 2 ** 20


def _nccl_p2p_sides(read: bool) -> tuple[int, int]:
    """Bytes per channel of one P2P connection at the sender and at the receiver, from
    NVIDIA/nccl v2.30.7-1: src/include/device.h (NCCL_STEPS 8, NCCL_LL_MAX_NTHREADS 512,
    NCCL_LL_LINES_PER_THREAD 8, union ncclLLFifoLine of four uint32, NCCL_LL128_MAX_NTHREADS
    640, NCCL_LL128_ELEMS_PER_THREAD 120), src/init.cc (DEFAULT_*BUFFSIZE), src/include/comm.h
    (MEM_ALIGN 4096 pads ncclSendMem and ncclRecvMem, CUDA_IPC_MIN 2097152) and
    src/transport/p2p.cc (p2pSendSetup, p2pRecvSetup)."""
    steps = 8
    ll = 8 * 512 * steps * (4 * 4)
    ll128 = 120 * 640 * steps * 8
    simple = 4 * 1024 * 1024
    header, ipc_min = 4096, 2097152

    def align(x: int) -> int:
        return (x + ipc_min - 1) // ipc_min * ipc_min

    if read:    # the Simple buffer sits at the sender, after its ncclSendMem
        return align(header + simple), align(header + ll + ll128)
    return align(header), align(header + ll + ll128 + simple)


def test_buffer_sizes_are_nccls():
    assert (P2P_SEND_BYTES, P2P_RECV_BYTES) == _nccl_p2p_sides(read=True) == (6 * MIB, 6 * MIB)
    # without P2P read a connection is split differently, but costs the same in all
    assert sum(_nccl_p2p_sides(read=False)) == P2P_SEND_BYTES + P2P_RECV_BYTES


def _by_hand(tables, ctas: int) -> tuple[int, int]:
    """Most bytes and most events of any rank, counted entry by entry."""
    read_send, read_recv = _nccl_p2p_sides(read=True)
    most_bytes = most_events = 0
    for entries in tables.entries:
        sends = {(e.peer, e.lane) for e in entries if e.role == DataflowRole.SEND}
        recvs = {(e.peer, e.lane) for e in entries if e.role == DataflowRole.RECV}
        most_bytes = max(most_bytes, ctas * (len(sends) * read_send + len(recvs) * read_recv))
        # an event per entry, one for the caller's stream, one per stream (nccl.cu.j2)
        most_events = max(most_events, len(entries) + 1 + tables.n_lanes + tables.n_local)
    return most_bytes, most_events


def test_small_ring_by_hand():
    # a 3-rank ring: each rank sends to one peer and receives from one, on 3 lanes (an odd
    # cycle needs 3 colours), 8 CTAs each (32 // 3 rounded down to a power of two)
    s = ring_reducescatter()
    choice = choose_lanes(s)
    tables = dataflow_tables(s, *to_units(s, split=True, pad=True), max_lanes=choice.max_lanes)
    cost = table_lane_cost(tables, choice.lane_ctas)
    assert (cost.lanes, cost.lane_ctas, cost.sends, cost.recvs) == (3, 8, 1, 1)
    assert cost.device_bytes == 8 * (6 + 6) * MIB == choice.device_bytes
    assert (cost.device_bytes, cost.events) == _by_hand(tables, 8)


@settings(max_examples=15, deadline=None)
@given(st.integers(2, 6), st.integers(0, 10 ** 6), st.sampled_from([24, 100, 400, 4096]))
def test_estimate_matches_the_tables(n, seed, budget_mib):
    s = random_allgather(n, seed)
    # the floor, a count of pairs asked before pricing, refuses exactly what the choice does
    floor = lane_floor_refusal(s, budget_mib * MIB)
    try:
        choice = choose_lanes(s, budget_mib * MIB)
    except ScheduleError as err:
        # refused only when one channel per connection does not fit either
        assert "raise --nccl-lane-memory" in err.message
        assert floor == err.message
        return
    assert floor is None
    tables = dataflow_tables(s, *to_units(s, split=True, pad=True), max_lanes=choice.max_lanes)
    cost = table_lane_cost(tables, choice.lane_ctas)
    assert (cost.device_bytes, cost.events) == _by_hand(tables, choice.lane_ctas)
    assert cost.device_bytes == choice.device_bytes <= budget_mib * MIB
    assert cost.lanes * cost.lane_ctas <= 32
    # the compile report's count, from the plan in chunks, says the same
    assert schedule_lane_cost(s, choice, NCCL_GROUP_OVERHEAD) == cost


def test_budget_halves_ctas_then_refuses():
    s = pairwise_alltoall()          # 3 ranks, 6 lanes: 4 CTAs, 2 sends and 2 receives
    per_cta = (2 * 6 + 2 * 6) * MIB
    assert [choose_lanes(s, b).lane_ctas for b in (4 * per_cta, 3 * per_cta, per_cta)] == \
        [4, 2, 1]
    with pytest.raises(ScheduleError, match=r"at least 24 MiB per rank .* budget of 23 MiB"):
        choose_lanes(s, 23 * MIB)
    with pytest.raises(ScheduleError, match="must be > 0"):
        choose_lanes(s, 0)


def test_the_output_refuses_what_its_lanes_cannot_hold():
    s = pairwise_alltoall()          # 2 sends and 2 receives a rank: 24 MiB with one lane
    assert BACKEND.refusal(s, EmitOptions()) is None
    assert BACKEND.refusal(s, EmitOptions(nccl_lane_memory=24 * MIB)) is None
    why = BACKEND.refusal(s, EmitOptions(nccl_lane_memory=23 * MIB))
    assert why is not None and "at least 24 MiB per rank" in why
    # the one-sided form runs on the caller's communicator: no lane buffers
    assert ONESIDED.refusal(s, EmitOptions(nccl_lane_memory=23 * MIB)) is None


def _alltoall_2x4(budget_mib: int):
    """An AllToAll on 8 ranks and the nccl model with ``budget_mib`` of lane memory:
    ``direct`` talks to 7 peers a rank (84 MiB with one lane), the rings to fewer."""
    coll = make_collective("a2a", CollectiveKind.ALLTOALL,
                           torus("t", (2, 4), bandwidth=50e9, latency=1e-6), tuple(range(8)),
                           8 * 8 * 1024)
    return coll, dataclasses.replace(NCCL_MODEL, lane_memory=budget_mib * MIB)


def test_the_model_gives_no_time_to_what_its_runtime_cannot_run(monkeypatch):
    coll, model = _alltoall_2x4(64)
    p = plan(coll, model=model, prune=False)
    row = next(r for r in p.candidates if r.name == "direct")
    assert not row.applicable and row.time is None
    assert row.reason.startswith("no time under the nccl model: the NCCL library cannot run "
                                 "it: the NCCL library needs at least 84 MiB per rank")
    # the chosen one runs on the library under that budget, and the output takes it
    assert p.name != "direct" and unpriced_reason(p.schedule, model) is None
    assert BACKEND.refusal(p.schedule, EmitOptions(nccl_lane_memory=64 * MIB)) is None
    # named explicitly, it is refused before it is verified or lowered into lanes
    monkeypatch.setattr(plan_module, "verify", lambda s: pytest.fail("verified"))
    with pytest.raises(CclError, match=r"its direct schedule has no time under the nccl "
                                       r"model.*raise --nccl-lane-memory"):
        plan(_named(coll, "direct"), model=model)
    monkeypatch.undo()
    # with room for its connections it is priced as before
    coll, roomy = _alltoall_2x4(84)
    assert plan(_named(coll, "direct"), model=roomy).time is not None


def _named(coll, name: str):
    return dataclasses.replace(coll, algorithm=Hint(name))


def test_the_model_prices_the_lanes_it_chooses():
    s = pairwise_alltoall()
    model = NCCL_MODEL
    assert model_lanes(s, model) == choose_lanes(s, model.lane_memory).max_lanes
    # fewer lanes than pairs: the dataflow plan shares lanes, which the same call prices
    few = lower_schedule(s, max_lanes=2)
    assert few.n_lanes == 2 and lower_schedule(s).n_lanes == 6


def test_header_and_report_say_the_same(tmp_path):
    s = pairwise_alltoall()
    header = render_sources(s)["cclc_a2a_schedule.h"]
    text = " ".join(line[3:] for line in header.splitlines() if line.startswith("// "))
    choice = choose_lanes(s)
    cost = schedule_lane_cost(s, choice, NCCL_GROUP_OVERHEAD)
    assert f"makes {cost.communicators} communicators" in text
    assert f"about {cost.device_bytes // MIB} MiB" in text
    assert f"{cost.events} CUDA events" in text
    rows = re.findall(r"^  \{ (-?\d+(?:, -?\d+){14}) \},$", header, flags=re.MULTILINE)
    lanes = {int(r.split(", ")[COLUMNS.index("lane")]) for r in rows[:-1]}
    assert max(lanes) < cost.lanes + 1 + cost.streams     # message and local lanes only
    assert re.search(rf"^  {choice.lane_ctas},    // CTAs per lane", header, re.MULTILINE)


CCL = """topology t = torus(2, 2) { link 50 GB/s, 1 us }
collective a2a = alltoall on t { size 1 MB }
"""


def _compile(tmp_path, *flags):
    src = tmp_path / "t.ccl"
    src.write_text(CCL)
    return subprocess.run([sys.executable, "-m", "cclc.cli", "compile", str(src), "-o",
                           str(tmp_path / "out"), *flags], capture_output=True, text=True,
                          check=False)


@pytest.mark.slow
def test_compile_reports_lanes_and_takes_the_budget(tmp_path):
    r = _compile(tmp_path, "--emit", "json,nccl", "--nccl-lane-memory", "40M")
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if "nccl library:" in x)
    assert re.search(r"\d+ lanes \(\d+ communicators split from the caller's, 1 CTA each\), "
                     r"\d+ send and \d+ receive connections, \d+ MiB of NCCL buffers "
                     r"\(estimate\), \d+ streams and \d+ events per rank at most "
                     r"\(budget 40 MiB\)", line), line
    header = (tmp_path / "out" / "nccl-a2a" / "cclc_a2a_schedule.h").read_text()
    assert "budget of 40 MiB" in header
    bad = _compile(tmp_path, "--emit", "json,nccl", "--nccl-lane-memory", "lots")
    assert bad.returncode == 2 and "expected a memory size > 0" in bad.stderr
    # no schedule's connections fit: none has a time under the nccl model
    small = _compile(tmp_path, "--emit", "json,nccl", "--nccl-lane-memory", "1M", "--force")
    assert small.returncode == 2 and "no time under the nccl model" in small.stderr
    assert "raise --nccl-lane-memory" in small.stderr
    unpriced = _compile(tmp_path, "--emit", "json", "--nccl-lane-memory", "1G", "--force")
    assert unpriced.returncode == 2 and "needs nccl" in unpriced.stderr
    onesided = _compile(tmp_path, "--emit", "json,nccl-onesided", "--force")
    assert onesided.returncode == 0, onesided.stderr
    assert "nccl-onesided model" in onesided.stdout
    assert re.search(r"nccl-onesided library: the caller's communicator only .* at most \d+ "
                     r"entries per rank run in order", onesided.stdout), onesided.stdout
    assert (tmp_path / "out" / "nccl-onesided-a2a" / "cclc_onesided.h").exists()


def test_lanes_are_ncclcommsplit_per_lane():
    # the library makes one communicator per lane with the chosen CTAs (nccl.cu.j2)
    cu = render_sources(ring_reducescatter())["cclc_rs_ring.cu"]
    assert "config.maxCTAs = plan.lane_ctas;" in cu
    assert np.all(np.diff([choose_lanes(ring_reducescatter(), b * MIB).lane_ctas
                           for b in (200, 100, 50, 25)]) <= 0)
