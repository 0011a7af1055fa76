"""Input side: where trace bytes come from and how they are decompressed.

A source is a path, ``-`` (stdin), a binary file object, or (with the
scheme's extra) an fsspec URL.  Compression is told by magic bytes, never
by the file name.  A source can be opened more than once: a local file is
reopened, anything else is copied to a spool file while it is first read,
so a remote object is downloaded once (unless ``reread_remote``: then
each reading downloads it again and nothing is copied).
"""
from __future__ import annotations

import glob
import gzip
import os
import sys
import tempfile
import zlib
from typing import BinaryIO, Union

import zstandard

from ..errors import TraceError
from . import archive
from .remote import RemoteReader, is_url
from .scratch import spool_writes

try:
    from isal import igzip as _fast_gzip
    from isal.isal_zlib import IsalError as _IsalError  # isal's corrupt-data error is no zlib.error
except ImportError:  # the `fast` extra is optional
    _fast_gzip = None
    _IsalError = zlib.error

GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
READ_SIZE = 1 << 20
ZSTD_READ_SIZE = 128 << 10  # compressed bytes per step: traces inflate 10-30x, keep the output small

SourceSpec = Union[str, "os.PathLike[str]", BinaryIO]


class TruncatedInput(EOFError):
    """The compressed stream ended before its end marker."""


class _CountingReader:
    """Counts the raw bytes read (for progress) and copies them to a spool."""

    def __init__(self, raw: BinaryIO, spool: BinaryIO | None, prefix: bytes = b"", spool_path: str = "") -> None:
        self._raw = raw
        self._spool = spool
        self._spool_path = spool_path
        self._prefix = prefix
        self.bytes_read = 0

    def read(self, size: int = -1) -> bytes:
        if self._prefix:
            data, self._prefix = self._prefix, b""
            if size is not None and 0 <= size < len(data):
                data, self._prefix = data[:size], data[size:]
        else:
            data = self._raw.read(size)
        self.bytes_read += len(data)
        if self._spool is not None and data:
            with spool_writes(self._spool_path):
                self._spool.write(data)
        return data

    def readinto(self, buffer) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def readable(self) -> bool:
        return True

    def plain_descriptor(self) -> int | None:
        """The descriptor of the file read, when the reading may jump in it
        (:meth:`seek`): a seekable file, copied nowhere, nothing held back."""
        if self._spool is not None or self._prefix:
            return None
        try:
            return self._raw.fileno() if self._raw.seekable() else None
        except (AttributeError, OSError, ValueError):  # not a file of the OS
            return None

    def seek(self, offset: int) -> None:
        """Go on reading at ``offset``; the bytes before it count as read."""
        self._raw.seek(offset)
        self.bytes_read = offset

    def close(self) -> None:
        self._raw.close()

    def drain(self) -> None:
        """Read the rest so that the spool holds the whole input."""
        while self.read(READ_SIZE):
            pass


