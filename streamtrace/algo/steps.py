"""Profiler steps and time windows: what ``slice`` selects by (pure).

A step is the span of a ``ProfilerStep#N`` event (``user_annotation`` or
``cpu_op``) on one rank.  Each rank has its own spans; step N of a merged
trace is the union of every rank's step N.  Events are placed in a step by
their start time (the span holds ``start <= ts < end``; a zero-length span
holds its own start); GPU events follow their launch instead.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from ..errors import TraceError

STEP_NAME = re.compile(r"ProfilerStep#(\d+)\Z")
STEP_CATEGORIES = frozenset({"user_annotation", "cpu_op"})
NO_STEP = -1
_UNITS = {"us": 1.0, "ms": 1e3, "s": 1e6}
_TIME = re.compile(r"\s*(\+)?\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*(us|ms|s)?\s*\Z")


def parse_int_list(text: str, flag: str, example: str = "0-7,12") -> set[int]:
    """``0-7,12`` -> {0, ..., 7, 12}; a one-line error naming ``flag`` otherwise."""
    values: set[int] = set()
    for part in text.split(","):
        low, _, high = part.strip().partition("-")
        try:
            first, last = int(low), int(high or low)
        except ValueError:
            raise TraceError(f"{flag}: cannot read {part!r}; expected a list like {example}") from None
        if first < 0 or last < first:
            raise TraceError(f"{flag}: {part!r} is not a range of non-negative numbers (like {example})")
        values.update(range(first, last + 1))
    return values


@dataclass(frozen=True)
class TimeBound:
    """One end of a window: microseconds, absolute or after the trace's first event."""

    us: float
    relative: bool

    def resolve(self, first_ts: float) -> float:
        return first_ts + self.us if self.relative else self.us


def parse_time(text: str) -> TimeBound:
    """``1500``, ``2.5ms``, ``3s``, ``+2.5s`` -> a bound in microseconds."""
    match = _TIME.match(text)
    if match is None:
        raise TraceError(f"--window: cannot read {text!r}; expected a time like 1500, 2.5ms, 3s or +2.5s")
    return TimeBound(float(match.group(2)) * _UNITS[match.group(3) or "us"], match.group(1) is not None)


def parse_window(text: str) -> tuple[TimeBound | None, TimeBound | None]:
    """``START:END`` (either may be empty: open) -> its two bounds."""
    start, colon, end = text.partition(":")
    if not colon:
        raise TraceError(f"--window: {text!r} has no ':'; expected START:END such as +2s:+3.5s")
    return (parse_time(start) if start.strip() else None, parse_time(end) if end.strip() else None)


class StepTable:
    """Every rank's step spans, for placing times in steps by bisection.

    ``numbers`` lists the step numbers found anywhere, ascending; a step id is
    an index into it, so step N has the same id on every rank.
    """

    def __init__(self, spans: dict[int, dict[int, tuple[float, float]]]) -> None:
        self.numbers = sorted({number for per_rank in spans.values() for number in per_rank})
        ids = {number: at for at, number in enumerate(self.numbers)}
        self.per_rank: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self.found = {rank: sorted(per_rank) for rank, per_rank in sorted(spans.items())}
        for rank, per_rank in spans.items():
            ordered = sorted(per_rank.items(), key=lambda item: item[1])
            starts = np.array([span[0] for _, span in ordered], dtype=np.float64)
            ends = np.array([span[1] for _, span in ordered], dtype=np.float64)
            self.per_rank[rank] = (starts, ends, np.array([ids[number] for number, _ in ordered], dtype=np.int32))

    def complete(self) -> list[int]:
        """Step numbers found on every rank that has steps (a step missing somewhere was cut by the capture)."""
        sets = [set(numbers) for numbers in self.found.values()]
        return sorted(set.intersection(*sets)) if sets else []

    def place(self, ranks: np.ndarray, ts: np.ndarray) -> np.ndarray:
        """The step id holding each (rank, start time), or NO_STEP."""
        out = np.full(len(ts), NO_STEP, dtype=np.int32)
        for rank, (starts, ends, ids) in self.per_rank.items():
            mine = np.flatnonzero(ranks == rank)
            if not len(mine):
                continue
            times = ts[mine]
            at = np.searchsorted(starts, times, side="right") - 1  # the last span starting at or before
            valid = at >= 0
            at = np.where(valid, at, 0)
            inside = valid & ((times < ends[at]) | (times == starts[at]))
            out[mine[inside]] = ids[at[inside]]
        return out


def longest_run(numbers: list[int], sizes: dict[int, int], fixed: int, limit: int) -> list[int]:
    """The longest run of consecutive step numbers from ``numbers[0]`` whose
    sizes plus ``fixed`` fit in ``limit`` bytes (empty if the first does not)."""
    taken: list[int] = []
    total = fixed
    for number in numbers:
        if taken and number != taken[-1] + 1:
            break
        total += sizes.get(number, 0)
        if total > limit:
            break
        taken.append(number)
    return taken
