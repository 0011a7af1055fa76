"""``analyze``: HTA's tables (Holistic Trace Analysis 0.5.0), streamed (SPEC 14).

One task per input file (``-j`` processes or a Dask cluster): pass 1 with
:class:`AnalyzeIndex` keeps, per event that HTA reads (events with a ``dur``
and a ``cat``), a few typed-array entries; its ranks are found as ``relink``
finds them, so a merged multi-rank file gives each rank its own tables.  Per
rank the task applies HTA's rules (its filtering of the last profiler step,
its links by correlation, its kernel types) with :mod:`streamtrace.algo.analysis`
and returns small facts; launch statistics, one row per launched kernel, go
to a CSV part on disk.  The coordinator joins what spans ranks (kernel-type
totals, stragglers, step lags) and writes the tables.
"""
from __future__ import annotations

import csv
import dataclasses
import io
import math
import os
import shutil
import struct
import tempfile
import time
from array import array
from dataclasses import dataclass, field
from decimal import Decimal
from itertools import repeat
from typing import IO, BinaryIO, Callable, Iterator, Sequence

import numpy as np

from ..algo import analysis as hta
from ..algo import sweeps, utilization
from ..algo.parts import extend_converted, shifted, translated
from ..algo.pp import pp_stage_from_info
from ..algo.rankmap import PidEvidence, pair_by_time, resolve_ranks
from ..algo.ranks import rank_from_file_name
from ..algo.steps import STEP_CATEGORIES
from ..engine.executors import TaskRunner, Work, shared_path
from ..engine.jobs import resolve_jobs
from ..engine.passes import index_pass
from ..errors import TraceError
from ..io import report as page
from ..io.destinations import Destinations
from ..io.inputs import expand_inputs, trace_names_in
from ..io.jsonscan import member_value
from ..io.objectstore import RunStore, open_object, scratch
from ..io.progress import Meter
from ..io.projection import projected_events
from ..io.remote import is_url
from ..io.sink import remove_quietly
from ..io.source import InputSource
from ..kineto import GPU_CATEGORIES, RUNTIME_CATEGORIES
from ..resources import buffers_from_os, peak_rss_mb, trim_heap
from .analyses import collectives  # TraceLens's collective report (SPEC 16): its hooks are marked "collectives"
from .analyses import ops as ops_analysis
from .mergedindex import note_process_name
from .mergerank import rank_files_in

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
SYNC_NAMES = ("Event Sync", "Context Sync")
RANK_EVIDENCE_CATEGORIES = GPU_CATEGORIES | RUNTIME_CATEGORIES  # the events relink reads args.rank on
NUMBERS = (int, float)
SCRATCH_MMAP_THRESHOLD = 4 << 20
PLAIN_BLOCK = 1 << 16  # plain rows held before they go to the temporary file
WORK_BLOCK = 1 << 16  # work rows held before they go to their temporary file (44 bytes each)
BUCKET_ROWS = 1 << 16  # GPU rows per time bucket, the unit of the time-ordered sweeps (about 50 bytes each)
JOIN_ROWS = 1 << 18  # GPU rows held at once to join them to their launches (24 bytes each)
_BLOCK_HEAD = struct.Struct("<Q")
_WORK_HEAD = struct.Struct("<QQ")
_WORK_COLUMNS = (("ts", np.float64), ("dur", np.float64), ("stream", np.int64), ("corr", np.int64), ("name", np.int32),
                 ("cat", np.int32), ("slot", np.int32))
_PLAIN_TIMES = {int, float, type(None)}
SAMPLES_PER_GPU_PID = 4096  # as relink: enough (id, ts) pairs to pair a GPU pid with its launching pid
ID_LIMIT = 1 << 62
ID_LOW, ID_HIGH = -(1 << 63), 1 << 63  # what a stream or correlation id array holds
KERNEL_CATEGORIES = frozenset({"kernel", "Kernel", "gpu_memset", "Memset", "gpu_memcpy", "Memcpy", "mtia_ccp_events"})
LAUNCH_NAMES = frozenset({"cudaLaunchKernel", "cudaLaunchKernelExC", "runFunction - job_prep_and_submit_for_execution"})
MEMORY_LAUNCH_NAMES = frozenset({"cudaMemcpyAsync", "cudaMemsetAsync"})
COMM_PREFIX = "ncclKernel"  # HTA's straggler analysis looks at these names only
JSON_LAUNCH_ROWS = 100_000  # beyond this --json leaves the launch rows to -o DIR (as dicts they would take ~50 MB)
CONSECUTIVE_KERNEL_DELAY = 30
MIN_NORMALIZED_DURATION = 0.01
NO_ID = -1


def _plain_event(event: object) -> dict:
    """The fields of an event that :func:`_first_row` reads, as a small dict (a projection or a dict)."""
    get = event.get if isinstance(event, dict) else lambda key: getattr(event, key, None)
    return {key: get(key) for key in ("ph", "ts", "dur", "cat", "pid")}


def _stream_of(value: object) -> int:
    """HTA's ``int(stream)``; what int() refuses counts as no stream (-1)."""
    if value.__class__ is int:
        return value  # type: ignore[return-value]
    try:
        return int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError, OverflowError):
        return NO_ID


def _stream_arg(original: object, stream: object) -> object:
    """The stream an event ran on: ``args.original_stream`` where compact or merge
    moved it to a lane (the lane is a drawing aid), else ``args.stream`` (None: no stream)."""
    found = stream if original is None else original
    return NO_ID if found is None else found


def _id_of(value: object) -> int:
    """A correlation id: an integer (or a whole float); anything else is no id."""
    if value.__class__ is int:
        return value if ID_LOW <= value < ID_HIGH else NO_ID  # type: ignore[return-value, operator]
    if value.__class__ is float and value.is_integer():  # type: ignore[union-attr]
        return int(value)  # type: ignore[arg-type]
    return NO_ID


