"""Reader: the events of a trace, one by one.

The bytes pass through repair filters on their way to the parser; the first
bytes go to the header scanner, the last ones are kept for the trailer scan.
The body of the events array is parsed a chunk at a time by a C parser
(orjson, or the json module in exact mode), several times faster than a
token stream; the last chunk, and everything after anything the chunk parser
refuses, goes through ijson's C backend, which owns the error messages,
truncation handling and the keys after the array.
Numbers are read as floats (fast) unless the trace holds integers beyond
64 bits, in which case the engine rereads in exact mode (Decimal floats,
written back out with their original text).
"""
from __future__ import annotations

import os
import re
import sys
from collections import deque
from dataclasses import dataclass, field
from typing import Generator, Iterator, Protocol

import ijson
import orjson

from ..errors import RobustModeNeeded, TraceError, TransferError
from . import jsonscan
from .chunkcut import (
    ONLY_DICTS,
    array_ends,
    chunk_loads_exact,
    chunk_loads_fast,
    cut_candidates,
    likely_cut,
    parse_up_to,
    usual_cut,
)
from .eventtext import loads_exact, value_kind
from .repair import ControlCharRepair, Utf8Repair
from .source import DecodedStream, TruncatedInput

PARSE_CHUNK = 64 * 1024  # larger chunks make ijson slower (more pending items per call)
CHUNK_PARSE_BYTES = 1 << 20  # events parsed at once: ~4k, a few MB of dicts
CHUNK_PARSE_LIMIT = 32 << 20  # no event boundary found within this: leave the rest to ijson
IJSON_BATCH = 512  # events ijson hands out at a time
HEADER_LIMIT = 64 << 20
TAIL_WINDOW = 8 << 20
CUT_WINDOW = 64 << 10  # the bytes at a chunk's end where its cut is looked for, when the chunk itself is read elsewhere
TRAILER_FIRST_TRY = 1 << 20  # the trailer is scanned in this much of the tail first: the whole window is rarely needed

_warned_backend = False


def warn_if_slow_backend() -> None:
    """Say once that the pure-Python ijson backend is about 10x slower."""
    global _warned_backend
    if not _warned_backend and not ijson.backend.startswith("yajl2_c"):
        _warned_backend = True
        print(
            f"streamtrace: warning: ijson C backend unavailable (using {ijson.backend}); reading is ~10x slower",
            file=sys.stderr,
        )


@dataclass(frozen=True)
class ReadMode:
    """How strictly to parse: escalated when the fast mode meets odd input."""

    exact_numbers: bool = False
    repair_strings: bool = False


@dataclass
class ReadStats:
    """What one reading found out about the stream itself."""

    form: str = ""
    events: int = 0
    bytes_decompressed: int = 0
    bytes_raw: int = 0
    compression: str = "none"
    invalid_utf8_repaired: int = 0
    control_chars_repaired: int = 0
    exact_numbers: bool = False
    truncated: bool = False
    unterminated_array: bool = False
    header: list[jsonscan.RawMember] = field(default_factory=list)
    trailer: list[jsonscan.RawMember] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {
            "form": self.form,
            "compression": self.compression,
            "bytes_raw": self.bytes_raw,
            "bytes_decompressed": self.bytes_decompressed,
            "events": self.events,
            "invalid_utf8_repaired": self.invalid_utf8_repaired,
            "control_chars_repaired": self.control_chars_repaired,
            "exact_numbers": self.exact_numbers,
            "truncated_salvaged": self.truncated,
            "unterminated_array": self.unterminated_array,
        }


