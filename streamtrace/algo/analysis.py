"""HTA's analyses (Holistic Trace Analysis 0.5.0) over typed arrays (pure).

Each function takes one rank's GPU rows (numpy arrays of start, duration,
stream, type, name id) or small per-rank facts, and returns what HTA's
table holds for it: the same columns, the same rules (kernel types by name,
interval unions, HTA's grouping of small kernels into ``others``, its
rounding).  Where HTA's rule is undefined (it asserts, divides by zero or
indexes an empty frame) these return a defined value: docs/analyze.md lists
those rules.
"""
from __future__ import annotations

import heapq
import math
import re
from dataclasses import dataclass

import numpy as np

COMMUNICATION, MEMORY, COMPUTATION, OTHER = range(4)
TYPE_NAMES = ("COMMUNICATION", "MEMORY", "COMPUTATION", "OTHER")
_COMM = re.compile(r"^nccl.*Kernel")
_MEMORY = re.compile(r"(^Memcpy)|(^Memset)|(^dma)")
_NOT_COMPUTE = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")
STEP_NUMBER = re.compile(r"ProfilerStep\s*#\s*(\d+)")
HOST_WAIT, KERNEL_WAIT, OTHER_WAIT = range(3)
IDLE_CATEGORIES = ("host_wait", "kernel_wait", "other")
BREAKDOWN_TYPES = (COMPUTATION, COMMUNICATION, MEMORY)  # HTA's order: bit 1, 2, 4 of an overlap state


def kernel_type(name: str) -> int:
    """HTA's ``get_kernel_type``: communication, memory, computation or other, by name."""
    if _COMM.match(name):
        return COMMUNICATION
    if _MEMORY.match(name):
        return MEMORY
    return OTHER if _NOT_COMPUTE.match(name) else COMPUTATION


def step_number(name: str) -> int | None:
    """N of a ``ProfilerStep#N`` name (None when the name has no number)."""
    match = STEP_NUMBER.match(name)
    return int(match.group(1)) if match else None


def hta_times(ts: np.ndarray, dur: np.ndarray, rounding: bool) -> tuple[np.ndarray, np.ndarray]:
    """Start and duration as HTA reads them: when any timestamp of the file
    is fractional (or missing), starts round up and ends down to whole us."""
    if not rounding:
        return ts, dur
    start = np.ceil(ts)
    rounded = ts + dur
    np.floor(rounded, out=rounded)
    rounded -= start
    return start, rounded


