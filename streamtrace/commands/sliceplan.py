"""``slice``'s plan between the passes: every event's verdict (kept, or the reason it goes),
steps chosen by number, window or size, whole flows, the metadata each output needs."""
from __future__ import annotations

import itertools
import math
from array import array
from dataclasses import dataclass, field
from typing import Iterable, Iterator

import numpy as np

from ..algo.links import NO_LAUNCH, IdTable, build_tables
from ..algo.steps import (
    NO_STEP,
    StepTable,
    longest_run,
)
from ..engine.passes import IndexResult
from ..errors import TraceError
from ..io.jsonscan import RawMember
from ..io.writer import TraceWriter
from ..resources import buffers_from_os, gc_paused, trim_heap
from .mergedindex import GPU, Resolved, resolve
from .sliceindex import (
    BY_CAT,
    BY_FLOW,
    BY_META,
    BY_NAME,
    BY_PID,
    BY_RANK,
    BY_STEP,
    BY_WINDOW,
    CAT,
    FLAG_SHIFT,
    FLOW,
    KEPT,
    MB,
    META,
    METADATA_EVERYWHERE,
    NAME,
    PID,
    PLAN_MMAP_THRESHOLD,
    RANK_SHIFT,
    REASONS,
    SLOT_LIMIT,
    Selection,
    SliceIndex,
    micros,
)


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



@gc_paused()
@buffers_from_os(PLAN_MMAP_THRESHOLD)  # numpy scratch and freed index arrays must not stay resident
def plan_slice(index: SliceIndex, result: IndexResult, selection: Selection, mapping: dict | None
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
        raise TraceError(f"--window: its start ({micros(low)} us) is after its end ({micros(high)} us); "
                         + _trace_facts(planner))
    taken = _choose_steps(planner, selection, result)
    verdicts = planner.plan(per_event_steps=selection.each_step)
    if verdicts[0].reasons[KEPT] == verdicts[0].metadata_kept:
        raise TraceError(f"the selection keeps none of the {result.stats.events:,} events; " + _trace_facts(planner))
    return planner, rank_table, taken, verdicts



def _trace_facts(planner: Planner) -> str:
    """What the trace holds to select from, for a refusal: time span (relative and absolute), ranks, steps."""
    index = planner.index
    parts = []
    if index.first_ts <= index.last_end:
        first, last = index.first_ts, index.last_end
        parts.append(f"spans +0:+{_duration(last - first)} (absolute {micros(first)}:{micros(last)} us)")
    ranks = planner.ranks_present()
    parts.append(f"has ranks {number_ranges(ranks)}" if ranks else "has no known rank")
    numbers = planner.steps.numbers
    parts.append(f"steps {number_ranges(numbers)}" if numbers else "no ProfilerStep#N steps")
    return "the trace " + ", ".join(parts)


def _duration(us: float) -> str:
    for unit, scale in (("s", 1e6), ("ms", 1e3)):
        if us >= scale:
            return f"{us / scale:.6g}{unit}"
    return f"{us:.6g}us"



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
            raise TraceError(f"none of the steps asked for is in the trace (steps found: {number_ranges(found)})")
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


def no_file_for(steps: list[int]) -> str:
    """--each-step's word on the steps the selection keeps nothing of."""
    which, whose = (f"step {steps[0]}", "its") if len(steps) == 1 else (f"steps {number_ranges(steps)}", "their")
    return (f"--each-step: no file for {which}: the selection keeps none of {whose} events (on other ranks or "
            "pids, outside the window, or dropped)")


def number_ranges(numbers: list[int]) -> str:
    """[1, 2, 3, 7] -> '1-3,7'."""
    parts = []
    for _, run in itertools.groupby(enumerate(numbers), lambda item: item[1] - item[0]):
        values = [value for _, value in run]
        parts.append(str(values[0]) if len(values) == 1 else f"{values[0]}-{values[-1]}")
    return ",".join(parts)
