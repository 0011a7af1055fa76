"""Event spool: pass 1 keeps each event as one compact JSON line.

Pass 2 then reads lines instead of parsing the input again: an unchanged
event is copied as bytes, only patched ones are decoded.  The spool is
zstd-compressed in a temporary directory and always deleted.
"""
from __future__ import annotations

import os
import queue
import tempfile
import threading
from array import array
from contextlib import contextmanager
from typing import IO, Callable, Iterator

import numpy as np
import zstandard

from .eventtext import dumped_batch
from .scratch import spool_writes

SPOOL_LEVEL = -5  # zstd's fast levels: half the time of level 1 to write, a quarter to read; about twice the size
READ_BLOCK = 1 << 20
MAX_SEGMENT = 4 << 20
"""Compressed bytes a segment may have for :meth:`EventSpool.segments` (a
worker decompresses one whole: pass 1's frames are a fraction of this)."""
Segments = list[tuple[int, int, int, int]]
"""Runs of a spool file's lines that decompress on their own: (start byte,
end byte, first line, lines) each."""
_DTYPES = {code: np.dtype(np.int8 if code == "b" else np.uint8 if code == "B" else code) for code in "bBhHiIqd"}


class EventSpool:
    """A temporary file of event lines, written once and read back once."""

    def __init__(self, directory: str | None = None, *, path: str | None = None) -> None:
        """A new spool in ``directory``, or (``path``) a rewrite of an existing
        spool's file by another process: see :meth:`parseproc.parse_in_child`."""
        if path is None:
            handle, self.path = tempfile.mkstemp(prefix="streamtrace-events-", suffix=".zst", dir=directory)
            self._file = os.fdopen(handle, "wb")
        else:
            self.path = path
            self._file = open(path, "wb")
        self._writer = self._new_writer()
        self._owned = path is None
        self._ends: list[tuple[int, int]] | None = [] if self._owned else None
        self._streamed = 0  # events written through the compressor since the last frame boundary

    def _new_writer(self) -> zstandard.ZstdCompressionWriter:
        """A compressor that works in a background thread while parsing goes on."""
        return zstandard.ZstdCompressor(level=SPOOL_LEVEL, threads=1).stream_writer(self._file, closefd=False)

    def reset(self) -> None:
        """Forget everything written: the input is being read again."""
        with spool_writes(self.path):
            self._writer.close()
            self._file.seek(0)
            self._file.truncate()
        self._writer = self._new_writer()
        self._ends = [] if self._owned else None
        self._streamed = 0

    def add_lines(self, lines: list[bytes]) -> None:
        """Keep a batch of event lines (one compressor call per line would be slow)."""
        if lines:
            self.add_text(b"\n".join(lines), len(lines))

    def add_text(self, text: bytes | memoryview, lines: int | None = None) -> None:
        """Keep event lines given as one text, newlines between them
        (``lines`` of them: without the count, :meth:`segments` knows none)."""
        with spool_writes(self.path):
            self._writer.write(text)
            self._writer.write(b"\n")
        if lines is None:
            self._ends = None
        else:
            self._streamed += lines

    @staticmethod
    def frame_encoder() -> Callable[[list], bytes]:
        """Events as spool lines in one zstd frame, for :meth:`add_frame` (made by a pass-1 worker)."""
        compressor = zstandard.ZstdCompressor(level=SPOOL_LEVEL)
        return lambda events: compressor.compress(b"".join((dumped_batch(events, 0)[1], b"\n")))

    @staticmethod
    def text_frame_encoder() -> Callable[[bytes], bytes]:
        """Spool lines already made (:meth:`~streamtrace.io.projection.Projection.decode_with_lines`)
        in one zstd frame, for :meth:`add_frame`."""
        compressor = zstandard.ZstdCompressor(level=SPOOL_LEVEL)
        return lambda lines: compressor.compress(lines + b"\n")

    def add_events(self, events: list, first_index: int) -> None:
        """Keep parsed events (``first_index``: the first one's, for errors)."""
        self.add_text(dumped_batch(events, first_index)[1], len(events))

    def add_frame(self, frame: bytes | memoryview, lines: int) -> None:
        """Keep ``lines`` event lines another process compressed: one or
        more whole zstd frames (of lines, each followed by a newline), after
        the lines kept so far.  The reading side reads across frames."""
        with spool_writes(self.path):
            self._writer.flush(zstandard.FLUSH_FRAME)
            self._end_streamed()
            self._file.write(frame)
            self._end_segment(lines)

    def _end_streamed(self) -> None:
        """The lines streamed through the compressor since the last segment,
        now flushed to a frame's end, are a segment."""
        self._end_segment(self._streamed)
        self._streamed = 0

    def _end_segment(self, lines: int) -> None:
        """What is in the file so far ends a segment of ``lines`` lines (none: no segment)."""
        if lines and self._ends is not None:
            self._ends.append((self._file.tell(), lines))

    def segments(self) -> Segments | None:
        """The finished file as runs of whole lines that decompress on their
        own: (start, end, first line, lines) each, so that several readers
        can share the work without each reading everything; None when not
        known (the lines were written by another process, or without
        counts), when the file is one run, or when a run is too big to
        hold in memory at once (lines streamed here, not framed by pass 1's
        workers)."""
        self.finish()
        if not self._ends or len(self._ends) < 2:
            return None
        runs, start, first = [], 0, 0
        for end, lines in self._ends:
            runs.append((start, end, first, lines))
            start, first = end, first + lines
        last_start, _, last_first, last_lines = runs[-1]
        runs[-1] = (last_start, os.path.getsize(self.path), last_first, last_lines)  # with the closing empty frame
        if max(end - start for start, end, _, _ in runs) > MAX_SEGMENT:
            return None
        return runs

    def read_segment(self, start: int, end: int) -> list[bytes]:
        """The lines of one of :meth:`segments`, without newlines."""
        with open(self.path, "rb") as raw:
            raw.seek(start)
            compressed = raw.read(end - start)
        lines = zstandard.ZstdDecompressor().stream_reader(compressed, read_across_frames=True).read().split(b"\n")
        lines.pop()  # after the last newline
        return lines

    def finish(self) -> None:
        """Close the writing side (idempotent)."""
        if self._file is not None and not self._file.closed:
            with spool_writes(self.path):
                try:
                    if not self._writer.closed:  # (a failed reset closes it)
                        self._writer.flush(zstandard.FLUSH_FRAME)
                        self._end_streamed()
                    self._writer.close()
                finally:
                    self._file.close()

    def __getstate__(self) -> dict:
        """A finished spool travels between processes by its path; the
        receiving process then owns (and deletes) the file."""
        self.finish()
        return {"path": self.path}

    def __setstate__(self, state: dict) -> None:
        self.path = state["path"]
        self._file = None
        self._writer = None
        self._owned, self._ends, self._streamed = False, None, 0

    def read_blocks(self) -> Iterator[list[bytes]]:
        """The lines in order, without newlines, a block (about 1 MB) at a time.

        Decompression runs in a background thread (zstd releases the GIL), so
        it overlaps with the caller's work on the previous block.
        """
        self.finish()
        blocks: queue.Queue = queue.Queue(maxsize=4)
        stop = threading.Event()
        reader = threading.Thread(target=self._decompress_into, args=(blocks, stop), daemon=True)
        reader.start()
        carry = b""
        try:
            while True:
                block = blocks.get()
                if isinstance(block, BaseException):
                    raise block
                if not block:
                    break
                lines = (carry + block).split(b"\n")
                carry = lines.pop()
                yield lines
            if carry:
                yield [carry]
        finally:
            stop.set()
            while reader.is_alive():
                try:
                    blocks.get(timeout=0.1)
                except queue.Empty:
                    pass

    def line_lengths(self) -> Iterator[np.ndarray]:
        """The byte length of every line, in order, a block at a time (a
        reading that never splits the text into line objects)."""
        self.finish()
        carry = 0
        with open(self.path, "rb") as raw:
            reader = zstandard.ZstdDecompressor().stream_reader(raw, read_size=READ_BLOCK)
            while True:
                block = reader.read(READ_BLOCK)
                if not block:
                    break
                ends = np.flatnonzero(np.frombuffer(block, dtype=np.uint8) == 10)
                if not len(ends):
                    carry += len(block)
                    continue
                lengths = np.diff(ends, prepend=-1) - 1  # without the newline
                lengths[0] += carry
                carry = len(block) - 1 - int(ends[-1])
                yield lengths
        if carry:
            yield np.array([carry], dtype=np.int64)

    def _decompress_into(self, blocks: queue.Queue, stop: threading.Event) -> None:
        try:
            with open(self.path, "rb") as raw:
                reader = zstandard.ZstdDecompressor().stream_reader(raw, read_size=READ_BLOCK, read_across_frames=True)
                while not stop.is_set():
                    block = reader.read(READ_BLOCK)
                    blocks.put(block)
                    if not block:
                        return
        except BaseException as exc:  # handed to the consumer, which raises it
            blocks.put(exc)

    def close(self) -> None:
        """Delete the spool; safe to call twice, and also when flushing it fails (disk full)."""
        try:
            self.finish()
        finally:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass

    def __enter__(self) -> "EventSpool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextmanager
