"""A run's objects under a bucket prefix, for clusters whose machines share no filesystem.

With ``--spool-dir s3://bucket/prefix`` (any writable fsspec URL) and
``--dask``, the tasks keep what outlives a task (a rank's parked state and
event spool, its output fragment) as objects under a prefix of the run's own
(:class:`RunStore`); their scratch files stay on the worker's own disk, in
a directory removed when the task ends.

Everything under the prefix is deleted when the run ends, whatever ends it.
A task abandoned by a stopped run may still be running on its worker and
upload later; the prefix's marker object (``.live``) closes that gap: a
task checks it after each upload and deletes what it uploaded when the
marker is gone, and the coordinator deletes the marker before it lists and
deletes the prefix.  An upload is thus either finished before that listing
(and deleted by it) or sees the marker gone (and deletes itself); buckets
list what is written at once (S3 has been strongly consistent since 2020).

Where the output is itself an ``s3://`` object, :func:`assemble_s3` makes it
from the fragments inside the store (a multipart upload whose parts are
copies of objects, ``UploadPartCopy``), so the merged bytes never pass
through the coordinator.
"""
from __future__ import annotations

import asyncio
import os
import posixpath
import shutil
import sys
import tempfile
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from typing import BinaryIO, Iterator

from ..errors import TraceError, TransferError
from ..resources import stop_if_requested
from .remote import _condition_refused, _filesystem, _name_taken, failure_reason, scheme_of

LIVE_MARKER = ".live"
RUN_PREFIX = "streamtrace-run-"
S3_SCHEMES = ("s3", "s3a")
MIN_PART = 5 << 20  # S3: every part of a multipart upload but the last has at least 5 MiB
MAX_PARTS = 10_000  # S3: parts per multipart upload
MAX_PART = 5 << 30  # S3: bytes per part
COPIES_AT_ONCE = 16  # part copies under way together (S3 copies each at its own pace)


@dataclass(frozen=True)
class RunStore:
    """The run's prefix (``url``, no trailing slash); small and picklable, sent with each task."""

    url: str

    @classmethod
    def start(cls, spool_url: str) -> "RunStore":
        """A fresh prefix under ``spool_url`` with its marker (the first write: it checks access)."""
        store = cls(f"{spool_url.rstrip('/')}/{RUN_PREFIX}{uuid.uuid4().hex[:12]}")
        fs, marker = _filesystem(store.object_url(LIVE_MARKER))
        try:
            fs.pipe_file(marker, b"")
        except Exception as exc:
            raise TraceError(f"cannot write to the spool URL: {failure_reason(exc)}", path=spool_url) from None
        return store

    def object_url(self, name: str) -> str:
        return f"{self.url}/{name}"

    def is_live(self) -> bool:
        fs, marker = _filesystem(self.object_url(LIVE_MARKER))
        fs.invalidate_cache(marker)
        return fs.exists(marker)

    def put(self, local: str) -> str:
        """Upload a task's file under a name of its own; returns the object's URL.

        (Names unique in one worker's directory may meet another worker's:
        each gets a random prefix.)  An upload that ends after the run
        stopped is deleted again (see the module's note), and says so as the
        task's error."""
        url = self.object_url(f"{uuid.uuid4().hex[:12]}-{os.path.basename(local)}")
        fs, path = _filesystem(url)
        uploaded = False
        try:
            if not self.is_live():
                raise TraceError("the run has stopped", path=self.url)
            fs.put_file(local, path)
            uploaded = True
            if not self.is_live():
                raise TraceError("the run has stopped", path=self.url)
        except BaseException as exc:
            if uploaded:  # whatever failed after the upload, its object must not outlive the task
                try:
                    fs.rm_file(path)
                except Exception:  # (under the run's prefix: removed with it, when the run is still on)
                    pass
            if isinstance(exc, TraceError) or not isinstance(exc, Exception):
                raise
            step = "check that the run is still on after uploading" if uploaded else "upload"
            raise TransferError(f"cannot {step} a spool object: {failure_reason(exc)}", path=url) from None
        return url

    def get(self, url: str, directory: str) -> str:
        """Download an object of the run into ``directory``; returns the local path."""
        local = os.path.join(directory, posixpath.basename(url))
        fs, path = _filesystem(url)
        try:
            fs.get_file(path, local)
        except Exception as exc:
            raise TransferError(f"cannot download a spool object: {failure_reason(exc)}", path=url) from None
        return local

    def remove(self) -> None:
        """Delete the marker, then everything under the prefix.  A failing
        delete does not replace the run's own outcome (its error, if any, is
        the one to tell): it is said in a warning naming what stays."""
        fs, marker = _filesystem(self.object_url(LIVE_MARKER))
        prefix = marker.rsplit("/", 1)[0]
        try:
            fs.rm_file(marker)
        except FileNotFoundError:
            pass
        except Exception as exc:
            _left_behind(self.object_url(""), exc)
            return
        try:
            fs.invalidate_cache(prefix)
            found = fs.find(prefix)
            if found:
                fs.rm(found)
        except Exception as exc:
            _left_behind(self.object_url(""), exc)


