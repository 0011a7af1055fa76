"""TraceLens's collective report put together (:func:`report`), and what it gives beyond TraceLens:
bandwidth in SI units with nccl-tests' bus factors, notes on sequences and clocks, why a straggler is late."""
from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np

from . import collectivebuckets, collectivematch
from .collectivebuckets import Spill
from .collectivematch import Kernels, Matching, group_ranks, known_groups, ranges
from .collectives import (
    BUS_FACTORS,
    CNAME,
    DTYPE,
    DTYPE_BYTES,
    DUR,
    GROUP_SIZE,
    IN_NELEMS,
    NAME,
    OUT_NELEMS,
    PG_RANKS,
    RANKS,
    TS,
    TYPE_OF,
    Collective,
    Consumer,
    KernelStore,
    LongTable,
    Nodes,
    Orderer,
    RankKernels,
    Report,
    Rows,
    Table,
    match,
    missing,
    order_in_memory,
    pg_ranks,
    walk,
)
from .collectivetables import All2allv, Heatmap, ImplicitSync
from .groupagg import MemoryColumn, ValueColumn

# ---------------------------------------------------------------- beyond TraceLens


NCCL_TESTS_TYPES = {**TYPE_OF, "broadcast": "broadcast", "_broadcast_oop": "broadcast", "reduce": "reduce",
                    "_reduce_oop": "reduce"}
"""Collective names -> kinds the bandwidth table covers (TraceLens's, with broadcast and reduce)."""
NCCL_TESTS_FACTORS: dict[str, Callable[[int], float]] = {
    **BUS_FACTORS, "broadcast": lambda n: 1.0, "reduce": lambda n: 1.0,
}
"""nccl-tests' bus bandwidth factors (its PERFORMANCE.md): the data each rank moves over the slowest link
per byte of the collective's size."""
BANDWIDTH_COLUMNS = ["collective_id", "Process Group Name", "Process Group Ranks", "Collective name", "dtype",
                     "Group size", "ranks", "ranks missing", "size (bytes)", "latency (us)", "last arrival rank",
                     "wait for last (us)", "algo bw (GB/s, 1e9)", "bus factor", "bus bw (GB/s, 1e9)"]


def _bandwidth(kernels: Kernels, matching: Matching, known: dict[str, tuple[int, ...]], rows: Rows,
               nodes: Nodes | None) -> list[str]:
    """collective_bandwidth (not TraceLens's) into ``rows``, its columns returned: every matched collective of
    a kind nccl-tests measures, broadcast and reduce included: its size in bytes (the out size of an
    all-gather, else the in size), TraceLens's latency (least duration), the rank arriving last and how
    long the first waited for it, and nccl-tests' algorithm and bus bandwidths in SI units (10^9 bytes/s).
    Collectives as :func:`collectivematch.match` matches them (by Seq where it can, else TraceLens's order;
    the id is TraceLens's on the lowest rank).  all_to_allv (sizes per rank) and send/recv (p2p_pairs) have
    no row."""
    for found in matching:
        meta = kernels.meta(found.rows[0])
        kind = NCCL_TESTS_TYPES.get(meta[NAME]) if isinstance(meta[NAME], str) else None
        if kind not in NCCL_TESTS_FACTORS or not collectivematch.consistent(kernels, found.rows):
            continue
        ranks = kernels.rank[found.rows].tolist()
        ts, dur = kernels.times(found.rows)
        latency = min(dur)
        last = max(ts)
        group = kernels.group(found.rows[0])
        listed = group_ranks(meta[PG_RANKS], meta[GROUP_SIZE], known, group[0])
        size = _size_bytes(meta, kind)
        algo = size / (latency / 1e6) / 1e9 if size is not None and latency > 0 else math.nan
        factor = NCCL_TESTS_FACTORS[kind](meta[GROUP_SIZE]) if isinstance(meta[GROUP_SIZE], int) and \
            meta[GROUP_SIZE] > 0 else math.nan
        row = [kernels.cid(found.rows[0]), group[0], meta[PG_RANKS], meta[NAME], meta[DTYPE], meta[GROUP_SIZE],
               len(ranks), len(set(listed) - set(ranks)) if listed is not None else None, size, latency,
               ranks[ts.index(last)], last - min(ts), algo, factor, algo * factor]
        rows.add(row if nodes is None else [*row, nodes.span(meta[PG_RANKS])])
    return BANDWIDTH_COLUMNS + (["node_span"] if nodes is not None and len(rows) else [])


