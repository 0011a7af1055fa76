"""``compact``: CUDA-graph stream compaction, streaming (SPEC 4).

Pass 1 (:class:`CompactIndex`) records GPU slices, GPU annotations, ac2g
endpoints and old-stream thread metadata in typed arrays.  Between the
passes :func:`plan_compaction` packs slices into lanes, maps annotations and
flow endpoints onto lanes, coalesces, builds per-kernel annotation spans and
rank-local PP arrows.  Pass 2 (:class:`CompactPlan`) patches the spooled event
lines and appends the new events.
"""
from __future__ import annotations

import json
import os
import time
from array import array
from collections import defaultdict
from dataclasses import dataclass, field
from decimal import Decimal

import orjson

from .engine import EmitPlan, IndexResult, emit_pass, index_pass
from .errors import TraceError
from .jsonscan import RawMember
from .lanes import (coalesce, first_overlap, label_runs, nearest_in_run, order_by_start, pack_lanes, partition,
                    starting_at)
from .pparrows import ArrowMaker, Span, find_blocks, local_arrows
from .progress import Progress
from .reader import decimal_as_json, dumps_event
from .resources import peak_rss_mb
from .rules import Rules, load_rules
from .sink import OutputTarget, SinkSpec
from .source import InputSource, SourceSpec

SLICE_CATEGORIES = frozenset({"kernel", "Kernel", "gpu_memcpy", "gpu_memset"})
GRAPH_LAUNCH_NAMES = frozenset({"cudaGraphLaunch", "hipGraphLaunch"})
THREAD_METADATA = frozenset({"thread_name", "thread_sort_index"})
KEEP, SLICE, ANNOTATION, FLOW, METADATA = range(5)
TID_GAP = 1000
TID_LIMIT = 2**31
PP_GROUP_NAMES = ("torchtitan_real_pp",)
PP_GROUP_DESCS = ("mesh_pp",)


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
        self.int_tids: set[int] = set()
        self.graph_launches = 0
        self.gpu_annotations = 0
        handlers = {cat: self._slice for cat in SLICE_CATEGORIES}
        handlers.update(gpu_user_annotation=self._annotation, ac2g=self._flow,
                        cuda_runtime=self._runtime, cuda_driver=self._runtime)
        self._handlers = handlers

    def visit(self, event: dict) -> None:
        tid = event.get("tid")
        if tid.__class__ is int:
            self.int_tids.add(tid)
        handler = self._handlers.get(event.get("cat"))
        if handler is not None:
            self.actions.append(handler(event))
        elif event.get("ph") == "M" and event.get("name") in THREAD_METADATA:
            self.meta_stream.append(self._stream(event))
            self.actions.append(METADATA)
        else:
            self.actions.append(KEEP)

    def _stream(self, event: dict) -> int:
        key = (event.get("pid"), event.get("tid"))
        found = self.stream_ids.get(key)
        if found is None:
            found = self.stream_ids[key] = len(self.stream_keys)
            self.stream_keys.append(key)
        return found

    def _label(self, text: str) -> int:
        found = self.label_ids.get(text)
        if found is None:
            found = self.label_ids[text] = len(self.label_names)
            self.label_names.append(text)
        return found

    def _times(self, event: dict, what: str) -> tuple[float, float]:
        ts, dur = event.get("ts"), event.get("dur", 0)
        if ts.__class__ not in (float, int, Decimal) or dur.__class__ not in (float, int, Decimal):
            raise TraceError(f"{what} needs numeric ts and dur", event_index=len(self.actions))
        if dur < 0:
            raise TraceError(f"{what} has negative dur {dur}", event_index=len(self.actions))
        return float(ts), float(ts) + float(dur)

    def _slice(self, event: dict) -> int:
        if event.get("ph") != "X":
            return KEEP
        start, end = self._times(event, "GPU slice")
        category, name = event.get("cat"), event.get("name")
        group = self.group_cache.get((category, name))
        if group is None:
            group = self.group_cache[(category, name)] = self.rules.classify(category, name)
        args = event.get("args")
        label = args.get("name") if args.__class__ is dict else None
        self.slice_stream.append(self._stream(event))
        self.slice_start.append(start)
        self.slice_end.append(end)
        self.slice_group.append(group)
        self.slice_label.append(self._label(label) if label.__class__ is str and label else -1)
        return SLICE

    def _annotation(self, event: dict) -> int:
        self.gpu_annotations += 1
        if event.get("ph") != "X":
            return KEEP
        start, end = self._times(event, "GPU annotation")
        identity = {key: value for key, value in event.items() if key not in ("ts", "dur", "tid")}
        name = event.get("name")
        self.note_stream.append(self._stream(event))
        self.note_start.append(start)
        self.note_end.append(end)
        self.note_identity.append(hash(orjson.dumps(identity, option=orjson.OPT_SORT_KEYS, default=decimal_as_json)))
        self.note_name.append(self._label(name) if name.__class__ is str else -1)
        return ANNOTATION

    def _flow(self, event: dict) -> int:
        ts = event.get("ts")
        if ts.__class__ not in (float, int, Decimal):
            return KEEP
        self.flow_stream.append(self._stream(event))
        self.flow_ts.append(float(ts))
        return FLOW

    def _runtime(self, event: dict) -> int:
        if event.get("name") in GRAPH_LAUNCH_NAMES:
            self.graph_launches += 1
        return KEEP


