"""``diff``: what changed between two runs, as HTA 0.5.0's ``TraceDiff`` says (SPEC 18).

Each side is one rank's trace (a file, or the file of the chosen rank among
rank files).  Pass 1 with :class:`DiffIndex` keeps, per event HTA reads
(events with a ``dur`` and a ``cat``), start, duration, stream, correlation
id and name id in columns spilled to disk; then two sweeps over those
columns (:mod:`streamtrace.algo.tracediff`) find the launches of the chosen
iteration and total each name's count and duration.  Memory holds the
distinct names, the step spans and one iteration's launch ids.  A file on
both sides (two iterations of one run) is read once.
"""
from __future__ import annotations

import csv
import io
import os
import time
from array import array
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Sequence

import numpy as np

from ..algo import tracediff
from ..algo.analysis import StepOf, hta_times, step_number
from ..algo.ranks import rank_from_file_name
from ..engine.jobs import resolve_jobs
from ..engine.passes import index_pass
from ..errors import TraceError
from ..io.destinations import Destinations
from ..io.inputs import trace_files_in
from ..io.jsonscan import member_value
from ..io.progress import Progress
from ..io.projection import Projection
from ..io.source import InputSource
from ..io.spool import ColumnSpill
from ..resources import peak_rss_mb
from .analyses.index import stream_of
from .mergerank import discover_inputs, header_rank

OUTPUTS = ("trace_diff.csv", "ops_diff.csv")
# analyze's tables that --tables joins, on these keys; not kernel_launch_stats (a row per launch, keyed by
# correlation ids two runs do not share) nor utilization (bins of each run's own time span)
TABLE_KEYS = {
    "temporal_breakdown": ("rank",),
    "kernel_type_breakdown": ("kernel_type",),
    "kernel_breakdown": ("kernel_type", "name", "rank"),
    "comm_comp_overlap": ("rank",),
    "idle_time_breakdown": ("rank", "stream", "idle_category"),
    "profiler_steps": ("step",),
    "step_times": ("rank", "step"),
    "stragglers": ("rank", "step"),
}
STEP_TIME = "step_time_per_rank"  # each rank's mean step, both runs (from step_times)
STEP_COLUMNS = ("rank", "steps", "mean_step(us)")
SYNC_NAMES = ("Event Sync", "Context Sync")  # HTA's device synchronisations: GPU side whatever their stream
ID_LOW, ID_HIGH = -(1 << 63), 1 << 63
NUMBERS = (int, float)
_PLAIN = {int, float, type(None)}  # the times visit_chunk takes (others: the ordinary reading)
_NAMES = {str, int, float, type(None)}  # the names it takes (an array or object name: the ordinary reading)
_PROJECTION = Projection({"ts": None, "dur": None, "cat": None, "name": None,
                          "args": {"stream": None, "correlation": None}})  # what DiffIndex reads of an event


def _correlation(value: Any) -> int:
    """A correlation id: an integer or a whole float (as pandas compares them); anything else is none."""
    if value.__class__ is float and value.is_integer():
        return int(value)
    return value if value.__class__ is int else tracediff.NO_ID


