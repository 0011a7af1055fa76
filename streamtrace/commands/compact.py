"""``compact``: CUDA-graph stream compaction, streaming (SPEC 4).

Pass 1 (:class:`CompactIndex`) records GPU slices, GPU annotations, ac2g
endpoints and old-stream thread metadata in typed arrays.  Between the
passes :func:`plan_compaction` packs slices into lanes, maps annotations and
flow endpoints onto lanes, coalesces, builds per-kernel annotation spans and
rank-local PP arrows.  Pass 2 (:class:`CompactPlan`) patches the spooled event
lines and appends the new events.
"""
from __future__ import annotations

import collections
import itertools
import operator
import re
import time
from array import array
from bisect import bisect_left, bisect_right
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable, Iterator

import orjson

from ..algo.lanes import (
    IN_MEMORY_SORT_LIMIT,
    Runs,
    coalesce,
    coalesce_in_start_order,
    first_overlap,
    label_runs,
    merge_runs,
    nearest_in_run,
    pack_lanes,
    partition,
    sorted_runs,
)
from ..algo.pp import parse_pp_name
from ..algo.pparrows import COMPUTE_OPS, Arrow, ArrowMaker, Span, arrow_events, find_blocks, local_arrows
from ..algo.ranks import pp_group_ranks
from ..algo.rules import Rules
from ..engine.passes import EmitPlan, IndexResult, emit_pass, index_pass, patched_lines
from ..errors import TraceError
from ..io.configfiles import load_rules
from ..io.jsonscan import RawMember, member_value
from ..io.progress import Progress
from ..io.reader import dumps_event, event_loader
from ..io.sink import OutputTarget, SinkSpec, default_output
from ..io.source import InputSource, SourceSpec
from ..io.textfields import Convert, field_pattern, positions, swap_all, swap_in_lines
from ..io.writer import JoinedLines
from ..kineto import NUMBER_TYPES
from ..resources import gc_paused, peak_rss_mb

SLICE_CATEGORIES = frozenset({"kernel", "Kernel", "gpu_memcpy", "gpu_memset"})
GRAPH_LAUNCH_NAMES = frozenset({"cudaGraphLaunch", "hipGraphLaunch"})
THREAD_METADATA = frozenset({"thread_name", "thread_sort_index"})
KEEP, SLICE, ANNOTATION, FLOW, METADATA = range(5)
RUNTIME = 5  # an event kind the index counts but pass 2 keeps
TID_GAP = 1000
TID_LIMIT = 2**31