def _size_bytes(meta: tuple, kind: str) -> int | None:
    """nccl-tests' size of a collective: an all-gather's output, any other's input, in bytes."""
    nelems = meta[OUT_NELEMS] if kind == "allgather" else meta[IN_NELEMS]
    width = DTYPE_BYTES.get(meta[DTYPE]) if isinstance(meta[DTYPE], str) else None
    return nelems * width if isinstance(nelems, int) and width is not None else None


class Sequences(Consumer):
    """Say where matching by order can pair different collectives: a group whose ranks hold different
    numbers of its collective kernels (a rank traced over another window, a collective missing on one
    rank), and group members absent from the inputs; and when a matched collective ends on one rank before
    it starts on another, which one clock cannot show (NCCL's ranks finish a collective together): the
    ranks' clocks disagree, or order matching paired different collectives; TraceLens's waits and skews
    carry that error."""

    def __init__(self, simplified: bool) -> None:
        self.simplified = simplified
        self.counts: dict[tuple, dict[int, int]] = {}
        self.present: set[int] = set()
        self.late: list[tuple] = []  # (the first of) the largest gap and its collective
        self._groups: dict[int, tuple | None] = {}  # metadata row -> its group's key (None: not counted)
        self.gaps = self.matched = 0

    def kernel(self, row: list, meta: int) -> None:
        self.present.add(row[2])
        group = self._groups.get(meta, False)
        if group is False:  # (point-to-point: each rank of a group sends and receives its own number)
            group = self._groups[meta] = None if row[CNAME] not in NCCL_TESTS_TYPES else \
                ("all", None) if self.simplified else (row[3], row[RANKS])
        if group is not None:
            per_rank = self.counts.setdefault(group, {})
            per_rank[row[2]] = per_rank.get(row[2], 0) + 1

    def collective(self, found: Collective) -> None:
        name = found.rows[0][CNAME]
        if len(found.rows) < 2 or not isinstance(name, str) or name not in NCCL_TESTS_TYPES:
            return
        self.matched += 1
        gap = max(row[TS] for row in found.rows) - min(row[TS] + row[DUR] for row in found.rows)
        if gap > 0:
            self.gaps += 1
            if not self.late or gap > self.late[0]:
                self.late = [gap, found.key[0]]

    def notes(self, notes: list[str]) -> None:
        for (name, _), per_rank in self.counts.items():
            if len(set(per_rank.values())) > 1:
                spread = ", ".join(f"rank {rank}: {count}" for rank, count in sorted(per_rank.items()))
                notes.append(f"collectives: group {name} has different numbers of kernels per rank ({spread}); "
                             "they are matched by order (as TraceLens), so later collectives of the group may pair "
                             "kernels of different collectives")
        absent = sorted({rank for _, members in self.counts for rank in pg_ranks(members)} - self.present)
        if absent:
            notes.append(f"collectives: process groups list ranks the inputs do not hold ({ranges(absent)}): "
                         "their collectives are matched over the ranks present")
        if self.gaps:
            gap, cid = self.late
            notes.append(f"collectives: {self.gaps:,} of {self.matched:,} matched collectives end on one rank before they "
                         f"start on another (by up to {gap:,.1f} us, at {cid}), which one clock cannot show: the ranks' "
                         "clocks disagree, or matching by order paired different collectives; waits and skews carry "
                         "that error")


# ---------------------------------------------------------------- why the straggler is late


SLOWER_GPU = 0.9  # a speed score below this: its compute kernels run 10 % or more slower than the fastest rank's
MORE_WORK = 1.05  # a work ratio above this: it runs more compute than the median rank
MORE_IDLE_POINTS = 5.0  # GPU idle this many percentage points above the median rank's: waiting on its host
CAUSE_COLUMNS = ["rank", "times_arrived_last", "pct_arrived_last", "gpu_speed_score", "work_ratio", "idle_time_pctg",
                 "median_idle_time_pctg", "why"]