class DecodedStream:
    """Decompressed bytes of one reading of a source."""

    def __init__(self, counter: _CountingReader, compression: str, name: str) -> None:
        self.counter = counter
        self.compression = compression
        self.name = name
        self._ahead = b""  # bytes peeked at, handed out first
        self._deferred: Exception | None = None  # what the peek ran into, raised where the reading gets to it
        if compression == "gzip":
            opener = _fast_gzip.IGzipFile if _fast_gzip is not None else gzip.GzipFile
            self._reader = opener(fileobj=counter, mode="rb")
        elif compression == "zstd":
            self._reader = _ZstdFrames(counter)
        else:
            self._reader = counter

    @property
    def raw_bytes_read(self) -> int:
        return self.counter.bytes_read

    def peek(self, size: int) -> bytes:
        """Up to ``size`` first bytes, still to be read; a decoding failure
        on the way is raised by the read that reaches it, as without a peek."""
        while len(self._ahead) < size and self._deferred is None:
            try:
                more = self._decode(size - len(self._ahead))
            except (TruncatedInput, TraceError) as exc:
                self._deferred = exc
                break
            if not more:
                break
            self._ahead += more
        return self._ahead[:size]

    def plain_file(self) -> int | None:
        """The descriptor of the file whose bytes this reading is, as they
        are (nothing to decompress), when the reading may jump in it
        (:meth:`seek`); else None."""
        if self.compression != "none" or self._ahead or self._deferred is not None:
            return None
        return self.counter.plain_descriptor()

    def seek(self, offset: int) -> None:
        """Go on reading at ``offset`` of the :meth:`plain_file`."""
        self.counter.seek(offset)

    def read(self, size: int) -> bytes:
        if self._ahead:
            data, self._ahead = self._ahead[:size], self._ahead[size:]
            return data
        if self._deferred is not None:
            failure, self._deferred = self._deferred, None
            raise failure
        return self._decode(size)

    def close(self) -> None:
        self.counter.close()

    def _decode(self, size: int) -> bytes:
        try:
            return self._reader.read(size)
        except EOFError as exc:
            raise TruncatedInput(f"{self.compression} data ends early ({exc})") from None
        except (OSError, zlib.error, _IsalError, zstandard.ZstdError) as exc:
            if "truncat" in str(exc).lower() or "end-of-stream" in str(exc).lower():
                raise TruncatedInput(f"{self.compression} data ends early ({exc})") from None
            raise TraceError(f"corrupt {self.compression} data (found after {self.counter.bytes_read} compressed "
                             f"bytes): {exc}", path=self.name) from None


class _ZstdFrames:
    """zstd frames one after another, like ``stream_reader(read_across_frames=True)``,
    but a frame cut short is an error (``stream_reader`` just stops)."""

    def __init__(self, raw: _CountingReader) -> None:
        self._raw = raw
        self._context = zstandard.ZstdDecompressor()
        self._frame = self._context.decompressobj()
        self._frame_started = False
        self._pending = b""
        self._pos = 0

    def read(self, size: int) -> bytes:
        while self._pos >= len(self._pending):
            chunk = self._raw.read(ZSTD_READ_SIZE)
            if not chunk:
                if self._frame_started and not self._frame.eof:
                    raise EOFError("the last zstd frame has no end")
                return b""
            self._decompress(chunk)
        data = self._pending[self._pos:self._pos + size]
        self._pos += len(data)
        return data

    def _decompress(self, chunk: bytes) -> None:
        parts = []
        while chunk:
            if self._frame.eof:
                self._frame = self._context.decompressobj()
            parts.append(self._frame.decompress(chunk))
            self._frame_started = True
            chunk = self._frame.unused_data if self._frame.eof else b""
        self._pending, self._pos = b"".join(parts), 0


def detect_compression(head: bytes) -> str:
    """``gzip``, ``zstd`` or ``none`` from the first bytes."""
    if head.startswith(GZIP_MAGIC):
        return "gzip"
    if head.startswith(ZSTD_MAGIC):
        return "zstd"
    return "none"


