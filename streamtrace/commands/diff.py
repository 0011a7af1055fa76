"""``diff``: what changed between two runs, as HTA 0.5.0's ``TraceDiff`` says (SPEC 18).

Each side is one rank: a rank file (among rank files, the chosen rank's),
or the chosen rank of a merged multi-rank file, its ranks told apart as
``analyze`` tells them (:mod:`.analyses.ranks`).  Pass 1 with
:class:`DiffIndex` keeps, per event HTA reads (events with a ``dur`` and a
``cat``), start, duration, stream, correlation id, name, category, pid and
own rank in columns spilled to disk; then sweeps over the chosen rank's
rows (:mod:`streamtrace.algo.tracediff`) find its step spans, the launches
of the chosen iteration and each name's count and duration.  Memory holds
one block of rows, the distinct names, the step spans and one iteration's
launch ids.  A file on both sides (two iterations or two ranks of one run)
is read once.
"""
from __future__ import annotations

import csv
import io
import os
import time
from array import array
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Iterator, Sequence

import numpy as np

from ..algo import difffigures, tracediff
from ..algo.analysis import StepOf, step_number
from ..algo.difffigures import change, listed, moved_by_name, where_moved
from ..algo.rankmap import PidEvidence
from ..algo.ranks import rank_from_file_name
from ..algo.reportfigures import Figure
from ..engine.jobs import resolve_jobs
from ..engine.passes import index_pass
from ..errors import TraceError
from ..io import report as page
from ..io.destinations import Destinations
from ..io.inputs import trace_files_in
from ..io.jsonscan import member_value
from ..io.progress import Progress
from ..io.projection import Projection
from ..io.source import InputSource
from ..io.spool import ColumnSpill
from ..resources import peak_rss_mb
from .analyses.index import RANK_EVIDENCE_CATEGORIES, absorb_ids, stream_of
from .analyses.ranks import RankInput, joined_columns, ranks_of_slots, split_by_rank
from .mergedindex import note_process_name
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
NO_RANK = -1
NO_ID = tracediff.NO_ID
NUMBERS = (int, float)
_PLAIN = {int, float, type(None)}  # the times visit_chunk takes (others: the ordinary reading)
_NAMES = {str, int, float, type(None)}  # the names it takes (an array or object name: the ordinary reading)
_PROJECTION = Projection({"ph": None, "ts": None, "dur": None, "cat": None, "name": None, "pid": None,
                          "args": {"stream": None, "original_stream": None, "correlation": None, "rank": None,
                                   "name": None}})  # what DiffIndex reads of an event


def _correlation(value: Any) -> int:
    """A correlation id: an integer or a whole float (as pandas compares them); anything else is none."""
    if value.__class__ is float and value.is_integer():
        return int(value)
    return value if value.__class__ is int else tracediff.NO_ID


def _ids(streams: list, corrs: list) -> tuple[list[int], list[int]]:
    """HTA's stream and correlation ids of some rows (what an int64 cannot hold: no id)."""
    if set(map(type, streams)) != {int}:
        streams = [stream_of(value) for value in streams]
    if set(map(type, corrs)) != {int}:
        corrs = [_correlation(value) for value in corrs]
    if streams and not (ID_LOW <= min(streams) and max(streams) < ID_HIGH and ID_LOW <= min(corrs) and max(corrs) < ID_HIGH):
        streams = [value if ID_LOW <= value < ID_HIGH else tracediff.NO_ID for value in streams]
        corrs = [value if ID_LOW <= value < ID_HIGH else tracediff.NO_ID for value in corrs]
    return streams, corrs


