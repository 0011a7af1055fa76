"""The collective report's kept columns beyond memory (:class:`~streamtrace.algo.groupagg.Kept`: the
values behind a median or a pandas pairwise sum, a number per collective): every column's values in memory
up to a budget shared by all, then written to one temporary file, so that what they hold in memory is the
budget whatever the number of collectives; read back a window at a time."""
from __future__ import annotations

import bisect
import os
import tempfile
from array import array
from typing import BinaryIO

import numpy as np

from .scratch import spool_writes

VALUE_BYTES = 16 << 20
"""Kept values (8 bytes each, all columns together) held in memory; beyond, every column's go to the file
(tests lower it)."""


class ValueSpill:
    """One temporary file (deleted when closed) for the values of many columns, each written at places of its
    own whenever the values held in memory exceed ``budget`` bytes."""

    def __init__(self, directory: str | None = None, budget: int | None = None) -> None:
        self.directory = directory
        self.budget = VALUE_BYTES if budget is None else budget
        self.held = 0
        self._columns: list[SpilledColumn] = []
        self._file: BinaryIO | None = None
        self._size = 0

    def column(self) -> SpilledColumn:
        self._columns.append(SpilledColumn(self))
        return self._columns[-1]

    def flush(self) -> None:
        """Every column's values held in memory to the file."""
        for column in self._columns:
            column.write()
        self.held = 0

    def write(self, values: array) -> int:
        """Append values; the byte offset they start at."""
        with spool_writes(self.directory or tempfile.gettempdir()):
            if self._file is None:
                self._file = tempfile.TemporaryFile(prefix="streamtrace-values-", dir=self.directory)
            offset = self._size
            os.pwrite(self._file.fileno(), values, offset)  # (the array's own bytes, not a copy)
        self._size += len(values) * 8
        return offset

    def read(self, offset: int, count: int) -> np.ndarray:
        assert self._file is not None
        return np.frombuffer(os.pread(self._file.fileno(), count * 8, offset), dtype=np.float64)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        self._columns = []


class SpilledColumn:
    """A column's values (:class:`~streamtrace.algo.groupagg.ValueColumn`): pieces in the spill's file, in
    order, then those held since its last write."""

    def __init__(self, spill: ValueSpill) -> None:
        self.spill = spill
        self.tail = array("d")
        self.offsets = array("q")  # each piece's byte offset in the file
        self.firsts = array("q")  # each piece's first place in the column
        self.stored = 0  # values in the file

    @property
    def spilled(self) -> bool:
        return self.stored > 0

    def append(self, value: float) -> None:
        self.tail.append(value)
        self.spill.held += 8
        if self.spill.held > self.spill.budget:
            self.spill.flush()

    def write(self) -> None:
        if self.tail:
            self.offsets.append(self.spill.write(self.tail))
            self.firsts.append(self.stored)
            self.stored += len(self.tail)
            self.tail = array("d")

    def __len__(self) -> int:
        return self.stored + len(self.tail)

    def read(self, first: int, end: int) -> np.ndarray:
        parts = []
        piece = max(bisect.bisect_right(self.firsts, first) - 1, 0)
        while first < min(end, self.stored):
            piece_end = self.firsts[piece + 1] if piece + 1 < len(self.firsts) else self.stored
            stop = min(end, piece_end)
            parts.append(self.spill.read(self.offsets[piece] + (first - self.firsts[piece]) * 8, stop - first))
            first, piece = stop, piece + 1
        if end > first:
            parts.append(np.frombuffer(self.tail, dtype=np.float64)[first - self.stored:end - self.stored])
        return np.concatenate(parts) if len(parts) > 1 else parts[0].copy() if parts else np.empty(0)