class DiffIndex:
    """Pass-1 visitor: per event HTA reads, its start, duration, stream,
    correlation id and name id (columns spilled to disk), and the spans of
    the ``ProfilerStep`` events.  Pass-1 workers index ranges of the events
    from a projection of the five members it reads (:meth:`visit_chunk`)
    and send their rows in parts (:meth:`take_part`, :meth:`absorb`)."""

    splits_by_ranges = True
    partial = False  # True where it indexes parts (a worker's): its rows go in parts, never to the file
    _COLUMNS = "ddqqi"  # ts, dur, stream, correlation, name id

    def __init__(self, spool_dir: str | None = None) -> None:
        self.rows = ColumnSpill(self._COLUMNS, spool_dir)
        self.names: dict[object, int] = {}
        self.step_symbols: set[str] = set()  # names and categories starting with ProfilerStep (HTA's iterations)
        self.spans: list[tuple[float, float, int]] = []  # (ts, dur, name id) of ProfilerStep rows, in event order
        self.fractional = False  # some ts is not an integer (or missing): HTA rounds every event's times
        self.first_kept = False  # the trace's event 0 is row 0 (HTA never links a kernel to it)
        self.skipped = 0
        self.events = 0  # events seen (in a worker: since its last part)
        self._listed = 0  # names already in a part
        self._maps: dict[int, array] = {}  # per worker: its name ids -> ours

    def visit(self, event: dict) -> None:
        get = event.get
        args = get("args")
        if args.__class__ is dict:
            self._add(get("ts"), get("dur"), get("cat"), get("name"), args.get("stream"), args.get("correlation"))
        else:
            self._add(get("ts"), get("dur"), get("cat"), get("name"), None, None)

    def visit_chunk(self, text: bytes) -> int | None:
        """Index a chunk's events as :meth:`visit` would, from their projection, a
        field at a time; None (nothing changed) when the ordinary reading must
        read it (a field of a type the rule is not written for here)."""
        events = _PROJECTION.decode(text)
        if events is None:
            return None
        ts, dur = [event.ts for event in events], [event.dur for event in events]
        cats, names = [event.cat for event in events], [event.name for event in events]
        if not (set(map(type, ts)) <= _PLAIN and set(map(type, dur)) <= _PLAIN and set(map(type, names)) <= _NAMES):
            return None
        self.fractional = self.fractional or set(map(type, ts)) != {int}
        kept = [at for at, (start, length, cat) in enumerate(zip(ts, dur, cats))
                if start is not None and length is not None and cat.__class__ is str and cat != "Trace"]
        if set(map(type, cats)) - {str, type(None)}:  # categories that are not text: counted, as visit counts them
            self.skipped += sum(1 for start, length, cat in zip(ts, dur, cats)
                                if start is not None and length is not None and cat is not None and cat.__class__ is not str)
        self.first_kept = self.first_kept or (self.events == 0 and bool(kept) and kept[0] == 0)
        self.events += len(events)
        if not kept:
            return len(events)
        args = [events[at].args for at in kept]
        streams = [tracediff.NO_ID if value is None else value for value in
                   (None if arg is None else arg.stream for arg in args)]
        corrs = [tracediff.NO_ID if value is None else value for value in
                 (None if arg is None else arg.correlation for arg in args)]
        if set(map(type, streams)) != {int}:
            streams = [stream_of(value) for value in streams]
        if set(map(type, corrs)) != {int}:
            corrs = [_correlation(value) for value in corrs]
        if not (ID_LOW <= min(streams) and max(streams) < ID_HIGH and ID_LOW <= min(corrs) and max(corrs) < ID_HIGH):
            streams = [value if ID_LOW <= value < ID_HIGH else tracediff.NO_ID for value in streams]
            corrs = [value if ID_LOW <= value < ID_HIGH else tracediff.NO_ID for value in corrs]
        ids = self.names
        name_ids = [ids.setdefault(names[at], len(ids)) for at in kept]
        for at in kept:
            name = names[at]
            if name.__class__ is str and name.startswith("ProfilerStep"):
                self.step_symbols.add(name)
                self.spans.append((float(ts[at]), float(dur[at]), ids[name]))
        self.step_symbols.update(cat for cat in {cats[at] for at in kept} if cat.startswith("ProfilerStep"))
        ts_column, dur_column, stream_column, corr_column, name_column = self.rows.columns
        ts_column.extend([float(ts[at]) for at in kept])
        dur_column.extend([float(dur[at]) for at in kept])
        stream_column.extend(streams)
        corr_column.extend(corrs)
        name_column.extend(name_ids)
        if self.rows.full() and not self.partial:
            self.rows.flush()
        return len(events)

    def _add(self, ts: Any, dur: Any, cat: Any, name: Any, stream_value: Any, corr_value: Any) -> None:
        """One event: a row when HTA reads it (a numeric ts and dur, a category other than Trace)."""
        first = self.events == 0
        self.events += 1
        if ts.__class__ is not int:
            self.fractional = True
            if ts.__class__ is Decimal:  # (exact mode reads fractions as Decimals)
                ts = float(ts)
            elif ts.__class__ is not float:
                return
        if dur is None:
            return
        if dur.__class__ is Decimal:
            dur = float(dur)
        if cat.__class__ is not str or cat == "Trace" or dur.__class__ not in NUMBERS:
            if cat is not None and cat != "Trace":
                self.skipped += 1
            return
        stream = tracediff.NO_ID if stream_value is None else stream_of(stream_value)
        corr = tracediff.NO_ID if corr_value is None else _correlation(corr_value)
        if not (ID_LOW <= stream < ID_HIGH and ID_LOW <= corr < ID_HIGH):
            stream, corr = (value if ID_LOW <= value < ID_HIGH else tracediff.NO_ID for value in (stream, corr))
        name_id = self.names.setdefault(name, len(self.names))
        if name.__class__ is str and name.startswith("ProfilerStep"):
            self.step_symbols.add(name)
            self.spans.append((float(ts), float(dur), name_id))
        if cat.startswith("ProfilerStep"):
            self.step_symbols.add(cat)
        self.first_kept = self.first_kept or first
        for column, value in zip(self.rows.columns, (ts, dur, stream, corr, name_id)):
            column.append(value)
        if self.rows.full() and not self.partial:
            self.rows.flush()

    def take_part(self) -> dict:
        """What was indexed since the last part: rows, spans and flags (names by
        this visitor's ids, the new names listed)."""
        part = {"rows": [column.tobytes() for column in self.rows.columns], "names": list(self.names)[self._listed:],
                "spans": self.spans[:], "step_symbols": set(self.step_symbols), "fractional": self.fractional,
                "skipped": self.skipped, "first_kept": self.first_kept, "events": self.events}
        for column in self.rows.columns:
            del column[:]
        self._listed = len(self.names)
        self.spans.clear()
        self.step_symbols.clear()
        self.fractional, self.first_kept, self.skipped, self.events = False, False, 0, 0
        return part

    def absorb(self, part: dict, source: int, first_event: int) -> None:
        """Append a worker's part (parts come in event order), its name ids made ours."""
        ids = self._maps.setdefault(source, array("i"))
        for name in part["names"]:
            ids.append(self.names.setdefault(name, len(self.names)))
        ours = np.frombuffer(ids, dtype=np.int32) if ids else np.empty(0, np.int32)
        names = ours[np.frombuffer(part["rows"][-1], dtype=np.int32)].astype(np.int32)
        self.first_kept = self.first_kept or (first_event == 0 and part["first_kept"])
        for column, data in zip(self.rows.columns, (*part["rows"][:-1], names.tobytes())):
            column.frombytes(data)
        if self.rows.full():
            self.rows.flush()
        self.spans += [(ts, dur, int(ours[name])) for ts, dur, name in part["spans"]]
        self.step_symbols |= part["step_symbols"]
        self.fractional = self.fractional or part["fractional"]
        self.skipped += part["skipped"]
        self.events = first_event + part["events"]


