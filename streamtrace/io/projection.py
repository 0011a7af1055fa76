"""Chunks of events decoded into the few typed fields a visitor reads
(msgspec), and their lines for the event spool in the input's own text.

Decoding a projection skips building a dict per event and every field not
named, which is most of the cost of a parse.  A visitor declares the fields
it reads (:class:`Projection`); the decoder is built from that declaration.
A chunk is decoded only when the plain fast reading would read it the same
way: elements that are not objects, a field of a shape the projection does
not model (``args`` that is not an object), an integer orjson would round,
nesting deeper than the decoder goes, or malformed text make the decoder
refuse the chunk (None), and the caller reads it the ordinary way.
"""
from __future__ import annotations

import re
from typing import Any, Mapping, Optional

import msgspec
import numpy as np
import orjson

from ..algo.secrets import fold
from .eventtext import has_int_beyond_fast_reading

ABSENT = msgspec.UNSET
"""A declared field's default that tells an absent member from ``null``."""


class _RawText:
    """The marker of :data:`RAW`."""


RAW = _RawText()
"""A declared field read as its text (``msgspec.Raw``; None when absent): a
member whose value is only compared, and decoded once per distinct text."""

_ELEMENTS = msgspec.json.Decoder(list[msgspec.Raw])


class Projection:
    """A typed decoder for the members of an event a visitor reads.

    ``fields`` maps each member to its default when absent (None, a value,
    or :data:`ABSENT`), :data:`RAW`, or to a mapping of the same kind: an object member
    (such as ``args``) and the members of it that are read; absent or
    ``null``, it is None, and any other value refuses the chunk.
    A member whose name is not a Python identifier (``"Collective name"``)
    is read as the attribute :func:`attribute` names.
    """

    def __init__(self, fields: Mapping[str, object] | type) -> None:
        """``fields``, or a msgspec Struct type of an event to decode into (its
        members typed: a member of another type refuses the chunk)."""
        self.fields = fields
        event = fields if isinstance(fields, type) else _struct("Event", fields)
        self._decoder = msgspec.json.Decoder(list[event])

    def decode(self, text: bytes, folded: bytes | None = None) -> list | None:
        """The events of a chunk of elements (``{...},{...}``), projected;
        None when the ordinary reading must read the chunk (see the module's
        text).  ``folded``: as :func:`read_alike` takes it."""
        if not read_alike(text, folded):
            return None
        try:
            return self._decoder.decode(b"[" + text + b"]")
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
            return None

    def decode_with_lines(self, text: bytes, folded: bytes | None = None) -> tuple[list, bytes, list] | None:
        """The events of a chunk, projected, the same events as spool lines
        (one event a line, newlines between them) in the input's own text,
        and each event's text as found (msgspec Raw); None when either must
        be refused: the chunk is then read and its events encoded the
        ordinary way.

        Pass 2 changes spooled lines as text where each change is exact (a
        key found as often as the event holds it, before a number), and
        decodes the line otherwise: spacing and key order may be the
        input's.  An event spread over lines (as Kineto writes them) becomes
        one line, without its line breaks and indentation.  But a key is
        found only as it is spelled: so a chunk with any backslash (an
        escape could spell a key, or hide text from redaction), invalid
        UTF-8 (which the projection does not read), or a number a float may
        overflow in (which the fast reading refuses) is refused.
        """
        if b"\\" in text or not read_alike(text, folded):
            return None
        listed = b"[" + text + b"]"
        try:
            elements = _ELEMENTS.decode(listed)
            events = self._decoder.decode(listed)
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
            return None
        return events, _joined_lines(elements), elements


def read_alike(text: bytes, folded: bytes | None = None) -> bool:
    """Would the fast reading read every byte of ``text`` as a projection
    does, members it skips included?  Not with an integer orjson would
    round, a float beyond a double (orjson refuses it; msgspec skips it
    unread), or text that is not UTF-8 (the same).  ``folded``:
    :func:`~streamtrace.algo.secrets.fold` of ``text``, when the caller
    has it: its digits are ``9``s and its exponent marks ``e``s, so the
    number shapes the fast reading refuses stand out."""
    shapes = fold(text) if folded is None else folded
    if has_int_beyond_fast_reading(text, shapes, run_limit=_HUGE_DIGITS):
        return False
    if _has_huge_exponent(shapes):
        return False
    if not text.isascii():
        try:
            text.decode()
        except UnicodeDecodeError:
            return False
    return True


_HUGE_EXPONENT = re.compile(rb"9e\+?999")  # beyond a double (zeros are nines here too)
_HUGE_DIGITS = 300  # a run of digits that makes a float beyond a double
_FEW_EXPONENTS = 64


def _has_huge_exponent(shapes: bytes) -> bool:
    """Does ``shapes`` (folded text, see :func:`read_alike`) hold :data:`_HUGE_EXPONENT`?
    Names hold many ``e``s and numbers many ``9``s, so a search is slow: most
    texts have no ``e`` after a digit at all, which numpy tells by comparing
    the text as 16-bit words; else it finds the few ``e``s after a digit,
    and only those are matched (all of them by one search when there are
    many: a trace of exponent floats)."""
    if not _holds_pair(shapes, _DIGIT_E):
        return False
    codes = np.frombuffer(shapes, dtype=np.uint8)
    marks = np.flatnonzero(codes[1:] == _E)  # an e at mark + 1
    marks = marks[codes[marks] == _NINE]
    if len(marks) > _FEW_EXPONENTS:
        return _HUGE_EXPONENT.search(shapes) is not None
    return any(_HUGE_EXPONENT.match(shapes, at) for at in marks.tolist())


_E, _NINE = ord("e"), ord("9")
_DIGIT_E = _NINE | _E << 8  # "9e" read as a little-endian 16-bit word


