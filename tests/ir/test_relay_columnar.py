"""The columnar relay lowering against the loop it replaced (``relay_reference``): the same
ops in the same order, the same scratch layout and the same routes, on random tori, faults,
routings and collectives."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from relay_reference import reference_lower_relays

from cclc.algorithms import algorithms_for
from cclc.collective import CollectiveKind, make_collective
from cclc.errors import CclError
from cclc.relay import RelayError, lower_relays
from cclc.topology import torus, with_faults


def _same(a, b) -> None:
    for k, v in a.ops.columns().items():
        np.testing.assert_array_equal(v, getattr(b.ops, k), err_msg=k)
    np.testing.assert_array_equal(a.routes.offsets, b.routes.offsets)
    np.testing.assert_array_equal(a.routes.links, b.routes.links)
    for x, y in zip(a.layouts, b.layouts, strict=True):
        np.testing.assert_array_equal(x, y)



def _raw_builds(coll):
    """(name, schedule before relays) of every applicable algorithm of ``coll``."""
    import cclc.algorithms as reg
    out = []
    for algo in algorithms_for(coll):
        if algo.applicable(coll) is not None:
            continue
        orig = reg.lower_relays
        try:
            reg.lower_relays = lambda s: s    # the registry's builds end with lower_relays
            s = algo.build(coll)
        except CclError:
            continue
        finally:
            reg.lower_relays = orig
        out.append((algo.name, s))
    return out


@pytest.mark.slow
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.integers(2, 5), min_size=1, max_size=3), st.integers(0, 10_000),
       st.sampled_from(["none", "dimension_order", "shortest"]),
       st.sampled_from([CollectiveKind.ALLTOALL, CollectiveKind.ALLGATHER,
                        CollectiveKind.ALLREDUCE, CollectiveKind.REDUCESCATTER]),
       st.booleans())
def test_columnar_relays_match_the_reference(dims, seed, routing, kind, fault):
    t = torus("t", dims, routing=routing)
    if fault and t.n_links:
        k = seed % t.n_links
        u, v = int(t.link_src[k]), int(t.link_dst[k])
        t2 = with_faults(t, links=[(u, v), (v, u)])
        t = t2 if t2.is_connected(t2.all_ranks()) else t
    n = t.n_ranks
    c = make_collective("c", kind, t, t.all_ranks(), n * n * 4 * (1 + seed % 3))
    for name, raw in _raw_builds(c):
        try:
            want = reference_lower_relays(raw)
        except RelayError as err:
            with pytest.raises(RelayError, match=str(err.message)[:40]):
                lower_relays(raw)
            continue
        got = lower_relays(raw)
        try:
            _same(got, want)
        except AssertionError as e:
            raise AssertionError(f"{name} on {dims} ({routing}): {e}") from None


@pytest.mark.slow
@pytest.mark.parametrize("routing", ["none", "dimension_order", "shortest"])
def test_relayed_schedules_of_a_faulty_3d_torus_match_the_reference(routing):
    t = torus("t", (3, 3, 4), routing=routing)
    t = with_faults(t, links=[(t.rank_at((1, 1, 1)), t.rank_at((2, 1, 1))),
                              (t.rank_at((2, 1, 1)), t.rank_at((1, 1, 1)))])
    c = make_collective("a", CollectiveKind.ALLTOALL, t, t.all_ranks(), 36 * 36 * 8)
    relayed = 0
    for _name, raw in _raw_builds(c):
        got = lower_relays(raw)
        _same(got, reference_lower_relays(raw))
        relayed += got is not raw
    assert relayed >= 2      # direct and the fault-tolerant torus entries relay here
