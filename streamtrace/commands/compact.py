"""``compact``: CUDA-graph stream compaction, streaming (SPEC 4).

Pass 1 (:class:`CompactIndex`) records GPU slices, GPU annotations, ac2g
endpoints and old-stream thread metadata in typed arrays.  Between the
passes :func:`plan_compaction` packs slices into lanes, maps annotations and
flow endpoints onto lanes, coalesces, builds per-kernel annotation spans and
rank-local PP arrows.  Pass 2 (:class:`CompactPlan`) patches the spooled event
lines and appends the new events.
"""
from __future__ import annotations

import itertools
import os
import re
import time
from array import array
from bisect import bisect_left
from collections import defaultdict
from contextlib import ExitStack
from dataclasses import dataclass, field
from operator import attrgetter, eq
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
from ..algo.parts import extend_converted, shifted, translated
from ..algo.pp import parse_pp_name
from ..algo.pparrows import COMPUTE_OPS, Arrow, ArrowMaker, Span, arrow_events, find_blocks, local_arrows
from ..algo.ranks import pp_group_ranks
from ..algo.rules import Rules
from ..engine.jobs import resolve_jobs
from ..engine.passes import IndexResult, emit_pass, index_pass
from ..engine.plan import EmitPlan, consume, patched_lines
from ..errors import TraceError
from ..io.configfiles import load_rules
from ..io.destinations import Destinations
from ..io.jsonscan import RawMember, member_value
from ..io.progress import Progress
from ..io.projection import ABSENT, ProjectedChunk, Projection
from ..io.reader import ReadStats, dumps_event, event_loader
from ..io.redact import RedactOptions, Redactor, redaction_summary
from ..io.sink import SinkSpec, default_output
from ..io.source import InputSource, SourceSpec
from ..io.spool import parked
from ..io.textfields import Convert, field_pattern, positions, swap_all, swap_in_lines, swap_one
from ..io.writer import JoinedLines
from ..kineto import NUMBER_TYPES
from ..resources import buffers_from_os, gc_paused, peak_rss_mb, trim_heap

SLICE_CATEGORIES = frozenset({"kernel", "Kernel", "gpu_memcpy", "gpu_memset"})
GRAPH_LAUNCH_NAMES = frozenset({"cudaGraphLaunch", "hipGraphLaunch"})
THREAD_METADATA = frozenset({"thread_name", "thread_sort_index"})
KEEP, SLICE, ANNOTATION, FLOW, METADATA = range(5)
RUNTIME = 5  # an event kind the index counts but pass 2 keeps
TID_GAP = 1000
TID_LIMIT = 2**31
STREAM_IDS = ("slice_stream", "note_stream", "flow_stream", "meta_stream")  # the index's arrays of stream ids
LABEL_IDS = ("slice_label", "note_name")  # its arrays of label ids (-1: none)
NO_STREAM_ARG, STREAM_ARG, ORIGINAL_KEPT = range(3)  # a slice's args.stream: none, an integer, one with
# args.original_stream already (a compacted trace compacted again: the first original stays)
PASS_1_CLOSURES = ("visit", "_rebind")  # the hot loop and its rebinder (CompactIndex._make_visit)
PART_ARRAYS = ("actions",) + STREAM_IDS + LABEL_IDS + (
    "slice_start", "slice_end", "slice_group", "slice_stream_arg", "note_start", "note_end", "note_identity",
    "flow_ts", "odd_tid_at")  # what pass 1 records per event (CompactIndex.take_part)
PASS_2_ONLY = ("actions", "slice_stream_arg")  # arrays the plan does not read: they wait on disk meanwhile
NOTE_TIMES = ("note_start", "note_end", "note_identity", "note_name")  # not read while lanes are packed: parked then
RUN_COLUMNS = ("lane", "label", "start", "end")  # the per-kernel spans: parked while annotations coalesce and in pass 2
PLAN_ONLY = ("slice_end", "slice_group", "slice_label", "note_start", "note_end", "note_identity", "note_name",
             "flow_ts")  # arrays pass 2 does not read: the plan releases them (CompactIndex.release)


