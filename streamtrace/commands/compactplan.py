"""``compact``'s plan between the passes: :func:`plan_compaction` packs slices into lanes, maps
annotations and flow endpoints onto them, coalesces, builds per-kernel annotation spans and rank-local PP arrows."""
from __future__ import annotations

from array import array
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np
import orjson

from ..algo.lanes import (
    CHUNK,
    NO_MATCH,
    ORDINAL,
    Clusters,
    Runs,
    coalesce,
    first_overlap,
    label_runs,
    nearest_in_runs,
    pack_lanes,
    partition,
    start_order,
    starting_in_runs,
)
from ..algo.pp import parse_pp_name
from ..algo.pparrows import COMPUTE_OPS, Arrow, ArrowMaker, Span, arrow_events, find_blocks, local_arrows
from ..algo.ranks import pp_group_ranks
from ..algo.rules import Rules
from ..errors import TraceError
from ..io.eventtext import dumps_event
from ..io.jsonscan import RawMember, member_value
from ..io.spool import parked
from ..resources import buffers_from_os, gc_paused
from .compactindex import NOTE_TIMES, RUN_COLUMNS, TID_GAP, TID_LIMIT, CompactIndex


@dataclass
class Retimed:
    """The annotations coalescing stretched (each cluster's kept member),
    ascending, with their new start and duration: arrays, as a dict of
    Python numbers would take ten times the memory all through pass 2."""

    ordinals: np.ndarray
    start: np.ndarray
    duration: np.ndarray

    @classmethod
    def of(cls, clusters: Clusters) -> Retimed:
        by_ordinal = np.argsort(clusters.kept, kind="stable")
        start = clusters.start[by_ordinal]
        return cls(clusters.kept[by_ordinal], start, clusters.end[by_ordinal] - start)

    def __len__(self) -> int:
        return len(self.ordinals)

    def among(self, ordinals: np.ndarray) -> np.ndarray:
        """Which of ``ordinals`` are retimed (a mask)."""
        ordinals = self._typed(ordinals)
        at = np.searchsorted(self.ordinals, ordinals)
        found = at < len(self.ordinals)
        found[found] = self.ordinals[at[found]] == ordinals[found]
        return found

    def times(self, ordinals: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The new starts and durations of ``ordinals`` (each of them retimed)."""
        at = np.searchsorted(self.ordinals, self._typed(ordinals))
        return self.start[at], self.duration[at]

    def get(self, ordinal: int) -> tuple[float, float] | None:
        """The new (start, duration) of annotation ``ordinal``; None: its own."""
        at = int(np.searchsorted(self.ordinals, self._typed(ordinal)))
        if at < len(self.ordinals) and self.ordinals[at] == ordinal:
            return float(self.start[at]), float(self.duration[at])
        return None

    def _typed(self, ordinals: np.ndarray | int) -> np.ndarray:
        """Ordinals in the type of :attr:`ordinals` (annotation ordinals, which
        it holds): searching for another type would cast the whole sorted array,
        a copy per search."""
        return np.asarray(ordinals).astype(self.ordinals.dtype, copy=False)


@dataclass
class Compaction:
    """Everything pass 2 needs, the new events to append, and the summary.

    Plain data (typed and numpy arrays, small dicts), so a worker process can hand a
    rank's compaction to the process that writes the merged output.
    """

    lane_tid_of_slice: array
    note_tid: array
    note_drop: bytearray
    note_union: Retimed
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
    original_stream: bool = True  # moved slices keep their old stream as args.original_stream

    def new_events(self) -> Iterator[dict]:
        """Per-kernel annotation spans, lane and track metadata, PP arrows."""
        for lane, label, start, end in self.kernel_runs.rows():
            yield self._run_event(lane, label, start, end - start)
        yield from self._other_new_events()

    def new_lines(self) -> Iterator[bytes]:
        """:meth:`new_events` as the text :func:`dumps_event` writes for them,
        the per-kernel spans (hundreds of thousands) a chunk at a time: each
        label and lane's text written once, the times by one orjson call per
        chunk, no dict per span."""
        runs, heads = self.kernel_runs, {}
        for lo in range(0, len(runs), CHUNK):
            pairs = list(zip(runs.lane[lo:lo + CHUNK].tolist(), runs.label[lo:lo + CHUNK].tolist()))
            for pair in set(pairs).difference(heads):
                head = dumps_event(self._run_event(*pair, 0.0, 0.0))
                heads[pair] = head[:head.rindex(_RUN_TAIL)] + b',"ts":'
            starts = runs.start[lo:lo + CHUNK]
            start_texts, duration_texts = (orjson.dumps(times.tolist())[1:-1].split(b",")
                                           for times in (starts, runs.end[lo:lo + CHUNK] - starts))
            yield from map(_RUN_LINE.__mod__, zip(map(heads.__getitem__, pairs), start_texts, duration_texts))
        yield from map(dumps_event, self._other_new_events())

    def _run_event(self, lane: int, label: int, start: float, duration: float) -> dict:
        return {"name": self.label_names[label], "cat": "gpu_user_annotation", "ph": "X",
                "pid": self.lane_info[lane][0], "tid": self.note_track[lane], "ts": start, "dur": duration, "args": {}}

    def _other_new_events(self) -> Iterator[dict]:
        yield from _lane_metadata(self.lane_info, self.note_track, self.used_tracks)
        yield from arrow_events(self.arrows)


_RUN_TAIL = b',"ts":0.0,"dur":0.0,"args":{}}'
_RUN_LINE = b'%b%b,"dur":%b,"args":{}}'  # a span's text after its head (up to "ts":): start, duration


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


PLAN_MMAP_THRESHOLD = 4 << 20  # while indexing and planning, buffers from this size on come from the OS and go back


@gc_paused()
@buffers_from_os(PLAN_MMAP_THRESHOLD)  # the plan's numpy scratch must not stay resident
def plan_compaction(index: CompactIndex, members: list[RawMember], *, pp_flows: bool = True,
                    local_arrows: bool = True, strict: bool = False, original_stream: bool = True,
                    scratch: str | None = None) -> Compaction:
    """Between the passes: lanes, tids, annotation and flow moves, new events.

    With ``pp_flows`` the PP spans are collected, and with ``local_arrows``
    too the rank-local arrows are made (``merge`` makes all arrows itself).
    With ``original_stream`` each moved slice keeps its stream as
    ``args.original_stream``.  ``scratch``: the directory for arrays parked
    while a stage that does not read them runs.

    The work runs in numpy over views of the index's arrays (see
    :mod:`streamtrace.algo.lanes`), ordered so that each array only the plan
    reads is released at its last use (:meth:`CompactIndex.release`, so a
    plan is made once per index), and the annotations' columns wait on disk
    while lanes are packed, the label runs while annotations coalesce: the
    plan's peak is the index and a few int32 arrays a slice, and pass 2
    runs beside the plan's results.
    """
    rules = index.rules
    count = len(index.slice_start)
    stream_pid = [key[0] for key in index.stream_keys]
    runs = StreamRuns(index)
    flow_tid, flows_unmatched = _flow_targets(index, runs, strict)
    index.release("flow_ts")
    note_tid = array("i", [0]) * len(index.note_start)
    runs.nearest_each(np.asarray(index.note_stream), np.asarray(index.note_start), out=np.asarray(note_tid))
    meta_drop = bytearray(1 if runs.is_old(stream) else 0 for stream in index.meta_stream)
    old_streams = runs.old_count
    pid_order = sorted({stream_pid[stream] for stream in runs.held()}, key=_pid_key)
    del runs  # the per-stream index is done with: free it before the next allocations

    with parked(index, NOTE_TIMES, scratch):
        starts, ends, labels = (np.asarray(column) for column in (index.slice_start, index.slice_end, index.slice_label))
        order = start_order(starts, ends)
        lane_tid, lane_info = _assign_lanes(index, order, stream_pid, pid_order)
        slice_groups = _by_group_name(rules, index.slice_group)
        index.release("slice_group")
        lanes = np.asarray(lane_tid)
        overlap = first_overlap(order, starts, ends, lanes)
        if overlap is not None:
            raise TraceError(f"validation failed: lane {lane_tid[overlap]} would hold overlapping slices")
        kernel_runs = label_runs(order, lanes, labels, starts, ends)
        converted = int(np.count_nonzero(labels >= 0))
        del order, starts, ends, labels
        index.release("slice_end", "slice_label")

    note_base = _allocate_tids(index.int_tids | set(lane_info), len(lane_info))
    note_track = {tid: note_base + n for n, tid in enumerate(sorted(lane_info, key=lambda t: (_pid_key(lane_info[t][0]), t)))}
    flows_mapped = _map_targets(np.asarray(flow_tid), lanes.__getitem__) - flows_unmatched
    with parked(kernel_runs, RUN_COLUMNS, scratch):
        mapped, note_drop, clusters = _move_annotations(index, note_tid, lanes, note_track)
        index.release("note_identity")
    note_union = Retimed.of(clusters)
    coalesced = len(clusters.removed)
    del clusters
    used_tracks = _used_tracks(index, mapped, note_tid, note_drop, stream_pid)
    used_tracks.update((lane_info[lane][0], note_track[lane]) for lane in np.unique(kernel_runs.lane).tolist())

    summary = {
        "measured_slices": count,
        "original_streams": old_streams,
        "compacted_lanes": len(lane_info),
        "slice_groups": slice_groups,
        "lanes_by_group": dict(sorted(_lanes_by_group(rules, lane_info).items())),
        "gpu_flow_endpoints_mapped": flows_mapped,
        "gpu_flow_endpoints_unmatched": flows_unmatched,
        "gpu_annotations_mapped": len(mapped),
        "gpu_annotations_coalesced": coalesced,
        "kernel_annotations_converted": converted,
        "kernel_annotation_blocks": len(kernel_runs),
        "gpu_annotations_retained": index.gpu_annotations - coalesced + len(kernel_runs),
        "cuda_graph_launches": index.graph_launches,
    }
    compaction = Compaction(lane_tid, note_tid, note_drop, note_union, flow_tid, meta_drop, summary, kernel_runs,
                            index.label_names, lane_info, note_track, used_tracks, original_stream=original_stream)
    if pp_flows:
        compaction.pp_tracks = _pp_tracks(rules, lane_info, note_track)
        compaction.pp_spans = _pp_spans(index, mapped, note_tid, note_drop, note_union, kernel_runs, lane_info,
                                        note_track, compaction.pp_tracks)
        if local_arrows:
            compaction.arrows = _pp_local_arrows(compaction.pp_spans, compaction.pp_tracks, pid_order, members, summary)
    index.release("note_start", "note_end", "note_name")
    return compaction


def _assign_lanes(index: CompactIndex, order: np.ndarray, stream_pid: list, pid_order: list) -> tuple[array, dict]:
    """Pack each (pid, group) into lanes; returns every slice's lane tid and
    ``lane_info[tid] = (pid, group, lane, label)``.  Its scratch arrays die here."""
    rules, starts, ends = index.rules, np.asarray(index.slice_start), np.asarray(index.slice_end)
    group_count = len(rules.names)
    pid_groups = [(pid, group) for pid in pid_order for group in range(group_count)]
    pid_number = {pid: n for n, pid in enumerate(pid_order)}
    small = np.min_scalar_type(len(pid_groups))
    stream_base = np.array([pid_number.get(pid, 0) * group_count for pid in stream_pid], small)
    pid_group = stream_base[np.asarray(index.slice_stream)] + np.asarray(index.slice_group, small)
    by_group, group_offsets = partition(order, pid_group, len(pid_groups))
    del pid_group
    lane_tid = array("i", [0]) * len(starts)
    lanes = np.asarray(lane_tid)
    lane_counts = [pack_lanes(by_group[group_offsets[k]:group_offsets[k + 1]], starts, ends, lanes)
                   for k in range(len(pid_groups))]
    lane_info, next_tid = {}, _allocate_tids(index.int_tids, sum(lane_counts))
    for k, (pid, group) in enumerate(pid_groups):
        for lane in range(lane_counts[k]):
            suffix = f" {lane + 1}" if lane_counts[k] > 1 else ""
            lane_info[next_tid + lane] = (pid, group, lane, rules.labels[group] + suffix)
        for lo in range(group_offsets[k], group_offsets[k + 1], CHUNK):  # (a gather at once would copy the group)
            lanes[by_group[lo:min(lo + CHUNK, group_offsets[k + 1])]] += next_tid
        next_tid += lane_counts[k]
    return lane_tid, lane_info


class StreamRuns:
    """The slices of each original stream, in start order, as bounds into one array."""

    def __init__(self, index: CompactIndex) -> None:
        self.starts, self.ends = np.asarray(index.slice_start), np.asarray(index.slice_end)
        order = start_order(self.starts, self.ends)
        self.perm, self.offsets = partition(order, np.asarray(index.slice_stream), len(index.stream_keys))
        self.old_count = len(self.held())

    def held(self) -> list[int]:
        """The streams that held slices before compaction."""
        return np.flatnonzero(self.offsets[1:] > self.offsets[:-1]).tolist()

    def is_old(self, stream: int) -> bool:
        """Did this (pid, tid) hold slices before compaction?"""
        return bool(self.offsets[stream + 1] > self.offsets[stream])

    def nearest_each(self, streams: np.ndarray, times: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """For each (stream, time): the stream's nearest slice, or -1 when the
        stream held no slices."""
        return nearest_in_runs(self.perm, self.offsets, self.starts, self.ends, streams, times, out)

    def starting_at_each(self, streams: np.ndarray, times: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """For each (stream, time): the slice starting exactly then, -2 when
        none does, -1 when the stream held no slices."""
        return starting_in_runs(self.perm, self.offsets, self.starts, streams, times, out)


def _flow_targets(index: CompactIndex, runs: StreamRuns, strict: bool) -> tuple[array, int]:
    """The slice each ac2g endpoint on an old stream moves to (-1 elsewhere):
    the one starting at its ts, else (dangling: trimmed captures) the
    stream's nearest slice; and how many dangle.  The array becomes the
    endpoints' lane tids once lanes are known (:func:`_map_targets`)."""
    streams, times = np.asarray(index.flow_stream), np.asarray(index.flow_ts)
    flow_tid = array("i", [0]) * len(streams)
    targets = runs.starting_at_each(streams, times, out=np.asarray(flow_tid))
    dangling = np.flatnonzero(targets == NO_MATCH)
    if dangling.size and strict:
        first = int(dangling[0])
        pid, tid = index.stream_keys[index.flow_stream[first]]
        raise TraceError(f"ac2g endpoint at ts {index.flow_ts[first]} on pid {pid} stream {tid} "
                         "matches no slice start (--strict)")
    targets[dangling] = runs.nearest_each(streams[dangling], times[dangling])
    return flow_tid, len(dangling)


