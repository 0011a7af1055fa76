"""Stragglers: HTA's straggler candidates, and per step each rank's lag behind the fastest.

Reads: the kept rows with their HTA iteration (start, end: each step's
extent), the kept communication kernels in a step (HTA's COMMUNICATION
type: ``ncclKernel*`` and NCCL 2.19+'s ``ncclDevKernel*``; stream, step,
name, start, duration); the steps' spans of :mod:`.steps` (which it needs).
Keeps per rank: each step's extent; per (stream, step, name) only the
kernels no later one outlasts or equals (whatever HTA's threshold, the last
kernel that passes it is one of them).
Combines: HTA's ``find_stragglers_with_late_start_comm_kernels`` over every
rank (the most variable communication kernel, its normalized late starts,
the ``num_candidates`` ranks most often late): once over the ``ncclKernel*``
names HTA looks at, once over every communication kernel; each step's lag
from the steps' durations.
Tables: stragglers (HTA's), stragglers_nccl_all (the same rule seeing ``ncclDevKernel*`` too).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ...algo import analysis as hta
from .ranks import Chunk, merge_extents, step_extents
from .spec import Analysis, ChunkView, RankContext, Run, Swept
from .steps import profiler_steps

COMM_PREFIX = "ncclKernel"  # HTA's straggler analysis looks at these names only (not NCCL 2.19+'s ncclDevKernel)
MIN_NORMALIZED_DURATION = 0.01


@dataclass
class StragglerResult:
    """A rank's step extents and its communication kernels that HTA's metric may pick."""

    step_extent: dict  # step -> (first start, last end) of the rows in it (HTA's iteration)
    comm_candidates: dict  # (stream, step, name) -> [(ts, dur)] in file order, suffix maxima of dur


class StragglerPart:
    def __init__(self, context: RankContext) -> None:
        self.context = context
        self.comm_names = np.array([at for at, name in enumerate(context.strings) if _communication(name)],
                                   dtype=np.int32)
        self.extents: dict = {}
        self.comm: dict[tuple, list[tuple[float, float]]] = {}

    def feed(self, view: ChunkView) -> None:
        chunk, keep, iteration = view.chunk, view.keep, view.iteration
        merge_extents(self.extents, step_extents(chunk.ts[keep], chunk.ts[keep] + chunk.dur[keep], iteration[keep]))
        _add_comm_candidates(self.comm, chunk, keep & (chunk.stream > 0) & (iteration > 0) & np.isin(chunk.name, self.comm_names),
                             iteration, self.context.strings)

    def finish(self, swept: Swept) -> StragglerResult:
        merge_extents(self.extents, self.context.plain.extents)
        return StragglerResult(self.extents, self.comm)

    def close(self) -> None:
        pass


def _communication(name: str) -> bool:
    """A kernel HTA types COMMUNICATION (``^nccl.*Kernel``): the corrected mode's kernels, HTA's among them."""
    return hta.kernel_type(name) == hta.COMMUNICATION


def _hta_sees(name: str) -> bool:
    """A kernel HTA's straggler analysis looks at."""
    return name.startswith(COMM_PREFIX)


def _add_comm_candidates(groups: dict, chunk: Chunk, rows: np.ndarray, iteration: np.ndarray, strings: list[str]) -> None:
    """Communication kernels HTA's straggler metric may pick, per (stream, step, name), file order: only
    those no later one of the group outlasts or equals (whatever the threshold, the last that passes is one)."""
    at = np.flatnonzero(rows)
    for stream, step, name, ts, dur in zip(chunk.stream[at].tolist(), iteration[at].tolist(), chunk.name[at].tolist(),
                                           chunk.ts[at].tolist(), chunk.dur[at].tolist()):
        kept = groups.setdefault((stream, step, strings[name]), [])
        while kept and kept[-1][1] <= dur:
            kept.pop()
        kept.append((ts, dur))


