"""A rank's collective kernels ordered by group, then start, then file position, beyond memory: under a
budget one sort in memory; beyond it, on disk, so that what the order holds in memory is a block of kernels
whatever their number.

On disk the kernels are first laid out by group (a stable counting sort: the groups' sizes are known), each
kernel as its start's sort key and its file position; a group whose starts already rise (kernels of one
process group run on one stream, so they usually do) is done, else it is split by ranges of starts (a stable
scatter, again) until each piece fits the budget and is sorted in memory.  Every move keeps file order among
equal starts, so the order is the in-memory sort's exactly."""
from __future__ import annotations

import os
import tempfile
from typing import Callable

import numpy as np

from ..algo import collectives
from ..algo.collectives import group_firsts, order_in_memory
from .scratch import spool_writes

SORT_BYTES = 32 << 20
"""Kernels of one rank ordered in memory (:data:`KERNEL_SORT_BYTES` each while sorted); beyond, on disk (tests
lower it)."""
KERNEL_SORT_BYTES = 32  # a kernel in the sort in memory: its group, start, 64-bit sort position, order and place
PIECE_BYTES = 24  # a kernel in a piece sorted in memory: its key (twice) and its 64-bit sort position
SPLITS = 64  # the ranges a piece too large is split into
NAN_KEY = np.uint64(2**64 - 1)  # (numpy sorts NaN last)