class _Feed:
    """The file object ijson reads: filters, header scan, tail window."""

    def __init__(self, stream: DecodedStream, mode: ReadMode, on_chunk) -> None:
        self._stream = stream
        self._utf8 = Utf8Repair()
        self._control = ControlCharRepair() if mode.repair_strings else None
        self._on_chunk = on_chunk
        self._primed: deque[tuple[int, bytes]] = deque()  # (offset, bytes) replayed before reading on
        self._tail: deque[bytes] = deque()
        self._tail_size = 0
        self.tail_trimmed = False
        self.offset = 0
        self.last_chunk = b""
        self.last_chunk_start = 0
        self.eof = False
        self.truncated_compression: str | None = None
        self._guard = jsonscan.NestingGuard()
        self._too_deep: TraceError | None = None

    def pull(self, size: int) -> bytes:
        """The next decoded, repaired bytes (b"" once at the end; see ``eof``)."""
        if self.eof:
            return b""
        try:
            data = self._stream.read(size)
        except TruncatedInput as exc:
            self.truncated_compression = str(exc)
            data = b""
        except TraceError as exc:  # corrupt compressed data: say how far decoding got
            if exc.byte_offset is None and not isinstance(exc, TransferError):
                exc.byte_offset = self.offset
            raise
        if data:
            data = self._utf8.feed(data)
        else:
            self.eof = True
            data = self._utf8.finish()
        if self._control is not None and data:
            data = self._control.feed(data)
        return self._delivered(data)

    def _delivered(self, data: bytes) -> bytes:
        """``data``, repaired bytes read at ``offset``, counted, kept for the tail and reported."""
        self.last_chunk_start = self.offset
        self.last_chunk = data
        self.offset += len(data)
        self._keep_tail(data)
        self._on_chunk(self)
        return data

    def plain_file(self) -> int | None:
        """The descriptor of the file read, when the reading may jump ahead
        in it (:meth:`skip_to`): a plain file, read as it is (nothing
        repaired so far), not at its end; else None."""
        if self._control is not None or self._utf8.repaired or self.eof:
            return None
        return self._stream.plain_file()

    def skip_to(self, offset: int) -> None:
        """Jump to ``offset`` of the :meth:`plain_file`, its bytes before it
        read elsewhere (by the workers a hand-off gives them to); call
        :meth:`resume` before reading on."""
        self._stream.seek(offset)
        self._on_chunk(self)

    def resume(self, held: bytes, offset: int, growth: int) -> bytes:
        """Read on after ``held``, the bytes of the :meth:`plain_file` at
        ``offset``, which are returned repaired as :meth:`pull` repairs what
        it reads; ``growth``: the bytes that repairs before ``offset`` added
        (offsets here count the repaired bytes).  The tail starts again."""
        self._stream.seek(offset + len(held))
        self._utf8.drop_pending()
        self.offset = offset + growth
        self._tail.clear()
        self._tail_size = 0
        self.tail_trimmed = True
        return self._delivered(self._utf8.feed(held))

    def _keep_tail(self, data: bytes) -> None:
        self._tail.append(data)
        self._tail_size += len(data)
        while self._tail_size - len(self._tail[0]) >= TAIL_WINDOW:
            self._tail_size -= len(self._tail.popleft())
            self.tail_trimmed = True

    def tail(self, at_least: int = TAIL_WINDOW) -> tuple[bytes, bool]:
        """The last pieces read, ``at_least`` bytes of them where there are as
        many, joined; and whether that is all the retained tail.  A part
        never starts with a backslash: a backward scan could not tell then
        whether the quote after it is escaped."""
        pieces: list[bytes] = []
        size = 0
        for piece in reversed(self._tail):
            if size >= at_least and not pieces[-1].startswith(b"\\"):
                break
            pieces.append(piece)
            size += len(piece)
        return b"".join(reversed(pieces)), len(pieces) == len(self._tail)

    def prime(self) -> tuple[str, list[jsonscan.RawMember], int]:
        """Read ahead until the header is scanned; the bytes are kept for
        :meth:`take_primed`.  Returns the form, the header members and the
        offset of the events array's ``[``."""
        buffer = bytearray()
        while True:
            chunk = self.pull(max(PARSE_CHUNK, len(buffer)))  # doubling: each rescan from 0 costs as much as all before
            self._primed.append((self.last_chunk_start, chunk))
            buffer += chunk
            try:
                return jsonscan.scan_header(bytes(buffer))
            except jsonscan.MoreData:
                if self.eof:
                    if self.truncated_compression:
                        raise TraceError(f"input is truncated ({self.truncated_compression}) before the first event",
                                         byte_offset=self.offset) from None
                    if not buffer.strip():
                        raise TraceError("empty input: no JSON at all", byte_offset=0) from None
                    raise TraceError("input ends inside the top-level keys, before traceEvents",
                                     byte_offset=self.offset) from None
                if len(buffer) > HEADER_LIMIT:
                    raise TraceError(f"no traceEvents key within the first {HEADER_LIMIT >> 20} MiB",
                                     byte_offset=self.offset) from None
            except jsonscan.MemberNotJSON as exc:
                if "control character" in str(exc) and self._control is None:
                    raise RobustModeNeeded(ReadMode(repair_strings=True)) from None
                raise TraceError(str(exc), byte_offset=exc.offset) from None
            except jsonscan.ScanError as exc:
                raise TraceError(str(exc), byte_offset=exc.offset) from None

    def take_primed(self) -> bytes:
        """The bytes read ahead so far (from offset 0), no longer to be replayed."""
        data = b"".join(chunk for _, chunk in self._primed)
        self._primed.clear()
        return data

    def replay(self, prefix: bytes, rest: bytes, rest_offset: int) -> None:
        """Make ijson read ``prefix`` then ``rest`` (found at ``rest_offset``)
        before the bytes still unread, so error offsets stay true."""
        self._primed.append((rest_offset - len(prefix), prefix + rest))

    def read(self, size: int) -> bytes:
        """What ijson reads: the nesting guard sees it first.  Bytes before a
        level too deep are handed out, so that ijson delivers the events
        that end before it and the refusal names the right event."""
        if size == 0:  # ijson probes the type with read(0)
            return b""
        if self._too_deep is not None:
            raise self._too_deep
        if self._primed:
            self.last_chunk_start, self.last_chunk = self._primed.popleft()
            data = self.last_chunk
        else:
            data = self.pull(max(size, PARSE_CHUNK))
        try:
            self._guard.feed(data)
        except jsonscan.ScanError as exc:
            self._too_deep = TraceError(str(exc), byte_offset=self.last_chunk_start + exc.offset)
            if exc.offset == 0:
                raise self._too_deep from None
            return data[:exc.offset]
        return data

    @property
    def repaired_utf8(self) -> int:
        return self._utf8.repaired

    @property
    def repaired_control(self) -> int:
        return self._control.repaired if self._control is not None else 0


