"""Holistic Trace Analysis 0.5.0 run in-process: the independent oracle for ``streamtrace analyze``.

HTA loads whole traces into pandas, so it only serves small inputs; on those
its tables are the reference. ``hta_tables`` returns them in the shape of
``streamtrace.analyze(...)["tables"]`` (table name -> rows keyed by HTA's own
column names) and ``assert_tables_equal`` compares the two with the issue's
tolerances. docs/analyze.md states HTA's rules table by table.
"""
from __future__ import annotations

import contextlib
import logging
import math
import warnings
from collections import defaultdict
from pathlib import Path

# Each table's columns, in HTA's order (the CSV header). HTA returns launch stats per rank and the steps
# as a list: those rows gain "rank" / are named "step" here.
COLUMNS = {
    "temporal_breakdown": ("rank", "idle_time(us)", "compute_time(us)", "non_compute_time(us)", "kernel_time(us)",
                           "idle_time_pctg", "compute_time_pctg", "non_compute_time_pctg"),
    "kernel_type_breakdown": ("kernel_type", "sum", "percentage"),
    "kernel_breakdown": ("name", "sum (us)", "max (us)", "min (us)", "stddev", "mean (us)", "kernel_type", "rank"),
    "comm_comp_overlap": ("rank", "comp_comm_overlap_pctg"),
    "idle_time_breakdown": ("rank", "stream", "idle_category", "idle_time", "idle_time_ratio"),
    "kernel_launch_stats": ("rank", "correlation", "cpu_duration", "gpu_duration", "launch_delay"),
    "profiler_steps": ("step",),
}
# Tables HTA has no frame for: it gives the columns named here, analyze's rows carry these and more.
# step_times: every ProfilerStep span HTA keeps (extract_iteration_info: CPU spans and their GPU
# annotations), start aligned as HTA aligns ranks; stragglers: get_potential_stragglers' ranks.
# Neither has a row key of HTA's (see _step_differences and _straggler_differences).
PARTIAL_COLUMNS = {
    "step_times": ("rank", "step", "start(us)", "duration(us)"),
    "stragglers": ("rank", "potential_straggler"),
}
TABLES = (*COLUMNS, *PARTIAL_COLUMNS)

# The columns that identify a row; where HTA defines the row order the key sequence must match too.
ROW_KEYS = {
    "temporal_breakdown": ("rank",),
    "kernel_type_breakdown": ("kernel_type",),
    "kernel_breakdown": ("kernel_type", "name", "rank"),
    "comm_comp_overlap": ("rank",),
    "idle_time_breakdown": ("rank", "stream", "idle_category"),
    "kernel_launch_stats": ("rank", "correlation"),
    "profiler_steps": ("step",),
}
# kernel_type_breakdown is sorted by sum with ties in undefined order, launch stats follow pandas merge order.
ORDERED = {"temporal_breakdown", "kernel_breakdown", "comm_comp_overlap", "idle_time_breakdown", "profiler_steps"}
# Columns compared exactly (ids, names); percentages and ratios within PERCENT_TOLERANCE; the rest are times.
EXACT = {"rank", "stream", "idle_category", "kernel_type", "name", "correlation", "step"}
PERCENT_COLUMNS = {"idle_time_pctg", "compute_time_pctg", "non_compute_time_pctg", "percentage", "comp_comm_overlap_pctg",
                   "idle_time_ratio"}
PERCENT_TOLERANCE = 0.01  # points; idle_time_ratio is a fraction HTA rounds to 0.01, so one rounding step
TIME_ABSOLUTE = 1.0  # us
TIME_RELATIVE = 1e-4  # 0.01 %


def hta_tables(trace_dir: Path, **options) -> dict[str, list[dict]]:
    """HTA's tables for the rank files in ``trace_dir``; a table HTA raises on is left out (see ``hta_run``)."""
    return hta_run(trace_dir, **options)[0]