class CompactIndex:
    """Pass-1 visitor: a byte per event saying what pass 2 does with it, and
    compact arrays for the events that move."""

    def __init__(self, rules: Rules) -> None:
        self.rules = rules
        self.actions = bytearray()
        self.stream_ids: dict[tuple, int] = {}
        self.stream_keys: list[tuple] = []
        self.group_cache: dict[tuple, int] = {}
        self.label_ids: dict[str, int] = {}
        self.label_names: list[str] = []
        self.slice_stream = array("i")
        self.slice_start = array("d")
        self.slice_end = array("d")
        self.slice_group = array("B")
        self.slice_label = array("i")
        self.note_stream = array("i")
        self.note_start = array("d")
        self.note_end = array("d")
        self.note_identity = array("q")
        self.note_name = array("i")
        self.flow_stream = array("i")
        self.flow_ts = array("d")
        self.meta_stream = array("i")
        self.slice_stream_arg = bytearray()  # per slice: 1 when args.stream is an integer
        self.int_tids: set[int] = set()
        self.odd_tid_at = array("q")  # events whose tid is not an integer (or is missing)
        self.graph_launches = 0
        self.gpu_annotations = 0
        self.visit = self._make_visit()

    def _make_visit(self) -> Callable[[dict], None]:
        """The per-event hot loop, written as one closure over local names:
        at millions of events, attribute lookups and method calls per event
        cost more than the indexing itself."""
        actions = self.actions
        record = actions.append
        tids = self.int_tids
        note_tid = tids.add
        kinds = dict.fromkeys(SLICE_CATEGORIES, SLICE)
        kinds.update(gpu_user_annotation=ANNOTATION, ac2g=FLOW, cuda_runtime=RUNTIME, cuda_driver=RUNTIME)
        stream_ids, new_stream = self.stream_ids, self._new_stream
        group_cache, classify = self.group_cache, self._classify
        label_ids, new_label = self.label_ids, self._new_label
        slice_stream, slice_start, slice_end = self.slice_stream.append, self.slice_start.append, self.slice_end.append
        slice_group, slice_label = self.slice_group.append, self.slice_label.append
        slice_stream_arg, odd_tid = self.slice_stream_arg.append, self.odd_tid_at.append
        flow_stream, flow_ts = self.flow_stream.append, self.flow_ts.append
        annotation, metadata, span = self._annotation, self._metadata, self._span

        def visit(event: dict) -> None:
            get = event.get
            tid = get("tid")
            if tid.__class__ is not int:
                odd_tid(len(actions))
            elif tid not in tids:
                note_tid(tid)
            kind = kinds.get(get("cat"))
            if kind is None:
                record(metadata(event) if get("ph") == "M" else KEEP)
            elif kind == FLOW:
                ts = get("ts")
                if ts.__class__ in NUMBER_TYPES:
                    key = (get("pid"), tid)
                    stream = stream_ids.get(key)
                    flow_stream(new_stream(key) if stream is None else stream)
                    flow_ts(float(ts))
                    record(FLOW)
                else:
                    record(KEEP)
            elif kind == SLICE and get("ph") == "X":
                if get("pid") is None:
                    raise TraceError("GPU slice has no pid (its device)", event_index=len(actions))
                ts, dur = get("ts"), get("dur", 0)
                if ts.__class__ is float and dur.__class__ is float and dur >= 0:
                    end = ts + dur
                else:
                    ts, end = span(ts, dur, "GPU slice")
                key = (get("pid"), tid)
                stream = stream_ids.get(key)
                slice_stream(new_stream(key) if stream is None else stream)
                slice_start(ts)
                slice_end(end)
                name = get("name")
                by_name = group_cache.get(kind_key := get("cat"))
                group = by_name.get(name) if by_name is not None else None
                slice_group(classify(kind_key, name) if group is None else group)
                args = get("args")
                if args.__class__ is dict:
                    label = args.get("name")
                    slice_stream_arg(args.get("stream").__class__ is int)
                else:
                    label = None
                    slice_stream_arg(0)
                if label.__class__ is str and label:
                    found = label_ids.get(label)
                    slice_label(new_label(label) if found is None else found)
                else:
                    slice_label(-1)
                record(SLICE)
            elif kind == ANNOTATION:
                record(annotation(event))
            else:
                if kind == RUNTIME and get("name") in GRAPH_LAUNCH_NAMES:
                    self.graph_launches += 1
                record(KEEP)

        return visit

    def __getstate__(self) -> dict:
        """Everything but the hot-loop closure (which cannot be pickled)."""
        state = dict(self.__dict__)
        del state["visit"]
        return state

    def _metadata(self, event: dict) -> int:
        if event.get("name") not in THREAD_METADATA:
            return KEEP
        self.meta_stream.append(self._stream(event))
        return METADATA

    def _stream(self, event: dict) -> int:
        key = (event.get("pid"), event.get("tid"))
        found = self.stream_ids.get(key)
        return self._new_stream(key) if found is None else found

    def _new_stream(self, key: tuple) -> int:
        found = self.stream_ids[key] = len(self.stream_keys)
        self.stream_keys.append(key)
        return found

    def _classify(self, category: str, name: object) -> int:
        group = self.group_cache.setdefault(category, {})[name] = self.rules.classify(category, name)
        return group

    def _label(self, text: str) -> int:
        found = self.label_ids.get(text)
        return self._new_label(text) if found is None else found

    def _new_label(self, text: str) -> int:
        found = self.label_ids[text] = len(self.label_names)
        self.label_names.append(text)
        return found

    def _span(self, ts: object, dur: object, what: str) -> tuple[float, float]:
        """Checked (start, end) of a slice whose times are not plain floats."""
        if ts.__class__ not in NUMBER_TYPES or dur.__class__ not in NUMBER_TYPES:
            raise TraceError(f"{what} needs numeric ts and dur", event_index=len(self.actions))
        if dur < 0:
            raise TraceError(f"{what} has negative dur {dur}", event_index=len(self.actions))
        return float(ts), float(ts) + float(dur)

    def _annotation(self, event: dict) -> int:
        self.gpu_annotations += 1
        if event.get("ph") != "X":
            return KEEP
        start, end = self._span(event.get("ts"), event.get("dur", 0), "GPU annotation")
        name = event.get("name")
        self.note_stream.append(self._stream(event))
        self.note_start.append(start)
        self.note_end.append(end)
        self.note_identity.append(_identity_hash(event))
        self.note_name.append(self._label(name) if name.__class__ is str else -1)
        return ANNOTATION


KINETO_ANNOTATION_KEYS = frozenset({"ph", "cat", "name", "pid", "tid", "ts", "dur", "args"})


def _identity_hash(event: dict) -> int:
    """A hash of everything but ts, dur and tid: what makes two annotations
    identical for coalescing.  Kineto's own key set takes a shortcut that
    serialises only ``args``; equal events take the same path."""
    if event.keys() == KINETO_ANNOTATION_KEYS:
        args = dumps_event(event["args"], orjson.OPT_SORT_KEYS)
        return hash((event["ph"], event["cat"], event["name"], event["pid"], args))
    identity = {key: value for key, value in event.items() if key not in ("ts", "dur", "tid")}
    return hash(dumps_event(identity, orjson.OPT_SORT_KEYS))


