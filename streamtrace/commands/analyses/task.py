"""The per-input task of ``analyze``: pass 1, then every rank it holds, one reading of its rows feeding
every analysis; returns small per-rank facts (launch rows go to a part file)."""
from __future__ import annotations

import csv
import dataclasses
import math
import os
import tempfile
from dataclasses import dataclass, field
from itertools import repeat
from typing import IO, BinaryIO

import numpy as np

from ...algo import analysis as hta
from ...algo import sweeps, utilization
from ...algo.pp import pp_stage_from_info
from ...algo.steps import STEP_CATEGORIES
from ...engine.passes import index_pass
from ...io.jsonscan import member_value
from ...io.objectstore import RunStore, open_object, scratch
from ...io.progress import Meter
from ...io.remote import is_url
from ...io.sink import remove_quietly
from ...io.source import InputSource
from ...resources import buffers_from_os
from .buckets import Buckets, sweep, timeline_records
from .index import NO_ID, PLAIN_BLOCK, AnalyzeIndex
from .ranks import (
    Chunk,
    Frame,
    PlainFacts,
    RankInput,
    first_row_times,
    frame_of,
    joined_columns,
    kept_times,
    merge_extents,
    plain_facts,
    ranks_of_slots,
    split_by_rank,
    step_extents,
)

SCRATCH_MMAP_THRESHOLD = 4 << 20
JOIN_ROWS = 1 << 18  # GPU rows held at once to join them to their launches (24 bytes each)
KERNEL_CATEGORIES = frozenset({"kernel", "Kernel", "gpu_memset", "Memset", "gpu_memcpy", "Memcpy", "mtia_ccp_events"})
LAUNCH_NAMES = frozenset({"cudaLaunchKernel", "cudaLaunchKernelExC", "runFunction - job_prep_and_submit_for_execution"})
MEMORY_LAUNCH_NAMES = frozenset({"cudaMemcpyAsync", "cudaMemsetAsync"})
COMM_PREFIX = "ncclKernel"  # HTA's straggler analysis looks at these names only


@dataclass
class RankResult:
    """What one rank contributes to the tables (small, picklable)."""

    rank: int
    source: str
    min_ts: float
    step_names: set
    filtered: bool
    temporal: hta.Temporal
    type_sums: dict
    kernel_rows: list
    overlap: float
    idle_rows: list
    launch_part: str | None
    launch_rows: int
    step_numbers: set  # HTA's profiler steps of this rank
    steps: list  # (number, start, duration) of its steps on the CPU
    step_times: dict  # step -> (busy, compute, communication, idle)
    step_extent: dict  # step -> (first start, last end) of the rows in it (HTA's iteration)
    comm_candidates: dict  # (stream, step, name) -> [(ts, dur)] in file order, suffix maxima of dur
    notes: list = field(default_factory=list)
    busy: utilization.FineBusy | None = None  # GPU busy time in fine bins (None: no GPU rows)
    exact: GpuTime | None = None  # the temporal breakdown from the trace's own times
    kernel_totals: list = field(default_factory=list)  # (name, type, count, total time) per name, the trace's own times
    pp_stage: int | None = None  # its place in its PP group (distributedInfo)


@dataclass
class GpuTime:
    """A rank's GPU time from the times the trace states (HTA's tables round them to whole microseconds):
    its temporal breakdown, the union of its communication and of its memory kernels, the share of
    communication overlapped by computation; ``rounded``: HTA's rounding moves some of this rank's GPU times."""

    temporal: hta.Temporal
    communication: float
    memory: float
    overlap: float
    rounded: bool

    @classmethod
    def of(cls, timeline: sweeps.Timeline, rounded: bool) -> GpuTime:
        return cls(timeline.temporal(), timeline.lengths[hta.COMMUNICATION], timeline.lengths[hta.MEMORY],
                   timeline.overlap_ratio(), rounded)


