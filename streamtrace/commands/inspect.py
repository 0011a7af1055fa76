"""``inspect``: one pass that says what is in a trace.

The visitor keeps counters, per-pid facts and correlation bitmaps, never
events, so memory stays flat however large the trace is.
"""
from __future__ import annotations

import os
import statistics
import time
from collections import defaultdict
from datetime import datetime, timezone
from decimal import Decimal
from typing import Iterable

from ..algo.busy import BusyTime, union_length
from ..algo.corrset import CorrelationSet, count_shared
from ..algo.mergeplan import EPOCH_US
from ..algo.secrets import SecretFinder
from ..engine.jobs import resolve_jobs
from ..engine.passes import index_pass
from ..errors import TraceError
from ..io.destinations import Destinations
from ..io.jsonscan import member_value
from ..io.progress import Progress
from ..io.reader import ReadStats
from ..io.redact import RedactOptions, load_secret_rules
from ..io.source import InputSource, SourceSpec
from ..resources import peak_rss_mb
from .inspectindex import CPU_CATEGORIES, GPU_SIDE_CATEGORIES, TIME_SCALE, TOP_KERNELS, InspectVisitor
from .mergedindex import resolve_pid_ranks


def _pid_ranks(visitor: InspectVisitor, pids: Iterable, members: list) -> dict[object, tuple[int | None, str]]:
    """Rank of each pid and the rule that decided it: the rules relink, split
    and attribute decide by (SPEC 6, :func:`resolve_pid_ranks`) for the pids
    that launch or run GPU work or name a rank; for the others (CPU work
    alone), the ``args.rank`` of their events, else ``distributedInfo.rank``
    when the file states no other rank."""
    evidence = visitor.rank_evidence
    resolution = resolve_pid_ranks(evidence, members)
    decided: dict[object, tuple[int | None, str]] = {}
    for slot, facts in enumerate(evidence.pids):
        rank = resolution.ranks[slot]
        decided[facts.pid] = (rank if rank >= 0 else None, resolution.rules[slot])
    distributed = member_value(members, "distributedInfo")
    file_rank = distributed.get("rank") if isinstance(distributed, dict) else None
    stated = any(rank >= 0 and rule != "distributedInfo.rank" for rank, rule in zip(resolution.ranks, resolution.rules))
    alone = file_rank if type(file_rank) is int and not stated else None
    for pid in pids:
        key = pid if pid.__class__ in (int, str) else str(pid)
        if decided.get(key, (None, "unknown"))[1] != "unknown":
            decided[pid] = decided[key]
        elif pid in visitor.pid_rank_args:
            decided[pid] = (visitor.pid_rank_args[pid], "args.rank")
        elif alone is not None:
            decided[pid] = (alone, "distributedInfo.rank")
        else:
            decided[pid] = (None, "unknown")
    return {pid: decided[pid] for pid in pids}


def _pid_order(pid: object) -> tuple:
    """Integers first in numeric order, then anything else by its text."""
    return (0, pid, "") if type(pid) is int else (1, 0, str(pid))


def _pid_facts(visitor: InspectVisitor) -> dict[object, tuple[int, str]]:
    """Event count and role of each pid that has events other than metadata
    (Kineto names a placeholder process for every GPU of the machine)."""
    events: dict[object, int] = defaultdict(int)
    roles: dict[object, str] = {}
    for (ph, cat, pid), count in visitor.counts.items():
        if ph == "M":
            continue
        events[pid] += count
        if cat in GPU_SIDE_CATEGORIES:
            roles[pid] = "GPU"
        elif cat in CPU_CATEGORIES and roles.get(pid) != "GPU":
            roles[pid] = "CPU"
    return {pid: (count, roles.get(pid, "other")) for pid, count in events.items()}


def _by_kind(visitor: InspectVisitor) -> dict[str, int]:
    totals: dict[str, int] = defaultdict(int)
    for (ph, cat, _), count in visitor.counts.items():
        totals[f"{ph}/{cat}"] += count
    return dict(sorted(totals.items(), key=lambda item: -item[1]))


