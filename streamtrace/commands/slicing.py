"""``slice``: cut a trace into pieces a viewer can open (SPEC 10).

Pass 1 (:class:`SliceIndex`) keeps the merged index (launches, GPU events,
rank evidence), the ``ProfilerStep#N`` spans and the flow keys in memory,
and spills per event its start, end, pid, ``args.rank`` and a few flags to
disk (:class:`~streamtrace.io.spool.ColumnSpill`): memory stays bounded
whatever the event count.  Between the passes every event gets a verdict
from those columns, chunk by chunk with numpy: kept, or the first reason it
is dropped.  GPU events take the step of their launch (by (rank,
correlation)), since GPU work lags the CPU; flows are kept only where a start
and an end of the same flow are both kept, and the metadata of exactly the
pids that keep an event.  Pass 2 copies the kept lines unchanged.
"""
from __future__ import annotations

import itertools
import math
import os
import re
import shutil
import tempfile
import time
from array import array
from contextlib import ExitStack
from dataclasses import dataclass, field
from itertools import repeat
from operator import attrgetter, eq
from typing import Callable, Iterable, Iterator

import numpy as np

from ..algo.columns import as_floats, plain_ints_below, rank_column
from ..algo.links import NO_LAUNCH, IdTable, build_tables
from ..algo.parts import extend_converted, translated
from ..algo.ranks import RANK_LIMIT
from ..algo.steps import (
    NO_STEP,
    STEP_CATEGORIES,
    STEP_NAME,
    StepTable,
    TimeBound,
    longest_run,
    parse_int_list,
    parse_window,
)
from ..engine.jobs import resolve_jobs
from ..engine.passes import IndexResult, emit_pass, index_pass, screen_of_copy
from ..engine.plan import EmitPlan
from ..errors import TraceError
from ..io.configfiles import load_rank_map
from ..io.destinations import Destinations
from ..io.jsonscan import RawMember
from ..io.progress import Progress
from ..io.projection import ProjectedChunk, Projection
from ..io.redact import RedactOptions, Redactor, pseudonymizes_hosts, redaction_summary
from ..io.sink import OutputTarget, SinkSpec, publish_all
from ..io.source import InputSource, SourceSpec
from ..io.spool import ColumnSpill
from ..io.writer import TraceWriter
from ..kineto import NUMBER_TYPES
from ..resources import buffers_from_os, gc_paused, peak_rss_mb, trim_heap
from .mergedindex import GPU, LinksIndex, Resolved, resolve
from .split import max_open_writers
from .toparquet import check_parquet_options, emit_rows, is_parquet, rank_lookup

CAT, NAME, PID, FLOW, META = 1, 2, 4, 8, 16
FLAG_SHIFT, RANK_SHIFT = 24, 32  # a spilled event's pid slot, flags and args.rank + 1 share one int64
SLOT_LIMIT = 1 << FLAG_SHIFT
FLOW_PHASES = frozenset({"s", "t", "f"})  # "s" starts a flow
REASONS = ("kept", "category", "name", "pid", "rank", "window", "step", "metadata_of_dropped_pid",
           "flow_half_without_partner")
KEPT, BY_CAT, BY_NAME, BY_PID, BY_RANK, BY_WINDOW, BY_STEP, BY_META, BY_FLOW = range(len(REASONS))
NAME_CACHE = 1 << 16
MB = 1_000_000
PLAN_MMAP_THRESHOLD = 4 << 20  # while planning, buffers from this size on come from the OS and go back to it
METADATA_EVERYWHERE = -2  # with --each-step: a metadata event, copied to several files
_PID, _CAT, _PH, _NAME, _TS, _DUR, _ARGS, _ID = map(attrgetter, ("pid", "cat", "ph", "name", "ts", "dur", "args", "id"))


@dataclass
class Selection:
    """What to keep; every given criterion must hold."""

    steps: set[int] | None = None
    window: tuple[TimeBound | None, TimeBound | None] | None = None
    ranks: set[int] | None = None
    pids: frozenset[str] | None = None
    drop_categories: frozenset[str] = frozenset()
    drop_name: re.Pattern | None = None
    max_mb: float | None = None
    each_step: bool = False

    @property
    def by_step(self) -> bool:
        return self.steps is not None or self.max_mb is not None or self.each_step


def _selection(steps: str | set[int] | None, window: str | None, ranks: str | set[int] | None,
               pids: str | Iterable[object] | None, drop_categories: Iterable[str], drop_name: str | re.Pattern | None,
               max_mb: float | None, each_step: bool) -> Selection:
    """Flags (text or values) as a :class:`Selection`, refused early when they cannot be read."""
    try:
        pattern = re.compile(drop_name) if isinstance(drop_name, str) else drop_name
    except re.error as exc:
        raise TraceError(f"--drop-name: {drop_name!r} is not a regular expression: {exc}") from None
    if max_mb is not None and not max_mb > 0:
        raise TraceError("--max-mb must be a positive number of megabytes")
    if max_mb is not None and each_step:
        raise TraceError("--max-mb and --each-step do not combine: --each-step writes every step")
    bounds = parse_window(window) if isinstance(window, str) else window
    if bounds is not None:
        _refuse_backward_window(*bounds)
    return Selection(
        steps=parse_int_list(steps, "--steps", "3,5-6") if isinstance(steps, str) else steps,
        window=bounds,
        ranks=parse_int_list(ranks, "--ranks") if isinstance(ranks, str) else ranks,
        pids=None if pids is None else frozenset(str(pid).strip() for pid in
                                                 (pids.split(",") if isinstance(pids, str) else pids)),
        drop_categories=frozenset(drop_categories), drop_name=pattern, max_mb=max_mb, each_step=each_step)


