"""A compact set of correlation ids.

Kineto numbers runtime calls with small increasing integers, so a bitmap
holds millions of ids in a few hundred KB; odd ids (negative, huge,
non-integer) go to an ordinary set.
"""
from __future__ import annotations

from typing import Iterable

import numpy as np

BITMAP_LIMIT = 1 << 28


class CorrelationSet:
    __slots__ = ("_bits", "_others")

    def __init__(self) -> None:
        self._bits = bytearray()
        self._others: set = set()

    def add(self, value: object) -> None:
        if type(value) is int and 0 <= value < BITMAP_LIMIT:
            index = value >> 3
            bits = self._bits
            if index >= len(bits):
                bits.extend(bytes(max(index + 1 - len(bits), len(bits))))
            bits[index] |= 1 << (value & 7)
        else:
            self._others.add(value)

    def __contains__(self, value: object) -> bool:
        if type(value) is int and 0 <= value < BITMAP_LIMIT:
            index = value >> 3
            return index < len(self._bits) and bool(self._bits[index] & (1 << (value & 7)))
        return value in self._others

    def as_int(self) -> int:
        """The bitmap part as one big integer (bit i set = id i present)."""
        return int.from_bytes(self._bits, "little")

    def __len__(self) -> int:
        return self.as_int().bit_count() + len(self._others)

    def union_update(self, other: "CorrelationSet") -> None:
        if len(other._bits) > len(self._bits):
            self._bits.extend(bytes(len(other._bits) - len(self._bits)))
        merged = (self.as_int() | other.as_int()).to_bytes(len(self._bits), "little")
        self._bits[:] = merged
        self._others |= other._others


    def add_each(self, values: np.ndarray) -> None:
        """:meth:`add` for each of an int64 array."""
        inside = (values >= 0) & (values < BITMAP_LIMIT)
        chosen = values[inside]
        if len(chosen):
            top = int(chosen.max()) >> 3
            if top >= len(self._bits):
                self._bits.extend(bytes(max(top + 1 - len(self._bits), len(self._bits))))
            view = np.frombuffer(self._bits, dtype=np.uint8)
            np.bitwise_or.at(view, chosen >> 3, np.left_shift(1, chosen & 7).astype(np.uint8))
            del view  # (a bytearray with a live view cannot grow)
        if len(chosen) != len(values):
            self._others.update(values[~inside].tolist())

    def export(self) -> tuple[int, bytes, set]:
        """The set as (first byte, the bitmap's bytes from there to its last
        set bit, the odd ids): small for the ids of a part of a trace."""
        bits = self._bits
        start = len(bits) - len(bits.lstrip(b"\0"))
        return start, bytes(bits[start:len(bits.rstrip(b"\0"))]), set(self._others)

    def update_exported(self, exported: tuple[int, bytes, set]) -> None:
        """Add the ids of another set's :meth:`export`."""
        start, bits, others = exported
        if bits:
            end = start + len(bits)
            if end > len(self._bits):
                self._bits.extend(bytes(end - len(self._bits)))
            view = np.frombuffer(self._bits, dtype=np.uint8)
            view[start:end] |= np.frombuffer(bits, dtype=np.uint8)
            del view  # (a bytearray with a live view cannot grow)
        self._others |= others

    def contains_each(self, values: np.ndarray) -> np.ndarray:
        """``value in self`` for each of an int64 array."""
        inside = (values >= 0) & (values < min(BITMAP_LIMIT, len(self._bits) * 8))
        found = np.zeros(len(values), dtype=bool)
        if inside.any():
            chosen = values[inside]
            bits = np.frombuffer(self._bits, dtype=np.uint8)
            found[inside] = (bits[chosen >> 3] >> (chosen & 7).astype(np.uint8)) & 1 == 1
        if self._others:
            outside = np.flatnonzero((values < 0) | (values >= BITMAP_LIMIT))
            found[outside] = [value in self._others for value in values[outside].tolist()]
        return found


def count_shared(sets: Iterable[CorrelationSet]) -> int:
    """How many ids occur in at least two of the sets."""
    seen = twice = 0
    seen_other: set = set()
    twice_other: set = set()
    for item in sets:
        bits = item.as_int()
        twice |= seen & bits
        seen |= bits
        twice_other |= seen_other & item._others
        seen_other |= item._others
    return twice.bit_count() + len(twice_other)
