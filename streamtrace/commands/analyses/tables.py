"""``analyze``'s tables from the per-rank facts (what spans ranks is joined here), and writing them."""
from __future__ import annotations

import csv
import io
import math
import os
import shutil

import numpy as np

from ...algo import analysis as hta
from ...algo import utilization
from ...io import report as page
from ...io.destinations import Destinations
from .task import GpuTime, RankResult, open_part

TABLES = ("temporal_breakdown", "kernel_type_breakdown", "kernel_breakdown", "comm_comp_overlap",
          "idle_time_breakdown", "kernel_launch_stats", "profiler_steps", "step_times", "stragglers", "utilization",
          "gpu_time", "kernel_totals")
COLUMNS = {
    "temporal_breakdown": ("rank", "idle_time(us)", "compute_time(us)", "non_compute_time(us)", "kernel_time(us)",
                           "idle_time_pctg", "compute_time_pctg", "non_compute_time_pctg"),
    "kernel_type_breakdown": ("kernel_type", "sum", "percentage"),
    "kernel_breakdown": ("name", "sum (us)", "max (us)", "min (us)", "stddev", "mean (us)", "kernel_type", "rank"),
    "comm_comp_overlap": ("rank", "comp_comm_overlap_pctg"),
    "idle_time_breakdown": ("rank", "stream", "idle_category", "idle_time", "idle_time_ratio"),
    "kernel_launch_stats": ("rank", "correlation", "cpu_duration", "gpu_duration", "launch_delay"),
    "profiler_steps": ("step",),
    "step_times": ("rank", "step", "start(us)", "duration(us)", "gpu_busy(us)", "compute(us)", "communication(us)",
                   "idle(us)"),
    "stragglers": ("rank", "step", "lag(us)", "normalized_start_time", "late", "potential_straggler"),
    "utilization": ("rank", "bin", "start(us)", "end(us)", "gpu_busy(us)", "busy_fraction"),
    "gpu_time": ("rank", "kernel_time(us)", "busy(us)", "idle_time(us)", "compute_time(us)", "non_compute_time(us)",
                 "communication(us)", "memory(us)", "idle_time_pctg", "compute_time_pctg", "non_compute_time_pctg",
                 "comp_comm_overlap_pctg", "hta_rounds"),
    "kernel_totals": ("name", "kernel_type", "count", "sum (us)"),
}
UTILIZATION_BINS = 200
MIN_NORMALIZED_DURATION = 0.01


def _pctg(part: float, whole: float, digits: int = 2) -> float:
    return float(np.round(100 * part / whole, digits)) if whole else math.nan


def build_tables(results: list[RankResult], num_candidates: int, bins: int = UTILIZATION_BINS) -> dict[str, list[dict] | None]:
    results = sorted(results, key=lambda result: result.rank)
    tables: dict[str, list[dict] | None] = {}
    tables["temporal_breakdown"] = [
        {"rank": r.rank, "idle_time(us)": r.temporal.idle, "compute_time(us)": r.temporal.compute,
         "non_compute_time(us)": r.temporal.non_compute, "kernel_time(us)": r.temporal.kernel_time,
         "idle_time_pctg": _pctg(r.temporal.idle, r.temporal.kernel_time),
         "compute_time_pctg": _pctg(r.temporal.compute, r.temporal.kernel_time),
         "non_compute_time_pctg": _pctg(r.temporal.non_compute, r.temporal.kernel_time)} for r in results]
    sums: dict[str, int] = {}
    for r in results:
        for kind, total in r.type_sums.items():
            sums[kind] = sums.get(kind, 0) + total
    grand = sum(sums.values())
    ordered = sorted(sorted(sums), key=lambda kind: -sums[kind])
    tables["kernel_type_breakdown"] = [{"kernel_type": kind, "sum": sums[kind], "percentage": _pctg(sums[kind], grand, 1)}
                                       for kind in ordered]
    tables["kernel_breakdown"] = sorted((row for r in results for row in r.kernel_rows),
                                        key=lambda row: (row["kernel_type"], row["name"], row["rank"]))
    tables["comm_comp_overlap"] = [{"rank": r.rank, "comp_comm_overlap_pctg": float(np.round(100 * r.overlap, 2))}
                                   for r in results]
    tables["idle_time_breakdown"] = [row for r in results for row in r.idle_rows]
    steps = sorted({step for r in results for step in r.step_numbers})
    tables["profiler_steps"] = [{"step": step} for step in steps]
    base = min((r.min_ts for r in results), default=0.0)
    tables["step_times"] = [
        {"rank": r.rank, "step": step, "start(us)": start - base, "duration(us)": duration,
         **dict(zip(("gpu_busy(us)", "compute(us)", "communication(us)", "idle(us)"),
                    r.step_times.get(step, (0.0, 0.0, 0.0, 0.0))))}
        for r in results for step, start, duration in r.steps]
    tables["stragglers"] = _stragglers(results, steps, num_candidates)
    tables["utilization"] = _utilization(results, base, bins)
    tables["gpu_time"] = [_gpu_time_row(r.rank, r.exact) for r in results if r.exact is not None]
    tables["kernel_totals"] = _kernel_totals(results)
    return tables


