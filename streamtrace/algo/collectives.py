"""Collectives across ranks: TraceLens's multi-rank collective report (its
``NcclAnalyser`` and ``generate_multi_rank_collective_report_pytorch``), as
pure functions over each rank's collective kernels (SPEC 16).

A rank's kernels come as :class:`RankKernels`: start, duration and a
metadata row per kernel (file order), the metadata rows (the collective's
args, see :data:`META`) listed once.  :func:`report` gives TraceLens's
tables, named by its file stems, with its columns, rows, order and
rounding; docs/analyze.md states each definition.  Two departures, where
TraceLens stops with an error: kernels of one collective id whose metadata
differ across ranks are left out of the per-collective tables (and named in
the notes) instead of ending the run, and process groups that share a name
but not their ranks are told apart by their ranks.  Beyond TraceLens:
``collective_bandwidth`` (nccl-tests' sizes and bus factors, SI units,
broadcast and reduce included), :func:`straggler_causes`, and notes on
sequences that order matching may misread.
"""
from __future__ import annotations

import ast
import math
import re
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Callable, Sequence

import numpy as np

META = ("Process Group Name", "Process Group Ranks", "Collective name", "Group size", "dtype", "In msg nelems",
        "Out msg nelems", "In split size", "Out split size", "stream")
"""The args of a collective kernel that the report reads (``stream`` too), in a metadata row's order."""
PG_NAME, PG_RANKS, NAME, GROUP_SIZE, DTYPE, IN_NELEMS, OUT_NELEMS, IN_SPLIT, OUT_SPLIT, STREAM = range(len(META))

COMMUNICATION_PATTERNS = (re.compile("rccl", re.IGNORECASE), re.compile("nccl", re.IGNORECASE),
                          re.compile("cross_device_reduce", re.IGNORECASE))
"""TraceLens's collective kernels: a name matching one of these (and a correlation or External id)."""
INFERRED_NAMES = ((re.compile("cross_device_reduce", re.IGNORECASE), "allreduce"),)
"""A kernel without a ``Collective name`` whose name matches gets this one (vLLM's custom all-reduce)."""

DTYPE_BYTES = {"Float": 4, "Int": 4, "Long": 8, "BFloat16": 2, "Bool": 1, "Byte": 1, "Double": 8, "Half": 2,
               "Short": 2}
COLLECTIVE_TYPES = {
    "allreduce": ("allreduce", "allreduce_coalesced"),
    "reducescatter": ("reducescatter", "_reduce_scatter_base", "reduce_scatter_tensor_coalesced"),
    "allgather": ("allgather", "all_gather", "_allgather_base", "all_gather_into_tensor_coalesced",
                  "allgather_into_tensor_coalesced"),
    "alltoall": ("all_to_all",),
    "alltoallv": ("all_to_allv",),
}
TYPE_OF = {name: kind for kind, names in COLLECTIVE_TYPES.items() for name in names}
IMPLICIT_SYNC = frozenset({"allreduce", "reducescatter", "allgather", "alltoall"})
BUS_FACTORS: dict[str, Callable[[float], float]] = {
    "allreduce": lambda n: 2 * (n - 1) / n,
    "reducescatter": lambda n: (n - 1) / n,
    "allgather": lambda n: (n - 1) / n,
    "alltoall": lambda n: (n - 1) / n,
}
AGGREGATES = ("mean", "median", "min", "max")  # the report's summaries (its command's default)
LONG_AGGREGATES = ("mean", "std", "min", "max")  # nccl_summary_long's (the analyser's default: the command passes none)
HEATMAP_MAX_WORLD = 1024
UNKNOWN_GROUP = "Unknown_Group"
MIB = 1024 ** 2

TRACELENS_TABLES = ("nccl_summary_implicit_sync", "nccl_summary_long", "nccl_summary_all2allv", "nccl_all2allv_heatmap",
                    "nccl_long", "nccl_implicit_sync", "nccl_all2allv", "straggler_summary")