@dataclass
class Compaction:
    """Everything pass 2 needs, and the summary figures."""

    lane_tid_of_slice: array
    note_tid: array
    note_drop: set
    note_union: dict
    flow_tid: array
    meta_drop: bytearray
    appended: list[dict]
    summary: dict
    slice_count: int
    stream_keys: list[tuple] = field(repr=False, default_factory=list)
    slice_stream: array = field(repr=False, default_factory=lambda: array("i"))
    slice_start: array = field(repr=False, default_factory=lambda: array("d"))


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
    info = None
    for key, raw in members:
        if key == "distributedInfo":
            try:
                info = orjson.loads(raw)
            except orjson.JSONDecodeError:
                info = None
    if not isinstance(info, dict) or type(info.get("rank")) is not int:
        return 0, "default (no distributedInfo.rank)"
    rank = info["rank"]
    for group in info.get("pg_config") or []:
        if isinstance(group, dict) and (group.get("pg_name") in PP_GROUP_NAMES or group.get("pg_desc") in PP_GROUP_DESCS):
            ranks = group.get("ranks")
            if isinstance(ranks, list) and rank in ranks:
                return ranks.index(rank), "pp process group"
    return rank, "global rank (no PP process group)"


def plan_compaction(index: CompactIndex, members: list[RawMember], *, pp_flows: bool = True,
                    strict: bool = False) -> Compaction:
    """Between the passes: lanes, tids, annotation and flow moves, new events."""
    rules = index.rules
    starts, ends = index.slice_start, index.slice_end
    count = len(starts)
    stream_pid = [key[0] for key in index.stream_keys]
    order = order_by_start(starts, ends)

    pid_order = sorted({stream_pid[s] for s in index.slice_stream}, key=_pid_key)
    pid_group_ids = {(pid, group): n for n, (pid, group) in
                     enumerate((pid, group) for pid in pid_order for group in range(len(rules.names)))}
    pid_group = array("i", (pid_group_ids[(stream_pid[s], g)] for s, g in zip(index.slice_stream, index.slice_group)))
    by_group, group_offsets = partition(order, pid_group, len(pid_group_ids))
    lanes = array("i", bytes(4 * count))
    lane_counts = [pack_lanes(by_group[group_offsets[k]:group_offsets[k + 1]], starts, ends, lanes)
                   for k in range(len(pid_group_ids))]

    base = _allocate_tids(index.int_tids, sum(lane_counts))
    lane_base, lane_info, next_tid = [], {}, base
    for (pid, group), k in pid_group_ids.items():
        lane_base.append(next_tid)
        for lane in range(lane_counts[k]):
            suffix = f" {lane + 1}" if lane_counts[k] > 1 else ""
            lane_info[next_tid + lane] = (pid, group, lane, rules.labels[group] + suffix)
        next_tid += lane_counts[k]
    lane_tid = array("i", (lane_base[pid_group[i]] + lanes[i] for i in range(count)))
    overlap = first_overlap(order, starts, ends, lane_tid)
    if overlap is not None:
        raise TraceError(f"validation failed: lane {lane_tid[overlap]} would hold overlapping slices")

    note_base = _allocate_tids(index.int_tids | set(lane_info), len(lane_info))
    note_track = {tid: note_base + n for n, tid in enumerate(sorted(lane_info, key=lambda t: (_pid_key(lane_info[t][0]), t)))}

    by_stream, stream_offsets = partition(order, index.slice_stream, len(index.stream_keys))

    def run_of(stream: int):
        return by_stream[stream_offsets[stream]:stream_offsets[stream + 1]]

    old_streams = {s for s in range(len(index.stream_keys)) if stream_offsets[s + 1] > stream_offsets[s]}

    note_tid = array("i", [-1]) * len(index.note_start)
    mapped = []
    for n, stream in enumerate(index.note_stream):
        if stream in old_streams:
            nearest = nearest_in_run(run_of(stream), starts, ends, index.note_start[n])
            note_tid[n] = note_track[lane_tid[nearest]]
            mapped.append(n)
    note_keys = array("q", (hash((note_tid[n], index.note_identity[n])) if note_tid[n] >= 0 else 0
                            for n in range(len(note_tid))))
    by_key = sorted(sorted(mapped, key=index.note_start.__getitem__), key=note_keys.__getitem__)
    note_drop, note_union = set(), {}
    for kept, removed, start, end in coalesce(by_key, note_keys, index.note_start, index.note_end):
        note_drop.update(removed)
        note_union[kept] = (start, end - start)

    kernel_runs = label_runs(order, lane_tid, index.slice_label, starts, ends)
    labelled = sum(1 for label in index.slice_label if label >= 0)

    flow_tid = array("i", [-1]) * len(index.flow_ts)
    flows_mapped = flows_unmatched = 0
    for n, stream in enumerate(index.flow_stream):
        if stream not in old_streams:
            continue
        run = run_of(stream)
        target = starting_at(run, starts, index.flow_ts[n])
        if target is None:
            if strict:
                pid, tid = index.stream_keys[stream]
                raise TraceError(f"ac2g endpoint at ts {index.flow_ts[n]} on pid {pid} stream {tid} "
                                 "matches no slice start (--strict)")
            target = nearest_in_run(run, starts, ends, index.flow_ts[n])
            flows_unmatched += 1
        else:
            flows_mapped += 1
        flow_tid[n] = lane_tid[target]
    meta_drop = bytearray(1 if stream in old_streams else 0 for stream in index.meta_stream)

    spans = [Span(index.stream_keys[index.note_stream[n]][0], note_tid[n], index.label_names[index.note_name[n]],
                  *(_union_span(note_union[n]) if n in note_union else (index.note_start[n], index.note_end[n])))
             for n in mapped if n not in note_drop and index.note_name[n] >= 0]
    kernel_spans = [Span(lane_info[lane][0], note_track[lane], index.label_names[label], start, end)
                    for lane, label, start, end in kernel_runs]
    used_tracks = {(span.pid, span.tid) for span in spans + kernel_spans}

    appended: list[dict] = [
        {"name": span.name, "cat": "gpu_user_annotation", "ph": "X", "pid": span.pid, "tid": span.tid,
         "ts": span.start, "dur": span.end - span.start, "args": {}}
        for span in kernel_spans
    ]
    sort_index = 0
    for tid in sorted(lane_info, key=lambda t: (_pid_key(lane_info[t][0]), t)):
        pid, _, _, label = lane_info[tid]
        tracks = [(note_track[tid], f"{label} annotations")] if (pid, note_track[tid]) in used_tracks else []
        for track, name in tracks + [(tid, label)]:
            appended.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": track, "args": {"name": name}})
            appended.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": track,
                             "args": {"sort_index": sort_index}})
            sort_index += 1

    summary = {
        "measured_slices": count,
        "original_streams": len(old_streams),
        "compacted_lanes": len(lane_info),
        "slice_groups": _by_group_name(rules, index.slice_group),
        "lanes_by_group": dict(sorted(_lanes_by_group(rules, lane_info).items())),
        "gpu_flow_endpoints_mapped": flows_mapped,
        "gpu_flow_endpoints_unmatched": flows_unmatched,
        "gpu_annotations_mapped": len(mapped),
        "gpu_annotations_coalesced": len(note_drop),
        "kernel_annotations_converted": labelled,
        "kernel_annotation_blocks": len(kernel_runs),
        "gpu_annotations_retained": index.gpu_annotations - len(note_drop) + len(kernel_runs),
        "cuda_graph_launches": index.graph_launches,
    }
    if pp_flows:
        pp_rank, source = _pp_rank(members)
        compute_tracks = {(info[0], note_track[tid]) for tid, info in lane_info.items()
                          if rules.names[info[1]] == "compute" and info[2] == 0}
        unshard_tracks = {(info[0], note_track[tid]) for tid, info in lane_info.items()
                          if rules.names[info[1]] == "nccl_all_gather" and info[2] in (0, 1)}
        maker = ArrowMaker({pid: pp_rank for pid in pid_order})
        local_arrows(find_blocks(spans + kernel_spans, compute_tracks, unshard_tracks), maker)
        appended.extend(maker.events)
        summary.update(
            pp_rank=pp_rank, pp_rank_source=source,
            pp_compute_dependency_pairs=maker.pairs["pp_compute_dependency"],
            pp_compute_dependency_unmatched=maker.unmatched["pp_compute_dependency"],
            pp_unshard_compute_pairs=maker.pairs["pp_unshard_dependency"],
            pp_unshard_compute_unmatched=maker.unmatched["pp_unshard_dependency"],
        )
    return Compaction(lane_tid, note_tid, note_drop, note_union, flow_tid, meta_drop, appended, summary, count,
                      index.stream_keys, index.slice_stream, starts)


