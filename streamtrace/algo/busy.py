"""GPU busy time: the length of the union of a GPU's slices, exact whatever
their order, in bounded memory.

A GPU's slices arrive nearly in start order (the profiler writes them as the
device's buffers fill, a few streams interleaved), sometimes far out of it
(thousands of slices on HTA's ``trace_diff`` test trace).  Slices are held
until ``2 * window`` of them wait; those are then ordered by start and the
first ``window`` swept (with numpy) into the runs of the union: a run closes
when a slice starts after its end, and closed runs are summed and kept, in
order, in a :class:`RunStore`.  A slice that comes later than the window can
absorb starts before the open run: it is set aside, and each ``late_limit``
of those are ordered and their own union kept as one more sorted segment.
The busy time is the sum of the runs when no slice came late, else the
length of the union of all the segments, merged a block of each at a time
(:func:`union_length`); the union of several GPUs' slices (a rank's) is
merged the same way.

Memory is the window, the late slices set aside and what the stores keep
in memory: the caller gives stores that keep the rest on disk (this module
does no I/O; :class:`MemoryRuns` keeps everything, for small inputs).
"""
from __future__ import annotations

from array import array
from itertools import chain
from typing import Callable, Iterable, Iterator, Protocol

import numpy as np

WINDOW = 4096
LATE_LIMIT = 1 << 16  # slices set aside before they are ordered into a segment
RUNS_IN_MEMORY = 1 << 16  # runs of the in-order segment a store keeps in memory
MERGE_ROWS = 1 << 18  # runs read at once by a merge, over all its segments

Block = tuple[np.ndarray, np.ndarray]  # starts and ends (float64), ordered by start


class RunStore(Protocol):
    """Runs appended in start order, read back in that order a block at a time."""

    def append(self, starts: np.ndarray, ends: np.ndarray) -> None: ...

    def blocks(self, rows: int) -> Iterator[Block]: ...


class MemoryRuns:
    """A :class:`RunStore` in memory (``budget`` is not needed: all is kept)."""

    def __init__(self, budget: int = 0) -> None:
        self.starts = array("d")
        self.ends = array("d")

    def append(self, starts: np.ndarray, ends: np.ndarray) -> None:
        self.starts.frombytes(starts.tobytes())
        self.ends.frombytes(ends.tobytes())

    def blocks(self, rows: int) -> Iterator[Block]:
        starts, ends = np.frombuffer(self.starts, dtype=np.float64), np.frombuffer(self.ends, dtype=np.float64)
        for at in range(0, len(starts), rows):
            yield starts[at:at + rows], ends[at:at + rows]


def extend_runs(starts: np.ndarray, ends: np.ndarray, run: tuple[float, float]
                ) -> tuple[np.ndarray, np.ndarray, tuple[float, float]]:
    """Sweep slices ordered by start, none starting before ``run`` (the open
    run), into it: the runs they close (starts, ends) and the open run after them."""
    run_starts = np.concatenate(([run[0]], starts))
    reach = np.maximum.accumulate(np.concatenate(([run[1]], ends)))
    opens = np.flatnonzero(run_starts[1:] > reach[:-1]) + 1  # slices that start a new run
    last = int(opens[-1]) if len(opens) else 0
    firsts = np.concatenate(([0], opens[:-1])).astype(np.intp) if len(opens) else opens
    return run_starts[firsts], reach[opens - 1], (float(run_starts[last]), float(reach[-1]))


