"""Bucket and web URLs through fsspec: which extra each scheme needs, reading
with failures told in one line, and uploads that appear only when complete.

fsspec and the scheme's package (aiohttp, s3fs, gcsfs) are optional: each
comes with an extra of its own, and a missing one is named in the error.
Endpoints, credentials and other options come from the scheme's usual
configuration (``AWS_ENDPOINT_URL``, ``~/.aws``, ``FSSPEC_S3_ENDPOINT_URL``,
fsspec config files), read by fsspec itself.
"""
from __future__ import annotations

import importlib

from ..errors import TraceError, TransferError

URL_SCHEMES = ("s3://", "s3a://", "gs://", "gcs://", "az://", "abfs://", "http://", "https://", "hf://", "file://")
# scheme -> (module it needs, extra that brings it); the other schemes name fsspec's own advice
SCHEME_EXTRAS = {
    "http": ("aiohttp", "http"),
    "https": ("aiohttp", "http"),
    "s3": ("s3fs", "s3"),
    "s3a": ("s3fs", "s3"),
    "gs": ("gcsfs", "gcs"),
    "gcs": ("gcsfs", "gcs"),
}
WRITABLE_SCHEMES = ("s3", "s3a", "gs", "gcs")
UPLOAD_PART = 8 << 20  # memory held per upload; S3 allows 10,000 parts: objects up to 78 GiB
# what aiohttp, botocore and the standard library raise when a connection ends early (by class name:
# those packages are optional)
LOST_CONNECTION = ("ClientPayloadError", "ServerDisconnectedError", "ClientConnectionError", "ClientOSError",
                   "IncompleteRead", "IncompleteReadError", "ResponseStreamingError", "ProtocolError",
                   "ConnectionError", "ConnectionResetError", "ConnectionAbortedError", "BrokenPipeError")


def is_url(spec: object) -> bool:
    return isinstance(spec, str) and spec.startswith(URL_SCHEMES)


def scheme_of(url: str) -> str:
    return url.split("://", 1)[0].lower()


def _filesystem(url: str, *, fresh: bool = False):
    """(fsspec filesystem, path in it) for ``url``; a missing package is named with its extra.
    ``fresh``: a new instance (fsspec hands out one per options), which reads its credentials again."""
    scheme = scheme_of(url)
    module, extra = SCHEME_EXTRAS.get(scheme, ("fsspec", "cloud"))
    for needed in ("fsspec", module):
        try:
            importlib.import_module(needed)
        except ImportError:
            raise TraceError(f"{scheme}:// URLs need the '{extra}' extra ({needed} is not installed): "
                             f"pip install 'streamtrace[{extra}]'", path=url) from None
    from fsspec.core import url_to_fs

    try:
        return url_to_fs(url, skip_instance_cache=True) if fresh else url_to_fs(url)
    except ImportError as exc:  # a scheme without an extra here (az://, hf://): fsspec says what to install
        raise TraceError(f"{scheme}:// URLs need a package that is not installed: {exc}", path=url) from None
    except Exception as exc:  # a malformed URL or bad fsspec configuration
        raise TraceError(f"cannot use this URL: {failure_reason(exc)}", path=url) from None


def failure_reason(exc: BaseException) -> str:
    """What went wrong with a remote object, in words: the HTTP status (and
    the store's error code) when one is known anywhere in the exception's
    causes, else its type and text."""
    status, code = _status_of(exc)
    if status in (401, 403) or (status is None and isinstance(exc, PermissionError)):
        return "access denied" + (f" (HTTP {status}{code})" if status else "")
    if status == 404 or (status is None and isinstance(exc, FileNotFoundError)):
        return "not found" + (f" (HTTP {status})" if status else "")
    if status is not None:
        return f"HTTP {status}{code}"
    detail = f"{type(exc).__name__}: {str(exc).strip() or 'no details'}"
    if any(kind.__name__ in LOST_CONNECTION for kind in type(exc).__mro__):
        return f"the connection was closed before the object's end ({detail})"
    return detail


def _status_of(exc: BaseException) -> tuple[int | None, str]:
    """The HTTP status found first in ``exc`` and its causes, and the
    store's error code (`` ExpiredToken``; empty when none is given)."""
    seen: BaseException | None = exc
    while seen is not None:
        found = getattr(seen, "status", None)  # aiohttp's ClientResponseError
        response = getattr(seen, "response", None)
        if found is None and isinstance(response, dict):  # botocore's ClientError
            found = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if isinstance(found, int):
            code = response.get("Error", {}).get("Code") if isinstance(response, dict) else None
            return found, f" {code}" if code and code != str(found) else ""
        seen = seen.__cause__ or seen.__context__
    return None, ""


