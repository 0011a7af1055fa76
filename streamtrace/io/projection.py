"""Chunks of events decoded into a few typed fields (msgspec), for index
visitors that read only those fields.

Decoding a projection skips building a dict per event and every field not
named, which is most of the cost of a parse.  A chunk is decoded only when
the plain fast reading would read it the same way: elements that are not
objects, a field of a shape the projection does not model (``args`` that is
not an object), an integer orjson would round, or malformed text make the
decoder refuse the chunk (None), and the caller reads it the ordinary way.
"""
from __future__ import annotations

import re
from typing import Any, Optional

import msgspec

from .reader import has_int_beyond_fast_reading


class EventArgs(msgspec.Struct):
    """The members of ``args`` the analyses read."""

    stream: Any = None
    correlation: Any = None
    rank: Any = None
    name: Any = None


class ProjectedEvent(msgspec.Struct):
    """The members of an event the analyses read."""

    ph: Any = None
    cat: Any = None
    name: Any = None
    pid: Any = None
    ts: Any = None
    dur: Any = None
    args: Optional[EventArgs] = None


_DECODER = msgspec.json.Decoder(list[ProjectedEvent])
# digits as 9, exponent marks as e, signs as +: the number shapes the fast reading refuses stand out
_NUMBER_SHAPES = bytes(57 if 48 <= byte <= 57 else 101 if byte in b"eE" else 43 if byte in b"+-" else 32
                       for byte in range(256))
_HUGE_EXPONENT = re.compile(rb"9e\+?999")  # beyond a double: orjson refuses it, a projection skips it
_LONG_DIGITS, _HUGE_DIGITS = b"9" * 19, b"9" * 309  # an integer beyond 64 bits; a float beyond a double


def projected_events(text: bytes) -> list[ProjectedEvent] | None:
    """The events of a chunk of elements (``{...},{...}``), projected; None
    when the ordinary reading must read the chunk (see the module's text)."""
    return decode_chunk(_DECODER, text)


def decode_chunk(decoder: msgspec.json.Decoder, text: bytes) -> list | None:
    """A chunk of elements decoded by ``decoder`` (of a list of Structs), or
    None when the fast reading would not read every byte of it as the
    decoder does: an integer it would round, a float beyond a double or
    text that is not UTF-8, in a field the projection skips as much as in
    one it decodes; malformed or too deeply nested text."""
    shapes = text.translate(_NUMBER_SHAPES)
    if _LONG_DIGITS in shapes and (has_int_beyond_fast_reading(text, shapes) or _HUGE_DIGITS in shapes):
        return None
    if _HUGE_EXPONENT.search(shapes):
        return None
    if not text.isascii():
        try:
            text.decode()
        except UnicodeDecodeError:
            return None
    try:
        return decoder.decode(b"[" + text + b"]")
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return None
