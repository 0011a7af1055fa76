"""Output side: where a trace goes, compressed by suffix or flag, atomically.

Files are written to a temporary name in the target's directory and renamed
only when the whole output is written, so a failure, a kill or a full disk
never leaves a partial or overwritten file behind.  Bucket URLs (``s3://``,
``gs://``) are uploaded in parts and the object appears only when the upload
is completed at the end; a failure aborts it.
"""
from __future__ import annotations

import errno
import os
import secrets
import stat
import sys
from contextlib import contextmanager
from typing import TYPE_CHECKING, BinaryIO, Callable, Iterable, Iterator, Union

import zstandard

from ..errors import TraceError
from ..resources import stop_if_requested
from .archive import outer_path
from .formats import COMPRESSIONS, LEVELS, chosen_level
from .gzipped import GzipPieces, compresses_elsewhere
from .remote import RemoteUpload, check_writable_url, is_url, remote_exists

if TYPE_CHECKING:
    from .redact import Redactor

WRITE_BUFFER = 1 << 20

SinkSpec = Union[str, "os.PathLike[str]", BinaryIO]


# Suffixes that promise a format streamtrace does not write: refused rather than writing plain JSON under
# them.  bzip2 and xz (the standard library's) compress at a few MB/s, ten and more times slower than gzip
# level 1; lz4 and brotli would be new dependencies; archives hold files, not a trace.
UNWRITTEN_SUFFIXES = {
    ".bz2": "bzip2", ".bzip2": "bzip2", ".xz": "xz", ".lzma": "lzma", ".lz": "lzip", ".lz4": "lz4", ".lzo": "lzop",
    ".br": "brotli", ".sz": "snappy", ".z": "compress", ".zip": "zip", ".tar": "tar", ".tgz": "tar",
    ".tbz": "tar", ".tbz2": "tar", ".txz": "tar", ".7z": "7-Zip", ".rar": "RAR",
}
WRITTEN = "it writes gzip for a .gz name, zstd for .zst, uncompressed for any other"


# The formats streamtrace writes, by the suffix under any .gz/.zst: a file named for one holds that one.
FORMATS = {".json": "JSON", ".csv": "CSV", ".parquet": "Parquet", ".html": "HTML", ".txt": "text"}


def inner_suffix(name: str) -> tuple[str, bool]:
    """The suffix under a compression suffix (``x.csv.gz`` -> ``.csv``), and whether there was one."""
    lower = name.lower().rstrip("/")
    for written in (".gz", ".gzip", ".zst", ".zstd"):
        if lower.endswith(written):
            return os.path.splitext(lower[: -len(written)])[1], True
    return os.path.splitext(lower)[1], False


def refuse_unwritten_suffix(name: str) -> None:
    """A name ending in a suffix of :data:`UNWRITTEN_SUFFIXES` (also under
    ``.gz``/``.zst``: ``x.tar.gz``) would promise what the file is not; so
    would ``x.parquet.gz``: Parquet is written only as ``.parquet``, whose
    columns it compresses itself."""
    suffix, compressed = inner_suffix(name)
    if suffix in UNWRITTEN_SUFFIXES:
        raise TraceError(f"streamtrace does not write {UNWRITTEN_SUFFIXES[suffix]} ({suffix}) files; {WRITTEN}",
                         path=name)
    if suffix == ".parquet" and compressed:
        raise TraceError("streamtrace writes Parquet only as .parquet (it compresses the columns itself): "
                         "drop the compression suffix", path=name)


def refuse_other_format(name: str, holds: str) -> None:
    """A file holding ``holds`` (JSON, CSV, ...) named for another format
    streamtrace writes (``trace.csv.gz`` for a JSON trace) would be read as
    that format: refused, naming the suffix it takes."""
    refuse_unwritten_suffix(name)  # (x.parquet.gz: say how Parquet is written)
    suffix = inner_suffix(name)[0]
    if FORMATS.get(suffix, holds) != holds:
        wanted = next(known for known, kind in FORMATS.items() if kind == holds)
        raise TraceError(f"this writes {holds}, not {FORMATS[suffix]}: give a name ending in {wanted}"
                         + ("[.gz|.zst]" if holds != "Parquet" else ""), path=name)


def compression_for(path: str, flag: str | None) -> str:
    """The flag, or the suffix (``.gz``, ``.zst``), else none; a flag
    contradicting a compression suffix is refused (``x.json.gz`` holding
    zstd), and so is a suffix naming a format not written, whatever the flag."""
    refuse_unwritten_suffix(path)
    lower = path.lower()
    named = "gzip" if lower.endswith((".gz", ".gzip")) else "zstd" if lower.endswith((".zst", ".zstd")) else None
    if flag:
        if flag not in COMPRESSIONS:
            raise TraceError(f"unknown compression {flag!r}; choose from {', '.join(COMPRESSIONS)}")
        if named not in (None, flag):
            raise TraceError(f"--compress {flag} contradicts the name, which says {named}: drop one of them",
                             path=path)
        return flag
    return named or "none"