class InputSource:
    """A trace input that can be read from the start more than once.

    An archive holding one trace reads as that trace; ``ARCHIVE!MEMBER``
    names one member (see :mod:`.archive`).
    """

    def __init__(self, spec: SourceSpec, *, spool_dir: str | None = None, reread_remote: bool = False) -> None:
        self._spec = spec
        self._spool_dir = spool_dir
        self._reread = reread_remote and is_url(spec)
        self.downloads = 0
        self.readings = 0
        self.spooled_bytes = 0
        self._path: str | None = None
        self._stream: BinaryIO | None = None
        self._owned: BinaryIO | None = None
        self._spool_path: str | None = None
        self._counter: _CountingReader | None = None
        self._member: tuple[str, str] | None = None if is_url(spec) else archive.split_member(spec)
        self._member_kind: str | None = None
        self._inner: InputSource | None = None  # the trace inside an archive read as a trace
        if self._member is not None:
            self.name = str(spec)
        elif spec == "-":
            self.name = "<stdin>"
            self._stream = sys.stdin.buffer
        elif is_url(spec):
            self.name = str(spec)
        elif isinstance(spec, (str, os.PathLike)):
            self.name = os.fspath(spec)
            self._path = self.name
            if not os.path.exists(self._path):
                raise TraceError("no such file" + ("; this reads one trace file, not a pattern standing for several"
                                                   if glob.has_magic(self.name) else ""), path=self.name)
            if os.path.isdir(self._path):
                raise TraceError(f"is a directory, expected one trace file: give one of {directory_glob(self.name)} "
                                 "(commands that take several inputs run on each)", path=self.name)
        else:
            self.name = getattr(spec, "name", None) or "<stream>"
            self._stream = spec

    @property
    def path(self) -> str | None:
        """The local file path, when the source is one."""
        return self._path

    @property
    def file_bytes(self) -> str | None:
        """The local file whose bytes a reading (once opened) decodes: the
        trace file itself, not an archive or a copy holding it."""
        return self._path if self._inner is None else None

    @property
    def location(self) -> str | None:
        """The local path, the URL, or ``ARCHIVE!MEMBER`` for a member: what
        an output must not overwrite."""
        if self._path is not None:
            return self._path
        return self.name if is_url(self._spec) or self._member is not None else None

    @property
    def size(self) -> int | None:
        """Raw (possibly compressed) size in bytes, when known up front."""
        if self._path is not None:
            return os.path.getsize(self._path)
        return None

    def open(self) -> DecodedStream:
        """A fresh reading from the first byte (of the trace in an archive)."""
        self.readings += 1
        if self._inner is not None:
            return self._inner.open()
        if self._path is not None or self._member_in_place():
            raw: BinaryIO = open(self._path, "rb") if self._path is not None else self._member_reader()
            self._close_owned()
            self._owned = raw
            spool = None
        elif self._reread:
            self._close_owned()
            raw = self._first_stream()
            spool = None
        elif self._spool_path is None:
            raw = self._first_stream()
            spool = self._new_spool()
        else:
            self._finish_spool()
            raw = open(self._spool_path, "rb")
            self._close_owned()
            self._owned = raw
            spool = None
        head = _read_exactly(raw, 4)
        counter = _CountingReader(raw, spool, head, self._spool_path or "")
        if spool is not None:
            self._counter = counter
        stream = DecodedStream(counter, detect_compression(head), self.name)
        if self._member is None:  # an archive in an archive is not looked into
            kind = archive.kind_of(stream.peek(archive.TAR_BLOCK), stream.compression)
            if kind is not None:
                return self._open_single_trace(kind)
        return stream

    def _open_single_trace(self, kind: str) -> DecodedStream:
        """Read an archive holding one trace as that trace; refuse any other archive."""
        if self._path is None:
            self._finish_spool()  # the archive, whole, in the spool: listed and read from there
        local = self._path or self._spool_path
        members = archive.list_members(kind, local, lambda: _decoded_file(local))
        if len(members) != 1:
            raise archive.refusal(kind, members, self.name)
        self._close_owned()
        self._inner = InputSource(f"{local}{archive.MEMBER_SEPARATOR}{members[0]}", spool_dir=self._spool_dir)
        self._inner.name = f"{self.name}{archive.MEMBER_SEPARATOR}{members[0]}"
        return self._inner.open()

    def _kind_of_member_archive(self) -> str:
        if self._member_kind is None:
            with _decoded_file(self._member[0]) as stream:
                kind = archive.kind_of(stream.peek(archive.TAR_BLOCK), stream.compression)
            if kind is None:
                raise TraceError("is not a tar or zip archive", path=self._member[0])
            self._member_kind = kind
        return self._member_kind

    def _member_in_place(self) -> bool:
        """Is this a member read in place (again at every reading, no spool)?"""
        return self._member is not None and archive.reopenable(self._kind_of_member_archive(), self._member[0])

    def _member_reader(self) -> archive.MemberReader:
        local, member = self._member
        return archive.MemberReader(self._kind_of_member_archive(), local, lambda: _decoded_file(local), member)

    def _first_stream(self) -> BinaryIO:
        if self._member is not None:
            self._owned = self._member_reader()
            return self._owned
        if self._stream is not None:
            return self._stream
        self._owned = RemoteReader(self.name)  # type: ignore[assignment]
        self.downloads += 1
        return self._owned  # type: ignore[return-value]

    def describe(self) -> dict:
        """The summary's ``input``, and for a URL how it was read: downloads,
        readings, and the bytes kept in a local copy for later readings."""
        if not is_url(self._spec):
            return {"input": self.name}
        return {"input": self.name, "remote_input": {
            "downloads": self.downloads, "readings": self.readings, "spooled_bytes": self.spooled_bytes,
            "reread_remote": self._reread}}

    def _new_spool(self) -> BinaryIO:
        handle, self._spool_path = tempfile.mkstemp(prefix="streamtrace-input-", suffix=".spool", dir=self._spool_dir)
        return os.fdopen(handle, "wb")

    def _finish_spool(self) -> None:
        """Copy what the first reading left unread, so the spool is whole."""
        counter, self._counter = self._counter, None
        if counter is None:
            return
        counter.drain()
        with spool_writes(self._spool_path):
            counter._spool.close()
        self.spooled_bytes = counter.bytes_read

    def _close_owned(self) -> None:
        if self._owned is not None:
            self._owned.close()
            self._owned = None

    def close(self) -> None:
        """Release files and delete the spool; safe to call twice."""
        if self._inner is not None:
            self._inner.close()
            self._inner = None
        if self._counter is not None and self._counter._spool is not None:
            try:
                self._counter._spool.close()
            except OSError:  # a full disk: the copy is being thrown away anyway
                pass
            self.spooled_bytes = self._counter.bytes_read
            self._counter = None
        self._close_owned()
        if self._spool_path is not None:
            try:
                os.unlink(self._spool_path)
            except FileNotFoundError:
                pass
            self._spool_path = None

    def __enter__(self) -> "InputSource":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def directory_glob(directory: str) -> str:
    """The glob naming a directory's traces, as a user would type it."""
    return f"'{directory.rstrip(os.sep)}{os.sep}*.json*'"