class SliceIndex(LinksIndex):
    """The merged index, plus step spans and flow keys in memory and per-event columns on disk.

    Chunks are read as projections (:meth:`visit_projected`) a column at a
    time, or as dicts event by event (:meth:`visit`), to the same records."""

    partial = False  # True in a pass-1 worker: the columns go to the joined index in parts, never to a spill
    projection = Projection({"ph": None, "cat": None, "name": None, "pid": None, "ts": None, "dur": None, "id": None,
                             "args": {"correlation": None, "rank": None}})

    def __init__(self, selection: Selection, spill_dir: str | None) -> None:
        self.selection = selection
        self.spill = ColumnSpill("ddq", spill_dir)  # start, end, and pid slot | flags | args.rank packed
        self.first_ts = math.inf
        self.last_end = -math.inf
        self.step_spans: list[tuple[int, int, int, float, float]] = []  # pid slot, args.rank, N, start, end
        self.flow_cat = array("H")
        self.flow_id = array("q")
        self.flow_start = bytearray()
        self.flow_cats: dict[object, int] = {}
        self.flow_other_ids: dict[object, int] = {}
        self._flows_listed = (0, 0)  # flow categories and odd flow ids already in a part
        self._flow_maps: dict[int, tuple[array, array]] = {}  # per pass-1 worker: its flow codes -> ours
        super().__init__()

    def take_part(self) -> dict:
        """The merged index's part, plus the columns, step spans and flow keys
        since the last part (see :mod:`streamtrace.engine.indexworkers`)."""
        part = super().take_part()
        part["columns"] = tuple(column[:] for column in self.spill.columns)
        part["flows"] = (self.flow_cat[:], self.flow_id[:], self.flow_start[:])
        for column in (*self.spill.columns, self.flow_cat, self.flow_id, self.flow_start):
            del column[:]  # (in place: the hot loop holds their appends)
        part["step_spans"], self.step_spans = self.step_spans, []
        part["flow_cats"] = list(self.flow_cats)[self._flows_listed[0]:]
        part["flow_other_ids"] = list(self.flow_other_ids)[self._flows_listed[1]:]
        self._flows_listed = (len(self.flow_cats), len(self.flow_other_ids))
        return part

    def absorb(self, part: dict, source: int, first_event: int) -> None:
        """Append a worker's part: pid slots and flow codes translated, the
        columns spilled at the same events as one process would."""
        super().absorb(part, source, first_event)
        slot_map = np.frombuffer(self._part_slots[source], dtype=np.int32).astype(np.int64)
        cat_map, other_map = self._flow_maps.setdefault(source, (array("i"), array("q")))
        for cat in part["flow_cats"]:
            code = self.flow_cats.get(cat)
            cat_map.append(self._new_flow_cat(cat) if code is None else code)
        for key in part["flow_other_ids"]:
            other_map.append(self._other_flow_id(key))
        cats, ids, starts = part["flows"]
        extend_converted(self.flow_cat, translated(cats, cat_map))
        ids = np.frombuffer(ids, dtype=np.int64)
        if len(other_map):
            ids = np.where(ids >= 0, ids, np.frombuffer(other_map, dtype=np.int64)[np.clip(-1 - ids, 0, None)])
        extend_converted(self.flow_id, ids)
        self.flow_start += starts
        self.step_spans += [(int(slot_map[slot]), *rest) for slot, *rest in part["step_spans"]]
        ts, end, packed = (np.frombuffer(column, dtype=column.typecode) for column in part["columns"])
        slots = packed & (SLOT_LIMIT - 1)
        self._add_columns(ts, end, packed - slots + slot_map[slots] if len(slot_map) else packed)

    def _add_columns(self, ts: np.ndarray, end: np.ndarray, packed: np.ndarray) -> None:
        """Append events' columns, spilled every ``CHUNK`` events as the event-by-event visit spills them."""
        done, columns = 0, self.spill.columns
        while done < len(ts):
            take = len(ts) - done if self.partial else min(len(ts) - done, self.spill.CHUNK - len(columns[0]))
            for column, values in zip(columns, (ts, end, packed)):
                column.frombytes(values[done:done + take].tobytes())
            done += take
            if len(columns[0]) >= self.spill.CHUNK:
                self._flush()

    def visit_projected(self, chunk: ProjectedChunk) -> bool:
        """Index a chunk as :meth:`visit` would, a column at a time: pid
        slots numbered as met, then the merged index (:class:`LinksIndex`),
        then each event's columns, the flows' keys and the step spans.
        Everything that can fail is read before anything is recorded."""
        events = chunk.events
        count = len(events)
        pids = list(map(_PID, events))
        cats = list(map(_CAT, events))
        phases = list(map(_PH, events))
        arguments = list(map(_ARGS, events))
        dropped = np.fromiter(map(self.selection.drop_categories.__contains__, cats), bool, count)
        is_metadata = np.fromiter(map(eq, phases, repeat("M")), bool, count)
        is_flow = np.fromiter(map(FLOW_PHASES.__contains__, phases), bool, count) & ~is_metadata
        flows = np.flatnonzero(is_flow).tolist()
        flow_cats = list(map(cats.__getitem__, flows))
        new_flow_cats = [cat for cat in dict.fromkeys(flow_cats) if cat not in self.flow_cats]
        may_step = np.fromiter(map(STEP_CATEGORIES.__contains__, cats), bool, count) & ~is_metadata & ~is_flow
        steps = [at for at in np.flatnonzero(may_step).tolist()
                 if events[at].name.__class__ is str and events[at].name.startswith("ProfilerStep#")]
        name_dropped = self._name_test()
        named_out = np.fromiter(map(name_dropped, map(_NAME, events)), bool, count) if name_dropped else None
        wanted = self.selection.pids
        pid_out = None if wanted is None else ~np.fromiter(map(wanted.__contains__, map(str, pids)), bool, count)
        if len(self.pids) + len(set(pids)) > SLOT_LIMIT or len(self.flow_cats) + len(new_flow_cats) > 1 << 16:
            return False  # the event-by-event reading says where the limit is passed
        slots = self._slots_of(pids)  # numbered before the merged index's, as visit numbers them
        if not super().visit_projected(chunk):
            return False
        start = as_floats(list(map(_TS, events)), math.nan)
        length = as_floats(list(map(_DUR, events)), math.nan)
        end = np.where(length >= 0, start + length, start)
        flags = np.where(dropped, CAT, 0) | np.where(is_metadata, META, 0) | np.where(is_flow, FLOW, 0)
        if named_out is not None:
            flags |= np.where(named_out, NAME, 0)
        if pid_out is not None:
            flags |= np.where(pid_out, PID, 0)
        own_rank = rank_column(arguments, -1)
        self._add_columns(start, end, slots | flags.astype(np.int64) << FLAG_SHIFT | (own_rank + 1) << RANK_SHIFT)
        for cat in new_flow_cats:
            self._new_flow_cat(cat)
        self.flow_cat.extend(map(self.flow_cats.__getitem__, flow_cats))
        self.flow_id.extend(self._flow_ids(list(map(_ID, map(events.__getitem__, flows)))))
        self.flow_start += bytes(map(eq, map(phases.__getitem__, flows), repeat("s")))
        for at in steps:
            rank = None if arguments[at] is None else arguments[at].rank
            self._step_span(events[at].name, int(slots[at]), rank, float(start[at]), events[at].dur)
        return True

    def _flow_ids(self, ids: list) -> list[int]:
        """Flow ids as the flow-id column keeps them (see :meth:`_other_flow_id`)."""
        if plain_ints_below(ids, 1 << 63):
            return ids
        return [flow_id if flow_id.__class__ is int and 0 <= flow_id < 1 << 63 else self._other_flow_id(flow_id)
                for flow_id in ids]

    def _make_visit(self) -> Callable[[dict], None]:
        index_visit = super()._make_visit()
        add_ts, add_end, add_packed = (column.append for column in self.spill.columns)
        slots, slot_of = self.pid_slots, self.slot
        spill, flush = self.spill, self._flush
        chunk = spill.CHUNK
        ts_column = spill.columns[0]
        dropped_cats = self.selection.drop_categories
        wanted_pids = self.selection.pids
        name_dropped = self._name_test()
        step_span = self._step_span
        flow_cats = self.flow_cats
        add_flow_cat, add_flow_id, add_flow_start = self.flow_cat.append, self.flow_id.append, self.flow_start.append
        new_flow_cat, other_flow_id = self._new_flow_cat, self._other_flow_id
        numbers = NUMBER_TYPES
        nan = math.nan

        def visit(event: dict) -> None:
            index_visit(event)
            pid = event.get("pid")
            slot = slots.get(pid)
            if slot is None:
                slot = slot_of(pid)
                if slot >= SLOT_LIMIT:
                    raise TraceError(f"more than {SLOT_LIMIT:,} pids: not a profiler trace")
            ts = event.get("ts")
            start = ts if ts.__class__ is float else float(ts) if ts.__class__ in numbers else nan
            dur = event.get("dur")
            args = event.get("args")
            rank = args.get("rank") if args.__class__ is dict else None
            cat = event.get("cat")
            ph = event.get("ph")
            flags = CAT if cat in dropped_cats else 0
            if ph == "M":
                flags |= META
            elif ph in FLOW_PHASES:  # inline: flows are a third of a GPU trace's events
                flags |= FLOW
                code = flow_cats.get(cat)
                add_flow_cat(new_flow_cat(cat) if code is None else code)
                flow_id = event.get("id")
                add_flow_id(flow_id if flow_id.__class__ is int and 0 <= flow_id < 1 << 63 else other_flow_id(flow_id))
                add_flow_start(ph == "s")
            elif cat in STEP_CATEGORIES:
                name = event.get("name")
                if name.__class__ is str and name.startswith("ProfilerStep#"):
                    step_span(name, slot, rank, start, dur)
            if name_dropped is not None and name_dropped(event.get("name")):
                flags |= NAME
            if wanted_pids is not None and str(pid) not in wanted_pids:
                flags |= PID
            add_ts(start)
            if dur.__class__ is float and dur >= 0:
                add_end(start + dur)
            else:
                add_end(start + float(dur) if dur.__class__ in numbers and dur >= 0 else start)
            if rank.__class__ is int and 0 <= rank < RANK_LIMIT:  # one append for three columns: appends cost
                add_packed(slot | flags << FLAG_SHIFT | (rank + 1) << RANK_SHIFT)
            else:
                add_packed(slot | flags << FLAG_SHIFT)
            if len(ts_column) >= chunk:
                flush()

        return visit

    def _flush(self) -> None:
        """Spill the chunk, keeping the earliest start (``+`` times count from it) and the latest end of a
        non-metadata event (a worker keeps its columns for its part)."""
        if self.partial:
            return
        ts = np.frombuffer(self.spill.columns[0], dtype=np.float64)
        end = np.frombuffer(self.spill.columns[1], dtype=np.float64)
        packed = np.frombuffer(self.spill.columns[2], dtype=np.int64)
        plain = ((packed >> FLAG_SHIFT) & META) == 0
        timed = ~np.isnan(ts) & plain
        if timed.any():
            self.first_ts = min(self.first_ts, float(ts[timed].min()))
            self.last_end = max(self.last_end, float(end[timed].max()))
        del ts, end, timed, plain, packed
        self.spill.flush()

    def finish(self) -> None:
        """Pass 1 is over: spill the last chunk; drop the visit closure, which holds every array's append."""
        self._flush()
        self.visit = None

    def drop_gpu_details(self) -> None:
        """Free what only linking needed (the links are made): tens of bytes per GPU event."""
        for column in (self.gpu_pid, self.gpu_id, self.gpu_rank):
            del column[:]
        self.samples.clear()

    def _name_test(self) -> Callable[[object], bool] | None:
        """``--drop-name`` as a test on names, remembered per name (names repeat)."""
        pattern = self.selection.drop_name
        if pattern is None:
            return None
        seen: dict[object, bool] = {}

        def dropped(name: object) -> bool:
            found = seen.get(name)
            if found is None:
                found = isinstance(name, str) and pattern.search(name) is not None
                if len(seen) < NAME_CACHE:
                    seen[name] = found
            return found

        return dropped

    def _new_flow_cat(self, cat: object) -> int:
        code = self.flow_cats[cat] = len(self.flow_cats)
        if code >= 1 << 16:
            raise TraceError("more than 65536 flow categories: not a profiler trace")
        return code

    def _other_flow_id(self, flow_id: object) -> int:
        """A flow id that is not a non-negative int64, as a negative key (by its text if not a scalar)."""
        key = flow_id if flow_id.__class__ in (str, int, float) else str(flow_id)
        return self.flow_other_ids.setdefault(key, -1 - len(self.flow_other_ids))

    def _step_span(self, name: str, slot: int, rank: object, start: float, dur: object) -> None:
        match = STEP_NAME.match(name)
        if match is None or math.isnan(start) or dur.__class__ not in NUMBER_TYPES or not dur >= 0:
            return
        own_rank = rank if rank.__class__ is int and rank >= 0 else -1
        self.step_spans.append((slot, own_rank, int(match.group(1)), start, start + float(dur)))