def _union_span(union: tuple[float, float]) -> tuple[float, float]:
    start, dur = union
    return start, start + dur


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
    """Pass 2: move slices, annotations and flow endpoints; drop old metadata."""

    def __init__(self, index: CompactIndex, compaction: Compaction, exact: bool) -> None:
        self.actions = index.actions
        self.compaction = compaction
        self._loads = _exact_loads if exact else orjson.loads
        self._cursor = [0, 0, 0, 0, 0]
        self._patchers = {SLICE: self._slice, ANNOTATION: self._annotation, FLOW: self._flow, METADATA: self._metadata}

    def patch_action(self, action: int, line: bytes) -> bytes | None:
        ordinal = self._cursor[action]
        self._cursor[action] = ordinal + 1
        return self._patchers[action](ordinal, line)

    def _retarget(self, line: bytes, tid: int, *, stream: bool = False, times: tuple | None = None) -> bytes:
        event = self._loads(line)
        event["tid"] = tid
        if stream:
            args = event.get("args")
            if isinstance(args, dict) and "stream" in args:
                args["stream"] = tid
        if times is not None:
            event["ts"], event["dur"] = times
        return dumps_event(event)

    def _slice(self, ordinal: int, line: bytes) -> bytes:
        plan = self.compaction
        event = self._loads(line)
        stream = plan.stream_keys[plan.slice_stream[ordinal]]
        if (event.get("pid"), event.get("tid")) != stream or float(event["ts"]) != plan.slice_start[ordinal]:
            raise TraceError(f"validation failed: GPU slice {ordinal} differs between the passes")
        tid = plan.lane_tid_of_slice[ordinal]
        event["tid"] = tid
        args = event.get("args")
        if isinstance(args, dict) and "stream" in args:
            args["stream"] = tid
        return dumps_event(event)

    def _annotation(self, ordinal: int, line: bytes) -> bytes | None:
        plan = self.compaction
        tid = plan.note_tid[ordinal]
        if tid < 0:
            return line
        if ordinal in plan.note_drop:
            return None
        return self._retarget(line, tid, times=plan.note_union.get(ordinal))

    def _flow(self, ordinal: int, line: bytes) -> bytes:
        tid = self.compaction.flow_tid[ordinal]
        return line if tid < 0 else self._retarget(line, tid)

    def _metadata(self, ordinal: int, line: bytes) -> bytes | None:
        return None if self.compaction.meta_drop[ordinal] else line

    def appended(self):
        written = self._cursor[SLICE]
        if written != self.compaction.slice_count:
            raise TraceError(f"validation failed: {written} GPU slices written, {self.compaction.slice_count} read")
        return (dumps_event(event) for event in self.compaction.appended)


def _exact_loads(line: bytes) -> dict:
    """Decode a spooled line keeping exact-mode numbers exact."""
    return json.loads(line, parse_float=Decimal)


def default_output(src: object) -> str:
    """``<name>_compacted.json.gz`` beside the input (``.json`` and ``.zst`` kept)."""
    if not isinstance(src, (str, os.PathLike)) or src == "-":
        raise TraceError("give an output path with -o when reading from stdin or a stream")
    path = os.fspath(src)
    for suffix in (".json.gz", ".json.zst", ".json"):
        if path.endswith(suffix):
            return path[: -len(suffix)] + "_compacted" + suffix
    return path + "_compacted.json.gz"


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
    dst = default_output(src) if dst is None else dst
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