class CompactIndex:
    """Pass-1 visitor: a byte per event saying what pass 2 does with it, and
    compact arrays for the events that move.

    Stream and label ids are held in 2-byte arrays (a trace has a few dozen
    streams and labels, millions of slices): the first id past their range
    widens them to 4 bytes (:meth:`_widen`).
    """

    splits_by_ranges = True  # pass-1 workers may index ranges of events: take_part / absorb

    def __init__(self, rules: Rules) -> None:
        self.rules = rules
        self.actions = bytearray()
        self.stream_ids: dict[tuple, int] = {}
        self.stream_keys: list[tuple] = []
        self.group_cache: dict[tuple, int] = {}
        self.label_ids: dict[str, int] = {}
        self.label_names: list[str] = []
        self.slice_stream = array("H")
        self.slice_start = array("d")
        self.slice_end = array("d")
        self.slice_group = array("B")
        self.slice_label = array("h")
        self.note_stream = array("H")
        self.note_start = array("d")
        self.note_end = array("d")
        self.note_identity = array("q")
        self.note_name = array("h")
        self.flow_stream = array("H")
        self.flow_ts = array("d")
        self.meta_stream = array("H")
        self.slice_stream_arg = bytearray()  # per slice: NO_STREAM_ARG, STREAM_ARG or ORIGINAL_KEPT
        self.int_tids: set[int] = set()
        self.odd_tid_at = array("q")  # events whose tid is not an integer (or is missing)
        self.graph_launches = 0
        self.gpu_annotations = 0
        self._streams_taken = self._labels_taken = 0  # ids already handed out in parts (take_part)
        self._part_maps: dict[int, tuple[array, array]] = {}  # per worker: its stream and label ids -> ours
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

        def rebind() -> None:
            """Point the loop at the id arrays :meth:`_widen` replaced."""
            nonlocal slice_stream, slice_label, flow_stream
            slice_stream, slice_label, flow_stream = (self.slice_stream.append, self.slice_label.append,
                                                      self.flow_stream.append)

        self._rebind = rebind

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
                    if stream is None:
                        stream = new_stream(key)  # (may widen the id arrays: the appender is read after it)
                    flow_stream(stream)
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
                if stream is None:
                    stream = new_stream(key)
                slice_stream(stream)
                slice_start(ts)
                slice_end(end)
                name = get("name")
                by_name = group_cache.get(kind_key := get("cat"))
                group = by_name.get(name) if by_name is not None else None
                slice_group(classify(kind_key, name) if group is None else group)
                args = get("args")
                if args.__class__ is dict:
                    label = args.get("name")
                    slice_stream_arg(NO_STREAM_ARG if args.get("stream").__class__ is not int
                                     else ORIGINAL_KEPT if "original_stream" in args else STREAM_ARG)
                else:
                    label = None
                    slice_stream_arg(0)
                if label.__class__ is str and label:
                    found = label_ids.get(label)
                    if found is None:
                        found = new_label(label)
                    slice_label(found)
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

    projection = Projection({"ph": None, "cat": None, "name": None, "pid": None, "tid": None, "ts": None, "dur": 0,
                             "args": {"name": None, "stream": None, "original_stream": ABSENT}})
    """The members :meth:`visit` reads: pass-1 workers decode only these (:meth:`visit_projected`)."""

    def visit_projected(self, chunk: ProjectedChunk) -> bool:
        """Index a chunk's events as :meth:`visit` would, a column at a time:
        the kinds of events from their categories and phases in C calls,
        GPU slices and flows as arrays; per-event Python only for GPU
        annotations and thread metadata, and for streams and labels seen
        for the first time (numbered in event order, as :meth:`visit`
        numbers them).  Anything unusual (a slice without pid, times that
        are not numbers, a value that cannot be a key) raises or returns
        False: the chunk is then read event by event, which reports it
        (this index is not used again)."""
        events = chunk.events
        first = len(self.actions)
        codes = np.frombuffer(bytes(map(_KIND_CODES.get, map(_CAT, events), itertools.repeat(KEEP))), np.uint8)
        phases = np.frombuffer(bytes(map(_PHASE_CODES.get, map(_PH, events), itertools.repeat(0))), np.uint8)
        tids = list(map(_TID, events))
        if set(map(type, tids)) == _INTS:
            self.int_tids.update(tids)
        else:
            for position, tid in enumerate(tids):
                if tid.__class__ is int:
                    self.int_tids.add(tid)
                else:
                    self.odd_tid_at.append(first + position)
        actions = np.zeros(len(events), np.uint8)
        streamed: list[tuple[list[int], list]] = []  # per kind: the positions of events with a stream, and their keys
        labelled: list[tuple[list[int], list]] = []  # the same for labels (None: none)

        def keys(at: list[int]) -> list[tuple]:
            return list(zip(map(_PID, map(events.__getitem__, at)), map(tids.__getitem__, at)))

        slices = np.flatnonzero((codes == SLICE) & (phases == _TIMED)).tolist()
        if slices:
            slice_events = list(map(events.__getitem__, slices))
            starts, ends = _spans(slice_events)
            if None in map(_PID, slice_events):
                return False
            groups = self._groups(list(map(_CAT, slice_events)), list(map(_NAME, slice_events)))
            stream_args, texts = _slice_args(list(map(_ARGS, slice_events)))
            streamed.append((slices, keys(slices)))
            labelled.append((slices, texts))
        flows = np.flatnonzero(codes == FLOW).tolist()
        if flows and not set(map(type, map(_TS, map(events.__getitem__, flows)))) <= _PLAIN_TIMES:
            flows = [position for position in flows if events[position].ts.__class__ in NUMBER_TYPES]
        flow_keys = keys(flows)
        if flows:
            streamed.append((flows, flow_keys))
        meta = [position for position in np.flatnonzero((codes == KEEP) & (phases == _METADATA)).tolist()
                if events[position].name in THREAD_METADATA]
        meta_keys = keys(meta)
        if meta:
            streamed.append((meta, meta_keys))
        notes = np.flatnonzero(codes == ANNOTATION)
        timed_notes = notes[phases[notes] == _TIMED].tolist()
        if timed_notes:
            note_starts, note_ends = _spans(list(map(events.__getitem__, timed_notes)))
            note_keys = keys(timed_notes)
            streamed.append((timed_notes, note_keys))
            labelled.append((timed_notes, [name if name.__class__ is str else None
                                           for name in map(_NAME, map(events.__getitem__, timed_notes))]))
        runtime = np.flatnonzero(codes == RUNTIME).tolist()
        graph_launches = sum(map(GRAPH_LAUNCH_NAMES.__contains__, map(_NAME, map(events.__getitem__, runtime))))
        stream_of = self._intern(streamed, self.stream_ids, self._new_stream)
        label_of = self._intern(labelled, self.label_ids, self._new_label)
        if slices:
            self.slice_stream.extend(map(stream_of.__getitem__, streamed[0][1]))
            self.slice_start.frombytes(starts.tobytes())
            self.slice_end.frombytes(ends.tobytes())
            self.slice_group.frombytes(groups)
            self.slice_stream_arg += stream_args
            self.slice_label.extend(map(label_of.get, texts, itertools.repeat(-1)))
            actions[slices] = SLICE
        if flows:
            self.flow_stream.extend(map(stream_of.__getitem__, flow_keys))
            self.flow_ts.extend(map(float, map(_TS, map(events.__getitem__, flows))))
            actions[flows] = FLOW
        if meta:
            self.meta_stream.extend(map(stream_of.__getitem__, meta_keys))
            actions[meta] = METADATA
        if timed_notes:
            self.note_stream.extend(map(stream_of.__getitem__, note_keys))
            self.note_start.frombytes(note_starts.tobytes())
            self.note_end.frombytes(note_ends.tobytes())
            self.note_identity.extend(_identity_hashes(chunk.whole(timed_notes)))
            self.note_name.extend(map(label_of.get, labelled[-1][1], itertools.repeat(-1)))
            actions[timed_notes] = ANNOTATION
        self.gpu_annotations += len(notes)
        self.graph_launches += graph_launches
        self.actions += actions.tobytes()
        return True

    def _groups(self, categories: list, names: list) -> bytes:
        """The rule group of each slice (category, name), classifying each pair once."""
        found: dict[tuple, int] = {}
        for pair in set(zip(categories, names)):
            by_name = self.group_cache.get(pair[0])
            group = by_name.get(pair[1]) if by_name is not None else None
            found[pair] = self._classify(*pair) if group is None else group
        return bytes(map(found.__getitem__, zip(categories, names)))

    @staticmethod
    def _intern(kinds: list[tuple[list[int], list]], ids: dict, new: Callable[[object], int]) -> dict:
        """The id of every key the kinds' events hold (None: the event holds
        none), numbering the new ones in the order of the events first holding them."""
        distinct = set().union(*(held for _, held in kinds))
        distinct.discard(None)
        unseen = distinct.difference(ids)
        if unseen:
            first: dict = {}
            for at, held in kinds:
                earliest = dict(zip(reversed(held), reversed(at)))  # each key's first position among the kind's events
                for key in unseen.intersection(earliest):
                    position = earliest[key]
                    if position < first.get(key, position + 1):
                        first[key] = position
            for key in sorted(unseen, key=first.__getitem__):
                new(key)
        return {key: ids[key] for key in distinct}

    def take_part(self) -> dict:
        """What this index holds of the events visited since the last part,
        with the streams and labels first met since then; the index then
        starts empty again (in place: the hot loop keeps its appenders)."""
        part: dict = {name: getattr(self, name)[:] for name in PART_ARRAYS}
        for name in PART_ARRAYS:
            del getattr(self, name)[:]
        part["stream_keys"] = self.stream_keys[self._streams_taken:]
        part["label_names"] = self.label_names[self._labels_taken:]
        self._streams_taken, self._labels_taken = len(self.stream_keys), len(self.label_names)
        part["int_tids"] = set(self.int_tids)
        self.int_tids.clear()
        part["counts"] = (self.graph_launches, self.gpu_annotations)
        self.graph_launches = self.gpu_annotations = 0
        return part

    def absorb(self, part: dict, source: int, first_event: int) -> None:
        """Append a worker's part (see :mod:`streamtrace.engine.indexworkers`)."""
        stream_map, label_map = self._part_maps.setdefault(source, (array("i"), array("i")))
        stream_map.extend(self._stream_key(key) for key in part["stream_keys"])
        label_map.extend(self._label(text) for text in part["label_names"])
        for name in PART_ARRAYS:
            if name in STREAM_IDS:
                extend_converted(getattr(self, name), translated(part[name], stream_map))
            elif name in LABEL_IDS:
                extend_converted(getattr(self, name), translated(part[name], label_map))
            elif name == "odd_tid_at":
                extend_converted(self.odd_tid_at, shifted(part[name], first_event))
            else:
                getattr(self, name).extend(part[name])
        self.int_tids |= part["int_tids"]
        graph_launches, gpu_annotations = part["counts"]
        self.graph_launches += graph_launches
        self.gpu_annotations += gpu_annotations

    def __getstate__(self) -> dict:
        """Everything but the hot-loop closures (which cannot be pickled)."""
        return {name: value for name, value in self.__dict__.items() if name not in PASS_1_CLOSURES}

    def release(self, *names: str) -> None:
        """Drop arrays of :data:`PLAN_ONLY` once the plan is done with them:
        the plan's own arrays then take their room, and pass 2 runs beside
        the plan's results instead of the whole index.  The pass-1 closures,
        which hold every array's ``append``, go first: pass 1 is over."""
        for name in PASS_1_CLOSURES + names:
            if name not in PLAN_ONLY + PASS_1_CLOSURES:
                raise ValueError(f"pass 2 reads {name}")
            self.__dict__.pop(name, None)
        trim_heap()

    def _widen(self, names: tuple[str, ...]) -> None:
        """Turn 2-byte id arrays into 4-byte ones (once, at the first id past
        their range) and rebind the hot loop's appenders to them."""
        for name in names:
            setattr(self, name, array("i", getattr(self, name)))
        self._rebind()

    def _metadata(self, event: dict) -> int:
        if event.get("name") not in THREAD_METADATA:
            return KEEP
        stream = self._stream(event)
        self.meta_stream.append(stream)
        return METADATA

    def _stream(self, event: dict) -> int:
        return self._stream_key((event.get("pid"), event.get("tid")))

    def _stream_key(self, key: tuple) -> int:
        found = self.stream_ids.get(key)
        return self._new_stream(key) if found is None else found

    def _new_stream(self, key: tuple) -> int:
        found = self.stream_ids[key] = len(self.stream_keys)
        self.stream_keys.append(key)
        if found == 1 << 16:
            self._widen(STREAM_IDS)
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
        if found == 1 << 15:
            self._widen(LABEL_IDS)
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
        stream = self._stream(event)  # (ids may widen: the arrays are read after)
        label = self._label(name) if name.__class__ is str else -1
        self.note_stream.append(stream)
        self.note_start.append(start)
        self.note_end.append(end)
        self.note_identity.append(_identity_hash(event))
        self.note_name.append(label)
        return ANNOTATION


