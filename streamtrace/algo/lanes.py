"""Lane algorithms for ``compact`` (pure functions over numpy arrays).

Slices are addressed by their ordinal; starts and ends are float64 (the
exact doubles read), orders and partitions int32, so millions of slices
cost a few bytes each.  The work runs in numpy's C loops with a Python step
per stream, group, lane or chunk, not per slice; the long sweeps go by
chunks of :data:`CHUNK` so that their scratch arrays stay small beside the
pass-1 index.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np

ORDINAL = np.int32
CHUNK = 1 << 15  # slices or queries per step of the chunked sweeps (scratch of a few hundred KB)
QUERY_BLOCK = 1 << 20  # queries grouped by run at once (see _per_run)
PEEL_LANES = 16  # lanes peeled per chunk before a heap packs the rest (see pack_lanes)
NONE = -1  # no slice: the query's stream held none
NO_MATCH = -2  # the stream held slices, none starting at the query's time


def start_order(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Every ordinal in (start, end, ordinal) order: the order slices are
    packed and label runs read in (``lexsort`` is stable, so equal times keep
    ordinal order)."""
    return np.lexsort((ends, starts)).astype(ORDINAL)


def partition(order: np.ndarray | None, keys: np.ndarray, key_count: int) -> tuple[np.ndarray, np.ndarray]:
    """Stable partition of ``order`` (None: every index of ``keys``) by
    ``keys[item]``: (permutation, offsets).

    Members with key k are ``perm[offsets[k]:offsets[k + 1]]``, still in
    ``order``'s order.  A counting sort a chunk at a time: beside the int32
    permutation, scratch memory stays a chunk's.
    """
    count = len(keys) if order is None else len(order)

    def chunks():
        for lo in range(0, count, CHUNK):
            items = np.arange(lo, min(lo + CHUNK, count), dtype=ORDINAL) if order is None else order[lo:lo + CHUNK]
            yield items, keys[items]

    offsets = np.zeros(key_count + 1, np.int64)
    for _, item_keys in chunks():
        offsets[1:] += np.bincount(item_keys, minlength=key_count)
    np.cumsum(offsets, out=offsets)
    perm = np.empty(count, ORDINAL)
    cursor = offsets[:-1].copy()
    for items, item_keys in chunks():
        by_key = np.argsort(item_keys, kind="stable")
        sorted_keys = item_keys[by_key]
        counts = np.bincount(item_keys, minlength=key_count)
        rank = np.arange(len(items)) - (np.cumsum(counts) - counts)[sorted_keys]  # place among its key's members
        perm[cursor[sorted_keys] + rank] = items[by_key]
        cursor += counts
    return perm, offsets


def _per_run(perm: np.ndarray, offsets: np.ndarray, starts: np.ndarray, runs: np.ndarray, times: np.ndarray,
             find: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray], out: np.ndarray | None) -> np.ndarray:
    """``find(run_starts, run_items, times)`` for the queries of each run
    that holds slices, :data:`CHUNK` queries at a time; :data:`NONE` for the
    other queries.  Into ``out`` when given (an int32 array as long as
    ``runs``).  Queries are grouped by run a block of :data:`QUERY_BLOCK` at
    a time, and each run's starts gathered once a block."""
    found = np.empty(len(runs), ORDINAL) if out is None else out
    found[:] = NONE
    for block in range(0, len(runs), QUERY_BLOCK):
        grouped, bounds = partition(None, runs[block:block + QUERY_BLOCK], len(offsets) - 1)
        grouped += block
        for run in np.flatnonzero((bounds[1:] > bounds[:-1]) & (offsets[1:] > offsets[:-1])).tolist():
            items = perm[offsets[run]:offsets[run + 1]]
            run_starts = starts[items]
            for lo in range(bounds[run], bounds[run + 1], CHUNK):
                queries = grouped[lo:min(lo + CHUNK, bounds[run + 1])]
                found[queries] = find(run_starts, items, times[queries])
    return found


