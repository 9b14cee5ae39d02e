"""The up-front size estimate: a lower bound on every schedule built, and the refusal it drives."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cclc.budget
from cclc.algorithms import algorithms_for
from cclc.algorithms import get as get_entry
from cclc.budget import BYTES_PER_OP, check_budget, estimate_ops, estimate_size
from cclc.cli import main
from cclc.collective import CollectiveKind as K
from cclc.collective import make_collective
from cclc.errors import CclError, CollectiveError
from cclc.pipeline import Events, Request, compile_source
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


def test_the_way_out_is_never_a_schedule_of_unknown_size():
    # a failed rank on 16x16x16: synth's estimate (n ops) is a loose lower bound, its search
    # runs minutes past its budget there; only entries whose estimate is their exact count
    # are suggested
    topo = with_faults(torus("t", (16, 16, 16)), ranks=[1000])
    group = tuple(r for r in range(4096) if r != 1000)
    coll = make_collective("ar", K.ALLREDUCE, topo, group, size=4095 * 4 * 64)
    est = estimate_size(coll, algorithms_for(coll), {}, algorithms_for(coll))
    assert est.smallest is None or get_entry(est.smallest[0]).exact_ops
    with pytest.raises(CclError) as err:
        check_budget(est, memory=1 << 30)
    assert "synth" not in err.value.message


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


_FABRIC = """\
node hgx = nvswitch(gpus = 2) {
    link 450 GB/s, 1 us
    nic  2 x 400 Gb/s
}
topology cluster = fabric(leaf_spine) {
    nodes 4 x hgx
    rails 2
    spines 2
    link 400 Gb/s, 2 us
}
collective ag = allgather on cluster { size 8 MiB }
"""


class _Notes(Events):
    def __init__(self):
        self.notes: list[str] = []

    def note(self, message: str) -> None:
        self.notes.append(message)


def _exact_estimates(text: str) -> dict[str, int]:
    """The exact op estimates of ``auto``'s applicable candidates of the file's collective."""
    import dsl

    (coll,) = dsl.loads(text, "<string>").collectives
    return {e.name: estimate_ops(coll, e) for e in algorithms_for(coll)
            if e.exact_ops and e.applicable(coll) is None}


def _without_synth(monkeypatch) -> None:
    """synth left out: a synthesis without a send bound admits nothing (the test below)."""
    import dataclasses

    from cclc.algorithms import REGISTRY, get

    monkeypatch.setitem(REGISTRY, "synth", dataclasses.replace(
        get("synth"), applicable=lambda coll, **params: "left out of this test"))


def test_auto_is_admitted_when_a_candidate_fits_and_skips_the_others(tmp_path, monkeypatch):
    _without_synth(monkeypatch)
    exact = _exact_estimates(_FABRIC)
    smallest, largest = min(exact.values()), max(exact.values())
    assert smallest < largest
    monkeypatch.setattr(cclc.budget, "MAX_OPS", smallest)
    events = _Notes()
    (r,) = compile_source(_FABRIC, tmp_path / "o", Request(emit=("json",)), events)
    assert r.plan is not None and not r.failed
    assert any("over the size limit" in n and "auto skips" in n for n in events.notes)
    rows = {c.name: c for c in r.plan.candidates}
    over = [name for name, ops in exact.items() if ops > smallest]
    # skipped with the estimate, or pruned by a bound before the size was asked about
    assert over and all(rows[name].pruned is not None
                        or (not rows[name].applicable
                            and rows[name].reason.startswith("too large to plan here"))
                        for name in over)


def test_auto_is_refused_in_seconds_when_no_exact_candidate_fits(tmp_path, monkeypatch):
    monkeypatch.setattr(cclc.budget, "MAX_OPS", min(_exact_estimates(_FABRIC).values()) - 1)
    with pytest.raises(CclError, match="too large to plan here.*--no-size-check"):
        compile_source(_FABRIC, tmp_path / "o", Request(emit=("json",)))
    assert not (tmp_path / "o").exists()


def test_an_explicit_entry_over_the_limit_is_still_refused(tmp_path, monkeypatch):
    exact = _exact_estimates(_FABRIC)
    monkeypatch.setattr(cclc.budget, "MAX_OPS", min(exact.values()))
    big = max(exact, key=lambda name: exact[name])
    with pytest.raises(CclError, match="too large to plan here"):
        compile_source(_FABRIC.replace("size 8 MiB", f"size 8 MiB; algorithm {big}"),
                       tmp_path / "o", Request(emit=("json",)))


def test_nothing_is_admitted_where_an_unprunable_candidate_of_unknown_cost_would_be_built():
    # a 4,096-rank torus AllGather: ring and pat fit the op cap exactly, but synth applies,
    # counts n ops (not its cost) and has no send bound to prune it: its search would run
    # minutes, so the collective is refused as the largest candidate says
    from cclc.budget import fitting_entries
    from cclc.plan import resolve

    topo = torus("t", (16, 16, 16), bandwidth=32e9, latency=1e-7)
    coll = make_collective("g", K.ALLGATHER, topo, topo.all_ranks(), 16 << 20)
    r = resolve(coll)
    names = {e.name for e in r.entries if e.applicable(coll) is None}
    assert {"synth", "ring", "pat"} <= names
    assert fitting_entries(coll, r.entries, r.params, 64 << 30) == ()
    # without synth, the exact candidates that fit admit it
    rest = [e for e in r.entries if e.name != "synth"]
    assert {"ring", "pat"} <= set(fitting_entries(coll, rest, r.params, 64 << 30))