class AnalyzeIndex:
    """Pass-1 visitor: per event HTA reads, a few typed-array entries.

    "Work" events (on a stream, with a correlation id, or a profiler step)
    keep start, duration, stream, id, name, category and pid slot; every
    other event only start, duration and pid slot.  Per pid, the rank
    evidence relink uses (``args.rank`` of its launches and GPU events, the
    rank its ``process_name`` states); an event's own ``args.rank`` is kept
    for the few events that have one.
    """

    def __init__(self, spool_dir: str | None = None, owner: int | None = None) -> None:
        self.pid_slots: dict[object, int] = {}
        self.pids: list[PidEvidence] = []
        self.unranked = bytearray()  # per pid slot: some launch or GPU event lacks args.rank
        self.names: dict[object, int] = {}
        self.cats: dict[object, int] = {}
        self.ts, self.dur = array("d"), array("d")
        self.stream, self.corr = array("q"), array("q")
        self.name, self.cat, self.slot = array("i"), array("i"), array("i")
        self.ranked_rows, self.row_ranks = array("q"), array("i")
        self.plain_ts, self.plain_dur, self.plain_slot = array("d"), array("d"), array("i")
        self.fractional = [False]  # some ts is not an integer (or missing): HTA rounds every event's times
        self.skipped = [0]
        self.first_event: list = [None]  # HTA joins kernels without a launch to the row of index 0: the first event
        self.row_seen = bytearray()  # per pid slot: a row of it was read
        self.first_rows: list[tuple[int, float, float]] = []  # (slot, ts, dur) of each pid's first row, in file order
        self._listed = (0, 0)  # names and categories already in a part
        self._first_sent = False
        self._part_maps: dict[int, tuple[array, array, array]] = {}  # per pass-1 worker: its ids -> ours
        self._spilled: IO[bytes] | None = None  # plain rows, in blocks, in an unnamed temporary file
        self._work: IO[bytes] | None = None  # work rows, in blocks, in another
        self.spilled_rows = [0]  # work rows in that file (row positions count from the first work row)
        self._owner = os.getpid() if owner is None else owner  # the process that spills (pass-1 workers send theirs in parts)
        self.spool_dir = spool_dir
        self.collectives = collectives.KernelCollector()  # collectives
        self.visit = self._make_visit()

    splits_by_ranges = True  # pass-1 workers may index ranges of events: take_part / absorb / visit_chunk
    partial = False  # True where it indexes parts (in a worker, or beside the joined index): its rows go in parts, unspilled
    _PART_ARRAYS = ("ts", "dur", "stream", "corr", "row_ranks", "plain_ts", "plain_dur")  # copied as they are
    _PART_IDS = (("name", 0), ("cat", 1), ("slot", 2), ("plain_slot", 2))  # translated: names, categories, pid slots

    def take_part(self) -> dict:
        """What was indexed since the last part (see :mod:`streamtrace.engine.indexworkers`);
        names, categories and pids keep their numbers, the new ones are listed."""
        part: dict = {name: getattr(self, name)[:] for name in (*self._PART_ARRAYS, "name", "cat", "slot",
                                                                  "plain_slot", "ranked_rows")}
        for name in part:
            del getattr(self, name)[:]
        part["names"] = list(self.names)[self._listed[0]:]
        part["cats"] = list(self.cats)[self._listed[1]:]
        self._listed = (len(self.names), len(self.cats))
        part["pids"] = self.pids[:]
        self.pids[:] = [PidEvidence(facts.pid) for facts in self.pids]  # in place: the hot loop holds the list
        part["unranked"] = bytes(self.unranked)
        self.unranked[:] = bytes(len(self.unranked))
        part["fractional"], self.fractional[0] = self.fractional[0], False
        part["skipped"], self.skipped[0] = self.skipped[0], 0
        first = self.first_event[0]
        part["first_event"] = None if first is None or self._first_sent else _plain_event(first)
        part["first_rows"], self.first_rows[:] = self.first_rows[:], []
        self._first_sent = first is not None
        part["collectives"] = self.collectives.take_part()  # collectives
        return part

    def absorb(self, part: dict, source: int, first_event: int) -> None:
        """Append a worker's part (parts come in event order)."""
        maps = self._part_maps.setdefault(source, (array("i"), array("i"), array("i")))
        for name in part["names"]:
            maps[0].append(self.names.setdefault(name, len(self.names)))
        for cat in part["cats"]:
            maps[1].append(self.cats.setdefault(cat, len(self.cats)))
        for local, facts in enumerate(part["pids"]):
            if local == len(maps[2]):
                maps[2].append(self.slot_of(facts.pid))
            slot = maps[2][local]
            self.pids[slot].arg_ranks |= facts.arg_ranks
            self.pids[slot].name_ranks |= facts.name_ranks
            if part["unranked"][local]:
                self.unranked[slot] = 1
        self.collectives.absorb(part["collectives"], source, maps[2])  # collectives
        extend_converted(self.ranked_rows, shifted(part["ranked_rows"], self.spilled_rows[0] + len(self.ts)))
        for name in self._PART_ARRAYS:
            getattr(self, name).extend(part[name])
        for name, kind in self._PART_IDS:
            extend_converted(getattr(self, name), translated(part[name], maps[kind]))
        if len(self.plain_ts) >= PLAIN_BLOCK:
            self.spill()
        if len(self.ts) >= WORK_BLOCK:
            self.spill_work()
        self.fractional[0] = self.fractional[0] or part["fractional"]
        self.skipped[0] += part["skipped"]
        if self.first_event[0] is None and part["first_event"] is not None:
            self.first_event[0] = part["first_event"]
        for local, ts, dur in part["first_rows"]:
            self._first_row_of(maps[2][local], ts, dur)

    def visit_chunk(self, text: bytes) -> int | None:
        """Index a chunk's events as :meth:`visit` would, from a projection
        decoded with msgspec and a pass over each field; None (refused) when
        the projection cannot read the chunk or a field has an unusual type."""
        events = projected_events(text)
        if events is None:
            return None
        ts = [event.ts for event in events]
        dur = [event.dur for event in events]
        ts_types, dur_types = set(map(type, ts)), set(map(type, dur))
        if not ts_types <= _PLAIN_TIMES or not dur_types <= _PLAIN_TIMES:
            return None  # (missing or fractional times are fine; strings, bools and the like go the dict way)
        if self.first_event[0] is None and events:
            self.first_event[0] = _plain_event(events[0])
        if ts_types != {int}:
            self.fractional[0] = True
        timed = np.flatnonzero(~np.isnan(np.array(dur, dtype=np.float64)) & ~np.isnan(np.array(ts, dtype=np.float64)))
        if len(timed) != len(events):
            phases = [event.ph for event in events]
            if "M" in phases:
                untimed = set(range(len(events))) - set(timed.tolist())
                for at in sorted(untimed):
                    if phases[at] == "M":
                        event = events[at]
                        args = event.args
                        self.metadata({"name": event.name, "pid": event.pid,
                                       "args": None if args is None else {"name": args.name, "rank": args.rank}})
        timed_events = [events[at] for at in timed.tolist()]
        cats = [event.cat for event in timed_events]
        kernels = self.collectives.kernels(timed_events, cats)  # collectives
        if set(map(type, cats)) - {str}:
            self.skipped[0] += sum(1 for cat in cats if cat is not None and cat.__class__ is not str)
            timed_events = [event for event, cat in zip(timed_events, cats) if cat.__class__ is str]
        if "Trace" in cats:
            timed_events = [event for event in timed_events if event.cat != "Trace"]
        self._rows(timed_events)
        self.collectives.add_projected(kernels, self.slot_of)  # collectives
        return len(events)

    def _rows(self, events: list) -> None:
        """The rows of a chunk (events HTA reads), in order: work rows and plain rows."""
        pid_slots, slot_of = self.pid_slots, self.slot_of
        slots = [pid_slots.get(event.pid) for event in events]
        if None in slots:
            slots = [slot_of(event.pid) for event in events]
        for slot in dict.fromkeys(slots):
            if not self.row_seen[slot]:
                event = events[slots.index(slot)]
                self._first_row_of(slot, float(event.ts), float(event.dur))
        streams = [NO_ID if event.args is None else _stream_arg(event.args.original_stream, event.args.stream)
                   for event in events]
        corrs = [NO_ID if event.args is None or event.args.correlation is None else event.args.correlation
                 for event in events]
        if set(map(type, streams)) - {int}:
            streams = [value if value.__class__ is int else _stream_of(value) for value in streams]
        if set(map(type, corrs)) - {int}:
            corrs = [value if value.__class__ is int else _id_of(value) for value in corrs]
        if events and not (ID_LOW <= min(streams) and max(streams) < ID_HIGH and ID_LOW <= min(corrs) and max(corrs) < ID_HIGH):
            streams = [value if ID_LOW <= value < ID_HIGH else NO_ID for value in streams]
            corrs = [value if ID_LOW <= value < ID_HIGH else NO_ID for value in corrs]
        work = [at for at, (stream, corr, event) in enumerate(zip(streams, corrs, events))
                if stream != NO_ID or corr != NO_ID or (event.name.__class__ is str and "ProfilerStep" in event.name)]
        chosen = set(work)
        plain = [at for at in range(len(events)) if at not in chosen] if len(work) != len(events) else []
        self.plain_ts.extend([float(events[at].ts) for at in plain])
        self.plain_dur.extend([float(events[at].dur) for at in plain])
        self.plain_slot.extend([slots[at] for at in plain])
        if len(self.plain_ts) >= PLAIN_BLOCK:
            self.spill()
        names, cats, first_row = self.names, self.cats, self.spilled_rows[0] + len(self.ts)
        for row, at in enumerate(work):
            event = events[at]
            if event.cat in RANK_EVIDENCE_CATEGORIES:
                rank = None if event.args is None else event.args.rank
                if rank.__class__ is int and rank >= 0:
                    self.pids[slots[at]].arg_ranks.add(rank)
                    self.ranked_rows.append(first_row + row)
                    self.row_ranks.append(rank)
                else:
                    self.unranked[slots[at]] = 1
        self.ts.extend([float(events[at].ts) for at in work])
        self.dur.extend([float(events[at].dur) for at in work])
        self.stream.extend([streams[at] for at in work])
        self.corr.extend([corrs[at] for at in work])
        self.name.extend([names.setdefault(events[at].name, len(names)) for at in work])
        self.cat.extend([cats.setdefault(events[at].cat, len(cats)) for at in work])
        self.slot.extend([slots[at] for at in work])
        if len(self.ts) >= WORK_BLOCK:
            self.spill_work()

    def spill(self) -> None:
        """Move the plain rows held to the temporary file (in the joined index only)."""
        if self.partial or os.getpid() != self._owner or not self.plain_ts:
            return
        if self._spilled is None:
            self._spilled = tempfile.TemporaryFile(prefix="streamtrace-rows-", dir=self.spool_dir)
        self._spilled.write(_BLOCK_HEAD.pack(len(self.plain_ts)))
        for rows in (self.plain_ts, self.plain_dur, self.plain_slot):
            self._spilled.write(rows.tobytes())
            del rows[:]

    def spill_work(self) -> None:
        """Move the work rows held (and their ranks) to their temporary file (in the joined index only)."""
        if self.partial or os.getpid() != self._owner or not self.ts:
            return
        if self._work is None:
            self._work = tempfile.TemporaryFile(prefix="streamtrace-work-", dir=self.spool_dir)
        self._work.write(_WORK_HEAD.pack(len(self.ts), len(self.ranked_rows)))
        self.spilled_rows[0] += len(self.ts)
        for name in (*(name for name, _ in _WORK_COLUMNS), "ranked_rows", "row_ranks"):
            rows = getattr(self, name)
            self._work.write(rows.tobytes())
            del rows[:]

    def work_blocks(self) -> Iterator[tuple[int, dict[str, np.ndarray]]]:
        """The work rows, a block at a time in event order: (position of the block's first row, its columns;
        ``ranked`` and ``ranks``: the rows with their own args.rank, by position)."""
        base = 0
        if self._work is not None:
            self._work.seek(0)
            while head := self._work.read(_WORK_HEAD.size):
                count, ranked = _WORK_HEAD.unpack(head)
                block = {name: np.frombuffer(self._work.read(np.dtype(dtype).itemsize * count), dtype=dtype)
                         for name, dtype in _WORK_COLUMNS}
                block["ranked"] = np.frombuffer(self._work.read(8 * ranked), dtype=np.int64)
                block["ranks"] = np.frombuffer(self._work.read(4 * ranked), dtype=np.int32)
                yield base, block
                base += count
        if self.ts:
            block = {name: np.frombuffer(getattr(self, name), dtype=dtype) for name, dtype in _WORK_COLUMNS}
            block["ranked"] = np.frombuffer(self.ranked_rows, dtype=np.int64) if self.ranked_rows else np.empty(0, np.int64)
            block["ranks"] = np.frombuffer(self.row_ranks, dtype=np.int32) if self.row_ranks else np.empty(0, np.int32)
            yield base, block

    @property
    def work_rows(self) -> int:
        return self.spilled_rows[0] + len(self.ts)

    def plain_blocks(self) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """The plain rows (start, duration, pid slot), a block at a time, in event order."""
        if self._spilled is not None:
            self._spilled.seek(0)
            while head := self._spilled.read(_BLOCK_HEAD.size):
                (count,) = _BLOCK_HEAD.unpack(head)
                yield (np.frombuffer(self._spilled.read(8 * count), dtype=np.float64),
                       np.frombuffer(self._spilled.read(8 * count), dtype=np.float64),
                       np.frombuffer(self._spilled.read(4 * count), dtype=np.int32))
        if self.plain_ts:
            yield (np.frombuffer(self.plain_ts, dtype=np.float64), np.frombuffer(self.plain_dur, dtype=np.float64),
                   np.frombuffer(self.plain_slot, dtype=np.int32))

    def close(self) -> None:
        for name in ("_spilled", "_work"):
            if getattr(self, name) is not None:
                getattr(self, name).close()
                setattr(self, name, None)

    def slot_of(self, pid: object) -> int:
        found = self.pid_slots.get(pid)
        if found is None:
            if pid.__class__ not in (int, str):  # as relink: pids are ints or strings, anything else by its text
                return self.slot_of(str(pid))
            found = self.pid_slots[pid] = len(self.pids)
            self.pids.append(PidEvidence(pid))
            self.unranked.append(0)
            self.row_seen.append(0)
        return found

    def _first_row_of(self, slot: int, ts: float, dur: float) -> None:
        """Note a pid's first row (the first seen of it, since rows come in file order)."""
        if not self.row_seen[slot]:
            self.row_seen[slot] = 1
            self.first_rows.append((slot, ts, dur))

    def metadata(self, event: dict) -> None:
        """A ``process_name`` event: the rank it states."""
        note_process_name(event, self.pids, self.slot_of)

    def _make_visit(self) -> Callable[[dict], None]:
        pid_slots, slot_of, metadata, pids, unranked = self.pid_slots, self.slot_of, self.metadata, self.pids, self.unranked
        names, cats = self.names, self.cats
        fractional, skipped, first_event = self.fractional, self.skipped, self.first_event
        row_seen, first_row_of = self.row_seen, self._first_row_of
        add_ts, add_dur, add_stream, add_corr = self.ts.append, self.dur.append, self.stream.append, self.corr.append
        add_name, add_cat, add_slot = self.name.append, self.cat.append, self.slot.append
        add_ranked, add_rank, rows = self.ranked_rows.append, self.row_ranks.append, self.ts
        spilled_rows, spill_work = self.spilled_rows, self.spill_work
        plain_ts, plain_dur, plain_slot = self.plain_ts.append, self.plain_dur.append, self.plain_slot.append
        plain_rows, spill = self.plain_ts, self.spill
        evidence_cats = RANK_EVIDENCE_CATEGORIES
        collective, add_collective = self.collectives.wanted, self.collectives.add  # collectives

        def visit(event: dict) -> None:
            if first_event[0] is None:
                first_event[0] = event
            get = event.get
            ts = get("ts")
            if ts.__class__ is not int:
                fractional[0] = True
                if ts.__class__ is not float:
                    if ts.__class__ is Decimal:  # exact mode reads every fraction as a Decimal
                        ts = float(ts)
                    else:
                        if get("ph") == "M":
                            metadata(event)
                        return
            dur = get("dur")
            if dur is None:
                if get("ph") == "M":
                    metadata(event)
                return
            if dur.__class__ is Decimal:
                dur = float(dur)
            cat = get("cat")
            if cat.__class__ is not str or cat == "Trace" or dur.__class__ not in NUMBERS:
                if cat is not None and cat != "Trace":
                    skipped[0] += 1
                return
            pid = get("pid")
            slot = pid_slots.get(pid)
            if slot is None:
                slot = slot_of(pid)
            if not row_seen[slot]:
                first_row_of(slot, ts, dur)
            name = get("name")
            if cat == "kernel" and collective(name):  # collectives
                add_collective(event, ts, dur, slot)
            args = get("args")
            stream = corr = NO_ID
            if args.__class__ is dict:
                value = args.get("original_stream")
                if value is None:
                    value = args.get("stream")
                if value is not None:
                    stream = value if value.__class__ is int else _stream_of(value)
                value = args.get("correlation")
                if value is not None:
                    corr = value if value.__class__ is int else _id_of(value)
            if not (ID_LOW <= stream < ID_HIGH and ID_LOW <= corr < ID_HIGH):  # (integers beyond 64 bits: no id)
                stream, corr = (stream if ID_LOW <= stream < ID_HIGH else NO_ID), (corr if ID_LOW <= corr < ID_HIGH else NO_ID)
            if stream == NO_ID and corr == NO_ID and not (name.__class__ is str and "ProfilerStep" in name):
                plain_ts(ts)
                plain_dur(dur)
                plain_slot(slot)
                if len(plain_rows) >= PLAIN_BLOCK:
                    spill()
                return
            if cat in evidence_cats:
                rank = args.get("rank") if args.__class__ is dict else None
                if rank.__class__ is int and rank >= 0:
                    pids[slot].arg_ranks.add(rank)
                    add_ranked(spilled_rows[0] + len(rows))
                    add_rank(rank)
                else:
                    unranked[slot] = 1
            name_id = names.get(name)
            if name_id is None:
                name_id = names[name] = len(names)
            cat_id = cats.get(cat)
            if cat_id is None:
                cat_id = cats[cat] = len(cats)
            add_ts(ts)
            add_dur(dur)
            add_stream(stream)
            add_corr(corr)
            add_name(name_id)
            add_cat(cat_id)
            add_slot(slot)
            if len(rows) >= WORK_BLOCK:
                spill_work()

        return visit