"""TraceLens's file stems, in the order its report makes them."""
TABLE_NAMES = (*TRACELENS_TABLES, "collective_bandwidth", "straggler_causes", "collective_matches", "p2p_pairs",
               "clock_offsets")
"""The report's tables: TraceLens's, then those it does not have."""


@dataclass
class RankKernels:
    """One rank's collective kernels, in file order: start and duration (us, as the trace states them)
    and each one's metadata row (an index into ``metas``, tuples in :data:`META`'s order)."""

    rank: int
    ts: np.ndarray
    dur: np.ndarray
    meta: np.ndarray
    metas: list[tuple] = field(default_factory=list)
    seq: np.ndarray | None = None  # each kernel's Seq arg (-1: none), for matching beyond TraceLens's order
    peer: np.ndarray | None = None  # a send's Dst Rank, a recv's Src Rank (-1: none)
    groups: dict[str, tuple[int, ...]] = field(default_factory=dict)  # its file's pg_config: group name -> ranks


@dataclass
class Table:
    columns: list[str]
    rows: list[list]

    def column(self, name: str) -> list:
        at = self.columns.index(name)
        return [row[at] for row in self.rows]


@dataclass
class Report:
    tables: dict[str, Table]
    notes: list[str]


def is_collective_kernel(name: object) -> bool:
    """TraceLens's test of a kernel's name."""
    return isinstance(name, str) and any(pattern.search(name) for pattern in COMMUNICATION_PATTERNS)


def collective_name(args_name: object, kernel_name: str) -> object:
    """The ``Collective name`` arg, else the one TraceLens infers from the kernel's name (else None)."""
    if args_name is not None:
        return args_name
    for pattern, inferred in INFERRED_NAMES:
        if pattern.search(kernel_name):
            return inferred
    return None


def hashable(value: object) -> object:
    """An arg as TraceLens keeps it: lists become tuples; an object (no arg Kineto writes is one) its text,
    an exact reading's decimal a float."""
    if isinstance(value, list):
        return tuple(hashable(item) for item in value)
    if isinstance(value, dict):
        return repr(value)
    if isinstance(value, Decimal):
        return float(value)
    return value


def _count(value: object) -> int | float | None:
    """A number of elements or ranks, or None for anything else (TraceLens would stop on it)."""
    return value if value.__class__ in (int, float) and math.isfinite(value) else None


def missing(value: object) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


# ---------------------------------------------------------------- nccl_long


@dataclass
class Long:
    """nccl_long's rows (rank order, then file order) and each row's match key."""

    table: Table
    keys: list[tuple]  # (collective_id, the group's ranks) per row
    ranks: list[int]
    ts: list
    dur: list
    metas: list[tuple]
    simplified: bool


def _sizes(meta: tuple) -> tuple[float | None, float | None]:
    size = DTYPE_BYTES.get(meta[DTYPE]) if isinstance(meta[DTYPE], str) else None
    nelems, out = _count(meta[IN_NELEMS]), _count(meta[OUT_NELEMS])
    if size is None or nelems is None:
        return None, None
    return nelems * size / MIB, None if out is None else out * size / MIB


