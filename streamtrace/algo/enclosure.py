"""Which CPU ops enclose each launch, without holding the ops (pure).

Kineto writes all CPU ops first and the runtime calls after them, and
neither in strict time order, so enclosure cannot be settled by a stack
while streaming.  Instead the launches that matter (those with GPU work) are
sorted per thread, and the ops are streamed past them once: each op finds
the launches inside it by bisection and offers itself as their innermost
``cpu_op`` (latest start, then shortest; later in the file on a tie) and as
their outermost op (earliest start, then longest; earlier on a tie).  Memory
grows with the launches, work with launches x nesting depth.
"""
from __future__ import annotations

from array import array
from bisect import bisect_left
from typing import Iterable

CPU_OP, ANNOTATION = 1, 2
NO_OP = -1


class Enclosure:
    """Innermost cpu_op and outermost op (name ids) per launch ordinal."""

    def __init__(self, launch_thread: array, launch_start: array, launch_end: array, wanted: bytearray) -> None:
        per_thread: dict[int, array] = {}
        for ordinal, needed in enumerate(wanted):
            if needed:
                thread = launch_thread[ordinal]
                if thread not in per_thread:
                    per_thread[thread] = array("i")
                per_thread[thread].append(ordinal)
        self._threads: dict[int, tuple[array, array]] = {}
        for thread, ordinals in per_thread.items():
            ordered = array("i", sorted(ordinals, key=launch_start.__getitem__))
            self._threads[thread] = (array("d", (launch_start[o] for o in ordered)), ordered)
        count = len(launch_start)
        self._end = launch_end
        self.inner = array("i", [NO_OP]) * count
        self.outer = array("i", [NO_OP]) * count
        self._inner_span = (array("d", bytes(8 * count)), array("d", bytes(8 * count)))
        self._outer_span = (array("d", bytes(8 * count)), array("d", bytes(8 * count)))

    def offer(self, ops: Iterable[tuple[int, float, float, int, int]]) -> None:
        """Stream ops ``(thread, start, end, name id, kind)`` past the launches."""
        threads, ends = self._threads, self._end
        inner, outer = self.inner, self.outer
        inner_start, inner_end = self._inner_span
        outer_start, outer_end = self._outer_span
        for thread, start, end, name, kind in ops:
            found = threads.get(thread)
            if found is None:
                continue
            starts, ordinals = found
            at = bisect_left(starts, start)
            while at < len(starts) and starts[at] <= end:
                launch = ordinals[at]
                at += 1
                if ends[launch] > end:
                    continue
                if kind == CPU_OP and (inner[launch] == NO_OP or start > inner_start[launch]
                                       or (start == inner_start[launch] and end <= inner_end[launch])):
                    inner[launch], inner_start[launch], inner_end[launch] = name, start, end
                if (outer[launch] == NO_OP or start < outer_start[launch]
                        or (start == outer_start[launch] and end > outer_end[launch])):
                    outer[launch], outer_start[launch], outer_end[launch] = name, start, end
