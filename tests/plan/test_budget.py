"""The up-front size estimate: a lower bound on every schedule built, and the refusal it drives."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cclc.algorithms import algorithms_for
from cclc.budget import BYTES_PER_OP, check_budget, estimate_ops, estimate_size
from cclc.cli import main
from cclc.collective import CollectiveKind as K
from cclc.collective import make_collective
from cclc.errors import CclError, CollectiveError
from cclc.topology import NodeType, leaf_spine, single_node, torus, with_faults


@st.composite
def collectives(draw):
    shape = draw(st.sampled_from(["torus", "mesh", "node", "fabric"]))
    if shape in ("torus", "mesh"):
        dims = tuple(draw(st.lists(st.integers(2, 5), min_size=1, max_size=2)))
        # routing none: relay lowering cuts every multi-hop move into single hops
        topo = torus("t", dims, wrap=tuple([shape == "torus"] * len(dims)),
                     routing=draw(st.sampled_from(["source", "none"])))
        if draw(st.booleans()):
            topo = with_faults(topo, [(int(topo.link_src[0]), int(topo.link_dst[0]))])
    elif shape == "node":
        topo = single_node("box", NodeType("x", "nvswitch", draw(st.integers(2, 9)), 450e9,
                                           1e-6))
    else:
        node = NodeType("n", "nvswitch", 2, 450e9, 1e-6, nics=2, nic_bandwidth=50e9)
        topo = leaf_spine("f", draw(st.integers(2, 4)), node, rails=2, leaves=2, spines=2,
                          oversubscription=1.0,
                          bandwidth=50e9, latency=2e-6)
    kind = draw(st.sampled_from(list(K)))
    group = tuple(topo.live_ranks())
    n = len(group)
    root = 0 if kind in (K.BROADCAST, K.REDUCE) else None
    try:
        return make_collective("c", kind, topo, group, size=4 * n * n * 3, root=root)
    except CollectiveError:
        return None


@pytest.mark.slow
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(coll=collectives())
def test_estimate_is_a_lower_bound_on_every_schedule_built(coll):
    if coll is None:
        return
    built = {}
    for entry in algorithms_for(coll):
        if entry.applicable(coll) is not None:
            continue
        ops = len(entry.build(coll).ops)
        built[entry.name] = ops
        assert estimate_ops(coll, entry) <= ops, entry.name
    # auto's estimate is the largest applicable candidate's, still at most what auto builds
    est = estimate_size(coll, algorithms_for(coll), {})
    assert est.ops <= max(built.values(), default=0)
    assert est.memory >= est.ops * BYTES_PER_OP


def test_refusal_names_the_estimate_and_the_way_to_insist():
    coll = make_collective("big", K.ALLGATHER, torus("t", (64, 64)), tuple(range(4096)),
                           size=4096 * 4)
    est = estimate_size(coll, algorithms_for(coll), {})
    # direct and ring apply: one block per op and pair, and each rank's own block copied
    assert est.ops == 4096 * 4096
    with pytest.raises(CclError, match=r"at least 1.68e\+07 ops.*--no-size-check"):
        check_budget(est, memory=1 << 20)
    check_budget(est, memory=1 << 40)      # enough memory, and under an hour


def test_refusal_names_the_smallest_entry_when_it_fits():
    from cclc.algorithms import get

    coll = make_collective("big", K.ALLGATHER, torus("t", (64, 64)), tuple(range(4096)),
                           size=4096 * 4)
    est = estimate_size(coll, [get("ring")], {}, algorithms_for(coll))
    assert est.largest == "ring" and est.smallest is not None
    name, ops = est.smallest
    with pytest.raises(CclError, match=rf"smallest schedule \(algorithm {name}: at least"):
        check_budget(est, memory=1 << 30)


@pytest.mark.slow
def test_compile_refuses_a_million_rank_mesh_before_writing(tmp_path, capsys):
    src = tmp_path / "m.ccl"
    src.write_text("topology t = mesh(1000, 1000) { link 32 GB/s, 100 ns }\n"
                   "collective a = allreduce on t { size 1 MiB }\n")
    assert main(["compile", str(src), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "too large to plan here" in err and "--no-size-check" in err
    assert "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_no_size_check_compiles_a_small_file(tmp_path, capsys):
    src = tmp_path / "s.ccl"
    src.write_text("topology t = torus(4) { link 32 GB/s, 100 ns }\n"
                   "collective a = allgather on t { size 1 MiB }\n")
    assert main(["compile", str(src), "-o", str(tmp_path / "out"), "--no-size-check"]) == 0
    assert (tmp_path / "out" / "a.schedule.json").exists()


@pytest.mark.parametrize("dims, wrap, fault", [((4, 4), True, False), ((3, 5), False, False),
                                               ((2, 2, 2), True, True), ((6,), True, True)])
def test_relayed_estimate_is_a_lower_bound_on_a_gpu_torus(dims, wrap, fault):
    # routing none: every pair's block crosses its hop distance in single-hop ops
    topo = torus("t", dims, wrap=(wrap,) * len(dims), routing="none")
    if fault:
        topo = with_faults(topo, [(int(topo.link_src[0]), int(topo.link_dst[0]))])
    n = topo.n_ranks
    for kind in (K.ALLTOALL, K.ALLGATHER):
        coll = make_collective("c", kind, topo, tuple(range(n)), size=4 * n * n)
        for entry in algorithms_for(coll):
            if entry.name == "synth" or entry.applicable(coll) is not None:
                continue
            assert estimate_ops(coll, entry) <= len(entry.build(coll).ops), entry.name


def test_chunks_grow_the_estimate_and_stay_below_what_is_built():
    from cclc.algorithms import get

    node = NodeType("n", "nvswitch", 2, 450e9, 1e-6, nics=2, nic_bandwidth=50e9)
    fabric = leaf_spine("f", 3, node, rails=2, leaves=2, spines=2, oversubscription=1.0,
                        bandwidth=50e9, latency=2e-6)
    ar = make_collective("ar", K.ALLREDUCE, fabric, tuple(range(6)), size=4 * 6 * 64)
    ring = torus("r", (5,), routing="none")
    bc = make_collective("b", K.BROADCAST, ring, tuple(range(5)), size=4 * 64, root=0)
    for coll, name in ((ar, "hierarchical"), (bc, "ring")):
        entry = get(name)
        sizes = []
        for chunks in (1, 3, 7):
            est = estimate_ops(coll, entry, {"chunks": chunks})
            assert est <= len(entry.build(coll, chunks=chunks).ops), (name, chunks)
            sizes.append(est)
        assert sizes == sorted(sizes) and sizes[0] < sizes[-1], name
