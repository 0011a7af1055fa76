"""HTA's kernel launch statistics: per launch and kernel, the CPU duration, GPU duration and launch delay.

Reads: the kept CPU rows with a correlation id (id, start, duration), the ids
launch calls have (cudaLaunchKernel and the like, memory copies and sets
included), the kept GPU rows with an id (id, start, duration).
Keeps per rank: the launch ids and the CPU rows with an id (a few arrays, 24
bytes a row); the GPU rows with an id go to a temporary file, with a count
per id.  At the end of the rank, the join (launches in order, each with its
GPU rows, a batch of launches at a time) is written as CSV rows to a part
file: one row per launched kernel is too many to travel or to hold.
Combines: the ranks' part files, one after the other (by rank), copied into
the table's CSV; ``--json`` lists the rows when they are few.
Tables: kernel_launch_stats.
"""
from __future__ import annotations

import csv
import io
import os
import tempfile
from dataclasses import dataclass
from itertools import repeat
from typing import IO, BinaryIO, Iterator

import numpy as np

from ...algo.columns import in_sorted, slice_positions
from ...io.objectstore import open_object
from ...io.remote import is_url
from ...io.sink import remove_quietly
from .index import NO_ID, PLAIN_BLOCK
from .ranks import Chunk, joined_columns
from .spec import Analysis, ChunkView, RankContext, Swept

JOIN_ROWS = 1 << 18  # GPU rows held at once to join them to their launches (24 bytes each)
LAUNCH_NAMES = frozenset({"cudaLaunchKernel", "cudaLaunchKernelExC", "runFunction - job_prep_and_submit_for_execution"})
MEMORY_LAUNCH_NAMES = frozenset({"cudaMemcpyAsync", "cudaMemsetAsync"})


@dataclass
class LaunchResult:
    """A rank's launch rows: a CSV part file (a file of the run's directory, or an object of its prefix), its rows."""

    path: str | None
    rows: int


class LaunchPart:
    def __init__(self, context: RankContext) -> None:
        self.context = context
        self.launch_names = np.array([at for at, name in enumerate(context.strings)
                                      if name in LAUNCH_NAMES or name in MEMORY_LAUNCH_NAMES], dtype=np.int32)
        self.launch_ids: list[np.ndarray] = []
        self.cpu: list[tuple[np.ndarray, ...]] = []
        self.joins = _JoinSpool(context.spool_dir)

    def feed(self, view: ChunkView) -> None:
        chunk, keep = view.chunk, view.keep
        self.launch_ids.append(np.unique(chunk.corr[keep & np.isin(chunk.name, self.launch_names)]))
        rows = np.flatnonzero(keep & (chunk.stream == NO_ID) & (chunk.corr != NO_ID))
        self.cpu.append((chunk.corr[rows], chunk.ts[rows], chunk.dur[rows]))
        self.joins.add(view.rows[view.rows.corr != NO_ID])

    def finish(self, swept: Swept) -> LaunchResult:
        try:
            return LaunchResult(*_launch_stats(self.context.rank, self._launch_rows(), self.joins, self.context.spool_dir))
        finally:
            self.close()

    def _launch_rows(self) -> tuple[np.ndarray, ...]:
        """The CPU rows whose id a launch call has, as columns; each chunk's rows let go once filtered (all of
        them beside the filtered copy would add a third to the rank's peak in the launch statistics)."""
        ids = np.unique(np.concatenate(self.launch_ids)) if self.launch_ids else np.empty(0, np.int64)
        ids = ids[ids != NO_ID]
        parts, self.cpu = self.cpu, []
        parts.reverse()
        kept = []
        while parts:
            columns = parts.pop()
            mine = in_sorted(columns[0], ids)
            kept.append(tuple(column[mine] for column in columns))
        return joined_columns(kept, (np.int64, np.float64, np.float64))

    def close(self) -> None:
        self.joins.close()


def open_part(part: str) -> BinaryIO:
    """A rank's launch rows: a file of the run's directory, or an object of its prefix."""
    return open_object(part) if is_url(part) else open(part, "rb")


def discard_part(result: LaunchResult) -> None:
    """Remove a rank's part file (an object goes with the run's prefix)."""
    if result.path and not is_url(result.path):
        remove_quietly(result.path)


def read_parts(parts: list[str]) -> list[dict]:
    """The rows of the ranks' part files, as ``--json`` lists them."""
    rows = []
    columns = ANALYSIS.tables["kernel_launch_stats"]
    for part in parts:
        with open_part(part) as raw, io.TextIOWrapper(raw, encoding="utf-8", newline="") as text:
            for values in csv.reader(text):
                rows.append(dict(zip(columns, (int(values[0]), int(values[1]), *(_parsed(v) for v in values[2:])))))
    return rows


