"""Pass 1's collective kernels beyond memory: past a budget the columns collected go to a temporary file a
block at a time (a :class:`~streamtrace.io.collectivespill.SpilledKernels` of :data:`COLUMNS`), and each
rank's kernels, read back a block at a time, to a file of its own, which the report reads as a memory map
(and which, named in the run's directory, can travel from the process reading an input to the one making the
report)."""
from __future__ import annotations

import os
import tempfile

import numpy as np

from .scratch import spool_writes

COLUMN_BYTES = 16 << 20
"""Pass 1's collective columns held in memory (:data:`COLUMNS`' 40 bytes a kernel); beyond, they go to disk
(tests lower it)."""
COLUMNS = np.dtype([("ts", "f8"), ("dur", "f8"), ("seq", "i8"), ("slot", "i4"), ("rank", "i4"), ("meta", "i4"),
                    ("peer", "i4")])
"""A kernel as pass 1 collects it: start, duration, ``Seq``, pid slot, own ``args.rank``, metadata row, peer."""
RANK_KERNEL = np.dtype([("ts", "f8"), ("dur", "f8"), ("seq", "i8"), ("meta", "i4"), ("peer", "i4")])
"""A kernel in its rank's file (what :class:`~streamtrace.algo.collectives.RankKernels` holds)."""


def packed(columns: dict[str, np.ndarray] | np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``dtype``'s fields taken from ``columns`` (arrays by name, or records holding those fields) as records."""
    records = np.empty(len(columns["ts"]), dtype)
    for name in dtype.names:
        records[name] = columns[name]
    return records


class RankFiles:
    """Each rank's kernels in a file of its own in ``directory`` (their reader removes them: :func:`remove`;
    else the run's directory goes with them)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.files: dict[int, tuple[str, int]] = {}  # rank -> its file, its kernels

    def append(self, rank: int, kernels: np.ndarray) -> None:
        """Append kernels (:data:`COLUMNS`) to the rank's file."""
        path, count = self.files.get(rank, (None, 0))
        with spool_writes(self.directory):
            if path is None:
                handle, path = tempfile.mkstemp(prefix=f"streamtrace-rank{rank}-", suffix=".collectives", dir=self.directory)
                os.close(handle)
            with open(path, "ab") as out:
                out.write(memoryview(packed(kernels, RANK_KERNEL)).cast("B"))
        self.files[rank] = (path, count + len(kernels))


def opened(path: str, count: int) -> np.ndarray:
    """A rank's kernels, from its file, as a memory map (empty without kernels)."""
    return np.memmap(path, dtype=RANK_KERNEL, mode="r", shape=(count,)) if count else np.empty(0, RANK_KERNEL)


def remove(path: str) -> None:
    """A rank's file, once read (its memory maps stay readable)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
