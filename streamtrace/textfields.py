"""Numeric fields of compact event lines, changed as text.

Merge's pass 2 changes a few numbers per event (pid, a shifted ts, ids).
Decoding and re-encoding each line costs several microseconds; changing the
digits in the text costs a fraction, and over a whole block of lines at
once (``split`` on a key pattern, new texts from ``map`` over C functions)
no Python call runs per line at all.  The caller guarantees exactness by
counting: see ``MergePlan`` in ``merge``.
"""
from __future__ import annotations

import re
from typing import Callable, Iterable

INTEGER = re.compile(rb"-?[0-9]+(?=[,}])")
NUMBER = re.compile(rb"-?[0-9]+(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?(?=[,}])")

Convert = Callable[[list[bytes]], Iterable[bytes]]
"""New texts for a list of number texts."""


def field_pattern(key: bytes, number: re.Pattern = INTEGER) -> re.Pattern:
    """Matches ``key`` (e.g. ``b'"tid":'``) then a number, capturing both."""
    return re.compile(b"(" + re.escape(key) + b")(" + number.pattern + b")")


def swap_all(pattern: re.Pattern, text: bytes, convert: Convert) -> tuple[bytes, int]:
    """``text`` with the number after every key ``pattern`` finds converted,
    and how many (``pattern`` from :func:`field_pattern`)."""
    parts = pattern.split(text)
    numbers = parts[2::3]
    parts[2::3] = convert(numbers)
    return b"".join(parts), len(numbers)


def swap_one(line: bytes, key: bytes, convert: Convert, number: re.Pattern = INTEGER) -> bytes | None:
    """``line`` with the number after ``key`` (which must occur once)
    converted; None when that is not possible."""
    at = line.find(key)
    if at < 0 or line.find(key, at + len(key)) >= 0:
        return None
    start = at + len(key)
    found = number.match(line, start)
    if found is None:
        return None
    return line[:start] + next(iter(convert([found.group()]))) + line[found.end():]


def as_texts(numbers: Iterable[int]) -> Iterable[bytes]:
    return map(b"%d".__mod__, numbers)