def _graph_summary(visitor: InspectVisitor, ranks: dict) -> dict:
    """GPU events per graph launch, joined by (rank, correlation)."""
    per_key: dict[tuple, int] = defaultdict(int)
    for (pid, correlation), count in visitor.graph_gpu.items():
        per_key[(ranks.get(pid, (None,))[0], correlation)] += count
    sizes = []
    for (pid, correlation), launches in visitor.graph_launches.items():
        rank = ranks.get(pid, (None,))[0]
        sizes.extend([per_key.get((rank, correlation), 0) // max(launches, 1)] * launches)
    summary: dict = {"count": len(sizes)}
    if sizes:
        summary.update(
            gpu_events_total=sum(per_key.values()),
            gpu_events_per_launch_min=min(sizes),
            gpu_events_per_launch_max=max(sizes),
            gpu_events_per_launch_mean=round(sum(sizes) / len(sizes), 2),
        )
    return summary


def _collisions(visitor: InspectVisitor, ranks: dict) -> dict:
    by_rank: dict[object, CorrelationSet] = {}
    for pid, ids in visitor.launches.items():
        rank = ranks.get(pid, (None,))[0]
        key = ("pid", pid) if rank is None else ("rank", rank)
        merged = by_rank.setdefault(key, CorrelationSet())
        merged.union_update(ids)
    return {
        "ids_shared_across_pids": count_shared(visitor.launches.values()),
        "ids_shared_across_ranks": count_shared(by_rank.values()),
    }


def _devices(members: list) -> dict:
    """The GPUs ``deviceProperties`` lists: how many, and how many of each name."""
    listed = member_value(members, "deviceProperties")
    names: dict[str, int] = defaultdict(int)
    for device in listed if isinstance(listed, list) else []:
        if isinstance(device, dict):
            names[str(device.get("name", "unnamed"))] += 1
    return {"count": sum(names.values()), "names": dict(names)}


def _gpu_busy(visitor: InspectVisitor) -> dict[object, tuple[float, float, float, BusyTime]]:
    """Per GPU pid (in pid order): the union of its slices, its first start and its last end."""
    busy = {}
    for pid, times in sorted(visitor.busy.items(), key=lambda item: _pid_order(item[0])):
        busy[pid] = (times.total(), times.first, times.last, times)
    return busy


def _busy_entry(total: float, first: float, last: float) -> dict:
    span = last - first
    return {"busy_us": round(total, 3), "span_us": round(span, 3),
            "busy_percent": round(100 * total / span, 1) if span > 0 else None}


def _by_rank(visitor: InspectVisitor, ranks: dict, busy: dict) -> list[dict]:
    """The run's shape per rank (None: pids of no known rank): its pids, its GPUs' busy time (the union of
    the slices of its GPU pids: the time one of them at least was busy; ``gpu_pids`` says how many when
    more than one) against the span from their first slice to their last end, and its profiler steps (a
    step's span on a rank runs from the earliest start to the latest end of its ``ProfilerStep#N`` events)."""
    members: dict[object, list] = defaultdict(list)
    for pid, (rank, _) in ranks.items():
        members[rank].append(pid)
    shape = []
    for rank in sorted(members, key=lambda rank: (rank is None, rank or 0)):
        pids = sorted(members[rank], key=_pid_order)
        entry: dict = {"rank": rank, "pids": pids}
        figures = [busy[pid] for pid in pids if pid in busy]
        if len(figures) == 1:
            entry["gpu_busy"] = _busy_entry(*figures[0][:3])
        elif figures:
            union = union_length([segment for *_, times in figures for segment in times.segments()])
            entry["gpu_busy"] = {**_busy_entry(union, min(first for _, first, _, _ in figures),
                                               max(last for _, _, last, _ in figures)), "gpu_pids": len(figures)}
        spans: dict[int, list[float]] = {}
        for pid in pids:
            for number, start, end in zip(*visitor.steps.get(pid, ((), (), ()))):
                known = spans.get(number)
                spans[number] = [start, end] if known is None else [min(known[0], start), max(known[1], end)]
        if spans:
            ordered = sorted(spans.items(), key=lambda item: item[1][0])
            durations = [end - start for _, (start, end) in ordered]
            entry["steps"] = {"count": len(ordered), "first": ordered[0][0], "last": ordered[-1][0],
                              "first_us": round(durations[0], 3), "last_us": round(durations[-1], 3),
                              "median_us": round(statistics.median(durations), 3)}
        shape.append(entry)
    return shape


def _time_span(first: float | None, last: float | None, base_ns: object) -> dict:
    """The span in the trace's own microseconds, and in UTC where the trace says when it ran: ts counts from
    ``baseTimeNanoseconds`` when there is one, or is itself epoch time when that large (as ``merge`` reads it)."""
    span: dict = {"first_ts": first, "last_end": last,
                  "duration": None if first is None or last is None else round(last - first, 3)}
    if first is None or last is None:
        return span
    if type(base_ns) is int:
        origin_us, clock = base_ns / 1000, "baseTimeNanoseconds + ts"
    elif first >= EPOCH_US:
        origin_us, clock = 0.0, "ts since the epoch"
    else:
        return {**span, "clock": "relative (no baseTimeNanoseconds)"}
    try:
        start, end = (datetime.fromtimestamp((origin_us + value) / 1e6, timezone.utc) for value in (first, last))
    except (OverflowError, ValueError, OSError):
        return {**span, "clock": "beyond the calendar"}
    return {**span, "clock": clock, "start_utc": start.isoformat(timespec="microseconds"),
            "end_utc": end.isoformat(timespec="microseconds")}


def _top_kernels(visitor: InspectVisitor, top: int) -> list[dict]:
    totals = {name: (count, total / TIME_SCALE + odd) for name, (count, total, odd) in visitor.kernels.items()}
    ranked = sorted(totals.items(), key=lambda item: (-item[1][1], item[0]))[:top]
    return [{"name": name, "count": count, "total_us": round(total, 3), "mean_us": round(total / count, 3)}
            for name, (count, total) in ranked]


def _warnings(visitor: InspectVisitor, stats: ReadStats) -> list[str]:
    if stats.truncated and not visitor.streams:
        return ["the input was cut off and --salvage kept its first part, which holds no GPU events: the "
                "profiler writes them last"]
    return []


def _hints(collisions: dict) -> list[str]:
    across_ranks, across_pids = collisions["ids_shared_across_ranks"], collisions["ids_shared_across_pids"]
    if across_ranks:
        return [f"{across_ranks:,} correlation ids are shared across ranks: tools that link by id alone mix the "
                "ranks up; run streamtrace relink to make them unique"]
    if across_pids:
        return [f"{across_pids:,} correlation ids are launched by several processes (several ranks in one file?): "
                "run streamtrace relink, which tells the ranks apart and makes the ids unique"]
    return []


def _number(value: object) -> float | None:
    if isinstance(value, (int, float, Decimal)) and value not in (float("inf"), float("-inf")):
        return float(value)
    return None


def summarize(visitor: InspectVisitor, stats: ReadStats, top: int = TOP_KERNELS) -> dict:
    """The inspect summary as a JSON-ready dict (``top``: kernels listed)."""
    visitor.settle()
    members = stats.header + stats.trailer
    facts = _pid_facts(visitor)
    ranks = _pid_ranks(visitor, facts, members)
    pids = []
    for pid, (events, role) in sorted(facts.items(), key=lambda item: _pid_order(item[0])):
        entry = {"pid": pid, "role": role, "rank": ranks[pid][0],
                 "rank_source": ranks[pid][1], "events": events}
        if pid in visitor.pid_names:
            entry["name"] = visitor.pid_names[pid]
        if pid in visitor.streams:
            entry["gpu_streams"] = len(visitor.streams[pid])
        pids.append(entry)
    first, last = _number(visitor.span[0]), _number(visitor.span[1])
    collisions = _collisions(visitor, ranks)
    busy = _gpu_busy(visitor)
    base_ns = member_value(members, "baseTimeNanoseconds")
    return {
        "top_level_keys": [key for key, _ in stats.header] + ["traceEvents"] + [key for key, _ in stats.trailer],
        "events_by_ph_cat": _by_kind(visitor),
        "pids": pids,
        "ranks": sorted({rank for rank, _ in ranks.values() if rank is not None}),
        "by_rank": _by_rank(visitor, ranks, busy),
        "gpu_streams": {str(pid): sorted(streams, key=str) for pid, streams in visitor.streams.items()},
        "runtime_launches": visitor.launch_count,
        "graph_launches": _graph_summary(visitor, ranks),
        "correlation_collisions": collisions,
        "pp_annotations": {f"{side}/{op}": n for (side, op), n in sorted(visitor.pp_counts.items())},
        "time_span_us": _time_span(first, last, base_ns),
        "events_without_numeric_ts": visitor.bad_ts,
        "base_time_ns": base_ns,
        "devices": _devices(members),
        "gpu_busy": {str(pid): {**_busy_entry(total, first, last), "slices": times.slices}
                     for pid, (total, first, last, times) in busy.items()},
        "top_kernels": _top_kernels(visitor, top),
        "hints": _hints(collisions),
        "warnings": _warnings(visitor, stats),
        **_secrets_found(visitor, members),
    }


def _secrets_found(visitor: InspectVisitor, members: list) -> dict:
    """``secrets_found``: by kind, a count and the first JSON paths (never a value)."""
    if visitor.secrets is None:
        return {}
    visitor.secrets.members(members)
    return {"secrets_found": visitor.secrets.findings.by_kind()}


def inspect(
    src: SourceSpec,
    *,
    salvage: bool = False,
    spool_dir: str | None = None,
    reread_remote: bool = False,
    progress: bool | str | None = False,
    jobs: int | str | None = None,
    secrets: RedactOptions | bool = True,
    summary_file: str | os.PathLike | None = None,
    overwrite: bool = False,
    top: int = TOP_KERNELS,
) -> dict:
    """Summarise a trace in one streaming pass (the ``inspect`` command); with
    ``jobs`` > 1 workers index ranges of the events.  ``secrets``
    (the default rules, or a :class:`RedactOptions` naming others; False:
    none) adds ``secrets_found`` and a warning when there are any.
    ``summary_file``: also write the summary there (``overwrite``: replacing it);
    ``top``: how many kernels ``top_kernels`` lists (by total time)."""
    if type(top) is not int or top < 0:
        raise TraceError(f"--top takes a number of kernels (0 or more), not {top!r}")
    started = time.perf_counter()
    processes = resolve_jobs(jobs)
    options = RedactOptions() if secrets is True else secrets
    finder = SecretFinder(load_secret_rules(options.rules, options.patterns)) if options else None
    with InputSource(src, spool_dir=spool_dir, reread_remote=reread_remote) as source:
        destinations = Destinations([source.location], overwrite=overwrite, summary=summary_file)
        meter = Progress(source.size, enabled=progress)
        result = index_pass(source, lambda: InspectVisitor(finder, spool_dir), keep_events=False, spool_dir=spool_dir,
                            salvage=salvage, progress=meter, jobs=processes)
    summary = {**source.describe(), **result.stats.as_dict()}
    try:
        summary.update(summarize(result.visitor, result.stats, top))
    finally:
        result.visitor.busy_spill.close()
    found = summary.get("secrets_found")
    if found:
        summary["warnings"].append(f"{source.name} holds {sum(entry['count'] for entry in found.values())} "
                                   f"secret(s) ({', '.join(found)}); 'streamtrace redact' writes a copy without them")
    summary["wall_seconds"] = round(time.perf_counter() - started, 3)
    summary["peak_rss_mb"] = peak_rss_mb()
    return destinations.finish(summary)
