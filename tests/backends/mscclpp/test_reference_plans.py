"""The executor of MSCCL++ plans agrees with MSCCL++'s own plans (copied into ``data/``, see
its README) and rejects hand-made mutants of them."""

from __future__ import annotations

import copy
import json
import pathlib

import pytest

from backends.mscclpp.executor import PlanError, Unsupported, run

DATA = pathlib.Path(__file__).parent / "data"


def _load(name: str) -> dict:
    return json.loads((DATA / name).read_text())


@pytest.mark.parametrize("name", ["allreduce.json", "reduce.json"])
def test_mscclpp_plans_pass(name):
    run(_load(name), seeds=6)


def test_reduce_tbg_race_is_found():
    with pytest.raises(PlanError, match="race on gpu"):
        run(_load("reduce_tbg.json"))


def test_packet_plans_are_not_modelled():
    with pytest.raises(Unsupported, match="not modelled"):
        run(_load("transfer_pack.json"))


def _tb0(plan: dict) -> list:
    return plan["gpus"][0]["threadblocks"][0]["ops"]


def _index(ops: list, name: str, nth: int = 0) -> int:
    return [i for i, o in enumerate(ops) if o["name"] == name][nth]


def test_mutants_of_reduce_are_rejected():
    base = _load("reduce.json")
    # a dropped wait: gpu 0 reads gpu 1's scratch before gpu 1 said it is written
    m = copy.deepcopy(base)
    del _tb0(m)[_index(_tb0(m), "wait")]
    with pytest.raises(PlanError, match="race|unmatched"):
        run(m)
    # no nop between the copy into scratch and the signal that announces it
    m = copy.deepcopy(base)
    ops = _tb0(m)
    assert ops[1] == {"name": "nop"}
    del ops[1]
    with pytest.raises(PlanError, match="race"):
        run(m)
    # a swapped chunk: the read-reduce takes the peer's chunk 1 instead of 0
    m = copy.deepcopy(base)
    ops = _tb0(m)
    rres = ops[_index(ops, "rres")]
    rres["src_buff"][1]["index"] = 1
    with pytest.raises(PlanError):
        run(m)
    # a reduce applied twice
    m = copy.deepcopy(base)
    ops = _tb0(m)
    i = _index(ops, "res")
    ops[i + 1:i + 1] = [copy.deepcopy(ops[i]), {"name": "nop"}]
    with pytest.raises(PlanError, match="postcondition|race"):
        run(m)
    # too many operations for one threadblock
    m = copy.deepcopy(base)
    _tb0(m).extend([{"name": "nop"}] * 64)
    with pytest.raises(PlanError, match="MAX_OPERATION"):
        run(m)
    # an op name the loader does not know
    m = copy.deepcopy(base)
    _tb0(m)[0]["name"] = "cpy"
    with pytest.raises(PlanError, match="does not know|Invalid"):
        run(m)


@pytest.mark.parametrize("name", ["reduce_nvls.json", "reduce_nvls_pipeline.json"])
def test_nvls_plans_pass(name):
    run(_load(name), seeds=4)


def test_nvls_pipeline_runs_several_iterations():
    # unit_size is 1 MiB: at 3 MiB chunks the pipeline runs its glres three times, each on
    # its slice of the chunk (the last one shorter)
    run(_load("reduce_nvls_pipeline.json"), seeds=2, chunk_bytes=3 << 20)


def _glres(plan: dict, rank: int) -> dict:
    ops = plan["gpus"][rank]["threadblocks"][0]["ops"]
    op = ops[_index(ops, "pipeline")]["ops"][0] if "pipeline" in str(ops) else None
    return op or ops[_index(ops, "glres")]


def test_mutants_of_nvls_are_rejected():
    base = _load("reduce_nvls.json")
    # both GPUs reduce chunk 0 through the switch: chunk 1 is never reduced, and the two
    # multicast stores into chunk 0 race
    m = copy.deepcopy(base)
    for buff in _glres(m, 1)["src_buff"] + _glres(m, 1)["dst_buff"]:
        buff["index"] = 0
    with pytest.raises(PlanError, match="race|postcondition"):
        run(m)
    # gpu 1 does not join the multicast group gpu 0 declares
    m = copy.deepcopy(base)
    m["gpus"][1]["channels"] = [c for c in m["gpus"][1]["channels"]
                                if c["channel_type"] != "switch"]
    m["gpus"][1]["threadblocks"][0]["channels"] = [
        c for c in m["gpus"][1]["threadblocks"][0]["channels"] if c["channel_type"] != "switch"]
    with pytest.raises(PlanError, match="connectNvlsCollective"):
        run(m)
    # a switch channel id the threadblock does not hold
    m = copy.deepcopy(base)
    _glres(m, 0)["src_buff"][0]["switch_channel_id"] = 1
    with pytest.raises(PlanError, match="switch channel 1"):
        run(m)


def test_mutants_of_nvls_pipeline_are_rejected():
    base = _load("reduce_nvls_pipeline.json")
    # the pipeline iterates over two chunks but its glres covers one: the second half of the
    # iterations start past the op's region
    m = copy.deepcopy(base)
    for g in m["gpus"]:
        ops = g["threadblocks"][0]["ops"]
        ops[_index(ops, "pipeline")]["iter_context"]["num_chunks"] = 2
    with pytest.raises(PlanError, match="wraps"):
        run(m, chunk_bytes=3 << 20)
    # more iterations than handlePipeline's uint16_t counts
    m = copy.deepcopy(base)
    for g in m["gpus"]:
        ops = g["threadblocks"][0]["ops"]
        ops[_index(ops, "pipeline")]["iter_context"]["unit_size"] = 16
    with pytest.raises(PlanError, match="uint16_t"):
        run(m, chunk_bytes=1 << 20)
