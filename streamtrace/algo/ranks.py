"""Rank facts that a trace states outright (pure functions)."""
from __future__ import annotations

import re

_RANK_IN_NAME = re.compile(r"\brank\s*[:#]?\s*(\d+)", re.IGNORECASE)
_GLOBAL_RANK_IN_NAME = re.compile(r"\bglobal\s+rank\s*[:#]?\s*(\d+)", re.IGNORECASE)
_RANK_IN_FILE_NAME = re.compile(r"(?:rank|worker)[_-]?(\d+)", re.IGNORECASE)
PP_GROUP_NAMES = ("torchtitan_real_pp",)
PP_GROUP_DESCS = ("mesh_pp",)


def rank_from_process_name(name: object) -> int | None:
    """The rank a merged trace's process name states (``RANK 3 - GPU``, ``rank 3``); the global rank
    where the name gives it beside a PP rank (``PP rank 1 (global rank 3) | GPU``, as ``merge`` names)."""
    if not isinstance(name, str):
        return None
    match = _GLOBAL_RANK_IN_NAME.search(name) or _RANK_IN_NAME.search(name)
    return plain_rank(int(match.group(1))) if match else None


def rank_from_args(args: object) -> int | None:
    """``args.rank`` when it is a plain non-negative integer."""
    return plain_rank(args.get("rank")) if isinstance(args, dict) else None


def plain_rank(rank: object) -> int | None:
    """``rank`` when it is a plain non-negative integer (not a bool, not a
    float) below :data:`RANK_LIMIT`; a larger one is no rank a job can have."""
    return rank if type(rank) is int and 0 <= rank < RANK_LIMIT else None


RANK_LIMIT = 1 << 30  # ranks are kept in 32-bit arrays, split's as -2 - rank


def rank_from_file_name(path: str) -> int | None:
    """The global rank a file name states (``rank3_trace.json``, ``host_rank-3.pt.trace.json``,
    ``worker3_step_12.pt.trace.json``)."""
    name = path.replace("\\", "/").rsplit("/", 1)[-1]
    match = _RANK_IN_FILE_NAME.search(name)
    return int(match.group(1)) if match else None


def pp_group_ranks(info: object) -> list[int] | None:
    """The ``ranks`` of the pipeline process group in a ``distributedInfo`` (SPEC 2)."""
    if not isinstance(info, dict):
        return None
    for group in info.get("pg_config") or []:
        if isinstance(group, dict) and (group.get("pg_name") in PP_GROUP_NAMES or group.get("pg_desc") in PP_GROUP_DESCS):
            ranks = group.get("ranks")
            if isinstance(ranks, list) and all(type(rank) is int for rank in ranks):
                return ranks
    return None
