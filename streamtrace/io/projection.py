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


def projected_events(text: bytes) -> list[ProjectedEvent] | None:
    """The events of a chunk of elements (``{...},{...}``), projected; None
    when the ordinary reading must read the chunk (see the module's text)."""
    if has_int_beyond_fast_reading(text):
        return None
    try:
        return _DECODER.decode(b"[" + text + b"]")
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
