"""HTA's per-rank analyses fed in chunks (pure): memory bounded by the
state carried between chunks, not by the number of GPU rows.

Rows come in start order (ties in event order) for the time sweeps, in any
order for the per-name statistics.  Each class gives what the matching
function of :mod:`streamtrace.algo.analysis` gives on all rows at once.
"""
from __future__ import annotations

import math

import numpy as np

from .analysis import (
    BREAKDOWN_TYPES,
    COMMUNICATION,
    COMPUTATION,
    HOST_WAIT,
    KERNEL_WAIT,
    OTHER_WAIT,
    TYPE_NAMES,
    NameStats,
    Runs,
    Temporal,
    _length,
    intersection_length,
    type_overlaps,
    union,
)
from .utilization import busy_before

_EMPTY = np.empty(0, dtype=np.float64)


class Stitcher:
    """The union of intervals fed in start order: each chunk's finished runs;
    the last run stays open (a later interval may still join it)."""

    def __init__(self) -> None:
        self.open: tuple[float, float] | None = None

    def feed(self, starts: np.ndarray, ends: np.ndarray) -> Runs:
        if self.open is not None:
            starts = np.concatenate([[self.open[0]], starts])
            ends = np.concatenate([[self.open[1]], ends])
        if not len(starts):
            return _EMPTY, _EMPTY
        run_starts, run_ends = union(starts, ends)
        self.open = (float(run_starts[-1]), float(run_ends[-1]))
        return run_starts[:-1], run_ends[:-1]

    def finish(self) -> Runs:
        if self.open is None:
            return _EMPTY, _EMPTY
        found, self.open = self.open, None
        return np.array([found[0]]), np.array([found[1]])


class Timeline:
    """Temporal breakdown, kernel type overlaps and the communication overlap
    of kernels fed in start order.  The per-type runs are held only back to
    the last instant at which no kernel ran: past it nothing joins them."""

    def __init__(self, busy: BusyBins | None = None) -> None:
        self.stitchers = [Stitcher() for _ in TYPE_NAMES]
        self.pending: list[list[Runs]] = [[] for _ in TYPE_NAMES]
        self.reach = -math.inf  # latest end fed so far
        self.first: float | None = None
        self.last = 0.0
        self.every = 0.0
        self.lengths = [0.0] * len(TYPE_NAMES)
        self.overlaps: dict[str, int] = {}
        self.comm_comp = 0.0
        self.busy = busy
        self.held = False  # some run is not accounted for yet
        self.intervals = Stitcher()  # (the busy bins are of the union of the kernels themselves)

    def feed(self, start: np.ndarray, end: np.ndarray, types: np.ndarray) -> None:
        if not len(start):
            return
        before = np.maximum.accumulate(np.concatenate([[self.reach], end[:-1]]))
        gaps = np.flatnonzero(start > before)  # no interval fed so far reaches these starts
        self.reach = max(self.reach, float(end.max()))
        cut = int(gaps[-1]) if len(gaps) else 0
        if self.busy is not None:
            self.busy.add(*self.intervals.feed(start, end))
        if cut:
            self._add(start[:cut], end[:cut], types[:cut])
        if len(gaps):
            self._close()
        self._add(start[cut:], end[cut:], types[cut:])

    def settle(self, now: float) -> None:
        """Nothing fed later starts before ``now``: when nothing fed so far reaches it, account for the runs held."""
        if self.held and self.reach < now:
            self._close()

    def _add(self, start: np.ndarray, end: np.ndarray, types: np.ndarray) -> None:
        self.held = True
        for kind, stitcher in enumerate(self.stitchers):
            mine = types == kind
            if mine.any():
                self.pending[kind].append(stitcher.feed(start[mine], end[mine]))

    def _close(self) -> None:
        """Every run so far is finished: account for them."""
        self.held = False
        runs = {}
        for kind, stitcher in enumerate(self.stitchers):
            parts = self.pending[kind] + [stitcher.finish()]
            runs[kind] = (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))
            self.pending[kind] = []
            self.lengths[kind] += _length(runs[kind])
        every = union(np.concatenate([pair[0] for pair in runs.values()]), np.concatenate([pair[1] for pair in runs.values()]))
        if not len(every[0]):
            return
        if self.first is None:
            self.first = float(every[0][0])
        self.last = float(every[1][-1])
        self.every += _length(every)
        for kind, total in type_overlaps(runs).items():
            self.overlaps[kind] = self.overlaps.get(kind, 0) + total
        self.comm_comp += intersection_length(runs[COMMUNICATION], runs[COMPUTATION])

    def finish(self) -> None:
        self._close()
        if self.busy is not None:
            self.busy.add(*self.intervals.finish())

    def temporal(self) -> Temporal:
        """As :func:`analysis.temporal` (call :meth:`finish` first)."""
        if self.first is None:
            return Temporal(0.0, 0.0, 0.0, 0.0)
        span = self.last - self.first
        idle = span - self.every
        compute = self.lengths[COMPUTATION]
        return Temporal(idle, compute, span - compute - idle, span)

    def overlap_ratio(self) -> float:
        comm_time = self.lengths[COMMUNICATION]
        return self.comm_comp / comm_time if comm_time else math.nan


