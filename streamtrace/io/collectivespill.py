"""The collective report beyond memory: the ranks' kernel records and the rows of its long tables (a row
per kernel or per collective) go to temporary files, so that ``analyze`` holds, whatever the size and
number of its inputs, a budget of records and the collective being matched."""
from __future__ import annotations

import csv
import io
import math
import os
import pickle
import shutil
import tempfile
from array import array
from typing import BinaryIO, Iterator

import numpy as np

from ..algo.collectives import KERNEL, Rows, missing
from .scratch import spool_writes

SPILL_BYTES = 64 << 20
"""Kernel records (32 bytes each) kept in memory; beyond, all of them go to one file (tests lower it)."""


PENDING_CELLS = 1 << 12
"""Cells of rows made held, then written together (a row of more on its own, a line at a time)."""


class SpilledKernels:
    """Every rank's kernel records (:class:`~streamtrace.algo.collectives.KernelStore`): in memory up to
    :data:`SPILL_BYTES`, else in one temporary file (one handle whatever the number of ranks), read back
    as a memory map: the matching reads a rank's block and each collective's kernels, the page cache the rest."""

    def __init__(self, directory: str | None = None, budget: int | None = None) -> None:
        self.directory = directory
        self.budget = SPILL_BYTES if budget is None else budget
        self._parts: list[np.ndarray] = []
        self._held = 0
        self._size = 0
        self._file: BinaryIO | None = None

    def append(self, records: np.ndarray) -> int:
        offset = self._size
        self._size += len(records)
        if self._file is None and self._held + records.nbytes <= self.budget:
            self._parts.append(records)
            self._held += records.nbytes
            return offset
        with spool_writes(self.directory or tempfile.gettempdir()):
            if self._file is None:
                self._file = tempfile.TemporaryFile(prefix="streamtrace-collectives-", dir=self.directory)
                for part in self._parts:
                    self._file.write(_raw(part))
                self._parts, self._held = [], 0
            self._file.write(_raw(records))
        return offset

    @property
    def spilled(self) -> bool:
        return self._file is not None

    def seal(self) -> np.ndarray:
        if self._file is None:
            return np.concatenate(self._parts) if self._parts else np.empty(0, KERNEL)
        self._file.flush()
        return np.memmap(self._file, dtype=KERNEL, mode="r", shape=(self._size,))

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        self._parts = []


def _raw(records: np.ndarray) -> memoryview:
    """The records' bytes as they are in memory (no copy: a rank's records may be hundreds of MB)."""
    return memoryview(np.ascontiguousarray(records)).cast("B")