@dataclass
class Side:
    """One side of the comparison: what was asked and what was found."""

    label: str
    spec: str
    rank: int | None
    iteration: int | None
    file: str = ""
    iterations: list[int] = field(default_factory=list)
    totals: dict[str, tuple[int, float]] = field(default_factory=dict)
    full_totals: dict[str, tuple[int, float]] = field(default_factory=dict)  # by full name: ops_diff's (HTA's own)
    read: dict = field(default_factory=dict)

    def describe(self) -> dict:
        return {"input": self.spec, "file": self.file, "rank": self.rank, "iteration": self.iteration,
                "iterations": self.iterations, "names": len(self.totals), "read": self.read}


def diff(control: str | os.PathLike, test: str | os.PathLike, out_dir: str | os.PathLike | None = None, *,
         device: str = "all", control_rank: int | None = None, test_rank: int | None = None,
         control_iteration: int | None = None, test_iteration: int | None = None, short_names: bool = False,
         overwrite: bool = False, salvage: bool = False, spool_dir: str | None = None, reread_remote: bool = False,
         tables: bool = False, progress: bool | str | None = False, jobs: int | str | None = None,
         summary_file: str | os.PathLike | None = None) -> dict:
    """HTA's ``TraceDiff.compare_traces`` and ``ops_diff`` of two traces;
    returns the summary (``trace_diff``: the rows, ``ops_diff``: names per change).

    ``control`` / ``test``: a trace file, or rank files (a directory, a glob,
    an archive) of which the rank asked for (default: the first) is read.
    ``device``: ``cpu``, ``gpu`` or ``all``.  Iterations default to each
    trace's first.  ``out_dir``: ``trace_diff.csv`` and ``ops_diff.csv``.
    ``tables``: also ``analyze`` both runs (every rank) and join each table
    (``tables`` in the summary, ``<table>.csv`` in ``out_dir``), with each
    rank's mean step in both runs (``step_time_per_rank``).
    """
    started = time.perf_counter()
    if device not in tracediff.DEVICES:
        raise TraceError(f"device must be one of {', '.join(tracediff.DEVICES)}, not {device!r}")
    sides = [Side(label, os.fspath(spec), rank, iteration) for label, spec, rank, iteration in
             zip(tracediff.LABELS, (control, test), (control_rank, test_rank), (control_iteration, test_iteration))]
    for side in sides:
        side.file, side.rank = _rank_file(side)
    inputs = {path for side in sides for path in (_trace_files(side.spec) if tables else [side.file])}
    destinations = Destinations(inputs, overwrite=overwrite, summary=summary_file)
    targets = []
    if out_dir is not None:
        directory = destinations.directory(out_dir, writes="the diff's CSV files")
        names = [*OUTPUTS, *(f"{name}.csv" for name in (*TABLE_KEYS, STEP_TIME) if tables)]
        targets = [os.path.join(directory, name) for name in names]
        destinations.claim_all(targets, role="table")
    options = dict(salvage=salvage, spool_dir=spool_dir, reread_remote=reread_remote, progress=progress,
                   jobs=resolve_jobs(jobs))
    for file in dict.fromkeys(side.file for side in sides):  # a file on both sides is read once
        _read_sides(file, [side for side in sides if side.file == file], device, short_names, options)
    joined = _joined_tables(sides, options) if tables else {}
    rows = tracediff.compare(sides[0].totals, sides[1].totals)
    # ops_diff compares full names whatever short_names says (HTA's ops_diff calls compare_traces without it)
    changes = tracediff.ops_diff(tracediff.compare(sides[0].full_totals, sides[1].full_totals))
    summary = {
        "command": "diff",
        "device": device,
        "short_names": short_names,
        "control": sides[0].describe(),
        "test": sides[1].describe(),
        "output": targets,
        "changes": {change: len(names) for change, names in changes.items()},
        "trace_diff": rows,
        "ops_diff": changes,
        "tables": {name: table_rows for name, (_, table_rows) in joined.items()},
    }
    if targets:
        files = [(tracediff.diff_columns(), [list(row.values()) for row in rows]),
                 (("category", "name"), [(change, name) for change, names in changes.items() for name in names]),
                 *((header, [[row[column] for column in header] for row in table_rows])
                   for header, table_rows in joined.values())]
        with destinations:  # every file appears, or none
            for target, (header, lines) in zip(targets, files):
                destinations.write(target, _csv(header, lines), role="table")
    summary["wall_seconds"] = round(time.perf_counter() - started, 3)
    summary["peak_rss_mb"] = peak_rss_mb()
    return destinations.finish(summary)