def hta_run(trace_dir: Path, *, include_last_step: bool = False,
            ranks: list[int] | None = None) -> tuple[dict[str, list[dict]], dict[str, BaseException]]:
    """Run every HTA analysis behind the tables; return (tables, exceptions by table name).

    HTA's defaults are kept except that idle time and launch statistics cover every rank (HTA's default
    is rank 0 only). Files are parsed in this process (``use_multiprocessing=False``): HTA would fork a
    pool from the test process; each file goes through the same parse function either way.
    """
    with _quiet(), _wide_correlation():
        from hta.analyzers.straggler import extract_iteration_info
        from hta.common.trace import Trace
        from hta.common.trace_file import get_trace_files
        from hta.trace_analysis import TraceAnalysis

        files = get_trace_files(str(trace_dir))
        if ranks is not None:
            files = {rank: path for rank, path in files.items() if rank in ranks}
        analysis = TraceAnalysis.__new__(TraceAnalysis)
        analysis.t = Trace(trace_files=files, trace_dir=str(trace_dir))
        analysis.t.load_traces(include_last_step, use_multiprocessing=False)
        all_ranks = analysis.t.get_ranks()

        def kernel_tables() -> tuple[list[dict], list[dict]]:
            by_type, by_kernel = analysis.get_gpu_kernel_breakdown(visualize=False)
            return _rows(by_type), _rows(by_kernel)

        def launch_stats() -> list[dict]:
            frames = analysis.get_cuda_kernel_launch_stats(ranks=all_ranks, visualize=False)
            return [{"rank": rank, **row} for rank, frame in frames.items() for row in _rows(frame)]

        producers = {
            "temporal_breakdown": lambda: _rows(analysis.get_temporal_breakdown(visualize=False)),
            ("kernel_type_breakdown", "kernel_breakdown"): kernel_tables,
            "comm_comp_overlap": lambda: _rows(analysis.get_comm_comp_overlap(visualize=False)),
            "idle_time_breakdown": lambda: _rows(analysis.get_idle_time_breakdown(ranks=all_ranks, visualize=False)[0]),
            "kernel_launch_stats": launch_stats,
            "profiler_steps": lambda: [{"step": int(step)} for step in analysis.get_profiler_steps()],
            "step_times": lambda: [{"rank": row["rank"], "step": row["iter"], "start(us)": row["ts"], "duration(us)": row["dur"]}
                                   for row in _rows(extract_iteration_info(analysis.t))],
            "stragglers": lambda: [{"rank": int(rank), "potential_straggler": True}
                                   for rank in analysis.get_potential_stragglers()],
        }
        tables: dict[str, list[dict]] = {}
        errors: dict[str, BaseException] = {}
        for names, produce in producers.items():
            names = names if isinstance(names, tuple) else (names,)
            try:
                result = produce()
            except Exception as error:  # HTA's own failures are findings, reported per table
                errors.update(dict.fromkeys(names, error))
                continue
            tables.update(zip(names, result if len(names) > 1 else (result,)))
    return tables, errors


