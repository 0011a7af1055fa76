"""gzip output cut into pieces at fixed offsets, each compressed on its own.

A gzip file holds one deflate stream, but that stream may be a run of
parts, each ended by a sync flush, compressed one by one (as ``pigz``
writes them).  Cutting the uncompressed text at every multiple of
:attr:`GzipPieces.PIECE` and compressing each piece with a new compressor
makes the file a function of the text alone: the same bytes however the
writes fell and whichever process compressed which piece.  So pass-2
workers that know where their block lands (see ``engine.parallel``)
compress the whole pieces inside it themselves and send only those, with
the crc of what they cover; the writer compresses the pieces that straddle
two blocks.

Each compressor is given the one byte before its piece as its dictionary.
That is not for the ratio: isal's compressor, started without one, leaves
part of its state to whatever its memory held, and then compresses a piece
now and then differently from one process to the next (measured: 1 KiB
pieces of a trace, 4 processes in 12 wrote other bytes; 128 KiB pieces of
a 0.49 GB trace, 2 in 10; none in 16 with the byte, and none with address
randomisation off).  The first piece of a file, which has no byte before
it, goes through zlib, which has no such state.  Pieces of 128 KiB make the
file about 6% larger than one stream does (37.5 MB against 35.4 MB for the
compacted 0.51 GB rank of docs/benchmarks.md): a piece starts with no
history to refer back to.
"""
from __future__ import annotations

import struct
import zlib
from typing import BinaryIO

from ..errors import TraceError

try:
    from isal import isal_zlib
except ImportError:  # the `fast` extra is optional
    isal_zlib = None

_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"  # gzip, deflate, no name, mtime 0, unknown OS
_LAST = b"\x03\x00"  # an empty final block: ends the deflate stream after the last sync-flushed piece
_TRAILER = struct.Struct("<II")  # crc32 and length mod 2**32 of the uncompressed text
_PLACED = struct.Struct("<QQQI")  # head bytes, compressed bytes, the text they cover, its crc32


def compresses_elsewhere() -> bool:
    """Can pieces compressed in another process be joined here?  (Their
    crcs are combined with isal's ``crc32_combine``; the standard library
    has none.)"""
    return isal_zlib is not None


class GzipPieces:
    """A writable gzip stream over ``raw`` (see the module); :meth:`close`
    finishes it and leaves ``raw`` open.  :meth:`flush` writes nothing: a
    piece is compressed only when it is whole, or at the end."""

    PIECE = 128 << 10

    def __init__(self, raw: BinaryIO, level: int) -> None:
        self._raw = raw
        self._level = level
        self._pending = bytearray()  # the text of the piece not yet whole
        self._before = b""  # the byte before it
        self._crc = 0
        self.position = 0  # uncompressed bytes so far
        raw.write(_HEADER)

    def write(self, data: bytes | bytearray | memoryview) -> int:
        self._crc = _crc32(data, self._crc)
        self.position += len(data)
        pending = self._pending
        pending += data
        if len(pending) >= self.PIECE:
            whole = len(pending) - len(pending) % self.PIECE
            # a copy, not a view: a view that outlives the call (a sampling profiler keeping the frame, as
            # Dask's workers run) would forbid resizing the buffer
            pieces = pending[:whole]
            self._raw.write(_deflate_pieces(memoryview(pieces), self._before, self._level, self.PIECE))
            self._before = bytes(pieces[-1:])
            del pending[:whole]
        return len(data)

    def seek(self, offset: int) -> int:
        """Only to where the stream stands (a writer whose reserved
        fragments have all been placed seeks there)."""
        if offset != self.position:
            raise TraceError(f"validation failed: gzip output at byte {self.position}, asked to go to {offset}")
        return offset

    def flush(self) -> None:
        """Nothing: flushing a partial piece would make the file depend on when it was called."""

    def close(self) -> None:
        if self._pending:
            self._raw.write(_deflate_piece(bytes(self._pending), self._before, self._level))
            self._pending = bytearray()
        self._raw.write(_LAST + _TRAILER.pack(self._crc, self.position & 0xFFFFFFFF))

    @classmethod
    def placed(cls, text: bytes, at: int, before: bytes, level: int) -> bytes:
        """``text``, which goes at uncompressed offset ``at`` after the byte
        ``before``, for :meth:`add_placed`: its whole pieces compressed
        here, the bytes before the first and after the last piece boundary
        as they are."""
        head_length = min(-at % cls.PIECE, len(text))
        whole = (len(text) - head_length) // cls.PIECE * cls.PIECE
        if not whole:
            return _PLACED.pack(len(text), 0, 0, 0) + text
        end = head_length + whole
        covered = memoryview(text)[head_length:end]
        compressed = _deflate_pieces(covered, text[head_length - 1:head_length] if head_length else before, level,
                                     cls.PIECE)
        return b"".join((_PLACED.pack(head_length, len(compressed), whole, _crc32(covered, 0)), text[:head_length],
                         compressed, text[end - 1:]))

    def add_placed(self, message: memoryview) -> None:
        """Write a text that :meth:`placed` prepared for this stream's current position."""
        head_length, compressed_length, covered, crc = _PLACED.unpack_from(message)
        at = _PLACED.size
        self.write(message[at:at + head_length])
        if not covered:
            return
        at += head_length
        if self._pending:
            raise TraceError("validation failed: a compressed piece does not start at a piece boundary")
        self._raw.write(message[at:at + compressed_length])
        at += compressed_length
        self._crc = isal_zlib.crc32_combine(self._crc, crc, covered)  # type: ignore[union-attr]
        self.position += covered
        self._before = bytes(message[at:at + 1])  # the last byte the pieces covered
        self.write(message[at + 1:])


def _deflate_pieces(text: memoryview, before: bytes, level: int, piece: int) -> bytes:
    """Whole pieces of ``text``, which follows the byte ``before``."""
    parts = [_deflate_piece(text[:piece], before, level)]
    parts += [_deflate_piece(text[at:at + piece], text[at - 1:at], level) for at in range(piece, len(text), piece)]
    return b"".join(parts)


def _deflate_piece(text: bytes | bytearray | memoryview, before: bytes | memoryview, level: int) -> bytes:
    """One piece as raw deflate ending on a byte boundary (a sync flush),
    not final, given the byte before it as its dictionary (see the module)."""
    module = isal_zlib if isal_zlib is not None and level <= 3 and before else zlib
    if before:
        compressor = module.compressobj(level, zlib.DEFLATED, -15, zdict=bytes(before))
    else:
        compressor = module.compressobj(level, zlib.DEFLATED, -15)
    return compressor.compress(text) + compressor.flush(zlib.Z_SYNC_FLUSH)


def _crc32(data: bytes | bytearray | memoryview, crc: int) -> int:
    return (isal_zlib or zlib).crc32(data, crc)