def _map_targets(targets: np.ndarray, tid_of: Callable[[np.ndarray], np.ndarray]) -> int:
    """Replace each target slice ordinal in ``targets`` by ``tid_of(ordinals)``,
    in place and a chunk at a time (-1, no slice, stays); returns how many."""
    replaced = 0
    for lo in range(0, len(targets), CHUNK):
        chunk = targets[lo:lo + CHUNK]
        moved = chunk >= 0
        chunk[moved] = tid_of(chunk[moved])
        replaced += int(np.count_nonzero(moved))
    return replaced


def _move_annotations(index: CompactIndex, note_tid: array, lanes: np.ndarray,
                      note_track: dict) -> tuple[np.ndarray, bytearray, Clusters]:
    """Annotation track of each GPU annotation on an old stream (``note_tid``
    holds its nearest slice and gets the track), and coalescing.

    Coalescing groups annotations by (track, identity): identical events
    (:func:`_identity_hash`) that land on one track.
    """
    tids = np.asarray(note_tid)
    lane_tids = np.array(sorted(note_track), ORDINAL)
    tracks = np.array([note_track[tid] for tid in lane_tids.tolist()], ORDINAL)
    _map_targets(tids, lambda slices: tracks[np.searchsorted(lane_tids, lanes[slices])])
    mapped = np.flatnonzero(tids >= 0).astype(ORDINAL)
    clusters = coalesce(mapped, (tids, np.asarray(index.note_identity)), np.asarray(index.note_start),
                        np.asarray(index.note_end))
    drop = bytearray(len(tids))
    np.asarray(drop)[clusters.removed] = 1
    return mapped, drop, clusters


