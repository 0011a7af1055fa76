"""The per-input task of ``analyze``: pass 1, then every rank it holds, one reading of its rows feeding
every analysis asked for (see :mod:`.spec`); returns small per-rank results (launch rows go to a part file)."""
from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from ...algo import analysis as hta
from ...algo.pp import pp_stage_from_info
from ...engine.forkcall import ForkedCall
from ...engine.passes import index_pass
from ...io.jsonscan import member_value
from ...io.objectstore import RunStore, scratch
from ...io.progress import Meter
from ...io.source import InputSource
from ...resources import buffers_from_os
from . import collectives
from . import ops as ops_analysis  # TraceLens's perf report (SPEC 17): from what pass 1 collects
from .buckets import Buckets, sweep, timeline_records
from .index import NO_ID, AnalyzeIndex
from .launches import discard_part
from .ranks import Frame, PlainFacts, RankInput, first_row_times, frame_of, kept_times, plain_facts, ranks_of_slots, split_by_rank
from .registry import ANALYSES
from .spec import ChunkView, RankContext, RankPart, RankResult

SCRATCH_MMAP_THRESHOLD = 4 << 20
KERNEL_CATEGORIES = frozenset({"kernel", "Kernel", "gpu_memset", "Memset", "gpu_memcpy", "Memcpy", "mtia_ccp_events"})


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
    ops: ops_analysis.InputOps | None = None  # the ops tables (--ops)


def discard(result: FileResult) -> None:
    """Remove the files an input's ranks left (their launch rows)."""
    for rank in result.ranks:
        if "launches" in rank.results:
            discard_part(rank.results["launches"])


@dataclass(frozen=True)
class Options:
    include_last_step: bool
    salvage: bool
    spool_dir: str | None
    reread_remote: bool = False
    jobs: int = 1  # pass-1 processes of one input (one input alone: all of -j; several: one task each)
    filter_steps: bool | None = None  # None: as this file's step names say; else as all inputs' say
    analyses: tuple[str, ...] = tuple(ANALYSES)  # the analyses computed per rank (those asked for, those they need)
    ops: bool = False  # also TraceLens's perf-report tables (--ops)
    collectives: bool = True  # pass 1 collects the collective kernels (not when the collective report is skipped)
    gpu_spec: dict | None = field(default=None, hash=False)  # their roofline's GPU (--gpu-spec), else the trace's


@buffers_from_os(SCRATCH_MMAP_THRESHOLD)  # the growing arrays' old copies and numpy scratch must not stay resident
def analyze_file(path: str, options: Options, progress: Meter | None = None) -> FileResult:
    """One input (a task): pass 1, then every rank it holds."""
    with InputSource(path, spool_dir=options.spool_dir, reread_remote=options.reread_remote) as source:
        owner = os.getpid()
        result = index_pass(source, lambda: AnalyzeIndex(options.spool_dir, owner, ops=options.ops,
                                                         with_collectives=options.collectives),
                            keep_events=False, salvage=options.salvage, jobs=options.jobs, progress=progress)
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
        ops_call = _ops_call(path, [rank for rank, _ in inputs], index, ranks, members, options)
        out: list[RankResult] = []
        with ops_call:
            try:
                frames = {rank: frame_of(data, strings, filtered, options.include_last_step) for rank, data in inputs}
                plain = plain_facts(index, ranks, frames)
                for rank, data in inputs:
                    out.append(_analyze_rank(location, data, frames[rank], plain.get(rank, PlainFacts()), strings,
                                             cat_strings, step_names, first.get(rank, math.nan), options))
                    out[-1].collectives = index.collectives.of_rank(
                        rank, ranks, collectives.device_count(members, member_value),
                        collectives.pg_config(members, member_value))
                ops = ops_call.result()
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
    elif any(getattr(result.results.get("launches"), "rows", 0) for result in out):
        notes.append(f"{location}: kernel_launch_stats lists the correlation ids this file of {len(out)} ranks states; "
                     "where merge or relink made them unique per rank ((rank + 1) x 10^k + id) they differ from the rank "
                     "files' (kept in args.correlation_raw), every other table is the rank files'")
    return FileResult(out, result.stats.as_dict(), index.skipped[0], result.seconds, step_names, filtered,
                      _device_names(members), notes, ops)


