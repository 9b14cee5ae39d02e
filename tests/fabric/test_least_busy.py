""":func:`cclc.least_busy.least_busy_picks` against the flow-by-flow greedy it computes at once:
random candidate paths (some sharing links, as the two cores of a fat tree's core group share
their spines' links; some in components of three and of fewer), random loads and bandwidths,
runs long and short."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from cclc.least_busy import least_busy_picks


def _greedy(load: np.ndarray, bandwidth: np.ndarray, links: np.ndarray, size: int,
            n_flows: int) -> list[int]:
    load = load.copy()
    out = []
    for _ in range(n_flows):
        busy = (load[links] + size) / bandwidth[links]
        pick = int(np.lexsort((busy.sum(axis=1), busy.max(axis=1)))[0])
        out.append(pick)
        load[links[pick]] += size
    return out


def _components(links: np.ndarray) -> np.ndarray:
    """Paths joined by shared links, each named by its lowest row."""
    comp = list(range(len(links)))
    for i in range(len(links)):
        for j in range(i):
            if set(links[i].tolist()) & set(links[j].tolist()):
                old, new = max(comp[i], comp[j]), min(comp[i], comp[j])
                comp = [new if c == old else c for c in comp]
    return np.array(comp)


@settings(max_examples=60, deadline=None)
@given(n_paths=st.integers(1, 7), width=st.sampled_from([2, 4]),
       shared=st.sampled_from(["none", "pairs", "triples"]),
       n_flows=st.integers(1, 60), size=st.sampled_from([0, 1, 3, 4096]),
       seed=st.integers(0, 2 ** 16))
def test_picks_are_the_flow_by_flow_greedy(n_paths, width, shared, n_flows, size, seed):
    rng = np.random.default_rng(seed)
    n_links = n_paths * width
    links = np.arange(n_links).reshape(n_paths, width)
    if shared == "pairs" and n_paths > 1:
        # pairs of paths share their first link (a spine's uplink under two cores)
        links[1::2, 0] = links[0::2, 0][:len(links[1::2])]
    elif shared == "triples" and n_paths > 2:
        # components of three (and a last one shorter: padded), joined by two links
        links[1::3, 0] = links[0::3, 0][:len(links[1::3])]
        links[2::3, -1] = links[0::3, -1][:len(links[2::3])]
    # loads in whole bytes (as the plan keeps them), some equal to force ties
    load = rng.integers(0, 4, n_links).astype(np.float64) * size
    bandwidth = rng.choice([1.0, 2.0, 3.0], n_links)
    want = _greedy(load, bandwidth, links, size, n_flows)
    got = least_busy_picks(load, bandwidth, links, _components(links), size, n_flows)
    assert got.tolist() == want