def _joined_tables(sides: list[Side], options: dict) -> dict[str, tuple[list[str], list[dict]]]:
    """``analyze`` of both runs (once when both are the same input), each table joined on its key."""
    from .analyze import COLUMNS, analyze

    runs: dict[str, dict] = {}
    for side in sides:
        if side.spec not in runs:
            runs[side.spec] = analyze(side.spec, salvage=options["salvage"], spool_dir=options["spool_dir"],
                                      reread_remote=options["reread_remote"], progress=options["progress"],
                                      jobs=options["jobs"])["tables"]
    control, test = (runs[side.spec] for side in sides)
    joined = {name: tracediff.join_tables(control.get(name) or [], test.get(name) or [], keys, COLUMNS[name])
              for name, keys in TABLE_KEYS.items()}
    joined[STEP_TIME] = tracediff.join_tables(*(_step_means(run.get("step_times") or []) for run in (control, test)),
                                              ("rank",), STEP_COLUMNS)
    return joined


def _step_means(step_times: list[dict]) -> list[dict]:
    """Each rank's step count and mean step duration."""
    durations: dict[int, list[float]] = {}
    for row in step_times:
        durations.setdefault(row["rank"], []).append(row["duration(us)"])
    return [{"rank": rank, "steps": len(values), "mean_step(us)": sum(values) / len(values)}
            for rank, values in sorted(durations.items())]


