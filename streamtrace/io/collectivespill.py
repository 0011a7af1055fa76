"""The collective report beyond memory: the ranks' kernel records and the rows of its long tables (a row
per kernel or per collective) go to temporary files, so that ``analyze`` holds, whatever the size and
number of its inputs, a budget of records and the collective being matched."""
from __future__ import annotations

import csv
import io
import math
import os
import shutil
import tempfile
from array import array
from typing import BinaryIO, Iterator

import numpy as np

from ..algo.collectives import KERNEL, Rows, missing
from .scratch import spool_writes

SPILL_BYTES = 64 << 20
"""Kernel records (32 bytes each) kept in memory; beyond, all of them go to one file (tests lower it)."""


PENDING_ROWS = 512  # plain rows formatted and written together


class SpilledKernels:
    """Every rank's kernel records (:class:`~streamtrace.algo.collectives.KernelStore`): in memory up to
    :data:`SPILL_BYTES`, else in one temporary file (one handle whatever the number of ranks), read back
    as a memory map: the matching reads a rank's block and each collective's kernels, the page cache the rest."""

    def __init__(self, directory: str | None = None, budget: int | None = None, dtype: np.dtype = KERNEL) -> None:
        self.directory = directory
        self.budget = SPILL_BYTES if budget is None else budget
        self.dtype = dtype  # (other records than kernels': the all_to_allv summary's)
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
            return np.concatenate(self._parts) if self._parts else np.empty(0, self.dtype)
        self._file.flush()
        return np.memmap(self._file, dtype=self.dtype, mode="r", shape=(self._size,))

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        self._parts = []


def _raw(records: np.ndarray) -> memoryview:
    """The records' bytes as they are in memory (no copy: a rank's records may be hundreds of MB)."""
    return memoryview(np.ascontiguousarray(records)).cast("B")


