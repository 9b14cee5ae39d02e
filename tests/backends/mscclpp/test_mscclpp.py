"""The MSCCL++ backend: plans for every small schedule run correctly in the independent
executor, stay inside the executor's limits, and what MSCCL++ cannot run is refused clearly."""

from __future__ import annotations

import copy
import json
import re

import pytest
from backend_helpers import (
    check_golden,
    fabric_2x3,
    folded_reducescatter,
    pairwise_alltoall,
    random_allgather,
    random_reducescatter,
    ring_allgather,
    ring_reducescatter,
    swap_allreduce,
)
from plan_checks import check_limits

from backends import load
from backends.contract import EmitOptions, Facts
from backends.msccl.lower import LimitError
from backends.mscclpp import render_plan
from backends.mscclpp.executor import PlanError, run
from backends.mscclpp.limits import LIMITS
from cclc.algorithms import algorithms_for
from cclc.collective import CollectiveKind, ReduceOp, make_collective
from cclc.errors import ScheduleError
from cclc.topology import NodeType, single_node, torus


def _small_collectives():
    """Every registered algorithm on a few small machines, for the collectives MSCCL++ names
    (the fabric has two servers: memory channels inside one, port channels between them)."""
    machines = [torus("ring4", (4,)), torus("ring3", (3,)), torus("t23", (2, 3)), fabric_2x3()]
    for topo in machines:
        n = topo.n_ranks
        for kind in (CollectiveKind.ALLGATHER, CollectiveKind.ALLTOALL,
                     CollectiveKind.REDUCESCATTER, CollectiveKind.ALLREDUCE):
            coll = make_collective(kind.value, kind, topo, tuple(range(n)), 4 * n * n * 4)
            for algo in algorithms_for(coll):
                if algo.applicable(coll) is None:
                    yield f"{topo.name}-{kind.value}-{algo.name}", algo.build(coll)


SCHEDULES = dict(_small_collectives())
HAND_MADE = {
    "ring-allgather": ring_allgather, "ring-reducescatter": ring_reducescatter,
    "pairwise-alltoall": pairwise_alltoall,
    **{f"random-allgather-{k}": (lambda k=k: random_allgather(6, k)) for k in range(3)},
    **{f"random-reducescatter-{k}": (lambda k=k: random_reducescatter(5, k)) for k in range(3)},
}


@pytest.mark.slow
@pytest.mark.parametrize("key", sorted(SCHEDULES))
def test_every_small_schedule_runs(key):
    for inplace in (False, True):
        plan = render_plan(SCHEDULES[key], inplace=inplace)
        assert plan["inplace"] is inplace
        check_limits(plan)
        run(plan, seeds=2)


@pytest.mark.parametrize("key", sorted(HAND_MADE))
def test_hand_made_schedules_run(key):
    for inplace in (False, True):
        plan = render_plan(HAND_MADE[key](), inplace=inplace)
        check_limits(plan)
        run(plan, seeds=3)


def test_port_channels_between_servers():
    """Two servers of three GPUs: peers in one server use memory channels, the others port
    channels with put-signal-flush."""
    key = next(k for k in sorted(SCHEDULES) if k.startswith("two-allgather"))
    plan = render_plan(SCHEDULES[key])
    kinds = {ch["channel_type"] for g in plan["gpus"] for ch in g["channels"]}
    assert kinds == {"memory", "port"}
    names = {op["name"] for g in plan["gpus"] for tb in g["threadblocks"] for op in tb["ops"]}
    assert "pwsf" in names and "put" in names
    run(plan, seeds=4)


def test_long_programs_are_split_into_chained_threadblocks():
    s = random_allgather(12, 5)
    plan = render_plan(s)
    check_limits(plan)
    tbs = [len(g["threadblocks"]) for g in plan["gpus"]]
    assert max(tbs) > 1
    gpu = plan["gpus"][tbs.index(max(tbs))]
    assert len(gpu["semaphores"]) == len(gpu["threadblocks"]) - 1
    assert gpu["threadblocks"][1]["ops"][0] == {"name": "sem_acquire", "semaphore_ids": [0]}
    run(plan, seeds=3)


