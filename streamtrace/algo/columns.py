"""Columns of decoded JSON values (a member of each event of a chunk) as
typed arrays, read as the event-by-event visits read them one at a time (pure)."""
from __future__ import annotations

import numpy as np

PLAIN_NUMBERS = frozenset({int, float})  # what a projection decodes numbers into (not bool)


def as_floats(values: list, missing: float) -> np.ndarray:
    """Numbers as float64 (an integer rounded as ``float()`` rounds it),
    anything else (absent, text, a bool) as ``missing``."""
    if set(map(type, values)) <= PLAIN_NUMBERS:
        return np.array(values, np.float64)
    return np.array([value if value.__class__ in PLAIN_NUMBERS else missing for value in values], np.float64)