_ESCALATE = {
    "integer overflow": ReadMode(exact_numbers=True),
    "numeric (floating point) overflow": ReadMode(exact_numbers=True),
    "invalid character inside string": ReadMode(repair_strings=True),
}


def header_members(stream: DecodedStream) -> list[jsonscan.RawMember]:
    """The top-level members before ``traceEvents``, reading no further
    (a directory of traces can be sorted by what their headers state)."""
    return _Feed(stream, ReadMode(), lambda feed: None).prime()[1]


class ChunkRefused(Exception):
    """A chunk handed off was not read (its cut was wrong, or it holds what
    only a slower reading can read); ``confirmed`` chunks before it were."""

    def __init__(self, confirmed: int) -> None:
        super().__init__(confirmed)
        self.confirmed = confirmed


class HandOff(Protocol):
    """Whoever parses the chunks :meth:`TraceReader.batches` hands off, in
    order; both methods raise :class:`ChunkRefused` when a chunk failed."""

    def submit(self, text: bytes, offset: int | None) -> int:
        """Take the text of the next chunk, found at ``offset`` of the input
        itself (None: the bytes read differ from the input's, as after a
        repair); return how many chunks so far were parsed."""

    def settle(self) -> int:
        """Wait until every chunk is parsed; return their number."""

    # Optional: where ``reads_places`` is true, ``submit_place(offset, length)``
    # hands out a chunk of the input file by its place alone, as ``submit``
    # does with its text.


class _Unconfirmed:
    """The stream's bytes from the first handed-off chunk not yet confirmed
    on: what a reading taking over from there needs."""

    def __init__(self, first: int = 0) -> None:
        """``first``: the number of the first chunk to be added."""
        self._chunks: deque[tuple[int, bytes, bytes]] = deque()  # (stream offset, elements' text, the gap after it)
        self._first = first  # number of the first chunk held

    def add(self, offset: int, text: bytes, gap: bytes) -> None:
        self._chunks.append((offset, text, gap))

    def confirm(self, confirmed: int) -> None:
        while self._first < confirmed:
            self._chunks.popleft()
            self._first += 1

    def since(self, confirmed: int) -> tuple[int, bytes] | None:
        """(offset, bytes) from the first chunk not confirmed, or None."""
        self.confirm(confirmed)
        if not self._chunks:
            return None
        offset = self._chunks[0][0]
        text = b"".join(part for _, elements, gap in self._chunks for part in (elements, gap))
        self._chunks.clear()
        return offset, text