def _ops_call(path: str, analyzed: list[int], index: AnalyzeIndex, ranks: list[int], members: list,
              options: Options) -> ForkedCall:
    """The input's ops tables (None without --ops), made from what pass 1 collected: with more than one
    process (-j), in a forked child while this process analyzes the ranks; else here, before them (the
    columns let go before the ranks' rows are read)."""
    collector, index.ops = index.ops, None
    if collector is None:
        return ForkedCall(lambda: None, fork=False)
    pid_ranks = {facts.pid: rank for facts, rank in zip(index.pids, ranks) if rank >= 0} if len(analyzed) > 1 else {}
    return ForkedCall(partial(ops_analysis.of_input, spec=options.gpu_spec), path, analyzed, pid_ranks, collector,
                      members, fork=options.jobs > 1)


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
            launches = rank.results.get("launches")
            if launches is not None and launches.path:
                launches.path = store.put(launches.path)
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
    """One reading of a rank's rows, a chunk at a time, HTA's rules applied once per chunk, feeding every
    analysis asked for; then the time sweep the analyses read (skipped when none does)."""
    name_type = np.array([hta.kernel_type(name) for name in strings], dtype=np.int8)
    kernel_cat = np.array([cat in KERNEL_CATEGORIES for cat in cats], dtype=bool)
    context = RankContext(data.rank, strings, cats, name_type, frame, plain, options.spool_dir)
    chosen = [ANALYSES[name] for name in options.analyses]
    wants = frozenset().union(*(analysis.sweeps for analysis in chosen))
    if not kept_times(frame, np.array([first_ts]))[0]:
        first_ts = math.nan
    # links as HTA's index_correlation: a kernel's launch is the last CPU row (event order) with its id
    corr, ts, stream = frame.linked
    steps = np.where(stream < 0, frame.step_of(ts), -1)
    launches = _Launches(hta.LastById(corr, np.arange(len(corr))), np.append(ts, np.nan),  # (one more: an index for "none")
                         np.append(kept_times(frame, ts), False), np.append(steps, -1))
    buckets = Buckets(*frame.gpu_range, options.spool_dir) if wants else None
    parts: dict[str, RankPart] = {}
    negative, min_ts = 0, math.inf
    gpu_lo, gpu_hi = math.inf, -math.inf
    rounded = False  # HTA's rounding moves the times of some GPU row
    others = False  # some row on a stream is no kernel, copy or set (a cuda_sync slice, a CPU event with args.stream)
    try:
        for analysis in chosen:
            parts[analysis.name] = analysis.part(context)
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
            gpu = np.flatnonzero(keep & (chunk.stream != NO_ID))
            rows = chunk[gpu]
            idle = kernel_cat[rows.cat] if len(cats) else np.zeros(len(gpu), dtype=bool)
            view = ChunkView(chunk, is_kernel, keep, iteration, gpu, rows, idle)
            for part in parts.values():
                part.feed(view)
            if buckets is None or not len(gpu):
                continue
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
        swept = sweep(buckets, gpu_lo, gpu_hi, rounded or others, wants)
        swept.rounded = rounded
        results = {name: part.finish(swept) for name, part in parts.items()}
    finally:
        if buckets is not None:
            buckets.close()
        for part in parts.values():
            part.close()
    notes = list(frame.notes)
    if negative:
        notes.append(f"rank {data.rank}: {negative:,} events last less than a microsecond within one: HTA's rounding "
                     "(start up, end down) gives them -1 us, counted so (as HTA does) in HTA's tables (gpu_time and the "
                     "report take the trace's own times)")
    left_out = frame.cutoff is not None and not frame.inclusive
    return RankResult(data.rank, path, min(min_ts, plain.min_ts), step_names, left_out, results, notes=notes)
