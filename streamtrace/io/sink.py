"""Output side: where a trace goes, compressed by suffix or flag, atomically.

Files are written to a temporary name in the target's directory and renamed
only when the whole output is written, so a failure, a kill or a full disk
never leaves a partial or overwritten file behind.
"""
from __future__ import annotations

import errno
import gzip
import os
import sys
import tempfile
from contextlib import contextmanager
from typing import TYPE_CHECKING, BinaryIO, Iterable, Iterator, Union

import zstandard

from ..errors import TraceError

if TYPE_CHECKING:
    from .redact import Redactor

try:
    from isal import igzip as _isal_gzip
    from isal import igzip_threaded as _fast_gzip
except ImportError:  # the `fast` extra is optional
    _fast_gzip = _isal_gzip = None

COMPRESSIONS = ("none", "gzip", "zstd")
DEFAULT_LEVEL = {"gzip": 1, "zstd": 3}
WRITE_BUFFER = 1 << 20

SinkSpec = Union[str, "os.PathLike[str]", BinaryIO]


def compression_for(path: str, flag: str | None) -> str:
    """The flag wins; else the suffix (``.gz``, ``.zst``); else none."""
    if flag:
        if flag not in COMPRESSIONS:
            raise TraceError(f"unknown compression {flag!r}; choose from {', '.join(COMPRESSIONS)}")
        return flag
    lower = path.lower()
    if lower.endswith((".gz", ".gzip")):
        return "gzip"
    if lower.endswith((".zst", ".zstd")):
        return "zstd"
    return "none"


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


class OutputTarget:
    """One output of a command: a path, ``-`` or a binary file object."""

    def __init__(
        self,
        spec: SinkSpec,
        *,
        overwrite: bool = False,
        compress: str | None = None,
        level: int | None = None,
        inputs: Iterable[str | None] = (),
        background: bool = True,
        redactor: Redactor | None = None,
    ) -> None:
        self.spec = spec
        self.redactor = redactor  # for the TraceWriter of this output: see io.writer
        self.background = background  # compress in a helper thread (several MB of buffers per output)
        self.overwrite = overwrite
        if spec == "-":
            self.name, self.path = "<stdout>", None
        elif isinstance(spec, (str, os.PathLike)):
            self.name = self.path = os.fspath(spec)
        else:
            self.name, self.path = getattr(spec, "name", None) or "<stream>", None
        self.compression = compression_for(self.path or "", compress)
        self.level = level
        self.check(inputs)

    @property
    def to_stdout(self) -> bool:
        return self.spec == "-"

    @property
    def rewindable(self) -> bool:
        """Can a failed attempt be thrown away and the output restarted?"""
        return self.path is not None

    def check(self, inputs: Iterable[str | None] = ()) -> None:
        """Refuse up front what would fail or destroy data at the end."""
        if self.path is None:
            return
        for source in inputs:
            if source is not None and os.path.exists(self.path) and _same_file(source, self.path):
                raise TraceError("refusing to write onto the input", path=self.path)
        if os.path.isdir(self.path):
            raise TraceError("is a directory; give an output file name", path=self.path)
        if os.path.exists(self.path) and not self.overwrite:
            raise TraceError("exists; pass --overwrite to replace it", path=self.path)
        directory = os.path.dirname(os.path.abspath(self.path))
        if not os.path.isdir(directory):
            raise TraceError("output directory does not exist", path=self.path)
        if not os.access(directory, os.W_OK):
            raise TraceError("output directory is not writable", path=self.path)

    @contextmanager
    def open(self) -> Iterator[BinaryIO]:
        """A writable binary stream; the file appears only if the block succeeds."""
        if self.path is None:
            raw = sys.stdout.buffer if self.to_stdout else self.spec
            with _compressed(raw, self.compression, self.level, self.background) as out:
                yield out
            raw.flush()
            return
        directory = os.path.dirname(os.path.abspath(self.path))
        base = os.path.basename(self.path)
        try:
            handle, temp = tempfile.mkstemp(prefix=f".{base}.", suffix=".part", dir=directory)
        except OSError as exc:
            raise TraceError(f"cannot create a file here: {exc.strerror}", path=self.path) from None
        try:
            with os.fdopen(handle, "wb", buffering=WRITE_BUFFER) as raw:
                with _compressed(raw, self.compression, self.level, self.background) as out:
                    yield out
            self.check()
            os.replace(temp, self.path)
        except OSError as exc:
            remove_quietly(temp)
            if exc.errno == errno.ENOSPC:
                raise TraceError("disk full while writing", path=self.path) from None
            raise TraceError(f"cannot write: {exc.strerror or exc}", path=self.path) from None
        except BaseException:
            remove_quietly(temp)
            raise


def default_output(src: object, tag: str) -> str:
    """``<name><tag>.json.gz`` beside the input (``.json`` and ``.zst`` kept)."""
    if not isinstance(src, (str, os.PathLike)) or src == "-":
        raise TraceError("give an output path with -o when reading from stdin or a stream")
    path = os.fspath(src)
    for suffix in (".json.gz", ".json.zst", ".json"):
        if path.endswith(suffix):
            return path[: -len(suffix)] + tag + suffix
    return path + tag + ".json.gz"


def remove_quietly(path: str) -> None:
    """Delete ``path`` if it is there."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


@contextmanager
def _compressed(raw: BinaryIO, compression: str, level: int | None, background: bool = True) -> Iterator[BinaryIO]:
    """Wrap ``raw`` in a compressor; closing flushes it but leaves ``raw`` open."""
    if compression == "none":
        yield raw
        return
    if compression == "gzip":
        chosen = DEFAULT_LEVEL["gzip"] if level is None else level
        if _fast_gzip is not None and chosen <= 3 and background:
            # compresses in a background thread, off the GIL: overlaps with the event loop
            writer = _fast_gzip.open(raw, "wb", compresslevel=chosen, threads=1)
        elif _isal_gzip is not None and chosen <= 3:
            writer = _isal_gzip.IGzipFile(fileobj=raw, mode="wb", compresslevel=chosen, mtime=0)
        else:
            writer = gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=chosen, mtime=0)
    else:
        chosen = DEFAULT_LEVEL["zstd"] if level is None else level
        compressor = zstandard.ZstdCompressor(level=chosen, threads=1 if background else 0)
        writer = compressor.stream_writer(raw, closefd=False)
    even = EvenWrites(writer)
    try:
        yield even  # type: ignore[misc]
        even.flush()
    finally:
        writer.close()


class EvenWrites:
    """Hands a compressor its input in pieces of one fixed size.

    Compressors cut their blocks where the writes fall, so the same bytes
    written in different pieces compress to different files; feeding them
    in even pieces keeps the output identical however the caller batched
    its writes (one process or several, any batch size).
    """

    PIECE = 1 << 20

    def __init__(self, inner: BinaryIO) -> None:
        self._inner = inner
        self._pending = bytearray()

    def write(self, data: bytes | memoryview) -> int:
        pending = self._pending
        pending += data
        if len(pending) >= self.PIECE:
            whole = len(pending) - len(pending) % self.PIECE
            for at in range(0, whole, self.PIECE):  # copies: a threaded compressor may keep what it is given
                self._inner.write(bytes(pending[at:at + self.PIECE]))
            del pending[:whole]
        return len(data)

    def flush(self) -> None:
        """Write what is pending (the last, shorter piece)."""
        if self._pending:
            self._inner.write(bytes(self._pending))
            self._pending.clear()
