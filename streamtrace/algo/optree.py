"""The op tree of TraceLens's ``TreePerf``: host events nested by time per
thread, GPU events hung under the runtime call that launched them, and the
interval arithmetic its tables use (unions of kernel intervals in float64,
summed left to right as Python's ``sum`` does).

Pure functions over typed arrays; docs/analyze.md states each rule and the
accidents kept.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import numpy as np

from .columns import slice_positions

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


TREE_BLOCK = 1 << 16  # host events taken per block (their times as Python floats for the walk)


def host_tree(thread: np.ndarray, ts: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Parent (an index into the arrays, or ``NO_PARENT``) of each host event,
    whether it is in the tree, and the order the events were taken in.

    Events are taken by start time (ties in array order) with a stack per
    thread: entries that ended at or before the start are popped; an event
    that starts inside the top but ends after it is hung beside it when the
    overlap is under 1 µs and the top has a parent, and otherwise left out of
    the tree (no parent, never a parent): TraceLens's rules.  The walk reads
    a block of events at a time and its stacks hold (event, end) pairs, so
    that its Python objects are a block's and the nesting depth's.
    """
    parent = np.full(len(ts), NO_PARENT, dtype=np.int64)
    in_tree = np.zeros(len(ts), dtype=bool)
    stacks: dict[int, list[tuple[int, float]]] = {}
    order = np.argsort(ts, kind="stable")
    for lo in range(0, len(order), TREE_BLOCK):
        block = order[lo:lo + TREE_BLOCK]
        parents = [NO_PARENT] * len(block)  # (lists while walking: a numpy item set costs more)
        kept = [False] * len(block)
        for at, (i, thread_of, start, finish) in enumerate(zip(block.tolist(), thread[block].tolist(),
                                                               ts[block].tolist(), end[block].tolist())):
            stack = stacks.setdefault(thread_of, [])
            while stack and start >= stack[-1][1]:
                stack.pop()
            if stack and finish > stack[-1][1]:
                if stack[-1][1] - start < BLEED_TOLERANCE_US and len(stack) >= 2:
                    stack.pop()
                else:
                    continue
            if stack:
                parents[at] = stack[-1][0]
            kept[at] = True
            stack.append((i, finish))
        parent[block] = parents
        in_tree[block] = kept
    return parent, in_tree, order


NO_LINK = -(1 << 63)