@dataclass
class Compaction:
    """Everything pass 2 needs, the new events to append, and the summary.

    Plain data (typed arrays, small dicts), so a worker process can hand a
    rank's compaction to the process that writes the merged output.
    """

    lane_tid_of_slice: array
    note_tid: array
    note_drop: bytearray
    note_union: dict
    flow_tid: array
    meta_drop: bytearray
    summary: dict
    kernel_runs: Runs
    label_names: list[str]
    lane_info: dict
    note_track: dict
    used_tracks: set
    pp_spans: list[Span] = field(default_factory=list)
    pp_tracks: tuple[set, set] = (set(), set())
    arrows: list[Arrow] = field(default_factory=list)

    def new_events(self) -> Iterator[dict]:
        """Per-kernel annotation spans, lane and track metadata, PP arrows."""
        runs, lane_info, note_track = self.kernel_runs, self.lane_info, self.note_track
        for n in range(len(runs)):
            lane = runs.lane[n]
            start, end = runs.start[n], runs.end[n]
            yield {"name": self.label_names[runs.label[n]], "cat": "gpu_user_annotation", "ph": "X",
                   "pid": lane_info[lane][0], "tid": note_track[lane], "ts": start, "dur": end - start, "args": {}}
        yield from _lane_metadata(lane_info, note_track, self.used_tracks)
        yield from arrow_events(self.arrows)


def _allocate_tids(used: set[int], count: int) -> int:
    """First tid of ``count`` consecutive tids clear of ``used``, below 2^31."""
    base = max(used, default=0) + TID_GAP
    if base + count < TID_LIMIT:
        return base
    candidate = TID_GAP
    for tid in sorted(t for t in used if t >= TID_GAP):
        if tid - candidate >= count:
            break
        candidate = tid + 1
    if candidate + count >= TID_LIMIT:
        raise TraceError("no room for new lane tids below 2^31")
    return candidate


def _pp_rank(members: list[RawMember]) -> tuple[int, str]:
    """This rank's index in its PP process group (SPEC 2), and how it was found."""
    info = member_value(members, "distributedInfo")
    if not isinstance(info, dict) or type(info.get("rank")) is not int:
        return 0, "default (no distributedInfo.rank)"
    rank = info["rank"]
    group = pp_group_ranks(info)
    if group is not None and rank in group:
        return group.index(rank), "pp process group"
    return rank, "global rank (no PP process group)"


@gc_paused()
def plan_compaction(index: CompactIndex, members: list[RawMember], *, pp_flows: bool = True,
                    local_arrows: bool = True, strict: bool = False) -> Compaction:
    """Between the passes: lanes, tids, annotation and flow moves, new events.

    With ``pp_flows`` the PP spans are collected, and with ``local_arrows``
    too the rank-local arrows are made (``merge`` makes all arrows itself).
    """
    rules = index.rules
    starts, ends = index.slice_start, index.slice_end
    count = len(starts)
    stream_pid = [key[0] for key in index.stream_keys]
    by_stream, stream_offsets = sorted_runs(starts, ends, index.slice_stream, len(index.stream_keys))
    order = merge_runs(by_stream, stream_offsets, starts, ends)

    pid_order = sorted({stream_pid[s] for s in index.slice_stream}, key=_pid_key)
    lane_tid, lane_info = _assign_lanes(index, order, stream_pid, pid_order)
    overlap = first_overlap(order, starts, ends, lane_tid)
    if overlap is not None:
        raise TraceError(f"validation failed: lane {lane_tid[overlap]} would hold overlapping slices")

    note_base = _allocate_tids(index.int_tids | set(lane_info), len(lane_info))
    note_track = {tid: note_base + n for n, tid in enumerate(sorted(lane_info, key=lambda t: (_pid_key(lane_info[t][0]), t)))}

    runs = StreamRuns(by_stream, stream_offsets, starts, ends)
    note_tid, mapped, note_drop, note_union = _move_annotations(index, runs, lane_tid, note_track)
    flow_tid, flows_mapped, flows_unmatched = _move_flows(index, runs, lane_tid, strict)
    meta_drop = bytearray(1 if runs.is_old(stream) else 0 for stream in index.meta_stream)
    old_streams = runs.old_count
    del runs, by_stream  # the per-stream index is done with: free it before the next allocations
    kernel_runs = label_runs(order, lane_tid, index.slice_label, starts, ends)
    used_tracks = {(index.stream_keys[index.note_stream[n]][0], note_tid[n]) for n in mapped if not note_drop[n]}
    coalesced = note_drop.count(1)
    used_tracks.update((lane_info[lane][0], note_track[lane]) for lane in set(kernel_runs.lane))

    summary = {
        "measured_slices": count,
        "original_streams": old_streams,
        "compacted_lanes": len(lane_info),
        "slice_groups": _by_group_name(rules, index.slice_group),
        "lanes_by_group": dict(sorted(_lanes_by_group(rules, lane_info).items())),
        "gpu_flow_endpoints_mapped": flows_mapped,
        "gpu_flow_endpoints_unmatched": flows_unmatched,
        "gpu_annotations_mapped": len(mapped),
        "gpu_annotations_coalesced": coalesced,
        "kernel_annotations_converted": sum(1 for label in index.slice_label if label >= 0),
        "kernel_annotation_blocks": len(kernel_runs),
        "gpu_annotations_retained": index.gpu_annotations - coalesced + len(kernel_runs),
        "cuda_graph_launches": index.graph_launches,
    }
    compaction = Compaction(lane_tid, note_tid, note_drop, note_union, flow_tid, meta_drop, summary, kernel_runs,
                            index.label_names, lane_info, note_track, used_tracks)
    if pp_flows:
        compaction.pp_tracks = _pp_tracks(rules, lane_info, note_track)
        compaction.pp_spans = _pp_spans(index, mapped, note_tid, note_drop, note_union, kernel_runs, lane_info,
                                        note_track, compaction.pp_tracks)
        if local_arrows:
            compaction.arrows = _pp_local_arrows(compaction.pp_spans, compaction.pp_tracks, pid_order, members, summary)
    return compaction


