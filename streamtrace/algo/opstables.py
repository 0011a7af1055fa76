"""TraceLens's perf-report tables that need no performance model, from the
op tree of one trace: ``gpu_timeline``, ``ops_summary``,
``ops_summary_by_category``, ``ops_unique_args``, ``kernel_summary``,
``short_kernel_histogram`` and ``short_kernels_summary``, with TraceLens's
file stems, columns, row order and numbers (its pandas and numpy arithmetic
included: grouped sums by reduceat or Kahan, pairwise column sums, Welford's
std, quicksort ties).

docs/analyze.md states each rule, and the accidents kept.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from . import blockunique, optree
from .blockunique import unique_in_blocks
from .columns import slice_positions
from .opcategories import op_category

SHORT_KERNEL_US = 10
HISTOGRAM_BINS = 100
KERNEL, MEMCPY, MEMSET = 0, 1, 2
CPU_OP, RUNTIME = 0, 1
LAUNCHER_BLOCK = 1 << 15  # launchers whose subtree's GPU events are gathered at once
BUSY_BLOCK = 1 << 13  # groups of GPU events whose busy time is found at once
GRAPH_LAUNCHES = frozenset({"cudaGraphLaunch", "hipGraphLaunch"})
NA = None  # an empty cell (pandas' NaN / NA)


@dataclass
class Table:
    """A table as TraceLens writes it: header line(s), then rows."""

    header: list[list[str]]
    rows: list[list[object]] = field(default_factory=list)


@dataclass
class OpsFacts:
    """What the ops analysis keeps of one trace (arrays in event order).

    Host events (``cpu_op``, ``cuda_runtime``, ``cuda_driver``): ``h_*``;
    GPU events (``kernel``, ``gpu_memcpy``, ``gpu_memset``): ``g_*``.
    ``link_run``/``link_gpu``/``g_parent`` are filled by :func:`link`.
    """

    names: list[str]
    h_thread: np.ndarray
    h_ts: np.ndarray
    h_end: np.ndarray
    h_kind: np.ndarray
    h_name: np.ndarray
    h_sig: np.ndarray
    g_ts: np.ndarray
    g_end: np.ndarray
    g_dur: np.ndarray
    g_int: np.ndarray  # ts and dur both integers in the trace
    g_cat: np.ndarray
    g_name: np.ndarray
    g_stream: np.ndarray  # NaN when the event has none
    g_dur_int: np.ndarray  # dur an integer in the trace
    h_uid: np.ndarray  # the event's place in traceEvents (TraceLens's UID)
    h_seq: np.ndarray  # its autograd "Sequence number" (optree.NO_LINK: none)
    threads: list[tuple]  # (pid, tid) of each h_thread number
    metadata: dict[tuple, object]  # (pid, tid, process_name|process_labels|thread_name) -> value
    signatures: list[tuple[str | None, ...]]  # str() of Input Dims, Input type, Input Strides, Concrete Inputs
    signature_values: list[list]  # the same four lists and Output type as the trace gives them (None: absent)
    h_kernel: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))  # a call's args.kernel name, or -1
    link_run: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))  # (runtime call, GPU event) links
    link_gpu: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    g_parent: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    has_cpu_ops: bool = True
    python_stack: bool = False
    untimed: int = 0  # host and GPU events without a numeric ts or dur (left out)
    h_dur: np.ndarray = field(default_factory=lambda: np.empty(0))  # dur as the trace gives it
    h_dur_int: np.ndarray = field(default_factory=lambda: np.empty(0, bool))  # ... an integer there
    h_driver: np.ndarray = field(default_factory=lambda: np.empty(0, bool))  # a cuda_driver event
    events: int = 0  # traceEvents' length (TraceLens's next UID)
    # user annotations (CPU and GPU) by start, ties in event order: start, end, name number
    a_ts: np.ndarray = field(default_factory=lambda: np.empty(0))
    a_end: np.ndarray = field(default_factory=lambda: np.empty(0))
    a_name: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))


def cell_number(value: float, integral: bool) -> object:
    return int(value) if integral else float(value)


def _total_order(key: tuple) -> tuple:
    """pandas' group order: ascending per level, missing values last."""
    return tuple((1, 0) if part is NA or (isinstance(part, float) and math.isnan(part)) else (0, part)
                 for part in key)


def ancestors(parent: np.ndarray, i: int):
    while i != optree.NO_PARENT:
        yield i
        i = int(parent[i])