def _holds_pair(text: bytes, pair: int) -> bool:
    """Does ``text`` hold the two bytes ``pair`` (a little-endian 16-bit
    word) side by side?  Compared as words at even offsets, then at odd ones."""
    if len(text) < 2:
        return False
    even = np.frombuffer(text, dtype="<u2", count=len(text) // 2)
    odd = np.frombuffer(text, dtype="<u2", count=(len(text) - 1) // 2, offset=1)
    return bool((even == pair).any() or (odd == pair).any())


def _struct(name: str, fields: Mapping[str, object]) -> type:
    """A Struct type for ``fields``, untracked by the garbage collector
    (decoded JSON holds no cycles): a quarter less time to decode a chunk."""
    members: list[tuple] = []
    for key, default in fields.items():
        if isinstance(default, Mapping):
            members.append((key, Optional[_struct(f"{name}_{key}", default)], None))
            continue
        kind, default = (msgspec.Raw, None) if default is RAW else (Any, default)
        if key.isidentifier():
            members.append((key, kind, default))
        else:
            members.append((attribute(key), kind, msgspec.field(default=default, name=key)))
    return msgspec.defstruct(name, members, gc=False)


def attribute(member: str) -> str:
    """The attribute a projected member is read as: its name, every character that
    cannot be in an identifier replaced by ``_`` (``Collective name``: ``Collective_name``)."""
    name = re.sub(r"\W", "_", member)
    return name if name.isidentifier() else f"_{name}"


class ProjectedChunk:
    """A chunk's events as projections (``events``), with the means to read
    the few a visitor needs whole (:meth:`whole`)."""

    def __init__(self, text: bytes, events: list, elements: list | None = None, folded: bytes | None = None) -> None:
        """``elements``: each event's text, when found (:meth:`Projection.decode_with_lines`);
        ``folded``: the text folded for the exactness test (:func:`read_alike`), which
        the secrets screen reads too."""
        self.text = text
        self.folded = folded
        self.events = events
        self._elements = elements

    def whole(self, at: list[int]) -> list[dict]:
        """The events at positions ``at`` decoded whole, as the fast reading
        decodes them (one decoder call for them all)."""
        if not at:
            return []
        if self._elements is None:
            self._elements = _ELEMENTS.decode(b"[" + self.text + b"]")
        return orjson.loads(b"[" + b",".join(map(self._elements.__getitem__, at)) + b"]")


def _joined_lines(elements: list) -> bytes:
    """The elements one a line.  Line breaks inside an element go, with the
    indentation after them (a carriage return becomes a space): in valid
    JSON, which the elements are, they can only be whitespace between
    tokens, as NUL cannot be at all, so NUL marks where elements end while
    the breaks inside them are removed."""
    lines = b"\n".join(elements)
    if _line_breaks(lines) == len(elements) - 1 and b"\r" not in lines:
        return lines
    marked = b"\0".join(elements)
    if b"\r" in marked:
        marked = marked.translate(_RETURN_TO_SPACE)
    return b"".join(map(bytes.lstrip, marked.split(b"\n"))).replace(b"\0", b"\n")


def _line_breaks(text: bytes) -> int:
    """How many ``\\n`` bytes ``text`` holds: numpy counts them in a third of ``bytes.count``'s time."""
    return int(np.count_nonzero(np.frombuffer(text, dtype=np.uint8) == _NEWLINE))


_NEWLINE = ord("\n")
_RETURN_TO_SPACE = bytes(32 if byte == 13 else byte for byte in range(256))


COLLECTIVE_ARGS = ("External id", "Process Group Name", "Process Group Ranks", "Collective name", "Group size", "dtype",
                   "In msg nelems", "Out msg nelems", "In split size", "Out split size", "Seq", "Src Rank", "Dst Rank")
"""The args of a collective kernel that analyze's collective report reads (besides ``stream`` and ``rank``)."""
COMMS_OP_ARGS = ("Global rank start", "Global rank stride")
"""And those of the record_param_comms op (its group's ranks, with its group name and size)."""
_ANALYSIS_FIELDS = {"ph": None, "cat": None, "name": None, "pid": None, "ts": None, "dur": None,
                    "args": {"stream": None, "original_stream": None, "correlation": None, "rank": None, "name": None,
                             **dict.fromkeys(COLLECTIVE_ARGS + COMMS_OP_ARGS)}}
_ANALYSIS = Projection(_ANALYSIS_FIELDS)
OP_SIGNATURE_ARGS = ("Input Dims", "Input type", "Input Strides", "Concrete Inputs", "Output type")
"""The args of a host op that TraceLens's perf report groups by and its performance models read (as text)."""
_OPS_ORDER = ("ph", "cat", "name", "pid", "tid", "ts", "dur", "id", "args")
"""The members ``analyze --ops`` reads, in the order Kineto writes them: msgspec looks a member up from the
field after the one it matched before, so a field out of that order (``tid`` after ``args``) costs a search."""
_OPS = Projection({key: {**_ANALYSIS_FIELDS["args"], "Sequence number": None, "kernel": None, "labels": None,
                         **dict.fromkeys(OP_SIGNATURE_ARGS, RAW)} if key == "args" else _ANALYSIS_FIELDS.get(key)
                   for key in _OPS_ORDER})
assert set(_ANALYSIS_FIELDS) <= set(_OPS_ORDER)  # (what the index reads is read with ops too)


def projected_events(text: bytes, ops: bool = False) -> list | None:
    """The events of a chunk with the members the analyses read (see :class:`Projection`);
    ``ops``: and those ``analyze --ops`` reads (its op signatures as text, :data:`RAW`)."""
    return (_OPS if ops else _ANALYSIS).decode(text)