def _assign_lanes(index: CompactIndex, order: array, stream_pid: list, pid_order: list) -> tuple[array, dict]:
    """Pack each (pid, group) into lanes; returns every slice's lane tid and
    ``lane_info[tid] = (pid, group, lane, label)``.  Its scratch arrays die here."""
    rules, starts, ends = index.rules, index.slice_start, index.slice_end
    group_count = len(rules.names)
    pid_group_ids = {(pid, group): n for n, (pid, group) in
                     enumerate((pid, group) for pid in pid_order for group in range(group_count))}
    pid_number = {pid: n for n, pid in enumerate(pid_order)}
    stream_base = [pid_number.get(pid, 0) * group_count for pid in stream_pid]
    # map() over typed arrays runs in C: no Python step per slice
    pid_group = array("i", map(operator.add, map(stream_base.__getitem__, index.slice_stream), index.slice_group))
    by_group, group_offsets = partition(order, pid_group, len(pid_group_ids))
    lanes = array("i", bytes(4 * len(starts)))
    lane_counts = [pack_lanes(by_group[group_offsets[k]:group_offsets[k + 1]], starts, ends, lanes)
                   for k in range(len(pid_group_ids))]
    del by_group
    lane_base, lane_info, next_tid = [], {}, _allocate_tids(index.int_tids, sum(lane_counts))
    for (pid, group), k in pid_group_ids.items():
        lane_base.append(next_tid)
        for lane in range(lane_counts[k]):
            suffix = f" {lane + 1}" if lane_counts[k] > 1 else ""
            lane_info[next_tid + lane] = (pid, group, lane, rules.labels[group] + suffix)
        next_tid += lane_counts[k]
    return array("i", map(operator.add, lanes, map(lane_base.__getitem__, pid_group))), lane_info


class StreamRuns:
    """The slices of each original stream, in start order, as bounds into one array."""

    def __init__(self, perm: array, offsets: list[int], starts: array, ends: array) -> None:
        self.perm, self.offsets, self.starts, self.ends = perm, offsets, starts, ends
        self.perm_starts = array("d", map(starts.__getitem__, perm))
        self.old_count = sum(1 for k in range(len(offsets) - 1) if offsets[k + 1] > offsets[k])

    def is_old(self, stream: int) -> bool:
        """Did this (pid, tid) hold slices before compaction?"""
        return self.offsets[stream + 1] > self.offsets[stream]

    def nearest_each(self, streams: array, times: array) -> array:
        """For each (stream, time): the stream's nearest slice, or -1 when the
        stream held no slices (one loop: a call per item would cost more)."""
        perm, perm_starts, offsets, starts, ends = self.perm, self.perm_starts, self.offsets, self.starts, self.ends
        found = array("i", [-1]) * len(streams)
        for n, stream in enumerate(streams):
            lo, hi = offsets[stream], offsets[stream + 1]
            if lo < hi:
                found[n] = nearest_in_run(perm, perm_starts, lo, hi, starts, ends, times[n])
        return found

    def starting_at_each(self, streams: array, times: array) -> array:
        """For each (stream, time): the slice starting exactly then, -2 when
        none does, -1 when the stream held no slices."""
        perm, perm_starts, offsets = self.perm, self.perm_starts, self.offsets
        found = array("i", [-1]) * len(streams)
        for n, stream in enumerate(streams):
            lo, hi = offsets[stream], offsets[stream + 1]
            if lo < hi:
                ts = times[n]
                at = bisect_right(perm_starts, ts, lo, hi)
                found[n] = perm[at - 1] if at > lo and perm_starts[at - 1] == ts else -2
        return found