class TraceReader:
    """One reading of a trace in one mode."""

    def __init__(self, stream: DecodedStream, mode: ReadMode, *, salvage: bool = False, on_chunk=None) -> None:
        self.mode = mode
        self.salvage = salvage
        self.stats = ReadStats(compression=stream.compression, exact_numbers=mode.exact_numbers)
        self._stream = stream
        report = on_chunk or (lambda reader: None)
        self._feed = _Feed(stream, mode, lambda feed: report(self))
        self._iterator: Generator | None = None
        self._hand_off: HandOff | None = None
        self.batch_text: bytes | None = None
        """The input text of the batch last handed out, when the chunk parser
        read it: the events, their separators, and no backslash (else None).
        Secret detection's pre-filter reads it instead of encoding the events."""

    @property
    def raw_bytes_read(self) -> int:
        return self._stream.raw_bytes_read

    def events(self) -> Iterator[dict]:
        """Every event, one by one; fills ``stats`` (header, trailer, counts) as it goes."""
        self._iterator = self._one_by_one()
        return self._iterator

    def batches(self, hand_off: HandOff | None = None,
                chunk_bytes: int = CHUNK_PARSE_BYTES) -> Iterator[list[dict]]:
        """The events a list at a time (a parsed chunk, a few thousand), for
        consumers with per-batch work; as :meth:`events` otherwise, except
        that errors the consumer raises get no event index from :meth:`blame`
        (only the consumer knows which event of the batch it was on).

        With ``hand_off``, chunks of about ``chunk_bytes`` are not parsed
        here: each is given to ``hand_off`` as the text of its elements
        (``{...},{...}``), cut at the last candidate boundary without the
        parse that would prove it.  The cuts are right exactly when ``[`` +
        text + ``]`` of every chunk parses (the first starts where the
        array's first element does, and each chunk that parses ends where the
        next element starts): ``hand_off`` must parse them in order and
        refuse a chunk that fails.  The reading goes on here from the first
        chunk not parsed, and parses the end of the array itself; only what
        is parsed here is yielded (and counted in ``stats.events``).
        """
        self._hand_off = hand_off
        self._iterator = self._read_batches(hand_off, chunk_bytes)
        return self._iterator

    def blame(self, exc: TraceError) -> TraceError:
        """Give the event being handled to an error its consumer raised on it.

        Only errors tied to no file or position yet (a visitor's or the
        writer's complaint about the event): an error about the output file
        keeps its own path.
        """
        events = self._iterator
        if exc.path is None and exc.event_index is None and events is not None and events.gi_frame is not None:
            events.close()  # its cleanup records how many events were handed out, the current one included
            exc.event_index = self.stats.events - 1
        return exc

    def _one_by_one(self) -> Iterator[dict]:
        batches = self._read_batches()
        delivered = 0
        try:
            for batch in batches:
                for event in batch:
                    delivered += 1
                    yield event
        finally:
            batches.close()
            self.stats.events = delivered

    def _read_batches(self, hand_off: HandOff | None = None,
                      chunk_bytes: int = CHUNK_PARSE_BYTES) -> Iterator[list]:
        stats = self.stats
        feed = self._feed
        stats.form, stats.header, events_at = feed.prime()
        count = 0
        last = None
        try:
            for batch in self._parsed_batches(events_at, hand_off, chunk_bytes):
                if not batch:
                    continue
                if set(map(type, batch)) != ONLY_DICTS:
                    bad = next(n for n, event in enumerate(batch) if event.__class__ is not dict)
                    raise TraceError(f"event is {value_kind(batch[bad])}, expected an object", event_index=count + bad)
                count += len(batch)
                stats.events = count
                last = batch[-1]
                yield batch
            self._last = last
            if feed.truncated_compression:
                self._truncated(feed.truncated_compression, count)
            elif stats.form == "object":
                self._read_trailer()
        except ijson.IncompleteJSONError as exc:
            self._last = last
            self._parse_failure(exc, count)
        except TraceError as exc:
            if exc.event_index is None and not isinstance(exc, TransferError):  # corrupt compression: where
                exc.event_index = count
            raise
        finally:
            stats.events = count
            self._finish_stats()

    def _parsed_batches(self, events_at: int, hand_off: HandOff | None,
                        chunk_bytes: int) -> Iterator[list]:
        """The array's elements in lists: chunk by chunk while that works, then through ijson."""
        yield from self._chunk_parsed(events_at, hand_off, chunk_bytes)
        prefix = "traceEvents.item" if self.stats.form == "object" else "item"
        self.batch_text = None
        yield from _grouped(ijson.items(self._feed, prefix, use_float=not self.mode.exact_numbers,
                                        buf_size=PARSE_CHUNK), IJSON_BATCH)

    def _chunk_parsed(self, events_at: int, hand_off: HandOff | None, chunk_bytes: int) -> Iterator[list]:
        """Lists of elements parsed a chunk at a time; then hand the rest to ijson.

        Each chunk is cut after a ``}`` that a ``,`` and a ``{`` follow (the
        last one: before a ``]``), and ``[`` + chunk + ``]`` is parsed whole.
        As every chunk starts where an element starts, that parse succeeds
        only if the cut is really between two elements (a cut inside a string
        or a nested value leaves the array unclosed), so the parser itself
        checks each cut.  What follows the array, an input that ends inside
        it, a chunk no cut works for, and anything the chunk parser refuses
        or would read differently are left to ijson, whose reading is
        replayed from the last good cut with the document's own opening
        (``{"traceEvents":[`` or ``[``).

        With ``hand_off``, chunks are handed off unparsed instead (see
        :meth:`batches`), and kept until confirmed; at the end of the input,
        or when a chunk is refused, the reading goes on here from the first
        chunk not confirmed.
        """
        feed = self._feed
        loads = chunk_loads_exact if self.mode.exact_numbers else chunk_loads_fast
        data = feed.take_primed()
        data_offset = 0  # where data[0] is in the stream
        start = events_at + 1
        failed_at = -1  # where the element starts that the last cuts failed after
        unconfirmed = _Unconfirmed()
        lead = _ELEMENT_START.match(data, start)
        # pretty-printed arrays put the same whitespace before every element, and more before nested ones
        separator = b"," + data[start:lead.end() - 1] if lead is not None and b"\n" in data[start:lead.end()] else None
        if hand_off is not None and lead is not None:
            windowed = self._hand_off_by_windows(hand_off, start, lead.end() - 1, len(data), chunk_bytes, separator)
            if windowed is not None:
                data_offset, data, handed_out, refused = windowed
                start = 0
                unconfirmed = _Unconfirmed(handed_out)
                if refused:
                    hand_off = None

        def take_back(refusal: ChunkRefused | None = None) -> None:
            """Stop handing off; read again from the first chunk not confirmed
            (after ``refusal``: no chunk after the refused one counts)."""
            nonlocal hand_off, data, data_offset, start
            if refusal is None:
                try:
                    confirmed = hand_off.settle()
                except ChunkRefused as late:
                    confirmed = late.confirmed
            else:
                confirmed = refusal.confirmed
            hand_off = None
            back = unconfirmed.since(confirmed)
            if back is not None:
                data, data_offset = back[1] + data[start:], back[0]
                start = 0

        while not feed.eof:
            if len(data) - start > CHUNK_PARSE_LIMIT:
                break
            pending = len(data) - start  # an element longer than a chunk: read as much again
            data = data[start:] + feed.pull(max(chunk_bytes, pending))
            data_offset += start
            start = 0
            first = _ELEMENT_START.match(data)
            if first is None:
                break
            start = first.end() - 1
            at_end = feed.eof
            if hand_off is not None:
                if not at_end:
                    cut = likely_cut(data, start, separator)
                    if cut is None:
                        continue  # one large element: read on
                    cut_from, text = start, data[start:cut[0]]
                    unconfirmed.add(data_offset + start, text, data[cut[0]:cut[1]])
                    start = cut[1]
                    try:
                        at_input = None if feed.repaired_utf8 or _offsets_moved(hand_off) else data_offset + cut_from
                        unconfirmed.confirm(hand_off.submit(text, at_input))
                        continue
                    except ChunkRefused as refusal:
                        take_back(refusal)
                else:
                    take_back()
            candidates = array_ends(data, start) if at_end else cut_candidates(data, start)
            parsed = parse_up_to(data, start, candidates, loads)
            if parsed is None:
                continue  # no cut yet (one large element): read on
            begun = start
            elements, start = parsed
            if elements is None:
                if failed_at == data_offset + start or at_end:
                    break
                failed_at = data_offset + start  # perhaps the last element and what follows the array: read on once
                continue
            text = data[begun:start]
            self.batch_text = None if b"\\" in text else text
            yield elements
        if hand_off is not None:
            take_back()
        opening = b'{"traceEvents":[' if self.stats.form == "object" else b"["
        feed.replay(opening, data[start:], data_offset + start)

    def _hand_off_by_windows(self, hand_off: HandOff, begin: int, position: int, end: int, chunk_bytes: int,
                             separator: bytes | None) -> tuple[int, bytes, int, bool] | None:
        """Hand off the chunks of a plain file by their places alone, cut as
        :meth:`_chunk_parsed` cuts them, reading here only the end of each.

        That loop holds the bytes from ``begin`` (``position``: where the
        first element starts) to ``end``, reads as much again as it holds
        past the last cut (at least ``chunk_bytes``), and cuts at the last
        candidate there.  When a window of those bytes' last
        :data:`CUT_WINDOW` holds the cut that loop would choose (one with
        the usual separator), it is that cut, and the workers read the chunk
        from the file.  Near the file's end (its trailer is read as it
        comes), at a window without such a cut, or at a refusal (the reading
        goes on at the refused chunk), the loop takes over: returns the
        offset and bytes it would hold then, the number of chunks handed
        out, and whether the last was refused; None when nothing was handed
        out so (not a plain file, workers that read no file, a file too
        small, no such cut in the first window)."""
        descriptor = self._feed.plain_file()
        if descriptor is None or not getattr(hand_off, "reads_places", False):
            return None
        last_end = os.fstat(descriptor).st_size - TAIL_WINDOW - chunk_bytes
        starts: deque[tuple[int, int]] = deque()  # (number, offset) of each chunk not known to be parsed
        handed_out = 0
        try:
            while True:
                next_end = end + max(chunk_bytes, end - begin)
                if next_end > last_end:
                    break
                window_at = max(position, next_end - CUT_WINDOW)
                cut = usual_cut(os.pread(descriptor, next_end - window_at, window_at), separator)
                if cut is None:
                    break
                starts.append((handed_out, position))
                end = next_end
                self._feed.skip_to(end)  # (which the progress shown follows)
                parsed = hand_off.submit_place(position, window_at + cut[0] - position)
                handed_out += 1
                while starts and starts[0][0] < parsed:
                    starts.popleft()
                begin = position = window_at + cut[1]
            if not handed_out:
                return None
            hand_off.settle()
        except ChunkRefused as refusal:
            position = next(offset for number, offset in starts if number == refusal.confirmed)
            return (*self._take_over(descriptor, position, end, hand_off), handed_out, True)
        return (*self._take_over(descriptor, begin, end, hand_off), handed_out, False)

    def _take_over(self, descriptor: int, position: int, end: int, hand_off: HandOff) -> tuple[int, bytes]:
        """The reading from ``position`` on, the feed at ``end``: the offset
        (counting repaired bytes) and the repaired bytes between them."""
        held = os.pread(descriptor, end - position, position)
        if len(held) != end - position:
            size = os.fstat(descriptor).st_size
            raise TraceError(f"the input file was shortened to {size:,} bytes while it was read",
                             path=self._stream.name, byte_offset=size)
        growth = getattr(hand_off, "utf8_growth", 0)
        return position + growth, self._feed.resume(held, position, growth)

    def _finish_stats(self) -> None:
        stats = self.stats
        stats.bytes_decompressed = self._feed.offset
        stats.bytes_raw = self._stream.raw_bytes_read
        stats.invalid_utf8_repaired = self._feed.repaired_utf8 + getattr(self._hand_off, "utf8_repaired", 0)
        stats.control_chars_repaired = self._feed.repaired_control

    def _read_trailer(self) -> None:
        """The members after the events array, scanned back from the end: in
        the last MiB read first, in the whole retained tail when that is too
        short (joining all of it at once would hold the tail twice at the
        index's largest)."""
        feed = self._feed
        tail, complete = feed.tail(TRAILER_FIRST_TRY)
        while True:
            try:
                self.stats.trailer = jsonscan.scan_trailer(tail, complete and not feed.tail_trimmed,
                                                           self._is_last_event)
                return
            except jsonscan.WindowTooSmall:
                if complete:
                    raise TraceError(f"top-level keys after traceEvents exceed {TAIL_WINDOW >> 20} MiB",
                                     byte_offset=feed.offset) from None
                tail, complete = feed.tail()
            except jsonscan.ScanError as exc:
                raise TraceError(f"after traceEvents: {exc}", byte_offset=feed.offset - len(tail) + exc.offset) from None

    def _parse_failure(self, exc: ijson.IncompleteJSONError, count: int) -> None:
        message = _first_line(exc)
        feed = self._feed
        if "premature EOF" in message:
            if feed.truncated_compression:
                message = feed.truncated_compression
            elif self.stats.form == "array" and count and self._only_bracket_missing():
                self.stats.unterminated_array = True
                return
            self._truncated(message, count)
            return
        for trigger, mode in _ESCALATE.items():
            if trigger in message and not _covers(self.mode, mode):
                raise RobustModeNeeded(mode)
        raise TraceError(f"malformed JSON: {message}{_context(exc)}", event_index=count,
                         byte_offset=self._error_offset(exc)) from None

    def _truncated(self, reason: str, count: int) -> None:
        if not self.salvage:
            raise TraceError(
                f"input is truncated ({reason}) after {count} complete events; "
                "--salvage keeps the complete events",
                event_index=count, byte_offset=self._feed.offset,
            )
        self.stats.truncated = True
        self.stats.trailer = []

    def _only_bracket_missing(self) -> bool:
        """True when a bare array ends after a complete event, as Chrome allows."""
        tail, _ = self._feed.tail()
        span = jsonscan.last_object_end(tail)
        return span is not None and self._is_last_event(tail[span[0] : span[1]])

    def _is_last_event(self, text: bytes) -> bool:
        """Is ``text`` the JSON of the last event read?"""
        loads = loads_exact if self.mode.exact_numbers else orjson.loads
        try:
            return loads(text) == self._last
        except (ValueError, RecursionError):  # not JSON, or nested deeper than any event read
            return False

    def _error_offset(self, exc: Exception) -> int:
        """Pin the byte offset using the context text yajl quotes."""
        lines = str(exc).split("\n")
        feed = self._feed
        if len(lines) >= 3 and "^" in lines[2]:
            context = lines[1].strip()
            caret = lines[2].index("^") - 1 - (len(lines[1]) - len(lines[1].lstrip()))
            chunk = feed.last_chunk.replace(b"\n", b" ").replace(b"\r", b" ").replace(b"\t", b" ")
            found = chunk.rfind(context.encode("utf-8", "replace"))
            if context and found >= 0:
                return feed.last_chunk_start + found + max(caret, 0)
        return feed.offset