class BusyBins:
    """Busy time in fixed bins (``edges``), summed over disjoint runs as they come."""

    def __init__(self, edges: np.ndarray) -> None:
        self.edges = edges
        self.busy = np.zeros(max(len(edges) - 1, 0))

    def add(self, runs_start: np.ndarray, runs_end: np.ndarray) -> None:
        if not len(runs_start):
            return
        self.busy += np.diff(busy_before(runs_start, runs_end, self.edges))


class NameTotals:
    """Per name id: count, sum, max, min and the sum of squared deviations
    (merged chunk by chunk with Chan's formula), for :func:`analysis.name_stats`."""

    def __init__(self) -> None:
        self.count = np.zeros(0, dtype=np.int64)
        self.total, self.mean, self.m2 = np.zeros(0), np.zeros(0), np.zeros(0)
        self.longest, self.shortest = np.zeros(0), np.zeros(0)

    def _grow(self, size: int) -> None:
        if size <= len(self.count):
            return
        extra = size - len(self.count)
        self.count = np.append(self.count, np.zeros(extra, dtype=np.int64))
        self.total, self.mean, self.m2 = (np.append(a, np.zeros(extra)) for a in (self.total, self.mean, self.m2))
        self.longest = np.append(self.longest, np.full(extra, -np.inf))
        self.shortest = np.append(self.shortest, np.full(extra, np.inf))

    def add(self, names: np.ndarray, dur: np.ndarray) -> None:
        if not len(names):
            return
        order = np.argsort(names, kind="stable")
        names, dur = names[order], dur[order]
        first = np.flatnonzero(np.append(True, names[1:] != names[:-1]))
        ids = names[first]
        counts = np.diff(np.append(first, len(names)))
        totals = np.add.reduceat(dur, first)
        means = totals / counts
        m2 = np.add.reduceat((dur - np.repeat(means, counts)) ** 2, first)
        self._grow(int(ids.max()) + 1)
        known = self.count[ids]
        merged = known + counts
        delta = means - self.mean[ids]
        self.mean[ids] += delta * counts / merged
        self.m2[ids] += m2 + delta * delta * known * counts / merged
        self.count[ids] = merged
        self.total[ids] += totals
        self.longest[ids] = np.maximum(self.longest[ids], np.maximum.reduceat(dur, first))
        self.shortest[ids] = np.minimum(self.shortest[ids], np.minimum.reduceat(dur, first))

    def stats(self, strings: list[str], wanted: np.ndarray | None = None) -> list[NameStats]:
        """The names seen (those of ``wanted`` ids only, if given), in id order."""
        ids = np.flatnonzero(self.count)
        if wanted is not None:
            ids = ids[np.isin(ids, wanted)]
        return [NameStats(strings[at], int(self.count[at]), float(self.total[at]), float(self.longest[at]),
                          float(self.shortest[at]),
                          math.sqrt(max(float(self.m2[at]), 0.0) / (self.count[at] - 1)) if self.count[at] > 1 else 0.0)
                for at in ids.tolist()]


class StreamIdle:
    """HTA's idle time breakdown per stream for kernels fed in start order
    (the previous kernel's end is carried per stream)."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.previous_end: dict[int, float] = {}
        self.times: dict[int, np.ndarray] = {}
        self.counts: dict[int, np.ndarray] = {}

    def feed(self, stream: np.ndarray, start: np.ndarray, end: np.ndarray, launch_ts: np.ndarray) -> None:
        if not len(stream):
            return
        order = np.argsort(stream, kind="stable")
        stream, start, end, launch_ts = stream[order], start[order], end[order], launch_ts[order]
        first = np.flatnonzero(np.append(True, stream[1:] != stream[:-1]))
        group = np.cumsum(np.append(True, stream[1:] != stream[:-1])) - 1
        previous = np.append(np.nan, end[:-1])
        streams = stream[first].tolist()
        previous[first] = [self.previous_end.get(s, math.nan) for s in streams]
        gap = start - previous
        with np.errstate(invalid="ignore"):
            host = launch_ts > previous
            kernel = ~host & (gap < self.delay)
        category = np.where(host, HOST_WAIT, np.where(kernel, KERNEL_WAIT, OTHER_WAIT))
        key = group * 3 + category
        times = np.bincount(key, weights=np.nan_to_num(gap, nan=0.0), minlength=3 * len(first)).reshape(-1, 3)
        counts = np.bincount(key, minlength=3 * len(first)).reshape(-1, 3)
        last = np.append(first[1:], len(stream)) - 1
        for at, s in enumerate(streams):
            self.previous_end[s] = float(end[last[at]])
            if s in self.times:
                self.times[s] += times[at]
                self.counts[s] += counts[at]
            else:
                self.times[s], self.counts[s] = times[at].copy(), counts[at].copy()

    def breakdown(self, stream: int) -> list[tuple[int, float]]:
        """As :func:`analysis.idle_breakdown` for that stream."""
        return [(kind, float(self.times[stream][kind])) for kind in (HOST_WAIT, KERNEL_WAIT, OTHER_WAIT)
                if self.counts[stream][kind]]


__all__ = ["BREAKDOWN_TYPES", "BusyBins", "NameTotals", "Stitcher", "StreamIdle", "Timeline"]
