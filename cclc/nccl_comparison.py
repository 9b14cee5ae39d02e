"""cclc's predicted time beside NCCL's: the comparison every report prints.

:mod:`cclc.nccl_model` predicts what NCCL chooses and how long it takes; this module sets that
beside the time cclc predicts for its own schedule (for an AllToAll, which NCCL runs as
grouped send/recv outside its tuning tables, :mod:`cclc.nccl_p2p` predicts it), says the
ratio the right way round, and says when the difference is inside the model's calibration
error or compares a time without software cost against one with it.
"""

from __future__ import annotations

from dataclasses import dataclass

from cclc.collective import Collective, CollectiveKind
from cclc.nccl_model import CALIBRATION_TOLERANCE, NcclChoice, nccl_estimate
from cclc.nccl_p2p import NcclAllToAll, alltoall_estimate
from cclc.units import format_time

__all__ = ["NcclComparison", "compare_with_nccl", "nccl_comparison", "speedup_text"]


def speedup_text(baseline: float, ours: float) -> str:
    """``"1.27x faster"``, ``"1.27x slower"`` or ``"as fast"``: a ratio said the right way."""
    if ours <= 0 or baseline <= 0:
        return "not comparable"
    ratio = baseline / ours
    if abs(ratio - 1) < 0.005:
        return "as fast"
    return f"{ratio:.2f}x faster" if ratio > 1 else f"{1 / ratio:.2f}x slower"


@dataclass(frozen=True, slots=True)
class NcclComparison:
    """NCCL's predicted choice for a collective beside cclc's predicted ``time`` (seconds) for
    it; ``software_cost=False`` when cclc's time charges no launch or per-op cost (the ``ir``
    model), which NCCL's does. Computed once by the pipeline and handed to every output."""

    nccl: NcclChoice | NcclAllToAll
    time: float
    software_cost: bool = True

    @property
    def nccl_time(self) -> float:
        """NCCL's predicted time (seconds)."""
        return self.nccl.time_us * 1e-6

    @property
    def speedup(self) -> str:
        """How cclc's time compares, said the right way (:func:`speedup_text`)."""
        return speedup_text(self.nccl_time, self.time)

    @property
    def _core(self) -> str:
        """What holds NCCL's ring or tree on a three-tier fabric (empty elsewhere)."""
        limit = self.nccl.core_limit
        return ("" if limit is None else
                f" (held by the pods' core links to {limit:.0f} GB/s of bus bandwidth)")

    @property
    def line(self) -> str:
        """One line for reports: NCCL's choice and time, and the comparison with its caveats
        (inside the calibration error; no software cost on cclc's side)."""
        verdict = self.speedup
        # The model is only shown to be right within the calibration tolerance: a smaller
        # difference is not a claim the model can carry, so the line says so instead of
        # standing as a speed-up.
        if (verdict != "as fast"
                and abs(self.nccl_time / self.time - 1) <= CALIBRATION_TOLERANCE):
            verdict += f", inside the model's +-{CALIBRATION_TOLERANCE:.0%} calibration error"
        if not self.software_cost:
            verdict += (" (cclc's time charges no software cost and NCCL's does: emit nccl or "
                        "msccl for a like-for-like time)")
        return (f"NCCL today (predicted by cclc's model of NCCL): {self.nccl.name} "
                f"{format_time(self.nccl_time)}, busbw {self.nccl.busbw:.1f} GB/s"
                f"{self._core}; cclc's schedule is predicted {verdict}")


def nccl_comparison(coll: Collective, time: float, software_cost: bool = True
                    ) -> NcclComparison | None:
    """NCCL's predicted choice for ``coll`` beside cclc's ``time`` for it: its tuning model
    (:func:`nccl_estimate`), or for an AllToAll its grouped send/recv
    (:func:`cclc.nccl_p2p.alltoall_estimate`); ``None`` where neither has anything to say or
    ``time`` is not positive."""
    est: NcclChoice | NcclAllToAll | None = (
        alltoall_estimate(coll) if coll.kind is CollectiveKind.ALLTOALL else nccl_estimate(coll))
    if est is None or time <= 0:
        return None
    return NcclComparison(est, time, software_cost)


def compare_with_nccl(coll: Collective, time: float, software_cost: bool = True) -> str | None:
    """The report line of :func:`nccl_comparison` (:attr:`NcclComparison.line`), or
    ``None``."""
    comparison = nccl_comparison(coll, time, software_cost)
    return None if comparison is None else comparison.line