def long_rows(ranks: Sequence[RankKernels]) -> Long:
    ranks = sorted(ranks, key=lambda kernels: kernels.rank)
    metas: list[tuple] = [kernels.metas[at] for kernels in ranks for at in kernels.meta.tolist()]
    rank_of = [kernels.rank for kernels in ranks for _ in range(len(kernels.ts))]
    ts = [value for kernels in ranks for value in _numbers(kernels.ts)]
    dur = [value for kernels in ranks for value in _numbers(kernels.dur)]
    pg_missing = all(missing(meta[PG_NAME]) or meta[PG_NAME] == UNKNOWN_GROUP for meta in metas)
    streams: dict[int, set] = {}
    for rank, meta in zip(rank_of, metas):
        if not missing(meta[STREAM]):
            streams.setdefault(rank, set()).add(meta[STREAM])
    simplified = pg_missing and all(len(found) <= 1 for found in streams.values())
    groups = ["all" if simplified else (UNKNOWN_GROUP if missing(meta[PG_NAME]) else meta[PG_NAME]) for meta in metas]
    index = _order_in_groups(ts, [rank if simplified else (group, rank) for group, rank in zip(groups, rank_of)])
    ids = [str(n) if simplified else f"{group}_{n}" for group, n in zip(groups, index)]
    rows = []
    for cid, n, rank, group, meta, start, length in zip(ids, index, rank_of, groups, metas, ts, dur):
        in_mb, out_mb = _sizes(meta)
        rows.append([cid, n, rank, group, meta[PG_RANKS], meta[NAME], meta[GROUP_SIZE], meta[DTYPE], meta[IN_NELEMS],
                     in_mb, meta[OUT_NELEMS], out_mb, meta[IN_SPLIT], meta[OUT_SPLIT], meta[STREAM], start, length])
    columns = ["collective_id", "index_in_group", "rank", "Process Group Name", "Process Group Ranks", "Collective name",
               "Group size", "dtype", "In msg nelems", "In msg size (MB)", "Out msg nelems", "Out msg size (MB)",
               "In split size", "Out split size", "stream", "ts", "dur"]
    keys = [(cid, None if simplified else meta[PG_RANKS]) for cid, meta in zip(ids, metas)]
    return Long(Table(columns, rows), keys, rank_of, ts, dur, metas, simplified)


def _numbers(values: np.ndarray) -> list:
    """Times as the trace wrote them: whole numbers as ints (TraceLens keeps JSON's integers)."""
    return [int(value) if value.is_integer() else value for value in values.tolist()]


def _order_in_groups(ts: list, groups: list) -> list[int]:
    """Each row's place by start time among its group's rows (ties: file order), pandas' rank(method='first') - 1."""
    members: dict[object, list[int]] = {}
    for row, group in enumerate(groups):
        members.setdefault(group, []).append(row)
    index = [0] * len(ts)
    for rows in members.values():
        for n, row in enumerate(sorted(rows, key=lambda row: ts[row])):
            index[row] = n
    return index


def by_collective(long: Long) -> dict[tuple, list[int]]:
    """Each collective's rows (first appearance order; rows in rank order)."""
    found: dict[tuple, list[int]] = {}
    for row, key in enumerate(long.keys):
        found.setdefault(key, []).append(row)
    return found


def _number(value: object) -> object:
    """A number, or NaN for anything else (where TraceLens would stop)."""
    return math.nan if _count(value) is None else value


def same(values: list) -> bool:
    first = values[0]
    return all(value == first or (missing(value) and missing(first)) for value in values[1:])


# ---------------------------------------------------------------- per collective


class _Columns:
    """Column names in order of first appearance over rows built as dicts (what pandas does with them)."""

    def __init__(self) -> None:
        self.names: dict[str, None] = {}

    def add(self, row: dict) -> dict:
        for name in row:
            self.names.setdefault(name, None)
        return row

    def table(self, general: list[str], rows: list[dict]) -> Table:
        per_rank = [name for name in self.names if name.startswith("rank_")]
        columns = general + per_rank
        return Table(columns, [[row.get(name) for name in columns] for row in rows])


IMPLICIT_META = ("Process Group Name", "Process Group Ranks", "Collective name", "Group size", "dtype", "In msg nelems",
                 "Out msg nelems", "In msg size (MB)", "Out msg size (MB)")
IMPLICIT_GENERAL = ["collective_id", *IMPLICIT_META, "Full msg size (MB)", "comm_latency", "skew in start time",
                    "earliest arrival rank", "avg_wait_time", "skew in end time", "algo bw (GB/s)", "bus bw (GB/s)"]


