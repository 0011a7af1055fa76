"""Small structural scanners for the parts of a trace around the events.

The C parser streams the ``traceEvents`` items; the top-level keys before
and after the array are found here, on the few bytes at the start and at the
end of the stream, and kept as raw JSON text so that they come out exactly
as they went in.  Nothing here looks inside the events.
"""
from __future__ import annotations

import re
from typing import Callable

import orjson

WHITESPACE = b" \t\r\n"
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)
_STRUCTURE = re.compile(rb'["\[\]{}]')
_SCALAR = re.compile(rb"[^\s,\]}:]+")
_SCALAR_BYTES = frozenset(b"+-.0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
WALK_LIMIT = 64 * 1024
_OPEN_FOR = {ord("]"): ord("["), ord("}"): ord("{")}

MAX_DEPTH = 1024
"""Deepest nesting read, below the top-level value: what the chunk parser
(orjson) takes; a deeper value is refused by every command."""
MAX_KEY_PATH = 64 * 1024
"""Longest key path (the keys from the top level down to a value, as in
``traceEvents.item.args.name``) read, in bytes."""

RawMember = tuple[str, bytes]
"""A top-level key and its value as raw JSON text."""


class MoreData(Exception):
    """The scan needs bytes beyond the end of the buffer."""


class ScanError(ValueError):
    """The bytes are not JSON of the expected shape; ``offset`` says where."""

    def __init__(self, message: str, offset: int) -> None:
        super().__init__(message)
        self.offset = offset


def skip_ws(buf: bytes, pos: int) -> int:
    while pos < len(buf) and buf[pos] in WHITESPACE:
        pos += 1
    if pos >= len(buf):
        raise MoreData
    return pos


def skip_value(buf: bytes, pos: int) -> int:
    """End offset of the JSON value starting at ``pos`` (one nested deeper
    than :data:`MAX_DEPTH` is refused, as the event parser refuses it)."""
    first = buf[pos]
    if first == 0x22:
        match = _STRING.match(buf, pos)
        if match is None:
            raise MoreData
        return match.end()
    if first in (0x5B, 0x7B):
        depth = 0
        while True:
            match = _STRUCTURE.search(buf, pos)
            if match is None:
                raise MoreData
            at = match.start()
            char = buf[at]
            if char == 0x22:
                string = _STRING.match(buf, at)
                if string is None:
                    raise MoreData
                pos = string.end()
                continue
            depth += 1 if char in (0x5B, 0x7B) else -1
            if depth > MAX_DEPTH:
                raise ScanError(f"JSON nested more than {MAX_DEPTH} levels deep", at)
            pos = at + 1
            if depth == 0:
                return pos
    match = _SCALAR.match(buf, pos)
    if match is None:
        raise ScanError(f"unexpected character {chr(first)!r}", pos)
    if match.end() >= len(buf):
        raise MoreData
    return match.end()


def _decode_key(raw: bytes, offset: int) -> str:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ScanError(f"bad key {raw[:40]!r}: {exc}", offset) from None


def scan_header(buf: bytes) -> tuple[str, list[RawMember], int]:
    """Find where the events start.

    Returns ``(form, header_members, events_offset)``: form ``"object"`` or
    ``"array"``, the top-level members before ``traceEvents`` (object form),
    and the offset of the events array's ``[``.  Raises :class:`MoreData`
    when the buffer ends first and :class:`ScanError` on a wrong shape.
    """
    pos = skip_ws(buf, 0)
    if buf.startswith(b"\xef\xbb\xbf", pos):
        pos = skip_ws(buf, pos + 3)
    first = buf[pos]
    if first == 0x5B:
        return "array", [], pos
    if first != 0x7B:
        kind = describe_value_start(buf, pos)
        raise ScanError(f"top level is {kind}, expected an object with traceEvents or an array of events", pos)
    members: list[RawMember] = []
    pos += 1
    while True:
        pos = skip_ws(buf, pos)
        if buf[pos] == 0x7D:
            raise ScanError("the top-level object has no traceEvents key", pos)
        if buf[pos] != 0x22:
            raise ScanError(f"expected a key, found {chr(buf[pos])!r}", pos)
        key_end = skip_value(buf, pos)
        key = _decode_key(buf[pos:key_end], pos)
        pos = skip_ws(buf, key_end)
        if buf[pos] != 0x3A:
            raise ScanError(f"expected ':' after key {key!r}", pos)
        pos = skip_ws(buf, pos + 1)
        if key == "traceEvents":
            if buf[pos] != 0x5B:
                kind = describe_value_start(buf, pos)
                raise ScanError(f"traceEvents is {kind}, expected a list of events", pos)
            return "object", members, pos
        value_end = skip_value(buf, pos)
        members.append((key, _checked_value(buf[pos:value_end], key, pos)))
        pos = skip_ws(buf, value_end)
        if buf[pos] == 0x2C:
            pos += 1
        elif buf[pos] != 0x7D:
            raise ScanError(f"expected ',' or '}}' after the value of {key!r}", pos)


class MemberNotJSON(ScanError):
    """A top-level value before the events is not JSON (it is copied out as
    raw text, so it is checked here: no parser reads it otherwise)."""


def _checked_value(raw: bytes, key: str, offset: int) -> bytes:
    """``raw`` if it parses as JSON; :class:`skip_value` only balances brackets."""
    try:
        orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise MemberNotJSON(f"malformed JSON in the value of top-level key {key!r}: {exc}", offset) from None
    return raw


def member_value(members: list[RawMember], key: str) -> object:
    """The parsed value of a top-level member (the last one named ``key``), or None."""
    value = None
    for name, raw in members:
        if name == key:
            try:
                value = orjson.loads(raw)
            except orjson.JSONDecodeError:
                value = None
    return value


def describe_value_start(buf: bytes, pos: int) -> str:
    """Name the kind of JSON value that starts at ``pos``."""
    byte = buf[pos]
    if byte == 0x22:
        return "a string"
    if byte in b"-0123456789":
        return "a number"
    if byte == 0x7B:
        return "an object"
    if byte == 0x5B:
        return "an array"
    for literal, kind in ((b"null", "null"), (b"true", "a boolean"), (b"false", "a boolean")):
        if buf.startswith(literal, pos):
            return kind
    return f"not JSON (starts with {buf[pos:pos + 12]!r})"


class WindowTooSmall(Exception):
    """A backward scan ran off the start of the retained tail."""


def _rskip_ws(buf: bytes, pos: int) -> int:
    while pos >= 0 and buf[pos] in WHITESPACE:
        pos -= 1
    if pos < 0:
        raise WindowTooSmall
    return pos


def _rskip_string(buf: bytes, pos: int) -> int:
    """Given the closing quote at ``pos``, the offset before the opening quote.

    Scanning backwards is exact: a quote inside a string is escaped by an odd
    number of backslashes, a delimiting quote by an even number (or none).
    """
    end = pos
    while True:
        quote = buf.rfind(b'"', 0, end)
        if quote < 0:
            raise WindowTooSmall
        slashes = 0
        while quote - slashes - 1 >= 0 and buf[quote - slashes - 1] == 0x5C:
            slashes += 1
        if slashes % 2 == 0:
            return quote - 1
        end = quote


def _rskip_value(buf: bytes, pos: int) -> int:
    """Given the last byte of a value at ``pos``, the offset before the value."""
    last = buf[pos]
    if last == 0x22:
        return _rskip_string(buf, pos)
    if last in _OPEN_FOR:
        depth = 0
        while pos >= 0:
            char = buf[pos]
            if char == 0x22:
                pos = _rskip_string(buf, pos)
                continue
            if char in (0x5D, 0x7D):
                depth += 1
            elif char in (0x5B, 0x7B):
                depth -= 1
                if depth == 0:
                    return pos - 1
            pos -= 1
        raise WindowTooSmall
    while pos >= 0 and buf[pos] in _SCALAR_BYTES:
        pos -= 1
    return pos


def scan_trailer(tail: bytes, whole: bool, is_last_event: Callable[[bytes], bool]) -> list[RawMember]:
    """The top-level members after the events array, from the end of the stream.

    ``tail`` holds the last bytes of the stream; ``whole`` says whether it is
    the entire stream.  Walks back member by member, reading each key.  An
    array value too long to walk back through within ``WALK_LIMIT`` bytes is
    the events array if its last element is the last event read
    (``is_last_event``): no trailer member is that long in practice.
    """
    members: list[RawMember] = []
    pos = _rskip_ws(tail, len(tail) - 1)
    if tail[pos] != 0x7D:
        raise ScanError("the top-level object does not end with '}'", pos)
    pos -= 1
    while True:
        pos = _rskip_ws(tail, pos)
        value_end = pos + 1
        if tail[pos] == 0x7B:
            raise ScanError("traceEvents not found scanning back from the end", pos)
        floor = max(0, pos - WALK_LIMIT)
        try:
            before_value = floor + _rskip_value(tail[floor:value_end], pos - floor)
        except WindowTooSmall:
            if tail[pos] == 0x5D and _ends_with_event(tail, pos - 1, is_last_event):
                return members
            if whole:
                raise ScanError("unbalanced brackets after traceEvents", pos) from None
            raise
        value = tail[before_value + 1 : value_end]
        pos = _rskip_ws(tail, before_value)
        if tail[pos] != 0x3A:
            raise ScanError("expected ':' before a top-level value", pos)
        pos = _rskip_ws(tail, pos - 1)
        if tail[pos] != 0x22:
            raise ScanError("expected a key before ':'", pos)
        before_key = _rskip_string(tail, pos)
        key = _decode_key(tail[before_key + 1 : pos + 1], before_key + 1)
        if key == "traceEvents":
            return members
        members.insert(0, (key, value))
        pos = _rskip_ws(tail, before_key)
        if tail[pos] != 0x2C:
            raise ScanError(f"expected ',' before key {key!r}", pos)
        pos -= 1


def _ends_with_event(tail: bytes, pos: int, is_last_event: Callable[[bytes], bool]) -> bool:
    """Does the array closing after ``pos`` end with the last event read?"""
    try:
        pos = _rskip_ws(tail, pos)
        if tail[pos] != 0x7D:
            return False
        return is_last_event(tail[_rskip_value(tail, pos) + 1 : pos + 1])
    except WindowTooSmall:
        return False


def last_object_end(tail: bytes) -> tuple[int, int] | None:
    """Span of the object that ends the tail (after whitespace and a comma).

    Used to tell a bare array that only lacks its closing ``]`` (accepted,
    as Chrome does) from one cut inside an event.
    """
    try:
        pos = _rskip_ws(tail, len(tail) - 1)
        if tail[pos] == 0x2C:
            pos = _rskip_ws(tail, pos - 1)
        if tail[pos] != 0x7D:
            return None
        return _rskip_value(tail, pos) + 1, pos + 1
    except WindowTooSmall:
        return None


_GUARD_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}:]|"', re.S)  # a string unrolled: fewer regex steps
_STRING_REST = re.compile(rb'[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_ITEM_STEP = len(".item")  # what an array level adds to ijson's path


class NestingGuard:
    """Refuses JSON nested deeper than :data:`MAX_DEPTH` or under a key path
    longer than :data:`MAX_KEY_PATH`, before the streaming parser sees it.

    ijson keeps the dotted path of every open level as its own string, so
    its memory grows with depth times path length: 200,000 nested ``[``
    (400 KB of input) would take tens of GB.  The guard follows strings,
    keys and brackets chunk by chunk, in bounded state, and raises
    :class:`ScanError` (offset within the chunk) at the first byte too deep.
    """

    def __init__(self) -> None:
        self._paths: list[int] = []  # path length inside each open container
        self._in_object: list[bool] = []
        self._key = 0  # length of the innermost object's current key
        self._last_string = -1  # length of the string just read (a key if ':' follows), else -1
        self._in_string = False
        self._string_length = 0
        self._escaped = False

    def feed(self, data: bytes) -> None:
        pos = self._finish_string(data)
        if pos is None:
            return
        for match in _GUARD_TOKEN.finditer(data, pos):
            token = match.group()
            char = token[0]
            if char == 0x22:
                if len(token) == 1:  # no closing quote in this chunk
                    self._open_string(data, match.start() + 1)
                    return
                self._last_string = len(token) - 2
                continue
            if char == 0x3A:
                if self._last_string >= 0:
                    self._key = self._last_string
            elif char in (0x5B, 0x7B):
                self._push(char == 0x7B, match.start())
            elif self._paths:
                self._paths.pop()
                self._in_object.pop()
                self._key = 0
            self._last_string = -1

    def _push(self, is_object: bool, at: int) -> None:
        if len(self._paths) > MAX_DEPTH:
            raise ScanError(f"JSON nested more than {MAX_DEPTH} levels deep", at)
        path = 0
        if self._paths:
            path = self._paths[-1] + (1 + self._key if self._in_object[-1] else _ITEM_STEP)
        if path > MAX_KEY_PATH:
            raise ScanError(f"keys nested more than {MAX_KEY_PATH >> 10} KiB deep (the path of keys to a value)", at)
        self._paths.append(path)
        self._in_object.append(is_object)
        self._key = 0

    def _open_string(self, data: bytes, start: int) -> None:
        """The chunk ends inside a string that starts at ``start``."""
        self._in_string = True
        self._string_length = 0
        self._escaped = False
        self._continue_string(data, start)

    def _continue_string(self, data: bytes, start: int) -> None:
        run = data[start:]
        self._string_length += len(run)
        self._escaped = (len(run) - len(run.rstrip(b"\\"))) % 2 == 1  # the next chunk starts escaped

    def _finish_string(self, data: bytes) -> int | None:
        """Where the tokens of ``data`` start, after the end of a string an
        earlier chunk left open (None: the string goes on past ``data``)."""
        if not self._in_string:
            return 0
        start = 1 if self._escaped and data else 0
        self._escaped = False
        match = _STRING_REST.match(data, start)
        if match is None:
            self._continue_string(data, start)
            return None
        self._in_string = False
        self._last_string = self._string_length + match.end() - 1
        return match.end()