def _kernel_totals(results: list[RankResult]) -> list[dict]:
    """Every GPU row name over all ranks, with its type, count and total time from the trace's own times
    (kernel_breakdown, HTA's, rounds them and keeps 10 names per type and rank), most time first."""
    totals: dict[tuple[str, str], list] = {}
    for r in results:
        for name, kind, count, total in r.kernel_totals:
            known = totals.setdefault((name, kind), [0, 0.0])
            known[0] += count
            known[1] += total
    ordered = sorted(totals, key=lambda key: (-totals[key][1], key))
    return [{"name": name, "kernel_type": kind, "count": totals[(name, kind)][0],
             "sum (us)": round(totals[(name, kind)][1], 3)} for name, kind in ordered]


def _gpu_time_row(rank: int, exact: GpuTime) -> dict:
    """The temporal breakdown and overlap of a rank from the trace's own times, to the nanosecond."""
    t = exact.temporal
    times = {"kernel_time(us)": t.kernel_time, "busy(us)": t.kernel_time - t.idle, "idle_time(us)": t.idle,
             "compute_time(us)": t.compute, "non_compute_time(us)": t.non_compute,
             "communication(us)": exact.communication, "memory(us)": exact.memory}
    return {"rank": rank, **{key: round(value, 3) for key, value in times.items()},
            "idle_time_pctg": _pctg(t.idle, t.kernel_time), "compute_time_pctg": _pctg(t.compute, t.kernel_time),
            "non_compute_time_pctg": _pctg(t.non_compute, t.kernel_time),
            "comp_comm_overlap_pctg": float(np.round(100 * exact.overlap, 2)), "hta_rounds": exact.rounded}


def _utilization(results: list[RankResult], base: float, bins: int) -> list[dict]:
    """Per rank, the fraction of each of about ``bins`` equal time bins over
    the run's GPU span that its GPU was busy (exact: see algo/utilization)."""
    found = utilization.run_bins([r.busy for r in results], bins)
    if found is None:
        return []
    starts, ends = (found.starts - base).tolist(), (found.ends - base).tolist()
    widths = found.ends - found.starts
    rows = []
    for r, busy in zip(results, found.busy):
        fractions = np.round(np.divide(busy, widths, out=np.zeros_like(busy), where=widths > 0), 4).tolist()
        for n, (start, end, time_busy, fraction) in enumerate(zip(starts, ends, np.round(busy, 3).tolist(), fractions)):
            rows.append({"rank": r.rank, "bin": n, "start(us)": start, "end(us)": end, "gpu_busy(us)": time_busy,
                         "busy_fraction": fraction})
    return rows


def _stragglers(results: list[RankResult], steps: list[int], num_candidates: int) -> list[dict]:
    """HTA's straggler candidates (late starts of the most variable
    communication kernel), and per step each rank's lag behind the fastest."""
    metric, candidates = _straggler_metric(results, steps, num_candidates)
    durations: dict[int, dict[int, float]] = {}
    for r in results:
        for step, _, duration in r.steps:
            durations.setdefault(step, {})[r.rank] = duration
    rows = []
    for r in results:
        for step, _, duration in r.steps:
            value = metric.get((r.rank, step))
            late = value is not None and value >= metric.get(("threshold", step), math.inf)
            rows.append({"rank": r.rank, "step": step, "lag(us)": duration - min(durations[step].values()),
                         "normalized_start_time": value, "late": late, "potential_straggler": r.rank in candidates})
    return rows


