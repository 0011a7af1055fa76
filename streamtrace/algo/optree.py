"""The op tree of TraceLens's ``TreePerf``: host events nested by time per
thread, GPU events hung under the runtime call that launched them, and the
interval arithmetic its tables use (unions of kernel intervals in float64,
summed left to right as Python's ``sum`` does).

Pure functions over typed arrays; docs/analyze.md states each rule and the
accidents kept.
"""
from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

NO_PARENT = -1
# TraceLens's "event bleed" tolerance: a host event starting less than this
# before its would-be sibling ends is hung under the sibling's parent.
BLEED_TOLERANCE_US = 1.0
COMMUNICATION = re.compile(r"rccl|nccl|cross_device_reduce", re.IGNORECASE)
ROCM_LEGACY_MEMCPY = re.compile(r"^(MEMORY_COPY_(HOST_TO_DEVICE|DEVICE_TO_HOST|DEVICE_TO_DEVICE)"
                                r"|__amd_rocclr_copyBuffer(Rect)?(Aligned)?)(\.kd)?$")
ROCM_LEGACY_MEMSET = re.compile(r"^__amd_rocclr_fillBuffer(Aligned)?(\.kd)?$")


def is_communication(name: str) -> bool:
    """TraceLens's NCCL/RCCL test on a kernel name (a substring, any case)."""
    return bool(name) and COMMUNICATION.search(name) is not None


def nest_host_events(thread: np.ndarray, ts: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Parent (an index into the arrays, or ``NO_PARENT``) of each host event.

    Events are taken by start time (ties in array order) with a stack per
    thread: entries that ended at or before the start are popped; an event
    that starts inside the top but ends after it is hung beside it when the
    overlap is under 1 µs and the top has a parent, and otherwise left out of
    the tree (no parent, never a parent): TraceLens's rules.
    """
    parent = np.full(len(ts), NO_PARENT, dtype=np.int64)
    stacks: dict[int, list[int]] = {}
    ts_list, end_list, thread_list = ts.tolist(), end.tolist(), thread.tolist()
    for i in np.argsort(ts, kind="stable").tolist():
        stack = stacks.setdefault(thread_list[i], [])
        start = ts_list[i]
        while stack and start >= end_list[stack[-1]]:
            stack.pop()
        if stack and end_list[i] > end_list[stack[-1]]:
            if end_list[stack[-1]] - start < BLEED_TOLERANCE_US and len(stack) >= 2:
                stack.pop()
            else:
                continue
        if stack:
            parent[i] = stack[-1]
        stack.append(i)
    return parent


def merged(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The union of intervals as sorted disjoint ones (touching ones merge)."""
    if len(starts) == 0:
        return starts, ends
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    reach = np.maximum.accumulate(e)
    first = np.ones(len(s), dtype=bool)
    first[1:] = s[1:] > reach[:-1]
    heads = np.flatnonzero(first)
    lasts = np.append(heads[1:], len(s)) - 1
    return s[heads], reach[lasts]


def left_sum(values: np.ndarray) -> float:
    """Sum left to right (Python's ``sum`` on floats), not numpy's pairwise."""
    return float(np.cumsum(values)[-1]) if len(values) else 0.0


def busy(starts: np.ndarray, ends: np.ndarray) -> float:
    """Length of the union of the intervals, as TraceLens sums it."""
    s, e = merged(starts, ends)
    return left_sum(e - s)


def subtract(cut: tuple[np.ndarray, np.ndarray], base: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """``base`` minus ``cut``, both sorted disjoint intervals (TraceLens's
    ``subtract_intervalsA_from_B``)."""
    cut_s, cut_e = cut[0].tolist(), cut[1].tolist()
    out_s: list[float] = []
    out_e: list[float] = []
    a = 0
    for b_start, b_end in zip(base[0].tolist(), base[1].tolist()):
        current = b_start
        while a < len(cut_s) and cut_e[a] <= b_start:
            a += 1
        k = a
        while k < len(cut_s) and cut_s[k] < b_end:
            if cut_s[k] > current:
                out_s.append(current)
                out_e.append(min(b_end, cut_s[k]))
            current = max(current, cut_e[k])
            if current >= b_end:
                break
            k += 1
        if current < b_end:
            out_s.append(current)
            out_e.append(b_end)
    return np.array(out_s, dtype=np.float64), np.array(out_e, dtype=np.float64)


def timeline(starts: np.ndarray, ends: np.ndarray, kind: np.ndarray) -> dict[str, float]:
    """TraceLens's GPU timeline breakdown (µs) of linked GPU events; ``kind``
    is 0 computation, 1 communication, 2 memcpy."""
    comp = merged(starts[kind == 0], ends[kind == 0])
    comm = merged(starts[kind == 1], ends[kind == 1])
    memcpy = merged(starts[kind == 2], ends[kind == 2])
    every = merged(starts, ends)
    total = float(every[1][-1] - every[0][0])
    exposed_comm = subtract(comp, comm)
    exposed_memcpy = subtract(comm, subtract(comp, memcpy))
    busy_time = left_sum(every[1] - every[0])
    return {
        "computation_time": left_sum(comp[1] - comp[0]),
        "exposed_comm_time": left_sum(exposed_comm[1] - exposed_comm[0]),
        "exposed_memcpy_time": left_sum(exposed_memcpy[1] - exposed_memcpy[0]),
        "busy_time": busy_time,
        "idle_time": total - busy_time,
        "total_time": total,
        "total_comm_time": left_sum(comm[1] - comm[0]),
        "total_memcpy_time": left_sum(memcpy[1] - memcpy[0]),
    }


def group_sums(codes: np.ndarray, values: np.ndarray, groups: int) -> np.ndarray:
    """Per-group sums as pandas 3.1's grouped ``sum`` and ``mean`` take them.

    ``codes``: each row's group number in pandas' group order (-1: a row whose
    key is dropped).  When the codes never decrease down the rows, pandas adds
    each group's rows with ``np.add.reduceat`` (the first row, then numpy's
    pairwise sum of the rest); otherwise row by row, Kahan-compensated.
    """
    sums = np.zeros(groups, dtype=np.float64)
    if len(codes) and np.all(codes[1:] >= codes[:-1]):
        kept = codes >= 0
        codes, values = codes[kept], values[kept]
        if len(codes):
            starts = np.flatnonzero(np.r_[True, codes[1:] != codes[:-1]])
            sums[codes[starts]] = np.add.reduceat(values, starts)
        return sums
    compensation = np.zeros(groups, dtype=np.float64)
    total, comp = sums.tolist(), compensation.tolist()
    for code, value in zip(codes.tolist(), values.tolist()):
        if code < 0:
            continue
        y = value - comp[code]
        t = total[code] + y
        c = t - total[code] - y
        comp[code] = 0.0 if c != c else c
        total[code] = t
    return np.array(total, dtype=np.float64)


def descending(values: Sequence[float]) -> list[int]:
    """Row order of pandas' ``sort_values(ascending=False)`` on one float
    column (its default quicksort: ties are not kept in order beyond 16 rows)."""
    items = np.asarray(values, dtype=np.float64)[::-1]
    index = np.arange(len(items))[::-1]
    return index[items.argsort(kind="quicksort")][::-1].tolist()