class RowPart(Rows):
    """A table's rows written to a temporary file as they are made, as CSV lines (a row of named columns
    its values, after the number of its sequence of names, each distinct sequence held once: laid out
    when the columns are known); while there are at most ``keep``, a copy of them as made too (pickled a
    block at a time, in a second file), so that the summary's rows are read back, values and types as
    made, from the files at the end (:meth:`each_row`): none is held meanwhile.  Rows are written
    together, :data:`PENDING_CELLS` cells at a time; a row of more cells on its own, a few hundred cells
    at a time (an all_to_allv's row over 1,024 ranks, every rank's splits, is megabytes).  A sorted table
    keeps its sort key and each row's place (16 bytes a row)."""

    def __init__(self, directory: str | None, keep: int) -> None:
        super().__init__()
        self.directory, self.keep = directory, keep
        self.count = 0
        self.named = False  # rows made as dicts
        self.typed = keep > 0  # the rows as made are kept (at most ``keep``)
        self._copies: BinaryIO | None = None
        self._file: BinaryIO | None = None
        self._text: io.TextIOWrapper | None = None
        self._sort_keys = array("d")
        self._offsets = array("q")
        self._copy_places = array("q")  # a sorted table's rows' places in the copies
        self._pending: list = []  # rows made, not yet written
        self._names: dict[tuple, int] = {}  # rows' sequences of column names (named rows), numbered
        self._cells = 0  # their cells

    def add(self, row: list | dict, key: object = None) -> None:
        self.named = isinstance(row, dict)
        if len(row) >= PENDING_CELLS:
            self._flush()  # (a row this long is written alone, a few hundred cells at a time)
        if key is not None:
            self._sort_keys.append(math.nan if missing(key) else key)  # type: ignore[arg-type]
        if len(self._sort_keys) not in (0, self.count + 1):  # (the keys would fall out of step with the rows)
            raise ValueError("every row of a sorted table needs its sort key, and a row of an unsorted one none")
        self._pending.append(row)
        self._cells += len(row)
        self.count += 1
        if self.typed and self.count > self.keep:
            self.typed = False
            if self._copies is not None:
                self._copies.close()
                self._copies = None
        if self._cells >= PENDING_CELLS:
            self._flush()

    def _flush(self) -> None:
        """Write the pending rows: their CSV lines (each keyed row's place noted), and their copy while typed."""
        if not self._pending:
            return
        rows, self._pending, self._cells = self._pending, [], 0
        with spool_writes(self.directory or tempfile.gettempdir()):
            if self._text is None:
                self._file = tempfile.TemporaryFile(prefix="streamtrace-table-", dir=self.directory)
                self._text = io.TextIOWrapper(self._file, encoding="utf-8", newline="", write_through=True)
            keyed = len(self._sort_keys) > len(self._offsets)
            if self.typed:
                self._copy(rows, keyed)
            if len(rows) == 1 and len(rows[0]) >= PENDING_CELLS:
                if keyed:
                    self._offsets.append(self._file.tell())  # type: ignore[union-attr]
                _write_cells(self._text, self._lines(rows)[0])
                return
            batch = io.StringIO()
            starts = self._write_rows(batch, rows, keyed)
            text = batch.getvalue()
            if keyed:
                self._note_places(text, starts)
            self._text.write(text)

    def _copy(self, rows: list, keyed: bool) -> None:
        """The rows as made, pickled: a block at a time, or a row at a time at a noted place when the table is
        sorted (read back in its order, a row at a time)."""
        if self._copies is None:
            self._copies = tempfile.TemporaryFile(prefix="streamtrace-rows-", dir=self.directory)
        self._copies.seek(0, os.SEEK_END)
        for block in [[row] for row in rows] if keyed else [rows]:
            if keyed:
                self._copy_places.append(self._copies.tell())
            pickle.dump(block, self._copies, protocol=pickle.HIGHEST_PROTOCOL)

    def _write_rows(self, out: io.TextIOBase, rows: list, keyed: bool) -> list[int]:
        """The rows' CSV lines; ``keyed``: returns where each row starts in ``out``."""
        writer = csv.writer(out, lineterminator="\n")
        if not keyed:
            writer.writerows(self._lines(rows))
            return []
        starts = []
        for line in self._lines(rows):
            starts.append(out.tell())
            writer.writerow(line)
        return starts

    def _lines(self, rows: list) -> list[list]:
        """The rows' cells as written: NaN as an empty cell (as None); a named row's values after the number
        of its names."""
        if not self.named:
            return [[value if value == value else "" for value in row] for row in rows]  # (value == value: not NaN)
        return [[self._number(row), *[value if value == value else "" for value in row.values()]] for row in rows]

    def _number(self, row: dict) -> int:
        names = tuple(row)
        found = self._names.get(names)
        if found is None:
            found = self._names[names] = len(self._names)
        return found

    def _note_places(self, text: str, starts: list[int]) -> None:
        """Each keyed row's byte offset in the file, from where it starts in ``text`` (characters)."""
        place = self._file.tell()  # type: ignore[union-attr]
        if text.isascii():
            self._offsets.extend([place + start for start in starts])
            return
        previous = 0
        for start in starts:
            place += len(text[previous:start].encode())
            previous = start
            self._offsets.append(place)

    def each_row(self, columns: list[str], order: np.ndarray | None) -> Iterator[list] | None:
        """The rows as they were made (lists in ``columns``' order, in ``order`` if given), read back from the
        files; None when there are more than ``keep``."""
        if not self.typed:
            return None
        self._flush()
        if self._copies is None:
            return iter(())
        rows = _blocks(self._copies) if order is None else self._rows_at(order)
        if self.named:
            rows = ([row.get(name) for name in columns] for row in rows)
        return rows

    def _rows_at(self, order: np.ndarray) -> Iterator:
        """The rows in ``order`` (their places in the copies), one at a time."""
        assert self._copies is not None
        for at in order:  # (not as a list: 36 bytes a row)
            self._copies.seek(self._copy_places[int(at)])
            yield from pickle.load(self._copies)

    def __len__(self) -> int:
        return self.count

    def table(self, columns: list[str], by_key: bool = False) -> PartTable:  # type: ignore[override]
        order = None
        if by_key:
            keys = np.frombuffer(self._sort_keys, dtype=np.float64)
            present = np.flatnonzero(~np.isnan(keys))
            order = np.concatenate([present[np.argsort(-keys[present], kind="stable")], np.flatnonzero(np.isnan(keys))])
        return PartTable(columns, self, order)

    def write(self, out: io.TextIOWrapper, columns: list[str], order: np.ndarray | None) -> None:
        """Copy the rows to ``out`` (in ``order``, the lines' places, if given), named columns laid out."""
        self._flush()
        if self._text is None or self._file is None:
            return
        self._text.flush()
        if not self.named and order is None:
            out.flush()
            self._file.seek(0)
            shutil.copyfileobj(self._file, out.buffer)
            return
        if order is None:
            self._text.seek(0)
            lines: Iterator[list[str]] = csv.reader(self._text)
        else:
            lines = (next(csv.reader(io.StringIO(self._line_at(int(at)).decode(), newline=""))) for at in order)
        if not self.named:
            csv.writer(out, lineterminator="\n").writerows(lines)
            return
        names = list(self._names)
        places: dict[str, list[int]] = {}  # a number of names -> per column the place of its value in the line
        for line in lines:
            index = places.get(line[0])
            if index is None:
                given = names[int(line[0])]
                at = {name: place for place, name in enumerate(given, 1)}
                index = places[line[0]] = [at.get(name, len(given) + 1) for name in columns]
            line.append("")  # (a column the row has not)
            _write_cells(out, [line[place] for place in index])

    def _line_at(self, at: int) -> bytes:
        assert self._file is not None
        self._file.seek(0, os.SEEK_END)
        end = self._offsets[at + 1] if at + 1 < len(self._offsets) else self._file.tell()
        self._file.seek(self._offsets[at])
        return self._file.read(end - self._offsets[at])

    def close(self) -> None:
        if self._text is not None:
            self._text.close()  # (and its file)
            self._text = self._file = None
        if self._copies is not None:
            self._copies.close()
            self._copies = None


