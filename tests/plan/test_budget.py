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
    assert est.ops == 4096 * 4095          # ring applies: one block per op
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


def _fabric_allgather(nodes: int, gpus: int, size: int):
    node = NodeType("hgx", "nvswitch", gpus, 450e9, 1e-6, nics=gpus, nic_bandwidth=50e9)
    topo = leaf_spine("f", nodes, node, rails=gpus, leaves=None, spines=2,
                      oversubscription=1.0, bandwidth=50e9, latency=2e-6)
    return make_collective("ag", K.ALLGATHER, topo, topo.all_ranks(), size=size)


def test_auto_keeps_the_candidates_that_fit_and_names_the_others(monkeypatch):
    import cclc.budget as budget

    coll = _fabric_allgather(4, 4, 4 * 16 * 8)
    entries = algorithms_for(coll)
    ops = {e.name: estimate_ops(coll, e) for e in entries}
    # a limit between the smallest and the largest candidate: the large ones are left out
    monkeypatch.setattr(budget, "MAX_OPS", sorted(ops.values())[-1] - 1)
    fits, too_large = budget.split_by_budget(coll, entries, {}, None)
    assert {e.name for e in fits} == {n for n, o in ops.items() if o <= budget.MAX_OPS}
    assert {n for n, _ in too_large} == {n for n, o in ops.items() if o > budget.MAX_OPS}
    assert all("too large to plan here" in why for _, why in too_large)
    # auto's own cap: candidates above it are left out while a smaller one applies
    monkeypatch.setattr(budget, "MAX_OPS", 10 ** 9)
    monkeypatch.setattr(budget, "AUTO_MAX_OPS", min(ops.values()))
    fits, too_large = budget.split_by_budget(coll, entries, {}, None)
    assert fits and all(ops[e.name] <= budget.AUTO_MAX_OPS for e in fits)
    assert all("left out by auto" in why for _, why in too_large)


def test_nothing_fits_when_only_inapplicable_entries_are_small(monkeypatch):
    import cclc.budget as budget

    coll = _fabric_allgather(4, 4, 4 * 16 * 8)
    applicable = [e for e in algorithms_for(coll) if e.applicable(coll) is None]
    inapplicable = [e for e in algorithms_for(coll) if e.applicable(coll) is not None]
    monkeypatch.setattr(budget, "MAX_OPS", 0)
    fits, too_large = budget.split_by_budget(coll, applicable + inapplicable, {}, None)
    assert fits == [] and too_large


def test_reductions_count_the_verifiers_bitsets_per_chunk_slot():
    from cclc.algorithms import get

    coll = _fabric_allgather(4, 4, 4 * 16 * 8)
    ar = make_collective("ar", K.ALLREDUCE, coll.topology, coll.group, size=4 * 16 * 8)
    entry = get("rail_halving")
    s = entry.build(ar)
    slots = sum(s.n * s.n_chunks(buf) for buf in (0, 1, 2))
    assert entry.min_slots(ar) <= slots
    est = estimate_size(ar, [entry], {})
    assert est.memory >= entry.min_slots(ar) * 8


def test_a_schedule_too_large_to_verify_is_refused_not_crashed(monkeypatch):
    import cclc.plan as plan_module
    from cclc.algorithms import get
    from cclc.verify import contributor_bytes

    coll = _fabric_allgather(4, 4, 4 * 16 * 8)
    ar = make_collective("ar", K.ALLREDUCE, coll.topology, coll.group, size=4 * 16 * 8)
    s = get("rail_halving").build(ar)
    # 16 ranks, 16 chunks in each of 3 buffers, one 64-bit word per slot
    assert contributor_bytes(s) == 16 * 48 * 8
    assert contributor_bytes(get("rail_halving").build(coll)) == 0
    monkeypatch.setattr(plan_module, "available_memory", lambda: 16 * 48 * 8)
    assert "too large to verify here" in plan_module.too_large_to_verify(s)
    monkeypatch.setattr(plan_module, "available_memory", lambda: 2 * 16 * 48 * 8)
    assert plan_module.too_large_to_verify(s) is None