def implicit_sync(long: Long, notes: list[str]) -> Table:
    """nccl_implicit_sync (detailed): a row per all-reduce, reduce-scatter, all-gather or all-to-all."""
    table = long.table
    columns = _Columns()
    rows = []
    meta_at = [table.columns.index(name) for name in IMPLICIT_META]
    mismatched = []
    for (cid, _), members in by_collective(long).items():
        name = table.rows[members[0]][5]
        kind = TYPE_OF.get(name) if isinstance(name, str) else None
        if long.simplified:
            if name is not None and kind is not None and kind not in IMPLICIT_SYNC:
                continue
        elif kind not in IMPLICIT_SYNC:
            continue
        meta = [table.rows[members[0]][at] for at in meta_at]
        if not long.simplified and not all(same([table.rows[row][at] for row in members]) for at in meta_at):
            mismatched.append(cid)
            continue
        row: dict = {"collective_id": cid, **dict(zip(IMPLICIT_META, meta))}
        ranks = [long.ranks[member] for member in members]
        ts = [long.ts[member] for member in members]
        dur = [long.dur[member] for member in members]
        for rank, start, length in zip(ranks, ts, dur):
            row[f"rank_{rank}_ts"] = start
            row[f"rank_{rank}_dur"] = length
        latest_start = max(ts)
        ends = [start + length for start, length in zip(ts, dur)]
        row["comm_latency"] = min(dur)
        waits = [latest_start - start for start in ts]
        for rank, wait in zip(ranks, waits):
            row[f"rank_{rank}_wait_time"] = wait
        row["skew in start time"], row["earliest arrival rank"] = max(zip(waits, ranks))
        row["avg_wait_time"] = sum(waits) / len(waits)
        row["skew in end time"] = max(ends) - min(ends)
        in_mb, out_mb, size = row["In msg size (MB)"], row["Out msg size (MB)"], row["Group size"]
        full = algo = bus = math.nan
        if in_mb is not None and out_mb is not None and kind is not None:
            full = out_mb if kind == "allgather" else in_mb
            algo = full / 1024 / (row["comm_latency"] / 1e6) if row["comm_latency"] > 0 else math.nan
            bus = algo * BUS_FACTORS[kind](size) if _count(size) and kind in BUS_FACTORS else math.nan
        row["Full msg size (MB)"], row["algo bw (GB/s)"], row["bus bw (GB/s)"] = full, algo, bus
        rows.append(columns.add(row))
    if mismatched:
        notes.append(f"collectives: {len(mismatched):,} collective ids whose kernels' args differ across ranks "
                     f"(TraceLens stops there) are left out of nccl_implicit_sync: {', '.join(mismatched[:5])}"
                     f"{' ...' if len(mismatched) > 5 else ''}")
    return columns.table(list(IMPLICIT_GENERAL), rows)


ALL2ALLV_META = ("Process Group Name", "Process Group Ranks", "Collective name", "Group size", "dtype", "stream")
ALL2ALLV_PER_RANK = ("ts", "dur", "In msg nelems", "Out msg nelems", "In msg size (MB)", "Out msg size (MB)",
                     "In split size", "Out split size")
ALL2ALLV_GENERAL = ["collective_id", *ALL2ALLV_META, "total data communicated (MB)", "total nelems communicated",
                    "wall_time (us)", "max_rank_dur (us)", "min_rank_dur (us)", "avg_rank_dur (us)", "throughput (GB/s)",
                    "max_rank_throughput (GB/s)", "min_rank_throughput (GB/s)", "size_imbalance", "skew in start time",
                    "skew in end time"]