def test_backend_renders_one_file_named_for_the_collective():
    s = ring_allgather()
    backend = load("mscclpp")
    files = backend.files(s.collective, EmitOptions())
    assert files == ("ag_ring.mscclpp.json", "ag_ring.inplace.mscclpp.json",
                     "ag_ring.ll.mscclpp.json", "ag_ring.ll.inplace.mscclpp.json")
    out = backend.render(s, EmitOptions(), Facts())
    assert sorted(out) == sorted(files[:2])  # a torus: port channels, no LL plans
    assert json.loads(out[files[1]])["inplace"] is True
    assert json.loads(out[files[1]])["name"] == "ag_ring_inplace"
    plan = json.loads(out[files[0]])
    assert plan["collective"] == "allgather" and plan["name"] == "ag_ring"
    # the sizes it serves: multiples of 16 B x chunks from one of them up (MSCCL++'s NCCL
    # interface would hand a smaller call to the plan, and its loader refuse it), every byte
    # offset within uint32
    chunks = plan["gpus"][0]["output_chunks"]
    assert plan["min_message_size"] == 16 * chunks
    assert plan["max_message_size"] % (16 * chunks) == 0
    assert plan["max_message_size"] // chunks * max(
        g["scratch_chunks"] for g in plan["gpus"]) < 2**32
    assert backend.refusal(s, EmitOptions()) is None


def test_refusals_name_the_reason():
    backend = load("mscclpp")
    topo = torus("ring4", (4,))
    bcast = make_collective("b", CollectiveKind.BROADCAST, topo, (0, 1, 2, 3), 64, root=0)
    algo = next(a for a in algorithms_for(bcast) if a.applicable(bcast) is None)
    s = algo.build(bcast)
    assert "no broadcast collective" in backend.refusal(s, EmitOptions())
    with pytest.raises(ScheduleError, match="no broadcast collective"):
        render_plan(s)
    rs_max = ring_reducescatter(op=ReduceOp.MAX)
    assert "sums every reduction" in backend.refusal(rs_max, EmitOptions())
    with pytest.raises(ScheduleError, match="writes its input buffer"):
        render_plan(swap_allreduce())
    with pytest.raises(LimitError, match="MAX|1024"):
        render_plan(ring_allgather(), EmitOptions(nthreads=2048))


def test_a_schedule_over_the_op_cap_is_refused_before_anything_walks_its_ops(monkeypatch):
    # (the cap lowered to the ring's op count: one op over it is refused, the cap itself not)
    import importlib

    import backends.mscclpp as mscclpp
    lower = importlib.import_module("backends.mscclpp.lower")   # (the package's `lower` is
    s = ring_allgather()                                         # the function)
    backend = load("mscclpp")
    monkeypatch.setattr(lower, "MAX_OPS", len(s.ops))
    assert backend.refusal(s, EmitOptions()) is None
    monkeypatch.setattr(lower, "MAX_OPS", len(s.ops) - 1)

    def walked(*_):
        raise AssertionError("an op-by-op check ran on a schedule over the cap")

    for name in ("nic_refusal", "chunk_refusal", "lowering_refusal"):
        monkeypatch.setattr(mscclpp, name, walked)
    why = backend.refusal(s, EmitOptions())
    assert f"its {len(s.ops):,} ops are over the {len(s.ops) - 1:,}" in why
    assert "parses whole on every rank" in why and "--emit json or nccl" in why
    with pytest.raises(ScheduleError, match="ops are over the"):
        render_plan(s)


def test_limits_are_cited():
    for name, limit in LIMITS.items():
        assert re.search(r"\S+ in microsoft/mscclpp src/\S+ @ 1f5f065", limit.cite()), name


# -- mutants of an emitted plan: the executor must reject each ---------------------------------

def _ops(plan):
    for g in plan["gpus"]:
        for tb in g["threadblocks"]:
            yield g, tb


def _emitted(inplace: bool = False):
    """A ring reduce-scatter inside one server: memory channels only."""
    node = NodeType("box4", "nvswitch", 4, 450e9, 1e-6)
    coll = make_collective("rs", CollectiveKind.REDUCESCATTER, single_node("box", node),
                           (0, 1, 2, 3), 4 * 4 * 16)
    algo = next(a for a in algorithms_for(coll) if a.name == "ring")
    plan = render_plan(algo.build(coll), inplace=inplace)
    assert {ch["channel_type"] for g in plan["gpus"] for ch in g["channels"]} == {"memory"}
    return plan