@dataclass
class FileResult:
    """One input's ranks and its reading."""

    ranks: list[RankResult]
    read: dict
    skipped_events: int
    pass1_seconds: float
    step_names: set  # every ProfilerStep name of the input (HTA decides its cut on all inputs' names)
    filtered: bool  # the decision this reading took
    devices: tuple = ()  # the input's deviceProperties names
    notes: list = field(default_factory=list)  # what the input lacks or what reading it repaired


def discard(result: FileResult) -> None:
    for rank in result.ranks:
        if rank.launch_part and not is_url(rank.launch_part):  # (an object goes with the run's prefix)
            remove_quietly(rank.launch_part)


def open_part(part: str) -> BinaryIO:
    """A rank's launch rows: a file of the run's directory, or an object of its prefix."""
    return open_object(part) if is_url(part) else open(part, "rb")


@dataclass(frozen=True)
class Options:
    include_last_step: bool
    salvage: bool
    spool_dir: str | None
    reread_remote: bool = False
    jobs: int = 1  # pass-1 processes of one input (one input alone: all of -j; several: one task each)
    filter_steps: bool | None = None  # None: as this file's step names say; else as all inputs' say


@buffers_from_os(SCRATCH_MMAP_THRESHOLD)  # the growing arrays' old copies and numpy scratch must not stay resident
def analyze_file(path: str, options: Options, progress: Meter | None = None) -> FileResult:
    """One input (a task): pass 1, then every rank it holds."""
    with InputSource(path, spool_dir=options.spool_dir, reread_remote=options.reread_remote) as source:
        owner = os.getpid()
        result = index_pass(source, lambda: AnalyzeIndex(options.spool_dir, owner), keep_events=False,
                            salvage=options.salvage, jobs=options.jobs, progress=progress)
        members = result.stats.header + result.stats.trailer
        index: AnalyzeIndex = result.visitor  # type: ignore[assignment]
        location = source.name
    try:
        ranks = ranks_of_slots(location, index, members)
        strings = [name if name.__class__ is str else str(name) for name in index.names]
        cat_strings = [cat if cat.__class__ is str else str(cat) for cat in index.cats]
        step_names = {name for name in strings if "ProfilerStep" in name}
        filtered = len(step_names) > 1 if options.filter_steps is None else options.filter_steps
        first = first_row_times(index, ranks)
        inputs, unplaced = split_by_rank(index, ranks)
        frames = {rank: frame_of(data, strings, filtered, options.include_last_step) for rank, data in inputs}
        plain = plain_facts(index, ranks, frames)
        out: list[RankResult] = []
        try:
            for rank, data in inputs:
                out.append(_analyze_rank(location, data, frames[rank], plain.get(rank, PlainFacts()), strings,
                                         cat_strings, step_names, first.get(rank, math.nan), options))
        except BaseException:
            discard(FileResult(out, {}, 0, 0.0, set(), False))
            raise
        unplaced += plain.get(-1, PlainFacts()).unplaced
        cpu_only = 0 if out else sum(fact.unplaced for rank, fact in plain.items() if rank >= 0)
    finally:
        index.close()
    notes = _reading_notes(location, result.stats.as_dict())
    if unplaced:
        pids = [str(facts.pid) for facts, rank in zip(index.pids, ranks) if rank < 0]
        notes.append(f"{location}: {unplaced:,} events on pids that no rule places in a rank ({', '.join(pids[:8])}"
                     f"{' ...' if len(pids) > 8 else ''}) are left out; give them a rank with args.rank or a "
                     "process_name such as 'rank 3'")
    if cpu_only:
        notes.append(f"{location}: {cpu_only:,} CPU events and no GPU work, launch or profiler step: no rank to analyze")
    elif not out and not unplaced:
        notes.append(f"{location}: " + (f"none of its {result.stats.events:,} events has a ts, a dur and a cat (what "
                                        "analyze reads)" if result.stats.events else "no events") + ": no rank to analyze")
    if len(out) == 1:  # a rank file's distributedInfo speaks for its rank (a merged file's for one of them)
        out[0].pp_stage = pp_stage_from_info(member_value(members, "distributedInfo"), out[0].rank)
    return FileResult(out, result.stats.as_dict(), index.skipped[0], result.seconds, step_names, filtered,
                      _device_names(members), notes)


