"""TraceLens's per-collective tables, as consumers of the walk of
:mod:`.collectives` (a collective's kernels on every rank at once):
nccl_implicit_sync and its summary, nccl_all2allv and its summary, the
all-to-allv heat map and straggler_summary, with TraceLens's columns, rows,
order and rounding (docs/analyze.md states each definition).
"""
from __future__ import annotations

import ast
import math
from typing import Callable, Iterator

import numpy as np

from . import collectives
from .collectives import (
    AGGREGATES,
    BUS_FACTORS,
    CID,
    CNAME,
    DT,
    DTYPE_BYTES,
    DUR,
    GSIZE,
    HEATMAP_MAX_WORLD,
    IMPLICIT_SYNC,
    IN_MB,
    IN_N,
    IN_SP,
    LONG_COLUMNS,
    MIB,
    RANK,
    TS,
    TYPE_OF,
    Collective,
    Consumer,
    KernelStore,
    MemoryKernels,
    Nodes,
    Orderer,
    Rows,
    finite_count,
    order_in_memory,
)
from .groupagg import (
    Column,
    MemoryColumn,
    Running,
    Sum,
    Table,
    ValueColumn,
    Values,
    add_to,
    by_ascending,
    by_descending,
    grouped,
    missing,
    sorted_groups,
)

# ---------------------------------------------------------------- per collective


def _span_column(nodes: Nodes | None, rows: Rows) -> list[str]:
    """A streamed table's node column (none without rows, as TraceLens)."""
    return ["node_span"] if nodes is not None and len(rows) else []


class _Columns:
    """Column names in order of first appearance over rows built as dicts (what pandas does with them)."""

    def __init__(self) -> None:
        self.names: dict[str, None] = {}

    def add(self, row: dict) -> dict:
        for name in row:
            self.names.setdefault(name, None)
        return row

    def columns(self, general: list[str]) -> list[str]:
        return general + [name for name in self.names if name.startswith("rank_")]


def _mismatch_note(notes: list[str], mismatched: list[str], what: str, table: str) -> None:
    if mismatched:
        notes.append(f"collectives: {len(mismatched):,} {what} whose kernels' args differ across ranks "
                     f"(TraceLens stops there) are left out of {table}: {', '.join(mismatched[:5])}"
                     f"{' ...' if len(mismatched) > 5 else ''}")


IMPLICIT_META = ("Process Group Name", "Process Group Ranks", "Collective name", "Group size", "dtype", "In msg nelems",
                 "Out msg nelems", "In msg size (MB)", "Out msg size (MB)")
IMPLICIT_META_AT = [LONG_COLUMNS.index(name) for name in IMPLICIT_META]
IMPLICIT_GENERAL = ["collective_id", *IMPLICIT_META, "Full msg size (MB)", "comm_latency", "skew in start time",
                    "earliest arrival rank", "avg_wait_time", "skew in end time", "algo bw (GB/s)", "bus bw (GB/s)"]
SUMMARY_IMPLICIT_KEYS = ("Collective name", "dtype", "In msg nelems")
_BANDWIDTHS = ("algo bw (GB/s)", "bus bw (GB/s)")
_IMPLICIT_METRICS = ("comm_latency", "skew in start time", "skew in end time", *_BANDWIDTHS)


