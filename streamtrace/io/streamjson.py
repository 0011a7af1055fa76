"""A summary written as JSON with lists too long to hold read from disk as they are written: the summary is
dumped with a placeholder for each such list, and each placeholder replaced, a block of items at a time, by
the list's items as the whole dump would have written them (the same bytes)."""
from __future__ import annotations

import re
import secrets
from typing import BinaryIO, Iterator

import orjson

BLOCK_ITEMS = 1_000  # items formatted, then written together


class Streamed:
    """A list of JSON values read from disk when iterated (:meth:`__iter__`), a block at a time; written into
    the summary by :func:`write` without being held."""

    def __iter__(self) -> Iterator[object]:
        raise NotImplementedError

    def close(self) -> None:
        """Let go of what holds the items (files)."""


def write(value: object, out: BinaryIO) -> None:
    """``value`` as ``orjson.dumps(value, option=OPT_INDENT_2) + b"\\n"`` writes it, each :class:`Streamed`
    within written as the list of its items."""
    streamed: list[Streamed] = []
    token = secrets.token_hex(8)  # (a placeholder no string of the value can be)

    def placeholder(found: object) -> str:
        if isinstance(found, Streamed):
            streamed.append(found)
            return f"\0streamed {token} {len(streamed) - 1}"
        raise TypeError(f"Type is not JSON serializable: {type(found).__name__}")

    text = orjson.dumps(value, default=placeholder, option=orjson.OPT_INDENT_2)
    written = 0
    for mark in re.finditer(rb'"\\u0000streamed ' + token.encode() + rb' (\d+)"', text):  # (NUL is written \u0000)
        start = mark.start()
        line = text.rfind(b"\n", 0, start) + 1
        margin = len(text[line:start]) - len(text[line:start].lstrip(b" "))
        out.write(text[written:start])
        _write_list(streamed[int(mark.group(1))], margin, out)
        written = mark.end()
    out.write(text[written:])
    out.write(b"\n")


def _write_list(items: Streamed, margin: int, out: BinaryIO) -> None:
    """The items as an indented list whose line starts ``margin`` spaces in, a block at a time."""
    inner = b"\n" + b" " * (margin + 2)
    block: list[bytes] = []
    count = 0
    for item in items:
        block.append((b"[" if not count else b",") + inner + orjson.dumps(item, option=orjson.OPT_INDENT_2).replace(b"\n", inner))
        count += 1
        if len(block) >= BLOCK_ITEMS:
            out.write(b"".join(block))
            block = []
    out.write(b"".join(block))
    out.write(b"[]" if not count else b"\n" + b" " * margin + b"]")


def close(value: object) -> None:
    """Close every :class:`Streamed` among ``value``'s dict values and list items (nested)."""
    if isinstance(value, Streamed):
        value.close()
    elif isinstance(value, dict):
        for item in value.values():
            close(item)
    elif isinstance(value, list):
        for item in value:
            close(item)