def same_file(a: str, b: str) -> bool:
    """Do the names reach one file (hard links and symlinks included)?"""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def check_file(path: str, inputs: Iterable[str | None] = (), *, overwrite: bool = False,
               directory_planned: bool = False) -> None:
    """The rules for one local file a run will write, checked before it is
    written: not an input (an archive member ``ARCHIVE!MEMBER`` lives in its
    archive), not a directory, not an existing file unless ``overwrite``, in
    a writable directory (unless ``directory_planned``: the run creates it
    and has checked its parent)."""
    exists = os.path.lexists(path)
    for source in inputs:
        if source is not None and exists and same_file(outer_path(source), path):
            raise TraceError("refusing to write onto the input", path=path)
    if special_file(path):
        return  # written in place, as a shell's redirection writes it: nothing there is replaced
    if exists and stat.S_ISBLK(os.stat(path).st_mode):
        raise TraceError("is a block device (a disk); give an output file name", path=path)
    if os.path.isdir(path):
        raise TraceError("is a directory; give an output file name", path=path)
    if exists and not overwrite:
        raise TraceError("exists; pass --overwrite to replace it", path=path)
    if directory_planned:
        return
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise TraceError("output directory does not exist", path=path)
    if not os.access(directory, os.W_OK):
        raise TraceError("output directory is not writable", path=path)