def _move_annotations(index: CompactIndex, runs: StreamRuns, lane_tid: array,
                      note_track: dict) -> tuple[array, array, bytearray, dict]:
    """Annotation track of each GPU annotation on an old stream, and coalescing."""
    nearest = runs.nearest_each(index.note_stream, index.note_start)
    note_tid = array("i", [-1]) * len(nearest)
    keys = array("q", bytes(8 * len(nearest)))
    mapped = array("i")
    identities = index.note_identity
    for n, target in enumerate(nearest):
        if target >= 0:
            note_tid[n] = tid = note_track[lane_tid[target]]
            keys[n] = hash((tid, identities[n]))
            mapped.append(n)
    starts, ends = index.note_start, index.note_end
    if len(mapped) <= IN_MEMORY_SORT_LIMIT:
        clusters = coalesce(mapped, keys, starts, ends)
    else:
        by_stream, offsets = sorted_runs(starts, ends, index.note_stream, len(index.stream_keys))
        in_start_order = (n for n in merge_runs(by_stream, offsets, starts, ends) if note_tid[n] >= 0)
        clusters = coalesce_in_start_order(in_start_order, keys, starts, ends)
    drop, union = bytearray(len(note_tid)), {}
    for kept, removed, start, end in clusters:
        for n in removed:
            drop[n] = 1
        union[kept] = (start, end - start)
    return note_tid, mapped, drop, union


def _move_flows(index: CompactIndex, runs: StreamRuns, lane_tid: array, strict: bool) -> tuple[array, int, int]:
    """Lane of each ac2g endpoint on an old stream: the slice starting at its ts,
    else (dangling: trimmed captures) the stream's nearest slice."""
    targets = runs.starting_at_each(index.flow_stream, index.flow_ts)
    dangling = array("i", (n for n, target in enumerate(targets) if target == -2) if -2 in targets else ())
    if dangling and strict:
        pid, tid = index.stream_keys[index.flow_stream[dangling[0]]]
        raise TraceError(f"ac2g endpoint at ts {index.flow_ts[dangling[0]]} on pid {pid} stream {tid} "
                         "matches no slice start (--strict)")
    nearest = runs.nearest_each(array("i", map(index.flow_stream.__getitem__, dangling)),
                                array("d", map(index.flow_ts.__getitem__, dangling)))
    for n, target in zip(dangling, nearest):
        targets[n] = target
    with_none = lane_tid + array("i", [-1])  # target -1 (not an old stream) reads the appended -1
    flow_tid = array("i", map(with_none.__getitem__, targets))
    unmatched = len(dangling)
    mapped = len(targets) - targets.count(-1) - unmatched
    return flow_tid, mapped, unmatched


def _lane_metadata(lane_info: dict, note_track: dict, used_tracks: set) -> Iterator[dict]:
    """thread_name and thread_sort_index for every lane, and for each used
    annotation track just above its lane."""
    sort_index = 0
    for tid in sorted(lane_info, key=lambda t: (_pid_key(lane_info[t][0]), t)):
        pid, _, _, label = lane_info[tid]
        tracks = [(note_track[tid], f"{label} annotations")] if (pid, note_track[tid]) in used_tracks else []
        for track, name in tracks + [(tid, label)]:
            yield {"name": "thread_name", "ph": "M", "pid": pid, "tid": track, "args": {"name": name}}
            yield {"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": track, "args": {"sort_index": sort_index}}
            sort_index += 1


def _pp_tracks(rules: Rules, lane_info: dict, note_track: dict) -> tuple[set, set]:
    """(pid, tid) of the first compute annotation track and the first two
    all-gather annotation tracks of each GPU pid: where PP blocks are read."""
    compute, unshard = set(), set()
    for tid, (pid, group, lane, _) in lane_info.items():
        if rules.names[group] == "compute" and lane == 0:
            compute.add((pid, note_track[tid]))
        elif rules.names[group] == "nccl_all_gather" and lane in (0, 1):
            unshard.add((pid, note_track[tid]))
    return compute, unshard


def _pp_spans(index: CompactIndex, mapped: array, note_tid: array, note_drop: bytearray, note_union: dict,
              kernel_runs: Runs, lane_info: dict, note_track: dict, tracks: tuple[set, set]) -> list[Span]:
    """PP-named annotation spans as they sit after compaction, only where
    blocks are read (so graph replays projected on many lanes cost nothing)."""
    compute_tracks, unshard_tracks = tracks
    ops = [{action.op for action in parse_pp_name(name)} for name in index.label_names]

    def wanted(label: int, pid: object, tid: int) -> bool:
        kinds = ops[label]
        return bool(kinds) and (any(op.startswith(("SEND_", "RECV_")) for op in kinds)
                                or ((pid, tid) in compute_tracks and not kinds.isdisjoint(COMPUTE_OPS))
                                or ((pid, tid) in unshard_tracks and "UNSHARD" in kinds))

    spans = []
    for n in mapped:
        label = index.note_name[n]
        pid = index.stream_keys[index.note_stream[n]][0]
        if label < 0 or note_drop[n] or not wanted(label, pid, note_tid[n]):
            continue
        start, end = index.note_start[n], index.note_end[n]
        if n in note_union:
            start, end = note_union[n][0], note_union[n][0] + note_union[n][1]
        spans.append(Span(pid, note_tid[n], index.label_names[label], start, end))
    for n in range(len(kernel_runs)):
        label, lane = kernel_runs.label[n], kernel_runs.lane[n]
        pid, tid = lane_info[lane][0], note_track[lane]
        if wanted(label, pid, tid):
            spans.append(Span(pid, tid, index.label_names[label], kernel_runs.start[n], kernel_runs.end[n]))
    return spans