class DiffIndex:
    """Pass-1 visitor: per event HTA reads, its start, duration, stream,
    correlation id, name id, category id and pid slot, and its own
    ``args.rank`` (columns spilled to disk); per pid, the rank evidence
    ``relink`` reads (as ``analyze``'s index: a merged file's ranks are told
    apart by the same rules, :func:`.analyses.ranks.ranks_of_slots`).  The
    rows come back as ``analyze``'s work blocks (:meth:`work_blocks`).
    Pass-1 workers index ranges of the events from a projection of the
    members it reads (:meth:`visit_chunk`) and send their rows in parts
    (:meth:`take_part`, :meth:`absorb`)."""

    splits_by_ranges = True
    partial = False  # True where it indexes parts (a worker's): its rows go in parts, never to the file
    _COLUMNS = "ddqqiiii"  # ts, dur, stream, correlation, name id, category id, pid slot, own rank (-1: none)
    _BLOCK = ("ts", "dur", "stream", "corr", "name", "cat", "slot")

    def __init__(self, spool_dir: str | None = None) -> None:
        self.rows = ColumnSpill(self._COLUMNS, spool_dir)
        self.names: dict[object, int] = {}
        self.cats: dict[object, int] = {}
        self.pid_slots: dict[object, int] = {}
        self.pids: list[PidEvidence] = []
        self.unranked = bytearray()  # per pid slot: some launch or GPU event lacks args.rank
        self.fractional = [False]  # some ts is not an integer (or missing): HTA rounds every event's times
        self.first_kept = False  # the trace's event 0 is row 0 (HTA never links a kernel to it)
        self.skipped = 0
        self.events = 0  # events seen (in a worker: since its last part)
        self._listed = (0, 0)  # names and categories already in a part
        self._maps: dict[int, tuple[array, array, array]] = {}  # per worker: its name, category and pid ids -> ours

    def slot_of(self, pid: object) -> int:
        """A pid's slot (pids are ints or strings, anything else by its text, as relink)."""
        found = self.pid_slots.get(pid)
        if found is None:
            if pid.__class__ not in (int, str):
                return self.slot_of(str(pid))
            found = self.pid_slots[pid] = len(self.pids)
            self.pids.append(PidEvidence(pid))
            self.unranked.append(0)
        return found

    def visit(self, event: dict) -> None:
        get = event.get
        args = get("args")
        if args.__class__ is not dict:
            args = {}
        stream = args.get("original_stream")  # (compact and merge move a GPU event's stream to a drawing lane)
        self._add(event, get("ts"), get("dur"), get("cat"), get("name"), get("pid"),
                  args.get("stream") if stream is None else stream, args.get("correlation"), args.get("rank"))

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
        self.fractional[0] = self.fractional[0] or set(map(type, ts)) != {int}
        if None in ts or None in dur:  # (metadata events have no dur)
            for event in (events[at] for at, (start, length) in enumerate(zip(ts, dur)) if start is None or length is None):
                if event.ph == "M":
                    args = event.args
                    note_process_name({"name": event.name, "pid": event.pid, "args": None if args is None else
                                       {"name": args.name, "rank": args.rank}}, self.pids, self.slot_of)
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
        streams = [None if arg is None else arg.stream if arg.original_stream is None else arg.original_stream
                   for arg in args]
        streams, corrs = _ids([NO_ID if value is None else value for value in streams],
                              [NO_ID if arg is None or arg.correlation is None else arg.correlation for arg in args])
        pid_slots = self.pid_slots
        slots = [pid_slots.get(events[at].pid) for at in kept]
        if None in slots:
            slots = [self.slot_of(events[at].pid) for at in kept]
        own = [NO_RANK] * len(kept)
        for row in [row for row, at in enumerate(kept) if cats[at] in RANK_EVIDENCE_CATEGORIES]:
            arg = args[row]
            own[row] = self._rank_evidence(cats[kept[row]], names[kept[row]], slots[row], streams[row], corrs[row],
                                           None if arg is None else arg.rank)
        name_ids, cat_ids = self.names, self.cats
        columns = self.rows.columns
        for column, values in zip(columns, ([float(ts[at]) for at in kept], [float(dur[at]) for at in kept], streams,
                                            corrs, [name_ids.setdefault(names[at], len(name_ids)) for at in kept],
                                            [cat_ids.setdefault(cats[at], len(cat_ids)) for at in kept], slots, own)):
            column.extend(values)
        if self.rows.full() and not self.partial:
            self.rows.flush()
        return len(events)

    def _rank_evidence(self, cat: str, name: object, slot: int, stream: int, corr: int, rank: object) -> int:
        """A row's own rank (-1: none), noted as its pid's evidence: ``args.rank``
        of a launch or GPU event that analyze keeps as a work row."""
        if cat not in RANK_EVIDENCE_CATEGORIES or (stream == tracediff.NO_ID and corr == tracediff.NO_ID
                                                   and not (name.__class__ is str and "ProfilerStep" in name)):
            return NO_RANK
        if rank.__class__ is int and rank >= 0:
            self.pids[slot].arg_ranks.add(rank)
            return rank
        self.unranked[slot] = 1
        return NO_RANK

    def _add(self, event: dict, ts: Any, dur: Any, cat: Any, name: Any, pid: Any, stream_value: Any, corr_value: Any,
             rank: Any) -> None:
        """One event: a row when HTA reads it (a numeric ts and dur, a category other than Trace)."""
        first = self.events == 0
        self.events += 1
        if ts.__class__ is not int:
            self.fractional[0] = True
            if ts.__class__ is Decimal:  # (exact mode reads fractions as Decimals)
                ts = float(ts)
            elif ts.__class__ is not float:
                if event.get("ph") == "M":
                    note_process_name(event, self.pids, self.slot_of)
                return
        if dur is None:
            if event.get("ph") == "M":
                note_process_name(event, self.pids, self.slot_of)
            return
        if dur.__class__ is Decimal:
            dur = float(dur)
        if cat.__class__ is not str or cat == "Trace" or dur.__class__ not in NUMBERS:
            if cat is not None and cat != "Trace":
                self.skipped += 1
            return
        (stream,), (corr,) = _ids([stream_value], [corr_value])
        slot = self.slot_of(pid)
        own = self._rank_evidence(cat, name, slot, stream, corr, rank)
        self.first_kept = self.first_kept or first
        values = (ts, dur, stream, corr, self.names.setdefault(name, len(self.names)),
                  self.cats.setdefault(cat, len(self.cats)), slot, own)
        for column, value in zip(self.rows.columns, values):
            column.append(value)
        if self.rows.full() and not self.partial:
            self.rows.flush()

    def take_part(self) -> dict:
        """What was indexed since the last part: rows, pid evidence and flags (names,
        categories and pids by this visitor's ids, the new ones listed)."""
        part = {"rows": [column.tobytes() for column in self.rows.columns], "names": list(self.names)[self._listed[0]:],
                "cats": list(self.cats)[self._listed[1]:], "pids": self.pids[:], "unranked": bytes(self.unranked),
                "fractional": self.fractional[0], "skipped": self.skipped, "first_kept": self.first_kept,
                "events": self.events}
        for column in self.rows.columns:
            del column[:]
        self._listed = (len(self.names), len(self.cats))
        self.pids[:] = [PidEvidence(facts.pid) for facts in self.pids]
        self.unranked[:] = bytes(len(self.unranked))
        self.fractional[0], self.first_kept, self.skipped, self.events = False, False, 0, 0
        return part

    def absorb(self, part: dict, source: int, first_event: int) -> None:
        """Append a worker's part (parts come in event order), its ids made ours."""
        maps = self._maps.setdefault(source, (array("i"), array("i"), array("i")))
        absorb_ids(self, part, maps)  # type: ignore[arg-type]  # (the members it reads, as AnalyzeIndex's)
        rows = list(part["rows"])
        for at, ids in ((4, maps[0]), (5, maps[1]), (6, maps[2])):
            ours = np.frombuffer(ids, dtype=np.int32) if ids else np.empty(0, np.int32)
            rows[at] = ours[np.frombuffer(rows[at], dtype=np.int32)].astype(np.int32).tobytes()
        self.first_kept = self.first_kept or (first_event == 0 and part["first_kept"])
        for column, data in zip(self.rows.columns, rows):
            column.frombytes(data)
        if self.rows.full():
            self.rows.flush()
        self.fractional[0] = self.fractional[0] or part["fractional"]
        self.skipped += part["skipped"]
        self.events = first_event + part["events"]

    def work_blocks(self) -> Iterator[tuple[int, dict[str, np.ndarray]]]:
        """The rows as analyze's work blocks, in event order: (the block's first row
        number, its columns; ``ranked``: the rows with their own rank, ``ranks``: those ranks)."""
        base = 0
        for columns in self.rows.chunks():
            block = dict(zip(self._BLOCK, columns))
            own = columns[-1]
            ranked = np.flatnonzero(own >= 0)
            block["ranked"], block["ranks"] = ranked + base, own[ranked]
            yield base, block
            base += len(own)