def _reading_notes(location: str, read: dict) -> list[str]:
    """What reading the input repaired, as inspect's repairs line says it: a cut trace's figures cover only its start."""
    repairs = [f"{read[key]:,} {label}" for key, label in (("invalid_utf8_repaired", "invalid UTF-8 sequences replaced"),
                                                           ("control_chars_repaired", "raw control characters escaped"))
               if read.get(key)]
    if read.get("truncated_salvaged"):
        repairs.append("the trace is truncated: its complete events are analyzed (--salvage), so every figure "
                       "covers only the part before the cut")
    return [f"{location}: {'; '.join(repairs)}"] if repairs else []


def analyze_file_in_store(path: str, options: Options, store: RunStore) -> FileResult:
    """One input on a worker that shares only a bucket: the tables come back
    as the result, each rank's launch rows (a table too long to travel with
    it) as an object of the run."""
    with scratch() as local:
        result = analyze_file(path, dataclasses.replace(options, spool_dir=local))
        for rank in result.ranks:
            if rank.launch_part:
                rank.launch_part = store.put(rank.launch_part)
    return result


def _device_names(members: list) -> tuple:
    devices = member_value(members, "deviceProperties")
    names = [device.get("name") for device in devices if isinstance(device, dict)] if isinstance(devices, list) else []
    return tuple(sorted({name for name in names if isinstance(name, str)}))


@dataclass
class _Launches:
    """A rank's launches as the kernels see them: per CPU row with an id, its time, whether the filter keeps it, its step."""

    last: hta.LastById  # id -> position in these arrays
    ts: np.ndarray
    kept: np.ndarray
    step: np.ndarray

    def of(self, corr: np.ndarray) -> np.ndarray:
        return self.last.find(corr)