def launch_links(calls: np.ndarray, call_link: np.ndarray, call_graph: np.ndarray, gpu_link: np.ndarray,
                 gpu_place: np.ndarray, flow_starts: np.ndarray, flow_ends: np.ndarray, flow_end_places: np.ndarray,
                 settle: Callable[[], None] = lambda: None) -> tuple[np.ndarray, np.ndarray]:
    """TraceLens's kernel-to-launch links as (runtime call, GPU event) pairs,
    by call then GPU event order.

    ``calls``: the runtime calls (host events, ascending), ``call_link``
    each one's id (``NO_LINK`` for none), ``call_graph`` whether it is a
    graph launch; a graph launch takes every GPU event of its id, another
    call the GPU event at its flow's end: the last flow end of that id must
    exist, as a flow start of it, and the GPU event is the last one of that
    id at the end's place (pid, tid). ``settle`` is called once an input
    has been read for the last time (the caller may give back its pages).
    """
    by_link = np.flatnonzero(gpu_link != NO_LINK)
    by_link = by_link[np.argsort(gpu_link[by_link], kind="stable")]  # (the linked GPU events by id, then event order)
    sorted_links = gpu_link[by_link]
    settle()
    runs: list[np.ndarray] = []
    gpus: list[np.ndarray] = []
    graph = call_graph & (call_link != NO_LINK)
    eager = ~call_graph & (call_link != NO_LINK)
    for r, link in zip(calls[graph].tolist(), call_link[graph].tolist()):
        lo, hi = np.searchsorted(sorted_links, link, "left"), np.searchsorted(sorted_links, link, "right")
        gpus.append(by_link[lo:hi])
        runs.append(np.full(hi - lo, r, dtype=np.int64))
    calls, wanted = calls[eager], call_link[eager]
    asked = np.unique(wanted)
    ends, end_places = _last_flow_ends(asked, flow_ends, flow_end_places)
    settle()
    at = np.minimum(np.searchsorted(ends, wanted), len(ends) - 1) if len(ends) else np.zeros(len(wanted), np.int64)
    ok = np.isin(wanted, flow_starts) & (ends[at] == wanted) if len(ends) else np.zeros(len(wanted), dtype=bool)
    calls, wanted, places = calls[ok], wanted[ok], end_places[at[ok]]
    del ends, end_places, at, ok
    # the last GPU event of each (id, place), among the GPU events of the ids asked for (graph kernels are not)
    lo, hi = np.searchsorted(sorted_links, asked, "left"), np.searchsorted(sorted_links, asked, "right")
    among = slice_positions(lo, hi - lo)
    by_link, sorted_links = by_link[among], sorted_links[among]
    del asked, lo, hi, among
    width = int(max(gpu_place.max(initial=0), places.max(initial=0))) + 1
    keys, owners, links = _last_by_place(sorted_links, by_link, gpu_place, width)
    del by_link, sorted_links
    rank = np.minimum(np.searchsorted(links, wanted), max(len(links) - 1, 0))
    query = rank * width + places
    at = np.minimum(np.searchsorted(keys, query), len(keys) - 1) if len(keys) else np.zeros(len(query), np.int64)
    found = (links[rank] == wanted) & (keys[at] == query) if len(keys) else np.zeros(len(query), dtype=bool)
    runs.append(calls[found])
    gpus.append(owners[at[found]])
    del links, keys, owners, query, at, found, rank
    eager_run, eager_gpu = runs.pop(), gpus.pop()
    graph_run, graph_gpu = np.concatenate([np.empty(0, np.int64), *runs]), np.concatenate([np.empty(0, np.int64), *gpus])
    del runs, gpus
    # the two lists, each by call, merged by call (no call is in both): each link's place in the merged one
    run = np.empty(len(graph_run) + len(eager_run), dtype=np.int64)
    gpu = np.empty(len(run), dtype=np.int64)
    to = np.searchsorted(eager_run, graph_run) + np.arange(len(graph_run))
    run[to], gpu[to] = graph_run, graph_gpu
    to = np.searchsorted(graph_run, eager_run) + np.arange(len(eager_run))
    run[to], gpu[to] = eager_run, eager_gpu
    return run, gpu


def _last_flow_ends(asked: np.ndarray, flow_ends: np.ndarray, flow_end_places: np.ndarray,
                    ) -> tuple[np.ndarray, np.ndarray]:
    """The ids of ``asked`` (sorted, distinct) that have a flow end, and the place of each one's last, in
    flow order; only the flow ends of those ids are sorted."""
    at = np.searchsorted(asked, flow_ends)
    np.minimum(at, len(asked) - 1, out=at)
    mine = np.flatnonzero(asked[at] == flow_ends) if len(asked) else np.empty(0, np.int64)
    del at
    ends, last = np.unique(flow_ends[mine][::-1], return_index=True)
    return ends, flow_end_places[mine][::-1][last]