@dataclass
class Chunk:
    """Some of one rank's work rows (event order), HTA's times applied; ``pos``: their positions among the
    file's work rows; ``exact_ts``, ``exact_dur``: their times as the trace states them (before HTA's rounding)."""

    pos: np.ndarray
    ts: np.ndarray
    dur: np.ndarray
    stream: np.ndarray
    corr: np.ndarray
    name: np.ndarray
    cat: np.ndarray
    exact_ts: np.ndarray
    exact_dur: np.ndarray

    def __getitem__(self, rows: np.ndarray) -> Chunk:
        return Chunk(*(getattr(self, column)[rows] for column in _CHUNK_COLUMNS))


_CHUNK_COLUMNS = ("pos", "ts", "dur", "stream", "corr", "name", "cat", "exact_ts", "exact_dur")


@dataclass
class RankInput:
    """One rank's work rows, read a block at a time from the index (they may be on disk)."""

    rank: int
    index: AnalyzeIndex
    slot_rank: np.ndarray  # pid slot -> rank (-1 at the end: no slot)

    def chunks(self) -> Iterator[Chunk]:
        for base, block in self.index.work_blocks():
            mine = np.flatnonzero(_block_ranks(block, base, self.slot_rank) == self.rank)
            if not len(mine):
                continue
            exact_ts, exact_dur = block["ts"][mine], block["dur"][mine]
            ts, dur = hta.hta_times(exact_ts, exact_dur, self.index.fractional[0])
            yield Chunk(mine + base, ts, dur, *(block[column][mine] for column in ("stream", "corr", "name", "cat")),
                        exact_ts, exact_dur)
            trim_heap()  # (a chunk's scratch is freed between the few arrays kept from it: give its pages back)