class ImplicitSync(Consumer):
    """nccl_implicit_sync (detailed: a row per all-reduce, reduce-scatter, all-gather or all-to-all, written
    as it comes), its summary (per collective name, dtype and size) and straggler_summary; ``column`` makes
    where the values its medians and pairwise sums need go (a number per collective: memory by default)."""

    def __init__(self, rows: Rows, nodes: Nodes | None, simplified: bool,
                 column: Callable[[], ValueColumn] = MemoryColumn) -> None:
        self.rows, self.nodes, self.simplified, self.column = rows, nodes, simplified, column
        self.columns = _Columns()
        self.mismatched: list[str] = []
        self.groups: dict[tuple, dict[str, Running]] = {}
        self.bandwidths: set[str] = set()  # the bandwidth columns some row has a value in
        self.stragglers = Stragglers(column)

    def collective(self, found: Collective) -> None:
        first = found.rows[0]
        name = first[CNAME]
        kind = TYPE_OF.get(name) if isinstance(name, str) else None
        if self.simplified:
            if name is not None and kind is not None and kind not in IMPLICIT_SYNC:
                return
        elif kind not in IMPLICIT_SYNC:
            return
        if not self.simplified and not found.same_args(IMPLICIT_META_AT):
            self.mismatched.append(first[CID])
            return
        row: dict = {"collective_id": first[CID], **{name: first[at] for name, at in zip(IMPLICIT_META, IMPLICIT_META_AT)}}
        ranks = found.ranks
        ts = [member[TS] for member in found.rows]
        dur = [member[DUR] for member in found.rows]
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
            bus = algo * BUS_FACTORS[kind](size) if finite_count(size) and kind in BUS_FACTORS else math.nan
        row["Full msg size (MB)"], row["algo bw (GB/s)"], row["bus bw (GB/s)"] = full, algo, bus
        if self.nodes is not None:
            row["node_span"] = self.nodes.span(row["Process Group Ranks"])
        self.rows.add(self.columns.add(row))
        self._summarize(row)
        self.stragglers.add(ranks, waits, row["earliest arrival rank"])

    def _summarize(self, row: dict) -> None:
        key = tuple("Unknown" if missing(row[name]) else row[name] for name in SUMMARY_IMPLICIT_KEYS)
        self.bandwidths.update(name for name in _BANDWIDTHS if not missing(row[name]))
        columns = self.groups.get(key)
        if columns is None:
            columns = self.groups[key] = {name: Values(self.column()) for name in _IMPLICIT_METRICS}
            columns.update((name, Sum()) for name in ("Process Group Name", "Group size", "Full msg size (MB)"))
        for name, values in columns.items():
            values.add(row[name])

    def columns_of(self) -> list[str]:
        return self.columns.columns(list(IMPLICIT_GENERAL)) + _span_column(self.nodes, self.rows)

    def wait_ranks(self) -> list[int]:
        """The ranks of the wait columns, in column order."""
        return [int(name[5:-10]) for name in self.columns.names if name.startswith("rank_") and name.endswith("_wait_time")]

    def summary(self) -> Table:
        """nccl_summary_implicit_sync."""
        if not len(self.rows):
            return Table([], [])
        metrics = [name for name in _IMPLICIT_METRICS if name not in _BANDWIDTHS or name in self.bandwidths]
        order = [*SUMMARY_IMPLICIT_KEYS, "Process Group Name", "Group size", "Full msg size (MB)",
                 *(f"{name}_{how}" for name in metrics for how in AGGREGATES), "count", "Total comm latency (ms)"]
        rows = []
        for key, columns in sorted_groups(self.groups):
            found = dict(zip(SUMMARY_IMPLICIT_KEYS, key))
            found.update((f"{name}_{how}", columns[name].aggregate(how)) for name in metrics for how in AGGREGATES)
            found.update((name, columns[name].aggregate("first")) for name in ("Process Group Name", "Group size",
                                                                                "Full msg size (MB)"))
            found["count"] = columns["comm_latency"].aggregate("size")
            found["Total comm latency (ms)"] = columns["comm_latency"].series_sum() / 1000  # type: ignore[attr-defined]
            rows.append([found[name] for name in order])
        return by_descending(Table(order, rows), "Total comm latency (ms)")

    def notes(self, notes: list[str]) -> None:
        _mismatch_note(notes, self.mismatched, "collective ids", "nccl_implicit_sync")


ALL2ALLV_META = ("Process Group Name", "Process Group Ranks", "Collective name", "Group size", "dtype", "stream")
ALL2ALLV_META_AT = [LONG_COLUMNS.index(name) for name in ALL2ALLV_META]
ALL2ALLV_PER_RANK = ("ts", "dur", "In msg nelems", "Out msg nelems", "In msg size (MB)", "Out msg size (MB)",
                     "In split size", "Out split size")
ALL2ALLV_PER_RANK_AT = [LONG_COLUMNS.index(name) for name in ALL2ALLV_PER_RANK]
ALL2ALLV_GENERAL = ["collective_id", *ALL2ALLV_META, "total data communicated (MB)", "total nelems communicated",
                    "wall_time (us)", "max_rank_dur (us)", "min_rank_dur (us)", "avg_rank_dur (us)", "throughput (GB/s)",
                    "max_rank_throughput (GB/s)", "min_rank_throughput (GB/s)", "size_imbalance", "skew in start time",
                    "skew in end time"]
