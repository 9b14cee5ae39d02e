"""The model of NCCL against published measurements (cclc/data/nccl_published.csv)."""

from __future__ import annotations

import pytest

from cclc.calibration import load_points, predict
from cclc.errors import SemanticError
from cclc.nccl_model import CALIBRATION_TOLERANCE as TOLERANCE
from cclc.nccl_model import Func

POINTS = load_points()


def test_the_data_covers_what_it_must():
    large = [p for p in POINTS if p.scale == "large"]
    assert len(POINTS) >= 12
    assert {p.func for p in large} == {Func.ALLREDUCE, Func.ALLGATHER, Func.REDUCESCATTER}
    assert any(p.scale == "small" for p in POINTS)
    assert {p.arch for p in large if p.nodes == 1 and p.interconnect == "nvswitch"} >= \
        {"ampere", "hopper"}
    assert any(p.interconnect == "pcie" for p in large)
    assert any(p.nodes == 2 for p in large) and any(p.nodes >= 4 and p.nics == 8 for p in large)
    # every row names where its number comes from
    assert all(p.source.startswith("https://") for p in POINTS)


def test_large_points_within_tolerance():
    """Every checked large-size point within +-25%; the message names the ones that drift."""
    preds = [predict(p) for p in POINTS if p.scale == "large" and p.check == "yes"]
    drift = [f"{r.point.id}: published {r.point.value:g}, predicted {r.predicted:.1f} "
             f"({r.error:+.0%}, {r.choice})" for r in preds if not r.within]
    assert not drift, "points outside +-{:.0%}:\n".format(TOLERANCE) + "\n".join(drift)
    assert len(preds) >= 8


@pytest.mark.parametrize("point", [p for p in POINTS if p.check == "known-weak"],
                         ids=lambda p: p.id)
def test_known_weak_points_stay_documented(point):
    """A point exempted as known-weak must really be outside the tolerance: when the model
    improves, the exemption has to go (strict, like an xfail that must fail)."""
    r = predict(point)
    assert not r.within, f"{point.id} is now within +-{TOLERANCE:.0%}: mark it 'yes'"
    assert "http" in point.source and len(point.source) > 60


def test_bad_data_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("id,arch\nx,hopper\n")
    with pytest.raises(SemanticError, match="row 1 lacks"):
        load_points(bad)
    with pytest.raises(SemanticError, match="cannot read"):
        load_points(tmp_path / "missing.csv")


def test_hgx16_example_allreduce_matches_its_class_of_cluster():
    """The flagship example (16 HGX H100 nodes, 8 x 400 Gb/s NICs each): the predicted NCCL
    busbw of its 1 GiB allreduce is within +-25% of every published allreduce figure for
    multi-node H100 clusters of that build (>= 4 nodes, 8 NDR NICs per node), whatever their
    size: the measured 1 GiB point of a 4-node cluster and the 8 GiB-class figures."""
    from pathlib import Path

    import dsl
    from cclc.collective import CollectiveKind
    from cclc.nccl_model import nccl_estimate

    example = Path(__file__).resolve().parents[2] / "examples" / "hgx16_leafspine.ccl"
    program = dsl.load(example)
    coll = next(c for c in program.collectives
                if c.kind is CollectiveKind.ALLREDUCE and c.size == 1 << 30 and c.n == 128)
    est = nccl_estimate(coll)
    peers = [p for p in POINTS
             if p.arch == "hopper" and p.nodes >= 4 and p.gpus == 8 and p.nics == 8
             and p.nic_gbps == 400 and p.func is Func.ALLREDUCE and p.metric == "busbw"]
    assert any(p.size == 1 << 30 for p in peers) and any(p.nodes == 16 for p in peers)
    off = [f"{p.id}: published {p.value:g} at {p.size} B, predicted {est.busbw:.1f}"
           for p in peers if abs(est.busbw / p.value - 1) > TOLERANCE]
    assert not off, "\n".join(off)