def _block_ranks(block: dict, base: int, slot_rank: np.ndarray) -> np.ndarray:
    """Each row's rank: its own args.rank, else its pid's."""
    ranks = slot_rank[block["slot"]]
    if len(block["ranked"]):
        ranks[block["ranked"] - base] = block["ranks"]
    return ranks


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
    collectives: collectives.CollectiveInput | None = None  # its collective kernels


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


def _discard(result: FileResult) -> None:
    for rank in result.ranks:
        if rank.launch_part and not is_url(rank.launch_part):  # (an object goes with the run's prefix)
            remove_quietly(rank.launch_part)


def _open_part(part: str) -> BinaryIO:
    """A rank's launch rows: a file of the run's directory, or an object of its prefix."""
    return open_object(part) if is_url(part) else open(part, "rb")


@dataclass(frozen=True)
class _Options:
    include_last_step: bool
    salvage: bool
    spool_dir: str | None
    reread_remote: bool = False
    jobs: int = 1  # pass-1 processes of one input (one input alone: all of -j; several: one task each)
    filter_steps: bool | None = None  # None: as this file's step names say; else as all inputs' say


@buffers_from_os(SCRATCH_MMAP_THRESHOLD)  # the growing arrays' old copies and numpy scratch must not stay resident
def analyze_file(path: str, options: _Options, progress: Meter | None = None) -> FileResult:
    """One input (a task): pass 1, then every rank it holds."""
    with InputSource(path, spool_dir=options.spool_dir, reread_remote=options.reread_remote) as source:
        owner = os.getpid()
        result = index_pass(source, lambda: AnalyzeIndex(options.spool_dir, owner), keep_events=False,
                            salvage=options.salvage, jobs=options.jobs, progress=progress)
        members = result.stats.header + result.stats.trailer
        index: AnalyzeIndex = result.visitor  # type: ignore[assignment]
        location = source.name
    try:
        ranks = _ranks_of_slots(location, index, members)
        strings = [name if name.__class__ is str else str(name) for name in index.names]
        cat_strings = [cat if cat.__class__ is str else str(cat) for cat in index.cats]
        step_names = {name for name in strings if "ProfilerStep" in name}
        filtered = len(step_names) > 1 if options.filter_steps is None else options.filter_steps
        first = _first_rows(index, ranks)
        inputs, unplaced = _split_by_rank(index, ranks)
        frames = {rank: _frame(data, strings, filtered, options.include_last_step) for rank, data in inputs}
        plain = _plain_facts(index, ranks, frames)
        out: list[RankResult] = []
        try:
            for rank, data in inputs:
                out.append(_analyze_rank(location, data, frames[rank], plain.get(rank, PlainFacts()), strings,
                                         cat_strings, step_names, first.get(rank, math.nan), options))
                out[-1].collectives = index.collectives.of_rank(rank, ranks, collectives.device_count(members, member_value))
        except BaseException:
            _discard(FileResult(out, {}, 0, 0.0, set(), False))
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
    elif any(result.launch_rows for result in out):
        notes.append(f"{location}: kernel_launch_stats lists the correlation ids this file of {len(out)} ranks states; "
                     "where merge or relink made them unique per rank ((rank + 1) x 10^k + id) they differ from the rank "
                     "files' (kept in args.correlation_raw), every other table is the rank files'")
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


def _analyze_file_in_store(path: str, options: _Options, store: RunStore) -> FileResult:
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


