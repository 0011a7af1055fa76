"""GPU busy time: the length of the union of a GPU's slices, in bounded memory.

A GPU's slices arrive nearly in start order (the profiler writes them as the
device's buffers fill, a few streams interleaved), rarely far out of it.
Slices are held until ``2 * window`` of them wait; those are then ordered
by start and the first ``window`` swept (with numpy) into the union summed
so far, the rest wait on.  Memory is the window, whatever the trace's
length, and the figure depends only on the slices and their order, not on
how they were handed over (one at a time, or in runs from the parts of a
split pass).  A slice that comes later than the window can absorb starts
before the part already summed; it is counted in ``late`` and its time
added as if it overlapped nothing, so ``late == 0`` means the figure is
exact.
"""
from __future__ import annotations

from array import array

import numpy as np

WINDOW = 4096


class BusyTime:
    """Union length of the intervals added; see the module docstring."""

    def __init__(self, window: int = WINDOW) -> None:
        self.window = window
        self.slices = 0
        self.late = 0
        self.first = float("inf")
        self.last = float("-inf")
        self.starts = array("d")  # the slices waiting, in the order they came
        self.ends = array("d")
        self._summed = 0.0
        self._run: tuple[float, float] | None = None  # the run of overlapping slices being swept

    def add(self, start: float, end: float) -> None:
        self.starts.append(start)
        self.ends.append(end)
        if len(self.starts) >= 2 * self.window:
            self._sweep(self.window)

    def extend(self, starts: array, ends: array) -> None:
        """Add slices in order, as :meth:`add` one at a time would."""
        done = 0
        while done < len(starts):
            take = min(len(starts) - done, 2 * self.window - len(self.starts))
            self.starts.extend(starts[done:done + take])
            self.ends.extend(ends[done:done + take])
            done += take
            if len(self.starts) >= 2 * self.window:
                self._sweep(self.window)

    def _sweep(self, count: int) -> None:
        """Order the waiting slices by start; sweep the first ``count`` of them."""
        starts, ends = np.frombuffer(self.starts, dtype=np.float64), np.frombuffer(self.ends, dtype=np.float64)
        self.slices += len(starts)
        if len(starts):
            self.first = min(self.first, float(starts.min()))
            self.last = max(self.last, float(ends.max()))
        order = np.argsort(starts, kind="stable")
        starts, ends = starts[order], ends[order]
        swept_starts, swept_ends = starts[:count], ends[:count]
        waiting = (starts[count:].copy(), ends[count:].copy())
        del self.starts[:], self.ends[:]
        self.slices -= len(waiting[0])
        if self._run is None and len(swept_starts):
            self._run = (float(swept_starts[0]), float(swept_ends[0]))
            swept_starts, swept_ends = swept_starts[1:], swept_ends[1:]
        if len(swept_starts):
            late = int(np.searchsorted(swept_starts, self._run[0], side="left"))  # behind the run: window too small
            if late:
                self.late += late
                self._summed += float(np.sum(swept_ends[:late] - swept_starts[:late]))
            run_starts = np.concatenate(([self._run[0]], swept_starts[late:]))
            reach = np.maximum.accumulate(np.concatenate(([self._run[1]], swept_ends[late:])))
            opens = np.flatnonzero(run_starts[1:] > reach[:-1]) + 1  # slices that start a new run
            if len(opens):
                firsts = np.concatenate(([0], opens))
                closed = reach[opens - 1] - run_starts[firsts[:-1]]
                self._summed += float(np.sum(closed))
                self._run = (float(run_starts[opens[-1]]), float(reach[-1]))
            else:
                self._run = (self._run[0], float(reach[-1]))
        self.starts.frombytes(waiting[0].tobytes())
        self.ends.frombytes(waiting[1].tobytes())

    def take_slices(self) -> tuple[array, array]:
        """The slices added and not yet swept, in the order they came (a
        part's share of a split pass); this then holds none of them."""
        taken = (self.starts[:], self.ends[:])
        del self.starts[:], self.ends[:]
        return taken

    def total(self) -> float:
        """The busy time so far (sweeps everything waiting: call once, at the end)."""
        self._sweep(len(self.starts))
        return self._summed + (0.0 if self._run is None else self._run[1] - self._run[0])