SUMMARY_ALL2ALLV_PLAN = [
    *(("total data communicated (MB)", how, f"total data communicated (MB)_{how}") for how in AGGREGATES),
    *(("wall_time (us)", how, f"wall_time (us)_{how}") for how in AGGREGATES),
    ("wall_time (us)", "sum", "Total wall_time (us)"),
    *(("throughput (GB/s)", how, f"throughput (GB/s)_{how}") for how in AGGREGATES),
    *((name, how, f"{name}_{how}") for name in ("size_imbalance", "max_rank_dur (us)", "skew in start time",
                                                 "skew in end time") for how in ("mean", "max")),
    ("collective_id", "count", "count"),
    *((name, "first", name) for name in ("Process Group Ranks", "Collective name", "Group size"))]
_SUMMARY_ALL2ALLV_LABELS = ("Process Group Name", "dtype", "Process Group Ranks", "Collective name", "Group size")
_SUMMARY_ALL2ALLV_NUMBERS = ("total data communicated (MB)", "wall_time (us)", "throughput (GB/s)", "size_imbalance",
                             "max_rank_dur (us)", "skew in start time", "skew in end time")
_SUMMARY_ALL2ALLV_KEPT = ("total data communicated (MB)", "wall_time (us)", "throughput (GB/s)")
ALL2ALLV_RECORD = np.dtype([("labels", "i4"), ("float", "f8", (7,)), ("int", "i8", (7,)), ("kind", "u1", (7,))])
"""What nccl_summary_all2allv reads of an all_to_allv row (123 bytes): its labels' number (they are the
kernels' args: few), and its numbers each as a float or an int, as it was (a CSV writes 3 and 3.0 apart)."""
_FLOAT, _INT, _NONE, _OTHER = range(4)  # a number's kind (_OTHER: kept aside, as it is)


def _numeric(value: object) -> object:
    """A number, or NaN for anything else (where TraceLens would stop)."""
    return math.nan if finite_count(value) is None else value