_CAT, _PH, _TID, _PID, _NAME, _ARGS, _TS = (attrgetter(name) for name in ("cat", "ph", "tid", "pid", "name", "args", "ts"))
_INTS = {int}
_TIMED, _METADATA = 1, 2
_PHASE_CODES = {"X": _TIMED, "M": _METADATA}
_KIND_CODES = {**dict.fromkeys(SLICE_CATEGORIES, SLICE), "gpu_user_annotation": ANNOTATION, "ac2g": FLOW,
               "cuda_runtime": RUNTIME, "cuda_driver": RUNTIME}
_PLAIN_TIMES = {float, int}


def _json_numbers(texts: list[bytes]) -> np.ndarray | None:
    """Number texts as floats, read by one orjson call (a seventh of the time of numpy's
    text-to-float cast); None when one is no JSON number orjson reads."""
    try:
        return np.array(orjson.loads(b"[" + b",".join(texts) + b"]"), dtype=np.float64)
    except orjson.JSONDecodeError:  # what orjson refuses; its ints and floats all convert
        return None


def _spans(events: list) -> tuple[np.ndarray, np.ndarray]:
    """Start and end of each projected GPU slice or annotation, as :meth:`CompactIndex.visit` finds them;
    TraceError (read event by event instead, which says where) for times that are not plain numbers or a negative dur."""
    starts, durations = list(map(_TS, events)), list(map(attrgetter("dur"), events))
    if not set(map(type, starts)) <= _PLAIN_TIMES or not set(map(type, durations)) <= _PLAIN_TIMES:
        raise TraceError("GPU event needs numeric ts and dur")
    start, duration = np.array(starts, dtype=np.float64), np.array(durations, dtype=np.float64)
    if (duration < 0).any():
        raise TraceError("GPU event has a negative dur")
    return start, start + duration