def _used_tracks(index: CompactIndex, mapped: np.ndarray, note_tid: array, note_drop: bytearray,
                 stream_pid: list) -> set:
    """(pid, tid) of every annotation track a kept annotation moved to."""
    kept = mapped[np.asarray(note_drop)[mapped] == 0]
    pairs = np.unique(np.asarray(index.note_stream)[kept].astype(np.int64) << 32 | np.asarray(note_tid)[kept])
    return {(stream_pid[pair >> 32], pair & 0xFFFFFFFF) for pair in pairs.tolist()}


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


def _pp_spans(index: CompactIndex, mapped: np.ndarray, note_tid: array, note_drop: bytearray, note_union: Retimed,
              kernel_runs: Runs, lane_info: dict, note_track: dict, tracks: tuple[set, set]) -> list[Span]:
    """PP-named annotation spans as they sit after compaction, only where
    blocks are read (so graph replays projected on many lanes cost nothing).
    What is wanted is decided per label and per track, not per span."""
    compute_tracks, unshard_tracks = tracks
    ops = [{action.op for action in parse_pp_name(name)} for name in index.label_names]
    send_recv = np.array([any(op.startswith(("SEND_", "RECV_")) for op in kinds) for kinds in ops], bool)
    compute = np.array([not kinds.isdisjoint(COMPUTE_OPS) for kinds in ops], bool)
    unshard = np.array(["UNSHARD" in kinds for kinds in ops], bool)
    stream_pid = [key[0] for key in index.stream_keys]

    def on(tracks: set, streams: np.ndarray, tids: np.ndarray) -> np.ndarray:
        """Which (stream's pid, tid) are in ``tracks``, looked up once per distinct pair."""
        pairs, inverse = np.unique(streams.astype(np.int64) << 32 | tids, return_inverse=True)
        return np.array([(stream_pid[pair >> 32], pair & 0xFFFFFFFF) in tracks for pair in pairs.tolist()], bool)[inverse]

    labels = np.asarray(index.note_name)[mapped]
    named = mapped[(labels >= 0) & (np.asarray(note_drop)[mapped] == 0)]
    labels = np.asarray(index.note_name)[named]
    named = named[send_recv[labels] | compute[labels] | unshard[labels]]
    labels = np.asarray(index.note_name)[named]
    streams, tids = np.asarray(index.note_stream)[named], np.asarray(note_tid)[named]
    wanted = send_recv[labels] | (compute[labels] & on(compute_tracks, streams, tids)) \
        | (unshard[labels] & on(unshard_tracks, streams, tids))
    spans = []
    chosen = named[wanted]
    retimed = chosen[note_union.among(chosen)]
    unions = dict(zip(retimed.tolist(), zip(*(column.tolist() for column in note_union.times(retimed)))))
    for n in chosen.tolist():
        start, end = index.note_start[n], index.note_end[n]
        if n in unions:
            start, end = unions[n][0], unions[n][0] + unions[n][1]
        spans.append(Span(stream_pid[index.note_stream[n]], note_tid[n], index.label_names[index.note_name[n]], start, end))

    def lanes_on(tracks: set) -> np.ndarray:
        return np.isin(run_lanes, [lane for lane, info in lane_info.items() if (info[0], note_track[lane]) in tracks])

    run_labels, run_lanes = kernel_runs.label, kernel_runs.lane
    wanted = send_recv[run_labels] | (compute[run_labels] & lanes_on(compute_tracks)) \
        | (unshard[run_labels] & lanes_on(unshard_tracks))
    for lane, label, start, end in zip(*(column[wanted].tolist() for column in
                                         (run_lanes, run_labels, kernel_runs.start, kernel_runs.end))):
        spans.append(Span(lane_info[lane][0], note_track[lane], index.label_names[label], start, end))
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
    by_group = np.zeros(len(rules.names), np.int64)
    for lo in range(0, len(groups), CHUNK):  # (bincount copies its input as int64)
        by_group += np.bincount(np.asarray(groups)[lo:lo + CHUNK], minlength=len(rules.names))
    counts: dict[str, int] = defaultdict(int)
    for group, count in enumerate(by_group.tolist()):
        if count:
            counts[rules.names[group]] += count
    return dict(sorted(counts.items()))


def _lanes_by_group(rules: Rules, lane_info: dict) -> dict[str, int]:
    counts: dict[str, int] = defaultdict(int)
    for _, group, _, _ in lane_info.values():
        counts[rules.names[group]] += 1
    return counts
