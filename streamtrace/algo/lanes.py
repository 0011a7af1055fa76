"""Lane algorithms for ``compact`` (pure functions over typed arrays).

Slices are addressed by their ordinal; starts and ends live in ``array('d')``.
Orders and partitions are ``array('i')`` so that millions of slices cost a
few bytes each, not a Python object each.
"""
from __future__ import annotations

import heapq
from array import array
from bisect import bisect_left
from typing import Iterable, Iterator, Sequence


def sorted_runs(starts: Sequence[float], ends: Sequence[float], keys: Sequence[int],
                key_count: int) -> tuple[array, list[int]]:
    """Ordinals grouped by key (a stream), each group in (start, end, ordinal) order.

    A stream's slices nearly always come in time order already, so most groups
    need only a check; the few that do not are sorted on their own.  This keeps
    the memory of ordering millions of slices in typed arrays.
    """
    perm, offsets = partition(range(len(starts)), keys, key_count)
    for key in range(key_count):
        lo, hi = offsets[key], offsets[key + 1]
        if not _in_time_order(perm, lo, hi, starts, ends):
            perm[lo:hi] = array("i", sorted(perm[lo:hi], key=lambda item: (starts[item], ends[item], item)))
    return perm, offsets


def _in_time_order(perm: Sequence[int], lo: int, hi: int, starts: Sequence[float], ends: Sequence[float]) -> bool:
    previous = (float("-inf"), float("-inf"))
    for position in range(lo, hi):
        item = perm[position]
        current = (starts[item], ends[item])
        if current < previous:
            return False
        previous = current
    return True


IN_MEMORY_SORT_LIMIT = 600_000


def merge_runs(perm: array, offsets: list[int], starts: Sequence[float], ends: Sequence[float]) -> array:
    """All ordinals in (start, end, ordinal) order.

    Up to ``IN_MEMORY_SORT_LIMIT`` ordinals a C sort is fastest; beyond, its
    Python lists (~100 bytes an ordinal) would dominate memory, so the sorted
    runs are merged k-way instead.
    """
    if len(perm) <= IN_MEMORY_SORT_LIMIT:
        by_end = sorted(sorted(perm), key=ends.__getitem__)
        return array("i", sorted(by_end, key=starts.__getitem__))
    runs = [((starts[item], ends[item], item) for item in perm[offsets[key]:offsets[key + 1]])
            for key in range(len(offsets) - 1) if offsets[key + 1] > offsets[key]]
    return array("i", (entry[2] for entry in heapq.merge(*runs)))


def partition(order: Sequence[int], keys: Sequence[int], key_count: int) -> tuple[array, list[int]]:
    """Stable counting sort of ``order`` by ``keys``; returns (permutation, offsets).

    Members with key k are ``perm[offsets[k]:offsets[k + 1]]``, still in
    ``order``'s order.
    """
    counts = [0] * (key_count + 1)
    for item in order:
        counts[keys[item] + 1] += 1
    for key in range(key_count):
        counts[key + 1] += counts[key]
    offsets = counts[:]
    perm = array("i", bytes(4 * len(order)))
    for item in order:
        key = keys[item]
        perm[counts[key]] = item
        counts[key] += 1
    return perm, offsets


def pack_lanes(order: Sequence[int], starts: Sequence[float], ends: Sequence[float], lanes: array) -> int:
    """Interval partitioning: give each slice in ``order`` the lowest free lane.

    ``order`` must be sorted by start.  A lane is free again once its last
    slice ended at or before the next start (touching slices share a lane).
    Writes ``lanes[ordinal]`` and returns the number of lanes used.
    """
    busy: list[tuple[float, int]] = []
    free: list[int] = []
    used = 0
    for item in order:
        start = starts[item]
        while busy and busy[0][0] <= start:
            heapq.heappush(free, heapq.heappop(busy)[1])
        if free:
            lane = heapq.heappop(free)
        else:
            lane = used
            used += 1
        lanes[item] = lane
        heapq.heappush(busy, (ends[item], lane))
    return used


def first_overlap(order: Sequence[int], starts: Sequence[float], ends: Sequence[float],
                  lanes: Sequence[int]) -> int | None:
    """A slice that overlaps the previous slice of its lane, or None.

    An independent check of :func:`pack_lanes`: walking in start order, each
    slice must start at or after the end of its lane's previous slice.
    """
    last_end: dict[int, float] = {}
    for item in order:
        lane = lanes[item]
        if starts[item] < last_end.get(lane, float("-inf")):
            return item
        last_end[lane] = max(last_end.get(lane, float("-inf")), ends[item])
    return None


