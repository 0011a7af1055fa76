"""Collectives across ranks: TraceLens's multi-rank collective report (its
``NcclAnalyser`` and ``generate_multi_rank_collective_report_pytorch``), as
pure functions over each rank's collective kernels (SPEC 16).

A rank's kernels come as :class:`RankKernels`: start, duration and a
metadata row per kernel (file order), the metadata rows (the collective's
args, see :data:`META`) listed once.  :func:`match` turns every rank's into
typed records (:data:`KERNEL`, 48 bytes a kernel, in a store the caller may
keep on disk) with their group and place; :func:`walk` reads them rank by
rank, makes each kernel's nccl_long row and, at a collective's lowest rank,
gathers the k-th kernel of its group on every rank: the tables are
consumers of that walk, writing their long tables' rows into a
:class:`Rows` as they come and keeping their summaries as running
aggregates (:mod:`.groupagg`).  The walk's consumers that
make TraceLens's per-collective tables (nccl_implicit_sync, nccl_all2allv,
the heat map, straggler_summary) are in :mod:`.collectivetables`; nccl_long
is here.  The report (``collectivereport.report``)
gives TraceLens's tables, named by its file stems, with its columns, rows,
order and rounding; docs/analyze.md states each definition.  Two
departures, where TraceLens stops with an error: kernels of one collective
id whose metadata differ across ranks are left out of the per-collective
tables (and named in the notes) instead of ending the run, and process
groups that share a name but not their ranks are told apart by their ranks.
"""
from __future__ import annotations

import ast
import math
import re
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Callable, Protocol, Sequence

import numpy as np

