"""Where a chunk of the events array can be cut between two events, and how a chunk parses
(orjson in fast mode, the json module with Decimal floats in exact mode): the reader's fast path."""
from __future__ import annotations

import json
import re
from decimal import Decimal
from typing import Callable, Iterator

import orjson

from .eventtext import has_int_beyond_fast_reading

CUT_ATTEMPTS = 4  # boundaries tried per chunk before leaving the rest to ijson

_CUT = re.compile(rb"\}[ \t\r\n]*,[ \t\r\n]*\{")

_BOUNDARY_SEARCH_LIMIT = 256  # closing braces (or brackets) looked at per chunk when none is a cut
_JSON_WHITESPACE = b" \t\r\n"

Candidates = Iterator[tuple[int, int]]  # (where the elements would end, where reading goes on), last first


def cut_candidates(data: bytes, start: int) -> Candidates:
    """``}`` then ``,`` then ``{``: the next element would start at the ``{``."""
    brace = data.rfind(b"}", start)
    for _ in range(_BOUNDARY_SEARCH_LIMIT):
        if brace <= start:
            return
        cut = _CUT.match(data, brace)
        if cut is not None:
            yield brace + 1, cut.end() - 1
        brace = data.rfind(b"}", start, brace)


def likely_cut(data: bytes, start: int, separator: bytes | None) -> tuple[int, int] | None:
    """The last cut whose separator is ``separator`` (when given), else the last cut."""
    fallback = None
    for cut in cut_candidates(data, start):
        if separator is None or data[cut[0]:cut[1]] == separator:
            return cut
        fallback = fallback or cut
    return fallback



def usual_cut(data: bytes, separator: bytes | None) -> tuple[int, int] | None:
    """The cut :func:`likely_cut` chooses in ``data``, when that is a cut
    with ``separator`` (or any cut, without one); else None: the bytes
    before ``data`` might hold the cut it would choose."""
    cut = likely_cut(data, 0, separator)
    return cut if cut is not None and (separator is None or data[cut[0]:cut[1]] == separator) else None


def array_ends(data: bytes, start: int) -> Candidates:
    """``}`` then ``]``: the ``]`` would close the events array."""
    bracket = data.rfind(b"]", start)
    for _ in range(_BOUNDARY_SEARCH_LIMIT):
        if bracket <= start:
            return
        before = bracket - 1
        while before > start and data[before] in _JSON_WHITESPACE:
            before -= 1
        if data[before] == 0x7D:
            yield before + 1, before + 1
        bracket = data.rfind(b"]", start, before + 1)


def parse_up_to(data: bytes, start: int, candidates: Candidates,
                 loads: Callable[[bytes], list | None]) -> tuple[list | None, int] | None:
    """Parse ``data[start:]`` up to the last candidate end that parses.

    Returns ``(elements, where reading goes on)``; ``(None, start)`` when
    candidates exist but none parses (the chunk parser refuses something:
    leave it to ijson); None when there is no candidate yet.
    """
    attempts = 0
    for end, resume in candidates:
        elements = loads(b"[" + data[start:end] + b"]")
        if elements is not None:
            return elements, resume
        attempts += 1
        if attempts == CUT_ATTEMPTS:
            break
    return (None, start) if attempts else None


def chunk_loads_fast(text: bytes) -> list | None:
    """Parse a chunk as a fast-mode reading would, or None.

    orjson reads integers beyond 64 bits as floats without a word: a chunk
    holding one is left to ijson, which asks for the exact-mode reread.
    """
    if has_int_beyond_fast_reading(text):
        return None
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return None


def chunk_events(text: bytes) -> list[dict] | None:
    """The events of a chunk of elements (``{...},{...}``) as a fast-mode
    reading would parse them, or None when that parse fails, would read
    differently, or finds an element that is not an object."""
    events = chunk_loads_fast(b"[" + text + b"]")
    if events is None or (events and set(map(type, events)) != ONLY_DICTS):
        return None
    return events


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def chunk_loads_exact(text: bytes) -> list | None:
    """Parse a chunk as an exact-mode reading would (Decimal floats, ints of any size), or None."""
    try:
        return json.loads(text, parse_float=Decimal, parse_constant=_refuse_constant)
    except (ValueError, RecursionError):
        return None


ONLY_DICTS = {dict}