def test_emitted_plan_mutants_are_rejected():
    plan = _emitted()
    run(plan)
    # a dropped data wait: the landing reads scratch before the put is known done
    m = copy.deepcopy(plan)
    _, tb = next((g, tb) for g, tb in _ops(m) if any(o["name"] == "wait" for o in tb["ops"]))
    waits = [i for i, o in enumerate(tb["ops"]) if o["name"] == "wait"]
    del tb["ops"][waits[1]]
    with pytest.raises(PlanError, match="race|unmatched|deadlock"):
        run(m)
    # a dropped credit wait: a put may overwrite staging its peer has not consumed
    m = copy.deepcopy(plan)
    _, tb = next(_ops(m))
    first = next(i for i, o in enumerate(tb["ops"]) if o["name"] == "wait")
    del tb["ops"][first]
    with pytest.raises(PlanError, match="race|unmatched|deadlock"):
        run(m)
    # a put into the wrong chunk
    m = copy.deepcopy(plan)
    put = next(o for _, tb in _ops(m) for o in tb["ops"] if o["name"] == "put")
    put["dst_buff"][0]["index"] += 1
    with pytest.raises(PlanError):
        run(m)
    # a reduce applied twice
    m = copy.deepcopy(plan)
    _, tb = next((g, tb) for g, tb in _ops(m) if any(o["name"] == "re" for o in tb["ops"]))
    i = next(i for i, o in enumerate(tb["ops"]) if o["name"] == "re")
    tb["ops"][i + 1:i + 1] = [{"name": "nop"}, copy.deepcopy(tb["ops"][i])]
    with pytest.raises(PlanError, match="postcondition"):
        run(m)
    # no nop between the puts and their signal
    m = copy.deepcopy(plan)
    _, tb = next((g, tb) for g, tb in _ops(m) if any(o["name"] == "put" for o in tb["ops"]))
    i = next(i for i, o in enumerate(tb["ops"]) if o["name"] == "put")
    assert tb["ops"][i + 1] == {"name": "nop"}
    del tb["ops"][i + 1]
    with pytest.raises(PlanError, match="race"):
        run(m)
    # too many ops in one threadblock
    m = copy.deepcopy(plan)
    _, tb = next(_ops(m))
    tb["ops"] += [{"name": "nop"}] * LIMITS["ops_per_tb"].value
    with pytest.raises(PlanError, match="MAX_OPERATION"):
        run(m)


def test_execution_model_is_priced_per_step():
    from backends import load
    from cclc.execution import IR_MODEL, MSCCLPP_MODEL, model_for, predict

    model = model_for([load("json"), load("mscclpp")])
    assert model is MSCCLPP_MODEL and model.mode == "lockstep"
    s = ring_allgather()
    extra = predict(s, model).time - predict(s, IR_MODEL).time
    assert extra == pytest.approx(s.n_steps * 2.345e-6)


@pytest.mark.parametrize("n", [3, 4])
def test_steps_of_local_ops_alone_neither_signal_nor_wait_nor_pay(n):
    """What the model charges is what the plan does: a schedule whose steps alternate local
    folds with steps between ranks synchronizes in the latter only, and the mscclpp model
    charges the round trip on those alone."""
    from cclc.execution import IR_MODEL, MSCCLPP_MODEL, predict

    s = folded_reducescatter(n)
    for inplace in (False, True):
        plan = render_plan(s, inplace=inplace)
        run(plan, seeds=3)
        for gpu in plan["gpus"]:
            ops = [op["name"] for tb in gpu["threadblocks"] for op in tb["ops"]
                   if op["name"] not in ("nop", "sem_acquire", "sem_release")]
            # step 0 copies (the in-place plan first snapshots its input); then per fold:
            # the credit that ends the local step before it (for the next step's writer),
            # the credit wait, put, data signal and data wait of the step between ranks, and
            # the fold, a step of its own with no signal or wait
            head = ["copy", "copy"] if inplace else ["copy"]
            assert ops == head + ["signal", "wait", "put", "signal", "wait", "re"] * (n - 1)
    # n - 1 steps synchronize (one put each on every rank): n - 1 round trips, not 2n - 1
    extra = predict(s, MSCCLPP_MODEL).time - predict(s, IR_MODEL).time
    assert s.n_steps == 2 * n - 1
    assert extra == pytest.approx((n - 1) * 2.345e-6, rel=1e-9)


