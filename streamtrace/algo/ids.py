"""Rank-unique correlation and flow ids for merged traces.

Correlation ids restart in every rank's profiling session, and viewers match
flows by id alone, so commands that put several ranks in one file (merge,
relink) rewrite each id as ``(rank + 1) * multiplier + raw``: still readable
(the raw id is visible in the low digits), unique across ranks, and below
2^53 so JavaScript viewers read it exactly.
"""
from __future__ import annotations

import numpy as np

MAX_SAFE_ID = 2**53 - 1
MIN_MULTIPLIER = 10**9


def id_multiplier(max_raw_id: int) -> int:
    """The smallest power of ten (at least 10^9) above every raw id."""
    multiplier = MIN_MULTIPLIER
    while multiplier <= max_raw_id:
        multiplier *= 10
    return multiplier


def rank_unique_id(rank: int, raw_id: int, multiplier: int) -> int:
    return (rank + 1) * multiplier + raw_id


def check_id_space(max_rank: int, multiplier: int) -> str | None:
    """Why rank-unique ids would not fit below 2^53, or None when they do."""
    largest = rank_unique_id(max_rank, multiplier - 1, multiplier)
    if largest > MAX_SAFE_ID:
        return (
            f"rank-unique ids for rank {max_rank} with raw ids up to {multiplier - 1} "
            f"would exceed 2^53"
        )
    return None


def existing_multiplier(ids: np.ndarray, ranks: np.ndarray) -> int | None:
    """The multiplier under which every id of a known rank (``ranks >= 0``)
    already has its rank-unique form (a file that ``merge`` or ``relink``
    wrote), or None when there is none or no id has a known rank.

    ``(rank + 1) * M + raw`` with ``raw < M`` is exactly ``id // M == rank + 1``;
    at most one power of ten satisfies that for a given id.
    """
    known = ranks >= 0
    if not known.any():
        return None
    ids, owners = ids[known], ranks[known].astype(np.int64) + 1
    multiplier = MIN_MULTIPLIER
    while multiplier <= MAX_SAFE_ID:
        if np.array_equal(ids // multiplier, owners):
            return multiplier
        multiplier *= 10
    return None