def _last_by_place(sorted_links: np.ndarray, by_link: np.ndarray, gpu_place: np.ndarray, width: int,
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The last GPU event of each (id, place), as sorted keys (the id's rank among the distinct ids times
    ``width``, plus the place), their GPU events, and the distinct ids. ``by_link``: the linked
    GPU events by id, then event order (``sorted_links`` their ids), so that a stable sort of the keys
    keeps event order within each key; a few arrays of the linked GPU events are held at once."""
    if not len(by_link):
        return np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, sorted_links.dtype)
    new_id = np.empty(len(sorted_links), dtype=bool)
    new_id[0] = True
    np.not_equal(sorted_links[1:], sorted_links[:-1], out=new_id[1:])
    links = sorted_links[new_id]
    key = np.cumsum(new_id, dtype=np.int64)
    del new_id
    key -= 1
    key *= width
    key += gpu_place[by_link]
    order = np.argsort(key, kind="stable")
    key, owner = key[order], by_link[order]
    del order
    last = np.empty(len(key), dtype=bool)
    last[-1] = True
    np.not_equal(key[1:], key[:-1], out=last[:-1])
    return key[last], owner[last], links


def last_parent(run: np.ndarray, gpu: np.ndarray, count: int) -> np.ndarray:
    """Each GPU event's runtime call: the last link to it (``NO_PARENT`` if none); the links by call, as
    :func:`launch_links` gives them, so the last link to an event is the one of the greatest call."""
    parent = np.full(count, NO_PARENT, dtype=np.int64)
    np.maximum.at(parent, gpu, run)
    return parent


def merged(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The union of intervals as sorted disjoint ones (touching ones merge)."""
    if len(starts) == 0:
        return starts, ends
    order = np.argsort(starts, kind="stable")
    s, reach = starts[order], ends[order]
    del order
    np.maximum.accumulate(reach, out=reach)
    first = np.ones(len(s), dtype=bool)
    first[1:] = s[1:] > reach[:-1]
    heads = np.flatnonzero(first)
    lasts = np.append(heads[1:], len(s)) - 1
    return s[heads], reach[lasts]


def left_sum(values: np.ndarray) -> float:
    """Sum left to right (Python's ``sum`` on floats), not numpy's pairwise."""
    return float(np.cumsum(values)[-1]) if len(values) else 0.0


def busy_of(starts: list[float], ends: list[float]) -> float:
    """:func:`busy` for a few intervals, in plain Python (the same arithmetic)."""
    if len(starts) == 1:
        return ends[0] - starts[0]
    total = 0.0
    last_start = last_end = None
    for start, end in sorted(zip(starts, ends), key=lambda pair: pair[0]):
        if last_end is not None and start <= last_end:
            last_end = max(last_end, end)
            continue
        if last_end is not None:
            total += last_end - last_start
        last_start, last_end = start, end
    return total + (last_end - last_start)


SMALL_GROUP = 32  # merged intervals a group adds column-wise (more: its own left-to-right cumsum)


def busy_groups(group: np.ndarray, starts: np.ndarray, ends: np.ndarray, count: int) -> np.ndarray:
    """:func:`busy_of` of many groups of intervals at once (``group``: each interval's group, 0 to
    ``count - 1``; a group without one: 0.0), with the same arithmetic: per group the intervals by
    start, merged where one starts at or before the reach of those before, the merged lengths added
    left to right from 0.0."""
    totals = np.zeros(count, dtype=np.float64)
    if not len(group):
        return totals
    order = np.lexsort((starts, group))
    g, s, e = group[order].astype(np.int64), starts[order], ends[order]
    # the reach (running maximum of the ends) within each group: the ends themselves where they never go
    # down within a group, else by the ends' ranks offset by the group (in the groups where they do)
    reach = e
    down = (g[1:] == g[:-1]) & (e[1:] < e[:-1])
    if down.any():
        uneven = np.zeros(count, dtype=bool)
        uneven[g[1:][down]] = True
        rows = np.flatnonzero(uneven[g])
        values, rank = np.unique(e[rows], return_inverse=True)
        offset = g[rows] * len(values)
        reach = e.copy()
        reach[rows] = values[np.maximum.accumulate(offset + rank.reshape(-1)) - offset]
    head = np.ones(len(g), dtype=bool)
    head[1:] = (g[1:] != g[:-1]) | (s[1:] > reach[:-1])
    heads = np.flatnonzero(head)
    lengths = reach[np.append(heads[1:], len(g)) - 1] - s[heads]
    owner = g[heads]
    firsts = np.flatnonzero(np.r_[True, owner[1:] != owner[:-1]])
    sizes = np.diff(np.append(firsts, len(owner)))
    small = np.repeat(sizes <= SMALL_GROUP, sizes)
    position = np.arange(len(owner)) - np.repeat(firsts, sizes)
    by_position = np.flatnonzero(small)[np.argsort(position[small], kind="stable")]
    bounds = np.searchsorted(position[by_position], np.arange(SMALL_GROUP + 2))
    for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        if lo < hi:  # (each group once: its k-th merged interval added after its first k)
            at = by_position[lo:hi]
            totals[owner[at]] += lengths[at]
    for first, size in zip(firsts[sizes > SMALL_GROUP].tolist(), sizes[sizes > SMALL_GROUP].tolist()):
        totals[owner[first]] = np.cumsum(lengths[first:first + size])[-1]
    return totals


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
    return group_sums_kahan(codes, values, groups)


COLUMN_GROUPS = 16  # groups still adding rows for a column-wise step to pay (fewer: a loop per group)
SUM_BLOCK = 1 << 14  # a long group's rows turned into Python floats at a time
KAHAN_BLOCK = 1 << 16  # rows added to the groups' Kahan sums at a time


def group_sums_kahan(codes: np.ndarray, values: np.ndarray, groups: int) -> np.ndarray:
    """Per-group sums row by row, Kahan-compensated (pandas' Cython kernel).

    Each group's rows are added in row order, as the kernel adds them; the
    groups are independent, so the k-th row of every group is added at once
    while many groups have a k-th row, and the long groups' remaining rows by
    a plain loop per group: the same operations on the same floats.  The
    rows are taken a block at a time, each group's sum and compensation
    carried from block to block (its rows still added in row order)."""
    total = np.zeros(groups, dtype=np.float64)
    comp = np.zeros(groups, dtype=np.float64)
    for lo in range(0, len(codes), KAHAN_BLOCK):
        block = codes[lo:lo + KAHAN_BLOCK]
        kept = block >= 0
        _kahan_block(block[kept].astype(np.int64), values[lo:lo + KAHAN_BLOCK][kept].astype(np.float64), total, comp)
    return total


def _kahan_block(codes: np.ndarray, values: np.ndarray, total: np.ndarray, comp: np.ndarray) -> None:
    """Add a block of rows to the groups' Kahan sums (``total``, ``comp``: updated in place)."""
    groups = len(total)
    if not len(codes):
        return
    by_group = np.argsort(codes, kind="stable")
    sizes = np.bincount(codes, minlength=groups)
    starts = np.cumsum(sizes) - sizes
    position = np.arange(len(codes))
    position -= np.repeat(starts, sizes)
    position[by_group] = position.copy()
    by_position = np.argsort(position, kind="stable")
    position = position[by_position]  # (sorted: where each k-th row begins)
    bounds = np.searchsorted(position, np.arange(int(sizes.max()) + 2)).tolist()
    del position
    step = 0
    while step + 1 < len(bounds) and bounds[step + 1] - bounds[step] >= COLUMN_GROUPS:
        at = by_position[bounds[step]:bounds[step + 1]]
        group = codes[at]
        y = values[at] - comp[group]
        t = total[group] + y
        c = t - total[group] - y
        c[np.isnan(c)] = 0.0
        comp[group], total[group] = c, t
        step += 1
    del by_position
    long_groups = np.flatnonzero(sizes > step).tolist()
    ordered = values[by_group] if long_groups else values
    for g in long_groups:
        sum_, compensation = float(total[g]), float(comp[g])
        end = int(starts[g] + sizes[g])
        for lo in range(int(starts[g]) + step, end, SUM_BLOCK):  # (a block of Python floats at a time)
            for value in ordered[lo:min(lo + SUM_BLOCK, end)].tolist():
                y = value - compensation
                t = sum_ + y
                c = t - sum_ - y
                compensation = 0.0 if c != c else c
                sum_ = t
        total[g], comp[g] = sum_, compensation


def descending(values: Sequence[float]) -> list[int]:
    """Row order of pandas' ``sort_values(ascending=False)`` on one float
    column (its default quicksort: ties are not kept in order beyond 16 rows)."""
    items = np.asarray(values, dtype=np.float64)[::-1]
    index = np.arange(len(items))[::-1]
    return index[items.argsort(kind="quicksort")][::-1].tolist()