def _pp_local_arrows(spans: list[Span], tracks: tuple[set, set], pids: list, members: list[RawMember],
                     summary: dict) -> list[Arrow]:
    """Rank-local PP arrows; adds their counts to ``summary``."""
    pp_rank, source = _pp_rank(members)
    maker = ArrowMaker({pid: pp_rank for pid in pids})
    local_arrows(find_blocks(spans, *tracks), maker)
    summary.update(
        pp_rank=pp_rank, pp_rank_source=source,
        pp_compute_dependency_pairs=maker.pairs["pp_compute_dependency"],
        pp_compute_dependency_unmatched=maker.unmatched["pp_compute_dependency"],
        pp_unshard_compute_pairs=maker.pairs["pp_unshard_dependency"],
        pp_unshard_compute_unmatched=maker.unmatched["pp_unshard_dependency"],
    )
    return maker.arrows


def _pid_key(pid: object) -> tuple:
    return (0, pid, "") if type(pid) is int else (1, 0, str(pid))


def _by_group_name(rules: Rules, groups: array) -> dict[str, int]:
    counts: dict[str, int] = defaultdict(int)
    for group in groups:
        counts[rules.names[group]] += 1
    return dict(sorted(counts.items()))


def _lanes_by_group(rules: Rules, lane_info: dict) -> dict[str, int]:
    counts: dict[str, int] = defaultdict(int)
    for _, group, _, _ in lane_info.values():
        counts[rules.names[group]] += 1
    return counts