class All2allv(Consumer):
    """nccl_all2allv (detailed: a row per all_to_allv, written as it comes, the biggest first) and its summary."""

    def __init__(self, rows: Rows, nodes: Nodes | None, column: Callable[[], ValueColumn] = MemoryColumn,
                 store: KernelStore | None = None, orderer: Orderer = order_in_memory) -> None:
        self.rows, self.nodes, self.column, self.orderer = rows, nodes, column, orderer
        self.columns = _Columns()
        self.mismatched: list[str] = []
        self.store = MemoryKernels(ALL2ALLV_RECORD) if store is None else store  # (:data:`ALL2ALLV_RECORD` a row)
        self.labels: dict[tuple, int] = {}
        self.other: dict[tuple[int, int], object] = {}  # (row, number) -> a number neither float nor int64
        self._pending: list[tuple] = []
        self._made = 0

    def collective(self, found: Collective) -> None:
        first = found.rows[0]
        if first[CNAME] != "all_to_allv":
            return
        if not found.same_args(ALL2ALLV_META_AT):
            self.mismatched.append(first[CID])
            return
        row: dict = {"collective_id": first[CID], **{name: first[at] for name, at in zip(ALL2ALLV_META, ALL2ALLV_META_AT)}}
        ranks = found.ranks
        for rank, member in zip(ranks, found.rows):
            for name, at in zip(ALL2ALLV_PER_RANK, ALL2ALLV_PER_RANK_AT):
                row[f"rank_{rank}_{name}"] = member[at]
        ts = [member[TS] for member in found.rows]
        dur = [member[DUR] for member in found.rows]
        ends = [start + length for start, length in zip(ts, dur)]
        earliest_start, latest_end = min(ts), max(ends)
        row["skew in start time"] = max(ts) - earliest_start
        row["skew in end time"] = latest_end - min(ends)
        for rank, start, end in zip(ranks, ts, ends):
            row[f"rank_{rank}_skew in start time"] = start - earliest_start
            row[f"rank_{rank}_skew in end time"] = latest_end - end
        sizes = [_numeric(member[IN_MB]) for member in found.rows]
        row["total data communicated (MB)"] = sum(sizes)
        row["total nelems communicated"] = sum(_numeric(member[IN_N]) for member in found.rows)
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
        if self.nodes is not None:
            row["node_span"] = self.nodes.span(row["Process Group Ranks"])
        self.rows.add(self.columns.add(row), row["total data communicated (MB)"])
        self._keep(row)

    def _keep(self, row: dict) -> None:
        """What the summary reads of a row, as a record (the store's, a block at a time)."""
        labels = tuple(row[name] for name in _SUMMARY_ALL2ALLV_LABELS)
        floats, ints, kinds = [0.0] * 7, [0] * 7, [_FLOAT] * 7
        for at, name in enumerate(_SUMMARY_ALL2ALLV_NUMBERS):
            value = row[name]
            if value.__class__ is float:
                floats[at] = value
            elif value.__class__ is int and -2**63 <= value < 2**63:
                ints[at], kinds[at] = value, _INT
            else:
                kinds[at] = _NONE if value is None else _OTHER
                if value is not None:
                    self.other[(self._made, at)] = value
        self._pending.append((self.labels.setdefault(labels, len(self.labels)), floats, ints, kinds))
        self._made += 1
        if len(self._pending) >= collectives.RECORD_BLOCK:
            self._store()

    def _store(self) -> None:
        if self._pending:
            self.store.append(np.array(self._pending, dtype=ALL2ALLV_RECORD))
            self._pending = []

    def columns_of(self) -> list[str]:
        return self.columns.columns(list(ALL2ALLV_GENERAL)) + _span_column(self.nodes, self.rows)

    def summary(self) -> Table:
        """nccl_summary_all2allv: over the rows in the table's order (the biggest first), as TraceLens's."""
        groups: dict[tuple, dict[str, Running]] = {}
        for row in self._by_size():
            key = (row["Process Group Name"], row["dtype"])
            if not any(missing(value) for value in key):
                add_to(groups, key, SUMMARY_ALL2ALLV_PLAN, row, kept=_SUMMARY_ALL2ALLV_KEPT, column=self.column)
        table = grouped(groups, ("Process Group Name", "dtype"), SUMMARY_ALL2ALLV_PLAN)
        table.columns.append("Total wall_time (ms)")
        for row in table.rows:
            row.append(row[table.columns.index("Total wall_time (us)")] / 1000)
        return by_descending(table, "Total wall_time (ms)")

    def _by_size(self) -> Iterator[dict]:
        """The rows as the summary reads them, the biggest total first (pandas' descending sort: ties in row
        order, NaN last), ordered by :attr:`orderer` and read a block at a time."""
        self._store()
        records = self.store.seal()
        labels = list(self.labels)

        def keys(first: int, end: int) -> tuple[np.ndarray, np.ndarray]:
            sizes = np.asarray(records["float"][first:end, 0])
            return np.zeros(len(sizes), np.int64), -sizes

        order, _ = self.orderer(len(records), keys, np.array([len(records)]))
        for first in range(0, len(records), collectives.RECORD_BLOCK):
            at = np.asarray(order[first:first + collectives.RECORD_BLOCK], dtype=np.int64)
            found = records[at]
            for made, label, floats, ints, kinds in zip(at.tolist(), found["labels"].tolist(), found["float"].tolist(),
                                                         found["int"].tolist(), found["kind"].tolist()):
                row = dict(zip(_SUMMARY_ALL2ALLV_LABELS, labels[label]))
                for n, name in enumerate(_SUMMARY_ALL2ALLV_NUMBERS):
                    kind = kinds[n]
                    row[name] = floats[n] if kind == _FLOAT else ints[n] if kind == _INT else None if kind == _NONE \
                        else self.other[(made, n)]
                row["collective_id"] = ""  # (a string: only counted)
                yield row

    def notes(self, notes: list[str]) -> None:
        _mismatch_note(notes, self.mismatched, "all_to_allv ids", "nccl_all2allv")


# ---------------------------------------------------------------- the heat map


