"""``np.unique(values, return_index=True, return_inverse=True)`` made a block of rows at a time: the
same distinct values, first rows and inverse, with a block's temporary arrays rather than numpy's
several whole-column ones (its sort's copy, permutation, mask and running sums), so that grouping the
rows of a large trace holds one column of codes beside its input."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

BLOCK = 1 << 16  # rows per block


def unique_in_blocks(count: int, values_of: Callable[[int, int], np.ndarray],
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The distinct values of rows ``0..count-1`` (``values_of(lo, hi)``: the values of rows lo to hi),
    sorted; the first row of each; and each row's number into them (int64)."""
    inverse = np.empty(count, dtype=np.int64)
    distinct, firsts, numbered = [], [], 0
    for lo in range(0, count, BLOCK):
        hi = min(lo + BLOCK, count)
        values, first, local = np.unique(values_of(lo, hi), return_index=True, return_inverse=True)
        inverse[lo:hi] = local.reshape(-1) + numbered  # (numbered across blocks, then merged)
        numbered += len(values)
        distinct.append(values)
        firsts.append(first + lo)
    if not distinct:
        return np.unique(values_of(0, 0)), np.empty(0, np.int64), inverse
    values, merged = np.unique(np.concatenate(distinct), return_inverse=True)
    first = np.full(len(values), count, dtype=np.int64)
    np.minimum.at(first, merged.reshape(-1), np.concatenate(firsts))
    for lo in range(0, count, BLOCK):
        inverse[lo:lo + BLOCK] = merged.reshape(-1)[inverse[lo:lo + BLOCK]]
    return values, first, inverse