def _rank_file(side: Side) -> tuple[str, int | None]:
    """The file of the side's rank: the only file, or among rank files the one
    of the rank asked for (default: the lowest).  A single file's rank is
    known after its pass (None until then)."""
    files = _trace_files(side.spec)
    if len(files) == 1:
        return files[0], side.rank
    ranks: dict[int, str] = {}
    for path in files:
        rank = _file_rank(path, header_rank(path))
        if rank in ranks:
            raise TraceError(f"{ranks[rank]} and {path} are both rank {rank}; give one of them", path=side.spec)
        ranks[rank] = path
    rank = min(ranks) if side.rank is None else side.rank
    if rank not in ranks:
        raise TraceError(f"no rank {rank} among the {side.label.lower()} traces (ranks {_listed(sorted(ranks))})",
                         path=side.spec)
    return ranks[rank], rank


def _trace_files(spec: str) -> list[str]:
    """What ``merge`` reads for ``spec``; in a directory, the traces that state
    their rank, else all of them (HTA's trace_dir: rank 0 where none is stated)."""
    if not os.path.isdir(spec):
        return discover_inputs([spec])
    files = trace_files_in(spec)
    ranked = [path for path in files if rank_from_file_name(path) is not None or header_rank(path) is not None]
    return ranked or files


def _file_rank(path: str, stated: object) -> int:
    """A rank file's rank: ``distributedInfo.rank``, else a ``rank<N>`` in its name, else 0 (as HTA)."""
    if type(stated) is int:
        return stated
    named = rank_from_file_name(path)
    return 0 if named is None else named


def _read_sides(path: str, sides: list[Side], device: str, short_names: bool, options: dict) -> None:
    """Pass 1 over one file, then each side's selection and totals."""
    with InputSource(path, spool_dir=options["spool_dir"], reread_remote=options["reread_remote"]) as source:
        meter = Progress(source.size, enabled=options["progress"])
        result = index_pass(source, lambda: DiffIndex(options["spool_dir"]), keep_events=False,
                            salvage=options["salvage"], jobs=options["jobs"], progress=meter)
        location = source.name
    index: DiffIndex = result.visitor  # type: ignore[assignment]
    try:
        info = member_value(result.stats.header + result.stats.trailer, "distributedInfo")
        rank = _file_rank(path, info.get("rank") if isinstance(info, dict) else None)
        names = [name if name.__class__ is str else str(name) for name in index.names]
        iterations = _iterations(location, index)
        steps = _step_of(location, index)
        sync_ids = np.array([at for at, name in enumerate(names) if name in SYNC_NAMES], dtype=np.int32)
        for side in sides:
            if side.rank is not None and side.rank != rank:
                raise TraceError(f"{side.label.lower()} trace is rank {rank}, not {side.rank}", path=location)
            side.rank, side.iterations = rank, iterations
            side.read = {**result.stats.as_dict(), "events_skipped": index.skipped,
                         "pass1_seconds": round(result.seconds, 3)}
            if not iterations:
                raise TraceError(f"no ProfilerStep#N event: the {side.label.lower()} trace has no iteration to "
                                 "compare", path=location)
            side.iteration = iterations[0] if side.iteration is None else side.iteration
            if side.iteration not in iterations:
                raise TraceError(f"no iteration {side.iteration} in the {side.label.lower()} trace (its iterations: "
                                 f"{_listed(iterations)})", path=location)
            selection = tracediff.Selection(steps, np.array([side.iteration]), device, sync_ids, bool(index.first_kept))
            totals = _totals(index, selection)
            side.totals = totals.by_name(names, short_names)
            side.full_totals = totals.by_name(names, False) if short_names else side.totals
    finally:
        index.rows.close()


def _iterations(location: str, index: DiffIndex) -> list[int]:
    """HTA's iterations: the numbers of the ``ProfilerStep#N`` names (and categories)."""
    numbers = {symbol: step_number(symbol) for symbol in index.step_symbols}
    odd = sorted(symbol for symbol, number in numbers.items() if number is None)
    if odd:
        raise TraceError(f"the step name {odd[0]!r} has no number (HTA reads ProfilerStep#N)", path=location)
    return sorted(set(numbers.values()))  # type: ignore[arg-type]


