"""Rank facts that a trace states outright (pure functions)."""
from __future__ import annotations

import re

_RANK_IN_NAME = re.compile(r"\brank\s*[:#]?\s*(\d+)", re.IGNORECASE)


def rank_from_process_name(name: object) -> int | None:
    """The rank a merged trace's process name states (``RANK 3 - GPU``, ``rank 3``)."""
    if not isinstance(name, str):
        return None
    match = _RANK_IN_NAME.search(name)
    return int(match.group(1)) if match else None


def rank_from_args(args: object) -> int | None:
    """``args.rank`` when it is a plain non-negative integer."""
    if isinstance(args, dict):
        rank = args.get("rank")
        if type(rank) is int and rank >= 0:
            return rank
    return None