def _left_behind(where: str, exc: Exception) -> None:
    print(f"streamtrace: warning: could not delete the run's spool objects under {where} ({failure_reason(exc)}); "
          "delete them, or let a lifecycle rule of the bucket do it", file=sys.stderr)


@contextmanager
def scratch() -> Iterator[str]:
    """A task's own directory on its worker's disk, removed when the task ends."""
    directory = tempfile.mkdtemp(prefix="streamtrace-task-")
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def reachable(url: str) -> str | None:
    """Why a worker cannot use the run's prefix at ``url`` (its marker unreadable), or None."""
    try:
        fs, marker = _filesystem(f"{url}/{LIVE_MARKER}")
        if fs.exists(marker):
            return None
        return "its objects are not visible from the worker (another endpoint or bucket?)"
    except TraceError as exc:
        return exc.args[0] if exc.args else str(exc)
    except Exception as exc:
        return failure_reason(exc)


def open_object(url: str) -> BinaryIO:
    """An object of the run, open for reading (a file object: text wrappers and copies take it)."""
    fs, path = _filesystem(url)
    try:
        return fs.open(path, "rb")
    except Exception as exc:
        raise TransferError(f"cannot open a spool object: {failure_reason(exc)}", path=url) from None


def same_s3_store(*urls: str) -> bool:
    """Can objects at these URLs be copied into each other server-side (all s3://, one endpoint's settings)?"""
    return all(scheme_of(url) in S3_SCHEMES for url in urls)