def parked(owner: object, names: tuple[str, ...], directory: str | None = None) -> Iterator[None]:
    """Keep the arrays (``array``, ``bytearray`` or 1-d numpy) ``owner.<name>``
    in a temporary file while the block runs, and put them back after it:
    arrays only a later stage reads then take no memory at an earlier
    stage's peak.  Nothing else may hold them meanwhile (or they are not
    freed)."""
    with tempfile.TemporaryFile(prefix="streamtrace-parked-", dir=directory) as file:
        kept = []
        with spool_writes(directory or tempfile.gettempdir()):
            for name in names:
                value = getattr(owner, name)
                kept.append((name, _blank_of(value)))
                file.write(value)
                setattr(owner, name, None)
            file.flush()
        del value
        yield
        file.seek(0)
        for name, blank in kept:
            restored = blank()
            file.readinto(memoryview(restored).cast("B"))
            setattr(owner, name, restored)


def _blank_of(value: array | bytearray | np.ndarray) -> Callable[[], array | bytearray | np.ndarray]:
    """Makes an empty array of ``value``'s kind and size, to read it back into."""
    if isinstance(value, np.ndarray):
        dtype, length = value.dtype, len(value)
        return lambda: np.empty(length, dtype)
    if isinstance(value, array):
        typecode, length = value.typecode, len(value)
        return lambda: array(typecode, [0]) * length  # (from bytes, the array would be held twice)
    size = len(value)
    return lambda: bytearray(size)