class CompactPlan(EmitPlan):
    """Pass 2: move slices, annotations and flow endpoints; drop old metadata.

    A block of lines is moved as one text when it can be (:meth:`moved_block`):
    the tid of every line (and ``args.stream`` of the slices) swapped by one
    split of the joined block, dropped lines left out, only retimed
    annotations patched one by one.  Otherwise each line goes through its
    kind's patcher, a closure that counts its own kind of event, so the k-th
    slice line met in pass 2 is checked against the k-th slice of pass 1.
    """

    def __init__(self, index: CompactIndex, compaction: Compaction, exact: bool) -> None:
        self.actions = index.actions
        self.compaction = compaction
        self._index = index
        self._loads = event_loader(exact)
        self._counters = {kind: itertools.count() for kind in (SLICE, ANNOTATION, FLOW, METADATA)}
        self._slices = self._counters[SLICE]
        self._old_tids = old_tids = [key[1] for key in index.stream_keys]
        self.patchers = [None, self._slice_patcher(index, old_tids), self._annotation_patcher(),
                         self._flow_patcher(index, old_tids), self._metadata_patcher()]
        self._cursor = [0, {SLICE: 0, ANNOTATION: 0, FLOW: 0, METADATA: 0}]  # next event, ordinals there
        tids = set(compaction.lane_tid_of_slice) | set(compaction.note_tid) | set(compaction.flow_tid)
        self._new_tids = {tid for tid in tids if tid >= 0}
        self._tid_texts: dict[bytes, dict[int, bytes]] = {}

    def lines(self, block: list[bytes], first_index: int) -> list[bytes] | JoinedLines:
        moved = self.moved_block(block, first_index)
        if moved is not None:
            lines, tids = moved.kept()
            joined = swap_all(_TID_KEY, b"\n".join(lines), self.tid_swap(tids, b'"tid":'), len(lines))
            if joined is not None:
                moved.commit()
                return JoinedLines(joined, len(lines))
        return patched_lines(self, block, first_index)

    def tid_swap(self, tids: array, prefix: bytes) -> Convert:
        """New texts (``prefix`` + tid) for the tids of a moved block's kept
        lines in order: the lane tid, or the old number where it stays."""
        texts = self._tid_texts.get(prefix)
        if texts is None:
            texts = self._tid_texts[prefix] = {tid: prefix + b"%d" % tid for tid in self._new_tids}
        return lambda numbers: map(texts.get, tids, map(prefix.__add__, numbers))

    def moved_block(self, block: list[bytes], first: int) -> "MovedBlock | None":
        """The block with compaction's moves decided (each line's new tid,
        the lines to drop) and done where they concern a few lines
        (``args.stream`` of slices, retimed annotations), or None when the block must go
        through the per-line patchers (an event without an integer tid, an
        ``args.stream`` that is not exactly once in its line).  Nothing
        changes until :meth:`MovedBlock.commit`."""
        end = first + len(block)
        bases, counts = self._bases(first, end)
        odd = self._index.odd_tid_at
        at = bisect_left(odd, first)
        if at < len(odd) and odd[at] < end:
            return None
        actions = self.actions[first:end]
        plan = self.compaction
        new_tids = array("i", [-1]) * len(block)
        lines = list(block)
        slice_at = positions(actions, SLICE)
        s0 = bases[SLICE]
        lanes = plan.lane_tid_of_slice[s0:s0 + len(slice_at)]
        check = self._check_slice
        for ordinal, position, tid in zip(itertools.count(s0), slice_at, lanes):
            check(lines[position], ordinal)
            new_tids[position] = tid
        with_stream = self._index.slice_stream_arg[s0:s0 + len(slice_at)]
        if not swap_in_lines(lines, list(itertools.compress(slice_at, with_stream)), _STREAM_KEY,
                             lambda numbers: map(b'"stream":%d'.__mod__, itertools.compress(lanes, with_stream))):
            return None
        for position, tid in zip(positions(actions, FLOW), plan.flow_tid[bases[FLOW]:bases[FLOW] + counts[FLOW]]):
            new_tids[position] = tid
        drop = []
        for ordinal, position in enumerate(positions(actions, ANNOTATION), bases[ANNOTATION]):
            tid = plan.note_tid[ordinal]
            if tid < 0:
                continue
            if plan.note_drop[ordinal]:
                drop.append(position)
                continue
            new_tids[position] = tid
            if ordinal in plan.note_union:
                lines[position] = self._annotation_line(block[position], ordinal)
        for ordinal, position in enumerate(positions(actions, METADATA), bases[METADATA]):
            if plan.meta_drop[ordinal]:
                drop.append(position)
        keep = None
        if drop:
            keep = bytearray(b"\x01") * len(block)
            for position in drop:
                keep[position] = 0
        return MovedBlock(lines, new_tids, keep, lambda: self._skip(counts))

    def _bases(self, first: int, end: int) -> tuple[dict[int, int], dict[int, int]]:
        """Each kind's ordinal at event ``first`` and its count in the block;
        blocks come in order, so the cursor then moves on to ``end``."""
        cursor, bases = self._cursor
        if cursor != first:
            raise TraceError(f"validation failed: pass 2 expected event {cursor}, got {first}")
        counts = {kind: self.actions.count(kind, first, end) for kind in bases}
        self._cursor = [end, {kind: ordinal + counts[kind] for kind, ordinal in bases.items()}]
        return bases, counts

    def _skip(self, counts: dict[int, int]) -> None:
        """Keep the line-by-line patchers' counters in step with a block moved whole."""
        for kind, count in counts.items():
            collections.deque(itertools.islice(self._counters[kind], count), maxlen=0)

    def _retarget(self, line: bytes, old_tid: object, tid: int, *, stream: bool = False,
                  times: tuple | None = None) -> bytes:
        """Move an event line to ``tid``: a textual splice of the compact line
        when it is unambiguous, else decode, change and re-encode."""
        if times is None and type(old_tid) is int:
            spliced = _splice(line, b'"tid":%d,' % old_tid, b'"tid":%d,' % tid)
            if spliced is not None and stream:
                spliced = _splice(spliced, b'"stream":%d,' % old_tid, b'"stream":%d,' % tid)
            if spliced is not None:
                return spliced
        event = self._loads(line)
        event["tid"] = tid
        args = event.get("args")
        if stream and isinstance(args, dict) and "stream" in args:
            args["stream"] = tid
        if times is not None:
            event["ts"], event["dur"] = times
        return dumps_event(event)

    def _check_slice(self, line: bytes, ordinal: int) -> None:
        start = _TS_FIELD.search(line)
        if start is None or float(start.group(1)) != self._index.slice_start[ordinal]:
            raise TraceError(f"validation failed: GPU slice {ordinal} differs between the passes")

    def _slice_patcher(self, index: CompactIndex, old_tids: list) -> Callable[[bytes], bytes]:
        streams, lane_tids = index.slice_stream, self.compaction.lane_tid_of_slice
        retarget, counter, check = self._retarget, self._slices, self._check_slice

        def patch(line: bytes) -> bytes:
            ordinal = next(counter)
            check(line, ordinal)
            return retarget(line, old_tids[streams[ordinal]], lane_tids[ordinal], stream=True)

        return patch

    def _annotation_line(self, line: bytes, ordinal: int) -> bytes | None:
        plan = self.compaction
        tid = plan.note_tid[ordinal]
        if tid < 0:
            return line
        if plan.note_drop[ordinal]:
            return None
        old_tid = self._old_tids[self._index.note_stream[ordinal]]
        return self._retarget(line, old_tid, tid, times=plan.note_union.get(ordinal))

    def _annotation_patcher(self) -> Callable[[bytes], bytes | None]:
        counter, patch = self._counters[ANNOTATION], self._annotation_line
        return lambda line: patch(line, next(counter))

    def _flow_patcher(self, index: CompactIndex, old_tids: list) -> Callable[[bytes], bytes]:
        tids, streams, counter, retarget = self.compaction.flow_tid, index.flow_stream, self._counters[FLOW], self._retarget

        def patch(line: bytes) -> bytes:
            ordinal = next(counter)
            tid = tids[ordinal]
            return line if tid < 0 else retarget(line, old_tids[streams[ordinal]], tid)

        return patch

    def _metadata_patcher(self) -> Callable[[bytes], bytes | None]:
        drop, counter = self.compaction.meta_drop, self._counters[METADATA]

        def patch(line: bytes) -> bytes | None:
            return None if drop[next(counter)] else line

        return patch

    def check_slices_written(self) -> None:
        """Every slice indexed in pass 1 went through pass 2."""
        written = next(self._slices)
        read = len(self.compaction.lane_tid_of_slice)
        if written != read:
            raise TraceError(f"validation failed: {written} GPU slices written, {read} read")

    def appended(self) -> Iterator[bytes]:
        self.check_slices_written()
        return (dumps_event(event) for event in self.compaction.new_events())


