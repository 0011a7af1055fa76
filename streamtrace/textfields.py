"""Numeric fields of compact event lines, changed as text.

Merge's pass 2 changes a few numbers per event (pid, a shifted ts, ids).
Decoding and re-encoding each line costs several microseconds; changing the
digits in the text costs a fraction, and over a whole block of lines at
once (one ``split`` on a key pattern, new texts from ``map`` over C
functions) no Python call runs per line at all.  The caller guarantees
exactness by knowing how often each key must occur: see ``MergePlan`` in
``merge``.
"""
from __future__ import annotations

import re
from typing import Callable, Iterable

INTEGER = re.compile(rb"-?[0-9]+(?=[,}])")
NUMBER = re.compile(rb"-?[0-9]+(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?(?=[,}])")

Convert = Callable[[list[bytes]], Iterable[bytes]]
"""New texts, key included, for a list of number texts found after the key."""
Field = tuple[re.Pattern, Convert, int]
"""A key pattern (from :func:`field_pattern`), the new texts, how often the key must occur."""


def field_pattern(key: bytes, number: re.Pattern = INTEGER) -> re.Pattern:
    """Matches every ``key`` (e.g. ``b'"tid":'``) and, when a number of the
    form ``number`` follows it, that number (group 1; None otherwise)."""
    return re.compile(re.escape(key) + b"(" + number.pattern + b")?")


def swap_all(pattern: re.Pattern, text: bytes, convert: Convert, expected: int) -> bytes | None:
    """``text`` with every key ``pattern`` finds, and its number, replaced by
    ``convert``'s texts; None unless the key occurs exactly ``expected``
    times, each time before a number (``pattern`` from :func:`field_pattern`)."""
    parts = pattern.split(text)
    numbers = parts[1::2]
    if len(numbers) != expected or None in numbers:
        return None
    parts[1::2] = convert(numbers)
    return b"".join(parts)


def swap_fields(text: bytes, fields: Iterable[Field]) -> bytes | None:
    """:func:`swap_all` for each field in turn; None as soon as one is not exact."""
    for pattern, convert, expected in fields:
        if not expected:
            if pattern.search(text) is not None:
                return None
            continue
        text = swap_all(pattern, text, convert, expected)
        if text is None:
            return None
    return text


def positions(marks: bytes, value: int) -> list[int]:
    """Where the byte ``value`` occurs in ``marks`` (a few per block: a
    ``find`` loop beats a Python step per byte)."""
    found, at = [], marks.find(value)
    while at >= 0:
        found.append(at)
        at = marks.find(value, at + 1)
    return found


def splice_number(line: bytes, key: bytes, new: bytes | Callable[[bytes], bytes]) -> bytes | None:
    """``line`` with its one ``key`` and the integer after it replaced by
    ``new`` (or ``new(integer text)``); None when the key is not there
    exactly once or no integer follows it."""
    head, found, tail = line.partition(key)
    if not found or key in tail:
        return None
    number = INTEGER.match(tail)
    if number is None:
        return None
    return head + (new if new.__class__ is bytes else new(number.group())) + tail[number.end():]


def swap_one(line: bytes, pattern: re.Pattern, convert: Convert) -> bytes | None:
    """``line`` with its one key ``pattern`` finds, and the number after it,
    replaced by ``convert``'s text; None when the key is missing, occurs
    twice or has no number after it."""
    found = pattern.search(line)
    if found is None or found.group(1) is None or pattern.search(line, found.end()) is not None:
        return None
    return line[:found.start()] + next(iter(convert([found.group(1)]))) + line[found.end():]