class RemoteReader:
    """A remote object being downloaded; any failure becomes one line
    saying how far the download got."""

    def __init__(self, url: str) -> None:
        self.url = url
        fs, path = _filesystem(url)
        try:
            self._file = fs.open(path, "rb")
        except Exception as exc:  # fsspec backends raise many kinds; all mean "cannot open"
            raise TraceError(f"cannot open: {failure_reason(exc)}", path=url) from None
        self.bytes_read = 0

    def read(self, size: int = -1) -> bytes:
        try:
            data = self._file.read(size)
        except Exception as exc:
            raise TransferError(f"download failed at byte {self.bytes_read:,}: {failure_reason(exc)}",
                             path=self.url) from None
        self.bytes_read += len(data)
        return data

    def close(self) -> None:
        try:
            self._file.close()
        except Exception:  # nothing was written: a failing close loses nothing
            pass


def remote_exists(url: str) -> bool:
    fs, path = _filesystem(url)
    try:
        return fs.exists(path)
    except Exception as exc:
        raise TraceError(f"cannot check the output: {failure_reason(exc)}", path=url) from None


def check_writable_url(url: str) -> None:
    """Refuse up front an output URL that cannot be uploaded to."""
    if scheme_of(url) not in WRITABLE_SCHEMES:
        raise TraceError(f"cannot write to {scheme_of(url)}:// URLs; write to a local path, s3:// or gs://",
                         path=url)
    _filesystem(url)


class RemoteUpload:
    """An object upload that appears only on :meth:`commit` (S3: a multipart
    upload completed then; GCS: a resumable upload finished then).  Parts are
    uploaded as the writing goes on, so memory stays at one part.

    ``exclusive``: the object is created only if no object has the name when
    the upload completes (S3 ``If-None-Match: *``, GCS ``ifGenerationMatch=0``),
    so of two runs completing at once exactly one succeeds; :meth:`commit`
    raises :class:`FileExistsError` for the other.  Where the condition
    cannot be asked (an s3fs or botocore too old to send it) or is not
    taken (a store answering 501 Not Implemented), the upload is completed
    without it: the caller checks the name just before.
    """

    def __init__(self, url: str, *, exclusive: bool = False) -> None:
        self.url = url
        fs, path = _filesystem(url)
        try:
            self._file = fs.open(path, "xb" if exclusive else "wb", autocommit=False, block_size=UPLOAD_PART)
        except (ValueError, NotImplementedError):  # an fsspec or s3fs without exclusive writes
            self._file = self._call("start the upload", fs.open, path, "wb", autocommit=False, block_size=UPLOAD_PART)
        except Exception as exc:
            raise TransferError(f"cannot start the upload: {failure_reason(exc)}", path=self.url) from None

    def _call(self, doing: str, function, *args, **kwargs):
        try:
            return function(*args, **kwargs)
        except Exception as exc:
            raise TransferError(f"cannot {doing}: {failure_reason(exc)}", path=self.url) from None

    def write(self, data: bytes | memoryview) -> int:
        return self._call("upload", self._file.write, data)

    def flush(self) -> None:
        """Parts go up when a part's worth is buffered, not on every flush."""

    def commit(self) -> None:
        """Upload what is buffered and make the object appear."""
        self._call("upload", self._file.close)
        try:
            self._file.commit()
        except Exception as exc:
            if _name_taken(exc):
                raise FileExistsError(self.url) from None
            if "x" not in self._file.mode or not _condition_refused(exc):
                raise TransferError(f"cannot complete the upload: {failure_reason(exc)}", path=self.url) from None
            self._file.mode = "wb"  # the store does not take the condition: the caller's check stands alone
            self._call("complete the upload", self._file.commit)

    def discard(self) -> None:
        """Abort the upload: no object appears, uploaded parts are deleted.

        When the abort fails (a credential that expired mid-run), it is tried
        once more with the credentials read afresh, which a renewing source
        (a rotated file, a web identity token) has replaced by then."""
        try:
            self._file.discard()
        except Exception:
            try:
                self._file.fs = _filesystem(self.url, fresh=True)[0]
                self._file.discard()
            except Exception:  # failed again: the bucket's lifecycle rules reclaim the parts
                pass
        self._file.closed = True  # nothing to upload when the object is collected


def _condition_refused(exc: BaseException) -> bool:
    """Did the completion fail for its condition alone: the store does not
    implement it (HTTP 501), or the client does not know the parameter
    (botocore's ParamValidationError, before 1.35.20)?"""
    seen: BaseException | None = exc
    while seen is not None:
        if type(seen).__name__ == "ParamValidationError":
            return True
        seen = seen.__cause__ or seen.__context__
    return _status_of(exc)[0] == 501


def _name_taken(exc: BaseException) -> bool:
    """Did an exclusive completion fail because the name exists (HTTP 412 or
    s3fs's translation of it)?"""
    return isinstance(exc, FileExistsError) or _status_of(exc)[0] == 412
