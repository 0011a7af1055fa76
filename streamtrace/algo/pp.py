"""Pipeline-parallel action names (pure functions).

``torch.distributed.pipelining`` names each scheduled action
``PP:<stage><op><microbatch>`` (``PP:1RECV_F0``, ``PP:0UNSHARD``), fused
actions ``PP:(0F1;1B0)OVERLAP_F_B``; GPipe-style code uses ``Forward 3`` /
``Backward 3``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

PP_OPS = ("F", "B", "I", "W", "SEND_F", "RECV_F", "SEND_B", "RECV_B", "UNSHARD", "RESHARD", "REDUCE_GRAD")
COMPUTE_OPS = frozenset({"F", "B", "I", "W"})
_OPS = "|".join(sorted(PP_OPS, key=len, reverse=True))
_SIMPLE = re.compile(rf"(\d+)({_OPS})(\d*)")
_FUSED = re.compile(r"PP:\((.+)\)([A-Z_]+)")
_GPIPE = re.compile(r"(Forward|Backward) (\d+)")


@dataclass(frozen=True)
class PPAction:
    """One scheduled action: stage, op and microbatch (None for UNSHARD etc.)."""

    stage: int | None
    op: str
    microbatch: int | None


@lru_cache(maxsize=1 << 12)
def parse_pp_name(name: str) -> tuple[PPAction, ...]:
    """The actions a record_function name stands for; empty if it is not one.
    Cached: a run repeats a few hundred names per rank millions of times."""
    if name.startswith("PP:"):
        if name.startswith("PP:("):
            fused = _FUSED.fullmatch(name)
            if fused is None:
                return ()
            parts = tuple(_simple(part.strip()) for part in fused.group(1).split(";"))
            return () if None in parts else parts  # type: ignore[return-value]
        action = _simple(name[3:])
        return (action,) if action is not None else ()
    if name.startswith(("Forward ", "Backward ")):
        gpipe = _GPIPE.fullmatch(name)
        if gpipe is not None:
            return (PPAction(None, "F" if gpipe.group(1) == "Forward" else "B", int(gpipe.group(2))),)
    return ()


def _simple(text: str) -> PPAction | None:
    match = _SIMPLE.fullmatch(text)
    if match is None:
        return None
    stage, op, microbatch = match.groups()
    if op in ("UNSHARD", "RESHARD", "REDUCE_GRAD"):
        if microbatch:
            return None
        return PPAction(int(stage), op, None)
    if not microbatch:
        return None
    return PPAction(int(stage), op, int(microbatch))


def pp_stage_from_info(info: object, rank: int) -> int | None:
    """A rank's PP stage from Kineto's ``distributedInfo``: its place in the
    process group whose description names the pipeline dimension (torchtitan's
    ``mesh_pp``), whose ranks are listed in stage order; None if none says."""
    groups = info.get("pg_config") if isinstance(info, dict) else None
    for group in groups if isinstance(groups, list) else ():
        if not isinstance(group, dict) or not isinstance(group.get("ranks"), list):
            continue
        words = re.split(r"[^a-z]+", f"{group.get('pg_desc', '')} {group.get('pg_name', '')}".lower())
        if "pp" in words and rank in group["ranks"]:
            return group["ranks"].index(rank)
    return None