def union_length(segments: list[Callable[[int], Iterable[Block]]]) -> float:
    """Length of the union of intervals given as segments, each ordered by
    start (``segments[n](rows)`` yields its blocks of at most ``rows``):
    merged a block of each at a time, in memory bounded by :data:`MERGE_ROWS`."""
    rows = max(1024, MERGE_ROWS // max(len(segments), 1))
    sources = [iter(segment(rows)) for segment in segments]
    heads = {number: block for number, source in enumerate(sources) if (block := _next_block(source)) is not None}
    total, run = 0.0, None
    while heads:
        bound = min(float(starts[-1]) for starts, _ in heads.values())  # nothing to come starts before it
        taken = []
        for number, (starts, ends) in list(heads.items()):
            cut = int(np.searchsorted(starts, bound, side="right"))
            taken.append((starts[:cut], ends[:cut]))
            if cut < len(starts):
                heads[number] = (starts[cut:], ends[cut:])
            elif (block := _next_block(sources[number])) is not None:
                heads[number] = block
            else:
                del heads[number]
        starts = np.concatenate([starts for starts, _ in taken])
        ends = np.concatenate([ends for _, ends in taken])
        order = np.argsort(starts, kind="stable")
        starts, ends = starts[order], ends[order]
        if run is None:
            run, starts, ends = (float(starts[0]), float(ends[0])), starts[1:], ends[1:]
        closed_starts, closed_ends, run = extend_runs(starts, ends, run)
        total += float(np.sum(closed_ends - closed_starts))
    return total if run is None else total + run[1] - run[0]


def _next_block(source: Iterator[Block]) -> Block | None:
    """The next block of a segment that holds a run, None at its end."""
    for block in source:
        if len(block[0]):
            return block
    return None


class BusyTime:
    """Union length of the intervals added; see the module docstring.
    ``runs(budget)`` makes a store keeping at most ``budget`` runs in memory."""

    def __init__(self, window: int = WINDOW, runs: Callable[[int], RunStore] = MemoryRuns,
                 late_limit: int = LATE_LIMIT) -> None:
        self.window = window
        self.late_limit = late_limit
        self.slices = 0
        self.late = 0  # slices that came later than the window (set aside, then merged)
        self.first = float("inf")
        self.last = float("-inf")
        self.starts = array("d")  # the slices waiting, in the order they came
        self.ends = array("d")
        self._runs = runs
        self._done = runs(RUNS_IN_MEMORY)  # the closed runs, in order
        self._summed = 0.0  # ... their total length
        self._run: tuple[float, float] | None = None  # the open run
        self._late_starts = array("d")
        self._late_ends = array("d")
        self._late_segments: list[RunStore] = []

    def add(self, start: float, end: float) -> None:
        self.slices += 1
        self.starts.append(start)
        self.ends.append(end)
        if len(self.starts) >= 2 * self.window:
            self._sweep(self.window)

    def extend(self, starts: array, ends: array, slices: int | None = None) -> None:
        """Add intervals in order, as :meth:`add` one at a time would; ``slices``:
        how many slices they stand for (a part's :meth:`take_part`), if not one each."""
        self.slices += len(starts) if slices is None else slices
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
        if not len(starts):
            return
        self.first = min(self.first, float(starts.min()))
        self.last = max(self.last, float(ends.max()))
        order = np.argsort(starts, kind="stable")
        starts, ends = starts[order], ends[order]
        swept_starts, swept_ends = starts[:count], ends[:count]
        waiting = (starts[count:].copy(), ends[count:].copy())
        del self.starts[:], self.ends[:]
        if self._run is None and len(swept_starts):
            self._run = (float(swept_starts[0]), float(swept_ends[0]))
            swept_starts, swept_ends = swept_starts[1:], swept_ends[1:]
        if len(swept_starts):
            late = int(np.searchsorted(swept_starts, self._run[0], side="left"))  # behind the open run
            if late:
                self._set_aside(swept_starts[:late], swept_ends[:late])
            closed_starts, closed_ends, self._run = extend_runs(swept_starts[late:], swept_ends[late:], self._run)
            if len(closed_starts):
                self._summed += float(np.sum(closed_ends - closed_starts))
                self._done.append(closed_starts, closed_ends)
        self.starts.frombytes(waiting[0].tobytes())
        self.ends.frombytes(waiting[1].tobytes())

    def _set_aside(self, starts: np.ndarray, ends: np.ndarray) -> None:
        """Keep slices that came too late for the sweep; order each ``late_limit`` of them into a segment."""
        self.late += len(starts)
        self._late_starts.frombytes(starts.tobytes())
        self._late_ends.frombytes(ends.tobytes())
        if len(self._late_starts) >= self.late_limit:
            store = self._runs(0)
            for block in self._late_union():
                store.append(*block)
            self._late_segments.append(store)
            del self._late_starts[:], self._late_ends[:]

    def _late_union(self) -> list[Block]:
        """The union of the slices set aside, as runs ordered by start."""
        starts, ends = np.frombuffer(self._late_starts, dtype=np.float64), np.frombuffer(self._late_ends, dtype=np.float64)
        if not len(starts):
            return []
        order = np.argsort(starts, kind="stable")
        starts, ends = starts[order], ends[order]
        closed_starts, closed_ends, run = extend_runs(starts[1:], ends[1:], (float(starts[0]), float(ends[0])))
        return [(closed_starts, closed_ends), (np.array([run[0]]), np.array([run[1]]))]

    def segments(self) -> list[Callable[[int], Iterable[Block]]]:
        """The union so far as segments ordered by start, for :func:`union_length` (after :meth:`settle`)."""
        run = [] if self._run is None else [(np.array([self._run[0]]), np.array([self._run[1]]))]
        late = self._late_union()
        return [lambda rows: chain(self._done.blocks(rows), run), *(store.blocks for store in self._late_segments),
                *([lambda rows: late] if late else [])]

    def settle(self) -> None:
        """Sweep every slice waiting (at the end of the input)."""
        self._sweep(len(self.starts))

    def total(self) -> float:
        """The busy time: the length of the union of the slices (settles them)."""
        self.settle()
        if self._run is None:
            return 0.0
        if not self.late:
            return self._summed + self._run[1] - self._run[0]
        return union_length(self.segments())

    def take_part(self) -> tuple[array, array, int]:
        """Intervals whose union is the slices' added so far, and how many
        slices they stand for (a part's share of a split pass, for
        :meth:`extend`); this then holds none of them."""
        if self._run is None and not self.late:
            taken = (self.starts[:], self.ends[:], self.slices)  # (nothing swept: the slices themselves)
        else:
            self.settle()
            blocks = [block for segment in self.segments() for block in segment(MERGE_ROWS)]
            taken = (array("d", np.concatenate([starts for starts, _ in blocks]).tobytes()),
                     array("d", np.concatenate([ends for _, ends in blocks]).tobytes()), self.slices)
        self.__init__(self.window, self._runs, self.late_limit)
        return taken
