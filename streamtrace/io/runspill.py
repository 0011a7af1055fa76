"""Runs of GPU busy time kept on disk beyond a memory budget
(:class:`~streamtrace.algo.busy.RunStore`), so that ``inspect`` stays in
bounded memory whatever the order of a GPU's slices."""
from __future__ import annotations

import os
import tempfile
from typing import Iterator

import numpy as np

from ..algo.busy import Block, MemoryRuns
from .scratch import spool_writes

_ROW = 16  # bytes per run: start and end, float64


class RunSpill:
    """One temporary file (deleted when closed, or at exit) that many stores
    write their runs into, each at places of its own.  Opened at the first
    write, by the process writing (a forked pass-1 worker gets a file of its own)."""

    def __init__(self, directory: str | None = None) -> None:
        self.directory = directory
        self._file = None
        self._owner = -1
        self._size = 0

    def write(self, starts: np.ndarray, ends: np.ndarray) -> int:
        """Append runs; the offset they start at."""
        with spool_writes(self.directory or tempfile.gettempdir()):
            if self._owner != os.getpid():
                self._file = tempfile.TemporaryFile(prefix="streamtrace-busy-", dir=self.directory)
                self._owner, self._size = os.getpid(), 0
            offset = self._size
            os.pwrite(self._file.fileno(), np.column_stack((starts, ends)).tobytes(), offset)
        self._size += len(starts) * _ROW
        return offset

    def read(self, offset: int, count: int) -> Block:
        rows = np.frombuffer(os.pread(self._file.fileno(), count * _ROW, offset), dtype=np.float64).reshape(-1, 2)
        return rows[:, 0], rows[:, 1]

    def close(self) -> None:
        if self._file is not None and self._owner == os.getpid():
            self._file.close()
        self._file = None


class SpilledRuns:
    """A run store keeping at most ``budget`` runs in memory, the rest in ``spill``."""

    def __init__(self, spill: RunSpill, budget: int) -> None:
        self.spill = spill
        self.budget = budget
        self.pieces: list[tuple[int, int]] = []  # (offset, runs) in the spill file
        self.tail = MemoryRuns()  # the runs since the last piece written

    def append(self, starts: np.ndarray, ends: np.ndarray) -> None:
        self.tail.append(starts, ends)
        if len(self.tail.starts) > self.budget:
            self.pieces.append((self.spill.write(*next(self.tail.blocks(len(self.tail.starts)))), len(self.tail.starts)))
            self.tail = MemoryRuns()

    def blocks(self, rows: int) -> Iterator[Block]:
        for offset, count in self.pieces:
            for done in range(0, count, rows):
                yield self.spill.read(offset + done * _ROW, min(rows, count - done))
        yield from self.tail.blocks(rows)
