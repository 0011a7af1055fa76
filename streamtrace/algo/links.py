"""Launch -> GPU event links keyed by (rank, correlation), in linear time.

Correlation ids restart in every rank, so a merged trace holds K launches
per id.  Each rank gets its own id table (a dense array indexed by
``id - min`` when the ids are dense, as Kineto numbers them; a sorted array
searched by bisection otherwise), and each GPU event looks up its own rank's
table once: one launcher or none (an orphan, launched before the capture
window).  A graph launch thereby gets exactly its own rank's GPU events, and
the work is one lookup per GPU event whatever K is.

Events of an ambiguous pid (several ranks claim it) form their own bucket:
they may link only where the id is used by a single launch in the whole
file; :func:`ambiguous_collisions` finds the ids for which that fails.
"""
from __future__ import annotations

from array import array
from bisect import bisect_left
from dataclasses import dataclass

import numpy as np

from .rankmap import AMBIGUOUS

NO_LAUNCH = -1
DENSE_SLACK = 4  # a table may be this many times sparser than its ids and stay dense


class IdTable:
    """Correlation id -> first launch ordinal with that id, for one bucket."""

    def __init__(self, ids: array, ordinals: array, *, note_duplicates: bool = False) -> None:
        self.duplicates = 0
        self.duplicate_ids: set[int] = set()
        note = self.duplicate_ids.add if note_duplicates else None
        self.size = len(ids)
        low = min(ids) if ids else 0
        span = (max(ids) - low + 1) if ids else 0
        self._low = low
        if span <= DENSE_SLACK * len(ids) + 4096:
            table = array("i", [NO_LAUNCH]) * span
            for correlation, ordinal in zip(ids, ordinals):
                at = correlation - low
                if table[at] == NO_LAUNCH:
                    table[at] = ordinal
                else:
                    self.duplicates += 1
                    if note is not None:
                        note(correlation)
            self._dense: array | None = table
        else:
            order = sorted(range(len(ids)), key=ids.__getitem__)
            self._keys = array("q", (ids[i] for i in order))
            self._values = array("i", (ordinals[i] for i in order))
            self._dense = None
            repeated = [a for a, b in zip(self._keys, self._keys[1:]) if a == b]
            self.duplicates = len(repeated)
            if note is not None:
                self.duplicate_ids.update(repeated)

    def get(self, correlation: int) -> int:
        """The launch ordinal for ``correlation``, or NO_LAUNCH."""
        if self._dense is not None:
            at = correlation - self._low
            return self._dense[at] if 0 <= at < len(self._dense) else NO_LAUNCH
        at = bisect_left(self._keys, correlation)
        if at < len(self._keys) and self._keys[at] == correlation:
            return self._values[at]
        return NO_LAUNCH

    def get_many(self, ids: np.ndarray) -> np.ndarray:
        """:meth:`get` for many ids at once (int64 in, int32 out)."""
        out = np.full(len(ids), NO_LAUNCH, dtype=np.int32)
        if self._dense is not None:
            if len(self._dense):
                table = np.frombuffer(self._dense, dtype=np.int32)
                at = ids - self._low
                inside = (at >= 0) & (at < len(table))
                out[inside] = table[at[inside]]
            return out
        if len(self._keys):
            keys = np.frombuffer(self._keys, dtype=np.int64)
            at = np.minimum(np.searchsorted(keys, ids), len(keys) - 1)
            found = keys[at] == ids
            out[found] = np.frombuffer(self._values, dtype=np.int32)[at[found]]
        return out


def build_tables(launch_bucket: array, launch_id: array) -> dict[int, IdTable]:
    """One id table per bucket (rank, UNKNOWN or AMBIGUOUS)."""
    ids: dict[int, array] = {}
    ordinals: dict[int, array] = {}
    for ordinal, (bucket, correlation) in enumerate(zip(launch_bucket, launch_id)):
        if bucket not in ids:
            ids[bucket], ordinals[bucket] = array("q"), array("i")
        ids[bucket].append(correlation)
        ordinals[bucket].append(ordinal)
    return {bucket: IdTable(ids[bucket], ordinals[bucket], note_duplicates=bucket == AMBIGUOUS) for bucket in ids}


@dataclass
class Links:
    """The launch of every GPU event (NO_LAUNCH for orphans)."""

    launch_of_gpu: array
    orphans: int
    duplicate_launch_ids: int  # launches whose (rank, id) an earlier launch already had


def link(tables: dict[int, IdTable], gpu_bucket: array, gpu_id: array, no_id: int) -> Links:
    """Give each GPU event its launch: its own bucket first, then the ambiguous one.

    A GPU event of an ambiguous pid links to the single launch of its id
    anywhere (callers have checked with :func:`ambiguous_collisions` that
    there is at most one).  The lookups run per bucket over numpy columns
    (:meth:`IdTable.get_many`): GPU events are millions, buckets a few.
    """
    buckets, ids = np.frombuffer(gpu_bucket, dtype=np.int32), np.frombuffer(gpu_id, dtype=np.int64)
    found = np.full(len(ids), NO_LAUNCH, dtype=np.int32)
    with_id = np.flatnonzero(ids != no_id)
    by_bucket = with_id[np.argsort(buckets[with_id], kind="stable")]
    bucket_values, firsts = np.unique(buckets[by_bucket], return_index=True)
    bounds = np.append(firsts, len(by_bucket)).tolist()
    for n, bucket in enumerate(bucket_values.tolist()):
        table = tables.get(bucket)
        if table is not None and bucket != AMBIGUOUS:
            members = by_bucket[bounds[n]:bounds[n + 1]]
            found[members] = table.get_many(ids[members])
    shared = tables.get(AMBIGUOUS)
    if shared is not None:
        _fill(found, ids, with_id[(buckets[with_id] != AMBIGUOUS) & (found[with_id] == NO_LAUNCH)], shared)
    ambiguous = with_id[buckets[with_id] == AMBIGUOUS]
    for table in tables.values():  # an ambiguous pid's event: the first table holding its id
        _fill(found, ids, ambiguous[found[ambiguous] == NO_LAUNCH], table)
    launch_of_gpu = array("i", found.tobytes())
    orphans = int(np.count_nonzero(found == NO_LAUNCH))
    return Links(launch_of_gpu, orphans, sum(table.duplicates for table in tables.values()))


def _fill(found: np.ndarray, ids: np.ndarray, members: np.ndarray, table: IdTable) -> None:
    """``found[members]`` from ``table``, where it has their ids."""
    if len(members):
        looked_up = table.get_many(ids[members])
        hit = looked_up != NO_LAUNCH
        found[members[hit]] = looked_up[hit]


def ambiguous_collisions(tables: dict[int, IdTable], ids: array, limit: int = 5) -> list[int]:
    """Ids of an ambiguous pid's events that more than one launch carries (first few)."""
    found: list[int] = []
    for correlation in ids:
        holders = sum(1 + (correlation in table.duplicate_ids) for table in tables.values()
                      if table.get(correlation) != NO_LAUNCH)
        if holders > 1:
            found.append(correlation)
            if len(found) >= limit:
                break
    return found
