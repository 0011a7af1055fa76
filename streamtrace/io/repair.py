"""Byte filters that make real-world traces acceptable to the C JSON parser.

yajl (ijson's C backend) rejects invalid UTF-8 and raw control characters
inside strings; profilers write both into names.  The filters fix them in
the byte stream before parsing and count what they changed.
"""
from __future__ import annotations

import codecs
import re

_REPLACEMENT = "\ufffd"


class Utf8Repair:
    """Replaces invalid UTF-8 sequences with U+FFFD, chunk by chunk.

    ASCII chunks (nearly all of a trace) pass through untouched, so the
    filter costs almost nothing on clean input.
    """

    def __init__(self) -> None:
        self.repaired = 0
        self._pending = b""
        self._error_name = f"streamtrace-utf8-{id(self)}"
        codecs.register_error(self._error_name, self._count)

    def _count(self, exc: UnicodeDecodeError) -> tuple[str, int]:
        self.repaired += 1
        return _REPLACEMENT, exc.end

    def drop_pending(self) -> None:
        """Forget the start of a character held back: the reading jumped
        elsewhere, and the bytes it would have joined are not read."""
        self._pending = b""

    def feed(self, chunk: bytes) -> bytes:
        if self._pending:
            chunk = self._pending + chunk
            self._pending = b""
        if chunk.isascii():
            return chunk
        keep = _incomplete_tail_length(chunk)
        if keep:
            chunk, self._pending = chunk[:-keep], chunk[-keep:]
        try:
            chunk.decode("utf-8")
            return chunk
        except UnicodeDecodeError:
            return chunk.decode("utf-8", self._error_name).encode("utf-8")

    def finish(self) -> bytes:
        """The bytes held back at the end: an incomplete sequence, repaired."""
        rest, self._pending = self._pending, b""
        if not rest:
            return b""
        return rest.decode("utf-8", self._error_name).encode("utf-8")


def _incomplete_tail_length(chunk: bytes) -> int:
    """Length of a multi-byte UTF-8 sequence cut off at the end of chunk."""
    for back in range(1, min(4, len(chunk)) + 1):
        byte = chunk[-back]
        if byte < 0x80:
            return 0
        if byte >= 0xC0:
            needed = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return back if needed > back else 0
    return 0


_STRING_SPECIAL = re.compile(rb'["\\\x00-\x1f]')


class ControlCharRepair:
    """Escapes raw control characters found inside JSON strings.

    Needs to know whether each byte is inside a string, so it follows quotes
    and escapes across chunks in Python.  It is slow, and only used when the
    fast parser has already failed on such a character.
    """

    def __init__(self) -> None:
        self.repaired = 0
        self._in_string = False
        self._escaped = False

    def feed(self, chunk: bytes) -> bytes:
        pieces: list[bytes] = []
        copied = 0
        pos = 0
        if self._escaped and chunk:
            self._escaped = False
            pos = 1
        in_string = self._in_string
        search = _STRING_SPECIAL.search
        while True:
            match = search(chunk, pos)
            if match is None:
                break
            at = match.start()
            byte = chunk[at]
            if byte == 0x22:
                in_string = not in_string
                pos = at + 1
            elif byte == 0x5C:
                if in_string and at + 1 >= len(chunk):
                    self._escaped = True
                pos = at + 2 if in_string else at + 1
            else:
                if in_string:
                    pieces.append(chunk[copied:at])
                    pieces.append(b"\\u%04x" % byte)
                    copied = at + 1
                    self.repaired += 1
                pos = at + 1
        self._in_string = in_string
        if not pieces:
            return chunk
        pieces.append(chunk[copied:])
        return b"".join(pieces)
