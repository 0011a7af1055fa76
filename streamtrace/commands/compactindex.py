"""``compact``'s pass 1: :class:`CompactIndex`, what every GPU slice, annotation, flow endpoint
and old-stream metadata event needs for the plan, in typed arrays (``merge`` indexes each rank with it too)."""
from __future__ import annotations

import itertools
from array import array
from operator import attrgetter, eq
from typing import Callable

import numpy as np
import orjson

from ..algo.parts import extend_converted, shifted, translated
from ..algo.rules import Rules
from ..errors import TraceError
from ..io.eventtext import dumps_event
from ..io.projection import ABSENT, ProjectedChunk, Projection
from ..kineto import NUMBER_TYPES
from ..resources import trim_heap

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


def json_numbers(texts: list[bytes]) -> np.ndarray | None:
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