class OpTree:
    """The op tree and the kernel launchers of one trace."""

    def __init__(self, facts: OpsFacts) -> None:
        self.f = facts
        self.parent, self.in_tree, self.order = optree.host_tree(facts.h_thread, facts.h_ts, facts.h_end)
        self.communication = [optree.is_communication(name) for name in facts.names]
        self.launcher_of = np.full(len(facts.g_ts), optree.NO_PARENT, dtype=np.int64)
        communication = np.array(self.communication + [False])[facts.g_name]
        kept = np.flatnonzero((facts.g_parent != optree.NO_PARENT) & ~communication)
        calls, call_of = np.unique(facts.g_parent[kept], return_inverse=True)
        self.launcher_of[kept] = self._launchers(calls)[call_of.reshape(-1)]
        # the launchers, in the order their first GPU event comes (then by start)
        by_launcher = kept[np.argsort(self.launcher_of[kept], kind="stable")]
        owners, first, count = np.unique(self.launcher_of[by_launcher], return_index=True, return_counts=True)
        in_order = owners[np.argsort(by_launcher[first], kind="stable")]
        self.launchers = in_order[np.argsort(facts.h_ts[in_order], kind="stable")]
        # the same by start (ties in event order), as TraceLens lists them: each launcher's slice of by_start
        self.by_start = kept[np.lexsort((facts.g_ts[kept], self.launcher_of[kept]))]
        self._owners, self._owner_first, self._owner_count = owners, first, count
        # each runtime call's slice of the links (link_run is by call): the calls, the slices' bounds
        heads = np.flatnonzero(np.r_[True, facts.link_run[1:] != facts.link_run[:-1]]) if len(facts.link_run) else \
            np.empty(0, np.int64)
        self._calls = facts.link_run[heads], heads, np.append(heads[1:], len(facts.link_run))
        self._category_of: dict[tuple[str, str | None], str] = {}
        self._cpu_op_above: dict[int, int] = {}
        self.model_results: dict[tuple, tuple] = {}  # (the performance models' results, by what they read)

    def link_pairs(self, ops: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each op's GPU events, every link of every runtime call below it (a GPU event linked twice counts
        twice, as TraceLens walks the children), as (op, GPU event) pairs by op, then by runtime call, then
        by link."""
        f = self.f
        wanted = np.zeros(len(f.h_ts) + 1, dtype=bool)  # (the last: no parent)
        wanted[ops] = True
        runs, lo, hi = self._calls
        pair_op, pair_run = [], []
        current, at = runs.copy(), np.arange(len(runs))
        while len(current):  # (a level of ancestors at a time, from each call itself up)
            mine = wanted[current]
            pair_op.append(current[mine])
            pair_run.append(at[mine])
            up = self.parent[current]
            current, at = up[up != optree.NO_PARENT], at[up != optree.NO_PARENT]
        op, run = np.concatenate([np.empty(0, np.int64), *pair_op]), np.concatenate([np.empty(0, np.int64), *pair_run])
        order = np.lexsort((run, op))
        op, run = op[order], run[order]
        sizes = (hi - lo)[run]
        return np.repeat(op, sizes), f.link_gpu[slice_positions(lo[run], sizes)]

    def busy_many(self, group: np.ndarray, gpu: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`busy` of many groups of GPU events at once (``group``: each GPU event's group)."""
        f = self.f
        busy = optree.busy_groups(group, f.g_ts[gpu], f.g_end[gpu], count)
        return busy, np.bincount(group[~f.g_int[gpu]], minlength=count) == 0

    def busy_slices(self, gpu: np.ndarray, first: np.ndarray, count: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`busy_many` of the groups ``gpu[first[i]:first[i] + count[i]]``, a block of groups at a
        time (its temporary arrays a block's)."""
        busy, integral = np.zeros(len(first)), np.ones(len(first), dtype=bool)
        for lo in range(0, len(first), BUSY_BLOCK):
            starts, sizes = first[lo:lo + BUSY_BLOCK], count[lo:lo + BUSY_BLOCK]
            busy[lo:lo + BUSY_BLOCK], integral[lo:lo + BUSY_BLOCK] = self.busy_many(
                np.repeat(np.arange(len(sizes)), sizes), gpu[slice_positions(starts, sizes)], len(sizes))
        return busy, integral

    def _launchers(self, runtime: np.ndarray) -> np.ndarray:
        """The cpu op above each runtime call (skipping ``execute``), else the call (a tree level at a time)."""
        f = self.f
        execute = np.array([name == "execute" for name in f.names] or [False])[f.h_name]
        found = runtime.astype(np.int64)
        at, current = np.arange(len(found)), self.parent[found]
        while len(at):
            cpu_op = current != optree.NO_PARENT
            at, current = at[cpu_op], current[cpu_op]
            cpu_op = f.h_kind[current] == CPU_OP
            at, current = at[cpu_op], current[cpu_op]
            named = ~execute[current]
            found[at[named]] = current[named]
            at, current = at[~named], self.parent[current[~named]]
        return found

    def kernel_slices(self, hs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Where each host event's own GPU events (by start) lie in ``by_start``: first place and count (0
        for an event that launched none)."""
        hs = np.asarray(hs, dtype=np.int64)
        if not len(self._owners):
            return np.zeros(len(hs), np.int64), np.zeros(len(hs), np.int64)
        at = np.minimum(np.searchsorted(self._owners, hs), len(self._owners) - 1)
        found = self._owners[at] == hs
        return np.where(found, self._owner_first[at], 0), np.where(found, self._owner_count[at], 0)

    def own_kernels(self, h: int) -> np.ndarray:
        """The GPU events ``h`` launched directly, by start (ties in event order)."""
        first, count = self.kernel_slices(np.array([h]))
        return self.by_start[int(first[0]):int(first[0] + count[0])]

    def first_kernel(self, h: int) -> str | None:
        """The name of the earliest kernel ``h`` launched directly (None if none)."""
        kernels = self.own_kernels(h)
        return self.f.names[self.f.g_name[kernels[0]]] if len(kernels) else None

    def category(self, h: int) -> str:
        return self.category_of(self.f.names[self.f.h_name[h]], self.first_kernel(h))

    def categories(self, hs: list[int] | np.ndarray) -> list[str]:
        """:meth:`category` of many host events."""
        codes, values = self.category_codes(hs)
        return [values[code] for code in codes.tolist()]

    def category_codes(self, hs: list[int] | np.ndarray) -> tuple[np.ndarray, list[str]]:
        """:meth:`category` of many host events as numbers into the distinct categories (in first-seen
        order), :func:`op_category` once per distinct (name, first kernel)."""
        f, width = self.f, len(self.f.names) + 1
        hs = np.asarray(hs, dtype=np.int64)
        first, count = self.kernel_slices(hs)
        kernel = np.where(count > 0, f.g_name[self.by_start[first]] if len(self.by_start) else -1, -1)
        keys, inverse = np.unique(f.h_name[hs].astype(np.int64) * width + kernel + 1, return_inverse=True)
        found = [self.category_of(f.names[key // width], f.names[key % width - 1] if key % width else None)
                 for key in keys.tolist()]
        codes, values = _codes(found)
        return codes[inverse.reshape(-1)], values

    def category_of(self, name: str, first_kernel: str | None) -> str:
        """:func:`op_category`, once per (name, first kernel)."""
        category = self._category_of.get((name, first_kernel))
        if category is None:
            category = self._category_of[(name, first_kernel)] = op_category(name, first_kernel)
        return category

    def busy(self, gpu: Sequence[int]) -> tuple[float, bool]:
        """Union length of the GPU events' intervals, and whether it is an integer in TraceLens."""
        idx = sorted(gpu)
        return optree.busy_of(self.f.g_ts[idx].tolist(), self.f.g_end[idx].tolist()), bool(self.f.g_int[idx].all())

    def cpu_op_above(self, runtime: int) -> int:
        found = self._cpu_op_above.get(runtime)
        if found is None:
            found = next((h for h in ancestors(self.parent, runtime) if self.f.h_kind[h] == CPU_OP), optree.NO_PARENT)
            self._cpu_op_above[runtime] = found
        return found

    def cpu_ops_above(self, hosts: np.ndarray) -> np.ndarray:
        """:meth:`cpu_op_above` of many host events (a tree level at a time)."""
        found = np.full(len(hosts), optree.NO_PARENT, dtype=np.int64)
        at, current = np.arange(len(hosts)), hosts.astype(np.int64)
        while len(at):
            cpu = self.f.h_kind[current] == CPU_OP
            found[at[cpu]] = current[cpu]
            at, current = at[~cpu], self.parent[current[~cpu]]
            at, current = at[current != optree.NO_PARENT], current[current != optree.NO_PARENT]
        return found


def link(facts: OpsFacts, run: np.ndarray, gpu: np.ndarray) -> None:
    """Record the (runtime call, GPU event) links (every one: TraceLens
    propagates them all up the tree; by call, as :func:`optree.launch_links`
    gives them, so that each call's links are one slice) and each GPU event's
    call (the last link wins)."""
    facts.link_run, facts.link_gpu = run, gpu
    facts.g_parent = optree.last_parent(run, gpu, len(facts.g_ts))


def gpu_timeline(facts: OpsFacts) -> tuple[Table, float] | None:
    """``gpu_timeline`` over the linked GPU events, and its total time (µs)."""
    linked = np.flatnonzero(facts.g_parent != optree.NO_PARENT)
    if not len(linked):
        return None
    # each (category, name) pair's kind, for the pairs the linked events hold (a small table, no sort)
    cats = facts.g_cat[linked].astype(np.int64)
    pairs = cats * len(facts.names) + facts.g_name[linked]
    present = np.flatnonzero(np.bincount(pairs, minlength=(int(cats.max()) + 1) * len(facts.names)))
    del cats
    kinds = np.zeros(present[-1] + 1, dtype=np.int8)
    kinds[present] = [_timeline_kind(int(p) // len(facts.names), facts.names[int(p) % len(facts.names)])
                      for p in present.tolist()]
    kind = kinds[pairs]
    del pairs, present, kinds
    metrics = optree.timeline(facts.g_ts[linked], facts.g_end[linked], kind)
    total = metrics["total_time"]
    rows = [[key, value / 1e3, value / total * 100] for key, value in metrics.items()]
    return Table([["type", "time ms", "percent"]], rows), total


def _timeline_kind(cat: int, name: str) -> int:
    """0 computation, 1 communication, 2 memcpy: ROCm 7.1's copy kernels are
    memcpy, its fill kernels computation, NCCL/RCCL names communication."""
    if cat == MEMCPY or (cat == KERNEL and optree.ROCM_LEGACY_MEMCPY.match(name)):
        return 2
    if cat == KERNEL and optree.ROCM_LEGACY_MEMSET.match(name):
        return 0
    return 1 if optree.is_communication(name) else 0


@dataclass
class OpRows:
    """Rows of ops as columns indexed by row (typed arrays, not a dict a row): the host event each
    stands for, its name and category (numbers into ``names`` and ``categories``)."""

    h: np.ndarray
    name: np.ndarray
    names: list[str]
    category: np.ndarray
    categories: list[str]
    columns: dict[str, np.ndarray] = field(default_factory=dict)  # numbers per row, by column
    values: dict[str, list] = field(default_factory=dict)  # the distinct values of coded columns, by column

    def __len__(self) -> int:
        return len(self.h)

    def name_list(self) -> list[str]:
        return [self.names[code] for code in self.name.tolist()]


def ops_rows(tree: OpTree) -> OpRows:
    """Each launcher's row: its name, category, and the busy time of its own GPU events (``direct``) and
    of every GPU event linked below it (``subtree``), with whether each is an integer in TraceLens."""
    f = tree.f
    launchers = tree.launchers
    position = np.full(len(f.h_ts), -1, dtype=np.int64)
    position[launchers] = np.arange(len(launchers))
    direct, direct_int = tree.busy_slices(tree.by_start, *tree.kernel_slices(launchers))
    subtree, subtree_int = np.zeros(len(launchers)), np.ones(len(launchers), dtype=bool)
    for lo in range(0, len(launchers), LAUNCHER_BLOCK):  # (a block of launchers' links below at a time)
        block = launchers[lo:lo + LAUNCHER_BLOCK]
        op, gpu = tree.link_pairs(block)
        subtree[lo:lo + len(block)], subtree_int[lo:lo + len(block)] = tree.busy_many(position[op] - lo, gpu,
                                                                                      len(block))
    category, categories = tree.category_codes(launchers)
    return OpRows(launchers, f.h_name[launchers].astype(np.int64), f.names, category, categories,
                  {"direct": direct, "direct_int": direct_int, "subtree": subtree, "subtree_int": subtree_int})


@dataclass
class _Groups:
    """Rows grouped as pandas' ``groupby`` numbers them: ``keys`` in its group
    order (sorted, missing values last; or first appearance), ``codes`` per
    row (-1: a row whose key has a missing value, when those are dropped)."""

    keys: list
    codes: np.ndarray

    def sums(self, values: np.ndarray) -> np.ndarray:
        return optree.group_sums(self.codes, values, len(self.keys))

    def counts(self) -> np.ndarray:
        return np.bincount(self.codes[self.codes >= 0], minlength=len(self.keys))


def grouped(keys: list, *, sort: bool = True, dropna: bool = False) -> _Groups:
    def missing(key: object) -> bool:
        parts = key if isinstance(key, tuple) else (key,)
        return any(part is NA or (isinstance(part, float) and math.isnan(part)) for part in parts)

    present = [key for key in dict.fromkeys(keys) if not (dropna and missing(key))]
    if sort:
        present.sort(key=lambda key: _total_order(key if isinstance(key, tuple) else (key,)))
    number = {key: i for i, key in enumerate(present)}
    return _Groups(present, np.array([number.get(key, -1) for key in keys], dtype=np.int64))


def percentages(ms: list[float]) -> tuple[list[float], list[float]]:
    total = float(np.sum(np.array(ms, dtype=np.float64)))
    pct = [(x / total) * 100 for x in ms]
    return pct, np.cumsum(np.array(pct, dtype=np.float64)).tolist()


def _by_code(column: np.ndarray, values: list) -> _Groups:
    """Rows grouped (sorted) by a coded column (``values``: each code's value)."""
    return _grouped_columns([column], lambda row: values[row[0]], sort=True)


def ops_summary(rows: OpRows) -> Table:
    groups = _by_code(rows.name, rows.names)
    direct, subtree = groups.sums(rows.columns["direct"]), groups.sums(rows.columns["subtree"])
    direct_int, subtree_int = bool(rows.columns["direct_int"].all()), bool(rows.columns["subtree_int"].all())
    counts = groups.counts()
    categories: dict[str, set] = {}
    pairs = _distinct_rows([rows.name, rows.category])[0]
    for name, category in pairs.tolist():
        categories.setdefault(rows.names[name], set()).add(rows.categories[category])
    order = optree.descending(direct.tolist())
    d_sum = [cell_number(direct[i], direct_int) for i in order]
    s_sum = [cell_number(subtree[i], subtree_int) for i in order]
    d_ms = [v / 1000 for v in d_sum]
    pct, cumulative = percentages(d_ms)
    header = ["name", "total_direct_kernel_time_sum", "total_subtree_kernel_time_sum", "total_direct_kernel_time_ms",
              "total_subtree_kernel_time_ms", "Count", "Categories", "Percentage (%)", "Cumulative Percentage (%)"]
    table = Table([header])
    for j, i in enumerate(order):
        name = groups.keys[i]
        table.rows.append([name, d_sum[j], s_sum[j], d_ms[j], s_sum[j] / 1000, int(counts[i]),
                           repr(sorted(categories[name])), pct[j], cumulative[j]])
    return table


def ops_summary_by_category(rows: OpRows) -> Table:
    groups = _by_code(rows.category, rows.categories)
    direct = groups.sums(rows.columns["direct"])
    direct_int = bool(rows.columns["direct_int"].all())
    counts = groups.counts()
    order = optree.descending(direct.tolist())
    ms = [cell_number(direct[i], direct_int) / 1000 for i in order]
    pct, cumulative = percentages(ms)
    table = Table([["op category", "Count", "total_direct_kernel_time_ms", "Percentage (%)",
                    "Cumulative Percentage (%)"]])
    for j, i in enumerate(order):
        table.rows.append([groups.keys[i], int(counts[i]), ms[j], pct[j], cumulative[j]])
    return table


def _short_signature(signature: tuple) -> tuple:
    dims, _, strides, concrete = signature
    return dims, strides, concrete


UNIQUE_ARGS_KEYS = ("name", "op category", "process_name", "process_label", "thread_name", "Input Dims", "Input type",
                    "Input Strides", "Concrete Inputs")
STATS = ("mean", "median", "std", "min", "max", "sum")
TRUNCATE_KERNEL_NAME = 64
STD_BLOCK = 1 << 16  # values of a group turned into Python floats at a time


def gpu_details(f: OpsFacts, gpu: Sequence[int]) -> list[dict]:
    """GPU events as TraceLens's ``kernel_details`` lists them: name, raw duration, stream."""
    return [{"name": f.names[f.g_name[g]], "dur": int(f.g_dur[g]) if f.g_dur_int[g] else float(f.g_dur[g]),
             "stream": None if math.isnan(f.g_stream[g]) else int(f.g_stream[g])} for g in gpu]


def kernel_stats_of(f: OpsFacts, flat: np.ndarray, first: np.ndarray, count: np.ndarray) -> list[dict]:
    """TraceLens's ``_summarize_kernel_stats`` of lists of GPU events (``flat[first[i]:first[i] + count[i]]``,
    each in its :func:`gpu_details` order): per position of the first list (lists of another length left
    out), numpy's statistics of the durations (an integer array where all are integers in the trace, as
    numpy makes one of them); then ordered by total time and name."""
    size = int(count[0])
    template = flat[int(first[0]):int(first[0]) + size]
    same = flat[first[count == size][:, None] + np.arange(size)]
    durations, integral = f.g_dur[same], f.g_dur_int[same].all(axis=0)
    return _summary([(details["name"], details["stream"]) for details in gpu_details(f, template.tolist())],
                    [durations[:, i].astype(np.int64) if integral[i] else durations[:, i] for i in range(size)])


def _summary(template: list[tuple[str, int | None]], durations: list[np.ndarray]) -> list[dict]:
    summary = []
    for (name, stream), array in zip(template, durations):
        summary.append({"name": name, "stream": stream, "count": len(array),
                        "total_duration_us": np.sum(array), "mean_duration_us": np.mean(array),
                        "median_duration_us": np.median(array), "std_dev_duration_us": np.std(array),
                        "min_duration_us": np.min(array), "max_duration_us": np.max(array)})
    summary.sort(key=lambda k: (k["total_duration_us"], k["name"]))
    return summary


def truncated(summary: list[dict]) -> list[dict] | None:
    out = [{"name": k["name"][:TRUNCATE_KERNEL_NAME] + "..." if len(k["name"]) > TRUNCATE_KERNEL_NAME else k["name"],
            "stream": k["stream"], "mean_duration_us": round(k["mean_duration_us"], 2)} for k in summary]
    return out or None


def welford_std(values: Sequence[float] | np.ndarray) -> float:
    """pandas' grouped ``std`` (Welford's running mean, ddof 1), a block of values at a time."""
    values = np.asarray(values, dtype=np.float64)
    count, mean, squares = 0, 0.0, 0.0
    for lo in range(0, len(values), STD_BLOCK):
        for value in values[lo:lo + STD_BLOCK].tolist():
            count += 1
            before = mean
            mean += (value - before) / count
            squares += (value - mean) * (value - before)
    return math.sqrt(squares / (count - 1)) if count > 1 else math.nan


def process_and_thread(f: OpsFacts, h: int) -> tuple:
    """process_name, process_label, thread_name of a host event (``Unknown`` without metadata)."""
    pid, tid = f.threads[f.h_thread[h]]
    return (f.metadata.get((pid, 0, "process_name"), "Unknown"), f.metadata.get((pid, 0, "process_labels"), "Unknown"),
            f.metadata.get((pid, tid, "thread_name"), "Unknown"))


def unique_args_groups(f: OpsFacts, rows: OpRows) -> tuple[_Groups, list[tuple], np.ndarray, list[np.ndarray]]:
    """Rows grouped as ``grouped(sort=False)`` groups TraceLens's unique-args keys (name, category,
    process, thread, argument lists) by their str(): each group's key as its first row has it, its first
    row, and its rows (in row order); the str() keys made once per distinct (name, category, thread,
    signature)."""
    hs = rows.h

    def key_of(row: list[int]) -> tuple:
        return tuple("None" if part is NA else str(part) for part in _unique_key(f, rows, *row))

    # (the host event stands for its thread and signature: one of the rows of each distinct four)
    thread_sig = _distinct_rows([f.h_thread[hs], f.h_sig[hs]])[2]
    stand_in = hs[np.unique(thread_sig, return_index=True)[1]][thread_sig]
    groups = _grouped_columns([rows.name, rows.category, stand_in], key_of, sort=False)
    order = np.argsort(groups.codes, kind="stable")
    bounds = np.searchsorted(groups.codes[order], np.arange(len(groups.keys) + 1))
    members = [order[lo:hi] for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist())]
    first = order[bounds[:-1]] if len(order) else np.empty(0, np.int64)
    keys = [_unique_key(f, rows, int(rows.name[i]), int(rows.category[i]), int(hs[i])) for i in first.tolist()]
    return groups, keys, first, members


def _unique_key(f: OpsFacts, rows: OpRows, name: int, category: int, h: int) -> tuple:
    return (rows.names[name], rows.categories[category], *process_and_thread(f, h), *f.signatures[f.h_sig[h]])


def _codes(values: list) -> tuple[np.ndarray, list]:
    """Values as numbers (in first-seen order), and the values."""
    numbers: dict = {}
    codes = np.array([numbers.setdefault(value, len(numbers)) for value in values], dtype=np.int64)
    return codes, list(numbers)


def ops_unique_args(tree: OpTree, rows: OpRows) -> Table:
    """``ops_unique_args``: launchers grouped by name, category, process,
    thread and the str() of their four argument lists, in first-seen order."""
    f = tree.f
    groups, keys, first, members = unique_args_groups(f, rows)
    counts = groups.counts()
    stats = {}
    for column in ("direct", "subtree"):
        values = rows.columns[column].astype(np.float64)
        integral = bool(rows.columns[column + "_int"].all())
        sums = groups.sums(values)
        stats[column] = {
            "mean": (sums / counts).tolist(),
            "median": [float(np.median(values[m])) for m in members],
            "std": [welford_std(values[m]) for m in members],
            "min": [cell_number(values[m].min(), integral) for m in members],
            "max": [cell_number(values[m].max(), integral) for m in members],
            "sum": [cell_number(x, integral) for x in sums.tolist()],
        }
    uids = f.h_uid[rows.h[first]].tolist()
    order = sorted(range(len(groups.keys)), key=lambda k: (-stats["direct"]["sum"][k], uids[k]))
    sums = [stats["direct"]["sum"][k] for k in order]
    pct, cumulative = percentages([float(x) for x in sums])
    header = [*UNIQUE_ARGS_KEYS, "operation_count"]
    for stat in STATS:
        header += [f"total_direct_kernel_time_{stat}", f"total_subtree_kernel_time_{stat}"]
    table = Table([header + ["ex_UID", "kernel_details_summary", "trunc_kernel_details", "Percentage (%)",
                             "Cumulative Percentage (%)"]])
    for j, k in enumerate(order):
        row = [*keys[k], int(counts[k])]
        for stat in STATS:
            row += [stats["direct"][stat][k], stats["subtree"][stat][k]]
        summary = kernel_stats_of(f, tree.by_start, *tree.kernel_slices(rows.h[members[k]]))
        row += [int(uids[k]), repr(summary), truncated(summary), pct[j], cumulative[j]]
        table.rows.append(row)
    return table


@dataclass
class _Kernels:
    """TraceLens's ``get_df_kernels(launcher_detail=True)`` rows (kernels
    only) as columns: what stands above each kernel is a number into
    ``above`` (category, Parent cpu_op, its signature)."""

    g: np.ndarray
    above: list[tuple]
    above_of: np.ndarray
    has_cpu_op: bool  # some kernel has a cpu op above it (else no "Parent cpu_op" column)


def kernels(tree: OpTree) -> _Kernels:
    f = tree.f
    g = np.flatnonzero(f.g_cat == KERNEL)
    numbers: dict[tuple, int] = {(NA, NA, (NA, NA, NA)): 0}  # an unlinked kernel
    is_call = np.zeros(len(f.h_ts), dtype=bool)  # (the calls that launched kernels, a block of kernels at a time)
    for lo in range(0, len(g), blockunique.BLOCK):
        runtime = f.g_parent[g[lo:lo + blockunique.BLOCK]]
        is_call[runtime[runtime != optree.NO_PARENT]] = True
    calls = np.flatnonzero(is_call)
    del is_call
    above = tree.cpu_ops_above(calls)
    has_cpu_op = bool((above != optree.NO_PARENT).any())
    # (each call's op: the cpu op above it, else, TraceLens's fallback, the launch call by its name)
    op_keys, first, inverse = np.unique(np.where(above != optree.NO_PARENT, above,
                                                 -1 - f.h_name[calls].astype(np.int64)),
                                        return_index=True, return_inverse=True)
    # (what stands above: (category, name, signature) of an op, the name of a call without one; each
    # distinct one numbered where its calls first come)
    is_op = op_keys >= 0
    category, categories = tree.category_codes(op_keys[is_op])
    columns = [is_op.astype(np.int64), np.full(len(op_keys), -1, np.int64), -1 - op_keys, np.full(len(op_keys), -1)]
    columns[1][is_op], columns[2][is_op], columns[3][is_op] = category, f.h_name[op_keys[is_op]], f.h_sig[op_keys[is_op]]
    distinct, _, info_of = _distinct_rows(columns) if len(op_keys) else (np.empty((0, 4), np.int64), None, op_keys)
    info_first = np.full(len(distinct), len(calls), dtype=np.int64)
    np.minimum.at(info_first, info_of, first)
    number_of_info = np.zeros(len(distinct), dtype=np.int64)
    for at in np.argsort(info_first, kind="stable").tolist():
        op, category, name, sig = distinct[at].tolist()
        info = (categories[category], f.names[name], _short_signature(f.signatures[sig])) if op else \
            _runtime_info(f.names[name])
        number_of_info[at] = numbers.setdefault(info, len(numbers))
    number_of_call = number_of_info[info_of][inverse.reshape(-1)]
    above_of = np.zeros(len(g), dtype=np.int64)
    for lo in range(0, len(g), blockunique.BLOCK):
        runtime = f.g_parent[g[lo:lo + blockunique.BLOCK]]
        linked = runtime != optree.NO_PARENT
        above_of[lo:lo + blockunique.BLOCK][linked] = number_of_call[np.searchsorted(calls, runtime[linked])]
    return _Kernels(g, list(numbers), above_of, has_cpu_op)


def _runtime_info(launcher: str) -> tuple:
    """A kernel's op when no cpu op is above its launch call: the call, as graph or runtime."""
    low = launcher.lower()
    return ("graph" if "cudagraph" in low or "graphlaunch" in low else "runtime", launcher, (NA, NA, NA))


def _grouped_columns(columns: list[np.ndarray], key_of, *, sort: bool, dropna: bool = False) -> _Groups:
    """:func:`grouped` over integer columns, making a key only per distinct row."""
    if not len(columns[0]):
        return _Groups([], np.empty(0, dtype=np.int64))
    distinct, first, inverse = _distinct_rows(columns)
    keys = [key_of(row) for row in distinct.tolist()]
    groups = grouped([keys[i] for i in np.argsort(first, kind="stable").tolist()], sort=sort, dropna=dropna)
    number = {key: i for i, key in enumerate(groups.keys)}
    remap = np.array([number.get(key, -1) for key in keys], dtype=np.int64)
    inverse = inverse.reshape(-1)
    for lo in range(0, len(inverse), blockunique.BLOCK):  # (in place: no second column of codes)
        inverse[lo:lo + blockunique.BLOCK] = remap[inverse[lo:lo + blockunique.BLOCK]]
    return _Groups(groups.keys, inverse)


def _distinct_rows(columns: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``np.unique(rows, axis=0, return_index=True, return_inverse=True)`` of the columns' rows: by one
    integer per row (the columns as digits of a mixed radix, which keeps their order) where it fits."""
    lows = [int(column.min()) for column in columns]
    widths = [int(column.max()) - low + 1 for column, low in zip(columns, lows)]
    if math.prod(widths) >= 1 << 62:
        return np.unique(np.stack(columns, axis=1), axis=0, return_index=True, return_inverse=True)

    def key(lo: int, hi: int) -> np.ndarray:
        found = np.zeros(hi - lo, dtype=np.int64)
        for column, low, width in zip(columns, lows, widths):
            found = found * width + (column[lo:hi].astype(np.int64) - low)
        return found

    values, first, inverse = unique_in_blocks(len(columns[0]), key)
    digits = []
    for low, width in zip(lows[::-1], widths[::-1]):
        digits.append(values % width + low)
        values = values // width
    return np.stack(digits[::-1], axis=1), first, inverse.reshape(-1)


def _stream_codes(streams: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, list]:
    """The streams of ``rows`` as small integers, and each code's value (None for none)."""
    values, _, codes = unique_in_blocks(len(rows), lambda lo, hi: np.nan_to_num(streams[rows[lo:hi]], nan=-np.inf))
    return codes, [None if math.isinf(v) and v < 0 else v for v in values.tolist()]


def kernel_summary(tree: OpTree, kernels: _Kernels, total_us: float) -> Table:
    f = tree.f
    durations = f.g_dur[kernels.g]
    integral = bool(f.g_dur_int[kernels.g].all())
    stream_codes, stream_values = _stream_codes(f.g_stream, kernels.g)
    streams_whole = None not in stream_values  # else pandas' float column: 7.0

    def key_of(row: list[int]) -> tuple:
        category, cpu_op, _ = kernels.above[row[0]]
        parts = (category, cpu_op) if kernels.has_cpu_op else (category,)
        return (*parts, f.names[row[1]], stream_values[row[2]])

    groups = _grouped_columns([kernels.above_of, f.g_name[kernels.g], stream_codes], key_of, sort=True)
    sums = groups.sums(durations)
    counts = groups.counts()
    lows = np.full(len(groups.keys), np.inf)
    highs = np.full(len(groups.keys), -np.inf)
    np.minimum.at(lows, groups.codes, durations)
    np.maximum.at(highs, groups.codes, durations)
    total_kernels = int(durations.sum()) if integral else float(np.sum(durations))
    whole = (total_us / 1e3) * 1e3
    table = Table([["Parent op category", *["Parent cpu_op"][:kernels.has_cpu_op], "Kernel name", "Kernel stream",
                    "Kernel duration (µs)_sum", "Kernel duration (µs)_count", "Kernel duration (µs)_mean",
                    "Kernel duration (µs)_min", "Kernel duration (µs)_max", "Percent of kernels time (%)",
                    "Percent of total time (%)"]])
    for k in optree.descending(sums.tolist()):
        *names, stream = groups.keys[k]
        total = cell_number(sums[k], integral)
        table.rows.append([*names, int(stream) if streams_whole else stream, total, int(counts[k]),
                           float(sums[k] / counts[k]), cell_number(lows[k], integral), cell_number(highs[k], integral),
                           total / total_kernels * 100 if total_kernels > 0 else NA,
                           total / whole * 100 if whole else NA])
    return table


def short_kernels(tree: OpTree, kernels: _Kernels, total_us: float) -> tuple[Table, Table]:
    """``short_kernel_histogram`` and ``short_kernels_summary``."""
    f = tree.f
    integral = bool(f.g_dur_int[kernels.g].all())
    short = f.g_dur[kernels.g] < SHORT_KERNEL_US
    histogram = Table([["bin_start", "bin_end", "count"]])
    if not short.any():
        return histogram, Table([[]])
    values = f.g_dur[kernels.g[short]]
    counts, edges = np.histogram(values.astype(np.int64) if integral else values, bins=HISTOGRAM_BINS)
    histogram.rows = [[float(edges[i]), float(edges[i + 1]), int(counts[i])] for i in range(len(counts))]
    names = f.g_name[kernels.g[short]]
    if f.has_cpu_ops:
        key_columns = ["Parent cpu_op", "Input dims", "Input strides", "Concrete Inputs", "Kernel name"]
        groups = _grouped_columns([kernels.above_of[short], names], lambda row: (
            kernels.above[row[0]][1], *kernels.above[row[0]][2], f.names[row[1]]), sort=False, dropna=True)
    else:
        key_columns = ["Kernel name"]
        groups = _grouped_columns([names], lambda row: (f.names[row[0]],), sort=False, dropna=True)
    if not groups.keys:  # pandas' empty grouped frame: a two-line header of its aggregations
        return histogram, Table([["Kernel duration (µs)"] * 3, ["sum", "count", "mean"]])
    sums = groups.sums(values.astype(np.float64))
    counts = groups.counts()
    whole = (total_us / 1e3) * 1e3
    summary = Table([key_columns + ["Short Kernel duration (µs) sum", "Short Kernel count",
                                    "Short Kernel duration (µs) mean",
                                    "Short Kernel duration (µs) percent of total time"]])
    records = []
    for i, key in enumerate(groups.keys):
        total = cell_number(sums[i], integral)
        records.append([*key, total, int(counts[i]), float(sums[i] / counts[i]), total / whole * 100])
    n = len(key_columns)
    records.sort(key=lambda r: (-r[n], r[n + 1], r[n + 2], r[n + 3]))
    summary.rows = records
    return histogram, summary
