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
from functools import lru_cache
from itertools import compress
from typing import Callable, Iterable

INTEGER = re.compile(rb"-?[0-9]+(?=[ \t]*[,}])")
NUMBER = re.compile(rb"-?[0-9]+(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?(?=[ \t]*[,}])")

Convert = Callable[[list[bytes]], Iterable[bytes]]
"""New texts, key included, for a list of number texts found after the key."""
Field = tuple[re.Pattern, Convert, int]
"""A key pattern (from :func:`field_pattern`), the new texts, how often the key must occur."""


def field_pattern(key: bytes, number: re.Pattern = INTEGER, *, spaced: bool = False) -> re.Pattern:
    """Matches every ``key`` (e.g. ``b'"tid":'``) and, when a number of the
    form ``number`` follows it, that number (group 1; None otherwise).
    ``spaced``: spaces and tabs may stand before the colon and between it
    and the number too (as Kineto writes them): in one-line JSON without
    escapes every member of that name is then found.  Group 1 holds the
    spaces before the number, so that a number put back as it was found
    is the same text."""
    if not spaced:
        return re.compile(re.escape(key) + b"(" + number.pattern + b")?")
    name = key.removesuffix(b":")
    return re.compile(re.escape(name) + b"[ \t]*:([ \t]*" + number.pattern + b")?")


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
    """Where the byte ``value`` occurs in ``marks``, found in C: the bytes
    translated to 1 where they equal ``value`` select from a range."""
    return list(compress(range(len(marks)), marks.translate(_selector(value))))


@lru_cache(maxsize=None)
def _selector(value: int) -> bytes:
    return bytes(1 if byte == value else 0 for byte in range(256))


def swap_in_lines(lines: list[bytes], at: list[int], pattern: re.Pattern, convert: Convert) -> bool:
    """Swap the key's number in each of ``lines[at]`` (each holds the key at
    least once) by one split of those lines joined; False, leaving
    ``lines`` as they were, unless each holds it exactly once, before a number."""
    if not at:
        return True
    swapped = swap_all(pattern, b"\n".join(map(lines.__getitem__, at)), convert, len(at))
    if swapped is None:
        return False
    for position, line in zip(at, swapped.split(b"\n")):
        lines[position] = line
    return True


def swap_one(line: bytes, pattern: re.Pattern, convert: Convert) -> bytes | None:
    """``line`` with its one key ``pattern`` finds, and the number after it,
    replaced by ``convert``'s text; None when the key is missing, occurs
    twice or has no number after it."""
    found = pattern.search(line)
    if found is None or found.group(1) is None or pattern.search(line, found.end()) is not None:
        return None
    return line[:found.start()] + next(iter(convert([found.group(1)]))) + line[found.end():]