def _ranks_of_slots(path: str, index: AnalyzeIndex, members: list) -> list[int]:
    """pid slot -> rank (-1: none): relink's rules (args.rank, process_name, inference by launch
    times); a file where no pid states a rank is one rank's (distributedInfo.rank, the file name, else 0)."""
    info = member_value(members, "distributedInfo")
    file_rank = info.get("rank") if isinstance(info, dict) else None
    for facts, flag in zip(index.pids, index.unranked):
        facts.unranked = bool(flag)
    _first_work(index)
    resolution = resolve_ranks(index.pids, pairings=lambda: _pairings(index), file_rank=file_rank)
    ranks = resolution.ranks
    known = {rank for rank in ranks if rank >= 0}
    for _, block in index.work_blocks():
        known.update(np.unique(block["ranks"]).tolist())
    if len(known) > 1:
        return ranks
    if known:
        rank = known.pop()
    elif type(file_rank) is int:
        rank = file_rank
    else:
        named = rank_from_file_name(path)
        rank = named if named is not None else 0
    return [rank] * len(ranks)


def _category_ids(index: AnalyzeIndex, categories: frozenset) -> list[int]:
    return [at for cat, at in index.cats.items() if cat in categories]


def _first_work(index: AnalyzeIndex) -> None:
    """Each pid's first launch or GPU event (its position among the work rows: the same order)."""
    ids = _category_ids(index, RANK_EVIDENCE_CATEGORIES)
    first: dict[int, int] = {}
    for base, block in index.work_blocks():
        rows = np.flatnonzero(np.isin(block["cat"], ids))
        found, at = np.unique(block["slot"][rows], return_index=True)
        for slot, position in zip(found.tolist(), (rows[at] + base).tolist()):
            first.setdefault(slot, position)
    for slot, position in first.items():
        index.pids[slot].first_work = position


def _pairings(index: AnalyzeIndex) -> dict:
    """Relink's inference input: per GPU pid its first sampled (id, ts), the launches of those ids."""
    gpu_ids, launch_ids = _category_ids(index, GPU_CATEGORIES), _category_ids(index, RUNTIME_CATEGORIES)
    samples: dict[int, list[tuple[int, float]]] = {}
    for _, block in index.work_blocks():
        corr = block["corr"]
        gpu = np.flatnonzero(np.isin(block["cat"], gpu_ids) & (corr >= 0) & (corr < ID_LIMIT))
        slots = block["slot"][gpu]
        for slot in np.unique(slots).tolist():
            have = samples.setdefault(slot, [])
            mine = gpu[slots == slot][:SAMPLES_PER_GPU_PID - len(have)]
            have.extend(zip(corr[mine].tolist(), block["ts"][mine].tolist()))
    wanted = np.array(sorted({c for pairs in samples.values() for c, _ in pairs}), dtype=np.int64)
    launches_by_id: dict[int, list[tuple[int, float]]] = {}
    for _, block in index.work_blocks():
        corr = block["corr"]
        launches = np.flatnonzero(np.isin(block["cat"], launch_ids) & (corr >= 0) & (corr < ID_LIMIT) & np.isin(corr, wanted))
        for slot, c, ts in zip(block["slot"][launches].tolist(), corr[launches].tolist(), block["ts"][launches].tolist()):
            launches_by_id.setdefault(c, []).append((slot, ts))
    return pair_by_time(samples, launches_by_id)


def _first_rows(index: AnalyzeIndex, ranks: list[int]) -> dict[int, float]:
    """Per rank, the HTA time of the row HTA's index 0 stands for (a kernel without a launch is joined to
    it).  A rank's own file: its first event, when HTA keeps it as a row.  A file of several ranks: each
    rank's first row, the first event of its own file had it been one."""
    if len({rank for rank in ranks if rank >= 0}) > 1:
        firsts: dict[int, tuple[float, float]] = {}
        for slot, ts, dur in index.first_rows:
            if ranks[slot] >= 0:
                firsts.setdefault(ranks[slot], (ts, dur))
        return {rank: _hta_start(index, ts, dur) for rank, (ts, dur) in firsts.items()}
    event = index.first_event[0]
    if event.__class__ is not dict or event.get("ph") == "M":
        return {}
    ts, dur, cat = event.get("ts"), event.get("dur"), event.get("cat")
    if ts.__class__ not in (int, float) or dur.__class__ not in (int, float) or cat.__class__ is not str or cat == "Trace":
        return {}
    slot = index.pid_slots.get(event.get("pid")) if event.get("pid").__class__ in (int, str) else None
    return {} if slot is None or ranks[slot] < 0 else {ranks[slot]: _hta_start(index, ts, dur)}


def _hta_start(index: AnalyzeIndex, ts: float, dur: float) -> float:
    start, _ = hta.hta_times(np.array([ts], dtype=np.float64), np.array([dur], dtype=np.float64), index.fractional[0])
    return float(start[0])


def _split_by_rank(index: AnalyzeIndex, ranks: list[int]) -> tuple[list[tuple[int, RankInput]], int]:
    """Each rank's work rows (an event's own args.rank, else its pid's), and how many rows no rank has."""
    slot_rank = np.array(ranks + [-1], dtype=np.int64)
    found: set[int] = set()
    unplaced = 0
    for base, block in index.work_blocks():
        row_ranks = _block_ranks(block, base, slot_rank)
        found.update(np.unique(row_ranks[row_ranks >= 0]).tolist())
        unplaced += int((row_ranks < 0).sum())
    return [(rank, RankInput(rank, index, slot_rank)) for rank in sorted(found)], unplaced


@dataclass
class Frame:
    """One rank's reading as HTA frames it: kernels, step spans, what its filter keeps, its launches."""

    sync_ids: np.ndarray
    step_ids: dict  # name id -> step number (None: a ProfilerStep name without one)
    step_of: hta.StepOf  # HTA's iteration of a time: from every ProfilerStep row, in event order
    kept_ids: np.ndarray | None  # sorted ids of the kept CPU rows (None: no filter)
    cutoff: float | None  # rows kept start before it (at or before with inclusive)
    inclusive: bool
    filtered: bool  # (the run's decision: several ProfilerStep names)
    notes: list
    linked: tuple  # (id, start, stream) of the CPU rows with an id (not kernels): the launches a kernel may link to
    gpu_range: tuple[float, float, int]  # first start, last start, count of the rows on a stream

    def is_kernel(self, chunk: Chunk) -> np.ndarray:
        return ((chunk.stream >= 0) & (chunk.corr >= 0)) | np.isin(chunk.name, self.sync_ids)

    def keep(self, chunk: Chunk, is_kernel: np.ndarray) -> np.ndarray:
        """HTA's filter: CPU rows by time, kernels by the ids of the kept CPU rows."""
        if self.kept_ids is None:
            return np.ones(len(chunk.ts), dtype=bool)
        return np.where(is_kernel, np.isin(chunk.corr, self.kept_ids), _kept_times(self, chunk.ts))