class DiskOrder:
    """:class:`~streamtrace.algo.collectives.Orderer`: in memory up to ``budget`` bytes a rank, else through
    temporary files in ``directory`` (deleted when the memory maps returned are let go)."""

    def __init__(self, directory: str | None = None, budget: int | None = None) -> None:
        self.directory = directory
        self.budget = SORT_BYTES if budget is None else budget
        self.spilled = 0  # ranks ordered on disk

    def __call__(self, count: int, keys: Callable[[int, int], tuple[np.ndarray, np.ndarray]],
                 sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if count * KERNEL_SORT_BYTES <= self.budget:
            return order_in_memory(count, keys, sizes)
        self.spilled += 1
        with spool_writes(self.directory or tempfile.gettempdir()):
            return self._on_disk(count, keys, sizes)

    def scratch(self, count: int, dtype: type) -> np.ndarray:
        """A writable array of ``count`` items: a memory map of an unnamed temporary file (deleted with it)."""
        if not count:
            return np.zeros(0, dtype)
        with spool_writes(self.directory or tempfile.gettempdir()), \
                tempfile.TemporaryFile(prefix="streamtrace-order-", dir=self.directory) as file:
            _reserve(file.fileno(), count * np.dtype(dtype).itemsize)
            return np.memmap(file, dtype=dtype, mode="r+", shape=(count,))  # (the map keeps the file)

    def _on_disk(self, count: int, keys: Callable, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        block = collectives.RECORD_BLOCK
        laid = (self.scratch(count, np.uint64), self.scratch(count, np.int32))
        spare = (self.scratch(count, np.uint64), self.scratch(count, np.int32))
        cursor = group_firsts(sizes).astype(np.int64)
        for first in range(0, count, block):
            group, ts = keys(first, first + block)
            _place(laid, cursor, group, sort_keys(ts), np.arange(first, first + len(group), dtype=np.int32))
        capacity = max(self.budget // PIECE_BYTES, block)  # (a block is held anyway)
        starts = group_firsts(sizes).astype(np.int64)
        for group in np.flatnonzero(sizes).tolist():
            _sort(laid, spare, int(starts[group]), int(starts[group] + sizes[group]), capacity, block)
        del spare
        order = laid[1]
        index = self.scratch(count, np.int32)
        ends = np.cumsum(sizes)
        for first in range(0, count, block):
            places = np.arange(first, min(first + block, count), dtype=np.int64)
            index[order[first:first + block]] = places - starts[np.searchsorted(ends, places, side="right")]
        return order, index


def _reserve(handle: int, size: int) -> None:
    """Give the file its size with its blocks allocated: a full disk is then an error here (ENOSPC), where a
    sparse file would make a later write through the memory map kill the process (SIGBUS)."""
    if hasattr(os, "posix_fallocate"):
        os.posix_fallocate(handle, 0, size)
    else:  # (macOS and Windows: no block reservation; the file is made sparse)
        os.ftruncate(handle, size)


def sort_keys(ts: np.ndarray) -> np.ndarray:
    """Starts as unsigned integers in numpy's float order (-0.0 as 0.0, every NaN last and equal); unsigned keys
    as they are."""
    if ts.dtype == np.uint64:
        return ts
    bits = (np.asarray(ts, dtype=np.float64) + 0.0).view(np.uint64)
    keys = np.where(bits >> np.uint64(63), ~bits, bits | np.uint64(1 << 63))
    keys[np.isnan(ts)] = NAN_KEY
    return keys


def _place(into: tuple[np.ndarray, np.ndarray], cursor: np.ndarray, ids: np.ndarray, keys: np.ndarray,
           positions: np.ndarray) -> None:
    """Kernels written at their bucket's cursor (``ids``: each one's bucket), in the order given (stable)."""
    order = np.argsort(ids, kind="stable")
    counts = np.bincount(ids, minlength=len(cursor))
    ordered = ids[order]
    places = cursor[ordered] + np.arange(len(ids)) - (np.cumsum(counts) - counts)[ordered]
    into[0][places], into[1][places] = keys[order], positions[order]
    cursor += counts


def _sort(laid: tuple[np.ndarray, np.ndarray], spare: tuple[np.ndarray, np.ndarray], low: int, high: int,
          capacity: int, block: int) -> None:
    """Order kernels ``low`` to ``high`` (in file order among equal keys) by key: pieces that fit ``capacity``
    sorted in memory, others left as they are if their keys rise, else split by ranges of keys."""
    keys, positions = laid
    pending = [(low, high)]
    while pending:
        low, high = pending.pop()
        if high - low <= capacity:
            piece = np.asarray(keys[low:high])
            order = np.argsort(piece, kind="stable")
            keys[low:high], positions[low:high] = piece[order], np.asarray(positions[low:high])[order]
            continue
        rising, least, most = _survey(keys, low, high, block)
        if rising:
            continue
        sample = np.unique(keys[low:high:max((high - low) // (SPLITS * 16), 1)])
        bounds = sample[np.linspace(0, len(sample) - 1, SPLITS + 1)[1:-1].astype(np.int64)]
        counts = _counts(keys, low, high, bounds, block)
        if counts.max() == high - low:  # (the sample fell in one range: halve the keys' span)
            bounds = np.array([least + (most - least) // np.uint64(2) + np.uint64(1)], np.uint64)  # (least below)
            counts = _counts(keys, low, high, bounds, block)
        cursor = low + np.cumsum(counts) - counts
        firsts = cursor.copy()
        for first in range(low, high, block):
            end = min(first + block, high)
            _place(spare, cursor, np.searchsorted(bounds, keys[first:end], side="right"), np.asarray(keys[first:end]),
                   np.asarray(positions[first:end]))
        for first in range(low, high, block):
            end = min(first + block, high)
            keys[first:end], positions[first:end] = spare[0][first:end], spare[1][first:end]
        pending += [(int(first), int(first + size)) for first, size in zip(firsts, counts) if size > 1]


def _survey(keys: np.ndarray, low: int, high: int, block: int) -> tuple[bool, np.uint64, np.uint64]:
    """Do the keys rise (or stay) from ``low`` to ``high``; their least and greatest."""
    rising, least, most, last = True, NAN_KEY, np.uint64(0), None
    for first in range(low, high, block):
        piece = np.asarray(keys[first:min(first + block, high)])
        rising = rising and bool(np.all(piece[1:] >= piece[:-1])) and (last is None or piece[0] >= last)
        least, most, last = min(least, piece.min()), max(most, piece.max()), piece[-1]
    return rising, least, most


def _counts(keys: np.ndarray, low: int, high: int, bounds: np.ndarray, block: int) -> np.ndarray:
    """How many keys fall in each range ``bounds`` cut."""
    counts = np.zeros(len(bounds) + 1, np.int64)
    for first in range(low, high, block):
        counts += np.bincount(np.searchsorted(bounds, keys[first:min(first + block, high)], side="right"),
                              minlength=len(counts))
    return counts
