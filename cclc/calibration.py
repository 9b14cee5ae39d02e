"""Published NCCL measurements against cclc's model of NCCL (:mod:`cclc.nccl_model`).

A calibration point is one published number (nccl-tests busbw at a large size, or the time of
a small call) on a machine described by a few figures: GPU generation, nodes, GPUs per node,
the per-GPU link to the node switch, NICs per node and their rate. Each point is turned into a
cclc topology (one node, or nodes on one switch) and predicted through the same path as every
report: :func:`cclc.nccl_model.system_of`, :func:`~cclc.nccl_model.nccl_init`,
:func:`~cclc.nccl_model.nccl_choice`. The data file ships with the package
(:data:`cclc.nccl_model.CALIBRATION_DATA`); every row names its source. An AllToAll point,
which NCCL runs as grouped send/recv outside its tuning tables, is predicted by
:func:`cclc.nccl_p2p.nccl_alltoall` on the same system.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from cclc.collective import CollectiveKind
from cclc.errors import SemanticError
from cclc.nccl_model import (
    CALIBRATION_DATA,
    CALIBRATION_TOLERANCE,
    Algo,
    Func,
    Proto,
    nccl_choice,
    nccl_init,
    system_of,
)
from cclc.nccl_p2p import nccl_alltoall
from cclc.topology import NodeType, interconnect_named, single_node, single_switch

__all__ = ["Point", "Prediction", "load_points", "predict"]

_KINDS = {"allreduce": CollectiveKind.ALLREDUCE, "allgather": CollectiveKind.ALLGATHER,
          "reducescatter": CollectiveKind.REDUCESCATTER, "alltoall": CollectiveKind.ALLTOALL}
_COLUMNS = ("id", "arch", "nodes", "gpus", "interconnect", "link_gbs", "nics", "nic_gbps",
            "collective", "size", "algorithm", "metric", "value", "scale", "check", "source")


@dataclass(frozen=True, slots=True)
class Point:
    """One published measurement and the machine it was taken on."""

    id: str
    arch: str
    nodes: int
    gpus: int
    interconnect: str
    link_gbs: float
    nics: int
    nic_gbps: float
    kind: CollectiveKind
    size: int
    algorithm: Algo | None
    metric: str            # "busbw" (GB/s) | "time_us"
    value: float
    scale: str             # "large" | "small"
    check: str             # "yes" | "known-weak" | "report"
    source: str

    @property
    def func(self) -> Func | None:
        """NCCL's function for the point's collective; ``None`` for AllToAll (grouped
        send/recv, outside NCCL's tuning tables)."""
        return Func[self.kind.name] if self.kind.name in Func.__members__ else None


@dataclass(frozen=True, slots=True)
class Prediction:
    point: Point
    predicted: float       # in the point's metric
    choice: str            # NCCL's algorithm/protocol in the model

    @property
    def error(self) -> float:
        """Relative error of the prediction against the published value."""
        return self.predicted / self.point.value - 1.0

    @property
    def within(self) -> bool:
        # large-size points marked ``check = yes`` must be predicted within this relative error
        return abs(self.error) <= CALIBRATION_TOLERANCE


def load_points(path: str | Path = CALIBRATION_DATA) -> list[Point]:
    """The points of a calibration CSV (``#`` lines are comments)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise SemanticError(f"cannot read calibration data '{path}': {err.strerror}") from None
    rows = list(csv.DictReader(line for line in text.splitlines()
                               if line.strip() and not line.lstrip().startswith("#")))
    points = []
    for i, row in enumerate(rows, start=1):
        missing = [c for c in _COLUMNS if not (row.get(c) or c in ("algorithm",))]
        if missing:
            raise SemanticError(f"{path}: row {i} lacks {', '.join(missing)}")
        try:
            algo = Algo[row["algorithm"].upper()] if row["algorithm"] else None
            points.append(Point(
                id=row["id"], arch=row["arch"], nodes=int(row["nodes"]), gpus=int(row["gpus"]),
                interconnect=row["interconnect"], link_gbs=float(row["link_gbs"]),
                nics=int(row["nics"]), nic_gbps=float(row["nic_gbps"]),
                kind=_KINDS[row["collective"]], size=int(row["size"]), algorithm=algo,
                metric=row["metric"], value=float(row["value"]), scale=row["scale"],
                check=row["check"], source=row["source"]))
        except (KeyError, ValueError) as err:
            raise SemanticError(f"{path}: row {i} ({row.get('id')}): bad value {err}") from None
    return points


def _topology(p: Point):
    node = NodeType(p.id, interconnect_named(p.interconnect), p.gpus, p.link_gbs * 1e9, 1e-6,
                    nics=p.nics, nic_bandwidth=p.nic_gbps / 8 * 1e9)
    if p.nodes == 1:
        return single_node(p.id, node)
    return single_switch(p.id, p.nodes, node, p.nic_gbps / 8 * 1e9, 2e-6)


def predict(p: Point) -> Prediction:
    """What cclc's model of NCCL predicts for ``p`` (NCCL's choice; a forced algorithm keeps
    NCCL's protocol choice among that algorithm's protocols, as ``NCCL_ALGO`` does)."""
    system = system_of(_topology(p), arch=p.arch)
    if p.func is None:
        a2a = nccl_alltoall(system, p.size)
        return Prediction(p, a2a.busbw if p.metric == "busbw" else a2a.time_us, a2a.name)
    model = nccl_init(system)
    allowed = None if p.algorithm is None else {(p.algorithm, q) for q in Proto}
    choice = nccl_choice(model, p.func, p.size, allowed)
    if choice is None:
        raise SemanticError(f"calibration point {p.id}: the model has no algorithm for it")
    value = choice.busbw if p.metric == "busbw" else choice.time_us
    return Prediction(p, value, choice.name)