def all2allv_table(long: Long, notes: list[str]) -> Table:
    """nccl_all2allv (detailed): a row per all_to_allv, the biggest first."""
    table = long.table
    columns = _Columns()
    rows = []
    meta_at = [table.columns.index(name) for name in ALL2ALLV_META]
    per_rank_at = [table.columns.index(name) for name in ALL2ALLV_PER_RANK]
    mismatched = []
    for (cid, _), members in by_collective(long).items():
        if table.rows[members[0]][5] != "all_to_allv":
            continue
        if not all(same([table.rows[row][at] for row in members]) for at in meta_at):
            mismatched.append(cid)
            continue
        row: dict = {"collective_id": cid, **{name: table.rows[members[0]][at] for name, at in zip(ALL2ALLV_META, meta_at)}}
        ranks = [long.ranks[member] for member in members]
        for rank, member in zip(ranks, members):
            for name, at in zip(ALL2ALLV_PER_RANK, per_rank_at):
                row[f"rank_{rank}_{name}"] = table.rows[member][at]
        ts = [row[f"rank_{rank}_ts"] for rank in ranks]
        dur = [row[f"rank_{rank}_dur"] for rank in ranks]
        ends = [start + length for start, length in zip(ts, dur)]
        earliest_start, latest_end = min(ts), max(ends)
        row["skew in start time"] = max(ts) - earliest_start
        row["skew in end time"] = latest_end - min(ends)
        for rank, start, end in zip(ranks, ts, ends):
            row[f"rank_{rank}_skew in start time"] = start - earliest_start
            row[f"rank_{rank}_skew in end time"] = latest_end - end
        sizes = [_number(row[f"rank_{rank}_In msg size (MB)"]) for rank in ranks]
        row["total data communicated (MB)"] = sum(sizes)
        row["total nelems communicated"] = sum(_number(row[f"rank_{rank}_In msg nelems"]) for rank in ranks)
        wall = latest_end - earliest_start
        row["wall_time (us)"] = wall
        row["max_rank_dur (us)"], row["min_rank_dur (us)"] = max(dur), min(dur)
        row["avg_rank_dur (us)"] = sum(dur) / len(ranks)
        row["throughput (GB/s)"] = sum(sizes) / 1024 / (wall / 1e6) if wall > 0 else math.nan
        rates = [size / 1024 / (length / 1e6) for size, length in zip(sizes, dur) if size > 0 and length > 0]
        row["max_rank_throughput (GB/s)"] = max(rates) if rates else math.nan
        row["min_rank_throughput (GB/s)"] = min(rates) if rates else math.nan
        mean = sum(sizes) / len(sizes)
        row["size_imbalance"] = max(sizes) / mean if mean > 0 else math.nan
        rows.append(columns.add(row))
    if mismatched:
        notes.append(f"collectives: {len(mismatched):,} all_to_allv ids whose kernels' args differ across ranks "
                     f"(TraceLens stops there) are left out of nccl_all2allv: {', '.join(mismatched[:5])}"
                     f"{' ...' if len(mismatched) > 5 else ''}")
    detailed = columns.table(list(ALL2ALLV_GENERAL), rows)
    return _sorted(detailed, "total data communicated (MB)", descending=True)


# ---------------------------------------------------------------- pandas' aggregates


def _kahan_sum(values: list[float]) -> float:
    """pandas' groupby sum (compensated), NaN left out."""
    total = compensation = 0.0
    for value in values:
        y = value - compensation
        t = total + y
        compensation = t - total - y
        total = t
    return total


def _aggregate(how: str, values: list) -> object:
    """One of pandas' groupby aggregates over a group's values (missing ones left out, as pandas does)."""
    if how == "size":
        return len(values)
    present = [value for value in values if not missing(value)]
    if how == "first":
        return present[0] if present else None
    if how == "count":
        return len(present)
    if not present:
        return 0 if how == "sum" else math.nan
    if how == "sum":
        return _kahan_sum(present) if any(isinstance(value, float) for value in present) else sum(present)
    if how == "mean":
        return _kahan_sum(present) / len(present)
    if how == "median":
        return float(np.median(np.array(present, dtype=np.float64)))
    if how in ("min", "max"):
        return min(present) if how == "min" else max(present)
    if how == "std":
        if len(present) < 2:
            return math.nan
        count, mean, squares = 0, 0.0, 0.0
        for value in present:  # Welford's, as pandas' group_var
            count += 1
            old = mean
            mean += (value - old) / count
            squares += (value - mean) * (value - old)
        return math.sqrt(squares / (count - 1))
    raise ValueError(how)


