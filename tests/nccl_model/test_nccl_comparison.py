"""cclc's time beside NCCL's (cclc/nccl_comparison.py): the ratio said the right way round, and
the caveats of the report line."""

from __future__ import annotations

from cclc.collective import CollectiveKind as K
from cclc.collective import make_collective
from cclc.nccl_comparison import compare_with_nccl, nccl_comparison, speedup_text
from cclc.nccl_model import nccl_estimate
from cclc.topology import NodeType, single_node

GiB = 1 << 30
HGX = NodeType("hgx", "nvswitch", 8, 450e9, 1e-6, nics=8, nic_bandwidth=50e9)


def test_speedup_text_says_slower():
    assert speedup_text(1.27, 1.0) == "1.27x faster"
    assert speedup_text(1.0, 1.27) == "1.27x slower"
    assert speedup_text(1.0, 1.0) == "as fast"
    coll = make_collective("c", K.ALLREDUCE, single_node("box", HGX), tuple(range(8)), size=GiB)
    est = nccl_estimate(coll)
    line = compare_with_nccl(coll, est.time_us * 1e-6 * 2)
    assert "predicted" in line and "2.00x slower" in line and "calibration" not in line
    # a difference the model's calibration cannot resolve is flagged as such
    line = compare_with_nccl(coll, est.time_us * 1e-6 / 1.1)
    assert "1.10x faster, inside the model's +-25% calibration error" in line
    # a time without software cost (the ir model) is not compared as if it were like for like
    assert "no software cost" in compare_with_nccl(coll, est.time_us * 1e-6 / 2,
                                                   software_cost=False)
    assert "no software cost" not in compare_with_nccl(coll, est.time_us * 1e-6 / 2)


def test_the_comparison_is_one_object_with_its_line():
    coll = make_collective("c", K.ALLREDUCE, single_node("box", HGX), tuple(range(8)), size=GiB)
    est = nccl_estimate(coll)
    c = nccl_comparison(coll, est.time_us * 1e-6 / 1.1, software_cost=False)
    assert c.nccl == est and c.speedup == "1.10x faster"
    assert c.line == compare_with_nccl(coll, est.time_us * 1e-6 / 1.1, software_cost=False)
    a2a = make_collective("a", K.ALLTOALL, single_node("box", HGX), tuple(range(8)), size=GiB)
    # an AllToAll is compared with NCCL's grouped send/recv (cclc.nccl_p2p)
    a2a_line = nccl_comparison(a2a, 1.0)
    assert a2a_line is not None and a2a_line.nccl.name == "p2p/simple"
    assert nccl_comparison(coll, 0.0) is None
