"""Writer: streams a trace object out, member by member, event by event.

Output is always the object form: header members, ``traceEvents`` (one
event per line), appended events, then the members that followed the array
in the input.  Member values are written as the raw JSON text they had.
Event lines are batched into large writes: a compressor called once per
event would cost more than the events.

A writer given a :class:`~streamtrace.io.redact.Redactor` passes every
member and every event text through it on the way out: the one place
where redaction happens, for every command that writes a trace.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, BinaryIO, Iterable, Iterator

import orjson

from .jsonscan import RawMember

if TYPE_CHECKING:
    from .redact import Redactor

BATCH_LINES = 512  # orjson.dumps results keep ~4 KB of capacity each


@dataclass(frozen=True)
class JoinedLines:
    """``count`` event lines as one text, separated by newlines (cheaper to
    write than a list when the lines were joined anyway)."""

    text: bytes
    count: int


class TraceWriter:
    """Writes one trace; call :meth:`event` per event, then :meth:`close`.

    With ``header`` None it writes a fragment instead: only the events, joined
    as in a trace (finish it with :meth:`flush`); another writer can
    :meth:`splice` it in, so worker processes can prepare parts of one output
    (a fragment is never redacted: the writer that splices it in redacts).
    A fragment that ``continues`` one with events before it begins with the
    separator, so fragments can be joined as they are.
    """

    def __init__(self, out: BinaryIO, header: Iterable[RawMember] | None, redactor: Redactor | None = None, *,
                 continues: bool = False) -> None:
        self._out = out
        self._batch: list[bytes] = []
        self._started = continues
        self.events_written = 0
        self._position = 0  # bytes written or reserved so far
        self._reserved = False  # the next write must seek past a reserved fragment
        self._last = b""  # the last byte written or reserved
        self._redactor = redactor if header is not None else None
        if header is None:
            return
        if self._redactor is not None:
            header = self._redactor.members(header)
        parts = [b"{"]
        for key, raw in header:
            parts.append(orjson.dumps(key) + b": " + raw + b",\n")
        parts.append(b'"traceEvents": [\n')
        self._write(b"".join(parts))

    def event(self, line: bytes) -> None:
        """Write one event given as its compact JSON text."""
        self._batch.append(line)
        if len(self._batch) >= BATCH_LINES:
            self.flush()

    def events(self, lines: list[bytes] | JoinedLines, *, clean: bool = False) -> None:
        """Write a batch of event lines; ``clean``: the redactor's screen,
        run on joined lines elsewhere, found nothing in them to look at."""
        self.flush()
        if isinstance(lines, JoinedLines):
            if lines.count:
                text = lines.text if clean else self._redacted(lines.text, self.events_written)
                self._write((b",\n" if self._started else b"") + text.replace(b"\n", b",\n"))
                self._started = True
                self.events_written += lines.count
        elif lines:
            self._batch = lines
            self.flush()

    def splice(self, fragment: Iterable[bytes], count: int) -> None:
        """Write a fragment of ``count`` events (its bytes, in pieces)."""
        self.flush()
        separator = b",\n" if self._started else b""
        if self._redactor is not None:
            fragment = self._redacted_pieces(fragment)
        for piece in fragment:
            if piece:
                self._write(separator + piece)
                separator = b""
        self._started = self._started or count > 0
        self.events_written += count

    def reserve(self, length: int, count: int, last: bytes = b"") -> tuple[int, bool, bytes]:
        """Room in the file for a fragment of ``count`` events and ``length``
        bytes ending with ``last`` that another process writes there itself
        (``os.pwrite``) or compresses for there (:meth:`add_placed`): where
        it goes, whether it must begin with the separator, and the byte
        before it.  This writer's later writes go after it."""
        self.flush()
        separated = self._started and length > 0
        at, before = self._position, self._last
        self._position += length + 2 * separated
        self._last = last if length else before
        self._reserved = True
        self._started = self._started or count > 0
        self.events_written += count
        return at, separated, before

    def add_placed(self, message: memoryview) -> None:
        """Write a reserved fragment that another process compressed for
        its place (the output is a :class:`~streamtrace.io.gzipped.GzipPieces`);
        fragments come in the order they were reserved."""
        self._out.add_placed(message)  # type: ignore[attr-defined]

    def flush(self) -> None:
        """Write the batched events out."""
        if self._batch:
            text = self._redacted(b",\n".join(self._batch), self.events_written)
            self._write((b",\n" if self._started else b"") + text)
            self._started = True
            self.events_written += len(self._batch)
            self._batch = []

    def _redacted(self, text: bytes, first_index: int) -> bytes:
        return text if self._redactor is None else self._redactor.text(text, first_index)

    def _redacted_pieces(self, fragment: Iterable[bytes]) -> Iterator[bytes]:
        """A fragment's pieces redacted, recut at line ends (a piece may
        end inside an event)."""
        carry = b""
        index = self.events_written
        for piece in fragment:
            text = carry + bytes(piece)
            cut = text.rfind(b"\n") + 1
            carry = text[cut:]
            if cut:
                yield self._redacted(text[:cut], index)
                index += text.count(b"\n", 0, cut)
        if carry:
            yield self._redacted(carry, index)

    def close(self, trailer: Iterable[RawMember]) -> None:
        self.flush()
        if self._redactor is not None:
            trailer = self._redactor.members(trailer)
        parts = [b"\n]"]
        for key, raw in trailer:
            parts.append(b",\n" + orjson.dumps(key) + b": " + raw)
        parts.append(b"}\n")
        self._write(b"".join(parts))

    def _write(self, data: bytes) -> None:
        if self._reserved:
            self._out.seek(self._position)
            self._reserved = False
        self._out.write(data)
        self._position += len(data)
        self._last = data[-1:] or self._last