def nearest_in_run(perm: Sequence[int], perm_starts: Sequence[float], lo: int, hi: int, starts: Sequence[float],
                   ends: Sequence[float], ts: float) -> int:
    """The slice of the start-sorted run ``perm[lo:hi]`` nearest to time ``ts``.

    ``perm_starts[k]`` is ``starts[perm[k]]`` (so bisect needs no key).  A
    slice containing ``ts`` is at distance 0; otherwise the distance is to its
    nearer edge.  Ties go to the earlier slice.
    """
    at = bisect_left(perm_starts, ts, lo, hi)
    best, best_distance = perm[lo], float("inf")
    for position in range(max(at - 1, lo), min(at + 2, hi)):
        item = perm[position]
        if starts[item] <= ts <= ends[item]:
            distance = 0.0
        else:
            distance = min(abs(ts - starts[item]), abs(ts - ends[item]))
        if distance < best_distance:
            best, best_distance = item, distance
    return best


def coalesce(items: Iterable[int], keys: Sequence[int], starts: Sequence[float],
             ends: Sequence[float]) -> Iterator[tuple[int, list[int], float, float]]:
    """Clusters of same-key spans that overlap or touch.

    Two C sorts (by start, then stably by key) put each key's spans in start
    order; one sweep then closes a cluster when the next span starts after
    its end.  The sorts cost ~70 bytes a span at their peak: above
    ``IN_MEMORY_SORT_LIMIT`` spans use :func:`coalesce_in_start_order`.
    Yields, for every cluster of two or more, ``(kept, removed, start,
    end)``: the member with the lowest ordinal is kept and stretched to the
    union; the others are removed.  (Yielded, not listed: with hundreds of
    thousands of clusters a list of them would be the plan's largest object.)
    """
    ordered = sorted(sorted(items, key=starts.__getitem__), key=keys.__getitem__)
    members: list[int] = []
    cluster_key, cluster_start, cluster_end = None, 0.0, 0.0
    for item in ordered:
        key, start, end = keys[item], starts[item], ends[item]
        if members and key == cluster_key and start <= cluster_end:
            members.append(item)
            if end > cluster_end:
                cluster_end = end
            continue
        if len(members) > 1:
            kept = min(members)
            yield kept, [other for other in members if other != kept], cluster_start, cluster_end
        members, cluster_key, cluster_start, cluster_end = [item], key, start, end
    if len(members) > 1:
        kept = min(members)
        yield kept, [other for other in members if other != kept], cluster_start, cluster_end


def coalesce_in_start_order(order: Iterable[int], keys: Sequence[int], starts: Sequence[float],
             ends: Sequence[float]) -> Iterator[tuple[int, list[int], float, float]]:
    """Clusters of same-key spans that overlap or touch.

    ``order`` must be in start order.  One sweep, holding only the clusters
    that can still grow (end not before the current start), so memory follows
    what is in flight, not the number of spans: for more spans than a sort
    of Python ints should hold (see :func:`merge_runs`).  Same result as
    :func:`coalesce`.  Yields, for every cluster of two or more, ``(kept,
    removed, start, end)``: the member with the lowest ordinal is kept and
    stretched to the union; the others are removed.
    """
    growing: dict[int, list] = {}
    closing: list[tuple[float, int]] = []

    def close(key: int) -> tuple[int, list[int], float, float] | None:
        members, start, end = growing.pop(key)
        if len(members) < 2:
            return None
        kept = min(members)
        return kept, [item for item in members if item != kept], start, end

    for item in order:
        start, end, key = starts[item], ends[item], keys[item]
        while closing and closing[0][0] < start:
            last_end, done = heapq.heappop(closing)
            if done in growing and growing[done][2] == last_end:
                closed = close(done)
                if closed is not None:
                    yield closed
        cluster = growing.get(key)
        if cluster is None:
            growing[key] = [[item], start, end]
            heapq.heappush(closing, (end, key))
            continue
        cluster[0].append(item)
        if end > cluster[2]:
            cluster[2] = end
            heapq.heappush(closing, (end, key))
    for key in list(growing):
        closed = close(key)
        if closed is not None:
            yield closed


class Runs:
    """Label runs as parallel typed arrays: lane, label, start, end."""

    def __init__(self) -> None:
        self.lane = array("i")
        self.label = array("i")
        self.start = array("d")
        self.end = array("d")

    def add(self, lane: int, label: int, start: float, end: float) -> None:
        self.lane.append(lane)
        self.label.append(label)
        self.start.append(start)
        self.end.append(end)

    def __len__(self) -> int:
        return len(self.lane)


def label_runs(order: Sequence[int], lanes: Sequence[int], labels: Sequence[int], starts: Sequence[float],
               ends: Sequence[float]) -> Runs:
    """Runs of lane-neighbouring slices that carry the same label.

    ``order`` is the start order; ``labels[ordinal]`` is a label id or -1 for
    none (which breaks a run).
    """
    open_runs: dict[int, list] = {}
    runs = Runs()
    for item in order:
        label = labels[item]
        lane = lanes[item]
        current = open_runs.get(lane)
        if current is not None and current[0] == label:
            current[2] = max(current[2], ends[item])
            continue
        if current is not None:
            runs.add(lane, *current)
            del open_runs[lane]
        if label >= 0:
            open_runs[lane] = [label, starts[item], ends[item]]
    for lane, current in open_runs.items():
        runs.add(lane, *current)
    return runs