@contextlib.contextmanager
def _quiet():
    """Silence HTA's INFO/WARNING chatter and pandas' deprecation warnings while it runs."""
    hta_logger = logging.getLogger("hta")
    level = hta_logger.level
    hta_logger.setLevel(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        hta_logger.setLevel(level)


@contextlib.contextmanager
def _wide_correlation():
    """HTA 0.5.0 downcasts ``correlation`` to the smallest integer type (int16
    when every id fits), then writes event positions into a column made from
    it: pandas 2 widens the column, pandas 3 raises TypeError once a trace has
    more than 32,767 events. pyproject's dev extra pins pandas below 3; where
    pandas 3 is installed anyway, widening the ids first does what pandas 2
    does, so HTA's tables are the same."""
    import hta.common.trace as hta_trace

    transform = hta_trace.transform_correlation_to_index

    def widened(frame, symbol_table):
        if "correlation" in frame.columns:
            frame["correlation"] = frame["correlation"].astype("int64")
        return transform(frame, symbol_table)

    hta_trace.transform_correlation_to_index = widened
    try:
        yield
    finally:
        hta_trace.transform_correlation_to_index = transform


def _rows(frame) -> list[dict]:
    """A DataFrame's rows as dicts of plain Python values (numpy scalars unwrapped), index dropped."""
    return [{str(column): _plain(value) for column, value in zip(frame.columns, values)}
            for values in frame.itertuples(index=False, name=None)]


def _plain(value):
    return value.item() if hasattr(value, "item") else value


def assert_tables_equal(ours: dict[str, list[dict]], hta: dict[str, list[dict]], tables=None) -> None:
    """Every table HTA produced (or those named) matches ours: same columns, same rows, values within tolerance."""
    problems = [problem for name in (tables or hta) for problem in table_differences(name, ours.get(name), hta[name])]
    assert not problems, "\n".join(problems[:40]) + (f"\n... {len(problems) - 40} more" if len(problems) > 40 else "")


def table_differences(name: str, ours: list[dict] | None, hta: list[dict]) -> list[str]:
    """Human-readable differences between our rows and HTA's for one table (empty when they agree)."""
    if ours is None:
        return [f"{name}: missing from our tables"]
    if name == "stragglers":
        return _straggler_differences(ours, hta)
    if name == "step_times":
        return _step_differences(ours, hta)
    keys, columns = ROW_KEYS[name], COLUMNS[name]
    if name == "kernel_type_breakdown":  # a label HTA sees only at tied instants has sum 0 or no row at all
        ours, hta = ([row for row in rows if row.get("sum") != 0] for rows in (ours, hta))
    problems = []
    for side, rows in (("our", ours), ("HTA's", hta)):
        wrong = next((tuple(row) for row in rows if tuple(row) != columns), None)
        if wrong is not None:
            problems.append(f"{name}: {side} columns {list(wrong)} != {list(columns)}")
    our_groups, hta_groups = _grouped(ours, keys), _grouped(hta, keys)
    for key in sorted(set(our_groups) | set(hta_groups), key=repr):
        mine, theirs = our_groups.get(key, []), hta_groups.get(key, [])
        if len(mine) != len(theirs):
            problems.append(f"{name} {_show(keys, key)}: {len(mine)} rows, HTA {len(theirs)}")
            continue
        for our_row, hta_row in zip(_by_values(mine), _by_values(theirs)):
            problems += [f"{name} {_show(keys, key)} {column}: {our_row.get(column)!r} vs HTA {value!r}"
                         for column, value in hta_row.items() if not values_agree(column, our_row.get(column), value)]
    if not problems and name in ORDERED and [_key(row, keys) for row in ours] != [_key(row, keys) for row in hta]:
        problems.append(f"{name}: row order differs from HTA's")
    if name == "kernel_type_breakdown" and [row["sum"] for row in ours] != sorted((row["sum"] for row in ours), reverse=True):
        problems.append(f"{name}: rows not in descending sum order")
    return problems


def _step_differences(ours: list[dict], hta: list[dict]) -> list[str]:
    """Same (rank, step) pairs; each of our spans is one of HTA's for that pair (HTA lists the CPU span and
    every GPU annotation of the step: analyze may list them all or the CPU span alone)."""
    spans = defaultdict(list)
    for row in hta:
        spans[row["rank"], row["step"]].append(row)
    columns = PARTIAL_COLUMNS["step_times"]
    problems = [f"step_times: columns {list(row)} lack {list(columns)}" for row in ours[:1] if not set(columns) <= set(row)]
    mine = {(row.get("rank"), row.get("step")) for row in ours}
    if mine != set(spans):
        problems.append(f"step_times: (rank, step) {sorted(mine, key=repr)}, HTA {sorted(spans)}")
    for row in ours:
        candidates = spans.get((row.get("rank"), row.get("step")), [])
        if candidates and not any(all(values_agree(column, row.get(column), span[column]) for column in columns[2:])
                                  for span in candidates):
            problems.append(f"step_times rank={row.get('rank')} step={row.get('step')}: span "
                            f"{row.get('start(us)')}+{row.get('duration(us)')} is none of HTA's")
    return problems


def _straggler_differences(ours: list[dict], hta: list[dict]) -> list[str]:
    """The ranks analyze marks as potential stragglers are the ranks HTA names (its order is a tie-break)."""
    if any("potential_straggler" not in row or "rank" not in row for row in ours):
        return ["stragglers: rows without rank / potential_straggler"]
    mine = sorted({row["rank"] for row in ours if row["potential_straggler"] is True})
    theirs = sorted(row["rank"] for row in hta)
    return [] if mine == theirs else [f"stragglers: ranks {mine}, HTA {theirs}"]


def values_agree(column: str, ours, hta) -> bool:
    """One cell: exact for ids and names, PERCENT_TOLERANCE points for percentages, max(1 us, 0.01 %) for times."""
    if isinstance(hta, float) and math.isnan(hta):
        return isinstance(ours, float) and math.isnan(ours)
    if column in EXACT or isinstance(hta, str):
        return ours == hta
    if not isinstance(ours, (int, float)) or isinstance(ours, bool) or (isinstance(ours, float) and math.isnan(ours)):
        return False
    tolerance = PERCENT_TOLERANCE if column in PERCENT_COLUMNS else max(TIME_ABSOLUTE, TIME_RELATIVE * abs(hta))
    return abs(ours - hta) <= tolerance + 1e-9


def _grouped(rows: list[dict], keys: tuple[str, ...]) -> dict[tuple, list[dict]]:
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for row in rows:
        groups[_key(row, keys)].append(row)
    return groups


def _key(row: dict, keys: tuple[str, ...]) -> tuple:
    return tuple(row.get(key) for key in keys)


def _by_values(rows: list[dict]) -> list[dict]:
    """Rows sharing a key (launch pairs of one correlation, a step's annotations) paired up in value order."""
    return sorted(rows, key=lambda row: [(0, float(value), "") if isinstance(value, (int, float)) else (1, 0.0, str(value))
                                         for value in row.values()])


def _show(keys: tuple[str, ...], key: tuple) -> str:
    return ", ".join(f"{name}={value!r}" for name, value in zip(keys, key))