def test_an_out_of_place_plan_run_in_place_is_caught():
    """The in-place plan's input copy is needed: the out-of-place plan of a direct alltoall,
    marked in-place, lets peers overwrite input the rank still sends."""
    key = "two-alltoall-direct"
    plan = render_plan(SCHEDULES[key])
    run(plan)
    plan["inplace"] = True
    with pytest.raises(PlanError, match="race"):
        run(plan)
    run(render_plan(SCHEDULES[key], inplace=True))


@pytest.mark.parametrize("name, make", [("ag_ring", ring_allgather), ("rs_box", None)])
def test_golden_plans(name, make):
    """The plans of a ring allgather on a torus (port channels) and of a ring reduce-scatter
    in one server (memory channels), printed in full for review (CCLC_REGEN=1 rewrites)."""
    for inplace in (False, True):
        plan = render_plan(make(), inplace=inplace) if make else _emitted(inplace)
        suffix = ".inplace" if inplace else ""
        check_golden(f"mscclpp/{name}{suffix}.mscclpp.txt", _printed(plan))


def _printed(plan: dict) -> str:
    """The plan one op a line (its JSON, in the order MSCCL++ runs it)."""
    lines = [json.dumps({k: v for k, v in plan.items() if k != "gpus"})]
    for gpu in plan["gpus"]:
        lines.append("gpu " + json.dumps({k: v for k, v in gpu.items() if k != "threadblocks"}))
        for tb in gpu["threadblocks"]:
            lines.append("  tb " + json.dumps({k: v for k, v in tb.items() if k != "ops"}))
            lines += ["    " + json.dumps(op) for op in tb["ops"]]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("n", [3, 4, 7])
def test_random_schedules_run_in_every_mode(n):
    """Random gossip allgathers and random reduction trees (relays through scratch, staging
    reused from step to step), in place and not, under several interleavings."""
    for seed in range(4):
        for s in (random_allgather(n, 100 + seed), random_reducescatter(n, 200 + seed)):
            for inplace in (False, True):
                plan = render_plan(s, inplace=inplace)
                check_limits(plan)
                run(plan, seeds=2)


def _one_server_collectives():
    node = NodeType("box4", "nvswitch", 4, 450e9, 1e-6)
    topo = single_node("box", node)
    for kind in (CollectiveKind.ALLGATHER, CollectiveKind.ALLTOALL,
                 CollectiveKind.REDUCESCATTER, CollectiveKind.ALLREDUCE):
        coll = make_collective(kind.value, kind, topo, (0, 1, 2, 3), 4 * 4 * 16)
        for algo in algorithms_for(coll):
            if algo.applicable(coll) is None:
                yield f"box-{kind.value}-{algo.name}", algo.build(coll)


ONE_SERVER = dict(_one_server_collectives())


def _reducescatters():
    """Out-of-place reducescatter plans: every algorithm on the small machines, in one server
    (Simple and LL), and random reduction trees."""
    for key, schedule in {**SCHEDULES, **ONE_SERVER}.items():
        if "reducescatter" in key:
            for protocol in ("Simple", "LL"):
                if protocol == "Simple" or key in ONE_SERVER:
                    yield f"{key}-{protocol}", schedule, protocol
    for n in (3, 4, 7):
        for seed in range(3):
            yield f"random-{n}-{seed}", random_reducescatter(n, 300 + seed), "Simple"


REDUCESCATTERS = {key: (schedule, protocol) for key, schedule, protocol in _reducescatters()}


@pytest.mark.parametrize("key", sorted(REDUCESCATTERS))
def test_out_of_place_reducescatters_survive_the_in_place_layout(key):
    """MSCCL++'s NCCL interface calls a reducescatter whose output is the rank's slice of its
    input out of place (``CollectiveRequest::bufferMode``, src/core/algorithm.cc): with
    out-of-place plans registered it runs one on those overlapping buffers, as Megatron's
    distributed optimizer lays its reduce-scatter out. Marked in-place, the executor lays the
    out-of-place plan's call out so, and its output must still be right."""
    schedule, protocol = REDUCESCATTERS[key]
    plan = render_plan(schedule, protocol=protocol)
    assert plan["inplace"] is False
    plan["inplace"] = True
    run(plan, seeds=3)