def _step_of(location: str, index: DiffIndex) -> StepOf:
    """HTA's iteration of a time: the last ``ProfilerStep`` span (in event order) holding it, HTA's times."""
    spans = np.array(index.spans, dtype=np.float64).reshape(-1, 3)
    starts, durations = hta_times(spans[:, 0].copy(), spans[:, 1].copy(), index.fractional)
    names = list(index.names)
    numbers = np.array([step_number(names[int(at)]) for at in spans[:, 2]], dtype=np.int64)
    return StepOf(starts, starts + durations, numbers)


def _totals(index: DiffIndex, selection: tracediff.Selection) -> tracediff.NameTotals:
    """Two sweeps over the rows: the chosen iteration's launches, then the totals of the rows kept."""
    start = 0
    for ts, dur, stream, corr, name in index.rows.chunks():
        ts, _ = hta_times(ts, dur, index.fractional)
        selection.note_launches(start, ts, stream, corr, name)
        start += len(ts)
    totals = tracediff.NameTotals()
    for ts, dur, stream, corr, name in index.rows.chunks():
        ts, dur = hta_times(ts, dur, index.fractional)
        kept = selection.rows(ts, stream, corr, name)
        totals.add(name[kept], dur[kept])
    return totals


def _csv(header: Sequence[str], rows: list) -> bytes:
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return text.getvalue().encode()


def _listed(numbers: list[int], limit: int = 8) -> str:
    shown = ", ".join(map(str, numbers[:limit]))
    return shown + (f" ... {numbers[-1]} ({len(numbers)})" if len(numbers) > limit else "")


def report_rows(summary: dict, top: int = 5) -> list[tuple[str, str]]:
    """The default report: what each side is, the changes, the names whose
    duration moved most; with the tables, each rank's step time in both runs
    (the ranks that moved most) and the kernels and idle time that moved most."""
    rows = [(side, f"{summary[side]['file']} rank {summary[side]['rank']} iteration {summary[side]['iteration']}")
            for side in ("control", "test")]
    rows.append(("ops", ", ".join(f"{count:,} {change}" for change, count in summary["changes"].items())))
    tables = summary.get("tables") or {}
    moved = sorted((row for row in summary["trace_diff"] if row["diff_duration"]),
                   key=lambda row: -abs(row["diff_duration"]))[:2 if tables else top]
    rows += [("duration", f"{row['diff_duration']:+,} us  {row['name'][:80]}") for row in moved]
    if not tables:
        return rows
    steps = tables[STEP_TIME]
    for row in _most_moved([row for row in steps if row["present"] == "both"], "mean_step(us)", 3):
        rows.append(("step time", f"rank {row['rank']}: {row['mean_step(us)__Control']:,.0f} -> "
                                  f"{row['mean_step(us)__Test']:,.0f} us ({_signed(row['mean_step(us)__pct'])})"))
    alone = [f"ranks {_listed([row['rank'] for row in steps if row['present'] == run])} only in the {run} run"
             for run in ("control", "test") if any(row["present"] == run for row in steps)]
    if len(steps) > 3 or alone:
        rows.append(("step time", "; ".join([f"{len(steps)} ranks"] + alone)))
    for row in _most_moved(tables["kernel_breakdown"], "sum (us)", 2):
        rows.append(("kernel", f"{_change(row, 'sum (us)'):+,.0f} us  {row['name'][:70]} (rank {row['rank']}"
                               f"{'' if row['present'] == 'both' else ', only in the ' + row['present'] + ' run'})"))
    for row in _most_moved(tables["idle_time_breakdown"], "idle_time", 2):
        rows.append(("idle", f"{_change(row, 'idle_time'):+,.0f} us  rank {row['rank']} stream {row['stream']} "
                             f"{row['idle_category']}"))
    return rows


def _change(row: dict, column: str) -> float:
    """How much a joined row's ``column`` moved: its difference, or all of it where one run lacks the row."""
    if row["present"] == "both":
        return row[f"{column}__diff"] or 0
    return (row[f"{column}__Test"] or 0) - (row[f"{column}__Control"] or 0)


def _most_moved(rows: list[dict], column: str, count: int) -> list[dict]:
    """The joined rows whose ``column`` moved most, leaving out those that did not move."""
    return sorted((row for row in rows if _change(row, column)), key=lambda row: -abs(_change(row, column)))[:count]


def _signed(pct: float | None) -> str:
    return "from 0" if pct is None else f"{pct:+.1f}%"