def _slice_args(argses: list) -> tuple[bytes, list]:
    """Per projected GPU slice from its ``args``: what its ``args.stream`` is
    (NO_STREAM_ARG, STREAM_ARG, ORIGINAL_KEPT) and its label (``args.name``
    when a non-empty string, else None), as :meth:`CompactIndex.visit` reads them."""
    if None in argses:
        return (bytes(NO_STREAM_ARG if args is None else _stream_arg(args) for args in argses),
                [None if args is None else _label_text(args.name) for args in argses])
    kinds = bytes(map(_STREAM_ARG_KINDS.get, map(type, map(attrgetter("stream"), argses)), itertools.repeat(NO_STREAM_ARG)))
    if list(map(attrgetter("original_stream"), argses)).count(ABSENT) != len(argses):
        kinds = bytes(map(_stream_arg, argses))
    texts = list(map(_NAME, argses))
    if not set(map(type, texts)) <= _STRINGS or "" in texts:  # each distinct value that is no label to None, in C
        no_label = {text: None for text in set(texts) if _label_text(text) is None}
        texts = list(map(no_label.get, texts, texts))
    return kinds, texts


_STREAM_ARG_KINDS = {int: STREAM_ARG}
_STRINGS = {str}


def _stream_arg(args: object) -> int:
    if args.stream.__class__ is not int:
        return NO_STREAM_ARG
    return STREAM_ARG if args.original_stream is ABSENT else ORIGINAL_KEPT