def _groups(table: Table, keys: Sequence[str], dropna: bool = True) -> list[tuple[tuple, list[list]]]:
    """pandas' groupby(keys): groups sorted by their keys; rows with a missing key left out (``dropna``)."""
    at = [table.columns.index(key) for key in keys]
    found: dict[tuple, list[list]] = {}
    for row in table.rows:
        key = tuple(row[n] for n in at)
        if dropna and any(missing(value) for value in key):
            continue
        found.setdefault(key, []).append(row)
    try:
        return sorted(found.items(), key=lambda item: item[0])
    except TypeError:  # keys of several types in one column (pandas too leaves them unsorted)
        return list(found.items())


def _sorted(table: Table, column: str, descending: bool) -> Table:
    """pandas' sort_values on one column: ties keep their order, missing values last."""
    at = table.columns.index(column)
    present = [row for row in table.rows if not missing(row[at])]
    absent = [row for row in table.rows if missing(row[at])]
    present.sort(key=lambda row: -row[at] if descending else row[at])
    return Table(table.columns, present + absent)


def _summary(table: Table, keys: Sequence[str], plan: list[tuple[str, str, str]], dropna: bool = True) -> Table:
    """Rows per group of ``keys``: ``plan`` lists (source column, aggregate, output column)."""
    at = {name: table.columns.index(name) for name, _, _ in plan}
    rows = []
    for key, members in _groups(table, keys, dropna):
        rows.append([*key, *(_aggregate(how, [row[at[name]] for row in members]) for name, how, _ in plan)])
    return Table([*keys, *(output for _, _, output in plan)], rows)


def _select(table: Table, columns: Sequence[str]) -> Table:
    at = [table.columns.index(name) for name in columns]
    return Table(list(columns), [[row[n] for n in at] for row in table.rows])


# ---------------------------------------------------------------- summaries


SUMMARY_LONG_KEYS = ("rank", "Process Group Name", "Process Group Ranks", "Collective name", "Group size", "dtype",
                     "In msg nelems", "Out msg nelems", "In split size", "Out split size", "stream")


def summary_long(long: Table) -> Table:
    plan = [("In msg size (MB)", "first", "In msg size (MB)_first"), ("Out msg size (MB)", "first", "Out msg size (MB)_first")]
    plan += [("dur", how, f"dur_{how}") for how in ("sum", *LONG_AGGREGATES)]
    plan.append(("collective_id", "count", "operation_count"))
    return _sorted(_summary(long, SUMMARY_LONG_KEYS, plan), "dur_sum", descending=True)


def summary_implicit_sync(detailed: Table) -> Table:
    if not detailed.rows:
        return Table([], [])
    metrics = ["comm_latency", "skew in start time", "skew in end time"]
    metrics += [name for name in ("algo bw (GB/s)", "bus bw (GB/s)") if not all(map(missing, detailed.column(name)))]
    keys = ("Collective name", "dtype", "In msg nelems")
    filled = Table(detailed.columns, [list(row) for row in detailed.rows])
    for key in keys:
        at = filled.columns.index(key)
        for row in filled.rows:
            if missing(row[at]):
                row[at] = "Unknown"
    plan = [(name, how, f"{name}_{how}") for name in metrics for how in AGGREGATES]
    plan += [("comm_latency", "size", "count"), ("comm_latency", "total_ms", "Total comm latency (ms)")]
    plan += [(name, "first", name) for name in ("Process Group Name", "Group size", "Full msg size (MB)")]
    at = {name: filled.columns.index(name) for name, _, _ in plan}
    rows = []
    for key, members in _groups(filled, keys, dropna=False):
        values = []
        for name, how, _ in plan:
            column = [row[at[name]] for row in members]
            values.append(_series_sum(column) / 1000 if how == "total_ms" else _aggregate(how, column))
        rows.append([*key, *values])
    table = _sorted(Table([*keys, *(output for _, _, output in plan)], rows), "Total comm latency (ms)", descending=True)
    order = [*keys, "Process Group Name", "Group size", "Full msg size (MB)",
             *(f"{name}_{how}" for name in metrics for how in AGGREGATES), "count", "Total comm latency (ms)"]
    return _select(table, order)