class PartTable:
    """A table whose rows are in a :class:`RowPart`: its columns, its length, its rows read back when few."""

    def __init__(self, columns: list[str], part: RowPart, order: np.ndarray | None) -> None:
        self.columns, self.part, self.order = columns, part, order

    def __len__(self) -> int:
        return self.part.count

    def each_row(self) -> Iterator[list] | None:
        """The rows, read back one at a time (None: more than its part keeps the types of)."""
        return self.part.each_row(self.columns, self.order)

    @property
    def rows(self) -> list[list] | None:
        found = self.each_row()
        return None if found is None else list(found)

    def write(self, raw: BinaryIO) -> None:
        """The CSV: header, then every row."""
        out = io.TextIOWrapper(raw, encoding="utf-8", newline="")
        try:
            csv.writer(out, lineterminator="\n").writerow(self.columns)
            self.part.write(out, self.columns, self.order)
            out.flush()
        finally:
            out.detach()  # (the stream is its owner's to close)


def _blocks(copies: BinaryIO) -> Iterator:
    """The rows pickled a block at a time into ``copies``, one at a time."""
    copies.seek(0)
    while True:
        try:
            block = pickle.load(copies)
        except EOFError:
            return
        yield from block


def _write_cells(out: io.TextIOWrapper, cells: list[str], chunk: int = 256) -> None:
    """One CSV row as the csv module writes it, formatted ``chunk`` cells at a time (a writer holds its row's
    text four times over: an all_to_allv's row over 1,024 ranks is megabytes)."""
    for first in range(0, len(cells), chunk):
        piece = cells[first:first + chunk]
        if first:
            out.write(",")
        if piece != [""]:  # (a row of one empty cell is written '""': here it is an empty cell)
            text = io.StringIO()
            csv.writer(text, lineterminator="\n").writerow(piece)
            out.write(text.getvalue()[:-1])
    out.write("\n")