from .groupagg import (
    Running,
    Table,
    by_descending,
    descending_order,
    missing,
    sorted_groups,
)

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
    and each one's metadata row (an index into ``metas``, tuples in :data:`META`'s order); arrays, or memory
    maps of a file holding them (:func:`match` reads them a block at a time)."""

    rank: int
    ts: np.ndarray
    dur: np.ndarray
    meta: np.ndarray
    metas: list[tuple] = field(default_factory=list)
    seq: np.ndarray | None = None  # each kernel's Seq arg (-1: none), for matching beyond TraceLens's order
    peer: np.ndarray | None = None  # a send's Dst Rank, a recv's Src Rank (-1: none)
    groups: dict[str, tuple[int, ...]] = field(default_factory=dict)  # its file's pg_config: group name -> ranks


@dataclass
class Report:
    tables: dict[str, Table]
    notes: list[str]
    sinks: list = field(default_factory=list)  # where its long tables' rows went (their maker closes them)
    figures: dict = field(default_factory=dict)  # what its maker gathered of the rows as they went by


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


def finite_count(value: object) -> int | float | None:
    """A number of elements or ranks, or None for anything else (TraceLens would stop on it)."""
    return value if value.__class__ in (int, float) and math.isfinite(value) else None


# ---------------------------------------------------------------- the kernels, kept as records


KERNEL = np.dtype([("ts", "f8"), ("dur", "f8"), ("meta", "i4"), ("group", "i4"), ("index", "i4"), ("sorted", "i4"),
                   ("rank", "i4"), ("peer", "i4"), ("seq", "i8")])
"""A collective kernel as the report keeps it (48 bytes): start and duration, its metadata row, its group
(an index into :attr:`Matched.groups`) and its place in the group (TraceLens's ``index_in_group``); the
``sorted`` of a rank's i-th record is the file position of its i-th kernel in (group, place) order; its
rank, and what the matching beyond TraceLens reads (:mod:`.collectivematch`): a send's or recv's peer and
its ``Seq`` arg (-1: none), so that they are on disk with the records."""


class KernelStore(Protocol):
    """Where the ranks' records go, rank after rank: in memory (:class:`MemoryKernels`), or on disk beyond a
    budget (analyze's, :mod:`streamtrace.io.collectivespill`)."""

    def append(self, records: np.ndarray) -> int:
        """Keep a rank's records; the position of the first among all."""
        ...

    def seal(self) -> np.ndarray:
        """Every record (an array, or a memory map of the file holding them)."""
        ...


class MemoryKernels:
    """The records in memory (the report's default store; ``dtype``: of other records than kernels')."""

    def __init__(self, dtype: np.dtype = KERNEL) -> None:
        self.dtype = dtype
        self._parts: list[np.ndarray] = []
        self._size = 0

    def append(self, records: np.ndarray) -> int:
        self._parts.append(records)
        self._size += len(records)
        return self._size - len(records)

    def seal(self) -> np.ndarray:
        return np.concatenate(self._parts) if self._parts else np.empty(0, self.dtype)


@dataclass
class Matched:
    """Every rank's kernels as records, and what matching them reads: each rank's slice of the records and,
    per group, where its kernels sorted by place start; per (group, group ranks), the ranks holding such
    kernels. A collective is the k-th kernel of a group on every rank whose k-th kernel has its group ranks."""

    ranks: list[int]
    starts: list[int]
    counts: list[int]
    records: np.ndarray
    metas: list[tuple]
    groups: list[object]
    slices: list[dict[int, tuple[int, int]]]  # per rank: group -> (first position in place order, kernels)
    pg: list[int]  # metadata row -> its Process Group Ranks' code (-1 for all when matching is simplified)
    meta_groups: list[int]  # metadata row -> its group
    classes: dict[tuple[int, int], list[int]]  # (group, ranks' code) -> positions of the ranks holding one
    simplified: bool
    _templates: dict[int, list] = field(default_factory=dict)

    def template(self, meta: int) -> list:
        """The nccl_long columns a kernel's metadata row gives (Process Group Ranks to stream), made once."""
        found = self._templates.get(meta)
        if found is None:
            values = self.metas[meta]
            in_mb, out_mb = _sizes(values)
            found = self._templates[meta] = [values[PG_RANKS], values[NAME], values[GROUP_SIZE], values[DTYPE],
                                             values[IN_NELEMS], in_mb, values[OUT_NELEMS], out_mb, values[IN_SPLIT],
                                             values[OUT_SPLIT], values[STREAM]]
        return found

    def kernel_at(self, at: int, group: int, place: int, pg: int) -> int:
        """The record of the rank at position ``at`` in this collective, or -1."""
        found = self.slices[at].get(group)
        if found is None or place >= found[1]:
            return -1
        start = self.starts[at]
        record = start + int(self.records["sorted"][start + found[0] + place])
        return record if self.pg[int(self.records["meta"][record])] == pg else -1


class Orderer(Protocol):
    """What orders a rank's kernels by group, then start, then file position (TraceLens's rank 'first'): in
    memory (:func:`order_in_memory`), or on disk beyond a budget (analyze's, :mod:`streamtrace.io.collectivesort`)."""

    def __call__(self, count: int, keys: Callable[[int, int], tuple[np.ndarray, np.ndarray]],
                 sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``keys(first, end)``: the groups and starts of kernels ``first`` to ``end``; ``sizes``: the kernels of
        each group. Returns the file positions in that order and each kernel's place in its group (32-bit
        arrays, or memory maps of files holding them)."""
        ...


def order_in_memory(count: int, keys: Callable[[int, int], tuple[np.ndarray, np.ndarray]],
                    sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:class:`Orderer` in memory: one stable sort of the whole rank."""
    group, ts = keys(0, count)
    order = np.lexsort((ts, group)).astype(np.int32)
    index = np.empty(count, np.int32)
    index[order] = np.arange(count, dtype=np.int32) - group_firsts(sizes)[group[order]]
    return order, index


def group_firsts(sizes: np.ndarray) -> np.ndarray:
    """Where each group's kernels start in group order."""
    return (np.cumsum(sizes) - sizes).astype(np.int32)


def match(ranks: Sequence[RankKernels], store: KernelStore | None = None, let_go: bool = False,
          orderer: Orderer = order_in_memory) -> Matched:
    """The ranks' kernels as records in ``store`` (memory by default), with their groups and places:
    TraceLens's matching (group ``all`` and places per rank when no kernel names a group and each rank
    uses one stream), each rank's kernels ordered by ``orderer`` and read :data:`RECORD_BLOCK` at a time
    (they may be memory maps).  ``let_go``: each rank's arrays are emptied once its records are made (its
    caller is done with them: the records hold them, on disk beyond the store's budget)."""
    ranks = sorted(ranks, key=lambda kernels: kernels.rank)
    metas: dict[tuple, int] = {}
    remaps = []
    for kernels in ranks:  # one table of metadata rows for all ranks, holding the rows a kernel uses
        remap = np.full(len(kernels.metas), -1, dtype=np.int32)
        for at in np.flatnonzero(_uses(kernels.meta, len(kernels.metas))).tolist():
            remap[at] = metas.setdefault(kernels.metas[at], len(metas))
        remaps.append(remap)
    rows = list(metas)
    pg_missing = all(missing(meta[PG_NAME]) or meta[PG_NAME] == UNKNOWN_GROUP for meta in rows)
    simplified = pg_missing and all(
        len({rows[at][STREAM] for at in remap[remap >= 0].tolist() if not missing(rows[at][STREAM])}) <= 1 for remap in remaps)
    names: dict[object, int] = {}
    group_of = np.array([names.setdefault("all" if simplified else UNKNOWN_GROUP if missing(meta[PG_NAME])
                                          else meta[PG_NAME], len(names)) for meta in rows], dtype=np.int32)
    values: dict[object, int] = {}
    pg = [-1 if simplified else values.setdefault(None if missing(meta[PG_RANKS]) else meta[PG_RANKS], len(values))
          for meta in rows]
    matched = Matched([], [], [], np.empty(0, KERNEL), rows, list(names), [], pg, group_of.tolist(), {}, simplified)
    store = store if store is not None else MemoryKernels()
    for kernels, remap in zip(ranks, remaps):
        count = len(kernels.ts)

        def keys(first: int, end: int, kernels: RankKernels = kernels, remap: np.ndarray = remap) -> tuple:
            return group_of[remap[kernels.meta[first:end]]], kernels.ts[first:end]

        used = np.flatnonzero(remap >= 0)
        sizes = np.zeros(len(names), np.int64)
        for first in range(0, count, RECORD_BLOCK):
            sizes += np.bincount(keys(first, first + RECORD_BLOCK)[0], minlength=len(names))
        order, index = orderer(count, keys, sizes)
        at = len(matched.ranks)
        matched.ranks.append(kernels.rank)
        matched.starts.append(_stored(store, kernels, remap, group_of, index, order))
        matched.counts.append(count)
        present = np.flatnonzero(sizes).tolist()
        matched.slices.append(dict(zip(present, zip(group_firsts(sizes)[present].tolist(), sizes[present].tolist()))))
        for group in present:  # (a group's kernels use the metadata rows of that group the rank uses)
            for code in {pg[int(row)] for row in remap[used].tolist() if group_of[row] == group}:
                matched.classes.setdefault((group, code), []).append(at)
        del order, index
        if let_go:
            kernels.ts = kernels.dur = np.empty(0)
            kernels.meta = np.empty(0, np.int32)
            kernels.seq = kernels.peer = None
    matched.records = store.seal()
    return matched


def _uses(meta: np.ndarray, rows: int) -> np.ndarray:
    """Which metadata rows the kernels use (read a block at a time)."""
    used = np.zeros(rows, bool)
    for first in range(0, len(meta), RECORD_BLOCK):
        used[np.unique(meta[first:first + RECORD_BLOCK])] = True
    return used


RECORD_BLOCK = 65_536  # records made and stored together (3 MiB: a rank's records are never whole in memory)


def _stored(store: KernelStore, kernels: RankKernels, remap: np.ndarray, group_of: np.ndarray, index: np.ndarray,
            order: np.ndarray) -> int:
    """A rank's records, made and appended to ``store`` :data:`RECORD_BLOCK` at a time; the first's position."""
    start = None
    for first in range(0, max(len(order), 1), RECORD_BLOCK):
        part = slice(first, first + RECORD_BLOCK)
        meta = remap[kernels.meta[part]]
        records = np.empty(len(meta), KERNEL)
        records["ts"], records["dur"], records["meta"], records["group"] = (kernels.ts[part], kernels.dur[part],
                                                                             meta, group_of[meta])
        records["index"], records["sorted"], records["rank"] = index[part], order[part], kernels.rank
        records["peer"] = -1 if kernels.peer is None else kernels.peer[part]
        records["seq"] = -1 if kernels.seq is None else kernels.seq[part]
        offset = store.append(records)
        start = offset if start is None else start
    return start  # type: ignore[return-value]


# ---------------------------------------------------------------- walking the kernels, collective by collective


LONG_COLUMNS = ["collective_id", "index_in_group", "rank", "Process Group Name", "Process Group Ranks", "Collective name",
                "Group size", "dtype", "In msg nelems", "In msg size (MB)", "Out msg nelems", "Out msg size (MB)",
                "In split size", "Out split size", "stream", "ts", "dur"]
CID, PLACE, RANK, GROUP, RANKS, CNAME, GSIZE, DT, IN_N, IN_MB, OUT_N, OUT_MB, IN_SP, OUT_SP, STRM, TS, DUR = range(17)


@dataclass
class Collective:
    """One collective: its key (id, group ranks; None when matching is simplified) and its kernels'
    nccl_long rows, in rank order."""

    key: tuple
    rows: list[list]
    metas: list[int]  # each kernel's metadata row

    def same_args(self, at: Sequence[int]) -> bool:
        """Do the kernels agree on these columns of their rows (they do if they share their metadata row)."""
        first = self.metas[0]
        return all(meta == first for meta in self.metas) or all(same([row[n] for row in self.rows]) for n in at)

    @property
    def ranks(self) -> list[int]:
        return [row[RANK] for row in self.rows]


class Consumer:
    """What the walk feeds: every kernel's nccl_long row (rank by rank, file order), every collective (in
    order of first appearance: the lowest rank's file order)."""

    def kernel(self, row: list, meta: int) -> None:
        """A kernel's row; ``meta``: its metadata row's number (what depends on it alone can be kept by it)."""

    def collective(self, found: Collective) -> None:
        pass


def _sizes(meta: tuple) -> tuple[float | None, float | None]:
    size = DTYPE_BYTES.get(meta[DTYPE]) if isinstance(meta[DTYPE], str) else None
    nelems, out = finite_count(meta[IN_NELEMS]), finite_count(meta[OUT_NELEMS])
    if size is None or nelems is None:
        return None, None
    return nelems * size / MIB, None if out is None else out * size / MIB


def walk(matched: Matched, consumers: Sequence[Consumer], block: int = 65_536) -> None:
    """Feed every kernel and every collective to ``consumers``, one rank's block of records at a time; a
    collective is gathered (the k-th kernel of its group on every rank holding one) at its lowest rank."""
    rows = matched.records
    for at, rank in enumerate(matched.ranks):
        for first in range(matched.starts[at], matched.starts[at] + matched.counts[at], block):
            chunk = rows[first:min(first + block, matched.starts[at] + matched.counts[at])]
            for ts, dur, meta, group, place in zip(chunk["ts"].tolist(), chunk["dur"].tolist(), chunk["meta"].tolist(),
                                                   chunk["group"].tolist(), chunk["index"].tolist()):
                row = _long_row(matched, rank, ts, dur, meta, group, place)
                for consumer in consumers:
                    consumer.kernel(row, meta)
                members = _members(matched, at, group, place, matched.pg[meta])
                if members is not None:
                    found = Collective((row[CID], None if matched.simplified else row[RANKS]), [row, *members[0]],
                                       [meta, *members[1]])
                    for consumer in consumers:
                        consumer.collective(found)


def _long_row(matched: Matched, rank: int, ts: float, dur: float, meta: int, group: int, place: int) -> list:
    name = matched.groups[group]
    return [str(place) if matched.simplified else f"{name}_{place}", place, rank, name, *matched.template(meta),
            int(ts) if ts.is_integer() else ts, int(dur) if dur.is_integer() else dur]  # (JSON's integers, as TraceLens)


def _members(matched: Matched, at: int, group: int, place: int, pg: int) -> tuple[list[list], list[int]] | None:
    """The other ranks' rows (and metadata rows) of the collective whose kernel at rank position ``at`` is
    this, if ``at`` is its lowest rank (else None: it was gathered there)."""
    rows, metas = [], []
    for other in matched.classes[(group, pg)]:
        if other == at:
            continue
        record = matched.kernel_at(other, group, place, pg)
        if record < 0:
            continue
        if other < at:
            return None
        found = matched.records[record]
        metas.append(int(found["meta"]))
        rows.append(_long_row(matched, matched.ranks[other], float(found["ts"]), float(found["dur"]), metas[-1], group,
                              place))
    return rows, metas


def same(values: list) -> bool:
    first = values[0]
    return all(value == first or (missing(value) and missing(first)) for value in values[1:])


# ---------------------------------------------------------------- rows as they come


class Rows:
    """A table's rows as they are produced (lists, or dicts naming their columns), kept here in memory;
    analyze writes them to disk as they come (:mod:`streamtrace.commands.analyses.collectives`)."""

    def __init__(self) -> None:
        self.rows: list = []
        self.keys: list = []

    def add(self, row: list | dict, key: object = None) -> None:
        """A row; ``key``: the value it is sorted by (largest first) when the table is made."""
        self.rows.append(row)
        self.keys.append(key)

    def __len__(self) -> int:
        return len(self.rows)

    def table(self, columns: list[str], by_key: bool = False) -> Table:
        """The table, its rows in the order made or ``by_key``."""
        return Table(columns, laid_out(self.rows, self.keys, columns, by_key))


def laid_out(rows: list, keys: Sequence, columns: list[str], by_key: bool) -> list[list]:
    """Rows as lists in ``columns``' order (those made as dicts), in the order made or by their keys."""
    listed = [[row.get(name) for name in columns] if isinstance(row, dict) else row for row in rows]
    return [listed[at] for at in descending_order(keys)] if by_key else listed


class Nodes:
    """TraceLens's node columns, added to each row as it is made: ``node_id`` (rank // GPUs per node, ranks
    below the world size) and ``node_span`` (intra_node when a group's ranks are on one node, inter_node,
    unknown without ranks)."""

    def __init__(self, gpus_per_node: int, world_size: int) -> None:
        self.gpus_per_node, self.world_size = gpus_per_node, world_size
        self._spans: dict[object, str] = {}

    def node(self, rank: int) -> int | None:
        return rank // self.gpus_per_node if 0 <= rank < self.world_size else None

    def span(self, ranks: object) -> str:
        found = self._spans.get(ranks)
        if found is None:
            members = pg_ranks(ranks)
            nodes = {member // self.gpus_per_node for member in members}
            found = self._spans[ranks] = "unknown" if not members else "intra_node" if len(nodes) == 1 else "inter_node"
        return found

    def table(self, table: Table) -> Table:
        """A whole (small) table's node columns; none without rows."""
        if not table.rows:
            return table
        columns, rows = list(table.columns), [list(row) for row in table.rows]
        for name, value in (("rank", self.node), ("Process Group Ranks", self.span)):
            if name in table.columns:
                at = table.columns.index(name)
                columns.append("node_id" if name == "rank" else "node_span")
                for row in rows:
                    row.append(value(row[at]))
        return Table(columns, rows)


# ---------------------------------------------------------------- nccl_long, nccl_summary_long


SUMMARY_LONG_KEYS = ("rank", "Process Group Name", "Process Group Ranks", "Collective name", "Group size", "dtype",
                     "In msg nelems", "Out msg nelems", "In split size", "Out split size", "stream")
_SUMMARY_LONG_AT = [LONG_COLUMNS.index(name) for name in SUMMARY_LONG_KEYS]
SUMMARY_LONG_COLUMNS = [*SUMMARY_LONG_KEYS, "In msg size (MB)_first", "Out msg size (MB)_first",
                        *(f"dur_{how}" for how in ("sum", *LONG_AGGREGATES)), "operation_count"]


class LongTable(Consumer):
    """nccl_long (a row per kernel, rank by rank, in file order, written as it comes) and nccl_summary_long
    (per rank and collective args: its kernels' durations)."""

    def __init__(self, rows: Rows, nodes: Nodes | None) -> None:
        self.rows, self.nodes = rows, nodes
        self.groups: dict[tuple, list] = {}  # key -> first in and out size (of the metadata), durations, count
        self._group_of: dict[tuple[int, int], list | None] = {}  # (rank, metadata row) -> its group, None if left out

    def kernel(self, row: list, meta: int) -> None:
        self.rows.add(row if self.nodes is None else [*row, self.nodes.node(row[RANK]), self.nodes.span(row[RANKS])])
        group = self._group_of.get((row[RANK], meta), False)
        if group is False:
            key = tuple(row[at] for at in _SUMMARY_LONG_AT)
            group = self._group_of[(row[RANK], meta)] = None if any(missing(value) for value in key) else \
                self.groups.setdefault(key, [row[IN_MB], row[OUT_MB], Running(), 0])
        if group is not None:
            group[2].add(row[DUR])
            group[3] += 1

    def columns(self) -> list[str]:
        return LONG_COLUMNS + (["node_id", "node_span"] if self.nodes is not None and len(self.rows) else [])

    def summary(self) -> Table:
        """nccl_summary_long."""
        rows = [[*key, first_in, first_out, *(dur.aggregate(how) for how in ("sum", *LONG_AGGREGATES)), count]
                for key, (first_in, first_out, dur, count) in sorted_groups(self.groups)]
        return by_descending(Table(SUMMARY_LONG_COLUMNS, rows), "dur_sum")


class _Dropped(Rows):
    """Rows let go as they come (a table whose summary alone is wanted)."""

    def add(self, row: list | dict, key: object = None) -> None:
        pass


def summary_long(ranks: Sequence[RankKernels]) -> Table:
    """nccl_summary_long alone (TraceLens's ``coll_analysis`` over one trace): nccl_long's rows let go."""
    long = LongTable(_Dropped(), None)
    walk(match(ranks), [long])
    return long.summary()


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