def _parsed(text: str) -> float | int:
    number = float(text)
    return int(number) if number.is_integer() and "." not in text and "e" not in text else number


_JOIN = np.dtype([("corr", np.int64), ("ts", np.float64), ("dur", np.float64)])


class _JoinSpool:
    """A rank's kept GPU rows with an id (id, start, duration), on disk in event order: only a block of them is
    in memory at a time, when they are counted or matched to the launches."""

    def __init__(self, spool_dir: str | None) -> None:
        self.handle: IO[bytes] | None = None
        self.spool_dir = spool_dir

    def add(self, rows: Chunk) -> None:
        if not len(rows.corr):
            return
        if self.handle is None:
            self.handle = tempfile.TemporaryFile(prefix="streamtrace-join-", dir=self.spool_dir)
        records = np.empty(len(rows.corr), dtype=_JOIN)
        records["corr"], records["ts"], records["dur"] = rows.corr, rows.ts, rows.dur
        self.handle.write(records.tobytes())

    def counts(self, wanted: np.ndarray) -> np.ndarray:
        """How many rows each wanted id has."""
        ids, where = np.unique(wanted, return_inverse=True)
        totals = np.zeros(len(ids), dtype=np.int64)
        for records in self._blocks() if len(ids) else ():
            corr = records["corr"]
            at = np.minimum(np.searchsorted(ids, corr), len(ids) - 1)
            found = ids[at] == corr
            totals += np.bincount(at[found], minlength=len(ids))
        return totals[where]

    def matching(self, wanted: np.ndarray) -> np.ndarray:
        """The rows whose id is wanted (``wanted``: sorted), sorted by id (event order within an id)."""
        found = [records[in_sorted(records["corr"], wanted)] for records in self._blocks()]
        rows = np.concatenate(found) if found else np.empty(0, dtype=_JOIN)
        return rows[np.argsort(rows["corr"], kind="stable")]

    def _blocks(self) -> Iterator[np.ndarray]:
        """The rows, :data:`JOIN_ROWS` at a time."""
        if self.handle is None:
            return
        self.handle.seek(0)
        while block := self.handle.read(_JOIN.itemsize * JOIN_ROWS):
            yield np.frombuffer(block, dtype=_JOIN)

    def close(self) -> None:
        if self.handle is not None:
            self.handle.close()


def _launch_stats(rank: int, calls: tuple[np.ndarray, ...], joins: _JoinSpool,
                  spool_dir: str | None) -> tuple[str | None, int]:
    """HTA's launch statistics (every launch, memory copies included): each
    CPU row on no stream whose id a launch call has (``calls``: their id,
    start and duration), joined with each GPU row with that id (their
    launches' order, then the GPU rows' order); written as CSV rows to a
    part file, the GPU rows read back a batch of launches at a time."""
    corr, ts, dur = calls
    matches = joins.counts(corr)
    if not len(corr) or not matches.sum():
        return None, 0
    handle, part = tempfile.mkstemp(prefix="streamtrace-launches-", suffix=".csv", dir=spool_dir)
    count = 0
    try:
        with os.fdopen(handle, "w", newline="") as out:
            write = csv.writer(out)
            batch_of = np.cumsum(matches) // JOIN_ROWS
            for batch in np.unique(batch_of).tolist():
                launches = np.flatnonzero(batch_of == batch)
                gpu = joins.matching(np.unique(corr[launches]))
                begin = np.searchsorted(gpu["corr"], corr[launches], side="left")
                found = np.searchsorted(gpu["corr"], corr[launches], side="right") - begin
                launch = np.repeat(launches, found)  # per row: its launch, then its kernel
                kernel = slice_positions(begin, found)
                delay = np.maximum(gpu["ts"][kernel] - ts[launch] - dur[launch], 0.0)
                for first in range(0, len(launch), PLAIN_BLOCK):
                    rows = slice(first, first + PLAIN_BLOCK)
                    write.writerows(zip(repeat(rank), corr[launch[rows]].tolist(), map(_number, dur[launch[rows]].tolist()),
                                        map(_number, gpu["dur"][kernel[rows]].tolist()), map(_number, delay[rows].tolist())))
                count += len(launch)
    except BaseException:
        remove_quietly(part)
        raise
    return part, count


def _number(value: float) -> float | int:
    return int(value) if float(value).is_integer() else float(value)


ANALYSIS = Analysis(
    name="launches",
    tables={"kernel_launch_stats": ("rank", "correlation", "cpu_duration", "gpu_duration", "launch_delay")},
    part=LaunchPart,
    combine=lambda run: {"kernel_launch_stats": []},  # (the rows stay in the part files: see read_parts)
)