def straggler_causes(stragglers: list[dict], kernels: list[dict], temporal: list[dict]) -> Table:
    """straggler_causes (not TraceLens's): per rank of straggler_summary, from HTA's kernel_breakdown and
    temporal_breakdown rows, why it would arrive late.

    ``gpu_speed_score``: over the compute kernels every rank ran (HTA's named ones), the fastest rank's
    mean duration over this rank's, weighted by this rank's time in each (NVIDIA's straggler detection
    takes medians; HTA's breakdown gives means): 1 is as fast as the fastest rank on every kernel.
    ``work_ratio``: this rank's count of each such kernel at the median rank's mean duration, over the
    median rank's.  ``why`` (ranks that arrive last at least once): slower GPU, more work, else
    host-bound (GPU idle more than the median rank's: only when speed and work do not explain it, as
    the ranks waiting for it count that wait as GPU time), or none of them."""
    compute = [row for row in kernels if row["kernel_type"] == "COMPUTATION" and row["name"] != "others"]
    ranks = sorted({row["rank"] for row in stragglers})
    by_name: dict[str, dict[int, dict]] = {}
    for row in compute:
        if row["rank"] in ranks and row["mean (us)"] and row["mean (us)"] > 0:
            by_name.setdefault(row["name"], {})[row["rank"]] = row
    shared = {name: per_rank for name, per_rank in by_name.items() if len(per_rank) == len(ranks)}
    speed: dict[int, float] = {}
    work: dict[int, float] = {}
    for rank in ranks:
        time = sum(per_rank[rank]["sum (us)"] for per_rank in shared.values())
        fastest = sum(per_rank[rank]["sum (us)"] * min(row["mean (us)"] for row in per_rank.values()) /
                      per_rank[rank]["mean (us)"] for per_rank in shared.values())
        speed[rank] = fastest / time if time > 0 else math.nan
        work[rank] = sum(per_rank[rank]["sum (us)"] / per_rank[rank]["mean (us)"] *
                         float(np.median([row["mean (us)"] for row in per_rank.values()])) for per_rank in shared.values())
    median_work = float(np.median(list(work.values()))) if work else math.nan
    idle = {row["rank"]: row["idle_time_pctg"] for row in temporal}
    known_idle = [idle[rank] for rank in ranks if not missing(idle.get(rank))]
    median_idle = float(np.median(known_idle)) if known_idle else math.nan
    rows = []
    for row in sorted(stragglers, key=lambda row: row["rank"]):
        rank = row["rank"]
        ratio = work[rank] / median_work if median_work > 0 else math.nan
        why = _why(row, speed[rank], ratio, idle.get(rank), median_idle) if row["times_arrived_last"] else ""
        rows.append([rank, row["times_arrived_last"], row["pct_arrived_last"], speed[rank], ratio, idle.get(rank),
                     median_idle, why])
    return Table(list(CAUSE_COLUMNS), rows)


def _why(row: dict, speed: float, work: float, idle: object, median_idle: float) -> str:
    causes = []
    if speed < SLOWER_GPU:
        causes.append(f"slower GPU (its compute kernels run at {speed:.2f} of the fastest rank's speed)")
    if work > MORE_WORK:
        causes.append(f"more work ({work:.2f}x the median rank's compute)")
    if not causes and not missing(idle) and idle - median_idle >= MORE_IDLE_POINTS:  # type: ignore[operator]
        causes.append(f"host-bound (its GPU idles {idle:.1f}% of the time, the median rank's {median_idle:.1f}%)")
    found = "; ".join(causes) if causes else "no cause found in GPU speed, work or GPU idle time"
    return f"rank {row['rank']} arrives last at {row['times_arrived_last']} of {row['num_collectives']} collectives: {found}"


# ---------------------------------------------------------------- the report