def archive_members(spec: str) -> list[str] | None:
    """The traces in a local archive file as ``ARCHIVE!MEMBER`` names (merge
    reads them like a directory of rank files); None if ``spec`` is not an archive."""
    if not os.path.isfile(spec):
        return None
    with _decoded_file(spec) as stream:
        kind = archive.kind_of(stream.peek(archive.TAR_BLOCK), stream.compression)
    if kind is None:
        return None
    members = archive.list_members(kind, spec, lambda: _decoded_file(spec))
    if not members:
        raise archive.refusal(kind, members, spec)
    return [f"{spec}{archive.MEMBER_SEPARATOR}{member}" for member in members]


class _ClosingStream(DecodedStream):
    """A decoded reading of a local file that closes the file after a ``with``."""

    def __enter__(self) -> "_ClosingStream":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _decoded_file(path: str) -> _ClosingStream:
    """A fresh decompressed reading of a local file (no archive look-through)."""
    raw = open(path, "rb")
    head = _read_exactly(raw, 4)
    return _ClosingStream(_CountingReader(raw, None, head), detect_compression(head), path)


def _read_exactly(raw: BinaryIO, size: int) -> bytes:
    data = b""
    while len(data) < size:
        more = raw.read(size - len(data))
        if not more:
            break
        data += more
    return data