def _series_sum(values: list) -> float:
    """pandas' Series.sum: numpy's (pairwise) sum, missing values as 0."""
    return np.array([0.0 if missing(value) else value for value in values], dtype=np.float64).sum().item() \
        if any(isinstance(value, float) for value in values) else sum(value for value in values if value is not None)


def summary_all2allv(detailed: Table) -> Table:
    general = _select(detailed, [name for name in detailed.columns if not name.startswith("rank_")])
    plan = [("total data communicated (MB)", how, f"total data communicated (MB)_{how}") for how in AGGREGATES]
    plan += [("wall_time (us)", how, f"wall_time (us)_{how}") for how in AGGREGATES]
    plan.append(("wall_time (us)", "sum", "Total wall_time (us)"))
    plan += [("throughput (GB/s)", how, f"throughput (GB/s)_{how}") for how in AGGREGATES]
    for name in ("size_imbalance", "max_rank_dur (us)", "skew in start time", "skew in end time"):
        plan += [(name, how, f"{name}_{how}") for how in ("mean", "max")]
    plan.append(("collective_id", "count", "count"))
    plan += [(name, "first", name) for name in ("Process Group Ranks", "Collective name", "Group size")]
    table = _summary(general, ("Process Group Name", "dtype"), plan)
    table.columns.append("Total wall_time (ms)")
    for row in table.rows:
        row.append(row[table.columns.index("Total wall_time (us)")] / 1000)
    return _sorted(table, "Total wall_time (ms)", descending=True)


def heatmap_table(long: Long, world_size: int, notes: list[str]) -> Table:
    """nccl_all2allv_heatmap: bytes each rank sent each rank over the all_to_allv (``In split size``)."""
    columns = ["src_rank", "dst_rank", "total_sent_MB", "avg_sent_MB", "count"]
    if world_size > HEATMAP_MAX_WORLD:
        notes.append(f"collectives: no all2allv heat map beyond {HEATMAP_MAX_WORLD} ranks (as TraceLens)")
        return Table(columns, [])
    pairs: dict[tuple[int, int], list[int]] = {}
    skipped = 0
    for rank, meta in zip(long.ranks, long.metas):
        if meta[NAME] != "all_to_allv":
            continue
        splits = split_sizes(meta[IN_SPLIT])
        size = DTYPE_BYTES.get(meta[DTYPE]) if isinstance(meta[DTYPE], str) else None
        if splits is None or (meta[GROUP_SIZE] is not None and len(splits) != meta[GROUP_SIZE]) or size is None:
            skipped += 1
            continue
        for peer, count in enumerate(splits):
            sums = pairs.setdefault((rank, peer), [0, 0])
            sums[0] += int(count) * size
            sums[1] += 1
    if skipped:
        notes.append(f"collectives: {skipped:,} all_to_allv kernels without readable split sizes, group size and "
                     "dtype are left out of the heat map")
    rows = [[src, dst, total / MIB, total / MIB / count, count] for (src, dst), (total, count) in sorted(pairs.items())]
    return Table(columns, rows)


def split_sizes(value: object) -> list[int] | None:
    """``In split size`` as a list of ints: a JSON list or its text (``"[1024, 2048]"``); None if neither."""
    if isinstance(value, (list, tuple)):
        return list(value) if all(item.__class__ is int for item in value) else None
    if isinstance(value, str) and value.strip().startswith("["):
        try:
            parsed = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return None
        if isinstance(parsed, (list, tuple)) and all(isinstance(item, int) for item in parsed):
            return list(parsed)
    return None


