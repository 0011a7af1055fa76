"""Columns of decoded JSON values (a member of each event of a chunk) as
typed arrays, read as the event-by-event visits read them one at a time,
and the gathering of many slices of such arrays at once (pure)."""
from __future__ import annotations

from itertools import compress, repeat
from operator import attrgetter, is_not

import numpy as np

from .ranks import plain_rank

PLAIN_NUMBERS = frozenset({int, float})  # what a projection decodes numbers into (not bool)
_NUMBERS_OR_NONE = PLAIN_NUMBERS | {type(None)}


def as_floats(values: list, missing: float) -> np.ndarray:
    """Numbers as float64 (an integer rounded as ``float()`` rounds it),
    anything else (absent, text, a bool) as ``missing``."""
    kinds = set(map(type, values))
    if kinds <= PLAIN_NUMBERS:
        return np.array(values, np.float64)
    if kinds <= _NUMBERS_OR_NONE:  # numpy reads None as NaN, which no decoded JSON number is
        column = np.array(values, np.float64)
        if missing == missing:
            column[np.isnan(column)] = missing
        return column
    return np.array([value if value.__class__ in PLAIN_NUMBERS else missing for value in values], np.float64)


def plain_ints_below(values: list, stop: int) -> bool:
    """Are all ``values`` plain integers (not bools) in [0, ``stop``)?  In C-level passes:
    the test that lets a column of ids skip the per-value reading."""
    return set(map(type, values)) <= _INTEGER and (not values or (min(values) >= 0 and max(values) < stop))


def rank_column(arguments: list, missing: int) -> np.ndarray:
    """Each event's ``args.rank`` when a plain rank (:func:`plain_rank`),
    else ``missing``, from the events' decoded ``args`` (None for none):
    C-level passes when no event names a rank, as most do not."""
    given = list(map(_RANK, compress(arguments, map(is_not, arguments, repeat(None)))))
    if given.count(None) == len(given):
        return np.full(len(arguments), missing, np.int64)
    return np.fromiter((missing if args is None or (rank := plain_rank(args.rank)) is None else rank
                        for args in arguments), np.int64, len(arguments))


_RANK = attrgetter("rank")
_INTEGER = frozenset({int})


def slice_positions(first: np.ndarray, count: np.ndarray) -> np.ndarray:
    """The positions ``first[i]:first[i] + count[i]`` of every slice, one slice's after another (to gather
    many slices of an array with one index)."""
    placed = np.cumsum(count) - count
    return (np.repeat(first - placed, count) + np.arange(int(count.sum()))).astype(np.int64, copy=False)


def in_sorted(values: np.ndarray, ordered: np.ndarray) -> np.ndarray:
    """``value in ordered`` for each of ``values`` (``ordered``: sorted): a binary search each, where
    ``np.isin`` would sort both again at every call."""
    if not len(ordered):
        return np.zeros(len(values), dtype=bool)
    return ordered[np.minimum(np.searchsorted(ordered, values), len(ordered) - 1)] == values
