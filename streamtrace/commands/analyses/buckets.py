"""A rank's kept GPU rows in time buckets on disk, and the one sweep through them in start order that
the time-based analyses read (HTA's timeline, the trace's own, per step, per stream)."""
from __future__ import annotations

import math
import os
import tempfile
from typing import IO, Iterator

import numpy as np

from ...algo import sweeps, utilization
from ...resources import trim_heap
from .ranks import Chunk, by_step

BUCKET_ROWS = 1 << 16  # GPU rows per time bucket, the unit of the time-ordered sweeps (about 50 bytes each)
CONSECUTIVE_KERNEL_DELAY = 30


_TIMELINE = np.dtype([("start", np.float64), ("end", np.float64), ("pos", np.int64), ("stream", np.int64),
                      ("launch", np.float64), ("step", np.int64), ("type", np.int8), ("idle", np.bool_),
                      ("exact_start", np.float64), ("exact_end", np.float64)])


class Buckets:
    """A rank's kept GPU rows on disk, in time buckets of about :data:`BUCKET_ROWS`
    rows by start: read back bucket by bucket, each sorted by (start, event order),
    they are the rows in start order that the time sweeps take."""

    def __init__(self, first: float, last: float, count: int, spool_dir: str | None) -> None:
        self.first = first
        self.count = max(1, math.ceil(count / BUCKET_ROWS))
        self.width = (last - first) / self.count if last > first else 1.0
        self.files: list[IO[bytes] | None] = [None] * self.count
        self.spool_dir = spool_dir

    def add(self, records: np.ndarray) -> None:
        bucket = np.clip(((records["start"] - self.first) // self.width).astype(np.int64), 0, self.count - 1)
        order = np.argsort(bucket, kind="stable")
        records, bucket = records[order], bucket[order]
        cuts = np.flatnonzero(np.append(True, bucket[1:] != bucket[:-1]))
        for begin, end in zip(cuts.tolist(), np.append(cuts[1:], len(bucket)).tolist()):
            at = int(bucket[begin])
            if self.files[at] is None:
                self.files[at] = tempfile.TemporaryFile(prefix="streamtrace-gpu-", dir=self.spool_dir)
            self.files[at].write(records[begin:end].tobytes())  # type: ignore[union-attr]

    def sorted(self) -> Iterator[np.ndarray]:
        """Each bucket's records in (start, event order); a bucket far larger than planned (starts
        crowded in a part of the span) is cut again by time, unless all its rows start at one instant."""
        for handle in self.files:
            if handle is None:
                continue
            count = handle.seek(0, os.SEEK_END) // _TIMELINE.itemsize
            first = last = 0.0
            if count > 4 * BUCKET_ROWS:
                first, last = math.inf, -math.inf
                for block in _records(handle):
                    first, last = min(first, float(block["start"].min())), max(last, float(block["start"].max()))
            if first == last:
                handle.seek(0)
                records = np.frombuffer(handle.read(), dtype=_TIMELINE)
                yield records[np.lexsort((records["pos"], records["start"]))]
                continue
            inner = Buckets(first, last, count, self.spool_dir)
            try:
                for block in _records(handle):
                    inner.add(block)
                yield from inner.sorted()
            finally:
                inner.close()

    def close(self) -> None:
        for handle in self.files:
            if handle is not None:
                handle.close()


def _records(handle: IO[bytes]) -> Iterator[np.ndarray]:
    """A bucket file's records, a bucket's worth at a time."""
    handle.seek(0)
    while block := handle.read(_TIMELINE.itemsize * BUCKET_ROWS):
        yield np.frombuffer(block, dtype=_TIMELINE)


def timeline_records(rows: Chunk, launch_ts: np.ndarray, steps: np.ndarray, types: np.ndarray,
                      idle: np.ndarray) -> np.ndarray:
    """What the time sweeps read of kept GPU rows (``idle``: a kernel, copy or set, which idle time counts)."""
    records = np.empty(len(rows.ts), dtype=_TIMELINE)
    for column, values in (("start", rows.ts), ("end", rows.ts + rows.dur), ("pos", rows.pos), ("stream", rows.stream),
                           ("launch", launch_ts), ("step", steps), ("type", types), ("idle", idle),
                           ("exact_start", rows.exact_ts), ("exact_end", rows.exact_ts + rows.exact_dur)):
        records[column] = values
    return records


def sweep(buckets: Buckets, lo: float, hi: float, apart: bool) -> tuple[sweeps.Timeline, sweeps.Timeline,
                                                                           utilization.FineBusy | None, dict,
                                                                           sweeps.StreamIdle]:
    """The kept rows on a stream in start order through the rank's timeline, with HTA's times and rules;
    its kernels, copies and sets through another with the trace's own times (``apart``: HTA's rounding
    or rows of other kinds make them differ; else one timeline is both), with its busy time in fine bins
    over ``lo``-``hi``; each step's timeline (as the latter: step_times is not HTA's) and each stream's
    idle time (HTA's).
    A bucket sorted by the trace's own starts is sorted by HTA's too (rounding a start up keeps the
    order), so both timelines take the buckets in turn."""
    bins = None
    if lo <= hi:
        width, first, edges = utilization.fine_edges(lo, hi)
        bins = sweeps.BusyBins(edges)
    exact = sweeps.Timeline(bins)
    timeline = sweeps.Timeline() if apart else exact
    step_lines: dict[int, sweeps.Timeline] = {}
    stream_idle = sweeps.StreamIdle(CONSECUTIVE_KERNEL_DELAY)
    for records in buckets.sorted():
        start, end, types = records["start"], records["end"], records["type"]
        timeline.feed(start, end, types)
        idle = records["idle"]
        stream_idle.feed(records["stream"][idle], start[idle], end[idle], records["launch"][idle])
        own = records
        if apart:
            own = records[np.argsort(records["exact_start"], kind="stable")]
            own = own[own["idle"]]
            exact.feed(own["exact_start"], own["exact_end"], own["type"])
        for number, mine in by_step(own["step"]):
            step_lines.setdefault(number, sweeps.Timeline()).feed(own["exact_start"][mine], own["exact_end"][mine],
                                                                   own["type"][mine])
        if len(own):
            for line in step_lines.values():
                line.settle(float(own["exact_start"][-1]))
        trim_heap()
    timeline.finish()
    if apart:
        exact.finish()
    for line in step_lines.values():
        line.finish()
    busy = None if bins is None else utilization.FineBusy(width, first, bins.busy, lo, hi)
    return timeline, exact, busy, step_lines, stream_idle