class RowPart(Rows):
    """A table's rows written to a temporary file as they are made, as CSV lines (a row of named columns a
    line per column, name and value, laid out when the columns are known); while there are at most
    ``keep``, each cell's type too (a letter a cell, in a second file), so that the summary's rows are read
    back, values and types as made, from the files at the end (:meth:`each_row`): none is held meanwhile.
    A sorted table keeps its sort key and each row's place (16 bytes a row).  No row's whole text is made
    at once (an all_to_allv's row over 1,024 ranks, every rank's splits, is megabytes)."""

    def __init__(self, directory: str | None, keep: int) -> None:
        super().__init__()
        self.directory, self.keep = directory, keep
        self.count = 0
        self.named = False  # rows made as dicts
        self.typed = True  # the cells' types are written (at most ``keep`` rows)
        self._types: BinaryIO | None = None
        self._codes = bytearray()  # type letters not yet written, a line a row
        self._objects: list = []  # cells that are neither numbers nor texts (args Kineto wrote as lists: shared)
        self._kinds: dict[tuple, bytes] = {}  # a row's cells' classes -> its line of type letters
        self._file: BinaryIO | None = None
        self._text: io.TextIOWrapper | None = None
        self._sort_keys = array("d")
        self._offsets = array("q")
        self._pending: list[list] = []  # plain rows not yet written (written a batch at a time)

    def _flush(self) -> None:
        if self._pending:
            batch = io.StringIO()
            csv.writer(batch, lineterminator="\n").writerows(self._pending)
            self._pending = []
            with spool_writes(self.directory or tempfile.gettempdir()):
                self._text.write(batch.getvalue())  # type: ignore[union-attr]

    def add(self, row: list | dict, key: object = None) -> None:
        self.named = isinstance(row, dict)
        if self.named:  # (value == value: all but NaN, written as an empty cell as None is)
            cells = [cell for name, value in row.items() for cell in (name, value if value == value else "")]  # type: ignore
        else:
            cells = [value if value == value else "" for value in row]  # type: ignore[union-attr]
        with spool_writes(self.directory or tempfile.gettempdir()):
            if self._text is None:
                self._file = tempfile.TemporaryFile(prefix="streamtrace-table-", dir=self.directory)
                self._text = io.TextIOWrapper(self._file, encoding="utf-8", newline="", write_through=True)
                self._writer = csv.writer(self._text, lineterminator="\n")
            if not self.named and key is None:
                self._pending.append(cells)
                if len(self._pending) >= PENDING_ROWS:
                    self._flush()
            else:
                self._flush()
                if key is not None:
                    self._sort_keys.append(math.nan if missing(key) else key)  # type: ignore[arg-type]
                    self._offsets.append(self._file.tell())  # type: ignore[union-attr]
                if self.named:  # a line per column, an empty line after the row
                    self._writer.writerows(zip(cells[::2], cells[1::2]))
                    self._writer.writerow([])
                else:
                    self._writer.writerow(cells)
        self.count += 1
        if self.typed:
            if self.count > self.keep:
                self.typed, self._codes, self._objects = False, bytearray(), []
                if self._types is not None:
                    self._types.close()
                    self._types = None
            else:
                values = list(row.values()) if self.named else row  # type: ignore[union-attr]
                kinds = tuple(map(type, values))
                codes = self._kinds.get(kinds)
                if codes is None:
                    codes = self._kinds[kinds] = "".join([_code(kind) for kind in kinds]).encode() + b"\n"
                if _OBJECT in codes:
                    self._objects.extend(value for value, code in zip(values, codes) if code == _OBJECT)
                self._codes += codes
                if len(self._codes) >= TYPE_BYTES:
                    self._write_codes()

    def _write_codes(self) -> None:
        with spool_writes(self.directory or tempfile.gettempdir()):
            if self._types is None:
                self._types = tempfile.TemporaryFile(prefix="streamtrace-types-", dir=self.directory)
            self._types.write(self._codes)
        self._codes = bytearray()

    def each_row(self, columns: list[str], order: np.ndarray | None) -> Iterator[list] | None:
        """The rows as they were made (lists in ``columns``' order, in ``order`` if given), read back from the
        files; None when there are more than ``keep``."""
        if not self.typed:
            return None
        if self._text is None:
            return iter(())
        self._flush()
        self._text.flush()
        if self._types is not None:
            self._write_codes()
            self._types.seek(0)
        codes = self._types or io.BytesIO(bytes(self._codes))
        self._text.seek(0)
        lines = csv.reader(self._text)
        readers = _Readers(iter(self._objects))
        if self.named:
            rows = (_laid(values, readers[types], columns) for values, types in zip(_named_rows(lines), codes))
        else:
            rows = ([read(text) for read, text in zip(readers[types], cells)] for cells, types in zip(lines, codes))
        if order is None:
            return rows
        made = list(rows)
        return (made[at] for at in order.tolist())

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
        if self._text is None or self._file is None:
            return
        self._flush()
        self._text.flush()
        if not self.named and order is None:
            out.flush()
            self._file.seek(0)
            shutil.copyfileobj(self._file, out.buffer)
            return
        if not self.named:
            writer = csv.writer(out, lineterminator="\n")
            for at in order:  # type: ignore[union-attr]
                writer.writerows(csv.reader(io.StringIO(self._line_at(int(at)).decode(), newline="")))
            return
        if order is not None:
            rows = (_named_rows(csv.reader(io.StringIO(self._line_at(int(at)).decode(), newline=""))) for at in order)
            named = (row for found in rows for row in found)
        else:
            self._text.seek(0)
            named = _named_rows(csv.reader(self._text))
        for values in named:
            _write_cells(out, [values.get(name, "") for name in columns])

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
        if self._types is not None:
            self._types.close()
            self._types = None


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


TYPE_BYTES = 64 << 10  # type letters held (per table) before they are written
_OBJECT = ord("o")
_READ = {"i": int, "s": str, "b": lambda text: text == "True", "n": lambda text: None,
         "f": lambda text: float(text) if text else math.nan}  # (NaN is written as an empty cell, a float never)


def _code(kind: type) -> str:
    """A cell's type letter, by its class: ``o`` for an object kept as it is (no number, text or None)."""
    if issubclass(kind, bool):
        return "b"
    if issubclass(kind, (int, np.integer)):
        return "i"
    if issubclass(kind, (float, np.floating)):
        return "f"
    return "s" if issubclass(kind, str) else "n" if kind is type(None) else "o"


class _Readers(dict):
    """A line of type letters -> what reads each of its cells back (made once per distinct line)."""

    def __init__(self, objects: Iterator) -> None:
        super().__init__()
        self.objects = objects

    def __missing__(self, types: bytes) -> list:
        found = self[types] = [(lambda text: next(self.objects)) if code == _OBJECT else _READ[chr(code)]
                               for code in types.rstrip(b"\n")]
        return found


def _laid(values: dict[str, str], readers: list, columns: list[str]) -> list:
    """A row made as a dict (its cells read back, typed), in ``columns``' order (None where it has none)."""
    cells = dict(zip(values, [read(text) for read, text in zip(readers, values.values())]))
    return [cells.get(name) for name in columns]


def _named_rows(lines: Iterator[list[str]]) -> Iterator[dict[str, str]]:
    """Rows written a column a line (name, value), an empty line after each, as dicts."""
    values: dict[str, str] = {}
    for line in lines:
        if line:
            values[line[0]] = line[1]
        else:
            yield values
            values = {}


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