def _frame(data: RankInput, strings: list[str], filtered: bool, include_last_step: bool) -> Frame:
    """HTA's filter: with several ProfilerStep names in the run, CPU rows that
    start before the latest ProfilerStep row (GPU copies included) starts
    (with the last step: ends), and the kernels whose correlation such a row has."""
    sync_ids = np.array([at for at, name in enumerate(strings) if name in SYNC_NAMES], dtype=np.int32)
    step_ids = {at: hta.step_number(name) for at, name in enumerate(strings) if name.startswith("ProfilerStep")}
    numbered = [at for at, n in step_ids.items() if n is not None]
    any_step = [at for at, name in enumerate(strings) if "ProfilerStep" in name]
    spans: list[tuple[np.ndarray, ...]] = []  # (start, end, name) of the ProfilerStep rows
    linked: list[tuple[np.ndarray, ...]] = []
    lo, hi, count = math.inf, -math.inf, 0
    cutoff = -math.inf  # the latest start (with the last step: end) of a CPU step row
    no_steps = hta.StepOf(np.empty(0), np.empty(0), np.empty(0, np.int64))
    probe = Frame(sync_ids, step_ids, no_steps, None, None, include_last_step, filtered, [], (), (0.0, 0.0, 0))
    for chunk in data.chunks():
        is_kernel = probe.is_kernel(chunk)
        rows = np.flatnonzero(np.isin(chunk.name, numbered))
        spans.append((chunk.ts[rows], chunk.ts[rows] + chunk.dur[rows], chunk.name[rows]))
        rows = np.flatnonzero(np.isin(chunk.name, any_step) & ~is_kernel)
        if len(rows):
            cutoff = max(cutoff, float((chunk.ts[rows] + chunk.dur[rows] if include_last_step else chunk.ts[rows]).max()))
        rows = np.flatnonzero(~is_kernel & (chunk.corr != NO_ID))
        linked.append((chunk.corr[rows], chunk.ts[rows], chunk.stream[rows]))
        on_stream = chunk.ts[chunk.stream != NO_ID]
        if len(on_stream):
            lo, hi, count = min(lo, float(on_stream.min())), max(hi, float(on_stream.max())), count + len(on_stream)
    starts, ends, names = _columns(spans, (np.float64, np.float64, np.int32))
    links = _columns(linked, (np.int64, np.float64, np.int64))
    frame = dataclasses.replace(probe, step_of=hta.StepOf(starts, ends, np.array([step_ids[at] for at in names.tolist()],
                                                                                  dtype=np.int64)),
                                linked=links, gpu_range=(lo, hi, count))
    if filtered:
        if cutoff > -math.inf:
            frame.cutoff = cutoff
            frame.kept_ids = np.unique(links[0][_kept_times(frame, links[1])])
        else:
            frame.notes.append(f"rank {data.rank}: no ProfilerStep while other ranks have some: all its events kept")
    return frame


def _columns(parts: list[tuple[np.ndarray, ...]], dtypes: tuple) -> tuple[np.ndarray, ...]:
    """Columns collected chunk by chunk, joined."""
    return tuple(np.concatenate([part[n] for part in parts]) if parts else np.empty(0, dtype) for n, dtype in enumerate(dtypes))


def _kept_times(frame: Frame, ts: np.ndarray) -> np.ndarray:
    """Which CPU rows of these start times the filter keeps."""
    if frame.cutoff is None:
        return np.ones(len(ts), dtype=bool)
    return ts <= frame.cutoff if frame.inclusive else ts < frame.cutoff


@dataclass
class PlainFacts:
    """What a rank's plain rows contribute: the earliest start, per step the first start and last end."""

    min_ts: float = math.inf
    extents: dict = field(default_factory=dict)
    unplaced: int = 0  # rows of a pid no rule places in a rank (or of a rank without GPU work or steps)


def _plain_facts(index: AnalyzeIndex, ranks: list[int], frames: dict[int, Frame]) -> dict[int, PlainFacts]:
    """One pass over the plain rows (spilled in blocks) for every rank."""
    slot_rank = np.array(ranks + [-1], dtype=np.int64)
    facts: dict[int, PlainFacts] = {}
    for ts, dur, slot in index.plain_blocks():
        ts, dur = hta.hta_times(ts, dur, index.fractional[0])
        row_rank = slot_rank[slot]
        for rank in np.unique(row_rank).tolist():
            frame = frames.get(rank)
            if frame is None:
                facts.setdefault(rank, PlainFacts()).unplaced += int((row_rank == rank).sum())
                continue
            mine = row_rank == rank
            start, end = ts[mine], ts[mine] + dur[mine]
            fact = facts.setdefault(rank, PlainFacts())
            fact.min_ts = min(fact.min_ts, float(start.min()))
            kept = _kept_times(frame, start)
            _merge_extents(fact.extents, _extents(start[kept], end[kept], frame.step_of(start[kept])))
    return facts


def _extents(starts: np.ndarray, ends: np.ndarray, steps: np.ndarray) -> dict:
    return {step: (float(starts[mine].min()), float(ends[mine].max())) for step, mine in _by_step(steps)}


def _merge_extents(into: dict, more: dict) -> None:
    for step, (first, last) in more.items():
        known = into.get(step)
        into[step] = (first, last) if known is None else (min(known[0], first), max(known[1], last))


_TIMELINE = np.dtype([("start", np.float64), ("end", np.float64), ("pos", np.int64), ("stream", np.int64),
                      ("launch", np.float64), ("step", np.int64), ("type", np.int8), ("idle", np.bool_),
                      ("exact_start", np.float64), ("exact_end", np.float64)])