def _analyze_rank(path: str, data: RankInput, frame: Frame, plain: PlainFacts, strings: list[str], cats: list[str],
                  step_names: set, first_ts: float, options: Options) -> RankResult:
    name_type = np.array([hta.kernel_type(name) for name in strings], dtype=np.int8)
    kernel_cat = np.array([cat in KERNEL_CATEGORIES for cat in cats], dtype=bool)
    comm_names = np.array([at for at, name in enumerate(strings) if name.startswith(COMM_PREFIX)], dtype=np.int32)
    launch_names = np.array([at for at, name in enumerate(strings) if name in LAUNCH_NAMES or name in MEMORY_LAUNCH_NAMES],
                            dtype=np.int32)
    if not kept_times(frame, np.array([first_ts]))[0]:
        first_ts = math.nan
    # links as HTA's index_correlation: a kernel's launch is the last CPU row (event order) with its id
    corr, ts, stream = frame.linked
    steps = np.where(stream < 0, frame.step_of(ts), -1)
    launches = _Launches(hta.LastById(corr, np.arange(len(corr))), np.append(ts, np.nan),  # (one more: an index for "none")
                         np.append(kept_times(frame, ts), False), np.append(steps, -1))
    buckets = Buckets(*frame.gpu_range, options.spool_dir)
    names, exact_names = sweeps.NameTotals(), sweeps.NameTotals()
    negative, min_ts, extents, first_seen = 0, math.inf, {}, {}
    step_spans: dict[int, tuple[float, float]] = {}
    step_numbers: set[int] = set()
    comm: dict[tuple, list[tuple[float, float]]] = {}
    launch_ids: list[np.ndarray] = []
    cpu_launches: list[tuple[np.ndarray, ...]] = []
    joins = _JoinSpool(options.spool_dir)
    gpu_lo, gpu_hi = math.inf, -math.inf
    rounded = False  # HTA's rounding moves the times of some GPU row
    others = False  # some row on a stream is no kernel, copy or set (a cuda_sync slice, a CPU event with args.stream)
    try:
        for chunk in data.chunks():
            is_kernel = frame.is_kernel(chunk)
            keep = frame.keep(chunk, is_kernel)
            # the iteration of a CPU row: the last ProfilerStep span (event order) holding its start; of a kernel: its launch's
            iteration = np.full(len(chunk.ts), -1, dtype=np.int64)
            cpu = chunk.stream < 0
            iteration[cpu] = frame.step_of(chunk.ts[cpu])
            launch = launches.of(chunk.corr)
            linked = (chunk.stream > 0) & (launch >= 0)
            iteration[linked] = launches.step[launch[linked]]
            negative += int((chunk.dur[keep] < 0).sum())
            min_ts = min(min_ts, float(chunk.ts.min()))
            merge_extents(extents, step_extents(chunk.ts[keep], chunk.ts[keep] + chunk.dur[keep], iteration[keep]))
            _add_step_spans(step_spans, step_numbers, chunk[np.isin(chunk.name, list(frame.step_ids)) & ~is_kernel & keep],
                            frame.step_ids, cats)
            _add_comm_candidates(comm, chunk, keep & (chunk.stream > 0) & (iteration > 0) & np.isin(chunk.name, comm_names),
                                 iteration, strings)
            launch_ids.append(np.unique(chunk.corr[keep & np.isin(chunk.name, launch_names)]))
            rows = np.flatnonzero(keep & (chunk.stream == NO_ID) & (chunk.corr != NO_ID))
            cpu_launches.append((chunk.corr[rows], chunk.ts[rows], chunk.dur[rows]))
            gpu = np.flatnonzero(keep & (chunk.stream != NO_ID))
            if not len(gpu):
                continue
            rows = chunk[gpu]
            joins.add(rows[rows.corr != NO_ID])
            names.add(rows.name, rows.dur)
            idle = kernel_cat[rows.cat] if len(cats) else np.zeros(len(gpu), dtype=bool)
            exact_names.add(rows.name[idle], rows.exact_dur[idle])
            for stream, at in zip(*np.unique(rows.stream[idle], return_index=True)):
                first_seen.setdefault(int(stream), int(rows.pos[idle][at]))
            mine = launch[gpu]
            found = mine >= 0
            at = np.where(found, mine, 0)
            launch_ts = np.where(found, np.where(launches.kept[at], launches.ts[at], np.nan),
                                 np.where(is_kernel[gpu], first_ts, np.nan))
            records = timeline_records(rows, launch_ts, iteration[gpu], name_type[rows.name], idle)
            if idle.any():
                gpu_lo = min(gpu_lo, float(rows.exact_ts[idle].min()))
                gpu_hi = max(gpu_hi, float(records["exact_end"][idle].max()))
            rounded = rounded or not (np.array_equal(rows.ts, rows.exact_ts) and np.array_equal(rows.dur, rows.exact_dur))
            others = others or not idle.all()
            buckets.add(records)
        timeline, exact, busy, step_lines, stream_idle = sweep(buckets, gpu_lo, gpu_hi, rounded or others)
        ids = np.unique(np.concatenate(launch_ids)) if launch_ids else np.empty(0, np.int64)
        launch_part, launch_rows = _launch_stats(data.rank, joined_columns(cpu_launches, (np.int64, np.float64, np.float64)), ids,
                                                 joins, options.spool_dir)
    finally:
        buckets.close()
        joins.close()
    kernel_rows = []
    for kind in hta.BREAKDOWN_TYPES:
        for row in hta.aggregate_names(names.stats(strings, np.flatnonzero(name_type == kind))):
            kernel_rows.append({"name": row["name"], "sum (us)": row["sum"], "max (us)": row["max"],
                                "min (us)": row["min"], "stddev": row["std"], "mean (us)": row["mean"],
                                "kernel_type": hta.TYPE_NAMES[kind], "rank": data.rank})
    notes = list(frame.notes)
    if negative:
        notes.append(f"rank {data.rank}: {negative:,} events last less than a microsecond within one: HTA's rounding "
                     "(start up, end down) gives them -1 us, counted so (as HTA does) in HTA's tables (gpu_time and the "
                     "report take the trace's own times)")
    merge_extents(extents, plain.extents)
    return RankResult(
        data.rank, path, min(min_ts, plain.min_ts), step_names, frame.filtered,
        timeline.temporal(), timeline.overlaps, kernel_rows, timeline.overlap_ratio(),
        _idle_rows(data.rank, stream_idle, first_seen), launch_part, launch_rows,
        step_numbers, [(number, start, end - start) for number, (start, end) in sorted(step_spans.items())],
        _step_times(step_lines), extents, comm, notes=notes, busy=busy, exact=GpuTime.of(exact, rounded),
        kernel_totals=[(stats.name, hta.TYPE_NAMES[name_type[at]], stats.count, stats.total)
                       for at, stats in zip(np.flatnonzero(exact_names.count).tolist(), exact_names.stats(strings))])


