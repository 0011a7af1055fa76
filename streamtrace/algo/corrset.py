"""A compact set of correlation ids.

Kineto numbers runtime calls with small increasing integers, so a bitmap
holds millions of ids in a few hundred KB; odd ids (negative, huge,
non-integer) go to an ordinary set.
"""
from __future__ import annotations

from typing import Iterable

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