def report(ranks: Sequence[RankKernels], gpus_per_node: int | None = None, world_size: int | None = None,
           heatmap: bool = False, align_clocks: bool = False, store: KernelStore | None = None,
           rows: Callable[[str], Rows] = lambda name: Rows(), column: Callable[[], ValueColumn] = MemoryColumn,
           let_go: bool = False, orderer: Orderer = order_in_memory, spill: Spill | None = None,
           all2allv_store: KernelStore | None = None) -> Report:
    """TraceLens's tables for these ranks' collective kernels (none without kernels), by its file stems.

    ``gpus_per_node``: adds its node columns (TraceLens takes the first rank file's deviceProperties
    count); ``world_size``: the ranks it counts (default: the highest rank + 1); ``heatmap``: the
    all2allv heat map too (its ``--all2allv_heatmap``); ``align_clocks``: the tables beyond TraceLens's
    on the ranks' clocks aligned on collective ends.  ``store``: where the kernels' records go (memory
    by default); ``rows``: where the rows of the long tables (a row per kernel or collective) go as they
    are made, by table (memory by default; a table whose rows went elsewhere is what its ``table`` gives);
    ``column``: where the summaries' kept columns go (a number per collective; memory by default);
    ``let_go``: the ranks' arrays are emptied as their records are made; ``orderer``: what orders each rank's
    kernels by group and start (in memory by default; :func:`.collectives.match`); ``spill``: where the matching
    beyond TraceLens sorts and keeps what it matched past a budget (in memory without; :mod:`.collectivebuckets`);
    ``all2allv_store``: where what nccl_summary_all2allv reads of each all_to_allv goes (memory by default; the
    summary reads it in ``orderer``'s order, its kept columns where ``column`` puts them)."""
    notes: list[str] = []
    ranks = [kernels for kernels in ranks if len(kernels.ts)]
    if not ranks:
        return Report({}, notes)
    matched = match(ranks, store, let_go, orderer)
    world = world_size if world_size is not None else matched.ranks[-1] + 1
    nodes = Nodes(gpus_per_node, world) if gpus_per_node else None
    long = LongTable(rows("nccl_long"), nodes)
    implicit = ImplicitSync(rows("nccl_implicit_sync"), nodes, matched.simplified, column)
    all2allv = All2allv(rows("nccl_all2allv"), nodes, column, all2allv_store, orderer)
    sequences = Sequences(matched.simplified)
    consumers: list[Consumer] = [long, implicit.stragglers, implicit, all2allv, sequences]
    heat = Heatmap() if heatmap else None
    if heat is not None:
        consumers.append(heat)
    walk(matched, consumers)
    implicit.notes(notes)
    all2allv.notes(notes)
    small = {"nccl_summary_implicit_sync": implicit.summary(), "nccl_summary_long": long.summary()}
    if len(all2allv.rows):
        small["nccl_summary_all2allv"] = all2allv.summary()
    if heat is not None:
        found = heat.table(world, notes)
        if found.rows:
            small["nccl_all2allv_heatmap"] = found
    tables = {name: nodes.table(table) if nodes is not None else table for name, table in small.items()}
    tables["nccl_long"] = long.rows.table(long.columns())
    tables["nccl_implicit_sync"] = implicit.rows.table(implicit.columns_of()) if len(implicit.rows) else Table([], [])
    if len(all2allv.rows):
        tables["nccl_all2allv"] = all2allv.rows.table(all2allv.columns_of(), by_key=True)
    stragglers = implicit.stragglers.table(implicit.wait_ranks())
    if stragglers.rows:
        tables["straggler_summary"] = nodes.table(stragglers) if nodes is not None else stragglers
    kernels = collectivematch.kernels_of(matched)
    matching = collectivebuckets.match(kernels, notes, spill)
    known = known_groups(ranks)
    bandwidth = rows("collective_bandwidth")
    columns = _bandwidth(kernels, matching, known, bandwidth, nodes)
    if len(bandwidth):
        tables["collective_bandwidth"] = bandwidth.table(columns)
    sequences.notes(notes)
    tables.update(collectivematch.tables(kernels, matching, known, align_clocks, notes, rows, nodes, orderer, column))
    return Report(tables, notes)