def _label_text(label: object) -> str | None:
    """A slice's label text (``args.name``), or None when it has none."""
    return label if label.__class__ is str and label else None


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


def _identity_hashes(events: list[dict]) -> list[int]:
    """:func:`_identity_hash` of each event; annotations in Kineto's key set
    whose args orjson writes as they are (as the fast reading decodes them)
    without a call per event."""
    if all(map(eq, map(dict.keys, events), itertools.repeat(KINETO_ANNOTATION_KEYS))):
        try:
            return [hash((event["ph"], event["cat"], event["name"], event["pid"],
                          orjson.dumps(event["args"], option=orjson.OPT_SORT_KEYS))) for event in events]
        except TypeError:
            pass
    return list(map(_identity_hash, events))


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
        self.counters = self._counters = {kind: itertools.count() for kind in (SLICE, ANNOTATION, FLOW, METADATA)}
        self._slices = self._counters[SLICE]
        self.patchers = [None, self._slice_patcher(index), self._annotation_patcher(),
                         self._flow_patcher(), self._metadata_patcher()]
        self._cursor = [0, {SLICE: 0, ANNOTATION: 0, FLOW: 0, METADATA: 0}]  # next event, ordinals there
        self._new_tids = set(compaction.lane_info) | set(compaction.note_track.values())  # every tid a line moves to
        self._tid_texts: dict[bytes, dict[int, bytes]] = {}
        self._parked_runs = ExitStack()
        self._stream_formats = {STREAM_ARG: _STREAM_AND_ORIGINAL if compaction.original_stream else _STREAM_ONLY,
                                ORIGINAL_KEPT: _STREAM_ONLY}  # a slice's new args.stream text, by the kind of its old one

    def lines(self, block: list[bytes], first_index: int) -> list[bytes] | JoinedLines:
        moved = self.moved_block(block, first_index)
        if moved is not None:
            lines, tids = moved.kept()
            joined = self.streams_swapped(moved, lines)
            if joined is not None:
                joined = swap_all(_TID_KEY, joined, self.tid_swap(tids, b'"tid":'), len(lines))
            if joined is not None:
                moved.commit()
                return JoinedLines(joined, len(lines))
        return patched_lines(self, block, first_index)

    def streams_swapped(self, moved: "MovedBlock", kept: list[bytes]) -> bytes | None:
        """The kept lines joined, ``args.stream`` of their slices swapped: by
        one split of the whole text when it holds as many ``"stream"`` keys
        as slices with one (each such slice holds one at least, spelled so
        the key pattern finds it, so then each exactly one and no other line
        any); else by one split of the slices' lines (another event holds
        such a key).  None when a slice does not allow the change."""
        joined = b"\n".join(kept)
        streamed = moved.stream_kinds.translate(_HAS_STREAM_ARG)
        chosen = list(itertools.compress(moved.lanes, streamed))
        if not chosen:
            return joined
        convert = self._stream_texts(moved.stream_kinds.translate(None, _NO_STREAM_ARG), chosen)
        swapped = swap_all(_STREAM_KEY, joined, convert, len(chosen))
        if swapped is not None:
            return swapped
        if not swap_in_lines(moved.lines, list(itertools.compress(moved.slice_at, streamed)), _STREAM_KEY, convert):
            return None
        return b"\n".join(moved.kept()[0])

    def _stream_texts(self, kinds: bytes, lanes: list[int] | tuple[int, ...]) -> Convert:
        """New ``args.stream`` texts for slices that have one, in order, by
        the kind of their old one (STREAM_ARG or ORIGINAL_KEPT) and their
        lanes: the old number, as the line spells it, kept as
        ``args.original_stream`` unless one is there or the compaction
        leaves it out."""
        formats = list(map(self._stream_formats.__getitem__, kinds))
        return lambda numbers: map(bytes.__mod__, formats, zip(lanes, numbers))

    def tid_swap(self, tids: array, prefix: bytes) -> Convert:
        """New texts (``prefix`` + tid) for the tids of a moved block's kept
        lines in order: the lane tid, or the old number where it stays."""
        texts = self._tid_texts.get(prefix)
        if texts is None:
            texts = self._tid_texts[prefix] = {tid: prefix + b"%d" % tid for tid in self._new_tids}
        return lambda numbers: map(texts.get, tids, map(prefix.__add__, numbers))

    def moved_block(self, block: list[bytes], first: int) -> "MovedBlock | None":
        """The block with compaction's moves decided (each line's new tid and
        ``args.stream``, the lines to drop) and done where they concern a
        few lines (retimed annotations), or None when the block must go
        through the per-line patchers (an event without an integer tid).
        Nothing changes until :meth:`MovedBlock.commit`."""
        end = first + len(block)
        bases, counts = self._bases(first, end)
        odd = self._index.odd_tid_at
        at = bisect_left(odd, first)
        if at < len(odd) and odd[at] < end:
            return None
        actions = self.actions[first:end]
        plan = self.compaction
        lines = list(block)
        slice_at = positions(actions, SLICE)
        s0 = bases[SLICE]
        lanes = plan.lane_tid_of_slice[s0:s0 + len(slice_at)]
        self._check_slices(lines, slice_at, s0)
        tids = np.full(len(block), -1, dtype=np.intc)
        tids[slice_at] = np.frombuffer(lanes, dtype=np.intc)
        tids[positions(actions, FLOW)] = _ordinals(plan.flow_tid, np.intc, bases[FLOW], counts[FLOW])
        note_at = np.array(positions(actions, ANNOTATION), dtype=np.intp)
        note_tids = _ordinals(plan.note_tid, np.intc, bases[ANNOTATION], len(note_at))
        placed = note_tids >= 0
        dropped = placed & (_ordinals(plan.note_drop, np.uint8, bases[ANNOTATION], len(note_at)) != 0)
        placed &= ~dropped
        placed_at = note_at[placed]
        tids[placed_at] = note_tids[placed]
        if len(plan.note_union):
            placed_ordinals = bases[ANNOTATION] + np.flatnonzero(placed)
            retimed = plan.note_union.among(placed_ordinals)
            for ordinal, position in zip(placed_ordinals[retimed].tolist(), placed_at[retimed].tolist()):
                lines[position] = self._annotation_line(block[position], ordinal)
        drop = np.zeros(len(block), dtype=bool)
        drop[note_at[dropped]] = True
        meta_at = np.array(positions(actions, METADATA), dtype=np.intp)
        drop[meta_at[_ordinals(plan.meta_drop, np.uint8, bases[METADATA], len(meta_at)) != 0]] = True
        keep = bytearray((~drop).view(np.uint8).tobytes()) if drop.any() else None
        new_tids = array("i", tids.tobytes())
        return MovedBlock(lines, new_tids, keep, lambda: self._skip(counts), slice_at, lanes,
                          self._index.slice_stream_arg[s0:s0 + len(slice_at)])

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
            consume(self._counters[kind], count)

    def skip(self, start: int, end: int) -> None:
        if start != end:
            self._bases(start, end)  # the block cursor moves past the events, as for a block written here
            super().skip(start, end)

    def _retarget(self, line: bytes, tid: int, *, stream_kind: int = NO_STREAM_ARG,
                  times: tuple | None = None) -> bytes:
        """Move an event line to ``tid`` (a slice's ``args.stream`` too, by its
        kind from pass 1) with the same text changes a moved block makes, so
        that a line comes out the same whichever way its block went; decode,
        change and re-encode where the text does not allow them (a key not
        there once before an integer) or the times change too."""
        if times is None:
            moved = swap_one(line, _TID_KEY, lambda numbers: (b'"tid":%d' % tid,))
            if moved is not None and stream_kind != NO_STREAM_ARG:
                moved = swap_one(moved, _STREAM_KEY, self._stream_texts(bytes((stream_kind,)), (tid,)))
            if moved is not None:
                return moved
        event = self._loads(line)
        event["tid"] = tid
        if stream_kind != NO_STREAM_ARG:
            args = event["args"]
            if stream_kind == STREAM_ARG and self.compaction.original_stream:
                args["original_stream"] = args["stream"]
            args["stream"] = tid
        if times is not None:
            event["ts"], event["dur"] = times
        return dumps_event(event)

    def _check_slices(self, lines: list[bytes], slice_at: list[int], first_ordinal: int) -> None:
        """:meth:`_check_slice` for a block's slices at once: their start
        times found by one search of the lines joined and compared as
        arrays; only when that does not line up (a line with a second
        ``"ts":`` inside its args) are the lines checked one by one."""
        if not slice_at:
            return
        found = _TS_FIELD.findall(b"\n".join(map(lines.__getitem__, slice_at)))
        if len(found) == len(slice_at):
            expected = np.frombuffer(self._index.slice_start, dtype=np.float64)
            starts = _json_numbers(found)
            if starts is not None and np.array_equal(starts, expected[first_ordinal:first_ordinal + len(found)]):
                return
        for ordinal, position in enumerate(slice_at, first_ordinal):
            self._check_slice(lines[position], ordinal)

    def _check_slice(self, line: bytes, ordinal: int) -> None:
        """The line's start time is the one pass 1 read: found in the text,
        or, where the text does not show it plainly (a space after a colon,
        a key given twice: the input's own text), in the decoded line."""
        expected = self._index.slice_start[ordinal]
        start = _TS_FIELD.search(line)
        if start is not None and float(start.group(1)) == expected:
            return
        ts = self._loads(line).get("ts")
        if ts.__class__ not in NUMBER_TYPES or float(ts) != expected:
            raise TraceError(f"validation failed: GPU slice {ordinal} differs between the passes")

    def _slice_patcher(self, index: CompactIndex) -> Callable[[bytes], bytes]:
        kinds, lane_tids = index.slice_stream_arg, self.compaction.lane_tid_of_slice
        retarget, counter, check = self._retarget, self._slices, self._check_slice

        def patch(line: bytes) -> bytes:
            ordinal = next(counter)
            check(line, ordinal)
            return retarget(line, lane_tids[ordinal], stream_kind=kinds[ordinal])

        return patch

    def _annotation_line(self, line: bytes, ordinal: int) -> bytes | None:
        plan = self.compaction
        tid = plan.note_tid[ordinal]
        if tid < 0:
            return line
        if plan.note_drop[ordinal]:
            return None
        return self._retarget(line, tid, times=plan.note_union.get(ordinal))

    def _annotation_patcher(self) -> Callable[[bytes], bytes | None]:
        counter, patch = self._counters[ANNOTATION], self._annotation_line
        return lambda line: patch(line, next(counter))

    def _flow_patcher(self) -> Callable[[bytes], bytes]:
        tids, counter, retarget = self.compaction.flow_tid, self._counters[FLOW], self._retarget

        def patch(line: bytes) -> bytes:
            ordinal = next(counter)
            tid = tids[ordinal]
            return line if tid < 0 else retarget(line, tid)

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

    def park_runs(self, directory: str | None) -> None:
        """Keep the per-kernel spans on disk until :meth:`appended` writes
        them: the blocks of pass 2 read none of them."""
        self._parked_runs.enter_context(parked(self.compaction.kernel_runs, RUN_COLUMNS, directory))

    def appended(self) -> Iterator[bytes]:
        self.check_slices_written()
        self._parked_runs.close()
        return self.compaction.new_lines()


