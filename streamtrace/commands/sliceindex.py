"""``slice``'s pass 1: what the user asked to keep (:class:`Selection`) and :class:`SliceIndex`,
the merged index plus every event's spilled pid slot, flags, rank, times and steps."""
from __future__ import annotations

import math
import re
from array import array
from dataclasses import dataclass
from itertools import repeat
from operator import attrgetter, eq
from typing import Callable, Iterable

import numpy as np

from ..algo.columns import as_floats, plain_ints_below, rank_column
from ..algo.parts import extend_converted, translated
from ..algo.ranks import RANK_LIMIT
from ..algo.steps import (
    STEP_CATEGORIES,
    STEP_NAME,
    TimeBound,
    parse_int_list,
    parse_window,
)
from ..errors import TraceError
from ..io.projection import ProjectedChunk, Projection
from ..io.spool import ColumnSpill
from ..kineto import NUMBER_TYPES
from .mergedindex import LinksIndex

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


def selection_of(steps: str | set[int] | None, window: str | None, ranks: str | set[int] | None,
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



def _refuse_backward_window(low: TimeBound | None, high: TimeBound | None) -> None:
    """A window whose start is after its end, when that shows before reading (both ends counted alike)."""
    if low is not None and high is not None and low.relative == high.relative and low.us > high.us:
        sign = "+" if low.relative else ""
        raise TraceError(f"--window: its start ({sign}{micros(low.us)} us) is after its end "
                         f"({sign}{micros(high.us)} us)")



def micros(value: float) -> str:
    """A time in microseconds as written in a trace: 1694128201426602, 12.5."""
    return f"{value:.3f}".rstrip("0").rstrip(".")