@dataclass
class Verdicts:
    """Every event's fate, and the counts the summary gives."""

    reasons: np.ndarray = field(default_factory=lambda: np.zeros(len(REASONS), dtype=np.int64))
    flows_total: int = 0
    flows_kept: int = 0
    flows_without_partner: int = 0  # flow events whose partner the input has but the selection cut
    flows_unpaired_in_input: int = 0  # flow events kept although the input itself lacks their other half
    metadata_kept: int = 0


@dataclass
class Metadata:
    """The metadata events (few: per pid and thread) and, per file, which go there."""

    positions: array = field(default_factory=lambda: array("q"))
    slots: array = field(default_factory=lambda: array("i"))
    chosen: bytearray = field(default_factory=bytearray)  # passes the criteria on who (all but time and step)
    steps: list[list[int]] = field(default_factory=list)  # with --each-step: the step ids each one goes to


class Planner:
    """Between the passes: every event's verdict from the spilled columns."""

    def __init__(self, index: SliceIndex, resolved: Resolved, selection: Selection, events: int) -> None:
        self.index, self.selection = index, selection
        self.by_step = selection.by_step  # False when --max-mb finds that the whole trace fits
        self.events = events
        pid_ranks = np.array(resolved.ranks.ranks, dtype=np.int64)
        self.pid_ranks = np.where(pid_ranks >= 0, pid_ranks, -1)
        spans: dict[int, dict[int, tuple[float, float]]] = {}
        for slot, own_rank, number, start, end in index.step_spans:
            rank = own_rank if own_rank >= 0 else int(self.pid_ranks[slot])
            known = spans.setdefault(rank, {}).get(number)
            spans[rank][number] = (start, end) if known is None else (min(known[0], start), max(known[1], end))
        self.steps = StepTable(spans)
        launch_ranks = np.array(resolved.launch_bucket, dtype=np.int64)
        self.launch_step = self.steps.place(np.where(launch_ranks >= 0, launch_ranks, -1),
                                            np.frombuffer(index.launch_ts, dtype=np.float64))
        self.launch_of_gpu = np.frombuffer(resolved.links.launch_of_gpu, dtype=np.int32)
        self.kinds = np.frombuffer(index.actions, dtype=np.uint8)  # the merged index's: GPU marks GPU events
        low, high = selection.window if selection.window is not None else (None, None)
        first = index.first_ts if index.first_ts != math.inf else 0.0
        self.window = (-math.inf if low is None else low.resolve(first), math.inf if high is None else high.resolve(first))
        self.chosen: np.ndarray | None = None  # step ids kept
        self.ac2g = index.flow_cats.get("ac2g", -1)
        self.flow_group, self.group_step = self._group_flows(build_tables(resolved.launch_bucket, index.launch_id))
        index.flow_id, index.flow_cat = array("q"), array("H")  # grouped: free them
        trim_heap()

    def _ranks(self, columns: tuple[np.ndarray, ...]) -> np.ndarray:
        """Each event's rank: its ``args.rank``, else its pid's, else -1."""
        return np.where(columns[3] >= 0, columns[3], self.pid_ranks[columns[2]])

    def _group_flows(self, tables: dict[int, IdTable]) -> tuple[np.ndarray, np.ndarray]:
        """A group number per flow event, one per flow, and each group's step:
        its start's, or, for a flow whose start the input lacks, its other
        members'.  An ``ac2g`` flow's group is its launch's (found by (rank,
        id) like a GPU event, no sorting), and its step the launch's (where its
        start sits); any other flow's group is found by sorting the keys (rank
        for ``ac2g`` only, cat, id)."""
        index = self.index
        cats = np.frombuffer(index.flow_cat, dtype=np.uint16)
        ids = np.frombuffer(index.flow_id, dtype=np.int64)
        starts = np.frombuffer(index.flow_start, dtype=np.uint8).astype(bool)
        group = np.full(len(ids), NO_LAUNCH, dtype=np.int32)
        rest_at: list[np.ndarray] = []
        rest_rank: list[np.ndarray] = []
        rest_step: list[np.ndarray] = []
        flow_at = 0
        for _, columns in self._chunks():
            flow = (columns[4] & FLOW) != 0
            count = int(np.count_nonzero(flow))
            if not count:
                continue
            span = slice(flow_at, flow_at + count)
            rank = self._ranks(columns)[flow]
            ac2g = cats[span] == self.ac2g
            found = group[span]
            for value in np.unique(rank[ac2g]).tolist():
                table = tables.get(value)
                if table is not None:
                    mine = np.flatnonzero(ac2g & (rank == value))
                    found[mine] = table.get_many(ids[span][mine])
            step = self.steps.place(rank, columns[0][flow]) if self.selection.by_step else np.full(
                count, NO_STEP, dtype=np.int32)
            rest = np.flatnonzero(found == NO_LAUNCH)
            rest_at.append(rest + flow_at)
            rest_rank.append(np.where(ac2g[rest], rank[rest], -1))
            rest_step.append(step[rest])
            flow_at += count
        groups = len(index.launch_id)
        group_step = self.launch_step.astype(np.int32)
        rest = np.concatenate(rest_at) if rest_at else np.zeros(0, dtype=np.int64)
        if len(rest):
            keys = (ids[rest], cats[rest], np.concatenate(rest_rank))
            order = np.lexsort(keys)
            changed = np.zeros(len(order), dtype=bool)
            changed[0] = True
            for key in keys:
                ordered = key[order]
                changed[1:] |= ordered[1:] != ordered[:-1]
            numbers = np.cumsum(changed) - 1
            group[rest[order]] = groups + numbers
            step, is_start = np.concatenate(rest_step), starts[rest]
            start_step, any_step = (np.full(int(numbers[-1]) + 1, NO_STEP, dtype=np.int32) for _ in range(2))
            np.maximum.at(start_step, group[rest][is_start] - groups, step[is_start])
            np.maximum.at(any_step, group[rest] - groups, step)
            has_start = np.zeros(len(start_step), dtype=bool)
            has_start[group[rest][is_start] - groups] = True
            group_step = np.concatenate((group_step, np.where(has_start, start_step, any_step)))
        return group, group_step

    def ranks_present(self) -> list[int]:
        """Every rank some event has (a reading of the spilled columns: only refusals need it)."""
        found: set[int] = set()
        for _, columns in self._chunks():
            found.update(np.unique(self._ranks(columns)).tolist())
        found.discard(-1)
        return sorted(found)

    def choose_steps(self, numbers: Iterable[int]) -> None:
        ids = {number: at for at, number in enumerate(self.steps.numbers)}
        self.chosen = np.array(sorted(ids[n] for n in numbers if n in ids), dtype=np.int32)

    def drop_steps_without_events(self, destination: np.ndarray) -> list[int]:
        """With per-event steps: leave out the chosen steps that keep no event
        (found only on ranks or pids the selection leaves out, or outside its
        window), so that no step's file is empty; their numbers."""
        kept = np.bincount(destination[destination >= 0], minlength=len(self.steps.numbers))[self.chosen] > 0
        empty = [self.steps.numbers[step] for step in self.chosen[~kept].tolist()]
        self.chosen = self.chosen[kept]
        return empty

    def _chunks(self) -> Iterator[tuple[int, tuple[np.ndarray, ...]]]:
        at = 0
        for ts, end, packed in self.index.spill.chunks():
            slot = (packed & (SLOT_LIMIT - 1)).astype(np.int32)
            flags = ((packed >> FLAG_SHIFT) & 0xFF).astype(np.uint8)
            rank = (packed >> RANK_SHIFT).astype(np.int32) - 1
            yield at, (ts, end, slot, rank, flags)
            at += len(ts)
        if at != self.events:
            raise TraceError(f"validation failed: {at} events spilled, {self.events} indexed")

    def _classify(self, at: int, columns: tuple[np.ndarray, ...], gpu_before: int
                  ) -> tuple[np.ndarray, np.ndarray, int]:
        """(reason before steps, step id) per event of a chunk, and the GPU events it holds."""
        ts, end, flags = columns[0], columns[1], columns[4]
        rank = self._ranks(columns)
        reason = np.zeros(len(ts), dtype=np.uint8)
        selection = self.selection
        checks = [(BY_CAT, (flags & CAT) != 0), (BY_NAME, (flags & NAME) != 0), (BY_PID, (flags & PID) != 0)]
        if selection.ranks is not None:
            checks.append((BY_RANK, ~np.isin(rank, list(selection.ranks))))
        if selection.window is not None:
            low, high = self.window
            checks.append((BY_WINDOW, ~((end >= low) & (ts <= high))))
        for code, failed in reversed(checks):  # the first failing check names the reason
            reason[failed] = code
        step = np.full(len(ts), NO_STEP, dtype=np.int32)
        gpu = self.kinds[at:at + len(ts)] == GPU
        gpu_count = int(np.count_nonzero(gpu))
        if self.by_step:
            step = self.steps.place(rank, ts)
            if gpu_count:
                launches = self.launch_of_gpu[gpu_before:gpu_before + gpu_count]
                linked = launches != NO_LAUNCH
                where = np.flatnonzero(gpu)
                step[where[linked]] = self.launch_step[launches[linked]]
        return reason, step, gpu_count

    def _flows(self, reason: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Flow verdicts from each flow event's own reason: every member of a
        flow goes with its group's step; a flow is kept where a start and an
        end both pass, or, when the input itself lacks its start or its end,
        as it is.  Returns (passes, kept, unpaired in the input) per flow event."""
        group = self.flow_group
        starts = np.frombuffer(self.index.flow_start, dtype=np.uint8).astype(bool)
        passes = reason == KEPT
        if self.by_step:
            passes &= np.isin(self.group_step, self.chosen)[group]
        whole = self._both_halves(group, starts, np.ones(len(group), dtype=bool))
        unpaired = ~whole[group]
        return passes, passes & (self._both_halves(group, starts, passes)[group] | unpaired), passes & unpaired

    def _both_halves(self, group: np.ndarray, starts: np.ndarray, members: np.ndarray) -> np.ndarray:
        """Per flow group: do ``members`` hold a start and an end of it?"""
        has_start = np.zeros(len(self.group_step), dtype=bool)
        has_end = np.zeros(len(self.group_step), dtype=bool)
        has_start[group[members & starts]] = True
        has_end[group[members & ~starts]] = True
        return has_start & has_end

    def sizes(self, line_lengths: Iterator[np.ndarray]) -> tuple[dict[int, int], int, int]:
        """Bytes each step would write (every line passing the other criteria,
        flows in their start's step, none yet dropped for a missing partner:
        an upper bound), the bytes of such lines in no step, and the bytes of
        all metadata lines."""
        lengths = _Lengths(line_lengths)
        step_sizes = np.zeros(len(self.steps.numbers) + 1, dtype=np.int64)  # the last: no step
        metadata_bytes = flow_at = 0
        for _, _, reason, step, flow, meta in self._classified():
            chunk_lengths = lengths.take(len(reason)) + 2  # ",\n" after each line
            metadata_bytes += int(chunk_lengths[meta].sum())
            count = int(np.count_nonzero(flow))
            step[flow] = self.group_step[self.flow_group[flow_at:flow_at + count]]
            flow_at += count
            counted = (reason == KEPT) & ~meta
            bins = np.where(step >= 0, step, len(step_sizes) - 1)[counted]
            step_sizes += np.bincount(bins, weights=chunk_lengths[counted],
                                      minlength=len(step_sizes)).astype(np.int64)
        return ({number: int(step_sizes[at]) for at, number in enumerate(self.steps.numbers)}, int(step_sizes[-1]),
                metadata_bytes)

    def plan(self, *, per_event_steps: bool = False) -> tuple[Verdicts, np.ndarray, Metadata]:
        """Every event's destination: 0 kept / 1 dropped (uint8), or with
        ``per_event_steps`` its step id, -1 dropped, METADATA_EVERYWHERE (int32).
        """
        verdicts = Verdicts()
        if per_event_steps:
            destination = np.zeros(self.events, dtype=np.int32)
        else:  # pass 2's actions, written through a view
            destination = np.frombuffer(bytearray(self.events), dtype=np.uint8)
        flow_reason = np.empty(len(self.flow_group), dtype=np.uint8)
        metadata = Metadata()
        flow_at = 0
        for at, columns, reason, step, flow, meta in self._classified():
            count = int(np.count_nonzero(flow))
            flow_reason[flow_at:flow_at + count] = reason[flow]
            flow_at += count
            metadata.chosen.extend(((reason[meta] == KEPT) | (reason[meta] == BY_WINDOW)).astype(np.uint8).tobytes())
            if self.by_step:
                reason[(reason == KEPT) & ~np.isin(step, self.chosen)] = BY_STEP
            plain = ~(flow | meta)
            verdicts.reasons += np.bincount(reason[plain], minlength=len(REASONS))[:len(REASONS)]
            metadata.positions.extend((np.flatnonzero(meta) + at).tolist())
            metadata.slots.extend(columns[2][meta].tolist())
            destination[at:at + len(reason)] = _destination(reason, step, per_event_steps)
        passes, kept, unpaired = self._flows(flow_reason)
        flow_reason[(flow_reason == KEPT) & ~passes] = BY_STEP
        flow_reason[passes & ~kept] = BY_FLOW
        verdicts.reasons += np.bincount(flow_reason, minlength=len(REASONS))[:len(REASONS)]
        verdicts.flows_total, verdicts.flows_kept = len(kept), int(np.count_nonzero(kept))
        verdicts.flows_without_partner = int(np.count_nonzero(passes & ~kept))
        verdicts.flows_unpaired_in_input = int(np.count_nonzero(unpaired))
        self._settle(destination, flow_reason, metadata, verdicts, per_event_steps)
        return verdicts, destination, metadata

    def _classified(self) -> Iterator[tuple]:
        """(first event, columns, reason, step, is flow, is metadata) per chunk."""
        gpu_before = 0
        for at, columns in self._chunks():
            reason, step, gpu_count = self._classify(at, columns, gpu_before)
            gpu_before += gpu_count
            flags = columns[4]
            yield at, columns, reason, step, (flags & FLOW) != 0, (flags & META) != 0

    def _settle(self, destination: np.ndarray, flow_reason: np.ndarray, metadata: "Metadata", verdicts: Verdicts,
                per_event_steps: bool) -> None:
        """Write the flows' verdicts, then the metadata's: a pid's metadata goes
        wherever some event of that pid went; the metadata of a pid that has
        no other event in the input (Kineto names every GPU of the machine)
        everywhere, unless the criteria on who (pids, ranks, categories,
        names) drop it."""
        flow_at = 0
        places: set[int] = set()  # pid slot * steps + step (or pid slot alone)
        busy: set[int] = set()  # pid slots with events other than metadata
        width = len(self.steps.numbers)
        everywhere = self.chosen.tolist() if per_event_steps else []
        for at, columns in self._chunks():
            flags, slot = columns[4], columns[2]
            flow = np.flatnonzero(flags & FLOW)
            if len(flow):
                destination[at + flow] = _destination(flow_reason[flow_at:flow_at + len(flow)],
                                                      self.group_step[self.flow_group[flow_at:flow_at + len(flow)]],
                                                      per_event_steps)
                flow_at += len(flow)
            chunk = destination[at:at + len(flags)]
            plain = (flags & META) == 0
            busy.update(np.unique(slot[plain]).tolist())
            if per_event_steps:
                going = plain & (chunk >= 0)
                places.update(np.unique(slot[going].astype(np.int64) * width + chunk[going]).tolist())
            else:
                places.update(np.unique(slot[plain & (chunk == 0)]).tolist())
        dropped = 0
        steps_of_pid: dict[int, list[int]] = {}
        if per_event_steps:
            for place in sorted(places):
                steps_of_pid.setdefault(place // width, []).append(place % width)
        for position, slot, chosen in zip(metadata.positions, metadata.slots, metadata.chosen):
            placeholder = slot not in busy
            if per_event_steps:
                steps = (everywhere if chosen else []) if placeholder else steps_of_pid.get(slot, [])
                metadata.steps.append(steps)
                destination[position] = METADATA_EVERYWHERE  # to each of its steps' files, maybe none
                dropped += not steps
            else:
                gone = not chosen if placeholder else slot not in places
                destination[position] = gone
                dropped += gone
        verdicts.metadata_kept = len(metadata.positions) - dropped
        verdicts.reasons[KEPT] += verdicts.metadata_kept
        verdicts.reasons[BY_META] += dropped


class _Lengths:
    """The spool's line lengths, handed out in runs of any size."""

    def __init__(self, blocks: Iterator[np.ndarray]) -> None:
        self._blocks = blocks
        self._pending = np.zeros(0, dtype=np.int64)

    def take(self, count: int) -> np.ndarray:
        parts = [self._pending]
        have = len(self._pending)
        while have < count:
            block = next(self._blocks, None)
            if block is None:
                raise TraceError("validation failed: the spool holds fewer lines than events indexed")
            parts.append(block)
            have += len(block)
        joined = np.concatenate(parts)
        self._pending = joined[count:]
        return joined[:count]


def _destination(reason: np.ndarray, step: np.ndarray, per_event_steps: bool) -> np.ndarray:
    if per_event_steps:
        return np.where(reason == KEPT, step, -1)
    return (reason != KEPT).astype(np.uint8)


class SlicePlan(EmitPlan):
    """Pass 2 of a single output: kept lines copied unchanged, the others dropped."""

    _KEEP = bytes.maketrans(b"\x00\x01", b"\x01\x00")

    def __init__(self, destination: np.ndarray) -> None:
        self.actions = destination.base if isinstance(destination.base, bytearray) else bytearray(destination)

    def lines(self, block: list[bytes], first_index: int) -> list[bytes]:
        wanted = self.actions[first_index:first_index + len(block)]
        if wanted.count(0) == len(block):
            return block
        return list(itertools.compress(block, wanted.translate(self._KEEP)))


def _frame_bytes(members: tuple[list[RawMember], list[RawMember]]) -> int:
    """Bytes of an output's top-level keys and brackets, around its events."""
    out = _Counter()
    TraceWriter(out, members[0]).close(members[1])
    return out.count


class _Counter:
    def __init__(self) -> None:
        self.count = 0

    def write(self, data: bytes) -> None:
        self.count += len(data)


def _write_each_step(result: IndexResult, destination: np.ndarray, metadata: Metadata, numbers: list[int],
                     chosen: list[int], staging: str, names: dict[int, str], compress: str, level: int | None,
                     redactor: Redactor | None) -> dict[int, int]:
    """One file per chosen step id, as many open at once as ``split`` opens (a spool reading per group)."""
    counts: dict[int, int] = {}
    stats = result.stats
    group_size = max_open_writers(None)
    for first in range(0, len(chosen), group_size):
        group = chosen[first:first + group_size]
        with ExitStack() as stack:
            writers: dict[int, TraceWriter] = {}
            for step in group:
                target = OutputTarget(os.path.join(staging, names[step]), compress=compress, level=level,
                                      background=False)  # a compressor thread per file would cost MBs each
                writers[step] = TraceWriter(stack.enter_context(target.open()), stats.header, redactor)
            batches: dict[int, list[bytes]] = {step: [] for step in group}
            position = ordinal = 0
            for block in result.spool.read_blocks():
                goes = destination[position:position + len(block)].tolist()
                position += len(block)
                for line, step in zip(block, goes):
                    if step >= 0:
                        batch = batches.get(step)
                        if batch is not None:
                            batch.append(line)
                    elif step == METADATA_EVERYWHERE:
                        for target_step in metadata.steps[ordinal]:
                            batch = batches.get(target_step)
                            if batch is not None:
                                batch.append(line)
                        ordinal += 1
                for step, batch in batches.items():
                    if batch:
                        writers[step].events(batch)
                        batches[step] = []
            if position != len(destination):
                raise TraceError(f"validation failed: {position} events spooled, {len(destination)} indexed")
            for step, writer in writers.items():
                writer.close(stats.trailer)
                counts[step] = writer.events_written
    return counts


SUFFIXES = {"gzip": ".json.gz", "zstd": ".json.zst", "none": ".json"}


def slice_trace(
    src: SourceSpec,
    dst: SinkSpec | str | os.PathLike,
    *,
    steps: str | set[int] | None = None,
    window: str | None = None,
    ranks: str | set[int] | None = None,
    pids: str | Iterable[object] | None = None,
    drop_categories: Iterable[str] = (),
    drop_name: str | re.Pattern | None = None,
    max_mb: float | None = None,
    each_step: bool = False,
    rank_map: str | dict | None = None,
    overwrite: bool = False,
    compress: str | None = None,
    level: int | None = None,
    salvage: bool = False,
    spool_dir: str | None = None,
    reread_remote: bool = False,
    progress: bool | str | None = False,
    jobs: int | str | None = None,
    redact: RedactOptions | bool | None = None,
    summary_file: str | os.PathLike | None = None,
) -> dict:
    """Write the events of ``src`` that the selection keeps to ``dst`` (with
    ``each_step``: one ``step<N>.json.gz`` per step into the directory ``dst``).

    ``steps`` ("3,5-6"), ``window`` ("START:END", us/ms/s, "+" = after the
    first event), ``ranks`` ("0-3,7"), ``pids``, ``drop_categories`` and
    ``drop_name`` (a regex) all must hold; ``max_mb`` takes the longest run of
    consecutive steps that fits (without ``steps``: the whole trace when it
    fits).  A selection that keeps no event raises TraceError before anything
    is written.  Returns the summary.
    """
    started = time.perf_counter()
    selection = _selection(steps, window, ranks, pids, drop_categories, drop_name, max_mb, each_step)
    processes = resolve_jobs(jobs)
    mapping = load_rank_map(rank_map) if isinstance(rank_map, str) else rank_map
    if each_step:
        compress = compress or "gzip"
        if compress not in SUFFIXES:
            raise TraceError(f"unknown compression {compress!r}; choose from {', '.join(SUFFIXES)}")
    rows = not each_step and is_parquet(dst)  # a Parquet file of the kept events
    if rows:
        check_parquet_options(compress, level, redact)
    redactor = Redactor.from_options(redact)  # one for every file: pseudonyms agree across them
    with InputSource(src, spool_dir=spool_dir, reread_remote=reread_remote) as source:
        destinations = Destinations([source.location], overwrite=overwrite, summary=summary_file)
        if each_step:
            directory = destinations.directory(_output_directory(dst), writes="--each-step files",
                                               existing=rf"step\d+{re.escape(SUFFIXES[compress])}")
        target = None if each_step else destinations.target(dst, compress=compress, level=level, redactor=redactor,
                                                            holds="Parquet" if rows else "JSON")
        meter = Progress(source.size, enabled=progress)
        result = index_pass(source, lambda: SliceIndex(selection, spool_dir), keep_events=True, spool_dir=spool_dir,
                            salvage=salvage, progress=meter, jobs=processes, learn_hosts=pseudonymizes_hosts(redactor))
        redactor = screen_of_copy(result, redactor)
        if target is not None:
            target.redactor = None if rows else redactor
        index: SliceIndex = result.visitor  # type: ignore[assignment]
        empty_steps: list[int] = []  # --each-step: steps the selection keeps nothing of
        try:
            planner, rank_table, taken, (verdicts, destination, metadata) = _plan(index, result, selection, mapping)
            planned = time.perf_counter()
            if each_step:
                empty_steps = planner.drop_steps_without_events(destination)
                taken = [number for number in taken if number not in empty_steps]
                files = _emit_each_step(result, planner, destination, metadata, directory, compress, level,
                                        destinations, redactor)
                written = sum(files.values())
                output = {"output_dir": directory, "files": files,
                          "output_bytes": sum(os.path.getsize(os.path.join(directory, name)) for name in files)}
        except BaseException:
            result.spool.close()
            index.spill.close()
            raise
        if not each_step:
            index.spill.close()
            if rows:
                rank_of = rank_lookup(rank_table, result.stats.header + result.stats.trailer)
                written = emit_rows(result, SlicePlan(destination), target, rank_of, progress=meter, screen=redactor)
            else:
                written = emit_pass(result, SlicePlan(destination), target, progress=meter, jobs=processes)
            output = {"output": target.name, "output_compression": target.compression,
                      "output_bytes": os.path.getsize(target.path) if target.path else None}
        else:
            result.spool.close()
            index.spill.close()
    reasons = {name: int(count) for name, count in zip(REASONS, verdicts.reasons) if name != "kept" and count}
    summary = {
        **source.describe(),
        **output,
        "steps_found": {str(rank): _ranges(numbers) for rank, numbers in planner.steps.found.items()},
        "steps_selected": taken,
        "whole_trace_fits": taken is None if selection.max_mb is not None else None,
        "window_us": list(planner.window) if selection.window is not None else None,
        "events_read": result.stats.events,
        "events_written": written,
        "events_dropped": reasons,
        "flow_events": verdicts.flows_total,
        "flow_events_kept": verdicts.flows_kept,
        "flow_events_dropped_without_partner": verdicts.flows_without_partner,
        "flow_events_unpaired_in_input": verdicts.flows_unpaired_in_input,
        "rank_map": rank_table,
        "warnings": [_no_file_for(empty_steps)] if empty_steps else [],
        "read": result.stats.as_dict(),
        **redaction_summary(redactor),
        "pass1_seconds": round(result.seconds, 3),
        "plan_seconds": round(planned - started - result.seconds, 3),
        "wall_seconds": round(time.perf_counter() - started, 3),
        "peak_rss_mb": peak_rss_mb(),
    }
    return destinations.finish(summary)


@gc_paused()
@buffers_from_os(PLAN_MMAP_THRESHOLD)  # numpy scratch and freed index arrays must not stay resident
def _plan(index: SliceIndex, result: IndexResult, selection: Selection, mapping: dict | None
          ) -> tuple[Planner, list[dict], list[int] | None, tuple[Verdicts, np.ndarray, Metadata]]:
    """Between the passes: ranks and links, steps, then every event's verdict."""
    index.finish()
    resolved = resolve(index, result.stats.header + result.stats.trailer, mapping)
    resolved.require_links("slice")
    rank_table = resolved.rank_table()
    index.drop_gpu_details()
    resolved.gpu_bucket = array("i")  # linked: only the launch of each GPU event is needed
    planner = Planner(index, resolved, selection, result.stats.events)
    del resolved
    trim_heap()
    low, high = planner.window
    if low > high:
        raise TraceError(f"--window: its start ({_micros(low)} us) is after its end ({_micros(high)} us); "
                         + _trace_facts(planner))
    taken = _choose_steps(planner, selection, result)
    verdicts = planner.plan(per_event_steps=selection.each_step)
    if verdicts[0].reasons[KEPT] == verdicts[0].metadata_kept:
        raise TraceError(f"the selection keeps none of the {result.stats.events:,} events; " + _trace_facts(planner))
    return planner, rank_table, taken, verdicts


def _refuse_backward_window(low: TimeBound | None, high: TimeBound | None) -> None:
    """A window whose start is after its end, when that shows before reading (both ends counted alike)."""
    if low is not None and high is not None and low.relative == high.relative and low.us > high.us:
        sign = "+" if low.relative else ""
        raise TraceError(f"--window: its start ({sign}{_micros(low.us)} us) is after its end "
                         f"({sign}{_micros(high.us)} us)")


def _trace_facts(planner: Planner) -> str:
    """What the trace holds to select from, for a refusal: time span (relative and absolute), ranks, steps."""
    index = planner.index
    parts = []
    if index.first_ts <= index.last_end:
        first, last = index.first_ts, index.last_end
        parts.append(f"spans +0:+{_duration(last - first)} (absolute {_micros(first)}:{_micros(last)} us)")
    ranks = planner.ranks_present()
    parts.append(f"has ranks {_ranges(ranks)}" if ranks else "has no known rank")
    numbers = planner.steps.numbers
    parts.append(f"steps {_ranges(numbers)}" if numbers else "no ProfilerStep#N steps")
    return "the trace " + ", ".join(parts)


def _duration(us: float) -> str:
    for unit, scale in (("s", 1e6), ("ms", 1e3)):
        if us >= scale:
            return f"{us / scale:.6g}{unit}"
    return f"{us:.6g}us"


def _micros(value: float) -> str:
    """A time in microseconds as written in a trace: 1694128201426602, 12.5."""
    return f"{value:.3f}".rstrip("0").rstrip(".")


def _choose_steps(planner: Planner, selection: Selection, result: IndexResult) -> list[int] | None:
    """The step numbers to keep (None: not selecting by step, or ``--max-mb``
    without ``--steps`` and the whole trace fits)."""
    if not selection.by_step:
        return None
    if selection.max_mb is not None:
        limit = int(selection.max_mb * MB)
        sizes, outside_steps, metadata_bytes = planner.sizes(result.spool.line_lengths())
        fixed = metadata_bytes + _frame_bytes((result.stats.header, result.stats.trailer))
        if selection.steps is None and fixed + outside_steps + sum(sizes.values()) <= limit:
            planner.by_step = False  # nothing to cut: the whole trace stays
            return None
    found = planner.steps.numbers
    if not found:
        raise TraceError("no ProfilerStep#N spans (user_annotation or cpu_op) in the trace: cannot select by "
                         "step; use --window instead")
    if selection.steps is not None:
        candidates = sorted(selection.steps.intersection(found))
        if not candidates:
            raise TraceError(f"none of the steps asked for is in the trace (steps found: {_ranges(found)})")
    else:
        complete = planner.steps.complete()
        first = complete[0] if complete else found[0]
        candidates = [number for number in found if number >= first]
    if selection.max_mb is not None:
        taken = longest_run(candidates, sizes, fixed, limit)
        if not taken:
            raise TraceError(f"step {candidates[0]} alone needs {(fixed + sizes[candidates[0]]) / MB:.1f} MB, "
                             f"more than --max-mb {selection.max_mb:g}")
        candidates = taken
    planner.choose_steps(candidates)
    return candidates


def _no_file_for(steps: list[int]) -> str:
    """--each-step's word on the steps the selection keeps nothing of."""
    which, whose = (f"step {steps[0]}", "its") if len(steps) == 1 else (f"steps {_ranges(steps)}", "their")
    return (f"--each-step: no file for {which}: the selection keeps none of {whose} events (on other ranks or "
            "pids, outside the window, or dropped)")


def _ranges(numbers: list[int]) -> str:
    """[1, 2, 3, 7] -> '1-3,7'."""
    parts = []
    for _, run in itertools.groupby(enumerate(numbers), lambda item: item[1] - item[0]):
        values = [value for _, value in run]
        parts.append(str(values[0]) if len(values) == 1 else f"{values[0]}-{values[-1]}")
    return ",".join(parts)


FILE_NAME = re.compile(r"\.(json|gz|zst|parquet|csv)$", re.IGNORECASE)


def _output_directory(dst: object) -> str:
    """``--each-step``'s directory; a file's name (``steps.json.gz``) is refused, not made a directory."""
    if not isinstance(dst, (str, os.PathLike)) or dst == "-":
        raise TraceError("--each-step writes a directory: give its path as the output")
    path = os.fspath(dst)
    if FILE_NAME.search(path) and not os.path.isdir(path):
        raise TraceError(f"--each-step writes one file per step into a directory, and -o {path} names a file; "
                         f"give a directory, e.g. -o {FILE_NAME.sub('', path.rstrip(os.sep)).removesuffix('.json')}/")
    return path


def _emit_each_step(result: IndexResult, planner: Planner, destination: np.ndarray, metadata: Metadata,
                    directory: str, compress: str, level: int | None, destinations: Destinations,
                    redactor: Redactor | None) -> dict[str, int]:
    """Write every chosen step's file into a staging directory, then move them all into place."""
    numbers = planner.steps.numbers
    chosen = planner.chosen.tolist()
    names = {step: f"step{numbers[step]}{SUFFIXES[compress]}" for step in chosen}
    destinations.claim_all(os.path.join(directory, name) for name in names.values())  # before any is written
    created = not os.path.isdir(directory)
    os.makedirs(directory, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".streamtrace-slice-", dir=directory)
    try:
        counts = _write_each_step(result, destination, metadata, numbers, chosen, staging, names, compress, level,
                                  redactor)
        publish_all([(os.path.join(staging, names[step]), os.path.join(directory, names[step])) for step in chosen],
                    destinations.overwrite)
    except BaseException:
        if created:
            shutil.rmtree(directory, ignore_errors=True)
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return {names[step]: counts[step] for step in chosen}