# ---------------------------------------------------------------- straggler summary


def straggler_summary(detailed: Table, long: Long) -> Table:
    """A row per rank: its wait summed and averaged over the collectives of nccl_implicit_sync, how often it
    arrived last (least wait) and first, its collective kernels' time; the least waiting (the straggler) first."""
    columns = ["rank", "total_wait_time_us", "mean_wait_time_us", "times_arrived_last", "times_arrived_first",
               "pct_arrived_last", "num_collectives", "total_nccl_dur_us"]
    waits = [name for name in detailed.columns if name.startswith("rank_") and name.endswith("_wait_time")]
    if not detailed.rows or not waits:
        return Table([], [])
    at = [detailed.columns.index(name) for name in waits]
    last = []
    for row in detailed.rows:  # pandas' idxmin: the first least wait, in column order, missing ones left out
        present = [(row[n], name) for n, name in zip(at, waits) if not missing(row[n])]
        least = min(value for value, _ in present)
        last.append(next(name for value, name in present if value == least))
    first_rank = detailed.column("earliest arrival rank")
    count = len(detailed.rows)
    durations: dict[int, list] = {}
    for rank, length in zip(long.ranks, long.dur):
        durations.setdefault(rank, []).append(length)
    rows = []
    for rank in sorted(int(name[5:-10]) for name in waits):
        name = f"rank_{rank}_wait_time"
        values = [row[detailed.columns.index(name)] for row in detailed.rows]
        present = [value for value in values if not missing(value)]
        total = _series_sum(values)
        mean = total / len(present) if present else math.nan
        times_last = sum(1 for found in last if found == name)
        rows.append([rank, _round1(total), _round1(mean), times_last, sum(1 for found in first_rank if found == rank),
                     _round1(100.0 * times_last / count), count, _round1(_aggregate("sum", durations.get(rank, [])))])
    return _sorted(Table(columns, rows), "total_wait_time_us", descending=False)


def _round1(value: float | int) -> float | int:
    """Python's round(x, 1) on pandas' numbers: numpy's rounding for floats, ints unchanged."""
    return value if isinstance(value, int) else float(np.round(value, 1))


# ---------------------------------------------------------------- node columns


def pg_ranks(value: object) -> list[int]:
    """The ranks a ``Process Group Ranks`` value lists (TraceLens's reading: its text's numbers if it is not a list)."""
    if isinstance(value, (list, tuple)):
        return [item for item in value if item.__class__ is int]
    if isinstance(value, str):
        try:
            parsed = ast.literal_eval(value)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return [int(digits) for digits in re.findall(r"\d+", value)]
        if isinstance(parsed, (list, tuple)):
            return [item for item in parsed if item.__class__ is int]
    return []


def with_nodes(table: Table, gpus_per_node: int, world_size: int) -> Table:
    """TraceLens's ``node_id`` (rank // gpus per node, ranks below the world size) and ``node_span``
    (intra_node when a group's ranks are on one node, inter_node, unknown without ranks)."""
    if not table.rows:
        return table
    columns, rows = list(table.columns), [list(row) for row in table.rows]
    if "rank" in columns:
        at = columns.index("rank")
        columns.append("node_id")
        for row in rows:
            row.append(row[at] // gpus_per_node if 0 <= row[at] < world_size else None)
    if "Process Group Ranks" in columns:
        at = columns.index("Process Group Ranks")
        columns.append("node_span")
        spans: dict[object, str] = {}
        for row in rows:
            span = spans.get(row[at])
            if span is None:
                members = pg_ranks(row[at])
                nodes = {member // gpus_per_node for member in members}
                span = spans[row[at]] = "unknown" if not members else "intra_node" if len(nodes) == 1 else "inter_node"
            row.append(span)
    return Table(columns, rows)