@pytest.mark.parametrize("key", sorted(ONE_SERVER))
def test_ll_plans_run(key):
    """LL packets: no signal or wait per step, one credit per pair and call."""
    for inplace in (False, True):
        plan = render_plan(ONE_SERVER[key], EmitOptions(protocol="LL"), inplace=inplace)
        assert plan["protocol"] == "LL"
        names = {op["name"] for g in plan["gpus"] for tb in g["threadblocks"]
                 for op in tb["ops"]}
        assert "put" not in names and ("ppkt" in names or not any(
            ch for g in plan["gpus"] for ch in g["channels"]))
        check_limits(plan)
        run(plan, seeds=3)


def test_ll_refusals_and_mutants():
    with pytest.raises(ScheduleError, match="memory channels only"):
        render_plan(ring_allgather(), EmitOptions(protocol="LL"))
    with pytest.raises(ScheduleError, match="Simple and LL"):
        render_plan(ONE_SERVER[sorted(ONE_SERVER)[0]], EmitOptions(protocol="LL128"))
    key = next(k for k in sorted(ONE_SERVER) if k.startswith("box-reducescatter-ring"))
    plan = render_plan(ONE_SERVER[key], EmitOptions(protocol="LL"))
    run(plan)
    # two moves into one packet slot: a reader cannot tell the packets apart
    m = copy.deepcopy(plan)
    ppkts = [o for _, tb in _ops(m) for o in tb["ops"] if o["name"] == "ppkt"]
    same_gpu = [o for o in ppkts if o["dst_buff"][0]["buffer_id"] == 0]
    same_gpu[1]["dst_buff"][0]["index"] = same_gpu[0]["dst_buff"][0]["index"]
    with pytest.raises(PlanError):
        run(m)
    # a dropped credit: the peer may still be in its previous call
    m = copy.deepcopy(plan)
    _, tb = next(_ops(m))
    del tb["ops"][next(i for i, o in enumerate(tb["ops"]) if o["name"] == "wait")]
    with pytest.raises(PlanError, match="unmatched|race"):
        run(m)


def test_one_server_gets_ll_plans_for_small_calls():
    from backends.mscclpp import LL_MAX_BYTES, render_plans

    key = next(k for k in sorted(ONE_SERVER) if k.startswith("box-allreduce"))
    plans = render_plans(ONE_SERVER[key])
    assert sorted(plans) == ["allreduce.inplace.mscclpp.json", "allreduce.ll.inplace.mscclpp.json",
                             "allreduce.ll.mscclpp.json", "allreduce.mscclpp.json"]
    ll, simple = plans["allreduce.ll.mscclpp.json"], plans["allreduce.mscclpp.json"]
    assert ll["protocol"] == "LL" and simple["protocol"] == "Simple"
    # the windows meet: the next size the Simple plan serves is one granule above
    granularity = 16 * simple["gpus"][0]["input_chunks"]
    assert ll["min_message_size"] == granularity and ll["max_message_size"] <= LL_MAX_BYTES
    assert simple["min_message_size"] == ll["max_message_size"] + granularity
    assert ll["name"] == "allreduce_ll" and plans["allreduce.ll.inplace.mscclpp.json"][
        "name"] == "allreduce_ll_inplace"
    for plan in plans.values():
        run(plan, seeds=2)
    # across servers: Simple plans only, for every size
    two = render_plans(SCHEDULES["two-allreduce-ring"])
    assert sorted(two) == ["allreduce.inplace.mscclpp.json", "allreduce.mscclpp.json"]
    assert two["allreduce.mscclpp.json"]["min_message_size"] == 16 * two[
        "allreduce.mscclpp.json"]["gpus"][0]["input_chunks"]


def _multicast_box(kind: CollectiveKind, multicast: bool = True):
    node = NodeType("box4", "nvswitch", 4, 450e9, 1e-6, multicast=multicast)
    topo = single_node("box", node)
    coll = make_collective(kind.value, kind, topo, (0, 1, 2, 3), 4 * 4 * 16)
    return {a.name: a.build(coll) for a in algorithms_for(coll) if a.applicable(coll) is None}