def _add_comm_candidates(groups: dict, chunk: Chunk, rows: np.ndarray, iteration: np.ndarray, strings: list[str]) -> None:
    """Communication kernels HTA's straggler metric may pick, per (stream, step, name), file order: only
    those no later one of the group outlasts or equals (whatever the threshold, the last that passes is one)."""
    at = np.flatnonzero(rows)
    for stream, step, name, ts, dur in zip(chunk.stream[at].tolist(), iteration[at].tolist(), chunk.name[at].tolist(),
                                           chunk.ts[at].tolist(), chunk.dur[at].tolist()):
        kept = groups.setdefault((stream, step, strings[name]), [])
        while kept and kept[-1][1] <= dur:
            kept.pop()
        kept.append((ts, dur))


def _add_step_spans(spans: dict[int, tuple[float, float]], numbers: set[int], rows: Chunk, step_ids: dict,
                    cats: list[str]) -> None:
    """The kept steps' numbers, and per step its span on the CPU: the union of its
    ``user_annotation`` and ``cpu_op`` spans (not the GPU copies, which lag)."""
    for name, cat, start, dur in zip(rows.name.tolist(), rows.cat.tolist(), rows.ts.tolist(), rows.dur.tolist()):
        number = step_ids[name]
        if number is None:
            continue
        numbers.add(number)
        if cats[cat] not in STEP_CATEGORIES:
            continue
        end = start + dur
        known = spans.get(number)
        spans[number] = (start, end) if known is None else (min(known[0], start), max(known[1], end))


def _idle_rows(rank: int, stream_idle: sweeps.StreamIdle, first_seen: dict[int, int]) -> list[dict]:
    """HTA's idle time breakdown of every stream (streams in the order they first appear).  A kernel's launch
    time is its launch's; a kernel with no launch in the trace gets, as in HTA (whose index 0 stands for
    "not in the trace"), the time of the file's first row."""
    out = []
    for stream in sorted(first_seen, key=first_seen.__getitem__):
        found = stream_idle.breakdown(stream)
        total = sum(idle for _, idle in found)
        for kind, idle in found:
            ratio = idle / total if total else math.nan
            out.append({"rank": rank, "stream": stream, "idle_category": hta.IDLE_CATEGORIES[kind],
                        "idle_time": round(idle, 2), "idle_time_ratio": round(ratio, 2)})
    return out


_JOIN = np.dtype([("corr", np.int64), ("ts", np.float64), ("dur", np.float64)])


