"""pandas' groupby aggregates and sorts, computed over a column's values as they come, so that a summary
holds a few numbers per group (the median and pandas' pairwise sums keep the column, 8 bytes a value)
instead of the rows it summarizes (the collective report's, :mod:`streamtrace.algo.collectives`)."""
from __future__ import annotations

import math
from array import array
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

import numpy as np


@dataclass
class Table:
    columns: list[str]
    rows: list[list]

    def column(self, name: str) -> list:
        at = self.columns.index(name)
        return [row[at] for row in self.rows]


def missing(value: object) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def descending_order(keys: Sequence) -> list[int]:
    """pandas' sort_values(ascending=False) on one column: ties keep their order, missing values last."""
    present = [at for at, key in enumerate(keys) if not missing(key)]
    present.sort(key=lambda at: -keys[at])
    return present + [at for at, key in enumerate(keys) if missing(key)]


class Sum:
    """A column of a group, aggregated as its values come, as pandas' groupby aggregates it (missing values
    left out): first, count, size, sum (compensated when a value is a float), mean."""

    def __init__(self) -> None:
        self.size = self.count = 0
        self.first: object = None
        self.total = self.compensation = 0.0
        self.whole = 0  # the sum while every value is an int
        self.floats = False
        self.numbers = True  # every value so far is a number

    def add(self, value: object) -> bool:
        """Take a value; whether it is a number counted (what the other aggregates read)."""
        self.size += 1
        if value is None or value != value:  # (missing: None or NaN)
            return False
        if self.count == 0:
            self.first = value
        self.count += 1
        if not isinstance(value, (int, float)):
            self.numbers = False  # (a column only taken first or counted)
        if not self.numbers:
            return False
        y = value - self.compensation  # type: ignore[operator]
        t = self.total + y
        self.compensation = t - self.total - y
        self.total = t
        if isinstance(value, float):
            self.floats = True
        else:
            self.whole += value  # type: ignore[operator]
        return True

    def aggregate(self, how: str) -> object:
        if how == "size":
            return self.size
        if how == "first":
            return self.first
        if how == "count":
            return self.count
        if not self.count:
            return 0 if how == "sum" else math.nan
        if how == "sum":
            return self.total if self.floats else self.whole
        if how == "mean":
            return self.total / self.count
        raise ValueError(how)


class Running(Sum):
    """:class:`Sum`'s aggregates and std (n-1, Welford's), min, max (the first least or largest value, as it was)."""

    def __init__(self) -> None:
        super().__init__()
        self.mean = self.squares = 0.0
        self.low: object = None
        self.high: object = None

    def add(self, value: object) -> bool:
        if not super().add(value):
            return False
        if self.count == 1:
            self.low = self.high = value
        old = self.mean
        self.mean += (value - old) / self.count  # type: ignore[operator]
        self.squares += (value - self.mean) * (value - old)  # type: ignore[operator]
        if value < self.low:  # type: ignore[operator]
            self.low = value
        if value > self.high:  # type: ignore[operator]
            self.high = value
        return True

    def aggregate(self, how: str) -> object:
        if how in ("min", "max", "std") and self.count:
            if how == "std":
                return math.sqrt(self.squares / (self.count - 1)) if self.count > 1 else math.nan
            return self.low if how == "min" else self.high
        return super().aggregate(how)


class ValueColumn(Protocol):
    """Where a kept column's values go, in order: in memory (:class:`MemoryColumn`), or on disk beyond a
    budget shared by every column (analyze's, :mod:`streamtrace.io.valuespill`)."""

    spilled: bool  # some values are on disk: read them a window at a time

    def append(self, value: float) -> None:
        ...

    def __len__(self) -> int:
        ...

    def read(self, first: int, end: int) -> np.ndarray:
        """The values at places ``first`` to ``end`` (float64, NaN for a missing value)."""
        ...


class MemoryColumn(array):
    """A kept column's values in memory (8 bytes a value; an array of doubles, appended to at C speed)."""

    spilled = False

    def __new__(cls) -> MemoryColumn:
        return super().__new__(cls, "d")

    def read(self, first: int, end: int) -> np.ndarray:
        return np.frombuffer(self, dtype=np.float64)[first:end]


class Kept:
    """A column's values kept too (8 bytes a value, in memory or in a :class:`ValueColumn` on disk) for
    what needs them all: the median, and numpy's pairwise sum (pandas' Series.sum); mixed into :class:`Sum`
    or :class:`Running`."""

    def __init__(self, column: ValueColumn | None = None) -> None:
        super().__init__()
        self.values: ValueColumn = MemoryColumn() if column is None else column
        self.nan = False  # some value is a float (NaN too): Series.sum is numpy's

    def add(self, value: object) -> bool:
        self.values.append(math.nan if value is None else value)  # type: ignore[arg-type]
        self.nan = self.nan or isinstance(value, float)
        return super().add(value)  # type: ignore[misc]

    def aggregate(self, how: str) -> object:
        if how == "median":
            if self.values.spilled:
                return windowed_median(self.values)
            present = self.values.read(0, len(self.values))
            present = present[~np.isnan(present)]
            return float(np.median(present)) if len(present) else math.nan
        return super().aggregate(how)  # type: ignore[misc]

    def series_sum(self) -> object:
        """pandas' Series.sum: numpy's (pairwise) sum, missing values as 0, when a value is a float."""
        if not self.nan:
            return self.whole  # type: ignore[attr-defined]
        if self.values.spilled:
            return windowed_sum(self.values, 0, len(self.values))
        return np.nan_to_num(self.values.read(0, len(self.values)), nan=0.0).sum().item()