def special_file(path: str) -> bool:
    """A character device, a pipe or a socket (``/dev/null``, ``/dev/stdout``,
    a FIFO): a finished file renamed onto it would replace the node itself,
    so it is written in place instead."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return stat.S_ISCHR(mode) or stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


def publish(temp: str, final: str, overwrite: bool) -> None:
    """Move the finished ``temp`` to ``final`` (same filesystem).  With
    overwrite the later of two runs renaming at once wins; without, a hard
    link (which fails if the name exists) publishes it, so exactly one of them
    does and the other is refused.  Readers see no file or one whole file."""
    stop_if_requested()
    if overwrite:
        os.replace(temp, final)
        return
    try:
        os.link(temp, final)
    except FileExistsError:
        raise _appeared_meanwhile(final) from None
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK):
            raise
        os.replace(temp, final)  # a filesystem without hard links: checked, then renamed
        return
    os.unlink(temp)


def publish_all(moves: Iterable[tuple[str, str]], overwrite: bool) -> None:
    """Publish several finished files (``(temp, final)`` pairs) as one:
    when one fails (a name that appeared meanwhile), those already published
    are taken back.  Without overwrite they were new names, so nothing is
    lost; with it a rename cannot fail on a name."""
    done: list[str] = []
    try:
        for temp, final in moves:
            if not overwrite and os.path.lexists(final):
                raise _appeared_meanwhile(final)
            publish(temp, final, overwrite)
            done.append(final)
    except BaseException:
        if not overwrite:
            for final in done:
                remove_quietly(final)
        raise


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
        self.check(inputs)  # first: writing onto an input is the gravest mistake, and said so
        self.compression = compression_for(self.path or self.url or "", compress)
        check_level(self.compression, level)
        self.level = level

    @property
    def to_stdout(self) -> bool:
        return self.spec == "-"

    @property
    def plain_file(self) -> bool:
        """A local file written as the writer gives it (uncompressed, not
        redacted): other processes may write parts of it in place."""
        return (self.path is not None and self.compression == "none" and self.redactor is None
                and not special_file(self.path))

    @property
    def pieces_level(self) -> int | None:
        """For a gzip output that other processes may compress pieces of
        (not redacted: redaction happens in the writer), its level."""
        if self.compression != "gzip" or self.redactor is not None or not compresses_elsewhere():
            return None
        return chosen_level("gzip", self.level)

    @property
    def rewindable(self) -> bool:
        """Can a failed attempt be thrown away and the output restarted?"""
        return self.path is not None or self.url is not None

    def check(self, inputs: Iterable[str | None] = ()) -> None:
        """Refuse up front what would fail or destroy data at the end."""
        if self.url is not None:
            self._check_url(inputs)
        elif self.path is not None:
            check_file(self.path, inputs, overwrite=self.overwrite)

    def _check_url(self, inputs: Iterable[str | None]) -> None:
        if self.url in inputs:
            raise TraceError("refusing to write onto the input", path=self.url)
        check_writable_url(self.url)
        if not self.overwrite and remote_exists(self.url):
            raise TraceError("exists; pass --overwrite to replace it", path=self.url)

    @contextmanager
    def open(self, *, hold: Callable[[str], None] | None = None) -> Iterator[BinaryIO]:
        """A writable binary stream; the file appears only if the block succeeds.
        ``hold`` (local files): called with the finished temporary file instead
        of publishing it, for a caller that publishes several at once."""
        if self.url is not None:
            upload = RemoteUpload(self.url, exclusive=not self.overwrite)  # no race: the store refuses a taken name
            try:
                with compressed(upload, self.compression, self.level, self.background) as out:  # type: ignore[arg-type]
                    yield out
                if not self.overwrite and remote_exists(self.url):
                    raise _appeared_meanwhile(self.url)
                upload.commit()
            except FileExistsError:
                upload.discard()
                raise _appeared_meanwhile(self.url) from None
            except BaseException:
                upload.discard()
                raise
            return
        if self.path is None:
            raw = sys.stdout.buffer if self.to_stdout else self.spec
            with compressed(raw, self.compression, self.level, self.background) as out:
                yield out
            raw.flush()
            return
        if special_file(self.path):
            try:
                with open(self.path, "wb", buffering=WRITE_BUFFER) as raw:
                    with compressed(raw, self.compression, self.level, self.background) as out:
                        yield out
            except OSError as exc:
                raise _unwritable(exc, self.path) from None
            return
        directory = os.path.dirname(os.path.abspath(self.path))
        base = os.path.basename(self.path)
        temp = ""
        try:
            while True:  # the name is known before the file exists: a stop at any moment knows what to remove
                temp = os.path.join(directory, f".{base}.{secrets.token_hex(4)}.part")
                try:  # mode 0666 less the umask, as a plain open() gives: colleagues can read the output
                    handle = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
                    break
                except FileExistsError:
                    continue
        except OSError as exc:
            raise TraceError(f"cannot create a file here: {exc.strerror}", path=self.path) from None
        except BaseException:  # a stop (Ctrl-C) while the file was being made, from whichever thread got the signal
            remove_quietly(temp)
            raise
        try:
            with os.fdopen(handle, "wb", buffering=WRITE_BUFFER) as raw:
                with compressed(raw, self.compression, self.level, self.background) as out:
                    yield out
            if hold is not None:
                hold(temp)
                return
            self.check()
            publish(temp, self.path, self.overwrite)
        except OSError as exc:
            remove_quietly(temp)
            raise _unwritable(exc, self.path) from None
        except BaseException:
            remove_quietly(temp)
            raise


def _unwritable(exc: OSError, path: str) -> TraceError:
    if exc.errno == errno.ENOSPC:
        return TraceError("disk full while writing", path=path)
    return TraceError(f"cannot write: {exc.strerror or exc}", path=path)


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


def remove_quietly(path: str) -> None:
    """Delete ``path`` if it is there."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def make_folders(folder: str) -> list[str]:
    """``os.makedirs(folder)``, returning the folders it created, outermost
    first: what :func:`remove_empty_folders` takes away if the run fails."""
    missing = []
    step = folder
    while step and not os.path.isdir(step):
        missing.append(step)
        parent = os.path.dirname(step)
        if parent == step:
            break
        step = parent
    os.makedirs(folder, exist_ok=True)
    return missing[::-1]


def remove_empty_folders(created: list[str]) -> None:
    """Remove the folders a failed run created (from :func:`make_folders`),
    deepest first, each only while empty."""
    for folder in reversed(created):
        try:
            os.rmdir(folder)
        except OSError:
            pass


def check_level(compression: str, level: int | None) -> None:
    """Refuse a level the compressor would reject (at the end of a long pass, with a traceback)."""
    levels = LEVELS.get(compression)
    if level is not None and levels is not None and level not in levels:
        raise TraceError(f"--level {level}: {compression} takes levels {levels.start} to {levels.stop - 1}")


@contextmanager
def compressed(raw: BinaryIO, compression: str, level: int | None, background: bool = True) -> Iterator[BinaryIO]:
    """Wrap ``raw`` in a compressor; closing flushes it but leaves ``raw`` open.
    ``background``: zstd compresses in a helper thread (several MB of
    buffers); gzip compresses each piece as it fills (see ``gzipped``)."""
    if compression == "none":
        yield raw
        return
    if compression == "gzip":
        pieces = GzipPieces(raw, chosen_level("gzip", level))
        yield pieces  # type: ignore[misc]
        pieces.close()
        return
    compressor = zstandard.ZstdCompressor(level=chosen_level("zstd", level), threads=1 if background else 0)
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
