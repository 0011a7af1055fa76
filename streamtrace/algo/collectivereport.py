"""TraceLens's collective report put together (:func:`report`), and what it gives beyond TraceLens:
bandwidth in SI units with nccl-tests' bus factors, notes on sequences and clocks, why a straggler is late."""
from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np

from . import collectivematch
from .collectivematch import Collective, group_ranks, known_groups, ranges
from .collectives import (
    BUS_FACTORS,
    DTYPE_BYTES,
    IMPLICIT_META,
    NAME,
    TYPE_OF,
    Long,
    RankKernels,
    Report,
    Table,
    all2allv_table,
    by_collective,
    heatmap_table,
    implicit_sync,
    long_rows,
    missing,
    pg_ranks,
    same,
    straggler_summary,
    summary_all2allv,
    summary_implicit_sync,
    summary_long,
    with_nodes,
)

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


def _bandwidth(long: Long, collectives: list[Collective], known: dict[str, tuple[int, ...]]) -> Table:
    """collective_bandwidth (not TraceLens's): every matched collective of a kind nccl-tests measures,
    broadcast and reduce included: its size in bytes (the out size of an all-gather, else the in size),
    TraceLens's latency (least duration), the rank arriving last and how long the first waited for it,
    and nccl-tests' algorithm and bus bandwidths in SI units (10^9 bytes/s).  Collectives as
    :func:`collectivematch.match` matches them (by Seq where it can, else TraceLens's order; the id is
    TraceLens's on the lowest rank).  all_to_allv (sizes per rank) and send/recv (p2p_pairs) have no row."""
    table = long.table
    rows = []
    meta_at = [table.columns.index(name) for name in IMPLICIT_META]
    for found in collectives:
        members = found.rows
        first = table.rows[members[0]]
        cid = first[0]
        kind = NCCL_TESTS_TYPES.get(first[5]) if isinstance(first[5], str) else None
        if kind not in NCCL_TESTS_FACTORS or not all(same([table.rows[row][at] for row in members]) for at in meta_at):
            continue
        ranks = [long.ranks[member] for member in members]
        ts = [long.ts[member] for member in members]
        latency = min(long.dur[member] for member in members)
        last = max(ts)
        listed = group_ranks(first[4], first[6], known, first[3])
        size = _size_bytes(first, kind)
        algo = size / (latency / 1e6) / 1e9 if size is not None and latency > 0 else math.nan
        factor = NCCL_TESTS_FACTORS[kind](first[6]) if isinstance(first[6], int) and first[6] > 0 else math.nan
        rows.append([cid, first[3], first[4], first[5], first[7], first[6], len(ranks),
                     len(set(listed) - set(ranks)) if listed is not None else None, size, latency,
                     ranks[ts.index(last)], last - min(ts), algo, factor, algo * factor])
    return Table(list(BANDWIDTH_COLUMNS), rows)


def _size_bytes(row: list, kind: str) -> int | None:
    """nccl-tests' size of a collective: an all-gather's output, any other's input, in bytes."""
    nelems = row[10] if kind == "allgather" else row[8]
    width = DTYPE_BYTES.get(row[7]) if isinstance(row[7], str) else None
    return nelems * width if isinstance(nelems, int) and width is not None else None


def _sequence_notes(long: Long, notes: list[str]) -> None:
    """Say where matching by order can pair different collectives: a group whose ranks hold different
    numbers of its collective kernels (a rank traced over another window, a collective missing on one
    rank), and group members absent from the inputs."""
    counts: dict[tuple, dict[int, int]] = {}
    listed: dict[tuple, object] = {}
    for (cid, members), rank, meta in zip(long.keys, long.ranks, long.metas):
        if meta[NAME] not in NCCL_TESTS_TYPES:
            continue  # (point-to-point: each rank of a group sends and receives its own number)
        group = (cid.rsplit("_", 1)[0] if not long.simplified else "all", members)
        per_rank = counts.setdefault(group, {})
        per_rank[rank] = per_rank.get(rank, 0) + 1
        listed[group] = members
    present = set(long.ranks)
    for (name, _), per_rank in counts.items():
        if len(set(per_rank.values())) > 1:
            spread = ", ".join(f"rank {rank}: {count}" for rank, count in sorted(per_rank.items()))
            notes.append(f"collectives: group {name} has different numbers of kernels per rank ({spread}); "
                         "they are matched by order (as TraceLens), so later collectives of the group may pair "
                         "kernels of different collectives")
    absent = sorted({rank for members in listed.values() for rank in pg_ranks(members)} - present)
    if absent:
        notes.append(f"collectives: process groups list ranks the inputs do not hold ({ranges(absent)}): "
                     "their collectives are matched over the ranks present")