_ELEMENT_START = re.compile(rb"[ \t\r\n]*\{")
def _offsets_moved(hand_off: HandOff) -> bool:
    """Did repairs in the chunks ``hand_off`` read from the file add bytes?
    Offsets in the bytes read here no longer are the file's then."""
    return getattr(hand_off, "utf8_growth", 0) != 0



def _covers(current: ReadMode, wanted: ReadMode) -> bool:
    return (current.exact_numbers or not wanted.exact_numbers) and (
        current.repair_strings or not wanted.repair_strings
    )


def _first_line(exc: Exception) -> str:
    text = exc.args[0] if exc.args else str(exc)
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    return str(text).split("\n", 1)[0].strip().rstrip(".")


def _context(exc: Exception) -> str:
    lines = str(exc).split("\n")
    return f" near {lines[1].strip()[:60]!r}" if len(lines) > 1 and lines[1].strip() else ""




def _grouped(items: Iterator[object], size: int) -> Iterator[list]:
    """``items`` in lists of ``size``; when ``items`` fails, the items read
    before the failure are handed out first (a truncated input keeps them)."""
    batch: list = []
    try:
        for item in items:
            batch.append(item)
            if len(batch) >= size:
                yield batch
                batch = []
    except BaseException:
        if batch:
            yield batch
        raise
    if batch:
        yield batch