class ColumnSpill:
    """Per-event columns (typed arrays) kept on disk between the passes.

    Pass 1 appends to in-memory columns; every ``CHUNK`` events they go to an
    unnamed temporary file (made at the first such move: a spill that never
    fills, such as a pass-1 worker's, makes none), so memory stays constant
    however many events there are.  :meth:`chunks` gives them back in order
    as numpy arrays.
    """

    CHUNK = 1 << 16

    def __init__(self, typecodes: str, directory: str | None = None) -> None:
        self._typecodes = typecodes
        self._directory = directory
        self._file: IO[bytes] | None = None
        self.columns = tuple(array(code) for code in typecodes)
        self._sizes: list[int] = []

    def full(self) -> bool:
        return len(self.columns[0]) >= self.CHUNK

    def flush(self) -> None:
        """Move the in-memory columns to the file."""
        count = len(self.columns[0])
        if not count:
            return
        if self._file is None:
            self._file = tempfile.TemporaryFile(prefix="streamtrace-columns-", dir=self._directory)
        for column in self.columns:
            if len(column) != count:
                raise ValueError("spilled columns differ in length")
            column.tofile(self._file)
            del column[:]
        self._sizes.append(count)

    def chunks(self) -> Iterator[tuple[np.ndarray, ...]]:
        """The columns, a chunk at a time, in the order they were added."""
        self.flush()
        if self._file is None:
            return
        self._file.seek(0)
        for count in self._sizes:
            yield tuple(np.fromfile(self._file, dtype=_DTYPES[code], count=count) for code in self._typecodes)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
