"""HTA's temporal breakdown, kernel-type breakdown and communication/computation overlap, and ``gpu_time``.

Reads: the kept rows on a stream, through the shared sweep: HTA's timeline
(HTA's times, every row on a stream) and the trace's own timeline (its own
times, kernels, copies and sets).
Keeps per rank: the two timelines' totals (a few numbers, a sum per kernel
type), whether HTA's rounding moved some GPU time.
Combines: one row per rank; kernel types summed over ranks.
Tables: temporal_breakdown, kernel_type_breakdown, comm_comp_overlap (HTA's,
with HTA's rounding of times to whole microseconds), gpu_time (the same from
the trace's own times, to the nanosecond, with the communication and memory
time and whether HTA's rounding moves this rank's figures).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ...algo import analysis as hta
from ...algo import sweeps
from .spec import Analysis, NoPart, RankContext, Run, Swept


@dataclass
class GpuTime:
    """A rank's GPU time from the times the trace states (HTA's tables round them to whole microseconds):
    its temporal breakdown, the union of its communication and of its memory kernels, the share of
    communication overlapped by computation; ``rounded``: HTA's rounding moves some of this rank's GPU times."""

    temporal: hta.Temporal
    communication: float
    memory: float
    overlap: float
    rounded: bool

    @classmethod
    def of(cls, timeline: sweeps.Timeline, rounded: bool) -> GpuTime:
        return cls(timeline.temporal(), timeline.lengths[hta.COMMUNICATION], timeline.lengths[hta.MEMORY],
                   timeline.overlap_ratio(), rounded)


@dataclass
class TemporalResult:
    """A rank's HTA temporal breakdown, its time per kernel type, its overlap ratio; its own-times counterpart."""

    temporal: hta.Temporal
    type_sums: dict
    overlap: float
    exact: GpuTime


def _finish(context: RankContext, swept: Swept) -> TemporalResult:
    timeline = swept.timeline
    assert timeline is not None and swept.exact is not None  # (declared: the sweep feeds both)
    return TemporalResult(timeline.temporal(), timeline.overlaps, timeline.overlap_ratio(),
                          GpuTime.of(swept.exact, swept.rounded))


def _pctg(part: float, whole: float, digits: int = 2) -> float:
    """A percentage as HTA rounds it (NaN of nothing)."""
    return float(np.round(100 * part / whole, digits)) if whole else math.nan


def _combine(run: Run) -> dict[str, list[dict]]:
    pairs = [(r.rank, result) for r, result in zip(run.ranks, run.results("temporal"))]
    sums: dict[str, int] = {}
    for _, result in pairs:
        for kind, total in result.type_sums.items():
            sums[kind] = sums.get(kind, 0) + total
    grand = sum(sums.values())
    ordered = sorted(sorted(sums), key=lambda kind: -sums[kind])
    return {
        "temporal_breakdown": [_temporal_row(rank, result.temporal) for rank, result in pairs],
        "kernel_type_breakdown": [{"kernel_type": kind, "sum": sums[kind], "percentage": _pctg(sums[kind], grand, 1)}
                                  for kind in ordered],
        "comm_comp_overlap": [{"rank": rank, "comp_comm_overlap_pctg": float(np.round(100 * result.overlap, 2))}
                              for rank, result in pairs],
        "gpu_time": [_gpu_time_row(rank, result.exact) for rank, result in pairs],
    }


def _temporal_row(rank: int, t: hta.Temporal) -> dict:
    return {"rank": rank, "idle_time(us)": t.idle, "compute_time(us)": t.compute,
            "non_compute_time(us)": t.non_compute, "kernel_time(us)": t.kernel_time,
            "idle_time_pctg": _pctg(t.idle, t.kernel_time), "compute_time_pctg": _pctg(t.compute, t.kernel_time),
            "non_compute_time_pctg": _pctg(t.non_compute, t.kernel_time)}


def _gpu_time_row(rank: int, exact: GpuTime) -> dict:
    """The temporal breakdown and overlap of a rank from the trace's own times, to the nanosecond."""
    t = exact.temporal
    times = {"kernel_time(us)": t.kernel_time, "busy(us)": t.kernel_time - t.idle, "idle_time(us)": t.idle,
             "compute_time(us)": t.compute, "non_compute_time(us)": t.non_compute,
             "communication(us)": exact.communication, "memory(us)": exact.memory}
    return {"rank": rank, **{key: round(value, 3) for key, value in times.items()},
            "idle_time_pctg": _pctg(t.idle, t.kernel_time), "compute_time_pctg": _pctg(t.compute, t.kernel_time),
            "non_compute_time_pctg": _pctg(t.non_compute, t.kernel_time),
            "comp_comm_overlap_pctg": float(np.round(100 * exact.overlap, 2)), "hta_rounds": exact.rounded}


ANALYSIS = Analysis(
    name="temporal",
    tables={
        "temporal_breakdown": ("rank", "idle_time(us)", "compute_time(us)", "non_compute_time(us)", "kernel_time(us)",
                               "idle_time_pctg", "compute_time_pctg", "non_compute_time_pctg"),
        "kernel_type_breakdown": ("kernel_type", "sum", "percentage"),
        "comm_comp_overlap": ("rank", "comp_comm_overlap_pctg"),
        "gpu_time": ("rank", "kernel_time(us)", "busy(us)", "idle_time(us)", "compute_time(us)",
                     "non_compute_time(us)", "communication(us)", "memory(us)", "idle_time_pctg", "compute_time_pctg",
                     "non_compute_time_pctg", "comp_comm_overlap_pctg", "hta_rounds"),
    },
    part=lambda context: NoPart(context, _finish),
    combine=_combine,
    sweeps=frozenset({"hta", "exact"}),
)
