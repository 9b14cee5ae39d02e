"""What MSCCL++'s loader and executor accept, checked on a plan's JSON."""

from __future__ import annotations

from backends.mscclpp.limits import LIMITS, OP_NAMES


def check_limits(plan: dict) -> None:
    """What the loader and executor accept, read from the plan's text."""
    assert plan["protocol"] in ("Simple", "LL") and isinstance(plan["inplace"], bool)
    assert 1 <= plan["num_threads_per_block"] <= LIMITS["threads_per_block"].value
    for r, gpu in enumerate(plan["gpus"]):
        assert gpu["id"] == r and gpu["input_chunks"] > 0 and gpu["output_chunks"] > 0
        for tb in gpu["threadblocks"]:
            assert len(tb["ops"]) <= LIMITS["ops_per_tb"].value
            for ch in tb["channels"]:
                assert len(ch["channel_ids"]) <= LIMITS["channels_per_tb"].value
            for ref in tb["remote_buffer_refs"]:
                assert len(ref["remote_buffer_ids"]) <= LIMITS["remote_buffers_per_tb"].value
            for op in tb["ops"]:
                assert op["name"] in OP_NAMES
                assert len(op.get("channel_ids", ())) <= LIMITS["channels_per_op"].value
