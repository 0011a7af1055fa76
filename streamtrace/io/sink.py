"""Output side: where a trace goes, compressed by suffix or flag, atomically.

Files are written to a temporary name in the target's directory and renamed
only when the whole output is written, so a failure, a kill or a full disk
never leaves a partial or overwritten file behind.  Bucket URLs (``s3://``,
``gs://``) are uploaded in parts and the object appears only when the upload
is completed at the end; a failure aborts it.
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
from .archive import outer_path
from .remote import RemoteUpload, check_writable_url, is_url, remote_exists

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
        self.url = spec if is_url(spec) else None
        if spec == "-":
            self.name, self.path = "<stdout>", None
        elif self.url is not None:
            self.name, self.path = self.url, None
        elif isinstance(spec, (str, os.PathLike)):
            self.name = self.path = os.fspath(spec)
        else:
            self.name, self.path = getattr(spec, "name", None) or "<stream>", None
        self.compression = compression_for(self.path or self.url or "", compress)
        self.level = level
        self.check(inputs)

    @property
    def to_stdout(self) -> bool:
        return self.spec == "-"

    @property
    def rewindable(self) -> bool:
        """Can a failed attempt be thrown away and the output restarted?"""
        return self.path is not None or self.url is not None

    def check(self, inputs: Iterable[str | None] = ()) -> None:
        """Refuse up front what would fail or destroy data at the end."""
        if self.url is not None:
            self._check_url(inputs)
            return
        if self.path is None:
            return
        for source in inputs:  # an archive member (ARCHIVE!MEMBER) lives in its archive
            if source is not None and os.path.exists(self.path) and _same_file(outer_path(source), self.path):
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

    def _publish(self, temp: str) -> None:
        """Move the finished ``temp`` into place.  With overwrite the later of
        two runs renaming at once wins; without, a hard link (which fails if
        the name exists) publishes it, so exactly one of them does and the
        other is refused.  Readers see no file or one whole file."""
        self.check()
        if self.overwrite:
            os.replace(temp, self.path)
            return
        try:
            os.link(temp, self.path)
        except FileExistsError:
            raise _appeared_meanwhile(self.path) from None
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK):
                raise
            os.replace(temp, self.path)  # a filesystem without hard links: check, then rename
            return
        os.unlink(temp)

    def _check_url(self, inputs: Iterable[str | None]) -> None:
        if self.url in inputs:
            raise TraceError("refusing to write onto the input", path=self.url)
        check_writable_url(self.url)
        if not self.overwrite and remote_exists(self.url):
            raise TraceError("exists; pass --overwrite to replace it", path=self.url)

    @contextmanager
    def open(self) -> Iterator[BinaryIO]:
        """A writable binary stream; the file appears only if the block succeeds."""
        if self.url is not None:
            upload = RemoteUpload(self.url)
            try:
                with _compressed(upload, self.compression, self.level, self.background) as out:  # type: ignore[arg-type]
                    yield out
                if not self.overwrite and remote_exists(self.url):
                    raise _appeared_meanwhile(self.url)
                upload.commit()
            except BaseException:
                upload.discard()
                raise
            return
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
            os.fchmod(handle, _permissions_of_a_new_file())  # mkstemp makes 0600: colleagues could not read it
            with os.fdopen(handle, "wb", buffering=WRITE_BUFFER) as raw:
                with _compressed(raw, self.compression, self.level, self.background) as out:
                    yield out
            self._publish(temp)
        except OSError as exc:
            remove_quietly(temp)
            if exc.errno == errno.ENOSPC:
                raise TraceError("disk full while writing", path=self.path) from None
            raise TraceError(f"cannot write: {exc.strerror or exc}", path=self.path) from None
        except BaseException:
            remove_quietly(temp)
            raise


def _appeared_meanwhile(name: str) -> TraceError:
    return TraceError("appeared while this run was writing it; pass --overwrite to replace it", path=name)


def default_output(src: object, tag: str) -> str:
    """``<name><tag>.json.gz`` beside the input (``.json`` and ``.zst`` kept)."""
    if not isinstance(src, (str, os.PathLike)) or src == "-":
        raise TraceError("give an output path with -o when reading from stdin or a stream")
    path = os.fspath(src)
    for suffix in (".json.gz", ".json.zst", ".json"):
        if path.endswith(suffix):
            return path[: -len(suffix)] + tag + suffix
    return path + tag + ".json.gz"


def _permissions_of_a_new_file() -> int:
    """The mode a plain ``open()`` gives a new file: 0666 less the umask."""
    umask = os.umask(0)  # the only way to read it; set straight back
    os.umask(umask)
    return 0o666 & ~umask


def check_output_directory(directory: str) -> None:
    """Refuse now, not after reading the whole input, a directory of outputs
    that cannot be written: a file of that name, or (when it is to be
    created) a nearest existing parent that is not writable."""
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise TraceError("exists and is not a directory", path=directory)
    existing = directory
    while not os.path.isdir(existing):  # the directory is created later: its nearest existing parent decides
        existing = os.path.dirname(os.path.abspath(existing))
    if not os.access(existing, os.W_OK):
        raise TraceError("output directory is not writable", path=directory)


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