def _combine(run: Run) -> dict[str, list[dict]]:
    """HTA's straggler candidates (late starts of the most variable communication kernel), and per step
    each rank's lag behind the fastest: as HTA finds them (``ncclKernel*`` only) and over every
    communication kernel (``stragglers_nccl_all``)."""
    ranks = [r.rank for r in run.ranks]
    spans = [result.spans for result in run.results("steps")]
    results = list(zip(ranks, run.results("stragglers")))
    steps = profiler_steps(run)
    durations: dict[int, dict[int, float]] = {}
    for rank, rank_steps in zip(ranks, spans):
        for step, _, duration in rank_steps:
            durations.setdefault(step, {})[rank] = duration
    tables = {}
    for table, sees in (("stragglers", _hta_sees), ("stragglers_nccl_all", _communication)):
        metric, candidates = _straggler_metric(results, steps, run.num_candidates, sees)
        rows = []
        for rank, rank_steps in zip(ranks, spans):
            for step, _, duration in rank_steps:
                value = metric.get((rank, step))
                late = value is not None and value >= metric.get(("threshold", step), math.inf)
                rows.append({"rank": rank, "step": step, "lag(us)": duration - min(durations[step].values()),
                             "normalized_start_time": value, "late": late, "potential_straggler": rank in candidates})
        tables[table] = rows
    return tables


def _straggler_metric(results: list[tuple[int, StragglerResult]], steps: list[int], num_candidates: int,
                      sees: Callable[[str], bool]) -> tuple[dict, list[int]]:
    """HTA's ``find_stragglers_with_late_start_comm_kernels``, on the per-rank facts, over the
    communication kernels whose names ``sees``."""
    valid = set(steps)
    extents = [extent for _, r in results for step, extent in r.step_extent.items() if step in valid]
    present = {step for _, r in results for step in r.step_extent if step in valid}
    if not extents or not present:
        return {}, []
    t_min = min(first for first, _ in extents)
    mean_iter = (max(last for _, last in extents) - t_min) / len(present)
    min_duration = mean_iter * MIN_NORMALIZED_DURATION
    last: dict[tuple, dict[int, tuple[float, float]]] = {}  # (stream, step, name) -> rank -> (ts, dur)
    for rank, r in results:
        for (stream, step, name), kernels in r.comm_candidates.items():
            if step not in valid or not sees(name):
                continue
            passing = [kernel for kernel in kernels if kernel[1] >= min_duration]
            if passing:
                last.setdefault((stream, step, name), {})[rank] = passing[-1]
    if not last or not mean_iter:
        return {}, []
    spread: dict[tuple, list[float]] = {}
    for (stream, _step, name), per_rank in sorted(last.items()):
        values = np.array([dur / mean_iter for _, dur in per_rank.values()])
        if len(values) > 1:
            spread.setdefault((stream, name), []).append(float(values.std(ddof=1)))
    if not spread:
        return {}, []
    chosen = max(sorted(spread), key=lambda key: float(np.mean(spread[key])))
    metric: dict = {}
    for (stream, step, name), per_rank in last.items():
        if (stream, name) == chosen:
            for rank, (ts, _) in per_rank.items():
                metric[(rank, step)] = (ts - t_min) / mean_iter
    by_step: dict[int, dict[int, float]] = {}
    for (rank, step), value in metric.items():
        by_step.setdefault(step, {})[rank] = value
    counts: dict[int, int] = {}
    for step, per_rank in by_step.items():
        late = hta.late_ranks(per_rank, num_candidates)
        values = sorted(per_rank.values(), reverse=True)
        metric[("threshold", step)] = values[min(num_candidates, len(values)) - 1]
        for rank in per_rank:
            counts[rank] = counts.get(rank, 0) + (rank in late)
    return metric, hta.top_candidates(counts, num_candidates)


ANALYSIS = Analysis(
    name="stragglers",
    tables={name: ("rank", "step", "lag(us)", "normalized_start_time", "late", "potential_straggler")
            for name in ("stragglers", "stragglers_nccl_all")},
    part=StragglerPart,
    combine=_combine,
    needs=("steps",),
)