@dataclass
class Side:
    """One side of the comparison: what was asked and what was found."""

    label: str
    spec: str
    rank: int | None
    iteration: int | None
    file: str = ""
    iterations: list[int] = field(default_factory=list)
    ranks: list[int] = field(default_factory=list)  # the ranks its file holds
    totals: dict[str, tuple[int, float]] = field(default_factory=dict)
    full_totals: dict[str, tuple[int, float]] = field(default_factory=dict)  # by full name: ops_diff's (HTA's own)
    read: dict = field(default_factory=dict)

    def describe(self) -> dict:
        return {"input": self.spec, "file": self.file, "rank": self.rank, "ranks": self.ranks, "iteration": self.iteration,
                "iterations": self.iterations, "names": len(self.totals), "read": self.read}


def diff(control: str | os.PathLike, test: str | os.PathLike, out_dir: str | os.PathLike | None = None, *,
         device: str = "all", control_rank: int | None = None, test_rank: int | None = None,
         control_iteration: int | None = None, test_iteration: int | None = None, short_names: bool = False,
         overwrite: bool = False, salvage: bool = False, spool_dir: str | None = None, reread_remote: bool = False,
         tables: bool = False, progress: bool | str | None = False, jobs: int | str | None = None,
         summary_file: str | os.PathLike | None = None, html: str | os.PathLike | None = None,
         command: str | None = None) -> dict:
    """HTA's ``TraceDiff.compare_traces`` and ``ops_diff`` of two traces;
    returns the summary (``trace_diff``: the rows, ``ops_diff``: names per change).

    ``control`` / ``test``: a trace file, rank files (a directory, a glob,
    an archive) or a merged multi-rank file, of which the rank asked for
    (default: the first) is read.
    ``device``: ``cpu``, ``gpu`` or ``all``.  Iterations default to each
    trace's first.  ``out_dir``: ``trace_diff.csv`` and ``ops_diff.csv``.
    ``tables``: also ``analyze`` both runs (every rank) and join each table
    (``tables`` in the summary, ``<table>.csv`` in ``out_dir``), with each
    rank's mean step in both runs (``step_time_per_rank``).  ``html``: also
    the report page there (needs ``streamtrace[report]``; implies
    ``tables``), its header naming ``command`` as what made it.
    """
    started = time.perf_counter()
    if device not in tracediff.DEVICES:
        raise TraceError(f"device must be one of {', '.join(tracediff.DEVICES)}, not {device!r}")
    tables = tables or html is not None  # (the page draws the joined tables)
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
    if html is not None:
        page.require_plotly()
        destinations.claim(html, role="HTML report", holds="HTML")
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
        "output": targets + ([os.fspath(html)] if html is not None else []),
        "changes": {change: len(names) for change, names in changes.items()},
        "notes": _notes(sides),
        "trace_diff": rows,
        "ops_diff": changes,
        "tables": {name: table_rows for name, (_, table_rows) in joined.items()},
    }
    if targets or html is not None:
        files = [(tracediff.diff_columns(), [list(row.values()) for row in rows]),
                 (("category", "name"), [(change, name) for change, names in changes.items() for name in names]),
                 *((header, [[row[column] for column in header] for row in table_rows])
                   for header, table_rows in joined.values())]
        with destinations:  # every file appears, or none
            for target, (header, lines) in zip(targets, files):
                destinations.write(target, _csv(header, lines), role="table")
            if html is not None:
                shown = difffigures.figures(summary)
                ranks = len(summary["tables"]["step_time_per_rank"])
                destinations.write(html, page.page("streamtrace diff", f"{summary['control']['file']} vs "
                                                   f"{summary['test']['file']}", difffigures.facts(summary, command),
                                                   shown, {figure.key: _height(figure, ranks) for figure in shown}),
                                   role="HTML report")
    summary["wall_seconds"] = round(time.perf_counter() - started, 3)
    summary["peak_rss_mb"] = peak_rss_mb()
    return destinations.finish(summary)