def test_multicast_node_stores_through_a_switch_channel():
    """On a node that declares multicast, a direct allgather's copies of one chunk to every
    GPU become one gstore each; the plan declares the switch channel on every member and runs
    correctly; a member that drops it is refused (the group is connected collectively)."""
    schedule = _multicast_box(CollectiveKind.ALLGATHER)["direct"]
    for inplace in (False, True):
        plan = render_plan(schedule, inplace=inplace)
        check_limits(plan)
        run(plan, seeds=3)
        for g in plan["gpus"]:
            switch = [c for c in g["channels"] if c["channel_type"] == "switch"]
            assert switch == [{"channel_type": "switch", "buffer_type": "o",
                               "rank_groups": [{"size": 4, "ranks": [0, 1, 2, 3]}]}]
            ops = [o for tb in g["threadblocks"] for o in tb["ops"]]
            assert [o["name"] for o in ops].count("gstore") == 1
            assert not any(o["name"] in ("put", "copy") for o in ops if not inplace)
    m = copy.deepcopy(render_plan(schedule))
    m["gpus"][2]["channels"] = [c for c in m["gpus"][2]["channels"]
                                if c["channel_type"] != "switch"]
    with pytest.raises(PlanError, match="connectNvlsCollective|switch channel"):
        run(m)
    # the stored chunk is another GPU's: the postcondition fails
    m = copy.deepcopy(render_plan(schedule))
    op = next(o for tb in m["gpus"][1]["threadblocks"] for o in tb["ops"]
              if o["name"] == "gstore")
    op["dst_buff"][0]["index"] = 2
    with pytest.raises(PlanError):
        run(m)


def test_multicast_allreduce_broadcasts_each_reduced_chunk_once():
    # direct allreduce: each owner sends its reduced chunk to the same place on the others
    plan = render_plan(_multicast_box(CollectiveKind.ALLREDUCE)["direct"])
    for g in plan["gpus"]:
        ops = [o["name"] for tb in g["threadblocks"] for o in tb["ops"]]
        assert ops.count("gstore") == 1 and "put" in ops  # the reduce-scatter half still puts
    run(plan, seeds=3)


def test_without_multicast_no_switch_channel():
    plan = render_plan(_multicast_box(CollectiveKind.ALLGATHER, multicast=False)["direct"])
    assert all(c["channel_type"] == "memory" for g in plan["gpus"] for c in g["channels"])


@pytest.mark.parametrize("kind", [CollectiveKind.ALLGATHER, CollectiveKind.ALLREDUCE,
                                  CollectiveKind.REDUCESCATTER, CollectiveKind.ALLTOALL])
def test_every_schedule_on_a_multicast_node_runs(kind):
    for schedule in _multicast_box(kind).values():
        for inplace in (False, True):
            plan = render_plan(schedule, inplace=inplace)
            check_limits(plan)
            run(plan, seeds=2)


def _local_swap():
    """An allgather whose ranks, after gathering, swap their two output slots in one step
    (each copy reads what the other writes): no order of the two copies keeps the meaning."""
    from cclc.ir import Buf, ScheduleBuilder

    topo = torus("pair", (2,))
    coll = make_collective("ag-swap", CollectiveKind.ALLGATHER, topo, (0, 1), 16)
    b = ScheduleBuilder(coll, input=[1, 1], output=[2, 2])
    for r in range(2):
        o = 1 - r
        b.add(step=0, src=r, dst=r, src_buf=Buf.INPUT, src_off=0, dst_buf=Buf.OUTPUT,
              dst_off=1 - r)
        b.add(step=0, src=r, dst=o, route=b.route(topo.shortest_path_links(r, o)),
              src_buf=Buf.INPUT, src_off=0, dst_buf=Buf.OUTPUT, dst_off=1 - r)
        for slot in range(2):
            b.add(step=1, src=r, dst=r, src_buf=Buf.OUTPUT, src_off=slot,
                  dst_buf=Buf.OUTPUT, dst_off=1 - slot)
    return b.build("swap")


def test_refusal_agrees_with_the_lowering():
    """The backend asks the lowering's checks without building programs: it refuses exactly
    what the lowering refuses, with the same words."""
    from backends.mscclpp.lower import lower, lowering_refusal

    cases = [swap_allreduce(), _local_swap()] + [SCHEDULES[k] for k in sorted(SCHEDULES)[:12]]
    for s in cases:
        try:
            lower(s)
            lowered = None
        except ScheduleError as err:
            lowered = err.message
        assert lowering_refusal(s) == lowered
    assert "cycle" in lowering_refusal(_local_swap())