def nearest_in_runs(perm: np.ndarray, offsets: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                    runs: np.ndarray, times: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """For each query n: the slice of run ``runs[n]`` (``perm[lo:hi]``, in
    start order) nearest to ``times[n]``, or :data:`NONE` for an empty run.

    A slice containing the time is at distance 0, others at their nearer
    edge.  The candidates are the slices just before, at and after the
    time's place in the run (``bisect_left`` over the starts); the first at
    the least distance wins.
    """
    def find(run_starts: np.ndarray, items: np.ndarray, times: np.ndarray) -> np.ndarray:
        at = np.searchsorted(run_starts, times, "left")
        best = np.full(len(times), items[0], ORDINAL)
        best_distance = np.full(len(times), np.inf)
        for position in (at - 1, at, at + 1):
            valid = (position >= 0) & (position < len(items))
            item = items[np.where(valid, position, 0)]
            item_start, item_end = starts[item], ends[item]
            to_start, to_end = np.abs(times - item_start), np.abs(times - item_end)
            distance = np.where(to_end < to_start, to_end, to_start)  # min() as Python takes it
            distance[(item_start <= times) & (times <= item_end)] = 0.0
            closer = valid & (distance < best_distance)
            best[closer] = item[closer]
            best_distance[closer] = distance[closer]
        return best

    return _per_run(perm, offsets, starts, runs, times, find, out)


def starting_in_runs(perm: np.ndarray, offsets: np.ndarray, starts: np.ndarray, runs: np.ndarray,
                     times: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """For each query n: the last slice of run ``runs[n]`` (in start order)
    starting exactly at ``times[n]``, :data:`NO_MATCH` when none does,
    :data:`NONE` for an empty run."""
    def find(run_starts: np.ndarray, items: np.ndarray, times: np.ndarray) -> np.ndarray:
        before = np.searchsorted(run_starts, times, "right") - 1
        at = np.maximum(before, 0)
        return np.where((before >= 0) & (run_starts[at] == times), items[at], NO_MATCH)

    return _per_run(perm, offsets, starts, runs, times, find, out)


def pack_lanes(order: np.ndarray, starts: np.ndarray, ends: np.ndarray, lanes: np.ndarray) -> int:
    """Interval partitioning: give each slice in ``order`` the lowest lane
    free at its start.

    ``order`` must be sorted by start.  A lane is free again once its last
    slice ended at or before the next start (touching slices share a lane).
    Writes ``lanes[ordinal]`` and returns the number of lanes used.

    Lowest-free-lane is the same as peeling: lane 0 takes, in start order,
    each slice starting at or after the end of the last one it took; lane 1
    does the same with what lane 0 left, and so on.  Each peel follows a
    chain of "next slice starting after my end" pointers by doubling (see
    :func:`_chain`).  Chunks of :data:`CHUNK` slices carry each lane's last
    end over.  When a chunk needs more than :data:`PEEL_LANES` lanes (many
    concurrent slices: each peel would take few), a heap packs its rest.
    """
    last_ends: list[float] = []
    for lo in range(0, len(order), CHUNK):
        items = order[lo:lo + CHUNK]
        lanes[items] = _pack_chunk(starts[items], ends[items], last_ends)
    return len(last_ends)


def _pack_chunk(chunk_starts: np.ndarray, chunk_ends: np.ndarray, last_ends: list[float]) -> np.ndarray:
    """Lanes of one chunk's slices, given and updating each lane's last end."""
    lanes = np.empty(len(chunk_starts), ORDINAL)
    rest = np.arange(len(chunk_starts), dtype=ORDINAL)  # positions not placed yet, in start order
    lane = 0
    while rest.size:
        rest_starts, rest_ends = chunk_starts[rest], chunk_ends[rest]
        if lane == PEEL_LANES:
            lanes[rest] = _pack_with_heap(rest_starts, rest_ends, last_ends, lane)
            break
        taken = _chain(rest_starts, rest_ends, last_ends[lane] if lane < len(last_ends) else -np.inf)
        if taken.size:
            if lane == len(last_ends):
                last_ends.append(0.0)
            last_ends[lane] = float(rest_ends[taken[-1]])
            lanes[rest[taken]] = lane
            rest = np.delete(rest, taken)
        lane += 1
    return lanes


def _chain(starts: np.ndarray, ends: np.ndarray, floor: float) -> np.ndarray:
    """Positions one lane takes from slices sorted by start: the first
    starting at or after ``floor``, then each time the first after it that
    starts at or after its end.

    The chain is followed by pointer doubling: with ``jump`` = the 2^k-th
    successor and the chain's first 2^k positions known, their 2^k-th
    successors are the next 2^k; ``log2(length)`` vectorised steps.
    """
    count = len(starts)
    first = np.searchsorted(starts, floor, "left")
    if first == count:
        return np.empty(0, ORDINAL)
    successor = np.searchsorted(starts, ends, "left")
    np.maximum(successor, np.arange(1, count + 1), out=successor)
    jump = np.append(successor, count).astype(ORDINAL)  # past the end (count) stays there
    del successor
    taken = np.array([first], ORDINAL)
    while True:
        step = jump[taken]
        step = step[step < count]
        taken = np.concatenate((taken, step))
        if step.size < taken.size - step.size:  # the chain ended within these 2^k steps
            return taken
        jump = jump[jump]


def _pack_with_heap(starts: np.ndarray, ends: np.ndarray, last_ends: list[float], first_lane: int) -> list[int]:
    """Lowest free lane from ``first_lane`` on, slice by slice with heaps of
    busy and free lanes: for a chunk's rest after :data:`PEEL_LANES` peels."""
    busy = [(end, lane) for lane, end in enumerate(last_ends) if lane >= first_lane]
    heapq.heapify(busy)
    free: list[int] = []
    lanes = []
    for start, end in zip(starts.tolist(), ends.tolist()):
        while busy and busy[0][0] <= start:
            heapq.heappush(free, heapq.heappop(busy)[1])
        if free:
            lane = heapq.heappop(free)
            last_ends[lane] = end
        else:
            lane = len(last_ends)
            last_ends.append(end)
        lanes.append(lane)
        heapq.heappush(busy, (end, lane))
    return lanes


def first_overlap(order: np.ndarray, starts: np.ndarray, ends: np.ndarray, lanes: np.ndarray) -> int | None:
    """A slice that overlaps an earlier slice of its lane, or None: the first
    in ``order`` (sorted by start).

    An independent check of :func:`pack_lanes`: each slice must start at or
    after the end of the previous slice of its lane.  (Up to the first
    overlap a lane's slices end in order, so its previous slice holds its
    latest end.)
    """
    last_ends: dict[int, float] = {}
    for lo in range(0, len(order), CHUNK):
        items = order[lo:lo + CHUNK]
        item_lanes = lanes[items]
        by_lane = np.argsort(item_lanes, kind="stable")
        item_lanes, item_starts, item_ends = item_lanes[by_lane], starts[items][by_lane], ends[items][by_lane]
        heads = np.flatnonzero(np.diff(item_lanes, prepend=item_lanes[0] - 1) != 0)
        previous = np.empty_like(item_ends)
        previous[1:] = item_ends[:-1]
        previous[heads] = [last_ends.get(lane, -np.inf) for lane in item_lanes[heads].tolist()]
        overlapping = np.flatnonzero(item_starts < previous)
        if overlapping.size:
            return int(items[by_lane[overlapping].min()])
        for lane, end in zip(item_lanes[heads].tolist(), np.maximum.reduceat(item_ends, heads).tolist()):
            last_ends[lane] = end
    return None


@dataclass
class Clusters:
    """Coalesced spans: each cluster's kept member and union, and every
    member removed."""

    kept: np.ndarray
    start: np.ndarray
    end: np.ndarray
    removed: np.ndarray


def coalesce(items: np.ndarray, keys: tuple[np.ndarray, ...], starts: np.ndarray, ends: np.ndarray) -> Clusters:
    """Clusters of same-key spans that overlap or touch, among ``items``.

    Spans are sorted by key (``keys[0][item]``, then ``keys[1][item]``, ...)
    and start; a cluster closes where the next span of its key starts after
    the latest end so far.  For every cluster of two or more the member with
    the lowest ordinal is kept and stretched to the union (first start,
    latest end); the others are removed.
    """
    if not len(items):
        return Clusters(items, np.empty(0), np.empty(0), items)
    members = items[np.lexsort((starts[items], *(key[items] for key in reversed(keys))))]
    head = np.zeros(len(members), bool)
    head[0] = True
    for key in keys:
        member_keys = key[members]
        head[1:] |= member_keys[1:] != member_keys[:-1]
        del member_keys
    reach = _running_max(ends[members], head)
    head[1:] |= starts[members[1:]] > reach[:-1]
    del reach
    heads = np.flatnonzero(head)
    cluster = np.cumsum(head, dtype=ORDINAL) - 1
    del head
    sizes = np.diff(heads, append=len(members))
    kept = np.minimum.reduceat(members, heads)
    removed = members[(sizes[cluster] > 1) & (members != kept[cluster])]
    multi = sizes > 1
    return Clusters(kept[multi], starts[members[heads[multi]]], np.maximum.reduceat(ends[members], heads)[multi],
                    removed)


def _running_max(values: np.ndarray, first: np.ndarray) -> np.ndarray:
    """Running maximum of ``values`` (changed in place) that restarts where
    ``first`` is set: a segmented scan by doubling, ``log2`` of the longest
    segment steps.  Each step goes a chunk at a time from the top, so the
    entries it reads below are still the previous step's."""
    segment = np.cumsum(first, dtype=ORDINAL)
    shift = 1
    while shift < len(values):
        spread = False
        for hi in range(len(values), shift, -CHUNK):
            lo = max(hi - CHUNK, shift)
            same = segment[lo:hi] == segment[lo - shift:hi - shift]
            if same.any():
                spread = True
                np.maximum(values[lo:hi], np.where(same, values[lo - shift:hi - shift], -np.inf), out=values[lo:hi])
        if not spread:
            return values
        shift *= 2
    return values


class Runs:
    """Label runs as parallel numpy columns: lane, label, start, end.

    Filled in place up to a capacity given first (an upper bound: pages never
    written are never resident), then cut to the runs made.
    """

    def __init__(self, capacity: int = 0) -> None:
        self.lane = np.empty(capacity, ORDINAL)
        self.label = np.empty(capacity, ORDINAL)
        self.start = np.empty(capacity)
        self.end = np.empty(capacity)
        self._count = 0

    def extend(self, lane: np.ndarray, label: np.ndarray, start: np.ndarray, end: np.ndarray) -> None:
        """Append runs (within the capacity)."""
        lo, hi = self._count, self._count + len(lane)
        self.lane[lo:hi], self.label[lo:hi], self.start[lo:hi], self.end[lo:hi] = lane, label, start, end
        self._count = hi

    def close(self) -> Runs:
        """Cut the columns to the runs made; returns self."""
        self.lane, self.label, self.start, self.end = (column[:self._count] for column in
                                                       (self.lane, self.label, self.start, self.end))
        return self

    def rows(self) -> Iterator[tuple[int, int, float, float]]:
        """(lane, label, start, end) of each run as Python numbers, a chunk at a time."""
        for lo in range(0, len(self), CHUNK):
            yield from zip(*(column[lo:lo + CHUNK].tolist() for column in (self.lane, self.label, self.start, self.end)))

    def __len__(self) -> int:
        return self._count


def label_runs(order: np.ndarray, lanes: np.ndarray, labels: np.ndarray, starts: np.ndarray,
               ends: np.ndarray) -> Runs:
    """Runs of lane-neighbouring slices that carry the same label.

    ``order`` is the (start, end, ordinal) order of :func:`start_order`;
    ``labels[ordinal]`` is a label id or -1 for none (which breaks a run).
    A run starts at its first slice and ends at the latest end of its
    slices.  Runs come in the order a sweep of ``order`` closes them: at the
    next slice of their lane; the runs still open at the end follow in the
    order they opened.

    The sweep goes a chunk of ``order`` at a time: each lane's open run is
    carried into the next chunk as a first entry of its lane there, so
    that every chunk is grouped by lane, cut into runs and closed alike.
    """
    runs = Runs(int(np.count_nonzero(labels >= 0)))  # every run holds a labelled slice
    carried = [np.empty(0, ORDINAL), np.empty(0, ORDINAL), np.empty(0), np.empty(0), np.empty(0, np.int64)]
    for lo in range(0, len(order), CHUNK):
        items = order[lo:lo + CHUNK]
        entries = [np.concatenate((open_runs, column)) for open_runs, column in
                   zip(carried, (lanes[items], labels[items], starts[items], ends[items], np.arange(lo, lo + len(items))))]
        by_lane = np.argsort(entries[0], kind="stable")
        lane, label, start, end, position = (column[by_lane] for column in entries)
        del entries, by_lane
        new_lane = np.ones(len(lane), bool)
        new_lane[1:] = lane[1:] != lane[:-1]
        changed = new_lane.copy()
        changed[1:] |= label[1:] != label[:-1]
        labelled = label >= 0
        heads = np.flatnonzero(labelled & changed)
        after = np.flatnonzero(labelled & np.append(changed[1:], True)) + 1  # the entry after each run
        labelled_at = np.flatnonzero(labelled)
        run_ends = np.maximum.reduceat(end[labelled_at], np.searchsorted(labelled_at, heads)) if heads.size else end[:0]
        closed = after < len(lane)
        closed[closed] = ~new_lane[after[closed]]
        swept = np.argsort(position[after[closed]])  # closed where the sweep meets the next slice of the lane
        closed_heads = heads[closed][swept]
        runs.extend(lane[closed_heads], label[closed_heads], start[closed_heads], run_ends[closed][swept])
        still_open = heads[~closed]
        carried = [lane[still_open], label[still_open], start[still_open], run_ends[~closed], position[still_open]]
    opened = np.argsort(carried[4])
    runs.extend(*(column[opened] for column in carried[:4]))
    return runs.close()