def _notes(sides: list[Side]) -> list[str]:
    """What one run has and the other lacks (ranks, iterations): compared on what they share."""
    control, test = sides
    notes = []
    for what, mine, theirs, where in (("ranks", control.ranks, test.ranks, ""),
                                      ("iterations", control.iterations, test.iterations,
                                       f" (control rank {control.rank}, test rank {test.rank})")):
        alone = [f"{what} {listed(sorted(set(one) - set(other)))} only in the {label} run" for label, one, other in
                 (("control", mine, theirs), ("test", theirs, mine)) if set(one) - set(other)]
        if alone:
            notes.append("; ".join(alone) + where)
    for side in sides if control.file != test.file else [control]:
        if side.read.get("rows_without_rank"):
            notes.append(f"{side.file}: {side.read['rows_without_rank']:,} events on pids that no rule places in a "
                         "rank are left out (as analyze leaves them); give them a rank with args.rank or a "
                         "process_name such as 'rank 3'")
    return notes


def _joined_tables(sides: list[Side], options: dict) -> dict[str, tuple[list[str], list[dict]]]:
    """``analyze`` of both runs (once when both are the same input), each table joined on its key."""
    from .analyze import COLUMNS, analyze

    runs: dict[str, dict] = {}
    for side in sides:
        if side.spec not in runs:
            runs[side.spec] = analyze(side.spec, salvage=options["salvage"], spool_dir=options["spool_dir"],
                                      reread_remote=options["reread_remote"], progress=options["progress"],
                                      jobs=options["jobs"], collective_rows=False)["tables"]  # (HTA's tables only)
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
    side.ranks = sorted(ranks)
    rank = min(ranks) if side.rank is None else side.rank
    if rank not in ranks:
        raise TraceError(f"no rank {rank} among the {side.label.lower()} traces (ranks {listed(sorted(ranks))})",
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
    """Pass 1 over one file, its ranks told apart as analyze tells them, then each side's selection and totals."""
    with InputSource(path, spool_dir=options["spool_dir"], reread_remote=options["reread_remote"]) as source:
        meter = Progress(source.size, enabled=options["progress"])
        result = index_pass(source, lambda: DiffIndex(options["spool_dir"]), keep_events=False,
                            salvage=options["salvage"], jobs=options["jobs"], progress=meter)
        location = source.name
    index: DiffIndex = result.visitor  # type: ignore[assignment]
    try:
        members = result.stats.header + result.stats.trailer
        found, unplaced = split_by_rank(index, ranks_of_slots(path, index, members))
        ranks: dict[int, RankInput | None] = dict(found)
        if not ranks:  # no row: the file's own rank, with nothing in it
            info = member_value(members, "distributedInfo")
            ranks[_file_rank(path, info.get("rank") if isinstance(info, dict) else None)] = None
        names = [name if name.__class__ is str else str(name) for name in index.names]
        cats = [cat if cat.__class__ is str else str(cat) for cat in index.cats]
        sync_ids = np.array([at for at, name in enumerate(names) if name in SYNC_NAMES], dtype=np.int32)
        for side in sides:
            if len(ranks) == 1 and side.ranks:  # a file picked among rank files: the rank it was picked as
                rank, data = side.rank, next(iter(ranks.values()))
            else:
                rank = min(ranks) if side.rank is None else side.rank
                if rank not in ranks:
                    if len(ranks) == 1:
                        raise TraceError(f"{side.label.lower()} trace is rank {next(iter(ranks))}, not {rank}",
                                         path=location)
                    raise TraceError(f"no rank {rank} in the {side.label.lower()} trace (its ranks: "
                                     f"{listed(sorted(ranks))})", path=location)
                data = ranks[rank]
            iterations, steps = _steps(location, data, names, cats)
            side.rank, side.ranks, side.iterations = rank, side.ranks or sorted(ranks), iterations
            side.read = {**result.stats.as_dict(), "events_skipped": index.skipped,
                         "pass1_seconds": round(result.seconds, 3)}
            if unplaced:
                side.read["rows_without_rank"] = unplaced
            if data is None or not iterations:
                raise TraceError(f"no ProfilerStep#N event: the {side.label.lower()} trace has no iteration to compare"
                                 + (f" on rank {rank}" if len(ranks) > 1 else ""), path=location)
            side.iteration = iterations[0] if side.iteration is None else side.iteration
            if side.iteration not in iterations:
                raise TraceError(f"no iteration {side.iteration} in the {side.label.lower()} trace"
                                 f"{f' (rank {rank})' if len(ranks) > 1 else ''} (its iterations: {listed(iterations)})",
                                 path=location)
            # HTA never links a kernel to its row 0: a rank's own file's event 0 when it is a row; in a file of
            # several ranks, each rank's first row (as analyze: the first event of its own file)
            selection = tracediff.Selection(steps, np.array([side.iteration]), device, sync_ids,
                                            len(ranks) > 1 or index.first_kept)
            totals = _totals(data, selection)
            side.totals = totals.by_name(names, short_names)
            side.full_totals = totals.by_name(names, False) if short_names else side.totals
    finally:
        index.rows.close()


def _steps(location: str, data: RankInput | None, names: list[str], cats: list[str]) -> tuple[list[int], StepOf]:
    """HTA's iterations of one rank (the numbers of its ``ProfilerStep#N`` names and
    categories) and its iteration of a time: the last ``ProfilerStep`` span (in
    event order) holding it, HTA's times."""
    step_names = np.array([at for at, name in enumerate(names) if name.startswith("ProfilerStep")], dtype=np.int32)
    step_cats = np.array([at for at, cat in enumerate(cats) if cat.startswith("ProfilerStep")], dtype=np.int32)
    symbols: set[str] = set()
    spans: list[tuple[np.ndarray, ...]] = []
    for chunk in ([] if data is None else data.chunks()):
        rows = np.flatnonzero(np.isin(chunk.name, step_names))
        spans.append((chunk.ts[rows], chunk.dur[rows], chunk.name[rows]))
        symbols.update(names[at] for at in np.unique(chunk.name[rows]).tolist())
        symbols.update(cats[at] for at in np.intersect1d(chunk.cat, step_cats).tolist())
    numbers = {symbol: step_number(symbol) for symbol in symbols}
    odd = sorted(symbol for symbol, number in numbers.items() if number is None)
    if odd:
        raise TraceError(f"the step name {odd[0]!r} has no number (HTA reads ProfilerStep#N)", path=location)
    starts, durations, ids = joined_columns(spans, (np.float64, np.float64, np.int32))
    steps = np.array([numbers[names[at]] for at in ids.astype(np.int64).tolist()], dtype=np.int64)
    return sorted(set(numbers.values())), StepOf(starts, starts + durations, steps)  # type: ignore[arg-type]


def _totals(data: RankInput, selection: tracediff.Selection) -> tracediff.NameTotals:
    """Two sweeps over a rank's rows: the chosen iteration's launches, then the totals of the rows kept."""
    start = 0
    for chunk in data.chunks():
        selection.note_launches(start, chunk.ts, chunk.stream, chunk.corr, chunk.name)
        start += len(chunk.ts)
    totals = tracediff.NameTotals()
    for chunk in data.chunks():
        kept = selection.rows(chunk.ts, chunk.stream, chunk.corr, chunk.name)
        totals.add(chunk.name[kept], chunk.dur[kept])
    return totals


def _csv(header: Sequence[str], rows: list) -> bytes:
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return text.getvalue().encode()


def report_rows(summary: dict, top: int = 5) -> list[tuple[str, str]]:
    """The default report: what each side is, the changes, the names whose
    duration moved most; with the tables, each rank's step time in both runs
    (the ranks that moved most) and the kernels and idle time that moved most."""
    rows = [(side, f"{summary[side]['file']} rank {summary[side]['rank']} iteration {summary[side]['iteration']}")
            for side in ("control", "test")]
    rows.append(("ops", ", ".join(f"{count:,} {change}" for change, count in summary["changes"].items())))
    rows += [("note", note) for note in summary.get("notes") or ()]
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
    alone = [f"ranks {listed([row['rank'] for row in steps if row['present'] == run])} only in the {run} run"
             for run in ("control", "test") if any(row["present"] == run for row in steps)]
    if len(steps) > 3 or alone:
        rows.append(("step time", "; ".join([f"{len(steps)} ranks"] + alone)))
    for row in _most_moved(tables["kernel_breakdown"], "sum (us)", 2):
        rows.append(("kernel", f"{change(row, 'sum (us)'):+,.0f} us  {row['name'][:70]} (rank {row['rank']}"
                               f"{'' if row['present'] == 'both' else ', only in the ' + row['present'] + ' run'})"))
    collectives = moved_by_name([row for row in tables["kernel_breakdown"] if row["kernel_type"] == "COMMUNICATION"])
    for name, moved, ranks in collectives[:1]:
        rows.append(("comms", f"{moved:+,.0f} us  {name[:60]} ({where_moved(moved, ranks)})"))
    for row in _most_moved(tables["idle_time_breakdown"], "idle_time", 2):
        rows.append(("idle", f"{change(row, 'idle_time'):+,.0f} us  rank {row['rank']} stream {row['stream']} "
                             f"{row['idle_category']}"))
    return rows


def _most_moved(rows: list[dict], column: str, count: int) -> list[dict]:
    """The joined rows whose ``column`` moved most, leaving out those that did not move."""
    return sorted((row for row in rows if change(row, column)), key=lambda row: -abs(change(row, column)))[:count]


def _height(figure: Figure, ranks: int) -> int:
    """A figure's height on the page: the change bars by their count, the rank bars by the ranks."""
    if figure.key in ("top-changes", "kernel-changes"):
        return 120 + 22 * sum(len(trace["y"]) for trace in figure.traces)
    return int(min(700, max(360, 200 + 4 * ranks)))


def _signed(pct: float | None) -> str:
    return "from 0" if pct is None else f"{pct:+.1f}%"