def part_groups(sizes: list[int], min_part: int = MIN_PART, max_parts: int = MAX_PARTS) -> list[list[int]]:
    """The fragments (by index, in order) each part of a multipart upload is
    made of: consecutive fragments gathered until a part has ``min_part``
    bytes (the last may have fewer), with parts large enough that there are
    at most ``max_parts``.  A part of one fragment is a server-side copy; a
    part of several must first be joined into one object."""
    target = max(min_part, -(-sum(sizes) // max_parts))
    groups: list[list[int]] = []
    current: list[int] = []
    held = 0
    for n, size in enumerate(sizes):
        current.append(n)
        held += size
        if held >= target:
            groups.append(current)
            current, held = [], 0
    if current:
        if groups and held < target and len(groups) >= max_parts:
            groups[-1].extend(current)
        else:
            groups.append(current)
    return groups


def join_objects(urls: list[str], store: RunStore) -> str:
    """The objects at ``urls``, one after the other, as one new object of the run (on a worker)."""
    with scratch() as directory:
        joined = os.path.join(directory, f"joined-{uuid.uuid4().hex[:12]}")
        with open(joined, "wb") as out:
            for url in urls:
                local = store.get(url, directory)
                with open(local, "rb") as piece:
                    shutil.copyfileobj(piece, out, 1 << 20)
                os.unlink(local)
        return store.put(joined)


def copy_ranges(size: int, max_part: int = MAX_PART) -> list[tuple[int, int]]:
    """An object of ``size`` bytes as the byte ranges (first, last) of the
    parts that copy it: one, or even shares of at most ``max_part`` bytes."""
    shares = max(1, -(-size // max_part))
    cuts = [size * n // shares for n in range(shares + 1)]
    return [(first, after - 1) for first, after in zip(cuts, cuts[1:])]


def assemble_s3(output: str, parts: list[tuple[str, int]], *, overwrite: bool) -> None:
    """Make the object ``output`` from the objects ``parts`` ((URL, size) each)
    in order, inside the store: one multipart upload whose parts are copies
    (of a whole object, or a range of one over 5 GiB), several at a time.
    Every object but the last must have at least 5 MiB.  Nothing appears
    unless every part is copied; a failure aborts the upload."""
    from fsspec.asyn import sync  # (the s3 extra's: _filesystem has checked it is there)

    fs, path = _filesystem(output)
    bucket, key, _ = fs.split_path(path)
    copies = []
    for url, size in parts:
        source_bucket, source_key, _ = fs.split_path(_filesystem(url)[1])
        whole = {"Bucket": source_bucket, "Key": source_key}
        ranges = copy_ranges(size, MAX_PART)
        copies.extend({"CopySource": whole} if len(ranges) == 1 else
                      {"CopySource": whole, "CopySourceRange": f"bytes={first}-{last}"} for first, last in ranges)
    if len(copies) > MAX_PARTS:
        raise TraceError(f"would take {len(copies):,} parts (S3 allows {MAX_PARTS:,}); write a local file", path=output)

    def call(doing: str, method: str, **kwargs):
        try:
            return fs.call_s3(method, Bucket=bucket, Key=key, **kwargs)
        except Exception as exc:
            raise TransferError(f"cannot {doing}: {failure_reason(exc)}", path=output) from None

    upload = call("start the upload", "create_multipart_upload")["UploadId"]

    async def copy_all() -> list[dict]:
        """Every part's copy, :data:`COPIES_AT_ONCE` under way at a time (on fsspec's event loop)."""
        turn = asyncio.Semaphore(COPIES_AT_ONCE)

        async def copy(number: int) -> dict:
            async with turn:
                copied = await fs._call_s3("upload_part_copy", Bucket=bucket, Key=key, UploadId=upload,
                                           PartNumber=number, **copies[number - 1])
            return {"PartNumber": number, "ETag": copied["CopyPartResult"]["ETag"]}

        return await asyncio.gather(*(copy(number) for number in range(1, len(copies) + 1)))

    try:
        try:
            done = sync(fs.loop, copy_all)
        except Exception as exc:
            raise TransferError(f"cannot copy a fragment into the output: {failure_reason(exc)}", path=output) from None
        stop_if_requested()
        fs.invalidate_cache(path)
        appeared = TraceError("appeared while this run was writing it; pass --overwrite to replace it", path=output)
        if not overwrite and fs.exists(path):
            raise appeared
        finish = {"UploadId": upload, "MultipartUpload": {"Parts": done}}
        try:  # without overwrite, only if the name is still free when it completes (as RemoteUpload does)
            fs.call_s3("complete_multipart_upload", Bucket=bucket, Key=key, **finish,
                       **({} if overwrite else {"IfNoneMatch": "*"}))
        except Exception as exc:
            if _name_taken(exc):
                raise appeared from None
            if overwrite or not _condition_refused(exc):
                raise TransferError(f"cannot complete the upload: {failure_reason(exc)}", path=output) from None
            call("complete the upload", "complete_multipart_upload", **finish)  # the store ignores conditions
    except BaseException:
        try:
            fs.call_s3("abort_multipart_upload", Bucket=bucket, Key=key, UploadId=upload)
        except Exception as exc:  # the run's error is the one to tell; the parts are said to stay
            print(f"streamtrace: warning: could not abort the multipart upload {upload} of {output} "
                  f"({failure_reason(exc)}): its parts stay until a lifecycle rule of the bucket removes them",
                  file=sys.stderr)
        raise
    fs.invalidate_cache(path)


def remote_glob(pattern: str) -> list[str]:
    """The objects a URL with wildcards names, as URLs, sorted."""
    fs, path = _filesystem(pattern)
    try:
        found = sorted(fs.glob(path))
    except Exception as exc:
        raise TraceError(f"cannot list: {failure_reason(exc)}", path=pattern) from None
    return [fs.unstrip_protocol(name) for name in found]
