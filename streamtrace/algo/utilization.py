"""GPU busy time per time bin, per rank, exact and in memory bounded by bins.

The run's time span is known only when every rank is done, so each rank
first sums its busy time (the union of its GPU rows) into at most
``FINE_BINS`` bins whose width is a power of two microseconds and whose
edges are multiples of that width (aligned to time 0).  The run's bins are
then ``j`` times the widest rank's width, also aligned to 0: every fine bin
of every rank lies inside exactly one of them, so re-binning is a sum and
the busy time of a run bin is exact, whatever the ranks' spans.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .analysis import union

FINE_BINS = 2048


@dataclass
class FineBusy:
    """One rank's busy time in fine bins ``[(first + i) * width, (first + i + 1) * width)``."""

    width: float  # a power of two (microseconds)
    first: int
    busy: np.ndarray  # float64, microseconds per fine bin
    start: float  # first GPU start
    end: float  # last GPU end


def _bin_count(start: float, end: float, width: float) -> int:
    return max(math.ceil(end / width) - math.floor(start / width), 1)


def fine_edges(lo: float, hi: float, fine_bins: int = FINE_BINS) -> tuple[float, int, np.ndarray]:
    """Width, first bin number and edges of at most ``fine_bins`` aligned bins over ``[lo, hi]``."""
    width = 2.0 ** math.ceil(math.log2(max(hi - lo, 1e-3) / max(fine_bins - 2, 1)))
    while _bin_count(lo, hi, width) > fine_bins:
        width *= 2
    first = math.floor(lo / width)
    return width, first, (first + np.arange(_bin_count(lo, hi, width) + 1, dtype=np.float64)) * width


def fine_busy(start: np.ndarray, end: np.ndarray, fine_bins: int = FINE_BINS) -> FineBusy | None:
    """The busy time (union of ``[start, end)``) of one rank in at most ``fine_bins`` aligned bins."""
    if not len(start):
        return None
    runs_start, runs_end = union(start, end)
    lo, hi = float(runs_start[0]), float(runs_end[-1])
    width, first, edges = fine_edges(lo, hi, fine_bins)
    return FineBusy(width, first, np.diff(busy_before(runs_start, runs_end, edges)), lo, hi)


def busy_before(runs_start: np.ndarray, runs_end: np.ndarray, times: np.ndarray) -> np.ndarray:
    """Busy time before each of ``times`` (sorted disjoint runs)."""
    lengths = runs_end - runs_start
    done = np.concatenate([[0.0], np.cumsum(lengths)])
    ended = np.searchsorted(runs_end, times, side="right")  # runs over by then
    current = np.minimum(ended, len(runs_start) - 1)
    partial = np.where(ended < len(runs_start), np.clip(times - runs_start[current], 0.0, lengths[current]), 0.0)
    return done[ended] + partial


@dataclass
class RunBins:
    """The run's bins (edges clipped to the GPU span) and each rank's busy time in them."""

    starts: np.ndarray
    ends: np.ndarray
    busy: list[np.ndarray]  # per rank given, microseconds per bin


def run_bins(ranks: list[FineBusy | None], bins: int) -> RunBins | None:
    """Re-bin every rank's fine bins into about ``bins`` (at most) common bins
    over the run's GPU span; None when no rank has GPU work."""
    known = [rank for rank in ranks if rank is not None]
    if not known:
        return None
    lo, hi = min(rank.start for rank in known), max(rank.end for rank in known)
    unit = max(rank.width for rank in known)
    factor = max(1, math.ceil((hi - lo) / (bins * unit)))
    while _bin_count(lo, hi, factor * unit) > bins and factor * unit < 2 * (hi - lo):
        factor += 1
    width = factor * unit
    first, count = math.floor(lo / width), _bin_count(lo, hi, width)
    edges = (first + np.arange(count + 1, dtype=np.float64)) * width
    out = []
    for rank in ranks:
        busy = np.zeros(count)
        if rank is not None:
            ratio = round(width / rank.width)  # whole: rank.width is a power of two dividing unit
            index = (rank.first + np.arange(len(rank.busy))) // ratio - first
            busy += np.bincount(index, weights=rank.busy, minlength=count)[:count]
        out.append(busy)
    return RunBins(np.maximum(edges[:-1], lo), np.minimum(edges[1:], hi), out)
