"""Where to draw every vertex and link of a topology, the way people picture the machine.

Tori are grids (3-D and 4-D as small multiples of 2-D slices over the last two dimensions),
fabrics are leaf/spine trees with nodes as boxes, a single NVSwitch node is a box of GPUs around
its switch. Every directed link gets one drawable segment: in-plane links as two offset lines
(one per direction), links between slices as short ticks at the rank pointing "up" (+) or
"down" (-), so the page always has exactly one link element per directed link.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from cclc.topology import Topology

__all__ = ["Layout", "layout_topology"]

GAP = 26.0   # gap between slices


def _cell(n_ranks: int) -> float:
    """Distance between neighbouring ranks in a torus slice: roomy when there are few."""
    return 64.0 if n_ranks <= 36 else 46.0 if n_ranks <= 150 else 32.0


@dataclass(frozen=True)
class Layout:
    width: float
    height: float
    vx: np.ndarray            # x of every vertex
    vy: np.ndarray            # y of every vertex
    seg: np.ndarray           # (n_links, 4): x1, y1, x2, y2 of each directed link's drawing
    boxes: list[dict]         # labelled rectangles (slices, nodes)
    labels: list[dict]        # free text (x, y, text)


def layout_topology(topo: Topology) -> Layout:
    if topo.dims is not None:
        return _torus(topo)
    return _nodes(topo)


def _offset(x1, y1, x2, y2, d):
    """Shift a segment sideways by ``d`` so the two directions of a link do not overlap."""
    dx, dy = x2 - x1, y2 - y1
    length = np.hypot(dx, dy)
    length = np.where(length == 0, 1, length)
    ox, oy = -dy / length * d, dx / length * d
    return x1 + ox, y1 + oy, x2 + ox, y2 + oy


def _torus(topo: Topology) -> Layout:
    assert topo.dims is not None        # layout() sends only tori here
    dims = topo.dims
    nd = len(dims)
    cell = _cell(topo.n_ranks)
    # the last two dimensions form a slice; the others index the small multiples
    plane = dims[-2:] if nd >= 2 else (1, dims[0])
    outer = dims[:-2] if nd >= 2 else ()
    rows, cols = plane
    slice_w = cols * cell + GAP
    slice_h = rows * cell + GAP
    # outer grid: first outer dim down, second across; further dims continue across
    out_rows = outer[0] if len(outer) >= 1 else 1
    out_cols = math.prod(outer[1:]) if len(outer) >= 2 else 1
    coords = np.array(np.unravel_index(np.arange(topo.n_ranks), dims)).T  # (n, nd)
    if nd >= 2:
        r, c = coords[:, -2], coords[:, -1]
        orow = coords[:, 0] if len(outer) >= 1 else np.zeros(topo.n_ranks, dtype=int)
        ocol = (np.ravel_multi_index(coords[:, 1:-2].T, outer[1:]) if len(outer) >= 2
                else np.zeros(topo.n_ranks, dtype=int))
    else:
        r, c = np.zeros(topo.n_ranks, dtype=int), coords[:, 0]
        orow = ocol = np.zeros(topo.n_ranks, dtype=int)
    vx = GAP + ocol * slice_w + c * cell + cell / 2
    vy = GAP + 14 + orow * slice_h + r * cell + cell / 2
    boxes = []
    if outer:
        for idx in np.ndindex(*outer):
            orow_i = idx[0]
            ocol_i = int(np.ravel_multi_index(idx[1:], outer[1:])) if len(outer) >= 2 else 0
            boxes.append(dict(x=GAP / 2 + ocol_i * slice_w, y=GAP / 2 + 14 + orow_i * slice_h - 4,
                              w=cols * cell + GAP / 2, h=rows * cell + GAP / 2,
                              label="dim " + ",".join(f"{k}={v}" for k, v in enumerate(idx)),
                              cls="slice"))
    src, dst = topo.link_src, topo.link_dst
    cs, cd = coords[src], coords[dst]
    diff = cd != cs
    dim_of_link = np.argmax(diff, axis=1)
    in_plane = dim_of_link >= nd - 2 if nd >= 2 else np.ones(len(src), dtype=bool)
    x1, y1 = vx[src].astype(float), vy[src].astype(float)
    x2, y2 = vx[dst].astype(float), vy[dst].astype(float)
    seg = np.zeros((len(src), 4))
    # wrap-around hops in a plane: draw a short stub leaving the edge instead of a long line
    step = (cd[np.arange(len(src)), dim_of_link] - cs[np.arange(len(src)), dim_of_link])
    wrap_hop = np.abs(step) > 1
    ux = np.where(dim_of_link == nd - 1, np.sign(step), 0) * np.where(wrap_hop, -1, 1)
    uy = np.where(dim_of_link == nd - 2, np.sign(step), 0) * np.where(wrap_hop, -1, 1)
    ex = np.where(wrap_hop, x1 + ux * cell * 0.45, x2)
    ey = np.where(wrap_hop, y1 + uy * cell * 0.45, y2)
    sx, sy, tx, ty = _offset(x1, y1, ex, ey, 2.5)
    # shorten so arrows do not hide under rank circles
    seg[:, 0], seg[:, 1], seg[:, 2], seg[:, 3] = sx, sy, tx, ty
    # links between slices: ticks toward the upper-right (+) or lower-left (-)
    out = ~in_plane
    if out.any():
        sign = np.sign(step[out])
        k = dim_of_link[out]
        ang = -math.pi / 4 + k * 0.35
        seg[out, 0] = x1[out]
        seg[out, 1] = y1[out]
        seg[out, 2] = x1[out] + sign * 9 * np.cos(ang)
        seg[out, 3] = y1[out] + sign * 9 * np.sin(ang)
    width = GAP + out_cols * slice_w
    height = GAP + 14 + out_rows * slice_h
    labels = [dict(x=GAP / 2, y=14, text=f"{topo.kind_name} {'x'.join(map(str, dims))}"
                   + ("" if nd <= 2 else "  (slices over the last two dimensions; ticks are "
                      "links to the neighbouring slices)"))]
    return Layout(width, height, vx.astype(float), vy.astype(float), seg, boxes, labels)


def _nodes(topo: Topology) -> Layout:
    """Fabrics and single nodes: spines on top, leaves below, node boxes at the bottom."""
    names = topo.vertex_names
    nv = topo.n_vertices
    vx, vy = np.zeros(nv), np.zeros(nv)
    n_nodes = topo.n_nodes
    # fabrics and nodes always place their ranks on nodes (cclc.topology)
    assert topo.node_of_rank is not None and topo.gpu_of_rank is not None
    gpus = int(np.bincount(topo.node_of_rank).max()) if topo.n_ranks else 1
    node_w = max(60.0, gpus * 16.0 + 12)
    node_h = 74.0
    top = 40.0
    leaves = [v for v in range(nv) if names[v].startswith("leaf")]
    spines = [v for v in range(nv) if names[v].startswith("spine")]
    switch = [v for v in range(nv) if names[v] == "switch"]
    width = max(400.0, n_nodes * (node_w + 12) + 40)
    y_nodes = top + (140 if (leaves or switch) else 0) + (70 if spines else 0)
    boxes = []
    for n in range(n_nodes):
        bx = 20 + n * (node_w + 12)
        boxes.append(dict(x=bx, y=y_nodes, w=node_w, h=node_h, label=f"node{n}", cls="node"))
    for v in range(nv):
        name = names[v]
        if v < topo.n_ranks:
            n, g = int(topo.node_of_rank[v]), int(topo.gpu_of_rank[v])
            vx[v] = 20 + n * (node_w + 12) + 14 + g * 16
            vy[v] = y_nodes + node_h - 18
        elif name.startswith("node") and (name.endswith("nvswitch") or name.endswith("pcie")):
            n = int(name[4:name.index(".")])
            vx[v] = 20 + n * (node_w + 12) + node_w / 2
            vy[v] = y_nodes + 40
        elif ".nic" in name:
            n = int(name[4:name.index(".")])
            i = int(name[name.index(".nic") + 4:])
            vx[v] = 20 + n * (node_w + 12) + 14 + i * 16
            vy[v] = y_nodes + 14
    for vs, y in ((spines, top + 10), (leaves, top + (80 if spines else 10)),
                  (switch, top + 60)):
        for k, v in enumerate(vs):
            vx[v] = 20 + (k + 0.5) * (width - 40) / max(1, len(vs))
            vy[v] = y
    height = y_nodes + node_h + 30
    x1, y1 = vx[topo.link_src], vy[topo.link_src]
    x2, y2 = vx[topo.link_dst], vy[topo.link_dst]
    sx, sy, tx, ty = _offset(x1, y1, x2, y2, 1.5)
    seg = np.stack([sx, sy, tx, ty], axis=1)
    label = {"fabric": "fabric", "node": "node"}.get(topo.kind, topo.kind)
    labels = [dict(x=10, y=16, text=f"{label} '{topo.name}': {topo.n_ranks} GPUs, "
                   f"{n_nodes} node{'s' if n_nodes != 1 else ''}")]
    return Layout(width, height, vx, vy, seg, boxes, labels)