WINDOW = 1 << 16
"""Values read at once from a column on disk (512 KB)."""


def windowed_sum(column: ValueColumn, first: int, count: int, window: int = WINDOW) -> float:
    """numpy's pairwise sum of ``count`` values from ``first`` (NaN as 0), bit for bit, reading at most
    ``window`` (>= 128) at a time: numpy halves a run longer than 128 at a multiple of 8, so the halves
    of a long run are summed apart and added, and a window is a whole subtree (numpy's own sum of it)."""
    if count <= window:
        return np.nan_to_num(column.read(first, first + count), nan=0.0).sum().item()
    half = count // 2
    half -= half % 8
    return windowed_sum(column, first, half, window) + windowed_sum(column, first + half, count - half, window)


_DIGIT = 16  # bits of the sort key a pass of the median's selection settles


def windowed_median(column: ValueColumn, window: int = WINDOW) -> float:
    """np.median of a column's values but NaN, exact, reading ``window`` at a time: the middle value(s)
    found by their sort keys (a float's bits, ordered as the floats), 16 bits per pass over the column."""
    wanted: list[int] | None = None  # the middle places among the values present
    prefixes = [0, 0]
    for shift in range(64 - _DIGIT, -1, -_DIGIT):
        counts = [np.zeros(1 << _DIGIT, np.int64), np.zeros(1 << _DIGIT, np.int64)]
        for first in range(0, len(column), window):
            keys = _sort_keys(column.read(first, min(first + window, len(column))))
            for which in (0, 1):
                found = keys if shift == 64 - _DIGIT else keys[(keys >> np.uint64(shift + _DIGIT)) == prefixes[which]]
                counts[which] += np.bincount(((found >> np.uint64(shift)) & np.uint64((1 << _DIGIT) - 1)).astype(np.int64),
                                             minlength=1 << _DIGIT)
        if wanted is None:
            present = int(counts[0].sum())
            if not present:
                return math.nan
            wanted = [(present - 1) // 2, present // 2]
        for which in (0, 1):
            below = np.cumsum(counts[which])
            digit = int(np.searchsorted(below, wanted[which], side="right"))
            wanted[which] -= int(below[digit - 1]) if digit else 0
            prefixes[which] = (prefixes[which] << _DIGIT) | digit
    low, high = (_from_sort_key(prefix) for prefix in prefixes)
    return low if low == high else float(np.mean(np.array([low, high])))


_SIGN = np.uint64(1 << 63)


def _sort_keys(values: np.ndarray) -> np.ndarray:
    """Unsigned keys ordered as the (non-NaN) floats are: negatives' bits flipped, the sign bit set on the rest."""
    bits = values[~np.isnan(values)].view(np.uint64)
    return np.where(bits & _SIGN, ~bits, bits | _SIGN)


def _from_sort_key(key: int) -> float:
    bits = np.uint64(key)
    return float(np.array([(bits & ~_SIGN) if bits & _SIGN else ~bits], dtype=np.uint64).view(np.float64)[0])


class Values(Kept, Running):
    """A column of a summary's group: its values kept, every aggregate."""


class Column(Kept, Sum):
    """A column kept for its pairwise sum and count."""


def sorted_groups(groups: dict) -> list[tuple]:
    """pandas' groupby order: groups sorted by their keys (keys of several types: as they came)."""
    try:
        return sorted(groups.items(), key=lambda item: item[0])
    except TypeError:
        return list(groups.items())


def grouped(groups: dict, keys: Sequence[str], plan: list[tuple[str, str, str]]) -> Table:
    """A summary's rows: per group (sorted by key), ``plan``'s (source column, aggregate, output column)."""
    rows = [[*key, *(columns[name].aggregate(how) for name, how, _ in plan)] for key, columns in sorted_groups(groups)]
    return Table([*keys, *(output for _, _, output in plan)], rows)


def by_descending(table: Table, column: str) -> Table:
    at = table.columns.index(column)
    return Table(table.columns, [table.rows[n] for n in descending_order([row[at] for row in table.rows])])


def add_to(groups: dict, key: tuple, plan: list[tuple[str, str, str]], row: dict, kept: Sequence[str] = (),
           column: Callable[[], ValueColumn] = MemoryColumn) -> None:
    """A row into its group's columns (``kept``: columns whose values are kept, where ``column`` puts them)."""
    columns = groups.get(key)
    if columns is None:
        columns = groups[key] = {name: Values(column()) if name in kept else Running() for name, _, _ in plan}
    for name in columns:
        columns[name].add(row[name])


def by_ascending(table: Table, column: str) -> Table:
    at = table.columns.index(column)
    present = sorted((row for row in table.rows if not missing(row[at])), key=lambda row: row[at])
    return Table(table.columns, present + [row for row in table.rows if missing(row[at])])