class Heatmap(Consumer):
    """nccl_all2allv_heatmap: bytes each rank sent each rank over the all_to_allv (``In split size``)."""

    COLUMNS = ["src_rank", "dst_rank", "total_sent_MB", "avg_sent_MB", "count"]

    def __init__(self) -> None:
        self.pairs: dict[tuple[int, int], list[int]] = {}
        self.skipped = 0
        self._splits: dict[int, list[int] | None] = {}  # metadata row -> bytes sent to each rank (None: unreadable)

    def kernel(self, row: list, meta: int) -> None:
        if row[CNAME] != "all_to_allv":
            return
        found = self._splits.get(meta, False)
        if found is False:
            splits = split_sizes(row[IN_SP])
            size = DTYPE_BYTES.get(row[DT]) if isinstance(row[DT], str) else None
            readable = splits is not None and (row[GSIZE] is None or len(splits) == row[GSIZE]) and size is not None
            found = self._splits[meta] = [int(count) * size for count in splits] if readable else None  # type: ignore
        if found is None:
            self.skipped += 1
            return
        for peer, sent in enumerate(found):
            sums = self.pairs.setdefault((row[RANK], peer), [0, 0])
            sums[0] += sent
            sums[1] += 1

    def table(self, world_size: int, notes: list[str]) -> Table:
        if world_size > HEATMAP_MAX_WORLD:
            notes.append(f"collectives: no all2allv heat map beyond {HEATMAP_MAX_WORLD} ranks (as TraceLens)")
            return Table(list(self.COLUMNS), [])
        if self.skipped:
            notes.append(f"collectives: {self.skipped:,} all_to_allv kernels without readable split sizes, group size "
                         "and dtype are left out of the heat map")
        rows = [[src, dst, total / MIB, total / MIB / count, count]
                for (src, dst), (total, count) in sorted(self.pairs.items())]
        return Table(list(self.COLUMNS), rows)


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


class Stragglers(Consumer):
    """straggler_summary: per rank its wait summed and averaged over the collectives of nccl_implicit_sync,
    how often it arrived last (least wait) and first, its collective kernels' time; the least waiting (the
    straggler) first.  A rank's waits are kept (8 bytes a collective, whether it is in it or not: pandas'
    pairwise sum reads them all; where ``column`` puts them); the last to arrive at a collective is resolved
    in column order at the end."""

    COLUMNS = ["rank", "total_wait_time_us", "mean_wait_time_us", "times_arrived_last", "times_arrived_first",
               "pct_arrived_last", "num_collectives", "total_nccl_dur_us"]

    def __init__(self, column: Callable[[], ValueColumn] = MemoryColumn) -> None:
        self.count, self.column = 0, column
        self.waits: dict[int, Column] = {}
        self.last: dict[tuple[int, ...], int] = {}  # the ranks with the least wait at a collective -> how often
        self.first: dict[int, int] = {}
        self.durations: dict[int, Sum] = {}

    def kernel(self, row: list, meta: int) -> None:
        found = self.durations.get(row[RANK])
        if found is None:
            found = self.durations[row[RANK]] = Sum()
        found.add(row[DUR])

    def add(self, ranks: list[int], waits: list, earliest: int) -> None:
        for rank, wait in zip(ranks, waits):
            values = self.waits.get(rank)
            if values is None:
                values = self.waits[rank] = Column(self.column())
                for _ in range(self.count):
                    values.add(None)
            values.add(wait)
        for values in self.waits.values():
            if values.size == self.count:
                values.add(None)
        self.count += 1
        least = min(waits)
        tied = tuple(rank for rank, wait in zip(ranks, waits) if wait == least)
        self.last[tied] = self.last.get(tied, 0) + 1
        self.first[earliest] = self.first.get(earliest, 0) + 1

    def table(self, wait_columns: list[int]) -> Table:
        """The table, given the ranks of nccl_implicit_sync's wait columns in their order."""
        if not self.count:
            return Table([], [])
        place = {rank: at for at, rank in enumerate(wait_columns)}
        last: dict[int, int] = {}
        for tied, times in self.last.items():  # pandas' idxmin: the first least wait in column order
            winner = min(tied, key=place.__getitem__)
            last[winner] = last.get(winner, 0) + times
        rows = []
        for rank in sorted(wait_columns):
            values = self.waits[rank]
            total = values.series_sum()
            mean = total / values.count if values.count else math.nan
            times_last = last.get(rank, 0)
            durations = self.durations.get(rank)
            rows.append([rank, _round1(total), _round1(mean), times_last, self.first.get(rank, 0),
                         _round1(100.0 * times_last / self.count), self.count,
                         _round1(durations.aggregate("sum") if durations else 0)])
        return by_ascending(Table(list(self.COLUMNS), rows), "total_wait_time_us")


def _round1(value: float | int) -> float | int:
    """Python's round(x, 1) on pandas' numbers: numpy's rounding for floats, ints unchanged."""
    return value if isinstance(value, int) else float(np.round(value, 1))