class _JoinSpool:
    """A rank's kept GPU rows with an id (id, start, duration), on disk in event order, with the count per id."""

    def __init__(self, spool_dir: str | None) -> None:
        self.handle: IO[bytes] | None = None
        self.spool_dir = spool_dir
        self.ids: list[np.ndarray] = []
        self.id_counts: list[np.ndarray] = []

    def add(self, rows: Chunk) -> None:
        if not len(rows.corr):
            return
        if self.handle is None:
            self.handle = tempfile.TemporaryFile(prefix="streamtrace-join-", dir=self.spool_dir)
        records = np.empty(len(rows.corr), dtype=_JOIN)
        records["corr"], records["ts"], records["dur"] = rows.corr, rows.ts, rows.dur
        self.handle.write(records.tobytes())
        ids, counts = np.unique(rows.corr, return_counts=True)
        self.ids.append(ids)
        self.id_counts.append(counts)

    def counts(self, wanted: np.ndarray) -> np.ndarray:
        """How many rows each wanted id has."""
        if not self.ids:
            return np.zeros(len(wanted), dtype=np.int64)
        ids, where = np.unique(np.concatenate(self.ids), return_inverse=True)
        totals = np.bincount(where, weights=np.concatenate(self.id_counts)).astype(np.int64)
        at = np.clip(np.searchsorted(ids, wanted), 0, len(ids) - 1)
        return np.where(ids[at] == wanted, totals[at], 0)

    def matching(self, wanted: np.ndarray) -> np.ndarray:
        """The rows whose id is wanted, sorted by id (event order within an id)."""
        found = []
        if self.handle is not None:
            self.handle.seek(0)
            while block := self.handle.read(_JOIN.itemsize * JOIN_ROWS):
                records = np.frombuffer(block, dtype=_JOIN)
                found.append(records[np.isin(records["corr"], wanted)])
        rows = np.concatenate(found) if found else np.empty(0, dtype=_JOIN)
        return rows[np.argsort(rows["corr"], kind="stable")]

    def close(self) -> None:
        if self.handle is not None:
            self.handle.close()


def _launch_stats(rank: int, cpu: tuple[np.ndarray, ...], ids: np.ndarray, joins: _JoinSpool,
                  spool_dir: str | None) -> tuple[str | None, int]:
    """HTA's launch statistics (every launch, memory copies included): each
    CPU row on no stream whose id a launch call has, joined with each GPU row
    with that id (their launches' order, then the GPU rows' order); written as
    CSV rows to a part file, the GPU rows read back a batch of launches at a time."""
    ids = ids[ids != NO_ID]
    mine = np.isin(cpu[0], ids)
    corr, ts, dur = (column[mine] for column in cpu)
    matches = joins.counts(corr)
    if not len(corr) or not matches.sum():
        return None, 0
    handle, part = tempfile.mkstemp(prefix="streamtrace-launches-", suffix=".csv", dir=spool_dir)
    count = 0
    try:
        with os.fdopen(handle, "w", newline="") as out:
            write = csv.writer(out)
            batch_of = np.cumsum(matches) // JOIN_ROWS
            for batch in np.unique(batch_of).tolist():
                launches = np.flatnonzero(batch_of == batch)
                gpu = joins.matching(np.unique(corr[launches]))
                begin = np.searchsorted(gpu["corr"], corr[launches], side="left")
                found = np.searchsorted(gpu["corr"], corr[launches], side="right") - begin
                launch = np.repeat(launches, found)  # per row: its launch, then its kernel
                kernel = np.arange(len(launch)) + np.repeat(begin - (np.cumsum(found) - found), found)
                delay = np.maximum(gpu["ts"][kernel] - ts[launch] - dur[launch], 0.0)
                for first in range(0, len(launch), PLAIN_BLOCK):
                    rows = slice(first, first + PLAIN_BLOCK)
                    write.writerows(zip(repeat(rank), corr[launch[rows]].tolist(), map(_number, dur[launch[rows]].tolist()),
                                        map(_number, gpu["dur"][kernel[rows]].tolist()), map(_number, delay[rows].tolist())))
                count += len(launch)
    except BaseException:
        remove_quietly(part)
        raise
    return part, count


def _number(value: float) -> float | int:
    return int(value) if float(value).is_integer() else float(value)


def by_step(steps: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """Positions of the rows of each step (steps >= 0), one sort for all steps."""
    rows = np.flatnonzero(steps >= 0)
    rows = rows[np.argsort(steps[rows], kind="stable")]
    ordered = steps[rows]
    cuts = np.flatnonzero(ordered[1:] != ordered[:-1]) + 1
    return [(int(ordered[group[0]]), rows[group]) for group in np.split(np.arange(len(rows)), cuts) if len(group)]


def _step_times(lines: dict[int, sweeps.Timeline]) -> dict:
    """Per step (the kernels its launches issued): busy, compute and communication time, idle within their span."""
    out = {}
    for step, line in lines.items():
        t = line.temporal()
        out[step] = (t.kernel_time - t.idle, t.compute, line.lengths[hta.COMMUNICATION], t.idle)
    return out