def _clock_notes(long: Long, notes: list[str]) -> None:
    """Say when a matched collective ends on one rank before it starts on another, which one clock cannot
    show (NCCL's ranks finish a collective together): the ranks' clocks disagree, or order matching paired
    different collectives; TraceLens's waits and skews carry that error."""
    table = long.table
    late = []
    count = 0
    for (cid, _), members in by_collective(long).items():
        name = table.rows[members[0]][5]
        if len(members) < 2 or not isinstance(name, str) or name not in NCCL_TESTS_TYPES:
            continue
        count += 1
        gap = max(long.ts[member] for member in members) - min(long.ts[member] + long.dur[member] for member in members)
        if gap > 0:
            late.append((gap, cid))
    if late:
        gap, cid = max(late, key=lambda item: item[0])  # (the first of the largest)
        notes.append(f"collectives: {len(late):,} of {count:,} matched collectives end on one rank before they start on "
                     f"another (by up to {gap:,.1f} us, at {cid}), which one clock cannot show: the ranks' clocks "
                     "disagree, or matching by order paired different collectives; waits and skews carry that error")


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
           heatmap: bool = False, align_clocks: bool = False) -> Report:
    """TraceLens's tables for these ranks' collective kernels (none without kernels), by its file stems.

    ``gpus_per_node``: adds its node columns (TraceLens takes the first rank file's deviceProperties
    count); ``world_size``: the ranks it counts (default: the highest rank + 1); ``heatmap``: the
    all2allv heat map too (its ``--all2allv_heatmap``); ``align_clocks``: the tables beyond TraceLens's
    on the ranks' clocks aligned on collective ends."""
    notes: list[str] = []
    if not any(len(kernels.ts) for kernels in ranks):
        return Report({}, notes)
    ranks = [kernels for kernels in ranks if len(kernels.ts)]
    long = long_rows(ranks)
    world = world_size if world_size is not None else max(long.ranks) + 1
    implicit = implicit_sync(long, notes)
    all2allv = all2allv_table(long, notes)
    tables = {"nccl_summary_implicit_sync": summary_implicit_sync(implicit),
              "nccl_summary_long": summary_long(long.table)}
    if all2allv.rows:
        tables["nccl_summary_all2allv"] = summary_all2allv(all2allv)
    if heatmap:
        found = heatmap_table(long, world, notes)
        if found.rows:
            tables["nccl_all2allv_heatmap"] = found
    tables["nccl_long"] = long.table
    tables["nccl_implicit_sync"] = implicit if implicit.rows else Table([], [])
    if all2allv.rows:
        tables["nccl_all2allv"] = all2allv
    stragglers = straggler_summary(implicit, long)
    if stragglers.rows:
        tables["straggler_summary"] = stragglers
    matching = collectivematch.match(ranks, long, notes)
    bandwidth = _bandwidth(long, matching.collectives, known_groups(ranks))
    if bandwidth.rows:
        tables["collective_bandwidth"] = bandwidth
    _sequence_notes(long, notes)
    _clock_notes(long, notes)
    tables.update(collectivematch.tables(ranks, long, matching, align_clocks, notes, gpus_per_node))
    if gpus_per_node:
        tables = {name: with_nodes(table, gpus_per_node, world) for name, table in tables.items()}
    return Report(tables, notes)