def _straggler_metric(results: list[RankResult], steps: list[int], num_candidates: int) -> tuple[dict, list[int]]:
    """HTA's ``find_stragglers_with_late_start_comm_kernels``, on the per-rank facts."""
    valid = set(steps)
    extents = [extent for r in results for step, extent in r.step_extent.items() if step in valid]
    present = {step for r in results for step in r.step_extent if step in valid}
    if not extents or not present:
        return {}, []
    t_min = min(first for first, _ in extents)
    mean_iter = (max(last for _, last in extents) - t_min) / len(present)
    min_duration = mean_iter * MIN_NORMALIZED_DURATION
    last: dict[tuple, dict[int, tuple[float, float]]] = {}  # (stream, step, name) -> rank -> (ts, dur)
    for r in results:
        for (stream, step, name), kernels in r.comm_candidates.items():
            if step not in valid:
                continue
            passing = [kernel for kernel in kernels if kernel[1] >= min_duration]
            if passing:
                last.setdefault((stream, step, name), {})[r.rank] = passing[-1]
    if not last or not mean_iter:
        return {}, []
    spread: dict[tuple, list[float]] = {}
    for (stream, _step, name), per_rank in sorted(last.items()):
        values = np.array([dur / mean_iter for _, dur in per_rank.values()])
        if len(values) > 1:
            spread.setdefault((stream, name), []).append(float(values.std(ddof=1)))
    if not spread:
        return {}, []
    chosen = max(sorted(spread), key=lambda key: float(np.mean(spread[key])))
    metric: dict = {}
    for (stream, step, name), per_rank in last.items():
        if (stream, name) == chosen:
            for rank, (ts, _) in per_rank.items():
                metric[(rank, step)] = (ts - t_min) / mean_iter
    by_step: dict[int, dict[int, float]] = {}
    for (rank, step), value in metric.items():
        by_step.setdefault(step, {})[rank] = value
    counts: dict[int, int] = {}
    for step, per_rank in by_step.items():
        late = hta.late_ranks(per_rank, num_candidates)
        values = sorted(per_rank.values(), reverse=True)
        metric[("threshold", step)] = values[min(num_candidates, len(values)) - 1]
        for rank in per_rank:
            counts[rank] = counts.get(rank, 0) + (rank in late)
    return metric, hta.top_candidates(counts, num_candidates)


def claim_outputs(destinations: Destinations, out_dir: str | os.PathLike | None,
                   html: str | os.PathLike | None) -> dict[str, str]:
    """Check and reserve every file the run writes before reading anything: the tables' CSVs, the page."""
    targets: dict[str, str] = {}
    if out_dir is not None:
        directory = destinations.directory(out_dir, writes="the tables' CSV files")
        targets = {name: os.path.join(directory, f"{name}.csv") for name in TABLES}
        destinations.claim_all(targets.values(), role="table")
    if html is not None:
        page.require_plotly()
        destinations.claim(html, role="HTML report", holds="HTML")
    return targets


def _csv_value(value: object) -> object:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return value


def write_tables(destinations: Destinations, tables: dict, parts: list[str], targets: dict[str, str]) -> None:
    """One CSV per table (launch statistics copied from the ranks' parts), each through the run's write rules
    (the destinations make the tables' directory, and take it away again if the run fails)."""
    for name, path in targets.items():
        with destinations.open(path, role="table") as raw:
            out = io.TextIOWrapper(raw, encoding="utf-8", newline="")
            csv.writer(out).writerow(COLUMNS[name])
            if name == "kernel_launch_stats":
                out.flush()
                for part in parts:
                    with open_part(part) as rows:
                        shutil.copyfileobj(rows, raw)
            else:
                csv.writer(out).writerows([_csv_value(row[column]) for column in COLUMNS[name]] for row in tables[name])
            out.flush()
            out.detach()  # the stream is the destination's to close


def read_parts(parts: list[str]) -> list[dict]:
    rows = []
    columns = COLUMNS["kernel_launch_stats"]
    for part in parts:
        with open_part(part) as raw, io.TextIOWrapper(raw, encoding="utf-8", newline="") as text:
            for values in csv.reader(text):
                rows.append(dict(zip(columns, (int(values[0]), int(values[1]), *(_parsed(v) for v in values[2:])))))
    return rows


def _parsed(text: str) -> float | int:
    number = float(text)
    return int(number) if number.is_integer() and "." not in text and "e" not in text else number
