"""GPU busy time: the length of the union of a GPU's slices, in bounded memory.

A GPU's slices arrive nearly in start order (the profiler writes them as the
device's buffers fill, a few streams interleaved), rarely far out of it.  A
reorder window of ``window`` slices (a min-heap on start) turns that into
start order, and a sweep over the ordered slices sums the union: memory is
the window, whatever the trace's length.  A slice that comes later than the
window can absorb starts before the part already summed; it is counted in
``late`` and its time added as if it overlapped nothing, so ``late == 0``
means the figure is exact.
"""
from __future__ import annotations

from heapq import heappop, heappush, heappushpop

WINDOW = 4096


class BusyTime:
    """Union length of the intervals added; see the module docstring."""

    def __init__(self, window: int = WINDOW) -> None:
        self.window = window
        self.slices = 0
        self.late = 0
        self.first = float("inf")
        self.last = float("-inf")
        self._pending: list[tuple[float, float]] = []
        self._summed = 0.0
        self._start: float | None = None  # the run of overlapping slices being swept
        self._end = 0.0

    def add(self, start: float, end: float) -> None:
        self.slices += 1
        if start < self.first:
            self.first = start
        if end > self.last:
            self.last = end
        if len(self._pending) < self.window:
            heappush(self._pending, (start, end))
        else:
            self._sweep(*heappushpop(self._pending, (start, end)))

    def _sweep(self, start: float, end: float) -> None:
        if self._start is None:
            self._start, self._end = start, end
        elif start < self._start:  # behind the run: the window was too small for this slice
            self.late += 1
            self._summed += end - start
        elif start <= self._end:
            if end > self._end:
                self._end = end
        else:
            self._summed += self._end - self._start
            self._start, self._end = start, end

    def total(self) -> float:
        """The busy time so far (drains the window: call once, at the end)."""
        while self._pending:
            self._sweep(*heappop(self._pending))
        return self._summed + (0.0 if self._start is None else self._end - self._start)