def union(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The union of intervals as sorted disjoint runs (touching intervals join, as HTA's)."""
    if not len(starts):
        return starts, ends
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    reach = np.maximum.accumulate(ends)
    new_run = np.empty(len(starts), dtype=bool)
    new_run[0] = True
    new_run[1:] = starts[1:] > reach[:-1]
    first = np.flatnonzero(new_run)
    last = np.append(first[1:], len(starts)) - 1
    return starts[first], reach[last]


def covered(starts: np.ndarray, ends: np.ndarray) -> float:
    """Length of the union."""
    return _length(union(starts, ends))


Runs = tuple[np.ndarray, np.ndarray]
"""Sorted disjoint intervals (starts, ends): a union."""


def type_runs(start: np.ndarray, end: np.ndarray, types: np.ndarray) -> dict[int, Runs]:
    """The union of each kernel type's intervals: what every time split below
    is computed from (unions of runs are far smaller than the kernels)."""
    return {kind: union(start[types == kind], end[types == kind]) for kind in range(len(TYPE_NAMES))}


def _length(runs: Runs) -> float:
    return float((runs[1] - runs[0]).sum())  # differences first: sums of epoch times lose whole units


@dataclass
class Temporal:
    idle: float
    compute: float
    non_compute: float
    kernel_time: float


def temporal(runs: dict[int, Runs]) -> Temporal:
    """HTA's temporal breakdown of one rank, from its :func:`type_runs`.
    Non-compute time is what is left of the span; it is negative where HTA's
    rounding made durations negative (HTA's assertion fails there), and
    reported as it is."""
    every = union(np.concatenate([pair[0] for pair in runs.values()]), np.concatenate([pair[1] for pair in runs.values()]))
    if not len(every[0]):
        return Temporal(0.0, 0.0, 0.0, 0.0)
    span = float(every[1][-1] - every[0][0])
    idle = span - _length(every)
    compute = _length(runs[COMPUTATION])
    return Temporal(idle, compute, span - compute - idle, span)


def type_overlaps(runs: dict[int, Runs]) -> dict[str, int]:
    """Time of each kernel type alone and of each overlap of types
    (``COMPUTATION overlapping COMMUNICATION``), as HTA sums it: each
    constant stretch truncated to whole units.  Stretches of no length are
    not listed."""
    times: list[np.ndarray] = []
    steps: list[np.ndarray] = []
    for bit, kind in enumerate(BREAKDOWN_TYPES):
        starts, ends = runs[kind]
        times += [starts, ends]
        steps += [np.full(len(starts), 1 << bit, dtype=np.int64), np.full(len(ends), -(1 << bit), dtype=np.int64)]
    at = np.concatenate(times)
    if not len(at):
        return {}
    delta = np.concatenate(steps)
    order = np.argsort(at, kind="stable")
    at, delta = at[order], delta[order]
    state = np.cumsum(delta)
    last_of_time = np.append(at[1:] != at[:-1], True)  # the state once every change at that time is applied
    at, state = at[last_of_time], state[last_of_time]
    lengths = np.trunc(np.diff(at)).astype(np.int64)
    state = state[:-1]
    sums: dict[str, int] = {}
    for value in np.unique(state[state > 0]):
        names = [TYPE_NAMES[kind] for bit, kind in enumerate(BREAKDOWN_TYPES) if value & (1 << bit)]
        sums[" overlapping ".join(names)] = int(lengths[state == value].sum())
    return sums


def overlap_ratio(runs: dict[int, Runs]) -> float:
    """Share of communication time during which computation also runs (NaN without communication)."""
    comm_time = _length(runs[COMMUNICATION])
    if comm_time == 0:
        return math.nan
    return intersection_length(runs[COMMUNICATION], runs[COMPUTATION]) / comm_time


def intersection_length(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> float:
    """Length of the intersection of two sets of sorted disjoint runs."""
    if not len(a[0]) or not len(b[0]):
        return 0.0
    points = np.concatenate([a[0], a[1], b[0], b[1]])
    delta = np.concatenate([np.ones(len(a[0])), -np.ones(len(a[1])), np.ones(len(b[0])), -np.ones(len(b[1]))])
    order = np.argsort(points, kind="stable")
    points, delta = points[order], delta[order]
    level = np.cumsum(delta)
    last_of_time = np.append(points[1:] != points[:-1], True)
    points, level = points[last_of_time], level[last_of_time]
    return float((np.diff(points) * (level[:-1] == 2)).sum())


@dataclass
class NameStats:
    """One kernel name's durations on one rank (count, sum, max, min, std)."""

    name: str
    count: int
    total: float
    longest: float
    shortest: float
    std: float


def name_stats(names: np.ndarray, dur: np.ndarray, strings: list[str]) -> list[NameStats]:
    """Per name id: count, sum, max, min and sample standard deviation (0 for one kernel)."""
    if not len(names):
        return []
    order = np.argsort(names, kind="stable")
    names, dur = names[order], dur[order]
    first = np.flatnonzero(np.append(True, names[1:] != names[:-1]))
    counts = np.diff(np.append(first, len(names)))
    totals = np.add.reduceat(dur, first)
    out = []
    for at, count, total in zip(first, counts, totals):
        values = dur[at:at + count]
        std = float(values.std(ddof=1)) if count > 1 else 0.0
        out.append(NameStats(strings[names[at]], int(count), float(total), float(values.max()), float(values.min()), std))
    return out


def aggregate_names(stats: list[NameStats], num_kernels: int = 10, duration_ratio: float = 0.8) -> list[dict]:
    """HTA's ``_aggr_gpu_kernel_time``: names by total time, descending; past
    ``num_kernels`` names, those beyond the count or whose running total
    passes the ``duration_ratio`` quantile become one ``others`` row, and every
    row's statistics are then taken over the names' totals (HTA's rule)."""
    ordered = sorted(stats, key=lambda item: item.name)
    ordered.sort(key=lambda item: -item.total)  # stable: equal totals keep name order
    rows = [{"name": s.name, "sum": s.total, "max": s.longest, "min": s.shortest, "mean": s.total / s.count,
             "std": s.std} for s in ordered]
    if len(rows) <= num_kernels:
        return rows
    cumulative = np.cumsum([row["sum"] for row in rows])
    threshold = float(np.quantile(cumulative, duration_ratio))
    grouped: dict[str, list[float]] = {}
    for at, row in enumerate(rows):
        name = "others" if cumulative[at] > threshold or at >= num_kernels else row["name"]
        grouped.setdefault(name, []).append(row["sum"])
    out = []
    for name in sorted(grouped):
        totals = np.array(grouped[name])
        std = float(totals.std(ddof=1)) if len(totals) > 1 else 0.0
        out.append({"name": name, "sum": float(totals.sum()), "max": float(totals.max()), "min": float(totals.min()),
                    "mean": float(totals.mean()), "std": std})
    return out


def idle_breakdown(start: np.ndarray, end: np.ndarray, launch_ts: np.ndarray, delay: float) -> list[tuple[int, float]]:
    """One stream's idle time by category (host wait, kernel wait, other), HTA's rule.

    ``start``/``end``/``launch_ts`` are the stream's kernels in start order
    (``launch_ts`` NaN when the launch is not known).  Each gap before a kernel
    is host wait when the launch came after the previous kernel ended, kernel
    wait when shorter than ``delay``, else other; the first kernel's (no gap)
    counts as other with no time.  Returns (category, time) for the categories
    that occur, in category order."""
    previous_end = np.append(np.nan, end[:-1])
    gap = start - previous_end
    with np.errstate(invalid="ignore"):
        host = launch_ts > previous_end
        kernel = ~host & (gap < delay)
    category = np.where(host, HOST_WAIT, np.where(kernel, KERNEL_WAIT, OTHER_WAIT))
    out = []
    for kind in (HOST_WAIT, KERNEL_WAIT, OTHER_WAIT):
        rows = category == kind
        if rows.any():
            out.append((kind, float(np.nansum(gap[rows]))))
    return out


class LastById:
    """For each id, the last position (in the order given) holding it: HTA's
    link from a kernel to "its" launch when several CPU events share an id."""

    def __init__(self, ids: np.ndarray, positions: np.ndarray) -> None:
        self.ids, first_from_end = np.unique(ids[::-1], return_index=True)
        self.positions = positions[len(ids) - 1 - first_from_end]

    def find(self, wanted: np.ndarray) -> np.ndarray:
        """The position for each wanted id, -1 where no position holds it."""
        if not len(self.ids):
            return np.full(len(wanted), -1, dtype=np.int64)
        at = np.clip(np.searchsorted(self.ids, wanted), 0, len(self.ids) - 1)
        return np.where(self.ids[at] == wanted, self.positions[at], -1)


class StepOf:
    """HTA's iteration of each time: the number of the last step (in the
    order given) whose span holds it (``start <= ts < end``), else -1.

    The span boundaries cut the time line into pieces; a sweep over them with
    a heap of the open spans (latest given first) finds each piece's step
    once, and every time is then placed by bisection."""

    def __init__(self, step_starts: np.ndarray, step_ends: np.ndarray, step_numbers: np.ndarray) -> None:
        self.bounds = np.unique(np.concatenate([step_starts, step_ends]))
        owner = np.full(len(self.bounds), -1, dtype=np.int64)  # per piece [bounds[i], bounds[i + 1]): a step's position
        by_start = np.argsort(step_starts, kind="stable")
        open_spans: list[tuple[int, float]] = []
        next_span = 0
        for piece, at in enumerate(self.bounds.tolist()):
            while next_span < len(by_start) and step_starts[by_start[next_span]] <= at:
                span = int(by_start[next_span])
                heapq.heappush(open_spans, (-span, float(step_ends[span])))
                next_span += 1
            while open_spans and open_spans[0][1] <= at:
                heapq.heappop(open_spans)
            if open_spans:
                owner[piece] = -open_spans[0][0]
        self.numbers = np.where(owner >= 0, step_numbers[np.clip(owner, 0, None)], -1) if len(step_numbers) else owner

    def __call__(self, ts: np.ndarray) -> np.ndarray:
        if not len(self.bounds):
            return np.full(len(ts), -1, dtype=np.int64)
        piece = np.searchsorted(self.bounds, ts, side="right") - 1
        return np.where(piece >= 0, self.numbers[np.clip(piece, 0, None)], -1)


def step_of(ts: np.ndarray, step_starts: np.ndarray, step_ends: np.ndarray, step_numbers: np.ndarray) -> np.ndarray:
    """:class:`StepOf` for one set of times."""
    return StepOf(step_starts, step_ends, step_numbers)(ts)


def suffix_maxima(order_keys: np.ndarray, dur: np.ndarray) -> np.ndarray:
    """Positions (in the given order) of rows no later row outlasts or equals:
    whatever the duration threshold, the last row that passes it is one of these."""
    keep = np.zeros(len(dur), dtype=bool)
    best = -math.inf
    for at in range(len(dur) - 1, -1, -1):
        if dur[at] > best:
            keep[at] = True
            best = dur[at]
    return np.flatnonzero(keep)


def top_candidates(counts: dict[int, int], num_candidates: int) -> list[int]:
    """HTA's stragglers: ranks by how often they were late, most first (ties: lower rank first)."""
    ranked = sorted(counts, key=lambda rank: (-counts[rank], rank))
    return ranked[:max(num_candidates, 1)]


def late_ranks(metric: dict[int, float], num_candidates: int) -> set[int]:
    """Ranks whose metric reaches the ``num_candidates``-th largest (ties all count)."""
    values = sorted(metric.values(), reverse=True)
    if not values:
        return set()
    threshold = values[min(max(num_candidates, 1), len(values)) - 1]
    return {rank for rank, value in metric.items() if value >= threshold}
