"""``compact``'s pass 2: :class:`CompactPlan` patches the spooled event lines (moved slices,
annotations and flow endpoints, dropped metadata) and appends the new events."""
from __future__ import annotations

import itertools
import re
from array import array
from bisect import bisect_left
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np

from ..engine.plan import EmitPlan, consume, patched_lines
from ..errors import TraceError
from ..io.eventtext import dumps_event, event_loader
from ..io.spool import parked
from ..io.textfields import Convert, field_pattern, positions, swap_all, swap_in_lines, swap_one
from ..io.writer import JoinedLines
from ..kineto import NUMBER_TYPES
from .compactindex import (
    ANNOTATION,
    FLOW,
    METADATA,
    NO_STREAM_ARG,
    ORIGINAL_KEPT,
    RUN_COLUMNS,
    SLICE,
    STREAM_ARG,
    CompactIndex,
    json_numbers,
)
from .compactplan import Compaction


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
            starts = json_numbers(found)
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