@dataclass
class MovedBlock:
    """A block of lines on its way through compaction: every line (changed
    where changes are per line), each line's new tid (-1: it stays; None:
    no compaction), which lines to keep (None: all), and ``commit`` to call
    once the block is written."""

    lines: list[bytes]
    new_tids: array | None
    keep: bytearray | None
    commit: Callable[[], None]

    def kept(self) -> tuple[list[bytes], array | None]:
        """The kept lines and their new tids."""
        if self.keep is None:
            return self.lines, self.new_tids
        return list(itertools.compress(self.lines, self.keep)), array("i", itertools.compress(self.new_tids, self.keep))


_TID_KEY = field_pattern(b'"tid":')
_STREAM_KEY = field_pattern(b'"stream":')


_TS_FIELD = re.compile(rb'"ts":(-?[0-9][0-9.eE+-]*)[,}]')


def _splice(line: bytes, old: bytes, new: bytes) -> bytes | None:
    """Replace the one integer field ``old`` (``"tid":7,``) by ``new``; None if ambiguous.

    Safe on compact JSON: a quote inside a string is always escaped, so
    ``"tid":`` can only be a key; the field must occur exactly once and end
    with ``,`` (so ``"tid":7,`` does not match ``"tid":71,``).  Anything else
    takes the decode path.
    """
    parts = line.split(old)
    if len(parts) != 2:
        return None
    return parts[0] + new + parts[1]


def compact(
    src: SourceSpec,
    dst: SinkSpec | None = None,
    *,
    rules: str | None = None,
    pp_flows: bool = True,
    strict: bool = False,
    overwrite: bool = False,
    compress: str | None = None,
    level: int | None = None,
    salvage: bool = False,
    spool_dir: str | None = None,
    progress: bool | None = False,
) -> dict:
    """Compact GPU streams into semantic lanes (the ``compact`` command); returns the summary."""
    started = time.perf_counter()
    chosen_rules = load_rules(rules)
    dst = default_output(src, "_compacted") if dst is None else dst
    with InputSource(src, spool_dir=spool_dir) as source:
        target = OutputTarget(dst, overwrite=overwrite, compress=compress, level=level, inputs=[source.path])
        meter = Progress(source.size, enabled=progress)
        result: IndexResult = index_pass(source, lambda: CompactIndex(chosen_rules), keep_events=True,
                                         spool_dir=spool_dir, salvage=salvage, progress=meter)
        index: CompactIndex = result.visitor  # type: ignore[assignment]
        members = result.stats.header + result.stats.trailer
        try:
            if not index.slice_start:
                plan: EmitPlan = EmitPlan()
                summary = {"notice": "no GPU kernel/memcpy/memset slices: trace passed through unchanged",
                           "measured_slices": 0}
            else:
                compaction = plan_compaction(index, members, pp_flows=pp_flows, strict=strict)
                plan = CompactPlan(index, compaction, result.stats.exact_numbers)
                summary = compaction.summary
        except BaseException:
            result.spool.close()
            raise
        planned = time.perf_counter()
        written = emit_pass(result, plan, target, progress=meter)
    return {
        "input": source.name,
        "output": target.name,
        **summary,
        "events_read": result.stats.events,
        "events_written": written,
        "read": result.stats.as_dict(),
        "pass1_seconds": round(result.seconds, 3),
        "plan_seconds": round(planned - started - result.seconds, 3),
        "wall_seconds": round(time.perf_counter() - started, 3),
        "peak_rss_mb": peak_rss_mb(),
    }
