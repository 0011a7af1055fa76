"""A chunk's ``ts`` and ``dur`` fields read once in analyze's pass 1, for its index and for ``--ops``'s
collection alike: as decoded (whether a value is an int matters to the ops tables) and as float64
(NaN: absent), so that both take their rows' times by position rather than an event at a time."""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

PLAIN_TIMES = {int, float, type(None)}


class Times(NamedTuple):
    """Each event's ts and dur: as decoded, the types found in each, and as float64."""

    ts: list
    dur: list
    ts_kinds: set
    dur_kinds: set
    ts_float: np.ndarray
    dur_float: np.ndarray


def times_of(ts: list, dur: list) -> Times | None:
    """The times of ``ts`` and ``dur`` (ints, floats or None); None where some value is of another type."""
    ts_kinds, dur_kinds = set(map(type, ts)), set(map(type, dur))
    if not ts_kinds <= PLAIN_TIMES or not dur_kinds <= PLAIN_TIMES:
        return None
    return Times(ts, dur, ts_kinds, dur_kinds, np.array(ts, dtype=np.float64), np.array(dur, dtype=np.float64))


def chunk_times(events: list) -> Times | None:
    """The times of a chunk's projected events (see :func:`times_of`; list comprehensions read a
    Struct's members in half the time ``map(attrgetter(...))`` takes)."""
    return times_of([event.ts for event in events], [event.dur for event in events])
