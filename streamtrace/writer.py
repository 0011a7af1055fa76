"""Writer: streams a trace object out, member by member, event by event.

Output is always the object form: header members, ``traceEvents`` (one
event per line), appended events, then the members that followed the array
in the input.  Member values are written as the raw JSON text they had.
"""
from __future__ import annotations

from typing import BinaryIO, Iterable

import orjson

from .jsonscan import RawMember


class TraceWriter:
    """Writes one trace; call :meth:`event` per event, then :meth:`close`."""

    def __init__(self, out: BinaryIO, header: Iterable[RawMember]) -> None:
        self._out = out
        self._first = True
        self.events_written = 0
        parts = [b"{"]
        for key, raw in header:
            parts.append(orjson.dumps(key) + b": " + raw + b",\n")
        parts.append(b'"traceEvents": [\n')
        out.write(b"".join(parts))

    def event(self, line: bytes) -> None:
        """Write one event given as its compact JSON text."""
        if self._first:
            self._first = False
            self._out.write(line)
        else:
            self._out.write(b",\n" + line)
        self.events_written += 1

    def close(self, trailer: Iterable[RawMember]) -> None:
        parts = [b"\n]"]
        for key, raw in trailer:
            parts.append(b",\n" + orjson.dumps(key) + b": " + raw)
        parts.append(b"}\n")
        self._out.write(b"".join(parts))