@dataclass
class MovedBlock:
    """A block of lines on its way through compaction: every line (changed
    where changes are per line), each line's new tid (-1: it stays; None:
    no compaction), which lines to keep (None: all), ``commit`` to call
    once the block is written, and where its slices are, their lanes and
    what their ``args.stream`` is (NO_STREAM_ARG, STREAM_ARG, ORIGINAL_KEPT)."""

    lines: list[bytes]
    new_tids: array | None
    keep: bytearray | None
    commit: Callable[[], None]
    slice_at: list[int] = field(default_factory=list)
    lanes: array = field(default_factory=lambda: array("i"))
    stream_kinds: bytearray = field(default_factory=bytearray)

    def kept(self) -> tuple[list[bytes], array | None]:
        """The kept lines and their new tids."""
        if self.keep is None:
            return self.lines, self.new_tids
        return list(itertools.compress(self.lines, self.keep)), array("i", itertools.compress(self.new_tids, self.keep))


_TID_KEY = field_pattern(b'"tid":', spaced=True)
_STREAM_KEY = field_pattern(b'"stream":', spaced=True)
_STREAM_AND_ORIGINAL = b'"stream":%d,"original_stream":%b'  # the lane, then the old number's text (spaces before it kept)
_STREAM_ONLY = b'"stream":%d%.0b'  # the lane (the old number's text, the second value, left out)
_HAS_STREAM_ARG = bytes(0 if kind == NO_STREAM_ARG else 1 for kind in range(256))  # slice_stream_arg kinds -> selectors
_NO_STREAM_ARG = bytes((NO_STREAM_ARG,))  # the kind to delete for the kinds of the slices with an args.stream


