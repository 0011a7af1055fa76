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
from .spec import Swept

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


def sweep(buckets: Buckets | None, lo: float, hi: float, apart: bool, wants: frozenset[str]) -> Swept:
    """The kept rows on a stream in start order through what the analyses ``wants`` (see
    :data:`~.spec.SWEEPS`): the rank's timeline with HTA's times and rules ("hta"); its kernels, copies
    and sets through another with the trace's own times ("exact"; ``apart``: HTA's rounding or rows of
    other kinds make them differ, else one timeline is both), with its busy time in fine bins over
    ``lo``-``hi`` ("bins"); each step's timeline (as the latter: step_times is not HTA's) and each
    stream's idle time (HTA's).
    A bucket sorted by the trace's own starts is sorted by HTA's too (rounding a start up keeps the
    order), so both timelines take the buckets in turn."""
    swept = Swept()
    if buckets is None:
        return swept
    bins = None
    if lo <= hi and "bins" in wants:
        width, first, edges = utilization.fine_edges(lo, hi)
        bins = sweeps.BusyBins(edges)
    exact = sweeps.Timeline(bins) if wants & {"exact", "bins"} or ("hta" in wants and not apart) else None
    timeline = (sweeps.Timeline() if apart else exact) if "hta" in wants else None
    first_line = timeline if timeline is not None else (None if apart else exact)  # what takes HTA's rows
    step_lines: dict[int, sweeps.Timeline] | None = {} if "steps" in wants else None
    stream_idle = sweeps.StreamIdle(CONSECUTIVE_KERNEL_DELAY) if "idle" in wants else None
    for records in buckets.sorted():
        start, end, types = records["start"], records["end"], records["type"]
        if first_line is not None:
            first_line.feed(start, end, types)
        idle = records["idle"]
        if stream_idle is not None:
            stream_idle.feed(records["stream"][idle], start[idle], end[idle], records["launch"][idle])
        own = records
        if apart and (exact is not None or step_lines is not None):
            own = records[np.argsort(records["exact_start"], kind="stable")]
            own = own[own["idle"]]
            if exact is not None:
                exact.feed(own["exact_start"], own["exact_end"], own["type"])
        if step_lines is not None:
            for number, mine in by_step(own["step"]):
                step_lines.setdefault(number, sweeps.Timeline()).feed(own["exact_start"][mine], own["exact_end"][mine],
                                                                       own["type"][mine])
            if len(own):
                for line in step_lines.values():
                    line.settle(float(own["exact_start"][-1]))
        trim_heap()
    for line in {id(line): line for line in (first_line, exact, *(step_lines or {}).values()) if line is not None}.values():
        line.finish()
    swept.timeline, swept.exact, swept.step_lines, swept.stream_idle = timeline, exact, step_lines or {}, stream_idle
    swept.busy = None if bins is None else utilization.FineBusy(width, first, bins.busy, lo, hi)
    return swept