class _Buckets:
    """A rank's kept GPU rows on disk, in time buckets of about :data:`BUCKET_ROWS`
    rows by start: read back bucket by bucket, each sorted by (start, event order),
    they are the rows in start order that the time sweeps take."""

    def __init__(self, first: float, last: float, count: int, spool_dir: str | None) -> None:
        self.first = first
        self.count = max(1, math.ceil(count / BUCKET_ROWS))
        self.width = (last - first) / self.count if last > first else 1.0
        self.files: list[IO[bytes] | None] = [None] * self.count
        self.spool_dir = spool_dir

    def add(self, records: np.ndarray) -> None:
        bucket = np.clip(((records["start"] - self.first) // self.width).astype(np.int64), 0, self.count - 1)
        order = np.argsort(bucket, kind="stable")
        records, bucket = records[order], bucket[order]
        cuts = np.flatnonzero(np.append(True, bucket[1:] != bucket[:-1]))
        for begin, end in zip(cuts.tolist(), np.append(cuts[1:], len(bucket)).tolist()):
            at = int(bucket[begin])
            if self.files[at] is None:
                self.files[at] = tempfile.TemporaryFile(prefix="streamtrace-gpu-", dir=self.spool_dir)
            self.files[at].write(records[begin:end].tobytes())  # type: ignore[union-attr]

    def sorted(self) -> Iterator[np.ndarray]:
        """Each bucket's records in (start, event order); a bucket far larger than planned (starts
        crowded in a part of the span) is cut again by time, unless all its rows start at one instant."""
        for handle in self.files:
            if handle is None:
                continue
            count = handle.seek(0, os.SEEK_END) // _TIMELINE.itemsize
            first = last = 0.0
            if count > 4 * BUCKET_ROWS:
                first, last = math.inf, -math.inf
                for block in _records(handle):
                    first, last = min(first, float(block["start"].min())), max(last, float(block["start"].max()))
            if first == last:
                handle.seek(0)
                records = np.frombuffer(handle.read(), dtype=_TIMELINE)
                yield records[np.lexsort((records["pos"], records["start"]))]
                continue
            inner = _Buckets(first, last, count, self.spool_dir)
            try:
                for block in _records(handle):
                    inner.add(block)
                yield from inner.sorted()
            finally:
                inner.close()

    def close(self) -> None:
        for handle in self.files:
            if handle is not None:
                handle.close()


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
                  step_names: set, first_ts: float, options: _Options) -> RankResult:
    name_type = np.array([hta.kernel_type(name) for name in strings], dtype=np.int8)
    kernel_cat = np.array([cat in KERNEL_CATEGORIES for cat in cats], dtype=bool)
    comm_names = np.array([at for at, name in enumerate(strings) if name.startswith(COMM_PREFIX)], dtype=np.int32)
    launch_names = np.array([at for at, name in enumerate(strings) if name in LAUNCH_NAMES or name in MEMORY_LAUNCH_NAMES],
                            dtype=np.int32)
    if not _kept_times(frame, np.array([first_ts]))[0]:
        first_ts = math.nan
    # links as HTA's index_correlation: a kernel's launch is the last CPU row (event order) with its id
    corr, ts, stream = frame.linked
    steps = np.where(stream < 0, frame.step_of(ts), -1)
    launches = _Launches(hta.LastById(corr, np.arange(len(corr))), np.append(ts, np.nan),  # (one more: an index for "none")
                         np.append(_kept_times(frame, ts), False), np.append(steps, -1))
    buckets = _Buckets(*frame.gpu_range, options.spool_dir)
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
            _merge_extents(extents, _extents(chunk.ts[keep], chunk.ts[keep] + chunk.dur[keep], iteration[keep]))
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
            records = _timeline_records(rows, launch_ts, iteration[gpu], name_type[rows.name], idle)
            if idle.any():
                gpu_lo = min(gpu_lo, float(rows.exact_ts[idle].min()))
                gpu_hi = max(gpu_hi, float(records["exact_end"][idle].max()))
            rounded = rounded or not (np.array_equal(rows.ts, rows.exact_ts) and np.array_equal(rows.dur, rows.exact_dur))
            others = others or not idle.all()
            buckets.add(records)
        timeline, exact, busy, step_lines, stream_idle = _sweep(buckets, gpu_lo, gpu_hi, rounded or others)
        ids = np.unique(np.concatenate(launch_ids)) if launch_ids else np.empty(0, np.int64)
        launch_part, launch_rows = _launch_stats(data.rank, _columns(cpu_launches, (np.int64, np.float64, np.float64)), ids,
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
    _merge_extents(extents, plain.extents)
    return RankResult(
        data.rank, path, min(min_ts, plain.min_ts), step_names, frame.filtered,
        timeline.temporal(), timeline.overlaps, kernel_rows, timeline.overlap_ratio(),
        _idle_rows(data.rank, stream_idle, first_seen), launch_part, launch_rows,
        step_numbers, [(number, start, end - start) for number, (start, end) in sorted(step_spans.items())],
        _step_times(step_lines), extents, comm, notes=notes, busy=busy, exact=GpuTime.of(exact, rounded),
        kernel_totals=[(stats.name, hta.TYPE_NAMES[name_type[at]], stats.count, stats.total)
                       for at, stats in zip(np.flatnonzero(exact_names.count).tolist(), exact_names.stats(strings))])


def _records(handle: IO[bytes]) -> Iterator[np.ndarray]:
    """A bucket file's records, a bucket's worth at a time."""
    handle.seek(0)
    while block := handle.read(_TIMELINE.itemsize * BUCKET_ROWS):
        yield np.frombuffer(block, dtype=_TIMELINE)


def _timeline_records(rows: Chunk, launch_ts: np.ndarray, steps: np.ndarray, types: np.ndarray,
                      idle: np.ndarray) -> np.ndarray:
    """What the time sweeps read of kept GPU rows (``idle``: a kernel, copy or set, which idle time counts)."""
    records = np.empty(len(rows.ts), dtype=_TIMELINE)
    for column, values in (("start", rows.ts), ("end", rows.ts + rows.dur), ("pos", rows.pos), ("stream", rows.stream),
                           ("launch", launch_ts), ("step", steps), ("type", types), ("idle", idle),
                           ("exact_start", rows.exact_ts), ("exact_end", rows.exact_ts + rows.exact_dur)):
        records[column] = values
    return records


def _sweep(buckets: _Buckets, lo: float, hi: float, apart: bool) -> tuple[sweeps.Timeline, sweeps.Timeline,
                                                                           utilization.FineBusy | None, dict,
                                                                           sweeps.StreamIdle]:
    """The kept rows on a stream in start order through the rank's timeline, with HTA's times and rules;
    its kernels, copies and sets through another with the trace's own times (``apart``: HTA's rounding
    or rows of other kinds make them differ; else one timeline is both), with its busy time in fine bins
    over ``lo``-``hi``; each step's timeline (as the latter: step_times is not HTA's) and each stream's
    idle time (HTA's).
    A bucket sorted by the trace's own starts is sorted by HTA's too (rounding a start up keeps the
    order), so both timelines take the buckets in turn."""
    bins = None
    if lo <= hi:
        width, first, edges = utilization.fine_edges(lo, hi)
        bins = sweeps.BusyBins(edges)
    exact = sweeps.Timeline(bins)
    timeline = sweeps.Timeline() if apart else exact
    step_lines: dict[int, sweeps.Timeline] = {}
    stream_idle = sweeps.StreamIdle(CONSECUTIVE_KERNEL_DELAY)
    for records in buckets.sorted():
        start, end, types = records["start"], records["end"], records["type"]
        timeline.feed(start, end, types)
        idle = records["idle"]
        stream_idle.feed(records["stream"][idle], start[idle], end[idle], records["launch"][idle])
        own = records
        if apart:
            own = records[np.argsort(records["exact_start"], kind="stable")]
            own = own[own["idle"]]
            exact.feed(own["exact_start"], own["exact_end"], own["type"])
        for number, mine in _by_step(own["step"]):
            step_lines.setdefault(number, sweeps.Timeline()).feed(own["exact_start"][mine], own["exact_end"][mine],
                                                                   own["type"][mine])
        if len(own):
            for line in step_lines.values():
                line.settle(float(own["exact_start"][-1]))
        trim_heap()
    timeline.finish()
    if apart:
        exact.finish()
    for line in step_lines.values():
        line.finish()
    busy = None if bins is None else utilization.FineBusy(width, first, bins.busy, lo, hi)
    return timeline, exact, busy, step_lines, stream_idle


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


def _by_step(steps: np.ndarray) -> list[tuple[int, np.ndarray]]:
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


def analyze(srcs: str | os.PathLike | Sequence[str | os.PathLike], out_dir: str | None = None, *,
            jobs: int | str | None = None, dask: str | None = None, include_last_step: bool = False,
            ranks: set[int] | None = None, salvage: bool = False, spool_dir: str | None = None,
            overwrite: bool = False, num_candidates: int = 2, progress: bool | str | None = False,
            reread_remote: bool = False, utilization_bins: int = UTILIZATION_BINS, html: str | os.PathLike | None = None,
            command: str | None = None, summary_file: str | os.PathLike | None = None, ops: bool = False,
            gpu_spec: str | None = None, all2allv_heatmap: bool = False) -> dict:
    """HTA's tables for every rank of the inputs; returns the summary, whose
    ``tables`` maps each table name to its rows (HTA's column names).

    ``srcs``: what ``merge`` accepts (files, globs, directories, archives,
    URLs), or one merged multi-rank file.  ``out_dir``: one CSV per table.
    ``html``: also write the report page there (needs ``streamtrace[report]``),
    its header naming ``command`` as what made it.  Inputs with collective kernels also give
    TraceLens's collective tables (:mod:`.analyses.collectives`; ``all2allv_heatmap``: its heat map too).
    ``ops``: also TraceLens's perf-report tables per input, under ``out_dir/ops/`` (see :mod:`.analyses.ops`),
    with the roofline of ``gpu_spec`` (TraceLens's arch JSON form) if given.
    """
    started = time.perf_counter()
    if num_candidates < 1:
        raise TraceError(f"--candidates (num_candidates) must be at least 1, not {num_candidates}")
    specs = [srcs] if isinstance(srcs, (str, os.PathLike)) else list(srcs)
    files = _inputs(specs)
    destinations = Destinations(files, overwrite=overwrite, summary=summary_file)
    targets = _claim_outputs(destinations, out_dir, html)
    if gpu_spec is not None and not ops:
        raise TraceError("--gpu-spec gives the roofline of the ops tables: add --ops")
    ops_spec = ops_analysis.prepare(destinations, out_dir, gpu_spec) if ops else None  # --ops, 1 of 3
    collective_targets = collectives.claim(destinations, out_dir)
    processes = resolve_jobs(jobs)
    alone = len(files) == 1 and dask is None  # one input: its pass 1 takes every process
    if files == ["-"] and not alone:
        raise TraceError("analyze --dask reads files or URLs the workers can reach, not stdin ('-')")
    with TaskRunner(1 if alone else processes, dask=dask, spool_dir=spool_dir, progress=progress, objects=True) as runner:
        if runner.distributed:
            files = [shared_path(path) for path in files]
        options = _Options(include_last_step, salvage, runner.work_dir, reread_remote, processes if alone else 1)
        per_file = _run(runner, files, options)
        results = [rank for result in per_file for rank in result.ranks]
        ops_files, ops_notes = ({}, []) if not ops else ops_analysis.run(  # --ops, 2 of 3
            files, [[rank.rank for rank in result.ranks] for result in per_file], salvage=salvage, spec=ops_spec)
        try:  # (the launch parts are in the run's directory: done with before it goes)
            if ranks is not None:
                results = [result for result in results if result.rank in ranks]
            _refuse_repeated_ranks(results)
            parts = [result.launch_part for result in results if result.launch_part]
            tables = _tables(results, num_candidates, utilization_bins)
            collective = collectives.collective_report([result.collectives for result in sorted(results, key=lambda r: r.rank)
                                                        if result.collectives is not None], all2allv_heatmap)
            collectives.add_causes(collective, tables)
            tables.update(collectives.as_records(collective))
            launch_rows = sum(result.launch_rows for result in results)
            notes = [note for result in per_file for note in result.notes]
            notes += [note for result in results for note in result.notes] + collective.notes + ops_notes
            summary = {
                "command": "analyze",
                "read": _read_totals([result.read for result in per_file]),
                "inputs": len(files),
                "ranks": sorted(result.rank for result in results),
                "devices": sorted({name for result in per_file for name in result.devices}),
                "rank_info": [{"rank": r.rank, "source": r.source, "pp_stage": r.pp_stage}
                              for r in sorted(results, key=lambda r: r.rank)],
                "output": list(targets.values()) + ([os.fspath(html)] if html is not None else []),
                "tables": tables,
                "kernel_launch_rows": launch_rows,
                "events_skipped": sum(result.skipped_events for result in per_file),
                "notes": notes,
                "pass1_seconds": round(sum(result.pass1_seconds for result in per_file), 3),
            }
            tables["kernel_launch_stats"] = None  # (read below from the parts, if few enough for --json)
            with destinations:  # the tables and the page appear together, or none of them
                _write_tables(destinations, tables, parts, targets)
                summary["output"][len(targets):len(targets)] = collectives.write(destinations, collective, collective_targets)
                summary["output"] += ops_analysis.write(destinations, out_dir, ops_files)  # --ops, 3 of 3
                if html is not None:
                    destinations.write(html, page.render(summary, files, command), role="HTML report")
            tables["kernel_launch_stats"] = _read_parts(parts) if launch_rows <= JSON_LAUNCH_ROWS else None
        finally:
            for result in per_file:
                _discard(result)
    summary["wall_seconds"] = round(time.perf_counter() - started, 3)
    summary["peak_rss_mb"] = peak_rss_mb()
    return destinations.finish(summary)


def _read_totals(reads: list[dict]) -> dict:
    """The inputs' readings together: counts summed, flags or-ed, names of the first."""
    total: dict = {}
    for read in reads:
        for key, value in read.items():
            if key not in total:
                total[key] = value
            elif isinstance(value, bool):
                total[key] = total[key] or value
            elif isinstance(value, int):
                total[key] += value
    return total


def _inputs(specs: list) -> list[str]:
    if not specs:
        raise TraceError("analyze needs at least one input")
    if [os.fspath(spec) for spec in specs] == ["-"]:
        return ["-"]  # read in this process (no worker could read this stdin)
    return expand_inputs(specs, _files_in)


def _files_in(directory: str) -> list[str]:
    """A directory's rank files, as merge takes them; its one trace when it holds one, ranked or not (HTA
    reads it as rank 0)."""
    traces = trace_names_in(directory)
    return [os.path.join(directory, traces[0])] if len(traces) == 1 else rank_files_in(directory)


def _run(runner: TaskRunner, files: list[str], options: _Options) -> list[FileResult]:
    """Every input's ranks; files whose own step names disagree with all
    inputs' (HTA cuts by the names of every rank) run again."""
    per_file = _run_tasks(runner, files, options, "inputs done")
    wanted = len(set().union(*(result.step_names for result in per_file))) > 1
    again = [n for n, result in enumerate(per_file) if result.filtered != wanted]
    if again:
        forced = dataclasses.replace(options, filter_steps=wanted)
        for n in again:
            _discard(per_file[n])
        redone = _run_tasks(runner, [files[n] for n in again], forced, "inputs redone")
        for n, result in zip(again, redone):
            per_file[n] = result
    return per_file


def _run_tasks(runner: TaskRunner, files: list[str], options: _Options, label: str) -> list[FileResult]:
    if runner.store is None:
        return list(runner.ordered(analyze_file, [(path, options) for path in files], label=label,
                                   work=Work.reading(files)))
    return list(runner.ordered(_analyze_file_in_store, [(path, options, runner.store) for path in files], label=label))


def _refuse_repeated_ranks(results: list[RankResult]) -> None:
    seen: dict[int, str] = {}
    for result in results:
        if result.rank in seen:
            raise TraceError(f"rank {result.rank} is in {seen[result.rank]} and in {result.source}: "
                             "give each rank once (or --ranks)")
        seen[result.rank] = result.source


def _pctg(part: float, whole: float, digits: int = 2) -> float:
    return float(np.round(100 * part / whole, digits)) if whole else math.nan


def _tables(results: list[RankResult], num_candidates: int, bins: int = UTILIZATION_BINS) -> dict[str, list[dict] | None]:
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


def _claim_outputs(destinations: Destinations, out_dir: str | os.PathLike | None,
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


def _write_tables(destinations: Destinations, tables: dict, parts: list[str], targets: dict[str, str]) -> None:
    """One CSV per table (launch statistics copied from the ranks' parts), each through the run's write rules
    (the destinations make the tables' directory, and take it away again if the run fails)."""
    for name, path in targets.items():
        with destinations.open(path, role="table") as raw:
            out = io.TextIOWrapper(raw, encoding="utf-8", newline="")
            csv.writer(out).writerow(COLUMNS[name])
            if name == "kernel_launch_stats":
                out.flush()
                for part in parts:
                    with _open_part(part) as rows:
                        shutil.copyfileobj(rows, raw)
            else:
                csv.writer(out).writerows([_csv_value(row[column]) for column in COLUMNS[name]] for row in tables[name])
            out.flush()
            out.detach()  # the stream is the destination's to close


def _read_parts(parts: list[str]) -> list[dict]:
    rows = []
    columns = COLUMNS["kernel_launch_stats"]
    for part in parts:
        with _open_part(part) as raw, io.TextIOWrapper(raw, encoding="utf-8", newline="") as text:
            for values in csv.reader(text):
                rows.append(dict(zip(columns, (int(values[0]), int(values[1]), *(_parsed(v) for v in values[2:])))))
    return rows


def _parsed(text: str) -> float | int:
    number = float(text)
    return int(number) if number.is_integer() and "." not in text and "e" not in text else number


__all__ = ["AnalyzeIndex", "COLUMNS", "TABLES", "analyze"]