def _ordinals(values: array | bytearray, dtype: type, first: int, count: int) -> np.ndarray:
    """``values[first:first + count]`` as numpy, without a copy."""
    return np.frombuffer(values, dtype=dtype, count=count, offset=first * np.dtype(dtype).itemsize)


_TS_FIELD = re.compile(rb'"ts":[ \t]*(-?[0-9][0-9.eE+-]*)[ \t]*[,}]')


def no_slices_notice(stats: ReadStats) -> str:
    """Why nothing was compacted; a salvaged input usually lost its GPU events."""
    notice = "no GPU kernel/memcpy/memset slices: trace passed through unchanged"
    if stats.truncated:
        notice += ("; the input was cut off and --salvage kept its first part, but the profiler writes GPU "
                   "events last, so a cut trace often has none")
    return notice


def compact(
    src: SourceSpec,
    dst: SinkSpec | None = None,
    *,
    rules: str | None = None,
    pp_flows: bool = True,
    strict: bool = False,
    original_stream: bool = True,
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
    """Compact GPU streams into semantic lanes (the ``compact`` command); returns the summary.

    ``jobs``: busy processes (see :func:`~streamtrace.engine.jobs.resolve_jobs`);
    ``original_stream``: keep each moved slice's stream as ``args.original_stream``.
    """
    started = time.perf_counter()
    processes = resolve_jobs(jobs)
    chosen_rules = load_rules(rules)
    dst = default_output(src, "_compacted") if dst is None else dst
    with InputSource(src, spool_dir=spool_dir, reread_remote=reread_remote) as source:
        destinations = Destinations([source.location], overwrite=overwrite, summary=summary_file)
        target = destinations.target(dst, compress=compress, level=level, redactor=Redactor.from_options(redact))
        meter = Progress(source.size, enabled=progress)
        with buffers_from_os(PLAN_MMAP_THRESHOLD):  # the index arrays grow by copies, which must not stay resident
            result: IndexResult = index_pass(source, lambda: CompactIndex(chosen_rules), keep_events=True,
                                             spool_dir=spool_dir, salvage=salvage, progress=meter, jobs=processes)
        index: CompactIndex = result.visitor  # type: ignore[assignment]
        members = result.stats.header + result.stats.trailer
        try:
            if not index.slice_start:
                plan: EmitPlan = EmitPlan()
                summary = {"notice": no_slices_notice(result.stats), "measured_slices": 0}
            else:
                index.release()  # (pass 1's closures, which hold the arrays to park)
                with parked(index, PASS_2_ONLY, spool_dir):
                    compaction = plan_compaction(index, members, pp_flows=pp_flows, strict=strict,
                                                 original_stream=original_stream, scratch=spool_dir)
                plan = CompactPlan(index, compaction, result.stats.exact_numbers)
                plan.park_runs(spool_dir)
                summary = compaction.summary
        except BaseException:
            result.spool.close()
            raise
        planned = time.perf_counter()
        written = emit_pass(result, plan, target, progress=meter, jobs=processes)
    return destinations.finish({
        **source.describe(),
        "output": target.name,
        **summary,
        "events_read": result.stats.events,
        "events_written": written,
        "read": result.stats.as_dict(),
        "pass1_seconds": round(result.seconds, 3),
        "plan_seconds": round(planned - started - result.seconds, 3),
        **redaction_summary(target.redactor),
        "wall_seconds": round(time.perf_counter() - started, 3),
        "peak_rss_mb": peak_rss_mb(),
    })
