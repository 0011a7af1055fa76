"""HTA's idle time breakdown: per stream, idle time by its cause (host wait, kernel wait, other).

Reads: the kept kernels, copies and sets in start order through the shared
sweep (stream, start, end, the start of the launch that issued each: HTA's
rules), and the first row of each stream in event order.
Keeps per rank: per stream, three idle totals and where it first appears.
Combines: the ranks' rows one after the other (by rank).
Tables: idle_time_breakdown.
"""
from __future__ import annotations

import math

import numpy as np

from ...algo import analysis as hta
from ...algo import sweeps
from .spec import Analysis, ChunkView, RankContext, Swept


class IdlePart:
    def __init__(self, context: RankContext) -> None:
        self.rank = context.rank
        self.first_seen: dict[int, int] = {}  # stream -> position of its first kernel, copy or set

    def feed(self, view: ChunkView) -> None:
        rows, idle = view.rows, view.idle
        for stream, at in zip(*np.unique(rows.stream[idle], return_index=True)):
            self.first_seen.setdefault(int(stream), int(rows.pos[idle][at]))

    def finish(self, swept: Swept) -> list[dict]:
        assert swept.stream_idle is not None  # (declared: the sweep feeds it)
        return _idle_rows(self.rank, swept.stream_idle, self.first_seen)

    def close(self) -> None:
        pass


def _idle_rows(rank: int, stream_idle: sweeps.StreamIdle, first_seen: dict[int, int]) -> list[dict]:
    """HTA's idle time breakdown of every stream (streams in the order they first appear).  A kernel's launch
    time is its launch's; a kernel with no launch in the trace gets, as in HTA (whose index 0 stands for
    "not in the trace"), the time of the file's first row."""
    out = []
    for stream in sorted(first_seen, key=first_seen.__getitem__):
        found = stream_idle.breakdown(stream)
        total = sum(idle for _, idle in found)
        for kind, idle in found:
            ratio = idle / total if total else math.nan
            out.append({"rank": rank, "stream": stream, "idle_category": hta.IDLE_CATEGORIES[kind],
                        "idle_time": round(idle, 2), "idle_time_ratio": round(ratio, 2)})
    return out


ANALYSIS = Analysis(
    name="idle",
    tables={"idle_time_breakdown": ("rank", "stream", "idle_category", "idle_time", "idle_time_ratio")},
    part=IdlePart,
    combine=lambda run: {"idle_time_breakdown": [row for rows in run.results("idle") for row in rows]},
    sweeps=frozenset({"idle"}),
)
