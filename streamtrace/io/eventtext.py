"""One event's JSON text, read and written exactly: the fields that must not be containers,
integers beyond 64 bits, Decimal floats written back with their own digits, the spool's lines."""
from __future__ import annotations

import json
import re
from decimal import Decimal
from typing import Callable

import orjson

from ..algo.secrets import fold
from ..errors import TraceError


def value_kind(value: object) -> str:
    names = {list: "a list", dict: "an object", str: "a string", int: "a number", float: "a number",
             Decimal: "a number", bool: "a boolean", type(None): "null"}
    return names.get(type(value), type(value).__name__)


KEY_FIELDS = ("ph", "cat", "name", "pid", "tid", "id")
"""Event fields commands use as dictionary keys: a list or object there cannot be indexed."""


def raise_if_container_field(event: object) -> None:
    """After a TypeError while handling ``event``: refuse it if a key field is a list or object.

    Checked only on failure, so the per-event hot paths stay free of type
    checks; a TypeError with well-typed fields is a bug and propagates.
    """
    if event.__class__ is not dict:
        return
    for key in KEY_FIELDS:
        value = event.get(key)
        if value.__class__ in (list, dict):
            raise TraceError(f"{key} is {value_kind(value)}, expected a number or string") from None


def decimal_as_json(value: object) -> orjson.Fragment:
    """orjson ``default`` hook: write an exact-mode number with its original text."""
    if isinstance(value, Decimal):
        return orjson.Fragment(str(value))
    raise TypeError(f"cannot write {type(value).__name__} as JSON")


def loads_exact(line: bytes) -> dict:
    """Decode an event line keeping exact-mode numbers exact (ints beyond
    64 bits, floats as Decimal), for the lines orjson refuses or rounds."""
    return json.loads(line, parse_float=Decimal)


_NINETEEN_DIGITS = b"9" * 19
_DIGIT_RUN = re.compile(rb"9+")
_ORJSON_INTS = range(-(1 << 63), 1 << 64)


def has_int_beyond_fast_reading(text: bytes, digits: bytes | None = None, run_limit: int | None = None) -> bool:
    """Does ``text`` hold an integer orjson would round (outside [-2^63, 2^64))?
    With ``run_limit``: or a run of that many digits, integer or not (a
    caller refusing floats beyond a double tests both in one search).

    Digits become ``9`` in a translated copy (``digits``, when the caller
    has made one: any copy with digits as ``9`` and nothing else as ``9``),
    so C-level ``find`` locates the runs of 19 or more; only those are
    looked at.  A run that is part of a float (after ``.``, before
    ``.``/``e``) is not an integer.  A run inside a string counts (rarely
    costly: that text is parsed exactly).
    """
    digits = fold(text) if digits is None else digits
    at = digits.find(_NINETEEN_DIGITS)
    while at >= 0:
        end = _DIGIT_RUN.match(digits, at).end()
        if run_limit is not None and end - at >= run_limit:
            return True
        in_float = (at and text[at - 1] == 0x2E) or text[end:end + 1] in (b".", b"e", b"E")
        start = at - 1 if at and text[at - 1] == 0x2D else at
        if not in_float and int(text[start:end]) not in _ORJSON_INTS:
            return True
        at = digits.find(_NINETEEN_DIGITS, end)
    return False


def loads_spooled(text: bytes | memoryview) -> object:
    """Decode spooled text of an exact-mode reading (an event line, or the
    parse child's JSON array of lines), fast.

    orjson reads nearly every line exactly and ~6x faster than the json
    module; it only rounds integers outside [-2^63, 2^64) to floats (without
    saying so) and refuses floats beyond double range.  A cheap byte-level
    test finds the text with such an integer, and only that, or what orjson
    refuses, takes the slow exact decoder.  (Decimal floats become plain
    floats, as in a fast-mode reading; the line itself, which is what gets
    written, keeps its text.)
    """
    text = bytes(text)
    if not has_int_beyond_fast_reading(text):
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError:
            pass
    return loads_exact(text)


WRITE_DEPTH_LIMIT = 254
"""Deepest nesting orjson writes; deeper events are refused by every command that writes events."""


def dumps_event(event: dict, option: int = 0) -> bytes:
    """Serialise one event compactly; exact-mode numbers keep their text.

    Raises :class:`TraceError` (without a position: the caller knows the
    event index) for an event nested too deep to write.
    """
    try:
        return orjson.dumps(event, default=decimal_as_json, option=option)
    except TypeError as exc:
        if "Recursion limit" in str(exc):
            raise TraceError(f"event is nested more than {WRITE_DEPTH_LIMIT} levels deep, "
                             "more than the JSON writer takes") from None
        return orjson.dumps(_big_ints_as_text(event), default=decimal_as_json, option=option)


def dumped_batch(events: list, first_index: int) -> tuple[bytes, bytes | memoryview]:
    """A list of events as one JSON array and as spool lines (each event
    compact on its own line; newlines between them), from one orjson call.

    In compact JSON, two adjacent objects in the array meet as ``},{``; that
    also occurs inside strings and nested lists, so the split is kept only
    when it yields exactly one line per event (orjson writes no raw newline).
    Otherwise, and for what orjson cannot write in one go, each event is
    written alone (errors then name the event: ``first_index`` + position).
    """
    if not events:
        raise ValueError("no events to write")
    try:
        array = orjson.dumps(events, default=decimal_as_json)
    except TypeError:
        array = None
    if array is not None:
        joined = array.replace(b"},{", b"}\n{")
        if joined.count(b"\n") == len(events) - 1:
            return array, memoryview(joined)[1:-1]
    texts = []
    for n, event in enumerate(events):
        try:
            texts.append(dumps_event(event))
        except TraceError as exc:
            exc.event_index = first_index + n
            raise
    return b"[" + b",".join(texts) + b"]", b"\n".join(texts)


def _big_ints_as_text(value: object) -> object:
    """Integers beyond 64 bits (orjson's limit) as raw JSON text."""
    if type(value) is int and not -(1 << 63) <= value < (1 << 64):
        return orjson.Fragment(str(value))
    if type(value) is dict:
        return {key: _big_ints_as_text(item) for key, item in value.items()}
    if type(value) is list:
        return [_big_ints_as_text(item) for item in value]
    return value


def event_loader(exact: bool) -> Callable[[bytes], dict]:
    """How pass 2 decodes a spooled event line: orjson, or keeping exact-mode numbers exact."""
    return loads_spooled if exact else orjson.loads
